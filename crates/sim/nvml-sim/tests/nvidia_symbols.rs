//! The simulated driver exports every NVML symbol NVIDIA's own node tools call.
//!
//! go-nvml binds NVML lazily: a symbol the library lacks kills GPU Feature Discovery, the device
//! plugin or mig-parted with "undefined symbol" the first time they call it (as
//! `nvmlDeviceGetAttributes` did on every node with a MIG device). The list of what they call is
//! `fixtures/nvidia-nvml-symbols.txt`, generated from their sources by
//! `fixtures/nvidia_symbols.py`; this test opens the built library as they do and looks each up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

const FIXTURE: &str = include_str!("fixtures/nvidia-nvml-symbols.txt");

struct Entry<'a> {
    alternatives: Vec<&'a str>,
    verdict: &'a str,
    users: &'a str,
}

fn entries() -> Vec<Entry<'static>> {
    FIXTURE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut cols = l.split('\t');
            let names = cols.next().unwrap();
            Entry {
                alternatives: names.split('|').collect(),
                verdict: cols.next().unwrap_or_else(|| panic!("no verdict: {l}")),
                users: cols.next().unwrap_or(""),
            }
        })
        .collect()
}

#[test]
fn the_fixture_lists_go_nvml_in_full_with_a_verdict_for_each() {
    let all = entries();
    let families = all.len();
    let symbols: usize = all.iter().map(|e| e.alternatives.len()).sum();
    // go-nvml v0.13.3-1 binds 413 C functions; a truncated regeneration would drop most of them.
    assert!(symbols >= 400, "only {symbols} symbols in the fixture");
    for e in &all {
        assert!(
            ["required", "guarded", "excluded", "unused"].contains(&e.verdict),
            "{:?}: {}",
            e.alternatives,
            e.verdict
        );
    }
    let required = all.iter().filter(|e| e.verdict == "required").count();
    assert!(
        (40..families).contains(&required),
        "{required} required of {families}"
    );
    // The symbols the first side-by-side run found missing, by name, so a regeneration that lost
    // them cannot pass silently.
    for name in [
        "nvmlDeviceGetAttributes_v2",
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        "nvmlEventSetWait_v2",
    ] {
        assert!(
            all.iter()
                .any(|e| e.verdict == "required" && e.alternatives.contains(&name)),
            "{name} is not marked required"
        );
    }
}

#[test]
fn every_symbol_nvidias_node_tools_call_is_exported() {
    let path = common::sim_library();
    let lib = common::Library::open();
    let has = |name: &str| lib.symbol(name).is_some();
    let missing: Vec<String> = entries()
        .iter()
        .filter(|e| e.verdict == "required")
        .filter(|e| !e.alternatives.iter().any(|n| has(n)))
        .map(|e| format!("{} (called by {})", e.alternatives.join(" or "), e.users))
        .collect();
    assert!(
        missing.is_empty(),
        "{} lacks symbols NVIDIA's tools call:\n  {}",
        path.display(),
        missing.join("\n  ")
    );
    // Both names of the attributes call: go-nvml takes the _v2 when present, else the plain one.
    assert!(has("nvmlDeviceGetAttributes_v2") && has("nvmlDeviceGetAttributes"));
}
