//! The NVML layer against the simulated driver: the real nvml-wrapper code path, loaded from the
//! `nvml-sim` cdylib, with faults and load injected through the simulator's state directory as
//! `gpuops sim` does.

// The whole crate is test code; clippy's allow-*-in-tests settings cover only `#[test]` functions,
// not the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    Sim, fleet_state, now_ms, open_at, serial, set_state_env, sim_library, with_fleet, with_gpus,
};
use gpuops_inventory::{Health, Inventory, PcieLevel, RemappedRows};
use gpuops_nvml::{GpuEvent, Gpus, Library, NvmlError, PlacementSlot, raw_codes};
use gpuops_sim::control::LoadChange;
use gpuops_sim::{BUILTIN_FLEETS, Fleet, SimProcess, SimState};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const H100_NAME: &str = "NVIDIA H100 80GB HBM3";
/// PCI bus numbers of a DGX H100's GPUs, as the simulator lays them out.
const DGX_BUS_IDS: [&str; 8] = [
    "00000000:18:00.0",
    "00000000:2A:00.0",
    "00000000:3A:00.0",
    "00000000:5D:00.0",
    "00000000:9A:00.0",
    "00000000:AB:00.0",
    "00000000:BA:00.0",
    "00000000:DB:00.0",
];

// GPU-instance profile ids on 8-slice GPUs (A100/H100/H200/B200).
const P_1G: u32 = 19;
const P_1G_2M: u32 = 15;
const P_2G: u32 = 14;
const P_3G: u32 = 9;
const P_4G: u32 = 5;
const P_7G: u32 = 0;
// Compute-instance profile ids (== NVML_COMPUTE_INSTANCE_PROFILE_* enums).
const CI_1C: u32 = 0;
const CI_2C: u32 = 1;
const CI_3C: u32 = 2;

fn all_gpus(gpus: &Gpus) -> Vec<u32> {
    (0..gpus.count().unwrap()).collect()
}

fn snapshot(gpus: &Gpus) -> Inventory {
    let inv = gpus.snapshot().unwrap();
    assert!(
        inv.warnings.is_empty(),
        "snapshot warnings: {:#?}",
        inv.warnings
    );
    inv
}

fn catalog(key: &str) -> &'static gpuops_catalog::GpuModel {
    gpuops_catalog::lookup(key).unwrap()
}

fn call_code<T: std::fmt::Debug>(r: Result<T, NvmlError>) -> Option<u32> {
    r.expect_err("the call should have failed").code()
}

// ---------------------------------------------------------------------------------------------
// Snapshots
// ---------------------------------------------------------------------------------------------

#[test]
fn dgx_h100_snapshot_reads_every_figure_the_driver_has() {
    with_fleet("dgx-h100", |sim, gpus| {
        let state = sim.state();
        let model = catalog("H100-SXM5-80GB");
        assert_eq!(gpus.count().unwrap(), 8);
        assert_eq!(gpus.library(), &Library::Path(sim_library()));
        let inv = snapshot(gpus);

        assert_eq!(inv.driver_version, "580.105.08");
        assert_eq!(inv.cuda_driver_version, "13.0");
        assert_eq!(inv.nvml_version, "13.580.105.08");
        assert_eq!(inv.gpus.len(), 8);
        let numa: Vec<Option<u32>> = inv.gpus.iter().map(|g| g.numa_node).collect();
        assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1].map(Some));

        for (i, g) in inv.gpus.iter().enumerate() {
            let sim_gpu = &state.gpus[i];
            assert_eq!(g.index, i as u32);
            assert_eq!(g.health, Health::Healthy);
            assert_eq!(g.name, H100_NAME);
            assert!(g.uuid.starts_with("GPU-"), "{}", g.uuid);
            assert_eq!(g.uuid, sim_gpu.uuid);
            assert_eq!(g.serial.as_deref(), Some(sim_gpu.serial.as_str()));
            assert_eq!(g.pci_bus_id, DGX_BUS_IDS[i]);
            assert_eq!(g.pci_device_id, 0x2330_10DE);
            assert_eq!(g.minor_number, Some(i as u32));
            assert_eq!(g.model.as_deref(), Some("H100-SXM5-80GB"));
            assert_eq!(g.compute_capability, Some((9, 0)));
            assert_eq!(g.family.as_deref(), Some("hopper"));
            assert_eq!(g.sm_count, Some(132));
            assert_eq!(g.compute_mode.as_deref(), Some("default"));

            // Memory: the catalog's total; the driver's reservation is neither used nor free.
            let m = g.memory;
            assert_eq!(m.total_mib, model.memory_mib);
            assert!(
                m.reserved_mib > 0 && m.reserved_mib < m.total_mib / 50,
                "{m:?}"
            );
            assert_eq!(m.used_mib, 0, "idle GPU");
            assert_eq!(
                m.used_mib + m.free_mib + m.reserved_mib,
                m.total_mib,
                "{m:?}"
            );

            // MIG capable, off, nothing configured.
            assert!(g.mig.capable);
            assert!(!g.mig.current_enabled && !g.mig.pending_enabled);
            assert!(g.mig_devices.is_empty());

            // Every NVLink goes to one of the four NVSwitches.
            assert_eq!(g.nvlinks.len(), 18);
            let links: Vec<u32> = g.nvlinks.iter().map(|l| l.link).collect();
            assert_eq!(links, (0..18).collect::<Vec<_>>());
            for l in &g.nvlinks {
                assert!(l.remote_is_switch, "{l:?}");
                assert!(
                    ["E0", "E1", "E2", "E3"]
                        .map(|b| format!("00000000:{b}:00.0"))
                        .contains(&l.remote_pci_bus_id),
                    "{l:?}"
                );
            }

            // Telemetry of an idle board.
            let t = g.telemetry;
            assert_eq!(t.gpu_utilization_pct, Some(0));
            assert_eq!(t.memory_utilization_pct, Some(0));
            assert_eq!(t.encoder_utilization_pct, Some(0));
            assert_eq!(t.decoder_utilization_pct, Some(0));
            assert_eq!(t.temperature_c, Some(sim_gpu.load.temperature_c));
            assert_eq!(
                t.memory_temperature_c,
                Some(sim_gpu.load.memory_temperature_c)
            );
            assert_eq!(t.power_mw, Some(model.power_limit_mw / 10));
            assert!(t.energy_mj.is_some());
            assert_eq!(t.sm_clock_mhz, Some(345), "idle SM clock");
            assert_eq!(t.mem_clock_mhz, Some(model.max_mem_clock_mhz));
            assert_eq!(t.pcie_replay_counter, Some(0));
            assert_eq!(t.remapped_rows, Some(RemappedRows::default()));
        }

        // Topology: all 28 pairs, 18 NVLinks each through the switches, PCIe by switch and socket.
        assert_eq!(inv.topology.len(), 28);
        for l in &inv.topology {
            assert!(l.a < l.b, "{l:?}");
            assert_eq!(l.nvlinks, 18, "{l:?}");
        }
        let level = |a, b| inv.link(a, b).unwrap().pcie;
        assert_eq!(level(0, 1), PcieLevel::SingleSwitch);
        assert_eq!(level(2, 3), PcieLevel::SingleSwitch);
        assert_eq!(level(6, 7), PcieLevel::SingleSwitch);
        assert_eq!(level(0, 2), PcieLevel::SameNumaNode);
        assert_eq!(level(1, 3), PcieLevel::SameNumaNode);
        assert_eq!(level(5, 7), PcieLevel::SameNumaNode);
        assert_eq!(level(0, 4), PcieLevel::CrossCpu);
        assert_eq!(level(3, 4), PcieLevel::CrossCpu);
        assert_eq!(level(7, 0), PcieLevel::CrossCpu);
    });
}

#[test]
fn energy_counter_grows_with_time() {
    with_fleet("dgx-h100", |_, gpus| {
        let before = snapshot(gpus).gpus[0].telemetry.energy_mj.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(60));
        let after = snapshot(gpus).gpus[0].telemetry.energy_mj.unwrap();
        // 70 W idle for at least 60 ms is at least 4200 mJ.
        assert!(after >= before + 4_000, "{before} -> {after}");
    });
}

#[test]
fn other_fleets_snapshot_with_their_own_models() {
    // (fleet, NVML name, catalog key, GPUs, NVLinks per GPU, compute capability, family)
    let cases = [
        (
            "dgx-a100",
            "NVIDIA A100-SXM4-80GB",
            "A100-SXM4-80GB",
            8,
            12,
            (8, 0),
            "ampere",
        ),
        ("hgx-h200", "NVIDIA H200", "H200", 8, 18, (9, 0), "hopper"),
        (
            "dgx-b200",
            "NVIDIA B200",
            "B200",
            8,
            18,
            (10, 0),
            "blackwell",
        ),
        (
            "h100-nvl-x2",
            "NVIDIA H100 NVL",
            "H100-NVL",
            2,
            12,
            (9, 0),
            "hopper",
        ),
        ("l4x4", "NVIDIA L4", "L4", 4, 0, (8, 9), "ada-lovelace"),
    ];
    for (fleet, name, key, count, nvlinks, cc, family) in cases {
        with_fleet(fleet, |sim, gpus| {
            let state = sim.state();
            let model = catalog(key);
            let inv = snapshot(gpus);
            assert_eq!(inv.gpus.len(), count, "{fleet}");
            for (g, s) in inv.gpus.iter().zip(&state.gpus) {
                assert_eq!(g.name, name, "{fleet}");
                assert_eq!(g.uuid, s.uuid, "{fleet}");
                assert_eq!(g.model.as_deref(), Some(key), "{fleet}");
                assert_eq!(g.memory.total_mib, model.memory_mib, "{fleet}");
                assert_eq!(g.sm_count, Some(model.sm_count), "{fleet}");
                assert_eq!(g.compute_capability, Some(cc), "{fleet}");
                assert_eq!(g.family.as_deref(), Some(family), "{fleet}");
                assert_eq!(g.mig.capable, model.mig_capable(), "{fleet}");
                assert_eq!(g.nvlinks.len(), nvlinks, "{fleet} GPU {}", g.index);
            }
            let pairs = count * (count - 1) / 2;
            assert_eq!(inv.topology.len(), pairs, "{fleet}");
            assert!(
                inv.topology.iter().all(|l| l.nvlinks == nvlinks as u32),
                "{fleet}: {:?}",
                inv.topology
            );
        });
    }
}

#[test]
fn nvl_pairs_are_bridged_directly() {
    with_fleet("h100-nvl-x2", |_, gpus| {
        let inv = snapshot(gpus);
        let (a, b) = (&inv.gpus[0], &inv.gpus[1]);
        assert!(
            a.nvlinks
                .iter()
                .all(|l| !l.remote_is_switch && l.remote_pci_bus_id == b.pci_bus_id)
        );
        assert!(
            b.nvlinks
                .iter()
                .all(|l| !l.remote_is_switch && l.remote_pci_bus_id == a.pci_bus_id)
        );
        let link = inv.link(1, 0).unwrap();
        assert_eq!((link.a, link.b, link.nvlinks), (0, 1, 12));
        assert_eq!(link.pcie, PcieLevel::SingleSwitch);
    });
}

#[test]
fn l4_has_no_mig_and_no_nvlink() {
    with_fleet("l4x4", |_, gpus| {
        let inv = snapshot(gpus);
        for g in &inv.gpus {
            assert!(!g.mig.capable && !g.mig.current_enabled, "{:?}", g.mig);
            assert!(g.nvlinks.is_empty());
            assert!(g.mig_devices.is_empty());
        }
        assert_eq!(inv.link(0, 1).unwrap().pcie, PcieLevel::SingleSwitch);
        assert_eq!(inv.link(0, 2).unwrap().pcie, PcieLevel::SameNumaNode);
        assert!(inv.topology.iter().all(|l| l.nvlinks == 0));

        let err = gpus.remaining_capacity(0, P_1G).unwrap_err();
        assert!(
            matches!(err, NvmlError::NotSupported { gpu: Some(0), .. }),
            "{err:?}"
        );
        assert_eq!(err.code(), Some(raw_codes::NOT_SUPPORTED));
        let err = gpus.set_mig_mode(1, true).unwrap_err();
        assert!(
            matches!(err, NvmlError::NotSupported { gpu: Some(1), .. }),
            "{err:?}"
        );
        assert!(matches!(
            gpus.possible_placements(0, P_1G),
            Err(NvmlError::NotSupported { .. })
        ));
        assert_eq!(gpus.gi_profiles(0).unwrap(), Vec::new());
        // XIDs are still watched on GPUs without MIG.
        let (watcher, skipped) = gpus.watch_xids(&all_gpus(gpus)).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(watcher.watched(), vec![0, 1, 2, 3]);
    });
}

// ---------------------------------------------------------------------------------------------
// MIG
// ---------------------------------------------------------------------------------------------

/// Checks the GI profiles the driver reports for GPU `index` against the catalog, names included.
fn assert_profiles_match_catalog(gpus: &Gpus, index: u32, key: &str, total_mib: u64) {
    let model = catalog(key);
    let geometry = model.mig.as_ref().unwrap();
    let reported = gpus.gi_profiles(index).unwrap();
    let reported_names: BTreeSet<String> = reported.iter().map(|p| p.name_for(total_mib)).collect();
    let catalog_names: BTreeSet<String> = geometry
        .gi_profiles
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    assert_eq!(reported_names, catalog_names, "{key}: profile names");
    assert_eq!(reported.len(), geometry.gi_profiles.len(), "{key}");
    for p in &reported {
        let c = model.gi_profile_by_enum(p.nvml_enum).unwrap();
        let what = format!("{key} profile {}", c.name);
        assert_eq!(p.name_for(total_mib), c.name, "{what}");
        assert_eq!(p.id, c.nvml_id, "{what}");
        assert_eq!(p.slice_count, c.compute_slices, "{what}");
        assert_eq!(p.instance_count, c.max_count, "{what}");
        assert_eq!(p.memory_mib, c.memory_mib, "{what}");
        assert_eq!(p.sm_count, c.sm_count, "{what}");
    }
}

#[test]
fn mig_profile_names_come_from_the_driver_for_every_builtin_model() {
    let mut checked = BTreeSet::new();
    for (fleet, _) in BUILTIN_FLEETS {
        with_fleet(fleet, |sim, gpus| {
            let state = sim.state();
            let inv = snapshot(gpus);
            for (g, s) in inv.gpus.iter().zip(&state.gpus) {
                if catalog(&s.model).mig.is_none() || !checked.insert(s.model.clone()) {
                    continue;
                }
                gpus.set_mig_mode(g.index, true).unwrap();
                assert_profiles_match_catalog(gpus, g.index, &s.model, g.memory.total_mib);
            }
        });
    }
    let expected: BTreeSet<String> = [
        "A100-SXM4-80GB",
        "B200",
        "H100-NVL",
        "H100-SXM5-80GB",
        "H200",
    ]
    .map(String::from)
    .into();
    assert_eq!(checked, expected);
}

#[test]
fn mig_profile_names_come_from_the_driver_for_every_catalog_model() {
    // One of every MIG-capable model the catalog has, on one simulated node.
    let keys: Vec<&str> = gpuops_catalog::models()
        .iter()
        .filter(|m| m.mig_capable())
        .map(|m| m.key)
        .collect();
    let text = keys
        .iter()
        .fold("hostname: every-mig-model\ngpus:\n".to_string(), |t, k| {
            t + &format!("  - model: {k}\n")
        });
    let fleet = Fleet::parse(&text, "<every MIG model>").unwrap();
    let sim = Sim::new(&SimState::from_fleet(&fleet, now_ms()).unwrap());
    with_gpus(&sim, |gpus| {
        let inv = snapshot(gpus);
        assert_eq!(inv.gpus.len(), keys.len());
        for (g, key) in inv.gpus.iter().zip(&keys) {
            assert_eq!(g.model.as_deref(), Some(*key));
            gpus.set_mig_mode(g.index, true).unwrap();
            assert_profiles_match_catalog(gpus, g.index, key, g.memory.total_mib);
        }
    });
}

#[test]
fn mig_placements_capacity_and_explicit_creation() {
    with_fleet("dgx-h100", |_, gpus| {
        // MIG must be on first.
        assert_eq!(
            call_code(gpus.create_gpu_instance(0, P_1G, None)),
            Some(raw_codes::NOT_SUPPORTED)
        );
        gpus.set_mig_mode(0, true).unwrap();
        let mig = snapshot(gpus).gpus[0].mig;
        assert!(
            mig.capable && mig.current_enabled && mig.pending_enabled,
            "{mig:?}"
        );

        let starts = |p| -> Vec<(u32, u32)> {
            gpus.possible_placements(0, p)
                .unwrap()
                .iter()
                .map(|s| (s.start, s.size))
                .collect()
        };
        assert_eq!(starts(P_1G), (0..7).map(|s| (s, 1)).collect::<Vec<_>>());
        assert_eq!(starts(P_1G_2M), vec![(0, 2), (2, 2), (4, 2), (6, 2)]);
        assert_eq!(starts(P_2G), vec![(0, 2), (2, 2), (4, 2)]);
        assert_eq!(starts(P_3G), vec![(0, 4), (4, 4)]);
        assert_eq!(starts(P_4G), vec![(0, 4)]);
        assert_eq!(starts(P_7G), vec![(0, 8)]);
        assert_eq!(
            call_code(gpus.possible_placements(0, 1234)),
            Some(raw_codes::INVALID_ARGUMENT)
        );

        let capacity = |p| gpus.remaining_capacity(0, p).unwrap();
        assert_eq!(
            [P_1G, 20, P_1G_2M, P_2G, P_3G, P_4G, P_7G].map(capacity),
            [7, 1, 4, 3, 2, 1, 1]
        );

        let at = |start, size| Some(PlacementSlot { start, size });
        assert_eq!(gpus.create_gpu_instance(0, P_3G, at(4, 4)).unwrap(), 2);
        assert_eq!(gpus.create_gpu_instance(0, P_1G, at(0, 1)).unwrap(), 7);
        assert_eq!(gpus.create_gpu_instance(0, P_2G, at(2, 2)).unwrap(), 4);
        // 3g starts only at 0 or 4; slot 0 is taken; 7 - 3 - 1 - 2 compute slices leave one 1g.
        assert_eq!(
            call_code(gpus.create_gpu_instance(0, P_3G, at(2, 4))),
            Some(raw_codes::INVALID_ARGUMENT)
        );
        assert_eq!(
            call_code(gpus.create_gpu_instance(0, P_1G, at(0, 1))),
            Some(raw_codes::INSUFFICIENT_RESOURCES)
        );
        assert_eq!(capacity(P_1G), 1);
        assert_eq!(capacity(P_2G), 0);
        assert_eq!(capacity(P_3G), 0);
        assert_eq!(gpus.gpu_instance_ids(0, P_3G).unwrap(), vec![2]);
        assert_eq!(gpus.gpu_instance_ids(0, P_2G).unwrap(), vec![4]);
        assert_eq!(gpus.gpu_instance_ids(0, P_1G).unwrap(), vec![7]);
        assert_eq!(gpus.gpu_instance_ids(0, P_7G).unwrap(), Vec::<u32>::new());
        // The last 1g goes to the only free slot, 1.
        assert_eq!(gpus.create_gpu_instance(0, P_1G, None).unwrap(), 8);
        assert_eq!(capacity(P_1G), 0);
        // Other GPUs are untouched.
        assert!(!snapshot(gpus).gpus[1].mig.current_enabled);
    });
}

#[test]
fn default_placement_depends_on_creation_order() {
    with_fleet("dgx-h100", |_, gpus| {
        gpus.set_mig_mode(1, true).unwrap();
        gpus.set_mig_mode(2, true).unwrap();

        // 1g, 1g, 2g, 3g: the driver's placement choices leave no aligned half for the 3g.
        assert_eq!(
            gpus.create_gpu_instance(1, P_1G, None).unwrap(),
            13,
            "first 1g lands in slot 6"
        );
        gpus.create_gpu_instance(1, P_1G, None).unwrap();
        gpus.create_gpu_instance(1, P_2G, None).unwrap();
        let err = gpus.create_gpu_instance(1, P_3G, None).unwrap_err();
        assert_eq!(err.code(), Some(raw_codes::INSUFFICIENT_RESOURCES), "{err}");
        assert!(
            matches!(err, NvmlError::Call { gpu: Some(1), .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("insufficient resources"), "{err}");
        let mut ids = gpus.gpu_instance_ids(1, P_1G).unwrap();
        ids.sort_unstable();
        assert_eq!(ids, vec![12, 13]);

        // The same profiles largest-first fit.
        for p in [P_3G, P_1G, P_2G, P_1G] {
            gpus.create_gpu_instance(2, p, None)
                .unwrap_or_else(|e| panic!("profile {p}: {e}"));
        }
        assert_eq!(gpus.gpu_instance_ids(2, P_3G).unwrap().len(), 1);
        assert_eq!(gpus.gpu_instance_ids(2, P_1G).unwrap().len(), 2);
        assert_eq!(gpus.gpu_instance_ids(2, P_2G).unwrap().len(), 1);
    });
}

#[test]
fn mig_devices_show_in_the_snapshot_and_teardown_is_ordered() {
    with_fleet("dgx-h100", |sim, gpus| {
        gpus.set_mig_mode(0, true).unwrap();
        let at = |start, size| Some(PlacementSlot { start, size });
        let gi_3g = gpus.create_gpu_instance(0, P_3G, at(4, 4)).unwrap();
        let gi_2g = gpus.create_gpu_instance(0, P_2G, at(2, 2)).unwrap();
        let gi_1g = gpus.create_gpu_instance(0, P_1G, at(0, 1)).unwrap();
        assert_eq!((gi_3g, gi_2g, gi_1g), (2, 4, 7));
        // A GI with no compute instance is not a MIG device yet.
        assert!(snapshot(gpus).gpus[0].mig_devices.is_empty());

        assert_eq!(
            gpus.create_compute_instance(0, gi_3g, CI_1C, None).unwrap(),
            0
        );
        assert_eq!(
            gpus.create_compute_instance(0, gi_2g, CI_2C, None).unwrap(),
            0
        );
        assert_eq!(
            gpus.create_compute_instance(0, gi_1g, CI_1C, None).unwrap(),
            0
        );
        // A 3-slice CI does not fit in a 2g; a second 1c in the 3g goes at the next slot.
        assert!(gpus.create_compute_instance(0, gi_2g, CI_3C, None).is_err());
        assert_eq!(
            gpus.create_compute_instance(0, gi_3g, CI_1C, Some(2))
                .unwrap(),
            1
        );

        let inv = snapshot(gpus);
        let g = &inv.gpus[0];
        let state = sim.state();
        let sim_uuid = |gi: u32, ci: u32| {
            state.gpus[0]
                .gpu_instances
                .iter()
                .find(|i| i.id == gi)
                .and_then(|i| i.compute_instances.iter().find(|c| c.id == ci))
                .map(|c| c.uuid.clone())
                .unwrap()
        };
        let rows: Vec<_> = g
            .mig_devices
            .iter()
            .map(|m| {
                (
                    m.index,
                    m.gi_id,
                    m.ci_id,
                    m.profile.as_str(),
                    m.ci_profile.as_str(),
                    m.gi_profile_id,
                    m.placement_start,
                    m.placement_size,
                    m.memory_mib,
                    m.sm_count,
                    m.gi_slices,
                    m.ci_slices,
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                (
                    0,
                    2,
                    0,
                    "3g.40gb",
                    "1c.3g.40gb",
                    P_3G,
                    4,
                    4,
                    40448,
                    16,
                    3,
                    1
                ),
                (
                    1,
                    2,
                    1,
                    "3g.40gb",
                    "1c.3g.40gb",
                    P_3G,
                    4,
                    4,
                    40448,
                    16,
                    3,
                    1
                ),
                (2, 4, 0, "2g.20gb", "2g.20gb", P_2G, 2, 2, 20096, 32, 2, 2),
                (3, 7, 0, "1g.10gb", "1g.10gb", P_1G, 0, 1, 9984, 16, 1, 1),
            ]
        );
        let uuids: BTreeSet<&str> = g.mig_devices.iter().map(|m| m.uuid.as_str()).collect();
        assert_eq!(uuids.len(), 4, "MIG UUIDs are distinct");
        for m in &g.mig_devices {
            assert!(m.uuid.starts_with("MIG-"), "{}", m.uuid);
            assert_eq!(m.uuid, sim_uuid(m.gi_id, m.ci_id));
            assert_eq!(inv.gpu_by_uuid(&m.uuid).map(|p| p.index), Some(0));
        }
        assert!(inv.gpus[1..].iter().all(|g| g.mig_devices.is_empty()));

        // Teardown must go CIs first: a GI with compute instances is in use.
        let err = gpus.destroy_gpu_instance(0, gi_3g).unwrap_err();
        assert_eq!(err.code(), Some(raw_codes::IN_USE), "{err}");
        assert_eq!(
            call_code(gpus.set_mig_mode(0, false)),
            Some(raw_codes::IN_USE)
        );
        gpus.destroy_compute_instance(0, gi_3g, 0).unwrap();
        assert_eq!(
            call_code(gpus.destroy_gpu_instance(0, gi_3g)),
            Some(raw_codes::IN_USE)
        );
        gpus.destroy_compute_instance(0, gi_3g, 1).unwrap();
        gpus.destroy_gpu_instance(0, gi_3g).unwrap();
        assert_eq!(gpus.gpu_instance_ids(0, P_3G).unwrap(), Vec::<u32>::new());
        assert!(gpus.destroy_gpu_instance(0, gi_3g).is_err(), "already gone");
        let left: Vec<u32> = snapshot(gpus).gpus[0]
            .mig_devices
            .iter()
            .map(|m| m.gi_id)
            .collect();
        assert_eq!(left, vec![4, 7]);

        for gi in [gi_2g, gi_1g] {
            gpus.destroy_compute_instance(0, gi, 0).unwrap();
            gpus.destroy_gpu_instance(0, gi).unwrap();
        }
        gpus.set_mig_mode(0, false).unwrap();
        let g = &snapshot(gpus).gpus[0];
        assert!(!g.mig.current_enabled && g.mig_devices.is_empty());
        assert!(sim.state().gpus[0].gpu_instances.is_empty());
    });
}

#[test]
fn full_gpu_instance_split_into_compute_instances() {
    with_fleet("dgx-h100", |_, gpus| {
        gpus.set_mig_mode(3, true).unwrap();
        let gi = gpus.create_gpu_instance(3, P_7G, None).unwrap();
        assert_eq!(gi, 0);
        assert_eq!(gpus.create_compute_instance(3, gi, CI_3C, None).unwrap(), 0);
        assert_eq!(gpus.create_compute_instance(3, gi, CI_3C, None).unwrap(), 1);
        let err = gpus
            .create_compute_instance(3, gi, CI_3C, None)
            .unwrap_err();
        assert_eq!(err.code(), Some(raw_codes::INSUFFICIENT_RESOURCES), "{err}");
        let inv = snapshot(gpus);
        let names: Vec<&str> = inv.gpus[3]
            .mig_devices
            .iter()
            .map(|m| m.ci_profile.as_str())
            .collect();
        assert_eq!(names, ["3c.7g.80gb", "3c.7g.80gb"]);
        assert!(
            inv.gpus[3]
                .mig_devices
                .iter()
                .all(|m| m.profile == "7g.80gb" && m.memory_mib == 81152)
        );
    });
}

#[test]
fn a100_and_h200_mig_devices_are_named_for_their_memory() {
    let cases = [
        ("dgx-a100", "1g.10gb", 9728, 14, "7g.80gb", 98),
        ("hgx-h200", "1g.18gb", 16384, 16, "7g.141gb", 132),
    ];
    for (fleet, small, small_mib, small_sms, full, full_sms) in cases {
        with_fleet(fleet, |_, gpus| {
            for i in [0, 1] {
                gpus.set_mig_mode(i, true).unwrap();
            }
            let gi = gpus.create_gpu_instance(0, P_1G, None).unwrap();
            gpus.create_compute_instance(0, 0, CI_1C, None).unwrap_err(); // no GI 0 on GPU 0
            gpus.create_compute_instance(0, gi, CI_1C, None).unwrap();
            let gi = gpus.create_gpu_instance(1, P_7G, None).unwrap();
            gpus.create_compute_instance(1, gi, 4, None).unwrap(); // the 7-slice CI
            let inv = snapshot(gpus);
            let m = &inv.gpus[0].mig_devices[0];
            assert_eq!(
                (m.profile.as_str(), m.ci_profile.as_str()),
                (small, small),
                "{fleet}"
            );
            assert_eq!(
                (m.memory_mib, m.sm_count),
                (small_mib, small_sms),
                "{fleet}"
            );
            let m = &inv.gpus[1].mig_devices[0];
            assert_eq!(
                (m.profile.as_str(), m.ci_profile.as_str()),
                (full, full),
                "{fleet}"
            );
            assert_eq!(m.sm_count, full_sms, "{fleet}");
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

#[test]
fn xid_events_reach_the_watcher_once() {
    with_fleet("dgx-h100", |sim, gpus| {
        let (watcher, skipped) = gpus.watch_xids(&all_gpus(gpus)).unwrap();
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(watcher.watched(), (0..8).collect::<Vec<_>>());
        assert_eq!(watcher.wait(50).unwrap(), None);

        sim.apply(|s| s.inject_xid(3, 48, None, None));
        assert_eq!(
            watcher.wait(2_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 3,
                xid: 48,
                gi_id: None,
                ci_id: None
            })
        );
        assert_eq!(watcher.wait(50).unwrap(), None, "delivered once");

        // Several queued events come out in order.
        sim.apply(|s| s.inject_xid(6, 79, None, None));
        sim.apply(|s| s.inject_xid(1, 13, None, None));
        let xid = |gpu, xid| {
            Some(GpuEvent::Xid {
                gpu,
                xid,
                gi_id: None,
                ci_id: None,
            })
        };
        assert_eq!(watcher.wait(2_000).unwrap(), xid(6, 79));
        assert_eq!(watcher.wait(2_000).unwrap(), xid(1, 13));
        assert_eq!(watcher.wait(50).unwrap(), None);
    });
}

/// A storm written in bursts while the watcher drains it: every XID arrives once and in order
/// (fewer than the driver's queue holds are in flight, so none may be dropped), however the
/// writes and the waits interleave.
#[test]
fn xids_written_in_bursts_while_the_watcher_drains_arrive_each_once_in_order() {
    with_fleet("dgx-h100", |sim, gpus| {
        let (watcher, _) = gpus.watch_xids(&all_gpus(gpus)).unwrap();
        let store = sim.store.clone();
        let writer = std::thread::spawn(move || {
            for burst in 0..20u32 {
                store
                    .update(|s| {
                        (0..25u32)
                            .try_for_each(|i| s.inject_xid((burst * 25 + i) % 8, 13, None, None))
                    })
                    .unwrap()
                    .unwrap();
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        });
        let mut seen = Vec::new();
        while seen.len() < 500 {
            match watcher.wait(5_000).unwrap() {
                Some(GpuEvent::Xid { gpu, .. }) => seen.push(gpu),
                other => panic!("after {} XIDs: {other:?}", seen.len()),
            }
        }
        writer.join().unwrap();
        assert_eq!(seen, (0..500u32).map(|n| n % 8).collect::<Vec<_>>());
        assert_eq!(watcher.wait(50).unwrap(), None, "each delivered once");
    });
}

#[test]
fn xid_raised_before_watching_or_on_unwatched_gpus_is_not_delivered() {
    with_fleet("dgx-h100", |sim, gpus| {
        sim.apply(|s| s.inject_xid(2, 31, None, None));
        let (watcher, skipped) = gpus.watch_xids(&[2, 5, 8]).unwrap();
        assert_eq!(watcher.watched(), vec![2, 5]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(
            skipped[0].0, 8,
            "index past the last GPU is skipped: {skipped:?}"
        );
        assert_eq!(
            watcher.wait(100).unwrap(),
            None,
            "XID 31 predates the watcher"
        );

        sim.apply(|s| s.inject_xid(4, 63, None, None)); // not watched
        sim.apply(|s| s.inject_xid(5, 92, None, None));
        assert_eq!(
            watcher.wait(2_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 5,
                xid: 92,
                gi_id: None,
                ci_id: None
            })
        );
        assert_eq!(watcher.wait(50).unwrap(), None);

        // A second watcher starts from its own creation, independently of the first.
        let (second, _) = gpus.watch_xids(&[4]).unwrap();
        assert_eq!(second.wait(50).unwrap(), None);
        sim.apply(|s| s.inject_xid(4, 45, None, None));
        assert!(matches!(
            second.wait(2_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 4,
                xid: 45,
                ..
            })
        ));
        assert_eq!(watcher.wait(50).unwrap(), None);
    });
}

#[test]
fn mig_attributed_xid_carries_instance_ids() {
    with_fleet("dgx-h100", |sim, gpus| {
        gpus.set_mig_mode(0, true).unwrap();
        let gi = gpus
            .create_gpu_instance(0, P_1G, Some(PlacementSlot { start: 0, size: 1 }))
            .unwrap();
        let ci = gpus.create_compute_instance(0, gi, CI_1C, None).unwrap();
        assert_eq!((gi, ci), (7, 0));
        let (watcher, _) = gpus.watch_xids(&[0]).unwrap();

        sim.apply(|s| s.inject_xid(0, 94, Some(gi), Some(ci)));
        assert_eq!(
            watcher.wait(2_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 0,
                xid: 94,
                gi_id: Some(7),
                ci_id: Some(0)
            })
        );
        sim.apply(|s| s.inject_xid(0, 43, Some(gi), None));
        assert_eq!(
            watcher.wait(2_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 0,
                xid: 43,
                gi_id: Some(7),
                ci_id: None
            })
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Faults, load and processes
// ---------------------------------------------------------------------------------------------

#[test]
fn lost_gpu_is_named_reported_and_recovers_after_reset() {
    with_fleet("dgx-h100", |sim, gpus| {
        let before = snapshot(gpus);
        let (watcher, _) = gpus.watch_xids(&all_gpus(gpus)).unwrap();
        // The driver reports XID 79 as the GPU falls off the bus.
        sim.apply(|s| {
            s.inject_xid(2, 79, None, None)?;
            s.set_lost(2, true)
        });

        let inv = gpus.snapshot().unwrap();
        assert_eq!(inv.gpus.len(), 8, "a lost GPU is still counted");
        let lost = &inv.gpus[2];
        assert_eq!(lost.health, Health::Lost);
        assert_eq!(
            lost.uuid, before.gpus[2].uuid,
            "remembered from the last snapshot"
        );
        assert_eq!(lost.name, H100_NAME);
        let healthy: Vec<u32> = inv.healthy_gpus().map(|g| g.index).collect();
        assert_eq!(healthy, vec![0, 1, 3, 4, 5, 6, 7]);
        assert_eq!(inv.topology.len(), 21);
        assert!(
            inv.topology.iter().all(|l| l.a != 2 && l.b != 2),
            "{:?}",
            inv.topology
        );
        assert_eq!(
            inv.gpus[3],
            before.gpus[3].clone().with_telemetry_of(&inv.gpus[3])
        );

        // The queued XID comes first, then every wait says a watched GPU is lost.
        assert_eq!(
            watcher.wait(1_000).unwrap(),
            Some(GpuEvent::Xid {
                gpu: 2,
                xid: 79,
                gi_id: None,
                ci_id: None
            })
        );
        assert_eq!(watcher.wait(1_000).unwrap(), Some(GpuEvent::GpuLost));
        assert_eq!(watcher.wait(10).unwrap(), Some(GpuEvent::GpuLost));

        let err = gpus.set_mig_mode(2, true).unwrap_err();
        assert!(err.is_gpu_lost(), "{err:?}");
        assert_eq!(err.code(), Some(raw_codes::GPU_IS_LOST));
        assert!(err.to_string().contains("GPU 2 fell off the bus"), "{err}");
        assert!(
            gpus.create_gpu_instance(2, P_1G, None)
                .unwrap_err()
                .is_gpu_lost()
        );
        assert!(gpus.remaining_capacity(2, P_1G).unwrap_err().is_gpu_lost());
        assert!(gpus.gi_profiles(2).unwrap_err().is_gpu_lost());
        // Registering on a lost GPU fails for that GPU only.
        let (w2, skipped) = gpus.watch_xids(&[1, 2]).unwrap();
        assert_eq!(w2.watched(), vec![1]);
        assert!(skipped[0].1.is_gpu_lost(), "{skipped:?}");
        drop(w2);

        // A process that never saw the GPU cannot name it, but still reports it lost.
        {
            let fresh = open_at(Some(sim.dir())).unwrap();
            let inv = fresh.snapshot().unwrap();
            assert_eq!(inv.gpus[2].health, Health::Lost);
            assert_eq!(inv.gpus[2].uuid, "");
            assert_eq!(inv.gpus[0].uuid, before.gpus[0].uuid);
        }
        // Dropping the second handle must not shut the first one's driver down.
        assert_eq!(gpus.count().unwrap(), 8);

        sim.apply(|s| s.reset(2));
        let inv = snapshot(gpus);
        assert_eq!(inv.gpus[2].health, Health::Healthy);
        assert_eq!(inv.gpus[2].uuid, before.gpus[2].uuid);
        assert_eq!(inv.healthy_gpus().count(), 8);
        assert_eq!(inv.topology.len(), 28);
        gpus.set_mig_mode(2, true).unwrap();
    });
}

/// Lets a GPU compare equal to another reading apart from its live figures.
trait WithTelemetry {
    fn with_telemetry_of(self, other: &gpuops_inventory::Gpu) -> Self;
}

impl WithTelemetry for gpuops_inventory::Gpu {
    fn with_telemetry_of(mut self, other: &gpuops_inventory::Gpu) -> Self {
        // Live figures: telemetry and the GPM activity since the previous snapshot.
        self.telemetry = other.telemetry;
        self.activity = other.activity;
        self
    }
}

#[test]
fn load_processes_and_row_remapping_show_in_the_next_snapshot() {
    with_fleet("dgx-h100", |sim, gpus| {
        let idle = snapshot(gpus);
        let load = LoadChange {
            gpu_util_pct: Some(87),
            mem_util_pct: Some(41),
            memory_used_mib: Some(30_000),
            power_mw: Some(612_000),
            temperature_c: Some(71),
        };
        sim.apply(|s| s.set_load(0, load, now_ms()));
        sim.apply(|s| {
            s.add_process(
                1,
                SimProcess {
                    pid: 4242,
                    used_memory_mib: 12_345,
                    gi_id: None,
                    ci_id: None,
                },
            )
        });
        sim.apply(|s| s.set_remapped_rows(5, 3, 1, true, false));

        let inv = snapshot(gpus);
        let t = inv.gpus[0].telemetry;
        assert_eq!(t.gpu_utilization_pct, Some(87));
        assert_eq!(t.memory_utilization_pct, Some(41));
        assert_eq!(t.power_mw, Some(612_000));
        assert_eq!(t.temperature_c, Some(71));
        assert_eq!(
            t.sm_clock_mhz,
            Some(1980),
            "a busy GPU runs at its maximum SM clock"
        );
        let m = inv.gpus[0].memory;
        assert_eq!(m.used_mib, 30_000);
        assert_eq!(m.used_mib + m.free_mib + m.reserved_mib, m.total_mib);

        let m = inv.gpus[1].memory;
        assert_eq!(m.used_mib, idle.gpus[1].memory.used_mib + 12_345);
        assert_eq!(m.free_mib, idle.gpus[1].memory.free_mib - 12_345);
        assert_eq!(inv.gpus[1].telemetry.gpu_utilization_pct, Some(0));

        assert_eq!(
            inv.gpus[5].telemetry.remapped_rows,
            Some(RemappedRows {
                correctable: 3,
                uncorrectable: 1,
                pending: true,
                failure: false
            })
        );
        // Untouched GPUs read as before.
        assert_eq!(inv.gpus[7].memory, idle.gpus[7].memory);
        assert_eq!(
            inv.gpus[7].telemetry.power_mw,
            idle.gpus[7].telemetry.power_mw
        );

        // Two changes of the same size in quick succession are both seen.
        for util in [11, 22, 33, 44] {
            let change = LoadChange {
                gpu_util_pct: Some(util),
                ..LoadChange::default()
            };
            sim.apply(|s| s.set_load(4, change, now_ms()));
            assert_eq!(
                snapshot(gpus).gpus[4].telemetry.gpu_utilization_pct,
                Some(util)
            );
        }
    });
}

#[test]
fn mig_mode_change_is_refused_while_a_process_runs() {
    with_fleet("dgx-h100", |sim, gpus| {
        let process = SimProcess {
            pid: 777,
            used_memory_mib: 1_000,
            gi_id: None,
            ci_id: None,
        };
        sim.apply(|s| s.add_process(6, process));
        let err = gpus.set_mig_mode(6, true).unwrap_err();
        assert_eq!(err.code(), Some(raw_codes::IN_USE), "{err:?}");
        assert!(
            matches!(err, NvmlError::Call { gpu: Some(6), .. }),
            "{err:?}"
        );
        assert!(!snapshot(gpus).gpus[6].mig.current_enabled);

        sim.apply(|s| s.clear_processes(6));
        gpus.set_mig_mode(6, true).unwrap();

        // A process inside a MIG device keeps its instances from being destroyed.
        let gi = gpus.create_gpu_instance(6, P_1G, None).unwrap();
        let ci = gpus.create_compute_instance(6, gi, CI_1C, None).unwrap();
        let in_mig = SimProcess {
            pid: 778,
            used_memory_mib: 2_000,
            gi_id: Some(gi),
            ci_id: Some(ci),
        };
        sim.apply(|s| s.add_process(6, in_mig));
        assert_eq!(
            call_code(gpus.destroy_compute_instance(6, gi, ci)),
            Some(raw_codes::IN_USE)
        );
        sim.apply(|s| s.clear_processes(6));
        gpus.destroy_compute_instance(6, gi, ci).unwrap();
        gpus.destroy_gpu_instance(6, gi).unwrap();
    });
}

// ---------------------------------------------------------------------------------------------
// Loading and initialisation errors
// ---------------------------------------------------------------------------------------------

fn expect_library_not_loaded(r: Result<Gpus, NvmlError>, path: &Path) -> String {
    match r {
        Err(e @ NvmlError::LibraryNotLoaded { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains("--simulate"), "{text}");
            text
        }
        Err(other) => panic!("expected LibraryNotLoaded, got {other:?}"),
        Ok(_) => panic!("{} should not load", path.display()),
    }
}

fn expect_init_error(r: Result<Gpus, NvmlError>) -> String {
    match r {
        Err(e @ NvmlError::Init { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains(&sim_library().display().to_string()),
                "{text}"
            );
            text
        }
        Err(other) => panic!("expected Init, got {other:?}"),
        Ok(_) => panic!("initialisation should have failed"),
    }
}

#[test]
fn missing_library_or_a_directory_is_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-libnvidia-ml.so.1");
    let text = expect_library_not_loaded(Gpus::open(Library::Path(missing.clone())), &missing);
    assert!(text.contains("Is the NVIDIA driver installed"), "{text}");
    let text = expect_library_not_loaded(
        Gpus::open(Library::Path(dir.path().to_path_buf())),
        dir.path(),
    );
    assert!(text.contains("not a file"), "{text}");
}

#[test]
fn a_file_that_is_not_a_library_is_not_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("libnvidia-ml.so.1");
    std::fs::write(&garbage, b"this is not an ELF shared object\n\x00\x01\x02").unwrap();
    expect_library_not_loaded(Gpus::open(Library::Path(garbage.clone())), &garbage);
}

/// A shared library every Linux system has, which is not NVML.
fn libm() -> Option<PathBuf> {
    let dirs = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/lib",
        "/usr/lib",
    ];
    dirs.iter()
        .map(|d| Path::new(d).join("libm.so.6"))
        .find(|p| p.is_file())
}

#[test]
fn a_library_that_is_not_nvml_is_named_so() {
    let Some(libm) = libm() else {
        eprintln!("skipped: no libm.so.6 found in the usual places");
        return;
    };
    let text = expect_library_not_loaded(Gpus::open(Library::Path(libm.clone())), &libm);
    assert!(text.contains("not an NVML library"), "{text}");
}

#[test]
fn init_fails_cleanly_without_a_usable_state() {
    let _guard = serial();
    let dir = tempfile::tempdir().unwrap();

    // No state directory configured.
    let text = expect_init_error(open_at(None));
    assert!(text.contains("driver is not loaded"), "{text}");

    // A directory without state.json.
    expect_init_error(open_at(Some(dir.path())));

    // Corrupt state.json.
    let corrupt = dir.path().join("corrupt");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join("state.json"), "{ \"format\": 1, \"gpus\": [").unwrap();
    expect_init_error(open_at(Some(&corrupt)));

    // A valid state with no GPUs.
    let mut empty = fleet_state("l4x4");
    empty.gpus.clear();
    let empty_sim = Sim::new(&empty);
    expect_init_error(open_at(Some(empty_sim.dir())));

    // None of that leaves the driver half-loaded: a good state opens and works.
    let good = Sim::fleet("l4x4");
    let gpus = open_at(Some(good.dir())).unwrap();
    assert_eq!(gpus.count().unwrap(), 4);
    drop(gpus);
    set_state_env(None);
}

#[test]
fn state_removed_after_init_fails_calls_not_the_process() {
    let sim = Sim::fleet("l4x4");
    with_gpus(&sim, |gpus| {
        assert_eq!(gpus.count().unwrap(), 4);
        std::fs::remove_file(sim.store.state_path()).unwrap();
        let err = gpus.count().unwrap_err();
        assert!(matches!(err, NvmlError::Call { .. }), "{err:?}");
        assert!(gpus.snapshot().is_err());
        // Restoring the state brings the driver back.
        gpuops_sim::Store::create(sim.dir(), &fleet_state("l4x4")).unwrap();
        assert_eq!(gpus.count().unwrap(), 4);
    });
}

#[test]
fn a_gpu_model_the_catalog_does_not_know_still_works() {
    // Behaves like an H100 but reports a name and PCI id the catalog has never seen, as a new
    // GPU on a newer driver would.
    let text = "hostname: future\ngpus:\n  - model: H100-SXM5-80GB\n    count: 2\n    report-as: {name: NVIDIA H999 80GB HBM9, pci-device-id: 0x2999}\n";
    let fleet = Fleet::parse(text, "<unknown model>").unwrap();
    let sim = Sim::new(&SimState::from_fleet(&fleet, now_ms()).unwrap());
    with_gpus(&sim, |gpus| {
        let inv = snapshot(gpus);
        let g = &inv.gpus[0];
        assert_eq!(g.name, "NVIDIA H999 80GB HBM9");
        assert_eq!(g.model, None, "not in the catalog");
        assert_eq!(g.pci_device_id, 0x2999_10DE);
        assert_eq!(
            g.family.as_deref(),
            Some("hopper"),
            "family from the compute capability"
        );
        assert_eq!(g.sm_count, None);
        assert!(g.mig.capable, "MIG capability comes from the driver");
        // MIG devices are named from what the driver reports, not from the catalog.
        gpus.set_mig_mode(0, true).unwrap();
        let gi = gpus.create_gpu_instance(0, 9, None).unwrap(); // 3g
        gpus.create_compute_instance(0, gi, 2, None).unwrap();
        let inv = snapshot(gpus);
        let m = &inv.gpus[0].mig_devices[0];
        assert_eq!(m.profile, "3g.40gb");
        assert!(inv.gpus[0].mig_devices[0].uuid.starts_with("MIG-"));
    });
}

#[test]
fn the_pci_class_comes_from_the_driver_per_gpu() {
    // GPU 0 in display mode (VGA controller), the rest as shipped (3D controller): GFD's
    // nvidia.com/gpu.mode is read from this.
    let text = "gpus:\n  - model: L4\n    pci-class: 0x030000\n  - model: L4\n    count: 2\n";
    let fleet = Fleet::parse(text, "<mode>").unwrap();
    let sim = Sim::new(&SimState::from_fleet(&fleet, now_ms()).unwrap());
    with_gpus(&sim, |gpus| {
        let inv = snapshot(gpus);
        let classes: Vec<Option<u32>> = inv.gpus.iter().map(|g| g.pci_class).collect();
        assert_eq!(
            classes,
            [Some(0x03_00_00), Some(0x03_02_00), Some(0x03_02_00)]
        );
        let labels = gpuops_labels::gfd_labels(
            &inv,
            &gpuops_resources::Config::default(),
            &gpuops_labels::LabelContext::default(),
        )
        .unwrap();
        assert_eq!(labels["nvidia.com/gpu.mode"], "graphics");
    });
}

#[test]
fn gpm_activity_is_the_load_between_two_snapshots_per_gpu_and_mig_instance() {
    with_fleet("dgx-h100", |sim, gpus| {
        let first = snapshot(gpus);
        assert!(
            first.gpus.iter().all(|g| g.activity.is_none()),
            "one sample is not an interval yet"
        );
        let load = LoadChange {
            gpu_util_pct: Some(80),
            mem_util_pct: Some(30),
            ..LoadChange::default()
        };
        sim.apply(|s| s.set_load(0, load, now_ms()));
        // The interval that spans the change mixes idle and busy; the next one is all busy.
        let spanning = snapshot(gpus).gpus[0].activity.unwrap();
        let gr = spanning.gr_engine_active.unwrap();
        assert!((0.0..=0.8).contains(&gr), "{gr}");
        let inv = snapshot(gpus);
        let busy = inv.gpus[0].activity.unwrap();
        assert!(
            (busy.gr_engine_active.unwrap() - 0.8).abs() < 1e-6,
            "{busy:?}"
        );
        assert!((busy.dram_active.unwrap() - 0.3).abs() < 1e-6, "{busy:?}");
        assert!(busy.sm_active.unwrap() > 0.0 && busy.tensor_active.unwrap() > 0.0);
        assert!(busy.pcie_rx_bytes_per_second.unwrap() > 1e9, "{busy:?}");
        assert!(busy.nvlink_tx_bytes_per_second.unwrap() > 1e9, "{busy:?}");
        let idle = inv.gpus[1].activity.unwrap();
        assert_eq!(idle.gr_engine_active, Some(0.0));
        assert_eq!(idle.pcie_tx_bytes_per_second, Some(0.0));

        // Per GPU instance (nvmlGpmMigSampleGet): busy only where a process runs.
        gpus.set_mig_mode(2, true).unwrap();
        let a = gpus.create_gpu_instance(2, P_1G, None).unwrap();
        gpus.create_compute_instance(2, a, CI_1C, None).unwrap();
        let b = gpus.create_gpu_instance(2, P_1G, None).unwrap();
        gpus.create_compute_instance(2, b, CI_1C, None).unwrap();
        sim.apply(|s| {
            s.set_load(2, load, now_ms())?;
            s.add_process(
                2,
                SimProcess {
                    pid: 77,
                    used_memory_mib: 1000,
                    gi_id: Some(a),
                    ci_id: Some(0),
                },
            )
        });
        snapshot(gpus);
        let inv = snapshot(gpus);
        let mig = &inv.gpus[2].mig_devices;
        let of = |gi: u32| {
            mig.iter()
                .find(|m| m.gi_id == gi)
                .and_then(|m| m.activity)
                .and_then(|a| a.gr_engine_active)
        };
        assert!((of(a).unwrap() - 0.8).abs() < 1e-6, "{mig:#?}");
        assert_eq!(of(b), Some(0.0));
        let whole = inv.gpus[2].activity.unwrap().gr_engine_active.unwrap();
        assert!(
            (whole - 0.1).abs() < 1e-6,
            "one busy 1g of 8 slices: {whole}"
        );
    });
}

#[test]
fn gpus_without_gpm_get_no_activity() {
    for fleet in ["dgx-a100", "l4x4"] {
        with_fleet(fleet, |_sim, gpus| {
            snapshot(gpus);
            let inv = snapshot(gpus);
            assert!(inv.gpus.iter().all(|g| g.activity.is_none()), "{fleet}");
        });
    }
}

#[test]
fn the_simulated_gpm_calls_check_versions_samples_and_devices_as_nvml_does() {
    use nvml_wrapper_sys::bindings::*;
    with_fleet("dgx-h100", |_sim, _gpus| {
        // The same loaded library (one driver per process), called through nvml.h's raw ABI.
        // SAFETY: the simulator library exports these symbols with nvml.h's signatures.
        let lib = unsafe { NvmlLib::new(common::sim_library()) }.unwrap();
        let dev = |i: u32| {
            let mut d: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the library is initialised by `with_fleet`.
            assert_eq!(unsafe { lib.nvmlDeviceGetHandleByIndex_v2(i, &mut d) }, 0);
            d
        };
        let alloc = || {
            let mut s: nvmlGpmSample_t = std::ptr::null_mut();
            // SAFETY: valid out-pointer.
            assert_eq!(unsafe { lib.nvmlGpmSampleAlloc(&mut s) }, 0);
            s
        };
        // SAFETY (all calls below): handles came from this library, pointers are to locals.
        unsafe {
            let mut support = nvmlGpmSupport_t {
                version: 0,
                isSupportedDevice: 9,
            };
            assert_eq!(lib.nvmlGpmQueryDeviceSupport(dev(0), &mut support), 25);
            support.version = NVML_GPM_SUPPORT_VERSION;
            assert_eq!(lib.nvmlGpmQueryDeviceSupport(dev(0), &mut support), 0);
            assert_eq!(support.isSupportedDevice, 1);

            let (a, b, c) = (alloc(), alloc(), alloc());
            let mut req: nvmlGpmMetricsGet_t = std::mem::zeroed();
            req.version = NVML_GPM_METRICS_GET_VERSION;
            req.numMetrics = 2;
            req.sample1 = a;
            req.sample2 = b;
            req.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL;
            req.metrics[1].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_NVDEC_0_UTIL;
            assert_eq!(
                lib.nvmlGpmMetricsGet(&mut req),
                raw_codes::INVALID_ARGUMENT,
                "unfilled samples"
            );
            assert_eq!(lib.nvmlGpmSampleGet(dev(0), a), 0);
            assert_eq!(lib.nvmlGpmSampleGet(dev(1), b), 0);
            assert_eq!(
                lib.nvmlGpmMetricsGet(&mut req),
                raw_codes::INVALID_ARGUMENT,
                "two GPUs"
            );
            assert_eq!(lib.nvmlGpmSampleGet(dev(0), b), 0);
            req.version = 2;
            assert_eq!(lib.nvmlGpmMetricsGet(&mut req), 25, "version mismatch");
            req.version = NVML_GPM_METRICS_GET_VERSION;
            req.numMetrics = nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX + 1;
            assert_eq!(lib.nvmlGpmMetricsGet(&mut req), raw_codes::INVALID_ARGUMENT);
            req.numMetrics = 2;
            assert_eq!(lib.nvmlGpmMetricsGet(&mut req), 0);
            assert_eq!(req.metrics[0].nvmlReturn, 0);
            assert_eq!(req.metrics[0].value, 0.0, "idle");
            assert!(!req.metrics[0].metricInfo.unit.is_null());
            assert_eq!(
                req.metrics[1].nvmlReturn,
                raw_codes::NOT_SUPPORTED,
                "per metric"
            );

            assert_eq!(
                lib.nvmlGpmMigSampleGet(dev(0), 1, c),
                raw_codes::NOT_SUPPORTED,
                "MIG off"
            );
            assert_eq!(lib.nvmlGpmSampleFree(c), 0);
            assert_eq!(
                lib.nvmlGpmSampleFree(c),
                raw_codes::INVALID_ARGUMENT,
                "double free"
            );
            assert_eq!(
                lib.nvmlGpmSampleGet(dev(0), c),
                raw_codes::INVALID_ARGUMENT,
                "freed"
            );
            assert_eq!(lib.nvmlGpmSampleFree(a), 0);
            assert_eq!(lib.nvmlGpmSampleFree(b), 0);
        }
    });
}
