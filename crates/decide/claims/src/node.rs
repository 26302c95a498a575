//! The devices a new node of a pool would publish: an inventory of the pool's GPU model built
//! from the catalog (as the simulator builds its GPUs), through gpuops-dra's model, the code the
//! agent publishes slices with.

use gpuops_catalog::GpuModel;
use gpuops_dra::{DeviceModel, NodeFacts, Options};
use gpuops_inventory::{Gpu, Inventory, Memory, MigState};

/// The driver a new node is assumed to run: the simulator's default, since a pool says nothing
/// about it. A selector on `driverVersion` is judged against this (docs/autoscaling.md).
pub const ASSUMED_DRIVER_VERSION: &str = "580.105.08";
pub const ASSUMED_CUDA_DRIVER_VERSION: &str = "13.0";

/// What a new node of a pool is: `gpus` GPUs of `model`.
#[derive(Debug, Clone, Copy)]
pub struct NewNode<'a> {
    pub model: &'a GpuModel,
    pub gpus: u32,
    /// The pool's agents publish dynamic MIG (every placement a partitionable device).
    pub dynamic_mig: bool,
}

/// The inventory a fresh node of this shape reports: MIG off (a new node boots without a layout
/// unless its pool sets one, which the MIG path handles), every GPU healthy.
pub fn inventory(node: &NewNode<'_>) -> Inventory {
    let gpus = (0..node.gpus)
        .map(|i| Gpu {
            index: i,
            uuid: format!("GPU-new-node-{i:04}"),
            name: node.model.nvml_name.to_string(),
            model: Some(node.model.key.to_string()),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + i),
            minor_number: Some(i),
            memory: Memory {
                total_mib: node.model.memory_mib,
                free_mib: node.model.memory_mib,
                ..Default::default()
            },
            compute_capability: Some(node.model.compute_capability),
            sm_count: Some(node.model.sm_count),
            mig: MigState {
                capable: node.model.mig.is_some(),
                current_enabled: false,
                pending_enabled: false,
            },
            ..Default::default()
        })
        .collect();
    Inventory {
        driver_version: ASSUMED_DRIVER_VERSION.to_string(),
        cuda_driver_version: ASSUMED_CUDA_DRIVER_VERSION.to_string(),
        gpus,
        ..Default::default()
    }
}

/// The devices the agent would publish on a new node of this shape.
pub fn devices(node: &NewNode<'_>) -> DeviceModel {
    let opts = Options {
        dynamic_mig: node.dynamic_mig,
        ..Default::default()
    };
    gpuops_dra::build(&inventory(node), &NodeFacts::default(), &opts)
}
