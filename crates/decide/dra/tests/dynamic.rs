//! Dynamic MIG: every valid placement as a partitionable device on the GPU's counter set.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

mod common;

use common::{inventory, model_of, with_mig};
use gpuops_dra::model::{DeviceType, valid_placements};
use gpuops_dra::{NodeFacts, Options, build};
use std::collections::BTreeMap;

fn dynamic() -> Options {
    Options {
        dynamic_mig: true,
        ..Options::default()
    }
}

#[test]
fn h100_offers_the_whole_gpu_and_every_placement_on_one_counter_set() {
    let inv = inventory("dgx-h100");
    let m = build(&inv, &NodeFacts::default(), &dynamic());
    let model = model_of(&inv.gpus[0]);
    let geometry = model.mig.as_ref().unwrap();
    let placements: usize = geometry
        .gi_profiles
        .iter()
        .map(|p| p.placement_starts.len())
        .sum();
    // Every catalog placement is valid on its own; the planner agrees.
    assert_eq!(valid_placements(model).len(), placements);

    let on0: Vec<_> = m.devices.iter().filter(|d| d.gpu_minor == 0).collect();
    assert_eq!(on0.len(), placements + 1);
    assert_eq!(on0[0].name, "gpu-0");
    assert_eq!(m.counter_sets.len(), 8);
    let set = &m.counter_sets[0];
    assert_eq!(set.name, "gpu-0-counter-set");
    let mut expected_keys: Vec<String> = [
        "copy-engines",
        "decoders",
        "encoders",
        "jpeg-engines",
        "memory",
        "multiprocessors",
        "ofa-engines",
    ]
    .map(String::from)
    .to_vec();
    expected_keys.extend((0..8).map(|i| format!("memory-slice-{i}")));
    expected_keys.sort();
    assert_eq!(
        set.counters.keys().cloned().collect::<Vec<_>>(),
        expected_keys
    );
    // The largest profile's figures (7g.80gb), as NVIDIA takes the maximum over profiles.
    let seven = model.gi_profile("7g.80gb").unwrap();
    assert_eq!(set.counters["multiprocessors"], u64::from(seven.sm_count));
    assert_eq!(set.counters["memory"], seven.memory_mib * 1024 * 1024);

    let whole = on0[0];
    assert_eq!(whole.capacity["multiprocessors"], u64::from(seven.sm_count));
    assert_eq!(whole.consumes.as_ref().unwrap().counters, set.counters);

    let one = m.device("gpu-0-mig-1g10gb-19-3").unwrap();
    assert_eq!(one.device_type, DeviceType::Mig);
    assert!(one.mig.as_ref().unwrap().uuid.is_none());
    assert!(!one.attributes.contains_key("uuid"));
    let c = &one.consumes.as_ref().unwrap().counters;
    assert_eq!(c["memory-slice-3"], 1);
    assert_eq!(
        c.keys().filter(|k| k.starts_with("memory-slice-")).count(),
        1
    );
    let p = model.gi_profile("1g.10gb").unwrap();
    assert_eq!(c["multiprocessors"], u64::from(p.sm_count));
    // Capacities name no memory slices in dynamic MIG (the counters carry placement).
    assert!(one.capacity.keys().all(|k| !k.starts_with("memorySlice")));
    let four = m.device("gpu-0-mig-4g40gb-5-0").unwrap();
    let c = &four.consumes.as_ref().unwrap().counters;
    assert_eq!(
        (0..4).map(|i| c[&format!("memory-slice-{i}")]).sum::<u64>(),
        4
    );
}

#[test]
fn a_full_layout_fits_the_counters_and_one_more_placement_does_not() {
    let inv = inventory("dgx-a100");
    let mut inv = inv;
    // A100 in MIG mode: partitions only (leaving MIG mode needs a GPU reset there).
    inv.gpus[0].mig.current_enabled = true;
    let m = build(&inv, &NodeFacts::default(), &dynamic());
    assert!(m.device("gpu-0").is_none());
    // An A100 out of MIG mode cannot be partitioned without a reset: whole, as without dynamic MIG.
    let one = m.device("gpu-1").unwrap();
    assert!(one.consumes.is_none());
    assert!(
        m.devices
            .iter()
            .all(|d| d.gpu_minor != 1 || d.name == "gpu-1")
    );
    let set = m
        .counter_sets
        .iter()
        .find(|s| s.name == "gpu-0-counter-set")
        .unwrap();
    assert_eq!(m.counter_sets.len(), 1);

    let model = model_of(&inv.gpus[0]);
    let layout = gpuops_mig::planner::check(
        model,
        &BTreeMap::from([
            ("3g.40gb".to_string(), 1),
            ("2g.20gb".to_string(), 1),
            ("1g.10gb".to_string(), 2),
        ]),
    )
    .unwrap();
    let mut used: BTreeMap<String, u64> = BTreeMap::new();
    for inst in &layout.instances {
        let p = model.gi_profile(&inst.gi_profile()).unwrap();
        let name = gpuops_dra::names::mig_device_name(0, p.name, p.nvml_id, inst.start);
        let d = m
            .device(&name)
            .unwrap_or_else(|| panic!("{name} not offered"));
        for (k, v) in &d.consumes.as_ref().unwrap().counters {
            *used.entry(k.clone()).or_default() += v;
        }
    }
    for (k, v) in &used {
        assert!(*v <= set.counters[k], "{k}: {v} of {}", set.counters[k]);
    }
    // Every memory slice is taken now: no further placement fits.
    for d in m.devices.iter().filter(|d| d.gpu_minor == 0) {
        let fits = d
            .consumes
            .as_ref()
            .unwrap()
            .counters
            .iter()
            .all(|(k, v)| used.get(k).copied().unwrap_or(0) + v <= set.counters[k]);
        assert!(!fits, "{} would still fit", d.name);
    }
}

#[test]
fn static_mig_devices_that_exist_do_not_change_the_dynamic_offer() {
    let mut inv = inventory("hgx-h200");
    let before = build(&inv, &NodeFacts::default(), &dynamic());
    with_mig(&mut inv, 0, &[("1g.18gb", 2)]);
    let after = build(&inv, &NodeFacts::default(), &dynamic());
    let published = |m: &gpuops_dra::DeviceModel| {
        let slices = gpuops_dra::resource_slices("n", 1, m);
        serde_json::to_value(slices).unwrap()
    };
    assert_eq!(published(&before), published(&after));
    // The preparer still learns the UUID of an instance at a placement.
    let mig = &inv.gpus[0].mig_devices[1];
    let p = model_of(&inv.gpus[0])
        .gi_profile_by_id(mig.gi_profile_id)
        .unwrap();
    let name = gpuops_dra::names::mig_device_name(0, p.name, p.nvml_id, mig.placement_start);
    let d = after.device(&name).unwrap();
    assert_eq!(
        d.mig.as_ref().unwrap().uuid.as_deref(),
        Some(mig.uuid.as_str())
    );
    assert!(!d.attributes.contains_key("uuid"));
    assert!(
        before
            .device(&name)
            .unwrap()
            .mig
            .as_ref()
            .unwrap()
            .uuid
            .is_none()
    );
}

/// A set of placements fits the counters exactly when the placement planner accepts it as a
/// layout: the devices offered never add up to an invalid layout, and every valid layout can be
/// allocated. Both refuse two media-extension (`+me`) instances on a GPU with one NVJPG and one
/// OFA (A30: `1g.6gb+me` beside `2g.12gb+me`), as the hardware does.
#[test]
fn the_counters_allow_exactly_the_layouts_the_planner_accepts() {
    for key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30", "B200"] {
        let model = gpuops_catalog::lookup(key).unwrap();
        let mut inv = inventory("dgx-h100");
        inv.gpus.truncate(1);
        let gpu = &mut inv.gpus[0];
        gpu.model = Some(model.key.to_string());
        gpu.mig.current_enabled = true;
        let m = build(&inv, &NodeFacts::default(), &dynamic());
        let set = &m.counter_sets[0];
        let parts: Vec<_> = m.devices.iter().filter(|d| d.mig.is_some()).collect();
        assert!(!parts.is_empty(), "{key}");
        let slices = |i: usize| {
            let mig = parts[i].mig.as_ref().unwrap();
            (mig.placement_start..mig.placement_start + mig.placement_size)
                .fold(0u32, |m, s| m | 1 << s)
        };

        // Depth-first over every set of placements with disjoint memory slices (a superset of
        // both the valid layouts and the sets that fit the counters).
        let (mut valid, mut checked, mut planner_only) = (0usize, 0usize, 0usize);
        let mut stack: Vec<(usize, Vec<usize>, u32)> = vec![(0, vec![], 0)];
        while let Some((next, chosen, occupied)) = stack.pop() {
            if !chosen.is_empty() {
                checked += 1;
                let mut used: BTreeMap<&str, u64> = BTreeMap::new();
                for &i in &chosen {
                    for (k, v) in &parts[i].consumes.as_ref().unwrap().counters {
                        *used.entry(k.as_str()).or_default() += v;
                    }
                }
                let fits = used.iter().all(|(k, v)| *v <= set.counters[*k]);
                let instances: Vec<gpuops_mig::Instance> = chosen
                    .iter()
                    .map(|&i| {
                        let mig = parts[i].mig.as_ref().unwrap();
                        gpuops_mig::Instance::new(mig.profile.clone(), mig.placement_start)
                    })
                    .collect();
                let layout = gpuops_mig::Layout::new(instances.clone());
                let plan = gpuops_mig::planner::plan(model, &layout.counts(), &layout);
                let accepted = plan.as_ref().is_ok_and(|p| p.keep.len() == instances.len());
                let media = instances
                    .iter()
                    .filter(|i| i.profile.contains("+me"))
                    .count();
                if accepted && !fits && media >= 2 {
                    planner_only += 1;
                } else {
                    assert_eq!(
                        fits, accepted,
                        "{key}: {layout:?} fits the counters: {fits}, the planner: {plan:?}"
                    );
                }
                valid += usize::from(fits);
            }
            for i in next..parts.len() {
                if occupied & slices(i) == 0 {
                    let mut chosen = chosen.clone();
                    chosen.push(i);
                    stack.push((i + 1, chosen, occupied | slices(i)));
                }
            }
        }
        assert!(valid > parts.len(), "{key}: {valid}");
        eprintln!(
            "{key}: {} placements; of {checked} sets with disjoint memory slices, {valid} fit the counters and are valid layouts; {planner_only} more the planner accepts with two +me instances",
            parts.len()
        );
        assert_eq!(planner_only, 0, "{key}");
    }
}
