//! Side-by-side autoscaling scenarios (issue 16) in the test bed: each scenario on a fresh
//! cluster, against the real Karpenter with and without gpuops's startup taint, and (once wired)
//! against gpuops's controller on Cluster API, all with the same node lifecycle: boot, Node Ready
//! without GPUs, GPUs after the device-plugin delay. Prints a Markdown table.
//!
//! Run through scripts/bench-autoscale (it builds what is needed). Knobs (environment):
//! BENCH_BOOT_S (5), BENCH_DEVICES_S (10), BENCH_SCENARIOS (`a,b,c`),
//! BENCH_SIDES (`karpenter,karpenter-taint,gpuops`), BENCH_BIN_PACKING (`1`: a GPU bin-packing
//! scheduler profile for both sides).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark driver

use gpuops_testbed::scenario::{self, Outcome, Scenario};
use gpuops_testbed::{
    CapiOptions, Cluster, ClusterOptions, InstanceType, KarpenterOptions, PoolSpec,
};
use std::time::Duration;

fn env_secs(name: &str, default: u64) -> Duration {
    Duration::from_secs(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// With BENCH_BIN_PACKING=1 both sides' kube-scheduler bin-packs the scenario's devices; the
/// default spreads.
fn scheduler_config(scenario: &Scenario) -> Option<String> {
    (std::env::var("BENCH_BIN_PACKING").as_deref() == Ok("1"))
        .then(|| scenario.bin_packing_profile())
}

const TIMEOUT: Duration = Duration::from_secs(420);
const SETTLE: Duration = Duration::from_secs(20);

fn karpenter_side(
    scenario: &Scenario,
    startup_taint: bool,
    boot: Duration,
    devices: Duration,
) -> Result<Outcome, String> {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        controller_manager: true,
        apiserver_args: KarpenterOptions::apiserver_args(),
        scheduler_config: scheduler_config(scenario),
        ..ClusterOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let karpenter = cluster
        .start_karpenter(KarpenterOptions {
            instance_types: scenario.offers.iter().map(InstanceType::from).collect(),
            startup_taint,
            registration_delay: boot,
            devices_delay: devices,
            ..KarpenterOptions::default()
        })
        .map_err(|e| e.to_string())?;
    let outcome = scenario::run(&cluster, &karpenter, scenario, "default", TIMEOUT, SETTLE)
        .map_err(|e| e.to_string())?;
    let claims = karpenter.node_claims().map_err(|e| e.to_string())?;
    let types: Vec<String> = claims
        .iter()
        .map(|c| c.instance_type.clone().unwrap_or_default())
        .collect();
    eprintln!(
        "[bench] {} / {}: NodeClaims {types:?}",
        outcome.scenario, outcome.autoscaler
    );
    Ok(outcome)
}

/// gpuops's controller (the `gpuops` binary as a process, as a Deployment would run it) on
/// Cluster API with the real core controllers, one pool per offer (Karpenter's instance types).
/// The binary is `$GPUOPS_BIN` (scripts/bench-autoscale builds it).
fn gpuops_side(scenario: &Scenario, boot: Duration, devices: Duration) -> Result<Outcome, String> {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        controller_manager: true,
        scheduler_config: scheduler_config(scenario),
        ..ClusterOptions::default()
    })
    .map_err(|e| e.to_string())?;
    let capi = cluster
        .start_cluster_api(CapiOptions::default())
        .map_err(|e| e.to_string())?;
    for offer in &scenario.offers {
        let mut pool = PoolSpec::from_offer(offer, boot, devices);
        pool.max = 30;
        capi.add_pool(&pool).map_err(|e| e.to_string())?;
    }
    let bin = std::env::var("GPUOPS_BIN").unwrap_or_else(|_| "target/debug/gpuops".into());
    let log =
        std::fs::File::create(cluster.dir().join("controller.log")).map_err(|e| e.to_string())?;
    let mut controller = std::process::Command::new(&bin)
        .arg("controller")
        .arg(format!("--kubeconfig={}", cluster.kubeconfig().display()))
        .args([
            "--namespace=default",
            "--no-leader-election",
            // BENCH_RESYNC: the controller's resync (the product's default is 10s).
            &format!(
                "--resync={}",
                std::env::var("BENCH_RESYNC").unwrap_or_else(|_| "2s".into())
            ),
            "--metrics-address=127.0.0.1:0",
        ])
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("{bin}: {e}"))?;
    // As Karpenter's side waits for its NodePool to be Ready: the pools' MachineSets exist and
    // the controller has synced its caches and run a pass (it writes its status then). Without
    // this a first run counted Cluster API creating the MachineSet into the time to capacity.
    let pools = scenario.offers.len();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let sets = cluster
            .get_json(&["machinesets.cluster.x-k8s.io", "-n", "default"])
            .map(|l| l["items"].as_array().map_or(0, Vec::len))
            .unwrap_or(0);
        let passed = cluster
            .get_json(&["configmap", "gpuops-autoscaler-status", "-n", "default"])
            .is_ok();
        if sets >= pools && passed {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = controller.kill();
            return Err(format!(
                "not ready in 120 s: {sets} of {pools} MachineSets, status written: {passed}"
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let outcome = scenario::run(&cluster, &capi, scenario, "default", TIMEOUT, SETTLE);
    let _ = controller.kill();
    let _ = controller.wait();
    outcome.map_err(|e| e.to_string())
}

fn main() {
    let boot = env_secs("BENCH_BOOT_S", 5);
    let devices = env_secs("BENCH_DEVICES_S", 10);
    let scenarios: Vec<Scenario> = env_list("BENCH_SCENARIOS", "a,b,c")
        .iter()
        .map(|s| match s.as_str() {
            "a" => Scenario::scale_from_zero(),
            "b" => Scenario::burst(),
            "c" => Scenario::mixed(),
            other => panic!("BENCH_SCENARIOS: unknown scenario {other:?} (a, b, c)"),
        })
        .collect();
    let sides = env_list("BENCH_SIDES", "karpenter,karpenter-taint,gpuops");
    let mut rows = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut notes = Vec::new();
    for scenario in &scenarios {
        for side in &sides {
            eprintln!("[bench] {} on {side} ...", scenario.name);
            let result = match side.as_str() {
                "karpenter" => karpenter_side(scenario, false, boot, devices),
                "karpenter-taint" => karpenter_side(scenario, true, boot, devices),
                "gpuops" => gpuops_side(scenario, boot, devices),
                other => Err(format!("BENCH_SIDES: unknown side {other:?}")),
            };
            match result {
                Ok(outcome) => {
                    rows.push(outcome.row());
                    for line in scenario::instance_lines(&outcome) {
                        eprintln!("[bench] {line}");
                    }
                    outcomes.push(outcome);
                }
                Err(e) => notes.push(format!("- {} / {side}: {e}", scenario.name)),
            }
        }
    }
    println!(
        "Node boot {}s, GPUs {}s after the node registers; Karpenter batch 1s idle / 10s max; \
         whole-GPU instance types 8x/4x/1x H100 at the same price per GPU ((c) adds 8x H100 \
         all-1g.10gb = 56 nvidia.com/mig-1g.10gb, and 4x L4 x 4 replicas = 16 \
         nvidia.com/gpu.shared).\n",
        boot.as_secs(),
        devices.as_secs()
    );
    println!("{}", Outcome::header());
    for r in rows {
        println!("{r}");
    }
    for n in notes {
        println!("{n}");
    }
    for scenario in &scenarios {
        let these: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.scenario == scenario.name)
            .collect();
        if these.is_empty() {
            continue;
        }
        println!(
            "\nStages of {} (per pod; objects' own timestamps, whole seconds):\n",
            scenario.name
        );
        println!("{}", scenario::stage_table(&these));
    }
}
