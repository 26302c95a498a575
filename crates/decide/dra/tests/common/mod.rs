//! Inventories of the simulator's built-in fleets, as the agent's snapshot would show them, with
//! MIG layouts from the placement planner.
#![allow(dead_code)]

use gpuops_catalog::GpuModel;
use gpuops_inventory::{Gpu, Inventory, MigDevice, MigState};
use gpuops_sim::fleet::{BUILTIN_FLEETS, Fleet};
use gpuops_sim::state::SimState;
use std::collections::BTreeMap;

pub fn fleet_names() -> Vec<&'static str> {
    BUILTIN_FLEETS.iter().map(|(n, _)| *n).collect()
}

/// The fleet's node with MIG off everywhere.
pub fn inventory(fleet: &str) -> Inventory {
    let fleet = Fleet::resolve(fleet).unwrap();
    let state = SimState::from_fleet(&fleet, 0).unwrap();
    Inventory {
        driver_version: state.driver_version.clone(),
        cuda_driver_version: fleet.cuda_version.clone(),
        nvml_version: format!("13.{}", state.driver_version),
        gpus: state
            .gpus
            .iter()
            .map(|g| {
                let model = gpuops_catalog::lookup(&g.model).unwrap();
                Gpu {
                    index: g.index,
                    uuid: g.uuid.clone(),
                    name: model.nvml_name.to_string(),
                    model: Some(model.key.to_string()),
                    pci_bus_id: g.pci_bus_id(),
                    minor_number: Some(g.minor_number),
                    memory: gpuops_inventory::Memory {
                        total_mib: model.memory_mib,
                        ..Default::default()
                    },
                    compute_capability: Some(model.compute_capability),
                    family: Some(model.family.as_str().to_string()),
                    sm_count: Some(model.sm_count),
                    numa_node: Some(g.numa_node),
                    mig: MigState {
                        capable: model.mig.is_some(),
                        current_enabled: false,
                        pending_enabled: false,
                    },
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

pub fn model_of(gpu: &Gpu) -> &'static GpuModel {
    gpuops_catalog::lookup(gpu.model.as_deref().unwrap()).unwrap()
}

/// Turns MIG on for GPU `index` with the planner's layout of `wanted` (`[("1g.10gb", 7)]`).
pub fn with_mig(inv: &mut Inventory, index: usize, wanted: &[(&str, u32)]) {
    let gpu = &mut inv.gpus[index];
    let model = model_of(gpu);
    let wanted: BTreeMap<String, u32> = wanted.iter().map(|(p, n)| (p.to_string(), *n)).collect();
    let layout = gpuops_mig::planner::check(model, &wanted).unwrap();
    gpu.mig.current_enabled = true;
    gpu.mig.pending_enabled = true;
    gpu.mig_devices = layout
        .instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let p = model.gi_profile(&inst.gi_profile()).unwrap();
            MigDevice {
                uuid: format!("MIG-{}-{i}", gpu.uuid.trim_start_matches("GPU-")),
                index: i as u32,
                gi_id: i as u32 + 1,
                ci_id: 0,
                profile: p.name.to_string(),
                ci_profile: inst.profile.clone(),
                gi_profile_id: p.nvml_id,
                placement_start: inst.start,
                placement_size: p.memory_slices,
                memory_mib: p.memory_mib,
                sm_count: p.sm_count,
                gi_slices: p.compute_slices,
                ci_slices: p.compute_slices,
                ..Default::default()
            }
        })
        .collect();
}
