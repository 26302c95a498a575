//! The placement planner against the catalog: feasibility of NVIDIA's named configs, minimal
//! disruption, explanations, an exhaustive oracle over every valid layout of a few models, and
//! what growing into a superset of the planner's own layout loses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_catalog::{Family, GiProfile, GpuModel, MigGeometry, ProfileName, ci_sizes, lookup};
use gpuops_mig::planner::{Infeasible, Plan, check, plan};
use gpuops_mig::{Instance, Layout};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

fn model(key: &str) -> &'static GpuModel {
    lookup(key).unwrap()
}

fn want(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(p, n)| ((*p).to_string(), *n)).collect()
}

fn layout(pairs: &[(&str, u32)]) -> Layout {
    Layout::new(pairs.iter().map(|(p, s)| Instance::new(*p, *s)).collect())
}

fn insts(pairs: &[(&str, u32)]) -> Vec<Instance> {
    layout(pairs).instances
}

fn mig_models() -> impl Iterator<Item = &'static GpuModel> {
    gpuops_catalog::models().iter().filter(|m| m.mig.is_some())
}

/// Independent validity check of a layout: names, compute-instance sizes, starts, overlap,
/// compute slices, per-GI-profile maxima and engines (each type summed over the instances, at most
/// the whole-GPU instance's).
fn validate(model: &GpuModel, layout: &Layout) -> Result<(), String> {
    let geo = model.mig.as_ref().ok_or("no MIG")?;
    let engines = |p: &GiProfile| [p.copy_engines, p.decoders, p.encoders, p.jpegs, p.ofas];
    let mut have = [0u32; 5];
    for p in geo.gi_profiles {
        for (h, e) in have.iter_mut().zip(engines(p)) {
            *h = (*h).max(e);
        }
    }
    let mut used = [0u32; 5];
    let mut slot_owner: Vec<Option<&Instance>> = vec![None; geo.memory_slices as usize];
    let mut compute = 0;
    let mut per_gi: HashMap<&str, u32> = HashMap::new();
    for inst in &layout.instances {
        let name: ProfileName = inst.profile.parse().map_err(|e| format!("{inst}: {e}"))?;
        let gi = model
            .gi_profile(&name.gi_name())
            .ok_or_else(|| format!("{inst}: unknown profile"))?;
        if let Some(c) = name.compute_slices
            && !ci_sizes(gi.compute_slices).contains(&c)
        {
            return Err(format!("{inst}: bad compute instance"));
        }
        if !gi.placement_starts.contains(&inst.start) {
            return Err(format!("{inst}: invalid start"));
        }
        for s in inst.start..inst.start + gi.memory_slices {
            let cell = slot_owner
                .get_mut(s as usize)
                .ok_or_else(|| format!("{inst}: past the last slice"))?;
            if let Some(other) = cell {
                return Err(format!("{inst} overlaps {other}"));
            }
            *cell = Some(inst);
        }
        compute += gi.compute_slices;
        for (u, e) in used.iter_mut().zip(engines(gi)) {
            *u += e;
        }
        let n = per_gi.entry(gi.name).or_default();
        *n += 1;
        if *n > gi.max_count {
            return Err(format!("more than {} {}", gi.max_count, gi.name));
        }
    }
    if compute > geo.compute_slices {
        return Err(format!("{compute} compute slices"));
    }
    if used.iter().zip(&have).any(|(u, h)| u > h) {
        return Err(format!("engines {used:?} of {have:?}"));
    }
    Ok(())
}

fn sorted(mut v: Vec<Instance>) -> Vec<Instance> {
    v.sort();
    v
}

/// Structural checks every plan must pass, whatever the input.
fn check_plan(model: &GpuModel, wanted: &BTreeMap<String, u32>, current: &Layout, p: &Plan) {
    let ctx = format!("{} wanted {wanted:?} from {current}: {p:?}", model.key);
    validate(model, &p.target).unwrap_or_else(|e| panic!("invalid target ({e}): {ctx}"));
    let want_counts: BTreeMap<String, u32> = wanted
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (k.clone(), *n))
        .collect();
    assert_eq!(p.target.counts(), want_counts, "{ctx}");
    // keep ∪ destroy = current, keep ∪ create = target (as multisets).
    assert_eq!(
        sorted(p.keep.iter().chain(&p.destroy).cloned().collect()),
        sorted(current.instances.clone()),
        "{ctx}"
    );
    assert_eq!(
        sorted(p.keep.iter().chain(&p.create).cloned().collect()),
        sorted(p.target.instances.clone()),
        "{ctx}"
    );
    // Creating one by one after the destroys stays valid at every step.
    let mut state = p.keep.clone();
    for c in &p.create {
        state.push(c.clone());
        validate(model, &Layout::new(state.clone()))
            .unwrap_or_else(|e| panic!("creating {c} is invalid ({e}): {ctx}"));
    }
    assert_eq!(p.is_noop(), p.destroy.is_empty() && p.create.is_empty());
}

#[test]
fn every_all_profile_config_fits_at_its_maximum_and_not_beyond() {
    let mut seen = 0;
    for m in mig_models() {
        for gi in m.mig.as_ref().unwrap().gi_profiles {
            let at_max = want(&[(gi.name, gi.max_count)]);
            let target =
                check(m, &at_max).unwrap_or_else(|e| panic!("{} all-{}: {e}", m.key, gi.name));
            validate(m, &target).unwrap();
            assert_eq!(target.counts(), at_max, "{}", m.key);
            let over = want(&[(gi.name, gi.max_count + 1)]);
            let err = check(m, &over).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "{}x {} exceeds the maximum of {} {} on {}",
                    gi.max_count + 1,
                    gi.name,
                    gi.max_count,
                    gi.name,
                    m.key
                )
            );
            seen += 1;
        }
    }
    assert!(seen > 50, "only {seen} profiles checked");
}

#[test]
fn all_balanced_configs_fit() {
    let cases: &[(&str, &[(&str, u32)])] = &[
        (
            "A100-SXM4-40GB",
            &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
        ),
        (
            "A100-PCIE-40GB",
            &[("1g.5gb", 2), ("2g.10gb", 1), ("3g.20gb", 1)],
        ),
        (
            "A100-SXM4-80GB",
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            "A100-PCIE-80GB",
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            "H100-SXM5-80GB",
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            "H100-PCIE-80GB",
            &[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)],
        ),
        (
            "H100-NVL",
            &[("1g.12gb", 2), ("2g.24gb", 1), ("3g.47gb", 1)],
        ),
        ("H200", &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)]),
        (
            "H200-NVL",
            &[("1g.18gb", 2), ("2g.35gb", 1), ("3g.71gb", 1)],
        ),
        ("B200", &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)]),
        ("A30", &[("1g.6gb", 2), ("2g.12gb", 1)]),
    ];
    for (key, pairs) in cases {
        let m = model(key);
        let wanted = want(pairs);
        let target = check(m, &wanted).unwrap_or_else(|e| panic!("{key}: {e}"));
        validate(m, &target).unwrap();
        assert_eq!(target.counts(), wanted, "{key}");
    }
    // The exact layouts. On an 8-slice part 3g has to take the upper half (no 1g starts at 7);
    // a full GPU cannot grow, so every layout is as good and the tie goes to the highest starts:
    // 2g the highest one left below the 3g.
    assert_eq!(
        check(
            model("H100-SXM5-80GB"),
            &want(&[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)])
        )
        .unwrap()
        .to_string(),
        "1g.10gb@0 1g.10gb@1 2g.20gb@2 3g.40gb@4"
    );
    assert_eq!(
        check(model("A30"), &want(&[("1g.6gb", 2), ("2g.12gb", 1)]))
            .unwrap()
            .to_string(),
        "1g.6gb@0 1g.6gb@1 2g.12gb@2"
    );
}

#[test]
fn driver_order_example_is_found_with_explicit_placements() {
    // `nvidia-smi mig -cgi 19,19,14,9` fails with the driver's default placement; the planner
    // places 3g first (largest first) in the upper half, where it has to be, and the rest below.
    let m = model("H100-SXM5-80GB");
    let wanted = want(&[("1g.10gb", 2), ("2g.20gb", 1), ("3g.40gb", 1)]);
    let p = plan(m, &wanted, &Layout::default()).unwrap();
    check_plan(m, &wanted, &Layout::default(), &p);
    assert!(p.keep.is_empty() && p.destroy.is_empty());
    assert_eq!(
        p.create,
        insts(&[
            ("1g.10gb", 0),
            ("1g.10gb", 1),
            ("2g.20gb", 2),
            ("3g.40gb", 4)
        ])
    );
}

#[test]
fn a_superset_keeps_everything() {
    let m = model("H100-SXM5-80GB");
    // The planner's own layout for one 3g is in the upper half, so the GPU it configured can grow
    // into the balanced config without moving it (3g at 0 would have to go: no 1g starts at 7).
    // At 4 it can grow into more count vectors, this one and 4g.40gb + 3g.40gb among them.
    let current = check(m, &want(&[("3g.40gb", 1)])).unwrap();
    assert_eq!(current, layout(&[("3g.40gb", 4)]));
    let wanted = want(&[("3g.40gb", 1), ("2g.20gb", 1), ("1g.10gb", 2)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert!(p.destroy.is_empty(), "{p:?}");
    assert_eq!(p.keep, insts(&[("3g.40gb", 4)]));
    assert_eq!(
        p.create,
        insts(&[("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2)])
    );

    // The lower half taken instead: the new pieces go around it.
    let current = layout(&[("3g.40gb", 0), ("1g.10gb", 5)]);
    let wanted = want(&[("3g.40gb", 1), ("1g.10gb", 3)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert!(p.destroy.is_empty(), "{p:?}");
    assert_eq!(p.create, insts(&[("1g.10gb", 4), ("1g.10gb", 6)]));
}

#[test]
fn the_current_layout_is_a_noop() {
    let m = model("H100-SXM5-80GB");
    for current in [
        layout(&[("3g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]),
        layout(&[("1g.10gb", 1), ("1g.10gb", 2), ("1c.3g.40gb", 4)]),
        layout(&[("7g.80gb", 0)]),
        layout(&[]),
    ] {
        let wanted = current.counts();
        let p = plan(m, &wanted, &current).unwrap();
        check_plan(m, &wanted, &current, &p);
        assert!(p.is_noop(), "{current}: {p:?}");
        assert_eq!(p.target, current);
        assert_eq!(p.keep, current.instances);
    }
}

#[test]
fn only_what_must_move_moves() {
    let m = model("H100-SXM5-80GB");
    // 4g.40gb can only start at 0, where the 1g.10gb is: it is recreated above. At 4 or 5 it can
    // still grow by a 1g.20gb (at 6) and a 1g.10gb, at 6 by a 2g.20gb (at 4) instead, which is
    // one count vector fewer; the tie between 4 and 5 goes to the higher start.
    let current = layout(&[("1g.10gb", 0)]);
    let wanted = want(&[("4g.40gb", 1), ("1g.10gb", 1)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert!(p.keep.is_empty());
    assert_eq!(p.destroy, insts(&[("1g.10gb", 0)]));
    assert_eq!(p.create, insts(&[("4g.40gb", 0), ("1g.10gb", 5)]));

    // With a second 1g.10gb already clear of the 4g, that one stays. The other goes to 4, not 6,
    // which would strand slot 7 (no 1g starts there) and leave no room for a 1g.20gb.
    let current = layout(&[("1g.10gb", 0), ("1g.10gb", 5)]);
    let wanted = want(&[("4g.40gb", 1), ("1g.10gb", 2)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert_eq!(p.keep, insts(&[("1g.10gb", 5)]));
    assert_eq!(p.destroy, insts(&[("1g.10gb", 0)]));
    assert_eq!(p.create, insts(&[("4g.40gb", 0), ("1g.10gb", 4)]));

    // Shrinking to one of two 1g.10gb: either could stay, and the one at 4 does, because it can
    // grow into more count vectors (e.g. no 4g.40gb fits beside the one at 0).
    let current = layout(&[("1g.10gb", 0), ("1g.10gb", 4)]);
    let wanted = want(&[("1g.10gb", 1)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert_eq!(p.keep, insts(&[("1g.10gb", 4)]));
    assert_eq!(p.destroy, insts(&[("1g.10gb", 0)]));
    assert!(p.create.is_empty());

    // Shrinking: drop one of three 2g.20gb, keep the others where they are.
    let current = layout(&[("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4)]);
    let wanted = want(&[("2g.20gb", 2), ("1g.20gb", 2)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert_eq!(p.keep, insts(&[("2g.20gb", 0), ("2g.20gb", 2)]));
    assert_eq!(p.destroy, insts(&[("2g.20gb", 4)]));
    assert_eq!(p.create, insts(&[("1g.20gb", 4), ("1g.20gb", 6)]));
}

#[test]
fn compute_instance_variants_are_distinct_devices() {
    let m = model("H100-SXM5-80GB");
    let current = layout(&[("1c.3g.40gb", 0)]);
    let wanted = want(&[("1c.3g.40gb", 1), ("3g.40gb", 1)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert_eq!(p.keep, insts(&[("1c.3g.40gb", 0)]));
    assert_eq!(p.create, insts(&[("3g.40gb", 4)]));

    // Same GI, different CI: not the same device, so it is recreated, in the upper half (like a
    // new 3g.40gb: there it can grow into more).
    let current = layout(&[("3g.40gb", 0)]);
    let wanted = want(&[("1c.3g.40gb", 1)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    assert!(p.keep.is_empty());
    assert_eq!(p.destroy, insts(&[("3g.40gb", 0)]));
    assert_eq!(p.create, insts(&[("1c.3g.40gb", 4)]));
}

#[test]
fn names_are_canonicalised_and_zero_counts_ignored() {
    let m = model("H100-SXM5-80GB");
    // Two spellings of one device add up.
    let wanted = want(&[("3G.40GB", 1), ("3c.3g.40gb", 1), ("2g.20gb", 0)]);
    assert_eq!(
        check(m, &wanted).unwrap().to_string(),
        "3g.40gb@0 3g.40gb@4"
    );
    let wanted = want(&[("1G.10GB+ME", 1), ("4g.40gb", 1)]);
    assert_eq!(
        check(m, &wanted).unwrap().to_string(),
        "4g.40gb@0 1g.10gb+me@6"
    );
    let wanted = want(&[("3G.40GB", 1), ("1c.2G.20gb", 1), ("2g.20gb", 0)]);
    assert_eq!(
        check(m, &wanted).unwrap().to_string(),
        "1c.2g.20gb@2 3g.40gb@4"
    );
    // A current instance written non-canonically is still recognised and kept.
    let current = layout(&[("3c.3g.40gb", 4)]);
    let p = plan(m, &want(&[("3g.40gb", 1)]), &current).unwrap();
    assert!(p.destroy.is_empty() && p.create.is_empty(), "{p:?}");
    assert_eq!(p.keep, insts(&[("3g.40gb", 4)]));
}

#[test]
fn invalid_current_instances_are_destroyed() {
    let m = model("H100-SXM5-80GB");
    let current = Layout::new(insts(&[
        ("9g.90gb", 0),
        ("2g.20gb", 1),
        ("nonsense", 3),
        ("1g.10gb", 6),
        ("1g.10gb", 6),
        ("3g.40gb", 4),
    ]));
    let wanted = want(&[("3g.40gb", 1), ("1g.10gb", 1)]);
    let p = plan(m, &wanted, &current).unwrap();
    check_plan(m, &wanted, &current, &p);
    // 3g.40gb@4 and 1g.10gb@6 overlap; only one can stay. Keeping the 3g.40gb grows into more
    // (a 1g.10gb at 6 strands slot 7); it is also the lowest start, which would win a tie.
    assert_eq!(p.keep, insts(&[("3g.40gb", 4)]));
    // The new 1g can grow equally far from any start below the kept 3g; the highest wins.
    assert_eq!(p.create, insts(&[("1g.10gb", 3)]));
    assert_eq!(
        sorted(p.destroy.clone()),
        sorted(insts(&[
            ("9g.90gb", 0),
            ("2g.20gb", 1),
            ("nonsense", 3),
            ("1g.10gb", 6),
            ("1g.10gb", 6)
        ]))
    );
    // Everything goes when nothing is wanted.
    let p = plan(m, &BTreeMap::new(), &current).unwrap();
    assert!(p.target.is_empty() && p.keep.is_empty());
    assert_eq!(p.destroy, current.instances);
}

#[test]
fn impossible_layouts_are_explained() {
    type Case<'a> = (&'a str, &'a [(&'a str, u32)], &'a str);
    let cases: &[Case] = &[
        (
            "H100-SXM5-80GB",
            &[("3g.40gb", 2), ("1g.10gb", 2)],
            "2x 3g.40gb + 2x 1g.10gb needs 10 of 8 memory slices on H100-SXM5-80GB",
        ),
        (
            "H100-SXM5-80GB",
            &[("4g.40gb", 1), ("1g.10gb", 4)],
            "1x 4g.40gb + 4x 1g.10gb needs 8 of 7 compute slices on H100-SXM5-80GB",
        ),
        (
            "H100-SXM5-80GB",
            &[("3g.40gb", 3)],
            "3x 3g.40gb exceeds the maximum of 2 3g.40gb on H100-SXM5-80GB",
        ),
        (
            // Compute-instance variants share their GPU instance profile's maximum.
            "H100-SXM5-80GB",
            &[("1c.3g.40gb", 1), ("3g.40gb", 2)],
            "3x 3g.40gb exceeds the maximum of 2 3g.40gb on H100-SXM5-80GB",
        ),
        (
            "H100-SXM5-80GB",
            &[("1g.10gb+me", 2)],
            "2x 1g.10gb+me exceeds the maximum of 1 1g.10gb+me on H100-SXM5-80GB",
        ),
        (
            "H100-SXM5-80GB",
            &[("9g.90gb", 1)],
            "9g.90gb is not a MIG profile of H100-SXM5-80GB (profiles: 1g.10gb, 1g.10gb+me, \
             1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)",
        ),
        (
            "A100-SXM4-40GB",
            &[("3g.40gb", 1)],
            "3g.40gb is not a MIG profile of A100-SXM4-40GB (profiles: 1g.5gb,",
        ),
        (
            "H100-SXM5-80GB",
            &[("3c.4g.40gb", 1)],
            "3c.4g.40gb: a 4g GPU instance cannot hold a 3-slice compute instance (valid: 1, 2, 4)",
        ),
        (
            "H100-SXM5-80GB",
            &[("5c.4g.40gb", 1)],
            "5c.4g.40gb: a 4g GPU instance cannot hold a 5-slice compute instance (valid: 1, 2, 4)",
        ),
        (
            "H100-SXM5-80GB",
            &[("4c.7g.80gb", 1), ("nonsense", 1)],
            "nonsense is not a MIG device name (missing memory size",
        ),
        (
            "A30",
            &[("4g.24gb", 1), ("1g.6gb", 1)],
            "1x 4g.24gb + 1x 1g.6gb needs 5 of 4 memory slices on A30",
        ),
        ("L4", &[("1g.6gb", 1)], "L4 does not support MIG"),
    ];
    for (key, pairs, expected) in cases {
        let err = check(model(key), &want(pairs)).unwrap_err().to_string();
        assert!(
            err.contains(expected),
            "{key} {pairs:?}:\n  got  {err}\n  want {expected}"
        );
        // plan explains the same way, whatever the GPU has now.
        let from = layout(&[("7g.80gb", 0)]);
        assert_eq!(
            plan(model(key), &want(pairs), &from)
                .unwrap_err()
                .to_string(),
            err
        );
    }
    // Machine-readable numbers.
    let err = check(
        model("H100-SXM5-80GB"),
        &want(&[("3g.40gb", 2), ("1g.10gb", 2)]),
    )
    .unwrap_err();
    assert_eq!(
        err,
        Infeasible::MemorySlices {
            wanted: "2x 3g.40gb + 2x 1g.10gb".into(),
            needed: 10,
            available: 8,
            model: "H100-SXM5-80GB".into(),
        }
    );
    let json = serde_json::to_value(&err).unwrap();
    assert_eq!(json["kind"], "memory_slices");
    assert_eq!(json["needed"], 10);
}

#[test]
fn three_g_and_two_two_g_fit_on_eight_slice_parts() {
    // 3g in the upper half leaves 0-1 and 2-3 for the 2g pair.
    let m = model("H100-SXM5-80GB");
    let t = check(m, &want(&[("3g.40gb", 1), ("2g.20gb", 2)])).unwrap();
    assert_eq!(t.to_string(), "2g.20gb@0 2g.20gb@2 3g.40gb@4");
}

// A made-up part where 3g may only take the lower half, so slice totals can fit while placements
// do not (on the catalog's parts they never disagree; see the exhaustive test below).
static TEST_PROFILES: &[GiProfile] = &[
    test_profile("1g.10gb", 19, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6]),
    test_profile("2g.20gb", 14, 2, 2, 3, &[0, 2, 4]),
    test_profile("3g.40gb", 9, 4, 3, 2, &[0]),
    test_profile("4g.40gb", 5, 4, 4, 1, &[0]),
];

const fn test_profile(
    name: &'static str,
    nvml_id: u32,
    memory_slices: u32,
    compute_slices: u32,
    max_count: u32,
    placement_starts: &'static [u32],
) -> GiProfile {
    GiProfile {
        name,
        nvml_enum: 0,
        nvml_id,
        memory_slices,
        compute_slices,
        max_count,
        placement_starts,
        memory_mib: 10240 * memory_slices as u64,
        sm_count: 16 * compute_slices,
        // No engines, so that only slices and placements decide on this made-up part.
        copy_engines: 0,
        decoders: 0,
        encoders: 0,
        jpegs: 0,
        ofas: 0,
    }
}

static TEST_MODEL: GpuModel = GpuModel {
    key: "TEST-3G-LOW",
    nvml_name: "Test GPU",
    pci_device_ids: &[],
    memory_mib: 81920,
    sm_count: 112,
    compute_capability: (9, 0),
    family: Family::Hopper,
    min_driver_major: 525,
    power_limit_mw: 700_000,
    max_sm_clock_mhz: 1980,
    max_mem_clock_mhz: 2619,
    nvlinks: 0,
    mig: Some(MigGeometry {
        memory_slices: 8,
        compute_slices: 7,
        mode_persists_across_reload: false,
        gi_profiles: TEST_PROFILES,
    }),
};

#[test]
fn placement_failures_name_the_blocked_profile() {
    let m = &TEST_MODEL;
    let err = check(m, &want(&[("3g.40gb", 1), ("2g.20gb", 2)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "1x 3g.40gb + 2x 2g.20gb has no valid placement on TEST-3G-LOW: 2g.20gb can start only at \
         slots 0, 2, 4; with 3g.40gb at 0-3 only slot 4 is left, but 2 are needed"
    );
    match err {
        Infeasible::Placement { detail, .. } => {
            let d = *detail;
            assert_eq!(
                (d.profile.as_str(), d.free, d.room, d.needed),
                ("2g.20gb", vec![4], 1, 2)
            );
            assert_eq!(d.starts, vec![0, 2, 4]);
            assert_eq!(d.placed, insts(&[("3g.40gb", 0)]));
        }
        other => panic!("{other:?}"),
    }
    let err = check(m, &want(&[("4g.40gb", 1), ("3g.40gb", 1)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "1x 4g.40gb + 1x 3g.40gb has no valid placement on TEST-3G-LOW: 3g.40gb can start only at \
         slot 0; with 4g.40gb at 0-3 no slot is left, but 1 is needed"
    );
    // plan gives the same explanation, and the same answer from any current layout.
    let from = layout(&[("3g.40gb", 0), ("2g.20gb", 4)]);
    let err2 = plan(m, &want(&[("3g.40gb", 1), ("2g.20gb", 2)]), &from).unwrap_err();
    assert!(
        err2.to_string()
            .contains("only slot 4 is left, but 2 are needed"),
        "{err2}"
    );
}

// ---------------------------------------------------------------------------------------------
// Exhaustive oracle: every valid layout of a model, enumerated naively.

/// Every MIG device name on the model: GI profiles and their smaller compute-instance variants.
fn device_names(model: &GpuModel) -> Vec<(String, &'static GiProfile)> {
    let mut out = Vec::new();
    for gi in model.mig.as_ref().unwrap().gi_profiles {
        out.push((gi.name.to_string(), gi));
        for c in ci_sizes(gi.compute_slices) {
            if c != gi.compute_slices {
                out.push((format!("{c}c.{}", gi.name), gi));
            }
        }
    }
    out
}

/// Every valid layout built from `names`, each as a sorted instance list.
fn all_layouts(model: &GpuModel, names: &[(String, &'static GiProfile)]) -> Vec<Layout> {
    let cands: Vec<Instance> = names
        .iter()
        .flat_map(|(n, gi)| {
            gi.placement_starts
                .iter()
                .map(move |&s| Instance::new(n.clone(), s))
        })
        .collect();
    fn walk(
        model: &GpuModel,
        cands: &[Instance],
        at: usize,
        chosen: &mut Vec<Instance>,
        out: &mut Vec<Layout>,
    ) {
        if at == cands.len() {
            out.push(Layout::new(chosen.clone()));
            return;
        }
        chosen.push(cands[at].clone());
        if validate(model, &Layout::new(chosen.clone())).is_ok() {
            walk(model, cands, at + 1, chosen, out);
        }
        chosen.pop();
        walk(model, cands, at + 1, chosen, out);
    }
    let mut out = Vec::new();
    walk(model, &cands, 0, &mut Vec::new(), &mut out);
    out
}

/// splitmix64: a tiny deterministic PRNG.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn common(a: &[Instance], b: &[Instance]) -> usize {
    let b: BTreeSet<&Instance> = b.iter().collect();
    a.iter().filter(|i| b.contains(i)).count()
}

#[test]
fn feasibility_matches_the_exhaustive_enumeration() {
    // For GI-profile-only counts: check() succeeds exactly for the counts some valid layout has,
    // and otherwise names a limit. On the catalog's parts no failure is a pure placement failure.
    for key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30", "B200"] {
        let m = model(key);
        let gi_names: Vec<(String, &'static GiProfile)> = m
            .mig
            .as_ref()
            .unwrap()
            .gi_profiles
            .iter()
            .map(|g| (g.name.to_string(), g))
            .collect();
        let realizable: BTreeSet<BTreeMap<String, u32>> = all_layouts(m, &gi_names)
            .iter()
            .map(Layout::counts)
            .collect();
        // Every count vector up to each profile's maximum + 1.
        let mut vectors: Vec<BTreeMap<String, u32>> = vec![BTreeMap::new()];
        for (name, gi) in &gi_names {
            vectors = vectors
                .into_iter()
                .flat_map(|v| {
                    (0..=gi.max_count + 1).map(move |n| {
                        let mut v = v.clone();
                        if n > 0 {
                            v.insert(name.clone(), n);
                        }
                        v
                    })
                })
                .collect();
        }
        let mut ok = 0;
        for v in &vectors {
            match check(m, v) {
                Ok(t) => {
                    assert!(realizable.contains(v), "{key} {v:?} -> {t}");
                    validate(m, &t).unwrap();
                    assert_eq!(&t.counts(), v);
                    ok += 1;
                }
                Err(e) => {
                    assert!(
                        !realizable.contains(v),
                        "{key} {v:?} is realizable but: {e}"
                    );
                    assert!(
                        !matches!(e, Infeasible::Placement { .. }),
                        "{key} {v:?}: {e}"
                    );
                }
            }
        }
        assert_eq!(ok, realizable.len(), "{key}");
    }
}

#[test]
fn random_replans_keep_as_much_as_any_layout_could() {
    let mut rng = Rng(0x5EED_F00D_6E05);
    let mut total = Duration::ZERO;
    let mut calls = 0u32;
    for key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30"] {
        let m = model(key);
        let layouts = all_layouts(m, &device_names(m));
        let mut by_counts: HashMap<BTreeMap<String, u32>, Vec<&Layout>> = HashMap::new();
        for l in &layouts {
            by_counts.entry(l.counts()).or_default().push(l);
        }
        for round in 0..1500 {
            let a = &layouts[rng.below(layouts.len())];
            // Half the time B shares a lot with A: A minus some plus some.
            let b = if round % 2 == 0 {
                &layouts[rng.below(layouts.len())]
            } else {
                let supersets: Vec<&Layout> = layouts
                    .iter()
                    .filter(|l| common(&a.instances, &l.instances) + 1 >= a.instances.len())
                    .collect();
                supersets[rng.below(supersets.len())]
            };
            let wanted = b.counts();
            let started = Instant::now();
            let p = plan(m, &wanted, a).unwrap_or_else(|e| panic!("{key} {a} -> {b}: {e}"));
            total += started.elapsed();
            calls += 1;
            check_plan(m, &wanted, a, &p);
            // Optimal: as many kept as the best layout with B's counts shares with A.
            let best = by_counts[&wanted]
                .iter()
                .map(|l| common(&a.instances, &l.instances))
                .max()
                .unwrap();
            assert_eq!(p.keep.len(), best, "{key} {a} -> {b}: {p:?}");
            assert!(p.keep.len() >= common(&a.instances, &b.instances));
            // Deterministic.
            assert_eq!(plan(m, &wanted, a).unwrap(), p);
            // Already there: nothing to do.
            let again = plan(m, &wanted, &p.target).unwrap();
            assert!(again.is_noop(), "{key} {}: {again:?}", p.target);
        }
        println!("{key}: {} valid layouts", layouts.len());
    }
    println!(
        "plan(): {calls} calls, mean {:?} per GPU (this build's profile)",
        total / calls.max(1)
    );
}

// ---------------------------------------------------------------------------------------------
// Growing into a superset: a GPU the planner configured for counts A, asked for counts B ⊇ A,
// should lose nothing. The planner picks the layout that can grow into the most count vectors for
// this, but on the 8-slice parts no layout achieves it for every pair; the pairs where the
// planner's own layout for A has to lose something are listed below, so any new loss fails (and
// a loss that goes away has to be dropped from the list).

/// Counts of GI profiles (no `Cc.` variants), e.g. `{"1g.10gb": 2, "3g.40gb": 1}`.
type Counts = BTreeMap<String, u32>;

/// Every count vector up to each GI profile's maximum that `check` accepts, with its layout.
fn feasible_counts(model: &GpuModel) -> Vec<(Counts, Layout)> {
    let mut vectors: Vec<Counts> = vec![BTreeMap::new()];
    for gi in model.mig.as_ref().unwrap().gi_profiles {
        vectors = vectors
            .into_iter()
            .flat_map(|v| {
                (0..=gi.max_count).map(move |n| {
                    let mut v = v.clone();
                    if n > 0 {
                        v.insert(gi.name.to_string(), n);
                    }
                    v
                })
            })
            .collect();
    }
    vectors
        .into_iter()
        .filter_map(|v| check(model, &v).ok().map(|l| (v, l)))
        .collect()
}

/// `3g.40gb + 2g.20gb + 2x 1g.10gb`: largest profile first (the catalog lists them smallest first).
fn spell(model: &GpuModel, counts: &Counts) -> String {
    let gis = model.mig.as_ref().unwrap().gi_profiles;
    let mut parts: Vec<(usize, String)> = counts
        .iter()
        .map(|(name, &n)| {
            let rank = gis.iter().position(|g| g.name == name).unwrap();
            let text = if n == 1 {
                name.clone()
            } else {
                format!("{n}x {name}")
            };
            (usize::MAX - rank, text)
        })
        .collect();
    parts.sort();
    parts
        .into_iter()
        .map(|(_, t)| t)
        .collect::<Vec<_>>()
        .join(" + ")
}

/// The inverse of [`spell`].
fn unspell(text: &str) -> Counts {
    text.split(" + ")
        .map(|part| match part.split_once("x ") {
            Some((n, name)) => (name.to_string(), n.parse().unwrap()),
            None => (part.to_string(), 1),
        })
        .collect()
}

/// The H100-SXM5-80GB name of each GI profile of `model`, when every one of them has the same
/// shape (id, slices, maximum, starts) there; the exceptions below are written in those names.
fn h100_names(m: &GpuModel) -> Option<HashMap<&'static str, &'static str>> {
    let h100 = model("H100-SXM5-80GB").mig.as_ref().unwrap();
    let geo = m.mig.as_ref().unwrap();
    if (geo.memory_slices, geo.compute_slices) != (h100.memory_slices, h100.compute_slices) {
        return None;
    }
    geo.gi_profiles
        .iter()
        .map(|p| {
            h100.gi_profiles
                .iter()
                .find(|h| {
                    (h.nvml_id, h.memory_slices, h.compute_slices, h.max_count)
                        == (p.nvml_id, p.memory_slices, p.compute_slices, p.max_count)
                        && h.placement_starts == p.placement_starts
                })
                .map(|h| (p.name, h.name))
        })
        .collect()
}

/// Known losses: (A, the supersets B for which `plan(B, check(A))` destroys something), in
/// H100-SXM5-80GB names. The same pairs, renamed, are the losses of every part with its geometry
/// (A100-SXM4-40GB and B200 here); A30 has none. 36 of the 1080 pairs A ⊊ B on those parts
/// (right-packing alone lost 120).
///
/// All are inherent: for each listed A, every layout with A's counts loses something for some B
/// (e.g. one 1g.10gb: B = 4g.40gb + 2g.20gb + 1g.10gb needs it at 6, B = 3g.40gb + 4x 1g.10gb in
/// 0-3), and the planner's layout for A loses the fewest (it grows into the most count vectors;
/// `the_planners_own_layout_grows_into_the_most_supersets` checks it against every layout).
const SUPERSET_EXCEPTIONS: &[(&str, &[&str])] = &[
    // Planner: 1g.10gb@5.
    (
        "1g.10gb",
        &[
            "3g.40gb + 2g.20gb + 1g.10gb",
            "4g.40gb + 2g.20gb + 1g.10gb",
            "3x 2g.20gb + 1g.10gb",
            "3g.40gb + 2g.20gb + 1g.10gb+me + 1g.10gb",
            "3g.40gb + 2g.20gb + 2x 1g.10gb",
            "3g.40gb + 1g.10gb+me + 3x 1g.10gb",
            "3g.40gb + 4x 1g.10gb",
        ],
    ),
    // Planner: 1g.10gb+me@5.
    (
        "1g.10gb+me",
        &[
            "3g.40gb + 2g.20gb + 1g.10gb+me",
            "4g.40gb + 2g.20gb + 1g.10gb+me",
            "3x 2g.20gb + 1g.10gb+me",
            "3g.40gb + 2g.20gb + 1g.10gb+me + 1g.10gb",
            "3g.40gb + 1g.10gb+me + 3x 1g.10gb",
        ],
    ),
    // Planner: 2g.20gb@4.
    (
        "2g.20gb",
        &[
            "3g.40gb + 2x 2g.20gb",
            "3g.40gb + 2g.20gb + 1g.10gb+me + 1g.10gb",
            "3g.40gb + 2g.20gb + 2x 1g.10gb",
        ],
    ),
    // Planner: 1g.10gb+me@4 1g.10gb@5.
    (
        "1g.10gb+me + 1g.10gb",
        &[
            "3g.40gb + 2g.20gb + 1g.10gb+me + 1g.10gb",
            "3g.40gb + 1g.10gb+me + 3x 1g.10gb",
        ],
    ),
    // Planner: 1g.10gb@4 1g.10gb@5.
    (
        "2x 1g.10gb",
        &[
            "3g.40gb + 2g.20gb + 2x 1g.10gb",
            "3g.40gb + 1g.10gb+me + 3x 1g.10gb",
            "3g.40gb + 4x 1g.10gb",
        ],
    ),
    // Planner: 1g.10gb@1 2g.20gb@2.
    (
        "2g.20gb + 1g.10gb",
        &["4g.40gb + 2g.20gb + 1g.10gb", "3x 2g.20gb + 1g.10gb"],
    ),
    // Planner: 1g.10gb+me@1 2g.20gb@2.
    (
        "2g.20gb + 1g.10gb+me",
        &["4g.40gb + 2g.20gb + 1g.10gb+me", "3x 2g.20gb + 1g.10gb+me"],
    ),
    // Planner: 4g.40gb@0 1g.10gb@5.
    ("4g.40gb + 1g.10gb", &["4g.40gb + 2g.20gb + 1g.10gb"]),
    // Planner: 4g.40gb@0 1g.10gb+me@6.
    (
        "4g.40gb + 1g.10gb+me",
        &["4g.40gb + 1g.20gb + 1g.10gb+me + 1g.10gb"],
    ),
    // Planner: 1g.10gb+me@1 1g.10gb@2 1g.10gb@3.
    (
        "1g.10gb+me + 2x 1g.10gb",
        &[
            "4g.40gb + 1g.10gb+me + 2x 1g.10gb",
            "2x 2g.20gb + 1g.10gb+me + 2x 1g.10gb",
        ],
    ),
    // Planner: 1g.10gb@1 1g.10gb@2 1g.10gb@3.
    (
        "3x 1g.10gb",
        &["4g.40gb + 3x 1g.10gb", "2x 2g.20gb + 3x 1g.10gb"],
    ),
    // Planner: 1g.10gb@1 2g.20gb@2 2g.20gb@4.
    ("2x 2g.20gb + 1g.10gb", &["3x 2g.20gb + 1g.10gb"]),
    // Planner: 2g.20gb@2 2g.20gb@4 1g.10gb+me@6.
    (
        "2x 2g.20gb + 1g.10gb+me",
        &["2x 2g.20gb + 1g.20gb + 1g.10gb+me + 1g.10gb"],
    ),
    // Planner: 1g.10gb+me@2 1g.10gb@3 2g.20gb@4 1g.10gb@6.
    (
        "2g.20gb + 1g.10gb+me + 2x 1g.10gb",
        &["2g.20gb + 1g.20gb + 1g.10gb+me + 3x 1g.10gb"],
    ),
    // Planner: 1g.10gb@1 1g.10gb@2 1g.10gb@3 2g.20gb@4.
    ("2g.20gb + 3x 1g.10gb", &["2x 2g.20gb + 3x 1g.10gb"]),
    // Planner: 1g.10gb+me@2 1g.10gb@3 1g.10gb@4 1g.10gb@5 1g.10gb@6.
    (
        "1g.10gb+me + 4x 1g.10gb",
        &["1g.20gb + 1g.10gb+me + 5x 1g.10gb"],
    ),
    // Planner: 1g.10gb@1 1g.10gb@2 1g.10gb@3 1g.10gb@4 1g.10gb@5.
    ("5x 1g.10gb", &["2g.20gb + 5x 1g.10gb"]),
];

#[test]
fn a_superset_of_the_planners_own_layout_loses_nothing() {
    let expected: BTreeSet<(Counts, Counts)> = SUPERSET_EXCEPTIONS
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(|b| (unspell(a), unspell(b))))
        .collect();
    let h100 = model("H100-SXM5-80GB");
    let mut report = Vec::new();
    for key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30", "B200"] {
        let m = model(key);
        let names = h100_names(m);
        let to_h100 = |c: &Counts| -> Counts {
            match &names {
                Some(n) => c
                    .iter()
                    .map(|(k, v)| (n[k.as_str()].to_string(), *v))
                    .collect(),
                None => c.clone(),
            }
        };
        let feasible = feasible_counts(m);
        let mut lost: BTreeSet<(Counts, Counts)> = BTreeSet::new();
        let mut pairs = 0;
        for (a, current) in &feasible {
            for (b, _) in &feasible {
                if !a.iter().all(|(k, n)| b.get(k).is_some_and(|bn| bn >= n)) {
                    continue;
                }
                pairs += 1;
                let p = plan(m, b, current).unwrap_or_else(|e| panic!("{key} {b:?}: {e}"));
                if p.destroy.is_empty() {
                    continue;
                }
                let pair = (to_h100(a), to_h100(b));
                if names.is_none() || !expected.contains(&pair) {
                    report.push(format!(
                        "{key}: [{current}] for {} loses {} for {}: target [{}]",
                        spell(m, a),
                        Layout::new(p.destroy.clone()),
                        spell(m, b),
                        p.target
                    ));
                }
                lost.insert(pair);
            }
        }
        assert!(pairs > 50, "{key}: only {pairs} pairs");
        if names.is_some() {
            for (a, b) in expected.difference(&lost) {
                report.push(format!(
                    "{key}: no longer loses anything for {} -> {} (H100 names): drop the exception",
                    spell(h100, a),
                    spell(h100, b)
                ));
            }
        }
    }
    assert!(
        report.is_empty(),
        "{} unexpected superset results:\n{}",
        report.len(),
        report.join("\n")
    );
}

#[test]
fn the_planners_own_layout_grows_into_the_most_supersets() {
    // Against every layout with the same counts: none keeps its instances for more supersets
    // than the planner's own. (Where the planner's loses nothing there is nothing to compare.)
    for key in ["H100-SXM5-80GB", "A100-SXM4-40GB", "A30", "B200"] {
        let m = model(key);
        let gi_names: Vec<(String, &'static GiProfile)> = m
            .mig
            .as_ref()
            .unwrap()
            .gi_profiles
            .iter()
            .map(|g| (g.name.to_string(), g))
            .collect();
        let mut by_counts: HashMap<Counts, Vec<Layout>> = HashMap::new();
        for l in all_layouts(m, &gi_names) {
            by_counts.entry(l.counts()).or_default().push(l);
        }
        let feasible = feasible_counts(m);
        let mut compared = 0;
        for (a, current) in &feasible {
            let supersets: Vec<&Counts> = feasible
                .iter()
                .map(|(b, _)| b)
                .filter(|b| a.iter().all(|(k, n)| b.get(k).is_some_and(|bn| bn >= n)))
                .collect();
            let losses = |l: &Layout| {
                supersets
                    .iter()
                    .filter(|b| !plan(m, b, l).unwrap().destroy.is_empty())
                    .count()
            };
            let own = losses(current);
            if own == 0 {
                continue;
            }
            for other in &by_counts[a] {
                let theirs = losses(other);
                assert!(
                    own <= theirs,
                    "{key}: [{current}] loses {own} supersets of {}, [{other}] only {theirs}",
                    spell(m, a)
                );
                compared += 1;
            }
        }
        println!("{key}: compared with {compared} other layouts");
    }
}

// ---------------------------------------------------------------------------------------------
// Engine budgets: instances share the GPU's engines, so each type summed over a layout is at most
// the GPU's. Media-extension (`+me`) profiles each take an NVJPG and an OFA.

#[test]
fn a30_takes_one_media_extension_instance() {
    let m = model("A30");
    let both = want(&[("1g.6gb+me", 1), ("2g.12gb+me", 1)]);
    let err = check(m, &both).unwrap_err();
    assert_eq!(
        err,
        Infeasible::Engines {
            wanted: "1x 2g.12gb+me + 1x 1g.6gb+me".into(),
            engine: "NVJPG".into(),
            needed: 2,
            available: 1,
            model: "A30".into(),
        }
    );
    assert!(
        err.to_string()
            .starts_with("1x 2g.12gb+me + 1x 1g.6gb+me needs 2 of 1 NVJPG engines on A30"),
        "{err}"
    );
    // From a layout that holds one of them, the other is still refused, whatever is kept.
    let from = layout(&[("2g.12gb+me", 0), ("1g.6gb", 2)]);
    assert!(matches!(
        plan(m, &both, &from),
        Err(Infeasible::Engines { .. })
    ));
    // One +me beside plain profiles fits, each one in turn.
    for wanted in [
        want(&[("1g.6gb+me", 1), ("1g.6gb", 1), ("2g.12gb", 1)]),
        want(&[("2g.12gb+me", 1), ("1g.6gb", 2)]),
        want(&[("1c.2g.12gb+me", 1), ("2g.12gb", 1)]),
    ] {
        let t = check(m, &wanted).unwrap_or_else(|e| panic!("{wanted:?}: {e}"));
        assert_eq!(t.counts(), wanted);
    }
    // A compute-instance variant of +me takes the engines of its GPU instance.
    assert!(matches!(
        check(m, &want(&[("1c.2g.12gb+me", 1), ("1g.6gb+me", 1)])),
        Err(Infeasible::Engines { .. })
    ));
}

#[test]
fn a100_takes_one_media_extension_instance_beside_six_plain_ones() {
    for key in ["A100-SXM4-40GB", "A100-SXM4-80GB"] {
        let m = model(key);
        let me = m
            .mig
            .as_ref()
            .unwrap()
            .gi_profiles
            .iter()
            .find(|p| p.name.ends_with("+me"))
            .unwrap();
        let plain = me.name.trim_end_matches("+me");
        assert!(check(m, &want(&[(me.name, 2)])).is_err(), "{key}");
        let t = check(m, &want(&[(me.name, 1), (plain, 6)])).unwrap();
        assert_eq!(t.instances.len(), 7, "{key}");
        // The whole-GPU instance owns the only NVJPG and OFA: no +me beside it is possible anyway
        // (slices), and the budget is the 7g's.
        let budget = m.mig.as_ref().unwrap().engine_budget();
        assert_eq!((budget.jpegs, budget.ofas), (1, 1), "{key}");
    }
}

#[test]
fn h100_shares_seven_nvjpgs_and_one_ofa() {
    let m = model("H100-SXM5-80GB");
    let budget = m.mig.as_ref().unwrap().engine_budget();
    assert_eq!((budget.decoders, budget.jpegs, budget.ofas), (7, 7, 1));
    // Seven 1g each take an NVDEC and an NVJPG: exactly the GPU's seven.
    check(m, &want(&[("1g.10gb", 7)])).unwrap();
    check(m, &want(&[("1g.10gb+me", 1), ("1g.10gb", 6)])).unwrap();
    check(
        m,
        &want(&[
            ("1g.10gb+me", 1),
            ("3g.40gb", 1),
            ("2g.20gb", 1),
            ("1g.10gb", 1),
        ]),
    )
    .unwrap();
    // The OFA is the one engine a second +me would need: the per-profile maximum already says so.
    assert!(matches!(
        check(m, &want(&[("1g.10gb+me", 2)])),
        Err(Infeasible::TooMany { .. })
    ));
}

#[test]
fn no_catalog_layout_exceeds_an_engine_budget() {
    // Every layout the planner accepts from empty, on every MIG model, sums each engine type to
    // at most the GPU's: the growth table and the up-front check agree.
    for m in mig_models() {
        let geo = m.mig.as_ref().unwrap();
        let budget = geo.engine_budget();
        for gi in geo.gi_profiles {
            for n in 1..=gi.max_count {
                let wanted = want(&[(gi.name, n)]);
                if let Ok(t) = check(m, &wanted) {
                    let used = t
                        .instances
                        .iter()
                        .fold(gpuops_catalog::EngineCounts::default(), |sum, i| {
                            sum.plus(m.gi_profile(&i.gi_profile()).unwrap().engines(), 1)
                        });
                    assert_eq!(used.exceeds(&budget), None, "{} {t}", m.key);
                }
            }
        }
    }
}

#[test]
fn mig_validate_fails_two_media_extension_instances_on_an_a30() {
    let cfg = gpuops_mig::config::parse(
        "version: v1\nmig-configs:\n  both-me:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.6gb+me\": 1\n        \"2g.12gb+me\": 1\n  one-me:\n    - devices: all\n      mig-enabled: true\n      mig-devices:\n        \"1g.6gb+me\": 1\n        \"2g.12gb\": 1\n",
        "a30.yaml",
    )
    .unwrap();
    let report = gpuops_mig::validate::check(&cfg, None, Some(model("A30"))).unwrap();
    let text = report.text();
    assert_eq!((report.ok, report.failed), (1, 1), "{text}");
    assert!(
        text.contains("FAIL  both-me entry 1")
            && text.contains("needs 2 of 1 NVJPG engines on A30"),
        "{text}"
    );
}
