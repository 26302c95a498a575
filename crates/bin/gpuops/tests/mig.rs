//! `gpuops mig` end to end on the simulated driver: the seed's configs, NVIDIA's defaults,
//! minimal disruption, processes, hooks, interrupted applies and reset-required mode changes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

mod common;

use common::{gpuops, run, text};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

const SEED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/seed-mig-parted-config.yaml"
);

/// A simulated node in a temporary directory.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(fleet: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let o = run(&[
            "sim",
            "init",
            "--fleet",
            fleet,
            "--state",
            dir.path().to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        Node { dir }
    }

    fn state(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }

    fn mig(&self, args: &[&str]) -> Output {
        let mut full = vec!["mig"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--sim-state", self.state()]);
        run(&full)
    }

    fn sim(&self, args: &[&str]) {
        let mut full = vec!["sim"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--state", self.state()]);
        let o = run(&full);
        assert!(o.status.success(), "{}", text(&o));
    }

    fn apply(&self, file: &str, config: &str) -> Output {
        self.mig(&["apply", "-f", file, "-c", config])
    }

    fn inventory(&self) -> serde_json::Value {
        let o = run(&["inventory", "--sim-state", self.state(), "-o", "json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap()
    }

    /// Per GPU: sorted "profile@start" of its MIG devices.
    fn layouts(&self) -> Vec<Vec<String>> {
        let inv = self.inventory();
        inv["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let mut v: Vec<String> = g["mig_devices"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        format!(
                            "{}@{}",
                            m["ci_profile"].as_str().unwrap(),
                            m["placement_start"]
                        )
                    })
                    .collect();
                v.sort();
                v
            })
            .collect()
    }

    fn uuids(&self, gpu: usize) -> Vec<(String, String)> {
        let inv = self.inventory();
        inv["gpus"][gpu]["mig_devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    format!(
                        "{}@{}",
                        m["ci_profile"].as_str().unwrap(),
                        m["placement_start"]
                    ),
                    m["uuid"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn file(&self, name: &str, content: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_string()
    }
}

fn counts(layout: &[String], profile: &str) -> usize {
    layout
        .iter()
        .filter(|l| l.starts_with(&format!("{profile}@")))
        .count()
}

#[test]
fn the_seeds_four_configs_apply_on_a100_and_h100_and_a_second_apply_does_nothing() {
    for fleet in ["dgx-a100", "dgx-h100"] {
        let node = Node::new(fleet);
        let o = node.mig(&["assert", "-f", SEED, "-c", "all-1g.10gb"]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{fleet}: not applied yet\n{}",
            text(&o)
        );

        for (config, want) in [
            ("all-1g.10gb", vec![("1g.10gb", 7)]),
            ("all-2g.20gb", vec![("2g.20gb", 3)]),
            ("mixed-inference", vec![("3g.40gb", 1), ("1g.10gb", 4)]),
        ] {
            let o = node.apply(SEED, config);
            assert!(o.status.success(), "{fleet} {config}:\n{}", text(&o));
            for (gpu, layout) in node.layouts().iter().enumerate() {
                for (profile, n) in &want {
                    assert_eq!(
                        counts(layout, profile),
                        *n,
                        "{fleet} {config} GPU {gpu}: {layout:?}"
                    );
                }
                assert_eq!(layout.len(), want.iter().map(|w| w.1).sum::<usize>());
            }
            let o = node.mig(&["assert", "-f", SEED, "-c", config]);
            assert!(o.status.success(), "{fleet} {config} assert:\n{}", text(&o));
            // Idempotent: nothing to do, no driver call.
            let o = node.apply(SEED, config);
            assert!(
                text(&o).contains("nothing to do"),
                "{fleet} {config}:\n{}",
                text(&o)
            );
        }
        let o = node.apply(SEED, "all-disabled");
        assert!(o.status.success(), "{}", text(&o));
        let inv = node.inventory();
        for g in inv["gpus"].as_array().unwrap() {
            assert_eq!(g["mig"]["current_enabled"], false);
            assert!(g["mig_devices"].as_array().unwrap().is_empty());
        }
        assert!(
            node.mig(&["assert", "-f", SEED, "-c", "all-disabled"])
                .status
                .success()
        );
    }
}

#[test]
fn dry_run_shows_the_plan_with_slot_maps_and_changes_nothing() {
    let node = Node::new("dgx-h100");
    let o = node.mig(&["apply", "-f", SEED, "-c", "mixed-inference", "--dry-run"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("MIG mode: disabled -> enabled"), "{out}");
    assert!(out.contains("create:") && out.contains("3g.40gb@"), "{out}");
    assert!(out.contains("slot  0"), "{out}");
    assert!(out.contains("dry run: nothing changed"), "{out}");
    assert!(node.layouts().iter().all(Vec::is_empty));
    assert_eq!(node.inventory()["gpus"][0]["mig"]["current_enabled"], false);
}

#[test]
fn impossible_layouts_are_rejected_with_a_slice_explanation_before_anything_changes() {
    let node = Node::new("dgx-h100");
    let cfg = node.file(
        "bad.yaml",
        "version: v1\nmig-configs:\n  too-big:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"3g.40gb\": 2\n        \"1g.10gb\": 2\n",
    );
    let o = node.apply(&cfg, "too-big");
    assert!(!o.status.success());
    let out = text(&o);
    assert!(
        out.contains("memory slices") && out.contains("H100-SXM5-80GB"),
        "{out}"
    );
    assert_eq!(
        node.inventory()["gpus"][0]["mig"]["current_enabled"],
        false,
        "nothing touched"
    );
    let o = run(&["mig", "validate", "-f", &cfg, "--gpu", "H100-SXM5-80GB"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("10 of 8 memory slices"), "{}", text(&o));
}

#[test]
fn growing_a_layout_keeps_every_existing_instance() {
    let node = Node::new("dgx-h100");
    let cfg = node.file(
        "grow.yaml",
        "version: v1\nmig-configs:\n  small:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 1}\n  big:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"3g.40gb\": 1, \"2g.20gb\": 1, \"1g.10gb\": 2}\n",
    );
    assert!(node.apply(&cfg, "small").status.success());
    let before = node.uuids(0);
    assert_eq!(before.len(), 1);
    let o = node.apply(&cfg, "big");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("destroy: -"), "{}", text(&o));
    let after = node.uuids(0);
    assert_eq!(after.len(), 4);
    assert!(
        after.contains(&before[0]),
        "the 3g.40gb kept its UUID: {before:?} vs {after:?}"
    );
    // Other GPUs were not selected, so they were left alone.
    assert!(node.layouts()[1].is_empty());
}

#[test]
fn processes_block_destruction_unless_forced() {
    let node = Node::new("dgx-h100");
    assert!(node.apply(SEED, "all-2g.20gb").status.success());
    let inv = node.inventory();
    let gi = inv["gpus"][0]["mig_devices"][0]["gi_id"]
        .as_u64()
        .unwrap()
        .to_string();
    node.sim(&[
        "process", "--gpu", "0", "--pid", "4242", "--memory", "1000", "--gi", &gi, "--ci", "0",
    ]);
    let o = node.apply(SEED, "all-1g.10gb");
    assert!(!o.status.success());
    assert!(
        text(&o).contains("pid 4242") && text(&o).contains("--force"),
        "{}",
        text(&o)
    );
    assert_eq!(
        counts(&node.layouts()[0], "2g.20gb"),
        3,
        "nothing destroyed"
    );
    assert_eq!(counts(&node.layouts()[1], "2g.20gb"), 3, "no GPU touched");
    // Forced: the driver itself refuses while the process runs.
    let o = node.mig(&["apply", "-f", SEED, "-c", "all-1g.10gb", "--force"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("in use"), "{}", text(&o));
    node.sim(&["process", "--gpu", "0", "--clear"]);
    let o = node.apply(SEED, "all-1g.10gb");
    assert!(
        o.status.success(),
        "converges once the process is gone:\n{}",
        text(&o)
    );
    assert!(node.layouts().iter().all(|l| counts(l, "1g.10gb") == 7));
}

#[test]
fn hooks_run_in_mig_parted_order_and_apply_exit_always_runs() {
    let node = Node::new("dgx-h100");
    let log = node.dir.path().join("hooks.log");
    let hook = |name: &str| {
        format!(
            "    - command: /bin/sh\n      args: [\"-c\", \"echo {name} $MIG_PARTED_SELECTED_CONFIG >> {}\"]\n",
            log.display()
        )
    };
    let hooks = node.file(
        "hooks.yaml",
        &format!(
            "version: v1\nhooks:\n  apply-start:\n{}  pre-apply-mode:\n{}  pre-apply-config:\n{}  apply-exit:\n{}",
            hook("apply-start"),
            hook("pre-apply-mode"),
            hook("pre-apply-config"),
            hook("apply-exit")
        ),
    );
    let o = node.mig(&["apply", "-f", SEED, "-c", "all-1g.10gb", "-k", &hooks]);
    assert!(o.status.success(), "{}", text(&o));
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        lines,
        "apply-start all-1g.10gb\npre-apply-mode all-1g.10gb\npre-apply-config all-1g.10gb\napply-exit all-1g.10gb\n"
    );
    // A failing hook aborts the apply, and apply-exit still runs.
    std::fs::remove_file(&log).unwrap();
    let failing = node.file(
        "failing.yaml",
        &format!(
            "version: v1\nhooks:\n  pre-apply-config:\n    - command: /bin/false\n  apply-exit:\n{}",
            hook("apply-exit")
        ),
    );
    let o = node.mig(&["apply", "-f", SEED, "-c", "all-2g.20gb", "-k", &failing]);
    assert!(!o.status.success());
    assert!(text(&o).contains("pre-apply-config hook"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "apply-exit all-2g.20gb\n"
    );
    assert!(
        node.layouts().iter().all(|l| counts(l, "1g.10gb") == 7),
        "nothing changed"
    );
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

fn checkpoint(node: &Node) -> serde_json::Value {
    let p: PathBuf = Path::new(node.state()).join("mig-checkpoint.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// Starts a slow apply and kills it (SIGKILL) after it made some but not all changes.
fn kill_half_way(node: &Node, config: &str) {
    let original = node.layouts();
    let mut child = gpuops()
        .args([
            "mig",
            "apply",
            "-f",
            SEED,
            "-c",
            config,
            "--step-delay",
            "150ms",
            "--sim-state",
            node.state(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the first changes to land in the simulator, then kill.
    wait_until("the apply to start changing GPU 0", || {
        node.layouts()[0] != original[0]
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn an_apply_killed_half_way_converges_on_the_next_apply() {
    let node = Node::new("dgx-h100");
    assert!(node.apply(SEED, "all-2g.20gb").status.success());
    kill_half_way(&node, "all-1g.10gb");
    assert!(
        node.layouts().iter().any(|l| counts(l, "1g.10gb") != 7),
        "killed before the end"
    );
    assert_eq!(
        checkpoint(&node)["applying"],
        "all-1g.10gb",
        "checkpoint marks the apply unfinished"
    );
    assert!(
        !node
            .mig(&["assert", "-f", SEED, "-c", "all-1g.10gb"])
            .status
            .success()
    );
    let o = node.apply(SEED, "all-1g.10gb");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("interrupted"), "{}", text(&o));
    assert!(
        node.mig(&["assert", "-f", SEED, "-c", "all-1g.10gb"])
            .status
            .success()
    );
    assert_eq!(checkpoint(&node)["applying"], serde_json::Value::Null);
}

#[test]
fn an_apply_killed_half_way_is_undone_by_restore() {
    let node = Node::new("dgx-h100");
    assert!(node.apply(SEED, "mixed-inference").status.success());
    let original = node.layouts();
    kill_half_way(&node, "all-1g.10gb");
    assert_ne!(node.layouts(), original);
    let o = node.mig(&["restore"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(node.layouts(), original, "exact placements restored");
    assert!(
        node.mig(&["assert", "-f", SEED, "-c", "mixed-inference"])
            .status
            .success()
    );
}

#[test]
fn a_mode_change_that_needs_a_reset_is_reported_not_forced() {
    let node = Node::new("dgx-a100");
    node.sim(&["hold", "--gpu", "2"]);
    let o = node.apply(SEED, "all-1g.10gb");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("GPU 2") && text(&o).contains("pending a GPU reset"),
        "{}",
        text(&o)
    );
    let l = node.layouts();
    assert!(l[2].is_empty(), "GPU 2 untouched until reset");
    assert_eq!(counts(&l[0], "1g.10gb"), 7, "other GPUs applied");
    node.sim(&["reset", "--gpu", "2"]);
    let o = node.apply(SEED, "all-1g.10gb");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(counts(&node.layouts()[2], "1g.10gb"), 7);
}

#[test]
fn export_prints_the_current_state_as_a_config_that_asserts() {
    let node = Node::new("dgx-h100");
    assert!(node.apply(SEED, "mixed-inference").status.success());
    let o = node.mig(&["export"]);
    assert!(o.status.success(), "{}", text(&o));
    let exported = node.file("exported.yaml", &String::from_utf8_lossy(&o.stdout));
    let o = node.mig(&["assert", "-f", &exported, "-c", "current"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = node.mig(&["export", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(v["mig-configs"]["current"][0]["mig-devices"]["1g.10gb"], 4);
    assert_eq!(
        v["mig-configs"]["current"][0]["devices"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
}

#[test]
fn config_errors_name_file_line_and_config() {
    let node = Node::new("dgx-h100");
    let cfg = node.file(
        "typo.yaml",
        "version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n      mig-devicez: {}\n",
    );
    let o = node.apply(&cfg, "x");
    assert!(!o.status.success());
    let out = text(&o);
    assert!(out.contains("typo.yaml") && out.contains("6"), "{out}");
    let o = node.apply(SEED, "no-such-config");
    assert!(
        text(&o).contains("all-1g.10gb"),
        "lists known configs: {}",
        text(&o)
    );
}

#[test]
fn nvidia_default_configs_validate_and_apply_on_every_mig_model() {
    let defaults = gpuops_mig::config::nvidia_default_configs();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("defaults.yaml");
    std::fs::write(&file, defaults.to_yaml()).unwrap();
    let file = file.to_str().unwrap();
    let o = run(&["mig", "validate", "-f", file]);
    assert!(o.status.success(), "{}", text(&o));
    // A board variant reports its production model's PCI id, so entries filtered by that id are
    // not meant for it (NVIDIA's defaults ship the production figures).
    for model in gpuops_catalog::models()
        .iter()
        .filter(|m| m.mig_capable() && !m.is_board_variant())
    {
        let node = Node::new(&{
            let fleet = dir.path().join(format!("{}.yaml", model.key));
            std::fs::write(&fleet, format!("gpus:\n  - model: {}\n", model.key)).unwrap();
            fleet.to_str().unwrap().to_string()
        });
        let mut applied = 0;
        let mut not_meant = 0;
        for name in defaults.names() {
            let named = defaults.get(name).unwrap();
            let meant = named.entries.iter().any(|e| {
                e.filters.is_empty()
                    || e.filters
                        .iter()
                        .any(|f| model.pci_device_ids.contains(&((f.device >> 16) as u16)))
            });
            // Configs with no entry for this model change nothing; one of them shows that, and
            // skipping the rest keeps the test's time proportional to the models' own configs.
            if !meant {
                not_meant += 1;
                if not_meant > 1 {
                    continue;
                }
            }
            let o = node.apply(file, name);
            assert!(o.status.success(), "{} {name}:\n{}", model.key, text(&o));
            assert!(
                node.mig(&["assert", "-f", file, "-c", name])
                    .status
                    .success(),
                "{} {name} asserts after apply",
                model.key
            );
            // The entry meant for this model (by PCI id) is what the GPU must now have.
            let named = defaults.get(name).unwrap();
            let entry = named.entries.iter().rev().find(|e| {
                e.filters.is_empty()
                    || e.filters
                        .iter()
                        .any(|f| model.pci_device_ids.contains(&((f.device >> 16) as u16)))
            });
            if let Some(entry) = entry {
                let layout = &node.layouts()[0];
                let want: usize = entry.mig_devices.values().map(|n| *n as usize).sum();
                assert_eq!(
                    layout.len(),
                    if entry.mig_enabled { want } else { 0 },
                    "{} {name}: {layout:?}",
                    model.key
                );
                for (profile, n) in &entry.mig_devices {
                    assert_eq!(
                        counts(layout, profile),
                        *n as usize,
                        "{} {name}: {layout:?}",
                        model.key
                    );
                }
                applied += 1;
            }
        }
        assert!(
            applied >= 3,
            "{}: only {applied} default configs were meant for it",
            model.key
        );
    }
}

/// A tiny deterministic generator (xorshift), so the property test needs no extra crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// Random MIG device counts that fit the model.
fn random_feasible(
    model: &gpuops_catalog::GpuModel,
    rng: &mut Rng,
) -> std::collections::BTreeMap<String, u32> {
    let profiles = model.mig.as_ref().unwrap().gi_profiles;
    loop {
        let mut wanted = std::collections::BTreeMap::new();
        for _ in 0..1 + rng.next(5) {
            let p = &profiles[rng.next(profiles.len() as u32) as usize];
            *wanted.entry(p.name.to_string()).or_insert(0) += 1;
        }
        if gpuops_mig::planner::check(model, &wanted).is_ok() {
            return wanted;
        }
    }
}

#[test]
fn applying_between_random_layouts_converges_and_keeps_shared_instances() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for model_key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30"] {
        let model = gpuops_catalog::lookup(model_key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fleet = dir.path().join("fleet.yaml");
        std::fs::write(
            &fleet,
            format!("gpus:\n  - model: {model_key}\n    mig-enabled: true\n"),
        )
        .unwrap();
        let node = Node::new(fleet.to_str().unwrap());
        for round in 0..6 {
            let (a, b) = (
                random_feasible(model, &mut rng),
                random_feasible(model, &mut rng),
            );
            let body = |w: &std::collections::BTreeMap<String, u32>| {
                w.iter()
                    .map(|(p, n)| format!("\"{p}\": {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let cfg = node.file(
                "pair.yaml",
                &format!(
                    "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{{}}}\n  b:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {{{}}}\n",
                    body(&a),
                    body(&b)
                ),
            );
            let o = node.apply(&cfg, "a");
            assert!(
                o.status.success(),
                "{model_key} round {round} a={a:?}:\n{}",
                text(&o)
            );
            let before = node.uuids(0);
            let o = node.apply(&cfg, "b");
            assert!(
                o.status.success(),
                "{model_key} round {round} {a:?} -> {b:?}:\n{}",
                text(&o)
            );
            assert!(
                node.mig(&["assert", "-f", &cfg, "-c", "b"])
                    .status
                    .success(),
                "{model_key} {b:?} converged"
            );
            let after = node.uuids(0);
            for (place, uuid) in &before {
                if let Some((_, now)) = after.iter().find(|(p, _)| p == place) {
                    assert_eq!(
                        now, uuid,
                        "{model_key} {a:?} -> {b:?}: {place} is in both layouts but was recreated"
                    );
                }
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "needs the test-only --crash-after: cargo test --features test-hooks (scripts/test sets it)"
)]
fn a_crash_between_creating_a_gpu_instance_and_its_compute_instance_is_cleaned_up() {
    let node = Node::new("dgx-h100");
    // 8 mode changes, then the first GPU instance on GPU 0; the crash comes before its compute
    // instance, leaving a GPU instance that no snapshot shows as a MIG device.
    let o = node.mig(&[
        "apply",
        "-f",
        SEED,
        "-c",
        "all-1g.10gb",
        "--crash-after",
        "9",
    ]);
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    assert!(node.layouts()[0].is_empty());
    let o = node.apply(SEED, "all-1g.10gb");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("left without a compute instance"),
        "{}",
        text(&o)
    );
    assert!(node.layouts().iter().all(|l| counts(l, "1g.10gb") == 7));
}

/// NVIDIA's published default config (mig-parted v0.15.0), unchanged.
const NVIDIA_DEFAULT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../decide/mig/tests/fixtures/nvidia-mig-parted-v0.15.0-config-default.yaml"
);

#[test]
fn validate_with_a_forced_gpu_skips_entries_whose_device_filter_does_not_select_it() {
    // all-balanced has one entry per model; only the H100/A100-80GB one is meant for an H100.
    let o = run(&[
        "mig",
        "validate",
        "-f",
        NVIDIA_DEFAULT,
        "-c",
        "all-balanced",
        "--gpu",
        "H100-SXM5-80GB",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    let ok: Vec<&str> = out.lines().filter(|l| l.starts_with("ok ")).collect();
    assert_eq!(ok.len(), 1, "{out}");
    assert!(
        ok[0].contains("2x 1g.10gb + 1x 2g.20gb + 1x 3g.40gb"),
        "{out}"
    );
    assert!(
        out.contains("skip  all-balanced entry 1 (line ")
            && out.contains("device-filter 0x294110DE does not select H100-SXM5-80GB"),
        "{out}"
    );
    assert!(
        out.contains("12 entries: 1 ok, 11 skipped (device-filter), 0 failed"),
        "{out}"
    );
    // An entry without a filter still applies to the forced model, and still fails when it
    // does not fit.
    let o = run(&[
        "mig",
        "validate",
        "-f",
        NVIDIA_DEFAULT,
        "-c",
        "all-1g.24gb.gfx",
        "--gpu",
        "H100-SXM5-80GB",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("FAIL  all-1g.24gb.gfx entry 1"),
        "{}",
        text(&o)
    );
}

#[test]
fn nvidias_published_default_config_validates_with_zero_failures() {
    let o = run(&["mig", "validate", "-f", NVIDIA_DEFAULT]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
    assert!(!out.contains("names no GPU model gpuops knows"), "{out}");
    assert!(out.contains(" 0 failed"), "{out}");
}

#[test]
fn nvidias_mig_manager_manifest_is_accepted_and_configmaps_are_picked_by_name() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../decide/mig/tests/fixtures/nvidia-mig-manager-v0.15.0-example.yaml"
    );
    let o = run(&["mig", "validate", "-f", example, "-c", "all-1g.10gb"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&[
        "mig",
        "validate",
        "-f",
        example,
        "--configmap",
        "mig-parted-config",
        "-c",
        "all-balanced",
        "--gpu",
        "A100-SXM4-40GB",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    // Two ConfigMaps holding configs: ambiguous, both named with their lines.
    let dir = tempfile::tempdir().unwrap();
    let body = std::fs::read_to_string(example).unwrap();
    let last = body.split("---\n").last().unwrap().to_string();
    let two = dir.path().join("two.yaml");
    std::fs::write(
        &two,
        format!(
            "{body}---\n{}",
            last.replace("name: mig-parted-config", "name: other")
        ),
    )
    .unwrap();
    let two = two.to_str().unwrap();
    let o = run(&["mig", "validate", "-f", two]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o);
    assert!(
        out.contains("ConfigMap \"mig-parted-config\" (line 135), ConfigMap \"other\" (line ")
            && out.contains("--configmap NAME"),
        "{out}"
    );
    let o = run(&[
        "mig",
        "validate",
        "-f",
        two,
        "--configmap",
        "other",
        "-c",
        "all-disabled",
    ]);
    assert!(o.status.success(), "{}", text(&o));
}
