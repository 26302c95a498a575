//! Driver calls per MIG apply on nvml-sim: `gpuops mig apply` (explicit placements, minimal
//! disruption) against mig-parted's strategy (clear the GPU, then retry creation orders until the
//! driver's default placement fits), measured in the same run on the same simulated H100.
//!
//! Run: `cargo bench -p gpuops --bench mig_apply`. Prints one row per scenario.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // benchmark harness

use gpuops_mig::config;
use gpuops_nvml::{Gpus, Library};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const CONFIGS: &str = "version: v1
mig-configs:
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices: {\"1g.10gb\": 7}
  mixed-inference:
    - devices: all
      mig-enabled: true
      mig-devices: {\"3g.40gb\": 1, \"1g.10gb\": 4}
  all-balanced:
    - devices: all
      mig-enabled: true
      mig-devices: {\"1g.10gb\": 2, \"2g.20gb\": 1, \"3g.40gb\": 1}
  grow-from-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {\"3g.40gb\": 1, \"2g.20gb\": 1, \"1g.10gb\": 2}
  only-3g:
    - devices: all
      mig-enabled: true
      mig-devices: {\"3g.40gb\": 1}
  all-disabled:
    - devices: all
      mig-enabled: false
";

/// (name, starting config or None for MIG off, target config).
const SCENARIOS: &[(&str, Option<&str>, &str)] = &[
    ("MIG off -> 7x 1g.10gb", None, "all-1g.10gb"),
    (
        "mixed-inference -> 7x 1g.10gb",
        Some("mixed-inference"),
        "all-1g.10gb",
    ),
    (
        "7x 1g.10gb -> all-balanced",
        Some("all-1g.10gb"),
        "all-balanced",
    ),
    (
        "3g.40gb -> 3g+2g+2x1g (superset)",
        Some("only-3g"),
        "grow-from-3g",
    ),
    (
        "all-balanced -> all-balanced (no-op)",
        Some("all-balanced"),
        "all-balanced",
    ),
];

fn gpuops(state: Option<&Path>, trace: Option<&Path>, args: &[&str]) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuops"));
    c.args(args);
    if let Some(state) = state {
        c.arg("--sim-state").arg(state);
    }
    c.env_remove("GPUOPS_NVML_SIM_TRACE");
    if let Some(t) = trace {
        c.env("GPUOPS_NVML_SIM_TRACE", t);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// (all calls, calls that change MIG state).
fn count(trace: &Path) -> (usize, usize) {
    let text = std::fs::read_to_string(trace).unwrap_or_default();
    let all = text.lines().count();
    let changes = text
        .lines()
        .filter(|l| l.contains("Create") || l.contains("Destroy") || *l == "nvmlDeviceSetMigMode")
        .count();
    (all, changes)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--baseline-child") {
        baseline_child(&args[2], &args[3]);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(&fleet, "gpus:\n  - model: H100-SXM5-80GB\n").unwrap();
    let configs = dir.path().join("configs.yaml");
    std::fs::write(&configs, CONFIGS).unwrap();
    let (fleet, configs) = (fleet.to_str().unwrap(), configs.to_str().unwrap());
    println!(
        "{:<40} {:>22} {:>26} {:>8}",
        "scenario (1x H100-SXM5-80GB)",
        "gpuops calls (changes)",
        "clear+retry calls (changes)",
        "ratio"
    );
    for (n, (name, from, to)) in SCENARIOS.iter().enumerate() {
        let mut row = Vec::new();
        for strategy in ["gpuops", "baseline"] {
            let state = dir.path().join(format!("{strategy}-{n}"));
            gpuops(
                None,
                None,
                &[
                    "sim",
                    "init",
                    "--fleet",
                    fleet,
                    "--state",
                    state.to_str().unwrap(),
                ],
            );
            if let Some(from) = from {
                gpuops(
                    Some(&state),
                    None,
                    &["mig", "apply", "-f", configs, "-c", from],
                );
            }
            let trace: PathBuf = dir.path().join(format!("{strategy}-{n}.trace"));
            if strategy == "gpuops" {
                gpuops(
                    Some(&state),
                    Some(&trace),
                    &["mig", "apply", "-f", configs, "-c", to],
                );
            } else {
                let o = Command::new(std::env::current_exe().unwrap())
                    .args(["--baseline-child", configs, to])
                    .env("GPUOPS_NVML_SIM_STATE", &state)
                    .env("GPUOPS_NVML_SIM_TRACE", &trace)
                    .output()
                    .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            }
            row.push(count(&trace));
        }
        let (ours, theirs) = (row[0], row[1]);
        println!(
            "{:<40} {:>22} {:>26} {:>8}",
            name,
            format!("{} ({})", ours.0, ours.1),
            format!("{} ({})", theirs.0, theirs.1),
            format!("{:.2}", ours.0 as f64 / theirs.0.max(1) as f64)
        );
    }
}

/// mig-parted's apply, reimplemented on the same NVML layer as the baseline: read the state; if the
/// counts differ, destroy every instance, then try creation orders (permutations of the profile
/// list) with the driver's default placement until one fits.
fn baseline_child(config_file: &str, name: &str) {
    let text = std::fs::read_to_string(config_file).unwrap();
    let cfg = config::parse(&text, config_file).unwrap();
    let entry = &cfg.get(name).unwrap().entries[0];
    let lib = sim_library();
    let gpus = Gpus::open(Library::Path(lib)).unwrap();
    let inv = gpus.snapshot_with(gpuops_nvml::Scope::Mig).unwrap();
    let gpu = &inv.gpus[0];
    let current: BTreeMap<String, u32> =
        gpu.mig_devices.iter().fold(BTreeMap::new(), |mut m, d| {
            *m.entry(d.ci_profile.clone()).or_insert(0) += 1;
            m
        });
    if gpu.mig.current_enabled == entry.mig_enabled && current == entry.mig_devices {
        return;
    }
    for d in &gpu.mig_devices {
        gpus.destroy_compute_instance(0, d.gi_id, d.ci_id).unwrap();
        gpus.destroy_gpu_instance(0, d.gi_id).unwrap();
    }
    if gpu.mig.current_enabled != entry.mig_enabled {
        gpus.set_mig_mode(0, entry.mig_enabled).unwrap();
    }
    if !entry.mig_enabled {
        return;
    }
    let model = gpuops_catalog::lookup(gpu.model.as_deref().unwrap()).unwrap();
    let list: Vec<u32> = entry
        .mig_devices
        .iter()
        .flat_map(|(p, n)| std::iter::repeat_n(model.gi_profile(p).unwrap().nvml_id, *n as usize))
        .collect();
    let mut order: Vec<usize> = (0..list.len()).collect();
    loop {
        let mut created = Vec::new();
        let mut ok = true;
        for &i in &order {
            match gpus.create_gpu_instance(0, list[i], None) {
                Ok(gi) => {
                    let ci = gpus
                        .create_compute_instance(0, gi, full_ci(model, list[i]), None)
                        .unwrap();
                    created.push((gi, ci));
                }
                Err(_) => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            return;
        }
        for (gi, ci) in created {
            gpus.destroy_compute_instance(0, gi, ci).unwrap();
            gpus.destroy_gpu_instance(0, gi).unwrap();
        }
        assert!(next_permutation(&mut order), "no creation order fits");
    }
}

fn full_ci(model: &gpuops_catalog::GpuModel, gi_profile_id: u32) -> u32 {
    let slices = model
        .gi_profile_by_id(gi_profile_id)
        .unwrap()
        .compute_slices;
    gpuops_catalog::nvml_enum::ci_profile_for_slices(slices).unwrap()
}

/// Lexicographic next permutation (as mig-parted walks every order).
fn next_permutation(v: &mut [usize]) -> bool {
    let Some(i) = (1..v.len()).rev().find(|&i| v[i - 1] < v[i]) else {
        return false;
    };
    let j = (i..v.len()).rev().find(|&j| v[j] > v[i - 1]).unwrap();
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

fn sim_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    [
        dir.join("libnvml_sim.so"),
        dir.join("../libnvml_sim.so"),
        dir.join("deps/libnvml_sim.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .expect("libnvml_sim.so next to the bench")
}
