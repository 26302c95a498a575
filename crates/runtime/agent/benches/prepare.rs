//! The DRA driver's prepare and unprepare on the simulated driver: a whole GPU (target p99 under
//! 50 ms) and a dynamic-MIG device made at prepare and destroyed at unprepare (target p99 under
//! 1 s), each through the agent's own preparer: checkpoint writes, the MIG driver calls, the node
//! read after them and the claim's CDI spec. The claim is handed over as the API server would
//! return it, so the figures are the node's work only (one `get` of the claim is added in a
//! cluster). `cargo bench -p gpuops-agent --bench prepare` (`BENCH_RUNS`, default 200).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpuops_agent::{DraConfig, NodeState, Preparer};
use gpuops_draplugin::{Claim, PluginConfig};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

fn sim_library() -> PathBuf {
    let name = format!(
        "{}nvml_sim{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .take(2)
        .flat_map(|d| [d.join(&name), d.join("deps").join(&name)])
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not built beside {}", exe.display()))
}

fn claim(i: usize) -> Claim {
    Claim {
        namespace: "bench".into(),
        name: format!("c{i}"),
        uid: format!("uid-{i}"),
    }
}

fn allocated(uid: &str, device: &str) -> ResourceClaim {
    let mut rc = ResourceClaim::default();
    rc.metadata.uid = Some(uid.into());
    rc.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    driver: "gpu.nvidia.com".into(),
                    pool: "node-1".into(),
                    device: device.into(),
                    request: "gpu".into(),
                    ..Default::default()
                }]),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    rc
}

fn preparer(
    dir: &Path,
    name: &str,
    options: gpuops_agent::DraOptions,
    state: watch::Receiver<Arc<NodeState>>,
    gpus: watch::Receiver<Option<Arc<gpuops_nvml::Gpus>>>,
) -> Preparer {
    let dir = dir.join(name);
    std::fs::create_dir_all(dir.join("root")).unwrap();
    // Never called: the claims are handed over as read.
    let client = gpuops_kube::kube::Client::try_from(gpuops_kube::kube::Config::new(
        "http://127.0.0.1:9".parse().unwrap(),
    ))
    .unwrap();
    let cfg = DraConfig {
        plugin: PluginConfig::new(
            "gpu.nvidia.com",
            &dir.join("registry"),
            &dir.join("plugins"),
        ),
        cdi_dir: dir.join("cdi"),
        probe_root: dir.join("root"),
        spec_options: Default::default(),
        options,
        resync: Duration::from_secs(60),
        mps: None,
    };
    Preparer::new(
        client,
        "node-1",
        cfg,
        state,
        gpus,
        None,
        Arc::new(Default::default()),
        Duration::from_secs(1),
    )
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut prepare: Vec<Duration>, mut unprepare: Vec<Duration>) {
    prepare.sort();
    unprepare.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what}: prepare p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; unprepare p50 {:.2} ms, p99 {:.2} ms ({} runs)",
        ms(percentile(&prepare, 0.5)),
        ms(percentile(&prepare, 0.99)),
        ms(*prepare.last().unwrap()),
        ms(percentile(&unprepare, 0.5)),
        ms(percentile(&unprepare, 0.99)),
        prepare.len()
    );
}

/// MIG devices on the node now (read outside the timed calls).
fn mig_devices(gpus: &gpuops_nvml::Gpus) -> usize {
    (0..8).map(|i| gpus.mig_devices_of(i).unwrap().len()).sum()
}

async fn run(
    p: &Preparer,
    runs: usize,
    device: impl Fn(usize) -> String,
    made: Option<&gpuops_nvml::Gpus>,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut prepare = Vec::with_capacity(runs);
    let mut unprepare = Vec::with_capacity(runs);
    for i in 0..runs {
        let c = claim(i);
        let rc = allocated(&c.uid, &device(i));
        let t = Instant::now();
        let got = p.prepare_allocated(&c, &rc).await.unwrap();
        prepare.push(t.elapsed());
        assert_eq!(got.len(), 1);
        // Dynamic MIG really made the claim's device, and unprepare really destroyed it.
        if let Some(gpus) = made {
            assert_eq!(mig_devices(gpus), 1, "run {i}: the claim's MIG device");
        }
        let t = Instant::now();
        p.unprepare_one(&c).await.unwrap();
        unprepare.push(t.elapsed());
        if let Some(gpus) = made {
            assert_eq!(mig_devices(gpus), 0, "run {i}: destroyed at unprepare");
        }
    }
    (prepare, unprepare)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let sim = dir.path().join("sim");
    let fleet = gpuops_sim::Fleet::resolve("dgx-h100").unwrap();
    let state = gpuops_sim::SimState::from_fleet(&fleet, 0).unwrap();
    gpuops_sim::Store::create(&sim, &state).unwrap();
    gpuops_nvml::use_simulator_state(&sim);
    let gpus =
        Arc::new(gpuops_nvml::Gpus::open(gpuops_nvml::Library::Path(sim_library())).unwrap());
    let inventory = Arc::new(gpus.snapshot().unwrap());
    let node = Arc::new(NodeState {
        inventory: Arc::clone(&inventory),
        health: Default::default(),
        xids: Default::default(),
        collection: None,
        nvml_errors: 0,
        nvml_loaded: true,
    });
    let (_state_tx, state_rx) = watch::channel(node);
    let (_gpus_tx, gpus_rx) = watch::channel(Some(Arc::clone(&gpus)));

    let whole = preparer(
        dir.path(),
        "whole",
        Default::default(),
        state_rx.clone(),
        gpus_rx.clone(),
    );
    let (p, u) = run(&whole, runs, |i| format!("gpu-{}", i % 8), None).await;
    report("whole GPU (dgx-h100)", p, u);

    let dynamic = gpuops_agent::DraOptions {
        dynamic_mig: true,
        ..Default::default()
    };
    let model = gpuops_dra::build(&inventory, &Default::default(), &dynamic);
    let placements: Vec<String> = model
        .devices
        .iter()
        .filter(|d| d.mig.as_ref().is_some_and(|m| m.profile == "3g.40gb"))
        .map(|d| d.name.clone())
        .collect();
    assert!(!placements.is_empty(), "no 3g.40gb placement published");
    let mig = preparer(dir.path(), "dynamic", dynamic, state_rx, gpus_rx);
    let (p, u) = run(
        &mig,
        runs.min(100),
        |i| placements[i % placements.len()].clone(),
        Some(&gpus),
    )
    .await;
    report(
        "dynamic MIG 3g.40gb made at prepare, destroyed at unprepare (dgx-h100)",
        p,
        u,
    );
}
