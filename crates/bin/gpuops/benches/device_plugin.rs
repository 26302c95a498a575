//! The agent's device plugin under load: resident memory with 8 GPUs x 7 MIG devices x 4 replicas,
//! Allocate latency, and the time from an XID in the driver to an Unhealthy device on ListAndWatch.
//!
//! Run: `cargo bench -p gpuops --bench device_plugin`. Prints the figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark harness

use gpuops_kubelet_api::deviceplugin::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, Empty, device_plugin_client::DevicePluginClient,
};
use gpuops_kubelet_api::{UNHEALTHY, unix};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn gpuops(args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpuops"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let plugin_config = dir.path().join("plugin.yaml");
    std::fs::write(
        &plugin_config,
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/mig-1g.10gb\n      replicas: 4\n",
    )
    .unwrap();
    let plugins = dir.path().join("device-plugins");
    let agent = Command::new(env!("CARGO_BIN_EXE_gpuops"))
        .args([
            "agent",
            "--sim-state",
            state_s,
            "--interval",
            "10s",
            "--metrics-address",
            "127.0.0.1:0",
            "--config-file",
        ])
        .arg(&plugin_config)
        .arg("--device-plugin-dir")
        .arg(&plugins)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = agent.id();
    let _agent = Killed(agent);
    let socket = plugins.join("nvidia-mig-1g.10gb.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        assert!(
            Instant::now() < deadline,
            "the agent never served {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = DevicePluginClient::new(unix::connect(Path::new(&socket)).await.unwrap());
        let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = stream.message().await.unwrap().unwrap();
        let devices = first.devices.len();
        println!("agent resident memory with 8 GPUs x 7 MIG devices x 4 replicas ({devices} device IDs): {} KiB", rss_kib(pid));

        let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
        let mut times = Vec::new();
        for i in 0..2000 {
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec![ids[i % ids.len()].clone()],
                }],
            };
            let start = Instant::now();
            client.allocate(request).await.unwrap();
            times.push(start.elapsed());
        }
        times.sort_unstable();
        println!(
            "Allocate latency over a Unix socket (2000 calls): p50 {:?}, p99 {:?}, max {:?}",
            times[times.len() / 2],
            times[times.len() * 99 / 100],
            times[times.len() - 1]
        );
        println!("agent resident memory after the Allocate calls: {} KiB", rss_kib(pid));

        // XID on GPU 3, MIG instance gi 7 (the first 1g): how long until ListAndWatch says Unhealthy.
        let start = Instant::now();
        gpuops(&["sim", "xid", "--state", state_s, "--gpu", "3", "--xid", "48", "--gi", "7", "--ci", "0"]);
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
                .await
                .expect("an Unhealthy device within 10 s")
                .unwrap()
                .unwrap();
            let unhealthy = msg.devices.iter().filter(|d| d.health == UNHEALTHY).count();
            if unhealthy > 0 {
                println!(
                    "XID injected -> ListAndWatch reports {unhealthy} Unhealthy replicas of the MIG device: {:?}",
                    start.elapsed()
                );
                break;
            }
        }
    });
}
