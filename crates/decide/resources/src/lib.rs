//! The device plugin's resource model: which kubelet resources and device IDs a node's GPUs become
//! under NVIDIA's config, and how to allocate them.
//!
//! Pure: everything takes an inventory snapshot and a config and returns data.
//! - [`config`] — NVIDIA's `version: v1` config file, env vars / flags and their precedence, and the
//!   per-node named-config selection.
//! - [`model`] — resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, `nvidia.com/gpu.shared`) and
//!   their device IDs.
//! - [`allocate`] — the Allocate response for one container.
//! - [`preferred`] — GetPreferredAllocation.
//! - [`health`] — which devices XIDs make unhealthy, and when they recover.
#![forbid(unsafe_code)]

pub mod allocate;
pub mod cdi;
pub mod config;
pub mod error;
pub mod health;
pub mod model;
pub mod preferred;

pub use allocate::{
    ContainerAllocation, DeviceSpec, HostDevices, Mount, allocate, parse_mig_minors,
};
pub use config::{
    AllocationPolicy, Config, DeviceIdStrategy, DeviceListStrategies, DeviceListStrategy,
    MigStrategy, Overrides, Selection, SharingStrategy, UnknownKey, UnknownKeyReport, select_named,
};
pub use error::ResourcesError;
pub use model::{
    Backing, Device, MigBacking, Resource, is_invalid_mig_layout, mig_strategy_check, resources,
};
pub use preferred::preferred_allocation;

/// Hand-built inventories and configs for the unit tests.
#[cfg(test)]
pub(crate) mod testutil {
    use crate::config::{Config, Overrides};
    use gpuops_inventory::{Gpu, Inventory, MigDevice, MigState};

    pub fn uuid(i: u32) -> String {
        format!("GPU-{i:08x}-1111-2222-3333-444444444444")
    }

    pub fn mig_uuid(i: u32, j: u32) -> String {
        format!("MIG-{i:04x}{j:04x}-aaaa-bbbb-cccc-dddddddddddd")
    }

    pub fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: uuid(index),
            name: "NVIDIA H100 80GB HBM3".into(),
            model: Some("H100-SXM5-80GB".into()),
            minor_number: Some(index),
            numa_node: Some(index / 4),
            ..Gpu::default()
        }
    }

    /// A MIG-enabled GPU with one MIG device per profile (GI ids 1.., CI 0).
    pub fn mig_gpu(index: u32, profiles: &[&str]) -> Gpu {
        let mut g = gpu(index);
        g.mig = MigState {
            capable: true,
            current_enabled: true,
            pending_enabled: true,
        };
        g.mig_devices = profiles
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let j = j as u32;
                MigDevice {
                    uuid: mig_uuid(index, j),
                    index: j,
                    gi_id: j + 1,
                    ci_id: 0,
                    profile: (*p).to_string(),
                    ci_profile: (*p).to_string(),
                    ..MigDevice::default()
                }
            })
            .collect();
        g
    }

    pub fn inv(gpus: Vec<Gpu>) -> Inventory {
        Inventory {
            gpus,
            ..Inventory::default()
        }
    }

    /// A parsed file made effective with no env or flags.
    /// `""` stands for "no config file" (an empty file is an error).
    pub fn cfg(yaml: &str) -> Config {
        let file = if yaml.is_empty() {
            Config::default()
        } else {
            Config::parse(yaml, "t.yaml").unwrap()
        };
        Config::effective(Some(file), &Overrides::default(), &Overrides::default()).unwrap()
    }
}
