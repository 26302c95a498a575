//! gpuops as a DRA driver, the pure half: the devices a node publishes under NVIDIA's names, its
//! ResourceSlices, dynamic MIG counters, health taints, NVIDIA's opaque configs, the claim
//! checkpoint's format and the DeviceClasses. No I/O: the agent reads the node and talks to the
//! kubelet and the API server. docs/dra.md has every name and where it comes from.
#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod classes;
pub mod config;
mod error;
pub mod health;
pub mod model;
pub mod names;
pub mod slices;

pub use error::DraError;
pub use health::{Taint, TaintEffect, Unhealthy};
pub use model::{Device, DeviceModel, DeviceType, NodeFacts, Options, build};
pub use names::DRIVER_NAME;
pub use slices::resource_slices;

use gpuops_inventory::Inventory;
use k8s_openapi::api::resource::v1::ResourceSliceSpec;

/// The node's slices straight from its inventory, with what was left out and why.
pub fn publish(
    node_name: &str,
    generation: i64,
    inv: &Inventory,
    facts: &NodeFacts,
    opts: &Options,
) -> (Vec<ResourceSliceSpec>, Vec<String>) {
    let model = build(inv, facts, opts);
    (
        resource_slices(node_name, generation, &model),
        model.warnings,
    )
}
