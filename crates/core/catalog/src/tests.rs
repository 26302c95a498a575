//! Table-driven checks of the catalog's data against /work/shared/reference/mig.md and against
//! itself: names follow the naming rule, maxima and placements match mig.md, and the layouts NVIDIA
//! ships (`all-balanced`, `all-<profile>`) fit without overlap.

use crate::nvml_enum::{
    GI_1_SLICE, GI_1_SLICE_ALL_ME, GI_1_SLICE_GFX, GI_1_SLICE_NO_ME, GI_1_SLICE_REV1,
    GI_1_SLICE_REV2, GI_2_SLICE, GI_2_SLICE_ALL_ME, GI_2_SLICE_GFX, GI_2_SLICE_NO_ME,
    GI_2_SLICE_REV1, GI_3_SLICE, GI_4_SLICE, GI_4_SLICE_GFX, GI_7_SLICE,
};
use crate::*;

/// Every model that has MIG geometry, with it.
fn mig_models() -> impl Iterator<Item = (&'static GpuModel, &'static MigGeometry)> {
    MODELS.iter().filter_map(|m| m.mig.as_ref().map(|g| (m, g)))
}

fn model(key: &str) -> &'static GpuModel {
    lookup(key).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// Names

#[test]
fn every_profile_renders_to_its_canonical_name() {
    for (m, g) in mig_models() {
        for p in g.gi_profiles {
            assert_eq!(
                render_gi_name(m, p),
                p.name,
                "{}: {} ({} MiB)",
                m.key,
                p.name,
                p.memory_mib
            );
            let parsed: ProfileName = p.name.parse().unwrap_or_else(|e| panic!("{}: {e}", m.key));
            assert_eq!(parsed.to_string(), p.name, "{}: canonical form", m.key);
            assert_eq!(
                parsed.gpu_slices, p.compute_slices,
                "{}: {} G",
                m.key, p.name
            );
            assert_eq!(
                parsed.memory_gb,
                memory_gb_for_name(p.memory_mib, m.memory_mib, g.memory_slices),
                "{}: {} memory",
                m.key,
                p.name
            );
        }
    }
}

#[test]
fn render_uses_the_enum_for_the_suffix() {
    let h100 = model("H100-SXM5-80GB");
    let base = h100.gi_profile("1g.10gb").expect("profile");
    let no_me = GiProfile {
        nvml_enum: GI_1_SLICE_NO_ME,
        ..base.clone()
    };
    assert_eq!(render_gi_name(h100, &no_me), "1g.10gb-me");
    let all_me = GiProfile {
        nvml_enum: crate::nvml_enum::GI_1_SLICE_ALL_ME,
        ..base.clone()
    };
    assert_eq!(render_gi_name(h100, &all_me), "1g.10gb+me.all");
}

/// Profile names and maxima per model, as mig.md lists them ("name ×max instances").
/// Rows marked "not in mig.md" are profiles mig.md leaves out that -lgip transcripts show.
const MAXIMA: &[(&str, &[(&str, u32)])] = &[
    (
        "A100-SXM4-40GB",
        &[
            ("1g.5gb", 7),
            ("1g.5gb+me", 1),
            ("1g.10gb", 4),
            ("2g.10gb", 3),
            ("3g.20gb", 2),
            ("4g.20gb", 1),
            ("7g.40gb", 1),
        ],
    ),
    (
        "A100-PCIE-40GB",
        &[
            ("1g.5gb", 7),
            ("1g.5gb+me", 1),
            ("1g.10gb", 4),
            ("2g.10gb", 3),
            ("3g.20gb", 2),
            ("4g.20gb", 1),
            ("7g.40gb", 1),
        ],
    ),
    (
        "A100-SXM4-80GB",
        &[
            ("1g.10gb", 7),
            ("1g.10gb+me", 1),
            ("1g.20gb", 4),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ],
    ),
    (
        "A100-PCIE-80GB",
        &[
            ("1g.10gb", 7),
            ("1g.10gb+me", 1),
            ("1g.20gb", 4),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ],
    ),
    (
        "A30",
        &[
            ("1g.6gb", 4),
            ("1g.6gb+me", 1),
            ("2g.12gb", 2),
            ("2g.12gb+me", 1),
            ("4g.24gb", 1),
        ],
    ),
    (
        "H100-SXM5-80GB",
        &[
            ("1g.10gb", 7),
            ("1g.10gb+me", 1),
            ("1g.20gb", 4),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ],
    ),
    (
        "H100-PCIE-80GB",
        &[
            ("1g.10gb", 7),
            ("1g.10gb+me", 1),
            ("1g.20gb", 4),
            ("2g.20gb", 3),
            ("3g.40gb", 2),
            ("4g.40gb", 1),
            ("7g.80gb", 1),
        ],
    ),
    // mig.md gives H100 NVL's names without maxima; they are the 8-slice maxima.
    (
        "H100-NVL",
        &[
            ("1g.12gb", 7),
            ("1g.12gb+me", 1),
            ("1g.24gb", 4),
            ("2g.24gb", 3),
            ("3g.47gb", 2),
            ("4g.47gb", 1),
            ("7g.94gb", 1),
        ],
    ),
    (
        "H200",
        &[
            ("1g.18gb", 7),
            ("1g.18gb+me", 1),
            ("1g.35gb", 4),
            ("2g.35gb", 3),
            ("3g.71gb", 2),
            ("4g.71gb", 1),
            ("7g.141gb", 1),
        ],
    ),
    (
        "H200-NVL",
        &[
            ("1g.18gb", 7),
            ("1g.18gb+me", 1),
            ("1g.35gb", 4),
            ("2g.35gb", 3),
            ("3g.71gb", 2),
            ("4g.71gb", 1),
            ("7g.141gb", 1),
        ],
    ),
    // "+me" not in mig.md.
    (
        "GH200",
        &[
            ("1g.12gb", 7),
            ("1g.12gb+me", 1),
            ("1g.24gb", 4),
            ("2g.24gb", 3),
            ("3g.48gb", 2),
            ("4g.48gb", 1),
            ("7g.96gb", 1),
        ],
    ),
    // "+me" not in mig.md.
    (
        "GH200-144GB",
        &[
            ("1g.18gb", 7),
            ("1g.18gb+me", 1),
            ("1g.36gb", 4),
            ("2g.36gb", 3),
            ("3g.72gb", 2),
            ("4g.72gb", 1),
            ("7g.144gb", 1),
        ],
    ),
    (
        "B200",
        &[
            ("1g.23gb", 7),
            ("1g.23gb+me", 1),
            ("1g.45gb", 4),
            ("2g.45gb", 3),
            ("3g.90gb", 2),
            ("4g.90gb", 1),
            ("7g.180gb", 1),
        ],
    ),
    // "+me" not in mig.md.
    (
        "GB200",
        &[
            ("1g.23gb", 7),
            ("1g.23gb+me", 1),
            ("1g.47gb", 4),
            ("2g.47gb", 3),
            ("3g.93gb", 2),
            ("4g.93gb", 1),
            ("7g.186gb", 1),
        ],
    ),
    // The rest: names and maxima from NVIDIA's default config (mig-parted v0.15.0), which
    // mig.md predates.
    (
        "GB200-189GB",
        &[
            ("1g.24gb", 7),
            ("1g.24gb+me", 1),
            ("1g.47gb", 4),
            ("2g.47gb", 3),
            ("3g.95gb", 2),
            ("4g.95gb", 1),
            ("7g.189gb", 1),
        ],
    ),
    (
        "B300",
        &[
            ("1g.34gb", 7),
            ("1g.34gb+me", 1),
            ("1g.67gb", 4),
            ("2g.67gb", 3),
            ("3g.135gb", 2),
            ("4g.135gb", 1),
            ("7g.269gb", 1),
        ],
    ),
    (
        "GB300",
        &[
            ("1g.35gb", 7),
            ("1g.35gb+me", 1),
            ("1g.70gb", 4),
            ("2g.70gb", 3),
            ("3g.139gb", 2),
            ("4g.139gb", 1),
            ("7g.278gb", 1),
        ],
    ),
    (
        "RTX-PRO-6000-BSE",
        &[
            ("1g.24gb", 4),
            ("1g.24gb+me", 1),
            ("1g.24gb+gfx", 4),
            ("1g.24gb+me.all", 1),
            ("1g.24gb-me", 4),
            ("2g.48gb", 2),
            ("2g.48gb+gfx", 2),
            ("2g.48gb+me.all", 1),
            ("2g.48gb-me", 2),
            ("4g.96gb", 1),
            ("4g.96gb+gfx", 1),
        ],
    ),
    (
        "H100-96GB",
        &[
            ("1g.12gb", 7),
            ("1g.12gb+me", 1),
            ("1g.24gb", 4),
            ("2g.24gb", 3),
            ("3g.48gb", 2),
            ("4g.48gb", 1),
            ("7g.96gb", 1),
        ],
    ),
    (
        "H20",
        &[
            ("1g.12gb", 7),
            ("1g.12gb+me", 1),
            ("1g.24gb", 4),
            ("2g.24gb", 3),
            ("3g.48gb", 2),
            ("4g.48gb", 1),
            ("7g.96gb", 1),
        ],
    ),
    (
        "PG506-96GB",
        &[
            ("1g.12gb", 7),
            ("1g.12gb+me", 1),
            ("1g.24gb", 4),
            ("2g.24gb", 3),
            ("3g.48gb", 2),
            ("4g.48gb", 1),
            ("7g.96gb", 1),
        ],
    ),
];

#[test]
fn profiles_and_maxima_match_mig_md() {
    let listed: Vec<&str> = MAXIMA.iter().map(|(k, _)| *k).collect();
    for (m, _) in mig_models() {
        assert!(
            listed.contains(&m.key),
            "{} has MIG but no row in MAXIMA",
            m.key
        );
    }
    for (key, expected) in MAXIMA {
        let m = model(key);
        let got: Vec<(&str, u32)> = m
            .mig
            .as_ref()
            .map(|g| {
                g.gi_profiles
                    .iter()
                    .map(|p| (p.name, p.max_count))
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(got, expected.to_vec(), "{key}");
    }
}

#[test]
fn placement_starts_match_mig_md() {
    for (m, g) in mig_models() {
        for p in g.gi_profiles {
            let expected: (&[u32], u32) = match (g.memory_slices, p.nvml_enum) {
                (8, GI_1_SLICE | GI_1_SLICE_REV1) => (&[0, 1, 2, 3, 4, 5, 6], 1),
                (8, GI_1_SLICE_REV2) => (&[0, 2, 4, 6], 2),
                (8, GI_2_SLICE) => (&[0, 2, 4], 2),
                (8, GI_3_SLICE) => (&[0, 4], 4),
                (8, GI_4_SLICE) => (&[0], 4),
                (8, GI_7_SLICE) => (&[0], 8),
                (
                    4,
                    GI_1_SLICE | GI_1_SLICE_REV1 | GI_1_SLICE_GFX | GI_1_SLICE_ALL_ME
                    | GI_1_SLICE_NO_ME,
                ) => (&[0, 1, 2, 3], 1),
                (
                    4,
                    GI_2_SLICE | GI_2_SLICE_REV1 | GI_2_SLICE_GFX | GI_2_SLICE_ALL_ME
                    | GI_2_SLICE_NO_ME,
                ) => (&[0, 2], 2),
                (4, GI_4_SLICE | GI_4_SLICE_GFX) => (&[0], 4),
                other => panic!(
                    "{}: {} has unexpected geometry/enum {other:?}",
                    m.key, p.name
                ),
            };
            assert_eq!(
                (p.placement_starts, p.memory_slices),
                expected,
                "{}: {}",
                m.key,
                p.name
            );
        }
    }
}

#[test]
fn nvml_ids_match_mig_md() {
    for (m, g) in mig_models() {
        for p in g.gi_profiles {
            let expected = match (g.memory_slices, p.nvml_enum) {
                (8, GI_1_SLICE) => 19,
                (8, GI_1_SLICE_REV1) => 20,
                (8, GI_1_SLICE_REV2) => 15,
                (8, GI_2_SLICE) => 14,
                (8, GI_3_SLICE) => 9,
                (8, GI_4_SLICE) => 5,
                (8, GI_7_SLICE) => 0,
                (4, GI_1_SLICE) => 14,
                (4, GI_1_SLICE_REV1) => 21,
                (4, GI_2_SLICE) => 5,
                (4, GI_2_SLICE_REV1) => 6,
                (4, GI_4_SLICE) => 0,
                // RTX PRO Blackwell's variants (47 and 65 from transcripts, the rest presumed).
                (4, GI_1_SLICE_GFX) => 47,
                (4, GI_1_SLICE_ALL_ME) => 65,
                (4, GI_1_SLICE_NO_ME) => 67,
                (4, GI_2_SLICE_GFX) => 35,
                (4, GI_2_SLICE_ALL_ME) => 64,
                (4, GI_2_SLICE_NO_ME) => 66,
                (4, GI_4_SLICE_GFX) => 32,
                other => panic!(
                    "{}: {} has unexpected geometry/enum {other:?}",
                    m.key, p.name
                ),
            };
            assert_eq!(p.nvml_id, expected, "{}: {}", m.key, p.name);
            assert_eq!(m.gi_profile_by_id(p.nvml_id).map(|q| q.name), Some(p.name));
            assert_eq!(
                m.gi_profile_by_enum(p.nvml_enum).map(|q| q.name),
                Some(p.name)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Layouts

/// Finds start slots for `request` (profile name, count) so that no two instances overlap, each
/// starts at one of its profile's placements, counts stay within `max_count` and compute slices
/// within the GPU's. Brute force: a GPU has at most 8 slots.
fn layout(m: &GpuModel, request: &[(&str, u32)]) -> Option<Vec<(&'static str, u32)>> {
    let g = m.mig.as_ref()?;
    let mut wanted: Vec<&'static GiProfile> = Vec::new();
    for (name, n) in request {
        let p = m.gi_profile(name)?;
        if *n > p.max_count {
            return None;
        }
        wanted.extend(std::iter::repeat_n(p, *n as usize));
    }
    if wanted.iter().map(|p| p.compute_slices).sum::<u32>() > g.compute_slices {
        return None;
    }
    // Big ones first: they have the fewest choices.
    wanted.sort_by_key(|p| std::cmp::Reverse(p.memory_slices));
    let mut placed = Vec::new();
    place(&wanted, g.memory_slices, 0, &mut placed).then_some(placed)
}

/// Places `wanted` one by one on the slots not in `used` (a bit per memory slice).
fn place(
    wanted: &[&'static GiProfile],
    slots: u32,
    used: u32,
    placed: &mut Vec<(&'static str, u32)>,
) -> bool {
    let Some((p, rest)) = wanted.split_first() else {
        return true;
    };
    for &start in p.placement_starts {
        if start + p.memory_slices > slots {
            continue;
        }
        let mask = ((1u32 << p.memory_slices) - 1) << start;
        if used & mask != 0 {
            continue;
        }
        placed.push((p.name, start));
        if place(rest, slots, used | mask, placed) {
            return true;
        }
        placed.pop();
    }
    false
}

/// Checks a layout found by [`layout`] independently: placements valid, nothing overlaps.
fn assert_valid(m: &GpuModel, placed: &[(&str, u32)]) {
    let mut used = 0u32;
    for (name, start) in placed {
        let p = m.gi_profile(name).expect("placed profile exists");
        assert!(
            p.placement_starts.contains(start),
            "{}: {name} at {start}",
            m.key
        );
        let mask = ((1u32 << p.memory_slices) - 1) << start;
        assert_eq!(used & mask, 0, "{}: {name} at {start} overlaps", m.key);
        used |= mask;
    }
}

/// `all-balanced` as mig.md lists it.
const BALANCED: &[(&str, &[(&str, u32)])] = &[
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
    ("B200", &[("1g.23gb", 2), ("2g.45gb", 1), ("3g.90gb", 1)]),
    ("A30", &[("1g.6gb", 2), ("2g.12gb", 1)]),
];

#[test]
fn all_balanced_fits_on_every_mig_model() {
    for (key, request) in BALANCED {
        let m = model(key);
        let placed =
            layout(m, request).unwrap_or_else(|| panic!("{key}: all-balanced does not fit"));
        assert_valid(m, &placed);
    }
    // Models mig.md gives no all-balanced for get the same recipe: 2×1g + 2g (+ 3g on 8 slices).
    for (m, g) in mig_models() {
        let by_enum = |e| {
            g.gi_profiles
                .iter()
                .find(|p| p.nvml_enum == e)
                .map(|p| p.name)
        };
        let mut request = vec![
            (by_enum(GI_1_SLICE).expect("1g"), 2),
            (by_enum(GI_2_SLICE).expect("2g"), 1),
        ];
        if g.memory_slices == 8 {
            request.push((by_enum(GI_3_SLICE).expect("3g"), 1));
        }
        let placed =
            layout(m, &request).unwrap_or_else(|| panic!("{}: balanced does not fit", m.key));
        assert_valid(m, &placed);
    }
}

#[test]
fn every_profile_fits_at_max_count() {
    for (m, g) in mig_models() {
        for p in g.gi_profiles {
            let placed = layout(m, &[(p.name, p.max_count)]).unwrap_or_else(|| {
                panic!("{}: all-{} ×{} does not fit", m.key, p.name, p.max_count)
            });
            assert_valid(m, &placed);
            // One more is refused, by the limit or by the geometry.
            assert!(
                layout(m, &[(p.name, p.max_count + 1)]).is_none(),
                "{}: {}",
                m.key,
                p.name
            );
        }
    }
}

#[test]
fn geometry_alone_limits_plain_profiles_to_max_count() {
    // Without the media-engine limit (`+me`, `+me.all`), max_count is exactly what fits. Checked by bypassing the
    // count limit: place max_count + 1 copies directly.
    for (m, g) in mig_models() {
        for p in g.gi_profiles.iter().filter(|p| {
            !matches!(
                p.nvml_enum,
                GI_1_SLICE_REV1 | GI_2_SLICE_REV1 | GI_1_SLICE_ALL_ME | GI_2_SLICE_ALL_ME
            )
        }) {
            let wanted = vec![p; p.max_count as usize + 1];
            let compute: u32 = wanted.iter().map(|q| q.compute_slices).sum();
            let fits =
                compute <= g.compute_slices && place(&wanted, g.memory_slices, 0, &mut Vec::new());
            assert!(
                !fits,
                "{}: {} fits more than {} times",
                m.key, p.name, p.max_count
            );
        }
    }
}

#[test]
fn known_mixed_layouts() {
    let a100 = model("A100-SXM4-40GB");
    // 4g + 3g fill the GPU (supported since R510).
    assert!(layout(a100, &[("4g.20gb", 1), ("3g.20gb", 1)]).is_some());
    // 7×1g leave slot 7 empty, and a 1g+me cannot go there.
    assert!(layout(a100, &[("1g.5gb", 7), ("1g.5gb+me", 1)]).is_none());
    // Compute slices run out before memory does: 3g + 3g + 1g is 7 compute slices, 3g+3g+2g is 8.
    assert!(layout(a100, &[("3g.20gb", 2)]).is_some());
    assert!(layout(a100, &[("2g.10gb", 3), ("3g.20gb", 1)]).is_none());
    // Two 1g.10gb (2 memory slices each) and a 3g.20gb: 8 memory slices, 5 compute.
    assert!(layout(a100, &[("1g.10gb", 2), ("3g.20gb", 1)]).is_some());
    let a30 = model("A30");
    assert!(layout(a30, &[("2g.12gb", 1), ("2g.12gb+me", 1)]).is_some());
    assert!(layout(a30, &[("4g.24gb", 1), ("1g.6gb", 1)]).is_none());
}

// ---------------------------------------------------------------------------------------------
// Look-ups

#[test]
fn lookup_is_case_insensitive_and_takes_nvml_names() {
    for m in MODELS {
        // A board variant shares its NVML name with the first model of that name.
        let first = MODELS
            .iter()
            .find(|x| x.nvml_name == m.nvml_name)
            .map(|x| x.key);
        for name in [m.nvml_name.to_string(), m.nvml_name.to_ascii_uppercase()] {
            assert_eq!(lookup(&name).map(|x| x.key).ok(), first, "{name:?}");
        }
        for name in [
            m.key.to_string(),
            m.key.to_ascii_lowercase(),
            format!("  {}  ", m.key),
        ] {
            assert_eq!(lookup(&name).map(|x| x.key), Ok(m.key), "{name:?}");
        }
    }
    assert_eq!(
        lookup("nvidia h100 80gb hbm3").map(|m| m.key),
        Ok("H100-SXM5-80GB")
    );
    assert_eq!(
        lookup("NVIDIA A100 80GB PCIe").map(|m| m.key),
        Ok("A100-PCIE-80GB")
    );
}

#[test]
fn unknown_model_error_lists_known_keys() {
    let err = lookup("H300").expect_err("unknown");
    let CatalogError::UnknownModel { name, known } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(name, "H300");
    assert_eq!(known, &known_keys());
    let text = err.to_string();
    assert!(
        text.starts_with("unknown GPU model \"H300\"; known models: "),
        "{text}"
    );
    for m in MODELS {
        assert!(text.contains(m.key), "{text} lacks {}", m.key);
    }
}

#[test]
fn keys_and_names_are_unique() {
    let mut keys: Vec<String> = MODELS.iter().map(|m| m.key.to_ascii_lowercase()).collect();
    // NVML names are unique except for board variants (same PCI id, other memory).
    let mut names: Vec<String> = MODELS
        .iter()
        .map(|m| format!("{} {}", m.nvml_name.to_ascii_lowercase(), m.memory_mib))
        .collect();
    keys.sort();
    keys.dedup();
    names.sort();
    names.dedup();
    assert_eq!(keys.len(), MODELS.len());
    assert_eq!(names.len(), MODELS.len());
    assert_eq!(models().len(), MODELS.len());
    assert_eq!(known_keys().len(), MODELS.len());
}

#[test]
fn every_pci_id_resolves_to_its_model() {
    let mut seen: Vec<(u16, &GpuModel)> = Vec::new();
    for m in MODELS {
        assert!(!m.pci_device_ids.is_empty(), "{}", m.key);
        for &id in m.pci_device_ids {
            match seen.iter().find(|(s, _)| *s == id) {
                // A later board variant of the same GPU (GB200's pre-production boards) shares
                // the id and the NVML name; the id resolves to the first, production, model.
                Some((_, first)) => {
                    assert_eq!(first.nvml_name, m.nvml_name, "{id:#06x} listed twice");
                    assert_ne!(first.memory_mib, m.memory_mib, "{id:#06x} listed twice");
                    assert_eq!(by_pci_device_id(id).map(|x| x.key), Some(first.key));
                }
                None => {
                    seen.push((id, m));
                    assert_eq!(
                        by_pci_device_id(id).map(|x| x.key),
                        Some(m.key),
                        "{id:#06x}"
                    );
                }
            }
        }
    }
    assert!(by_pci_device_id(0x0000).is_none());
    assert!(by_pci_device_id(0xFFFF).is_none());
}

#[test]
fn board_variants_are_told_apart_by_memory() {
    let production = model("GB200");
    let early = model("GB200-189GB");
    assert!(early.is_board_variant() && !production.is_board_variant());
    assert_eq!(by_pci_device_id(0x2941).map(|m| m.key), Some("GB200"));
    assert_eq!(identify(0x2941, 189_471).map(|m| m.key), Some("GB200"));
    assert_eq!(
        identify(0x2941, 193_024).map(|m| m.key),
        Some("GB200-189GB")
    );
    assert_eq!(identify(0x2330, 1).map(|m| m.key), Some("H100-SXM5-80GB"));
    assert!(identify(0xFFFF, 1).is_none());
    let variants: Vec<&str> = MODELS
        .iter()
        .filter(|m| m.is_board_variant())
        .map(|m| m.key)
        .collect();
    assert_eq!(variants, ["GB200-189GB"]);
}

#[test]
fn mig_md_pci_ids_resolve() {
    // mig.md's device-filter list.
    let cases: &[(&[u16], &[&str])] = &[
        (
            &[0x20B0, 0x20B1, 0x20F1, 0x20F6],
            &["A100-SXM4-40GB", "A100-PCIE-40GB"],
        ),
        (
            &[0x20B2, 0x20B5, 0x20F3, 0x20F5],
            &["A100-SXM4-80GB", "A100-PCIE-80GB"],
        ),
        (
            &[0x2330, 0x2331, 0x2322, 0x2324],
            &["H100-SXM5-80GB", "H100-PCIE-80GB"],
        ),
        (&[0x2321, 0x233A], &["H100-NVL"]),
        (&[0x2335], &["H200"]),
        (&[0x233B], &["H200-NVL"]),
        (&[0x2348], &["GH200-144GB"]),
        (&[0x2901], &["B200"]),
        (&[0x2941], &["GB200"]),
        (&[0x20B7], &["A30"]),
        // The ids NVIDIA's default config (mig-parted v0.15.0) filters by that mig.md lacks.
        (&[0x31C2], &["GB300"]),
        (&[0x3182], &["B300"]),
        (&[0x2BB5], &["RTX-PRO-6000-BSE"]),
        (&[0x2342], &["GH200"]),
        (&[0x233D], &["H100-96GB"]),
        (&[0x20B6], &["PG506-96GB"]),
        (&[0x2329], &["H20"]),
        (&[0x27B8], &["L4"]),
        (&[0x2236], &["A10"]),
    ];
    for (ids, keys) in cases {
        for id in *ids {
            let key = by_pci_device_id(*id).map(|m| m.key);
            assert!(
                key.is_some_and(|k| keys.contains(&k)),
                "{id:#06x} -> {key:?}, want one of {keys:?}"
            );
        }
    }
}

#[test]
fn ci_sizes_follow_the_rule() {
    assert_eq!(ci_sizes(7), vec![1, 2, 3, 4, 7]);
    assert_eq!(ci_sizes(4), vec![1, 2, 4]);
    assert_eq!(ci_sizes(3), vec![1, 2, 3]);
    assert_eq!(ci_sizes(2), vec![1, 2]);
    assert_eq!(ci_sizes(1), vec![1]);
    assert!(ci_sizes(0).is_empty());
}

#[test]
fn gi_profile_lookup_ignores_case() {
    let h100 = model("H100-SXM5-80GB");
    assert_eq!(h100.gi_profile("1G.10GB+ME").map(|p| p.nvml_id), Some(20));
    assert!(h100.gi_profile("1g.5gb").is_none());
    assert!(model("L4").gi_profile("1g.10gb").is_none());
    assert!(!model("L4").mig_capable());
    assert!(h100.mig_capable());
}

// ---------------------------------------------------------------------------------------------
// Consistency of the data

#[test]
fn model_facts_are_consistent() {
    for m in MODELS {
        let (major, minor) = m.compute_capability;
        assert_eq!(
            Family::from_compute_capability(major, minor),
            Some(m.family),
            "{}",
            m.key
        );
        assert!(
            m.memory_mib > 0 && m.sm_count > 0 && m.power_limit_mw > 0,
            "{}",
            m.key
        );
        assert!(
            m.max_sm_clock_mhz > 0 && m.max_mem_clock_mhz > 0,
            "{}",
            m.key
        );
        assert!(m.nvml_name.starts_with("NVIDIA "), "{}", m.key);
        if let Some(g) = &m.mig {
            // Ampere keeps MIG mode in InfoROM; Hopper and later lose it on driver reload.
            assert_eq!(
                g.mode_persists_across_reload,
                m.family == Family::Ampere,
                "{}",
                m.key
            );
            assert!(m.compute_capability.0 >= 8, "{}", m.key);
            let mut ids: Vec<u32> = g.gi_profiles.iter().map(|p| p.nvml_id).collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(
                ids.len(),
                g.gi_profiles.len(),
                "{}: duplicate profile ids",
                m.key
            );
            for p in g.gi_profiles {
                let at = format!("{}: {}", m.key, p.name);
                assert!(p.memory_mib > 0 && p.memory_mib <= m.memory_mib, "{at}");
                assert!(p.sm_count > 0 && p.sm_count <= m.sm_count, "{at}");
                assert!(p.compute_slices <= g.compute_slices, "{at}");
                assert!(p.memory_slices <= g.memory_slices, "{at}");
                assert!(p.max_count >= 1, "{at}");
                for s in p.placement_starts {
                    assert!(s + p.memory_slices <= g.memory_slices, "{at}: start {s}");
                    assert_eq!(s % p.memory_slices, 0, "{at}: start {s} is not aligned");
                }
                // Media-engine variants are the plain profile plus JPEG and OFA.
                if matches!(p.nvml_enum, GI_1_SLICE_REV1 | GI_2_SLICE_REV1) {
                    assert!(p.jpegs >= 1 && p.ofas >= 1 && p.decoders >= 1, "{at}");
                }
            }
            // Some profile spans every compute slice (the full-GPU profile).
            let full = g.gi_profiles.iter().map(|p| p.compute_slices).max();
            assert_eq!(full, Some(g.compute_slices), "{}", m.key);
        }
    }
}

#[test]
fn min_drivers_match_mig_md() {
    for (key, driver) in [
        ("A100-SXM4-40GB", 450),
        ("A100-SXM4-80GB", 450),
        ("A100-PCIE-80GB", 450),
        ("A30", 460),
        ("H100-SXM5-80GB", 525),
        ("H100-PCIE-80GB", 525),
        ("H200", 550),
        ("B200", 570),
        ("L4", 525),
        ("A10", 460),
    ] {
        assert_eq!(model(key).min_driver_major, driver, "{key}");
    }
}

#[test]
fn total_memory_gives_the_marketing_size() {
    // The full-GPU profile's name carries the GPU's size, which comes from total memory rounded up.
    for (key, gib) in [
        ("A100-SXM4-40GB", 40),
        ("A100-SXM4-80GB", 80),
        ("A30", 24),
        ("H100-SXM5-80GB", 80),
        ("H100-NVL", 94),
        ("H200", 141),
        ("GH200", 96),
        ("GH200-144GB", 144),
        ("B200", 180),
        ("GB200", 186),
        ("GB200-189GB", 189),
        ("B300", 269),
        ("GB300", 278),
        ("RTX-PRO-6000-BSE", 96),
        ("H100-96GB", 96),
        ("H20", 96),
        ("PG506-96GB", 96),
    ] {
        assert_eq!(model(key).memory_mib.div_ceil(1024), gib, "{key}");
    }
}
