//! The metrics exporter under the load dcgm-exporter struggles with: 8 GPUs x 7 MIG instances and
//! 50 pods. Prints scrape latency (p50/p99/max), the agent's resident memory (device plugin
//! included) and its CPU use at a 1 s collection interval, and, as the same-run baseline, what
//! one collection costs: the work dcgm-exporter does on every scrape.
//!
//! Run: `cargo bench -p gpuops --bench metrics`. Targets: p99 < 2 ms, RSS < 25 MiB, CPU < 1%.
//! The kubelet's PodResources API is played by a small in-process server answering `List()` with
//! 50 pods holding MIG devices (the e2e test checks the real kubelet code path).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark harness

use gpuops_kubelet_api::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpuops_kubelet_api::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn gpuops(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuops"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

struct Kubelet {
    pods: Vec<PodResources>,
}

#[tonic::async_trait]
impl PodResourcesLister for Kubelet {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: self.pods.clone(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(AllocatableResourcesResponse::default()))
    }

    async fn get(
        &self,
        _: tonic::Request<GetPodResourcesRequest>,
    ) -> Result<tonic::Response<GetPodResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not used"))
    }
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn scrape(address: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).unwrap();
    raw
}

// Long on purpose: the bench is one script of measurements in order, each printing its figures.
fn main() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("sim");
    let state_s = state.to_str().unwrap();
    gpuops(&["sim", "init", "--fleet", "dgx-h100", "--state", state_s]);
    let configs = dir.path().join("mig.yaml");
    std::fs::write(
        &configs,
        "version: v1\nmig-configs:\n  all-1g.10gb:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": 7}\n",
    )
    .unwrap();
    gpuops(&[
        "mig",
        "apply",
        "-f",
        configs.to_str().unwrap(),
        "-c",
        "all-1g.10gb",
        "--sim-state",
        state_s,
    ]);
    let inv: serde_json::Value = serde_json::from_str(&gpuops(&[
        "inventory",
        "--sim-state",
        state_s,
        "-o",
        "json",
    ]))
    .unwrap();
    let mig_uuids: Vec<String> = inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["mig_devices"].as_array().unwrap().iter())
        .map(|m| m["uuid"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(mig_uuids.len(), 56);
    let pods: Vec<PodResources> = mig_uuids
        .iter()
        .take(50)
        .enumerate()
        .map(|(i, uuid)| PodResources {
            name: format!("inference-{i}"),
            namespace: "serving".into(),
            containers: vec![ContainerResources {
                name: "server".into(),
                devices: vec![ContainerDevices {
                    resource_name: "nvidia.com/mig-1g.10gb".into(),
                    device_ids: vec![uuid.clone()],
                    topology: None,
                }],
                ..ContainerResources::default()
            }],
        })
        .collect();

    let socket = dir.path().join("pod-resources.sock");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime
        .block_on(async { tokio::net::UnixListener::bind(&socket) })
        .unwrap();
    runtime.spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Kubelet { pods }))
            .serve_with_incoming(gpuops_kubelet_api::unix::incoming(listener)),
    );

    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).unwrap();
    let agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpuops"))
            .args([
                "agent",
                "--sim-state",
                state_s,
                "--interval",
                "1s",
                "--metrics-address",
                "127.0.0.1:0",
            ])
            .arg("--pod-resources-socket")
            .arg(&socket)
            .arg("--device-plugin-dir")
            .arg(dir.path().join("device-plugins"))
            .env("MIG_STRATEGY", "mixed")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap(),
    );
    let pid = agent.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(a) = text
            .lines()
            .find_map(|l| l.split("metrics        http://").nth(1))
            .and_then(|s| s.split('/').next())
        {
            break a.to_string();
        }
        assert!(Instant::now() < deadline, "agent did not start:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = scrape(&address);
        if body.matches("gpuops_device_allocated{").count() >= 56
            && body
                .lines()
                .filter(|l| l.starts_with("gpuops_device_allocated{") && l.ends_with(" 1"))
                .count()
                == 50
            // GPM activity needs a second collection: measure the full exposition.
            && body.matches("DCGM_FI_PROF_GR_ENGINE_ACTIVE{").count() >= 64
        {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "50 pods never showed up:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let series = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();

    // Scrape latency: a new connection per scrape, as a restarted scraper would open.
    for _ in 0..200 {
        scrape(&address);
    }
    let mut times: Vec<Duration> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let body = scrape(&address);
            let took = t.elapsed();
            assert!(body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"));
            took
        })
        .collect();
    times.sort();
    let pct = |p: f64| times[((times.len() as f64 * p) as usize).min(times.len() - 1)];
    // CPU at a 1 s interval, idle scrapers apart.
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(20));
    let cpu_pct = (cpu_ticks(pid) - c0) as f64 / 100.0 / t0.elapsed().as_secs_f64() * 100.0;
    let rss = proc_status_kib(pid, "VmRSS:");
    let hwm = proc_status_kib(pid, "VmHWM:");
    let collection = scrape(&address)
        .lines()
        .find(|l| l.starts_with("gpuops_collection_duration_seconds{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    drop(agent);

    // Baseline, same run: the same agent with metrics off (device plugin and GPU reads only).
    let out = std::fs::File::create(dir.path().join("baseline.log")).unwrap();
    let baseline = Killed(
        Command::new(env!("CARGO_BIN_EXE_gpuops"))
            .args([
                "agent",
                "--sim-state",
                state_s,
                "--interval",
                "1s",
                "--no-metrics",
            ])
            .arg("--device-plugin-dir")
            .arg(dir.path().join("device-plugins-baseline"))
            .env("MIG_STRATEGY", "mixed")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let bpid = baseline.0.id();
    let (t0, c0) = (Instant::now(), cpu_ticks(bpid));
    std::thread::sleep(Duration::from_secs(20));
    let base_cpu = (cpu_ticks(bpid) - c0) as f64 / 100.0 / t0.elapsed().as_secs_f64() * 100.0;
    let base_rss = proc_status_kib(bpid, "VmRSS:");
    drop(baseline);

    println!(
        "metrics exporter: 8 GPUs x 7 MIG instances, 50 pods, {series} series, {} KiB per scrape",
        body.len() / 1024
    );
    println!(
        "  scrape latency      p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms  (2000 scrapes, target p99 < 2 ms)",
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
    println!(
        "  one collection      {:.3} ms (NVML snapshot + PodResources + render: what a scrape would cost if it collected, {:.0}x the p50 scrape)",
        collection * 1e3,
        collection / pct(0.50).as_secs_f64()
    );
    println!(
        "  agent RSS           {:.1} MiB now, {:.1} MiB peak (device plugin included; target < 25 MiB); without metrics {:.1} MiB",
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        base_rss as f64 / 1024.0
    );
    println!(
        "  agent CPU           {cpu_pct:.2}% of a core at a 1 s interval (target < 1%); without metrics {base_cpu:.2}%, so metrics cost {:.2}%",
        cpu_pct - base_cpu
    );
    drop(runtime);
}
