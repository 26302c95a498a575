//! The simulated driver's state: everything a real driver would know about its GPUs.
//!
//! Serialised as `state.json` in the state directory so separate processes (the agent, `gpuops sim`,
//! tests) see one driver.

use crate::fleet::{Fabric, Fleet, parse_cuda_version};
use crate::{SimError, ids};
use gpuops_catalog::GpuModel;
use serde::{Deserialize, Serialize};

/// The on-disk format version; bumped on incompatible changes.
pub const STATE_FORMAT: u32 = 1;
/// Events older than this many are dropped, like the driver's bounded event queue.
pub const MAX_EVENTS: usize = 1024;

/// The whole simulated driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimState {
    pub format: u32,
    pub hostname: String,
    pub driver_version: String,
    /// CUDA version as NVML reports it (13.0 -> 13000).
    pub cuda_driver_version: i32,
    /// When the "driver was loaded" (energy counters start here), Unix milliseconds.
    pub loaded_unix_ms: u64,
    pub gpus: Vec<SimGpu>,
    pub events: Vec<SimEvent>,
    pub next_event_seq: u64,
    /// Bumped for every created instance so re-created MIG devices get fresh UUIDs, as on real drivers.
    pub next_instance_serial: u64,
    /// `gpuops sim hang-driver`: every NVML call blocks until the hang is cleared, as when the
    /// driver is stuck in the kernel (a GPU wedged mid-reset, an RM call that never returns).
    /// Left out of the file while false, so state files stay as they were.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub driver_hung: bool,
}

/// One simulated GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpu {
    pub index: u32,
    /// Catalog key.
    pub model: String,
    pub uuid: String,
    pub serial: String,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub minor_number: u32,
    pub numa_node: u32,
    /// GPUs with the same switch id share a PCIe switch.
    pub pcie_switch: u32,
    pub mig_current: bool,
    pub mig_pending: bool,
    pub gpu_instances: Vec<SimGi>,
    pub lost: bool,
    pub load: Load,
    pub processes: Vec<SimProcess>,
    pub remapped_rows_correctable: u64,
    pub remapped_rows_uncorrectable: u64,
    pub remapped_rows_pending: bool,
    pub remapped_rows_failure: bool,
    pub pcie_replay_counter: u32,
    /// `nvmlComputeMode_t` (0 default, 2 prohibited, 3 exclusive process).
    pub compute_mode: u32,
    /// What each NVLink connects to, by link number.
    pub nvlinks: Vec<NvlinkPeer>,
    /// A client (nvidia-persistenced, nvidia_drm, ...) holds the GPU, so the driver cannot reset it
    /// to switch MIG mode: changes stay pending until `reset`.
    #[serde(default)]
    pub held: bool,
    /// Name and PCI device id reported instead of the catalog's (simulates an unknown model).
    #[serde(default)]
    pub reported_name: Option<String>,
    #[serde(default)]
    pub reported_pci_device_id: Option<u16>,
    /// PCI class code when the fleet set one; else [`DEFAULT_PCI_CLASS`].
    #[serde(default)]
    pub pci_class: Option<u32>,
    /// Energy counted before the last power change, and when that change happened.
    pub energy_base_mj: u64,
    pub power_since_unix_ms: u64,
    /// When `gpuops sim load` last changed the load: GPM metrics of an interval spanning it mix
    /// the rates before and after.
    #[serde(default)]
    pub load_since_unix_ms: u64,
}

/// The far end of one NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvlinkPeer {
    Gpu { index: u32 },
    Switch { bus: u32 },
}

/// Domain in which the simulated NVSwitches sit (distinct from the GPUs' domain 0).
pub const NVSWITCH_PCI_DOMAIN: u32 = 0;
/// NVSwitches in a DGX/HGX baseboard.
pub const NVSWITCHES: u32 = 4;

/// What the GPU is doing, as set by `gpuops sim load`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Load {
    pub gpu_util_pct: u32,
    pub mem_util_pct: u32,
    pub encoder_util_pct: u32,
    pub decoder_util_pct: u32,
    /// Framebuffer in use beyond what listed processes use.
    pub memory_used_mib: u64,
    pub power_mw: u32,
    pub temperature_c: u32,
    pub memory_temperature_c: u32,
}

/// A GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGi {
    pub id: u32,
    /// NVML profile id (`info.id`, e.g. 19 for 1g).
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub compute_instances: Vec<SimCi>,
}

/// A compute instance inside a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimCi {
    pub id: u32,
    /// NVML CI profile id (equals the `NVML_COMPUTE_INSTANCE_PROFILE_*` enum).
    pub profile_id: u32,
    pub start: u32,
    pub size: u32,
    pub uuid: String,
}

/// A process using a GPU (and optionally one MIG device of it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimProcess {
    pub pid: u32,
    pub used_memory_mib: u64,
    pub gi_id: Option<u32>,
    pub ci_id: Option<u32>,
}

/// One NVML event waiting to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimEvent {
    pub seq: u64,
    pub gpu_index: u32,
    /// `nvmlEventType*` bit, e.g. 0x8 for XidCriticalError.
    pub event_type: u64,
    /// The XID for XID events.
    pub data: u64,
    /// 0xFFFFFFFF when the event is not specific to a MIG instance.
    pub gi_id: u32,
    pub ci_id: u32,
}

/// PCI class code of a data-center GPU in compute mode (3D controller), what every catalog model
/// shows out of the box.
pub const DEFAULT_PCI_CLASS: u32 = 0x03_02_00;

/// Not specific to one GPU or compute instance (nvml.h uses all-ones).
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// PCI bus numbers of a DGX H100's GPUs; beyond eight, numbers continue past them.
const BUS_NUMBERS: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

impl SimState {
    /// A freshly loaded driver for `fleet`, at time `now_ms`.
    pub fn from_fleet(fleet: &Fleet, now_ms: u64) -> Result<SimState, SimError> {
        let cuda = parse_cuda_version(&fleet.cuda_version)?;
        let models = fleet.expanded();
        let n = models.len() as u32;
        let numa_nodes = if fleet.numa_nodes == 0 {
            n.div_ceil(4).max(1)
        } else {
            fleet.numa_nodes
        };
        let seed = ids::seed_of(&fleet.hostname);
        let gpus = models
            .iter()
            .enumerate()
            .map(|(i, (model, group))| {
                let i = i as u32;
                SimGpu {
                    index: i,
                    model: model.key.to_string(),
                    uuid: ids::uuid("GPU-", seed, &[u64::from(i)]),
                    serial: ids::serial(seed, i),
                    pci_domain: 0,
                    pci_bus: BUS_NUMBERS.get(i as usize).copied().unwrap_or(0xdc + i),
                    minor_number: i,
                    numa_node: (i * numa_nodes / n.max(1)).min(numa_nodes - 1),
                    pcie_switch: i / 2,
                    mig_current: group.mig_enabled,
                    mig_pending: group.mig_enabled,
                    gpu_instances: Vec::new(),
                    lost: false,
                    load: Load::idle(model, i),
                    processes: Vec::new(),
                    remapped_rows_correctable: 0,
                    remapped_rows_uncorrectable: 0,
                    remapped_rows_pending: false,
                    remapped_rows_failure: false,
                    pcie_replay_counter: 0,
                    compute_mode: 0,
                    nvlinks: nvlinks_for(fleet.fabric, model, i, n),
                    held: false,
                    reported_name: group.report_as.as_ref().map(|r| r.name.clone()),
                    reported_pci_device_id: group.report_as.as_ref().map(|r| r.pci_device_id),
                    pci_class: group.pci_class,
                    energy_base_mj: 0,
                    power_since_unix_ms: now_ms,
                    load_since_unix_ms: now_ms,
                }
            })
            .collect();
        Ok(SimState {
            format: STATE_FORMAT,
            hostname: fleet.hostname.clone(),
            driver_version: fleet.driver_version.clone(),
            cuda_driver_version: cuda,
            loaded_unix_ms: now_ms,
            gpus,
            events: Vec::new(),
            next_event_seq: 1,
            next_instance_serial: 1,
            driver_hung: false,
        })
    }

    /// The GPU at `index`, or an error naming the valid range.
    pub fn gpu(&self, index: u32) -> Result<&SimGpu, SimError> {
        self.gpus.get(index as usize).ok_or(SimError::NoSuchGpu {
            index,
            count: self.gpus.len(),
        })
    }

    /// Mutable access to the GPU at `index`.
    pub fn gpu_mut(&mut self, index: u32) -> Result<&mut SimGpu, SimError> {
        let count = self.gpus.len();
        self.gpus
            .get_mut(index as usize)
            .ok_or(SimError::NoSuchGpu { index, count })
    }

    /// Queues an event, dropping the oldest beyond the queue bound.
    pub fn push_event(
        &mut self,
        gpu_index: u32,
        event_type: u64,
        data: u64,
        gi_id: u32,
        ci_id: u32,
    ) {
        let seq = self.next_event_seq;
        self.next_event_seq += 1;
        self.events.push(SimEvent {
            seq,
            gpu_index,
            event_type,
            data,
            gi_id,
            ci_id,
        });
        if self.events.len() > MAX_EVENTS {
            let excess = self.events.len() - MAX_EVENTS;
            self.events.drain(..excess);
        }
    }

    /// Checks invariants a hand-edited or damaged file might break, so the cdylib never indexes
    /// out of range.
    pub fn check(&self) -> Result<(), SimError> {
        if self.format != STATE_FORMAT {
            return Err(SimError::StateFormat {
                format: self.format,
            });
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if g.index as usize != i {
                return Err(SimError::GpuIndex {
                    position: i,
                    index: g.index,
                });
            }
            let model = gpuops_catalog::lookup(&g.model).map_err(|source| SimError::GpuModel {
                position: i,
                source,
            })?;
            if !g.gpu_instances.is_empty() && model.mig.is_none() {
                return Err(SimError::InstancesWithoutMig {
                    position: i,
                    model: model.key,
                });
            }
        }
        Ok(())
    }
}

impl SimGpu {
    /// The catalog entry for this GPU (checked when the state was loaded).
    pub fn catalog(&self) -> Option<&'static GpuModel> {
        gpuops_catalog::lookup(&self.model).ok()
    }

    /// The name NVML reports (`nvmlDeviceGetName`).
    pub fn name(&self) -> String {
        self.reported_name
            .clone()
            .or_else(|| self.catalog().map(|m| m.nvml_name.to_string()))
            .unwrap_or_default()
    }

    /// The PCI device id (upper 16 bits of `pciDeviceId`) NVML reports.
    pub fn pci_device_id(&self) -> u16 {
        self.reported_pci_device_id
            .or_else(|| {
                self.catalog()
                    .and_then(|m| m.pci_device_ids.first().copied())
            })
            .unwrap_or(0)
    }

    /// The PCI class code (`0x030200` 3D controller, `0x030000` VGA controller).
    pub fn pci_class(&self) -> u32 {
        self.pci_class.unwrap_or(DEFAULT_PCI_CLASS)
    }

    /// `00000000:18:00.0`, NVML's `busId` format.
    pub fn pci_bus_id(&self) -> String {
        format!("{:08X}:{:02X}:00.0", self.pci_domain, self.pci_bus)
    }

    /// `0000:18:00.0`, NVML's legacy `busIdLegacy` format.
    pub fn pci_bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:00.0", self.pci_domain, self.pci_bus)
    }

    /// Energy since driver load in millijoules at `now_ms`.
    pub fn energy_mj(&self, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.power_since_unix_ms);
        self.energy_base_mj + u64::from(self.load.power_mw) * elapsed / 1000
    }

    /// Memory used by processes plus background load, in MiB.
    pub fn memory_used_mib(&self) -> u64 {
        self.load.memory_used_mib
            + self
                .processes
                .iter()
                .map(|p| p.used_memory_mib)
                .sum::<u64>()
    }
}

impl Load {
    /// An idle GPU: no work, idle power, a slightly different temperature per board.
    pub fn idle(model: &GpuModel, index: u32) -> Load {
        Load {
            gpu_util_pct: 0,
            mem_util_pct: 0,
            encoder_util_pct: 0,
            decoder_util_pct: 0,
            memory_used_mib: 0,
            power_mw: model.power_limit_mw / 10,
            temperature_c: 30 + index % 4,
            memory_temperature_c: 34 + index % 3,
        }
    }
}

fn nvlinks_for(fabric: Fabric, model: &GpuModel, index: u32, count: u32) -> Vec<NvlinkPeer> {
    let fabric = match fabric {
        Fabric::Auto if model.nvlinks == 0 => Fabric::None,
        Fabric::Auto if model.key.contains("NVL") => Fabric::Pairs,
        Fabric::Auto => Fabric::Nvswitch,
        other => other,
    };
    match fabric {
        Fabric::None | Fabric::Auto => Vec::new(),
        Fabric::Nvswitch => (0..model.nvlinks)
            .map(|l| NvlinkPeer::Switch {
                bus: 0xe0 + l % NVSWITCHES,
            })
            .collect(),
        Fabric::Pairs => {
            let peer = index ^ 1;
            if peer < count {
                (0..model.nvlinks)
                    .map(|_| NvlinkPeer::Gpu { index: peer })
                    .collect()
            } else {
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dgx_h100_state_looks_like_a_dgx() {
        let fleet = Fleet::resolve("dgx-h100").unwrap();
        let s = SimState::from_fleet(&fleet, 1_000).unwrap();
        assert_eq!(s.gpus.len(), 8);
        assert_eq!(s.cuda_driver_version, 13000);
        assert_eq!(s.gpus[0].pci_bus_id(), "00000000:18:00.0");
        assert_eq!(s.gpus[0].pci_bus_id_legacy(), "0000:18:00.0");
        assert_eq!(s.gpus[3].numa_node, 0);
        assert_eq!(s.gpus[4].numa_node, 1);
        assert_eq!(s.gpus[0].nvlinks.len(), 18);
        let uuids: std::collections::HashSet<_> = s.gpus.iter().map(|g| g.uuid.clone()).collect();
        assert_eq!(uuids.len(), 8);
        s.check().unwrap();
    }

    #[test]
    fn nvl_pairs_and_pcie_parts_get_the_right_links() {
        let s = SimState::from_fleet(&Fleet::resolve("h100-nvl-x2").unwrap(), 0).unwrap();
        assert!(
            s.gpus[0]
                .nvlinks
                .iter()
                .all(|p| *p == NvlinkPeer::Gpu { index: 1 })
        );
        let s = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        assert!(s.gpus.iter().all(|g| g.nvlinks.is_empty()));
    }

    #[test]
    fn energy_accumulates_with_power() {
        let s = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        let g = &s.gpus[0];
        assert_eq!(g.energy_mj(2_000), u64::from(g.load.power_mw) * 2);
    }

    #[test]
    fn event_queue_is_bounded() {
        let mut s = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        for _ in 0..(MAX_EVENTS + 5) {
            s.push_event(0, 8, 48, NO_INSTANCE, NO_INSTANCE);
        }
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.events[0].seq, 6);
    }

    #[test]
    fn check_rejects_inconsistent_state() {
        let mut s = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        s.gpus[1].index = 7;
        assert!(s.check().unwrap_err().to_string().contains("gpus[1]"));
        s.gpus[1].index = 1;
        s.gpus[1].model = "H900".into();
        assert!(
            s.check()
                .unwrap_err()
                .to_string()
                .contains("unknown GPU model")
        );
    }
}
