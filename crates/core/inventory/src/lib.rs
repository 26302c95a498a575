//! The inventory snapshot: what the NVML layer saw on one node, as plain serialisable data.
//!
//! Everything downstream (device plugin, metrics, labels, MIG planner, doctor) reads these types and
//! never NVML itself, so it can be tested with hand-written snapshots.
#![forbid(unsafe_code)]

pub mod render;

use serde::{Deserialize, Serialize};

/// One node's GPUs at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Inventory {
    /// Kernel driver version, e.g. `580.105.08`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, e.g. `13.0`.
    pub cuda_driver_version: String,
    /// NVML library version, e.g. `13.580.105.08`.
    pub nvml_version: String,
    pub gpus: Vec<Gpu>,
    /// Pairwise links between GPUs (each unordered pair once, `a < b`).
    pub topology: Vec<GpuLink>,
    /// Problems met while collecting that did not stop the rest (one GPU's call failing, ...).
    pub warnings: Vec<String>,
}

impl Inventory {
    /// GPUs that answered and are not lost.
    pub fn healthy_gpus(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(|g| g.health == Health::Healthy)
    }

    /// The GPU with this UUID, or the parent GPU of the MIG device with this UUID.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus
            .iter()
            .find(|g| g.uuid == uuid || g.mig_devices.iter().any(|m| m.uuid == uuid))
    }

    /// The link between two GPU indices, if collected.
    pub fn link(&self, a: u32, b: u32) -> Option<&GpuLink> {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.topology.iter().find(|l| l.a == a && l.b == b)
    }
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Gpu {
    /// NVML index (also `gpu` in metric labels).
    pub index: u32,
    /// `GPU-…`; empty when the GPU was lost before we ever read it.
    pub uuid: String,
    /// `nvmlDeviceGetName`, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Catalog key when the model is known (`H100-SXM5-80GB`); `None` for models the catalog lacks.
    pub model: Option<String>,
    /// `00000000:53:00.0`.
    pub pci_bus_id: String,
    /// Full 32-bit `pciDeviceId` (device << 16 | vendor), e.g. `0x233010DE`.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    /// PCI class code (`0x030200` 3D controller = compute mode, `0x030000` VGA = graphics mode);
    /// `None` when neither NVML nor sysfs told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_class: Option<u32>,
    /// `/dev/nvidiaN`'s N.
    pub minor_number: Option<u32>,
    pub serial: Option<String>,
    pub memory: Memory,
    pub compute_capability: Option<(u32, u32)>,
    /// GFD family name (`hopper`), from the compute capability.
    pub family: Option<String>,
    pub sm_count: Option<u32>,
    pub numa_node: Option<u32>,
    pub compute_mode: Option<String>,
    pub mig: MigState,
    /// MIG devices (one per compute instance), ordered by GI id then CI id.
    pub mig_devices: Vec<MigDevice>,
    pub nvlinks: Vec<NvLink>,
    /// Compute processes, with the MIG device they run in.
    pub processes: Vec<GpuProcess>,
    pub telemetry: Telemetry,
    /// GPM activity over the interval since the previous snapshot of this GPU; `None` on GPUs
    /// without GPM (before Hopper) and on the first snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
    pub health: Health,
}

/// A process with a compute context on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_mib: Option<u64>,
    /// GPU/compute instance the process runs in, on MIG GPUs.
    pub gi_id: Option<u32>,
    pub ci_id: Option<u32>,
}

/// Framebuffer memory, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Memory {
    pub total_mib: u64,
    pub used_mib: u64,
    pub free_mib: u64,
    pub reserved_mib: u64,
}

/// MIG capability and mode of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MigState {
    pub capable: bool,
    pub current_enabled: bool,
    pub pending_enabled: bool,
}

/// One MIG device: a compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct MigDevice {
    /// `MIG-…`.
    pub uuid: String,
    /// Index among the parent's MIG devices (the `j` in `i:j`).
    pub index: u32,
    pub gi_id: u32,
    pub ci_id: u32,
    /// GPU-instance profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Compute-instance profile when it is smaller than the GI (`1c.3g.40gb`), else equal to `profile`.
    pub ci_profile: String,
    /// NVML GPU-instance profile id (`info.id`).
    pub gi_profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    pub memory_mib: u64,
    pub sm_count: u32,
    pub gi_slices: u32,
    pub ci_slices: u32,
    /// This instance's framebuffer use as the driver reports it for the MIG handle; `None` when it
    /// could not be read. Only the used and free figures vary between snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fb: Option<Memory>,
    /// GPM activity of this device's GPU instance since the previous snapshot (shared by the
    /// compute instances of one GPU instance: NVML samples per GPU instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
}

/// One active NVLink and what is at its other end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NvLink {
    pub link: u32,
    /// PCI bus id at the far end (a GPU or an NVSwitch).
    pub remote_pci_bus_id: String,
    pub remote_is_switch: bool,
}

/// How two GPUs are connected, as used for NVLink-aware allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLink {
    pub a: u32,
    pub b: u32,
    /// NVLinks between the two (through a switch counts the lesser side's links).
    pub nvlinks: u32,
    pub pcie: PcieLevel,
}

/// `nvmlDeviceGetTopologyCommonAncestor` levels, closest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PcieLevel {
    SameBoard,
    SingleSwitch,
    MultipleSwitches,
    HostBridge,
    SameNumaNode,
    CrossCpu,
}

/// Live figures; `None` where the GPU does not support the query (never a sentinel).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Telemetry {
    pub gpu_utilization_pct: Option<u32>,
    pub memory_utilization_pct: Option<u32>,
    pub encoder_utilization_pct: Option<u32>,
    pub decoder_utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub memory_temperature_c: Option<u32>,
    pub power_mw: Option<u32>,
    pub energy_mj: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    pub pcie_replay_counter: Option<u32>,
    pub remapped_rows: Option<RemappedRows>,
}

/// What the GPU's engines did over an interval, from NVML's GPM metrics (DCGM's profiling fields):
/// ratios 0-1 of the interval, rates in bytes per second. `None` for a metric the GPU does not
/// report (NVLink on a GPU without it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Activity {
    /// The graphics/compute engine was busy (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`).
    pub gr_engine_active: Option<f64>,
    /// SMs had at least one warp assigned (`DCGM_FI_PROF_SM_ACTIVE`).
    pub sm_active: Option<f64>,
    /// Resident warps against the SMs' maximum (`DCGM_FI_PROF_SM_OCCUPANCY`).
    pub sm_occupancy: Option<f64>,
    /// Tensor pipes busy (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`).
    pub tensor_active: Option<f64>,
    /// Device memory interface busy (`DCGM_FI_PROF_DRAM_ACTIVE`).
    pub dram_active: Option<f64>,
    pub pcie_tx_bytes_per_second: Option<f64>,
    pub pcie_rx_bytes_per_second: Option<f64>,
    pub nvlink_tx_bytes_per_second: Option<f64>,
    pub nvlink_rx_bytes_per_second: Option<f64>,
}

/// Row-remapping state (NVML field values 142-145).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RemappedRows {
    pub correctable: u64,
    pub uncorrectable: u64,
    pub pending: bool,
    pub failure: bool,
}

/// Whether a GPU can be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum Health {
    #[default]
    Healthy,
    /// Fell off the bus: NVML answers `GPU_IS_LOST`.
    Lost,
    /// NVML answered, but reading it failed in a way that makes it unusable.
    Unreachable { reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> Gpu {
        Gpu {
            index,
            uuid: uuid.into(),
            ..Gpu::default()
        }
    }

    #[test]
    fn finds_parent_of_a_mig_uuid() {
        let mut g = gpu(1, "GPU-b");
        g.mig_devices.push(MigDevice {
            uuid: "MIG-x".into(),
            ..MigDevice::default()
        });
        let inv = Inventory {
            gpus: vec![gpu(0, "GPU-a"), g],
            ..Inventory::default()
        };
        assert_eq!(inv.gpu_by_uuid("MIG-x").map(|g| g.index), Some(1));
        assert_eq!(inv.gpu_by_uuid("GPU-a").map(|g| g.index), Some(0));
        assert!(inv.gpu_by_uuid("MIG-nope").is_none());
    }

    #[test]
    fn link_lookup_ignores_order_and_health_filter_skips_lost() {
        let mut lost = gpu(1, "GPU-b");
        lost.health = Health::Lost;
        let inv = Inventory {
            gpus: vec![gpu(0, "GPU-a"), lost],
            topology: vec![GpuLink {
                a: 0,
                b: 1,
                nvlinks: 18,
                pcie: PcieLevel::CrossCpu,
            }],
            ..Inventory::default()
        };
        assert_eq!(inv.link(1, 0).map(|l| l.nvlinks), Some(18));
        assert_eq!(inv.healthy_gpus().count(), 1);
    }

    #[test]
    fn health_serialises_with_a_state_tag() {
        let json = serde_json::to_string(&Health::Unreachable { reason: "x".into() }).unwrap();
        assert_eq!(json, r#"{"state":"unreachable","reason":"x"}"#);
    }
}
