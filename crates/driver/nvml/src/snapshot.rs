//! Reads the driver into an [`Inventory`]: one GPU failing never hides the others.

use crate::error::{NvmlError, call};
use crate::{Gpus, raw};
use gpuops_catalog::{Family, GpuModel, ProfileName, memory_gb_for_name, nvml_enum};
use gpuops_inventory::{
    Gpu, GpuLink, GpuProcess, Health, Inventory, Memory, MigDevice, MigState, NvLink, PcieLevel,
    RemappedRows, Telemetry,
};
use nvml_wrapper::Device;
use nvml_wrapper::enum_wrappers::device::{Clock, ComputeMode, TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::field_id::*;
use std::path::Path;

const MIB: u64 = 1024 * 1024;
/// `NVML_NVLINK_MAX_LINKS`.
const MAX_NVLINKS: u32 = 18;
/// Memory slices MIG names are computed against (A30's four slices give the same eighths).
const NAME_SLICES: u32 = 8;

/// How much a snapshot reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Everything: identity, memory, MIG, processes, NVLinks, topology, telemetry.
    Full,
    /// What MIG partitioning needs: identity, memory, MIG devices, processes (no NVLinks,
    /// topology or telemetry, which cost most of the driver calls).
    Mig,
    /// Everything that changes while the node runs: [`Scope::Full`] without NVLinks and
    /// topology (a third of the driver calls on an NVSwitch node), for periodic re-reads that
    /// keep those from the first snapshot.
    Live,
}

/// Collects optional figures: unsupported is `None`, a lost GPU aborts the GPU, anything else is a
/// warning and `None`.
struct Reader<'w> {
    gpu: u32,
    warnings: &'w mut Vec<String>,
}

impl Reader<'_> {
    fn opt<T>(
        &mut self,
        what: &'static str,
        r: Result<T, WrapperError>,
    ) -> Result<Option<T>, NvmlError> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) => self.soft(call(what, Some(self.gpu), e)),
        }
    }

    fn soft<T>(&mut self, e: NvmlError) -> Result<Option<T>, NvmlError> {
        match e {
            NvmlError::GpuLost { .. } => Err(e),
            NvmlError::NotSupported { .. } => Ok(None),
            other => {
                self.warnings.push(other.to_string());
                Ok(None)
            }
        }
    }
}

impl Gpus {
    /// The whole node now. Fails only when the driver cannot even count its GPUs.
    pub fn snapshot(&self) -> Result<Inventory, NvmlError> {
        self.snapshot_with(Scope::Full)
    }

    /// A snapshot of only what `scope` needs.
    pub fn snapshot_with(&self, scope: Scope) -> Result<Inventory, NvmlError> {
        let count = self.count()?;
        let mut inv = Inventory::default();
        let mut system = |what: &str, r: Result<String, WrapperError>| match r {
            Ok(v) => v,
            Err(e) => {
                inv.warnings.push(format!("{what}: {e}"));
                String::new()
            }
        };
        let driver = system("driver version", self.nvml.sys_driver_version());
        let nvml_version = system("NVML version", self.nvml.sys_nvml_version());
        let cuda = system(
            "CUDA version",
            self.nvml
                .sys_cuda_driver_version()
                .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)),
        );
        inv.driver_version = driver;
        inv.nvml_version = nvml_version;
        inv.cuda_driver_version = cuda;
        for index in 0..count {
            let gpu = match self.read_gpu(index, scope, &mut inv.warnings) {
                Ok(gpu) => gpu,
                Err(e) => self.unusable_gpu(index, e),
            };
            inv.gpus.push(gpu);
        }
        if scope == Scope::Full {
            let mut warnings = Vec::new();
            inv.topology = self.topology(&inv, &mut warnings);
            inv.warnings.extend(warnings);
        }
        Ok(inv)
    }

    /// One GPU's MIG devices, reading only what MIG needs (much cheaper than a snapshot).
    pub fn mig_devices_of(&self, index: u32) -> Result<Vec<MigDevice>, NvmlError> {
        let gpu = Some(index);
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| call("nvmlDeviceGetHandleByIndex", gpu, e))?;
        let total_mib = d
            .memory_info()
            .map_err(|e| call("nvmlDeviceGetMemoryInfo", gpu, e))?
            .total
            / MIB;
        let mut warnings = Vec::new();
        let mut r = Reader {
            gpu: index,
            warnings: &mut warnings,
        };
        let devices = self.mig_devices(&d, index, total_mib, &mut r)?;
        match warnings.into_iter().next() {
            Some(w) => Err(NvmlError::Call {
                call: "reading MIG devices",
                gpu,
                reason: w,
                code: None,
            }),
            None => Ok(devices),
        }
    }

    /// A placeholder for a GPU that could not be read, named as it was last seen.
    fn unusable_gpu(&self, index: u32, e: NvmlError) -> Gpu {
        let (uuid, name) = self
            .last_seen
            .lock()
            .map(|seen| seen.get(&index).cloned().unwrap_or_default())
            .unwrap_or_default();
        let health = if e.is_gpu_lost() {
            Health::Lost
        } else {
            Health::Unreachable {
                reason: e.to_string(),
            }
        };
        Gpu {
            index,
            uuid,
            name,
            health,
            ..Gpu::default()
        }
    }

    fn read_gpu(
        &self,
        index: u32,
        scope: Scope,
        warnings: &mut Vec<String>,
    ) -> Result<Gpu, NvmlError> {
        let full = scope == Scope::Full;
        let live = scope != Scope::Mig;
        let gpu = Some(index);
        let d = self
            .nvml
            .device_by_index(index)
            .map_err(|e| call("nvmlDeviceGetHandleByIndex", gpu, e))?;
        let name = d.name().map_err(|e| call("nvmlDeviceGetName", gpu, e))?;
        let uuid = d.uuid().map_err(|e| call("nvmlDeviceGetUUID", gpu, e))?;
        let pci = d
            .pci_info()
            .map_err(|e| call("nvmlDeviceGetPciInfo", gpu, e))?;
        if let Ok(mut seen) = self.last_seen.lock() {
            seen.insert(index, (uuid.clone(), name.clone()));
        }
        let mut r = Reader {
            gpu: index,
            warnings,
        };
        let pci_class = match raw::pci_class(self.nvml.lib(), raw::handle(&d), gpu) {
            Ok(class) => Some(class),
            // Drivers before R535 lack the call: read what the kernel shows, as GFD does.
            Err(NvmlError::NotSupported { .. }) => sysfs_pci_class(&self.sysfs_root, &pci.bus_id),
            Err(e) => r
                .soft(e)?
                .or_else(|| sysfs_pci_class(&self.sysfs_root, &pci.bus_id)),
        };
        let mem = d
            .memory_info()
            .map_err(|e| call("nvmlDeviceGetMemoryInfo", gpu, e))?;
        // By PCI id and memory: board variants share an id (GB200's pre-production boards).
        let model = gpuops_catalog::identify((pci.pci_device_id >> 16) as u16, mem.total / MIB)
            .or_else(|| gpuops_catalog::lookup(&name).ok());
        let memory = Memory {
            total_mib: mem.total / MIB,
            used_mib: mem.used / MIB,
            free_mib: mem.free / MIB,
            reserved_mib: mem.reserved / MIB,
        };
        let cc = r.opt(
            "nvmlDeviceGetCudaComputeCapability",
            d.cuda_compute_capability(),
        )?;
        let compute_capability = cc.map(|c| (c.major as u32, c.minor as u32));
        let family = compute_capability
            .and_then(|(ma, mi)| Family::from_compute_capability(ma, mi))
            .map(|f| f.as_str().to_string());
        let mig = match d.mig_mode() {
            Ok(m) => MigState {
                capable: true,
                current_enabled: m.current == 1,
                pending_enabled: m.pending == 1,
            },
            Err(e) => {
                r.soft::<()>(call("nvmlDeviceGetMigMode", gpu, e))?;
                MigState::default()
            }
        };
        let mut mig_devices = if mig.current_enabled {
            self.mig_devices(&d, index, memory.total_mib, &mut r)?
        } else {
            Vec::new()
        };
        let activity = if live {
            let mut gis: Vec<(u32, u32, u32)> = mig_devices
                .iter()
                .map(|m| (m.gi_id, m.gi_profile_id, m.placement_start))
                .collect();
            gis.dedup();
            let sampled =
                crate::gpm::sample_gpu(&self.nvml, &self.gpm, &d, index, &uuid, &gis, r.warnings)?;
            for m in &mut mig_devices {
                m.activity = sampled.instances.get(&m.gi_id).copied();
            }
            sampled.gpu
        } else {
            None
        };
        Ok(Gpu {
            index,
            uuid,
            name,
            model: model.map(|m| m.key.to_string()),
            pci_bus_id: pci.bus_id.clone(),
            pci_device_id: pci.pci_device_id,
            pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
            pci_class,
            minor_number: r.opt("nvmlDeviceGetMinorNumber", d.minor_number())?,
            serial: r.opt("nvmlDeviceGetSerial", d.serial())?,
            memory,
            compute_capability,
            family,
            sm_count: model.map(|m: &GpuModel| m.sm_count),
            numa_node: r.opt("nvmlDeviceGetNumaNodeId", d.numa_node_id())?,
            compute_mode: r
                .opt("nvmlDeviceGetComputeMode", d.compute_mode())?
                .map(compute_mode_name),
            mig,
            mig_devices,
            nvlinks: if full {
                self.nvlinks(&d, &mut r)?
            } else {
                Vec::new()
            },
            processes: r
                .opt(
                    "nvmlDeviceGetComputeRunningProcesses",
                    d.running_compute_processes(),
                )?
                .unwrap_or_default()
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_memory_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
                        UsedGpuMemory::Unavailable => None,
                    },
                    gi_id: p.gpu_instance_id,
                    ci_id: p.compute_instance_id,
                })
                .collect(),
            telemetry: if live {
                telemetry(&d, &mut r)?
            } else {
                Telemetry::default()
            },
            activity,
            health: Health::Healthy,
        })
    }

    fn mig_devices(
        &self,
        d: &Device<'_>,
        index: u32,
        total_mib: u64,
        r: &mut Reader<'_>,
    ) -> Result<Vec<MigDevice>, NvmlError> {
        let gpu = Some(index);
        let parent = raw::handle(d);
        let profiles = match self.gi_profiles(index) {
            Ok(p) => p,
            Err(e) => r.soft(e)?.unwrap_or_default(),
        };
        let max = r
            .opt("nvmlDeviceGetMaxMigDeviceCount", d.mig_device_count())?
            .unwrap_or(0);
        let mut out = Vec::new();
        for j in 0..max {
            let m = match d.mig_device_by_index(j) {
                Ok(m) => m,
                // Indices may be sparse: NOT_FOUND just means no MIG device at this index.
                Err(WrapperError::NotFound) | Err(WrapperError::InvalidArg) => continue,
                Err(e) => {
                    r.soft::<()>(call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, e))?;
                    continue;
                }
            };
            // One unreadable MIG device is a warning, not a reason to hide the GPU or the others.
            match self.mig_device(&m, j, parent, &profiles, total_mib, index) {
                Ok(device) => out.push(device),
                Err(e) => {
                    r.soft::<()>(e)?;
                }
            }
        }
        Ok(out)
    }

    fn mig_device(
        &self,
        m: &Device<'_>,
        j: u32,
        parent: nvml_wrapper_sys::bindings::nvmlDevice_t,
        profiles: &[crate::GiProfileInfo],
        total_mib: u64,
        index: u32,
    ) -> Result<MigDevice, NvmlError> {
        let gpu = Some(index);
        let lib = self.nvml.lib();
        let uuid = m.uuid().map_err(|e| call("nvmlDeviceGetUUID", gpu, e))?;
        let (gi_id, ci_id) = raw::mig_ids(lib, raw::handle(m), gpu)?;
        let gi = raw::gpu_instance_by_id(lib, parent, gi_id, gpu)?;
        let gi_info = raw::gpu_instance_info(lib, gi, gpu)?;
        let ci = raw::compute_instance_by_id(lib, gi, ci_id, gpu)?;
        let ci_info = raw::compute_instance_info(lib, ci, gpu)?;
        let ci_profile = raw::compute_instance_profile_info(lib, gi, ci_info.profileId, gpu)?;
        let profile = profiles.iter().find(|p| p.id == gi_info.profileId);
        let (gi_name, gi_slices, memory_mib) = match profile {
            Some(p) => (p.name_for(total_mib), p.slice_count, p.memory_mib),
            None => (format!("unknown-profile-{}", gi_info.profileId), 0, 0),
        };
        // Per-instance memory: a failure here only loses the FB figures of this instance.
        let fb = m.memory_info().ok().map(|mem| Memory {
            total_mib: mem.total / MIB,
            used_mib: mem.used / MIB,
            free_mib: mem.free / MIB,
            reserved_mib: mem.reserved / MIB,
        });
        let ci_name = if ci_profile.sliceCount < gi_slices {
            format!("{}c.{gi_name}", ci_profile.sliceCount)
        } else {
            gi_name.clone()
        };
        Ok(MigDevice {
            uuid,
            index: j,
            gi_id,
            ci_id,
            profile: gi_name,
            ci_profile: ci_name,
            gi_profile_id: gi_info.profileId,
            placement_start: gi_info.placement.start,
            placement_size: gi_info.placement.size,
            memory_mib,
            sm_count: ci_profile.multiprocessorCount,
            gi_slices,
            ci_slices: ci_profile.sliceCount,
            fb,
            activity: None,
        })
    }

    fn nvlinks(&self, d: &Device<'_>, r: &mut Reader<'_>) -> Result<Vec<NvLink>, NvmlError> {
        let mut out = Vec::new();
        for link in 0..MAX_NVLINKS {
            let w = d.link_wrapper_for(link);
            let active = match w.is_active() {
                Ok(a) => a,
                // Links past the GPU's count, or no NVLink at all.
                Err(WrapperError::NotSupported) | Err(WrapperError::InvalidArg) => break,
                Err(e) => match r.soft::<()>(call("nvmlDeviceGetNvLinkState", Some(r.gpu), e)) {
                    Ok(_) => break,
                    Err(lost) => return Err(lost),
                },
            };
            if !active {
                continue;
            }
            let Some(remote) = r.opt("nvmlDeviceGetNvLinkRemotePciInfo", w.remote_pci_info())?
            else {
                continue;
            };
            let remote_is_switch = match raw::nvlink_remote_is_switch(
                self.nvml.lib(),
                raw::handle(d),
                link,
                Some(r.gpu),
            ) {
                Ok(s) => s,
                Err(e) => r.soft(e)?.unwrap_or(false),
            };
            out.push(NvLink {
                link,
                remote_pci_bus_id: remote.bus_id,
                remote_is_switch,
            });
        }
        Ok(out)
    }

    /// Pairwise links between healthy GPUs.
    fn topology(&self, inv: &Inventory, warnings: &mut Vec<String>) -> Vec<GpuLink> {
        let healthy: Vec<&Gpu> = inv.healthy_gpus().collect();
        let mut links = Vec::new();
        for (i, a) in healthy.iter().enumerate() {
            for b in &healthy[i + 1..] {
                let direct = a
                    .nvlinks
                    .iter()
                    .filter(|l| l.remote_pci_bus_id == b.pci_bus_id)
                    .count() as u32;
                let switched =
                    |g: &Gpu| g.nvlinks.iter().filter(|l| l.remote_is_switch).count() as u32;
                let nvlinks = if direct > 0 {
                    direct
                } else {
                    switched(a).min(switched(b))
                };
                let level = self
                    .nvml
                    .device_by_index(a.index)
                    .and_then(|da| self.nvml.device_by_index(b.index).map(|db| (da, db)))
                    .and_then(|(da, db)| da.topology_common_ancestor(db));
                let pcie = match level {
                    Ok(l) => pcie_level(l),
                    Err(e) => {
                        warnings.push(format!(
                            "topology between GPU {} and {}: {e}",
                            a.index, b.index
                        ));
                        PcieLevel::CrossCpu
                    }
                };
                links.push(GpuLink {
                    a: a.index,
                    b: b.index,
                    nvlinks,
                    pcie,
                });
            }
        }
        links
    }
}

/// `<root>/bus/pci/devices/0000:18:00.0/class` (`0x030200`) for NVML's bus id `00000000:18:00.0`;
/// `None` when the file is missing or unreadable.
pub(crate) fn sysfs_pci_class(root: &Path, nvml_bus_id: &str) -> Option<u32> {
    let (domain, rest) = nvml_bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let address = format!("{domain:04x}:{}", rest.to_ascii_lowercase());
    let text =
        std::fs::read_to_string(root.join("bus/pci/devices").join(address).join("class")).ok()?;
    let hex = text.trim().trim_start_matches("0x");
    u32::from_str_radix(hex, 16).ok()
}

fn pcie_level(level: TopologyLevel) -> PcieLevel {
    match level {
        TopologyLevel::Internal => PcieLevel::SameBoard,
        TopologyLevel::Single => PcieLevel::SingleSwitch,
        TopologyLevel::Multiple => PcieLevel::MultipleSwitches,
        TopologyLevel::HostBridge => PcieLevel::HostBridge,
        TopologyLevel::Node => PcieLevel::SameNumaNode,
        TopologyLevel::System => PcieLevel::CrossCpu,
    }
}

fn compute_mode_name(mode: ComputeMode) -> String {
    match mode {
        ComputeMode::Default => "default",
        ComputeMode::ExclusiveThread => "exclusive-thread",
        ComputeMode::Prohibited => "prohibited",
        ComputeMode::ExclusiveProcess => "exclusive-process",
    }
    .to_string()
}

fn field_u64(sample: &Result<FieldValueSample, WrapperError>) -> Option<u64> {
    match sample.as_ref().ok()?.value.as_ref().ok()? {
        SampleValue::U64(v) => Some(*v),
        SampleValue::U32(v) => Some(u64::from(*v)),
        SampleValue::I64(v) => u64::try_from(*v).ok(),
        SampleValue::F64(_) => None,
    }
}

fn telemetry(d: &Device<'_>, r: &mut Reader<'_>) -> Result<Telemetry, NvmlError> {
    let util = r.opt("nvmlDeviceGetUtilizationRates", d.utilization_rates())?;
    let fields = [
        NVML_FI_DEV_MEMORY_TEMP,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
    ]
    .map(FieldId);
    let values = r
        .opt("nvmlDeviceGetFieldValues", d.field_values_for(&fields))?
        .unwrap_or_default();
    let value = |i: usize| values.get(i).and_then(field_u64);
    // A memory temperature above 200 C is NVML's "no sensor" value, not a reading.
    let memory_temperature_c = value(0).filter(|t| *t <= 200).map(|t| t as u32);
    let remapped_rows = match (value(1), value(2), value(3), value(4)) {
        (Some(c), Some(u), Some(p), Some(f)) => Some(RemappedRows {
            correctable: c,
            uncorrectable: u,
            pending: p != 0,
            failure: f != 0,
        }),
        _ => None,
    };
    Ok(Telemetry {
        gpu_utilization_pct: util.as_ref().map(|u| u.gpu),
        memory_utilization_pct: util.as_ref().map(|u| u.memory),
        encoder_utilization_pct: r
            .opt("nvmlDeviceGetEncoderUtilization", d.encoder_utilization())?
            .map(|u| u.utilization),
        decoder_utilization_pct: r
            .opt("nvmlDeviceGetDecoderUtilization", d.decoder_utilization())?
            .map(|u| u.utilization),
        temperature_c: r
            .opt(
                "nvmlDeviceGetTemperature",
                d.temperature(TemperatureSensor::Gpu),
            )?
            .filter(|t| *t <= 200),
        memory_temperature_c,
        power_mw: r.opt("nvmlDeviceGetPowerUsage", d.power_usage())?,
        energy_mj: r.opt(
            "nvmlDeviceGetTotalEnergyConsumption",
            d.total_energy_consumption(),
        )?,
        sm_clock_mhz: r.opt("nvmlDeviceGetClockInfo", d.clock_info(Clock::SM))?,
        mem_clock_mhz: r.opt("nvmlDeviceGetClockInfo", d.clock_info(Clock::Memory))?,
        pcie_replay_counter: r.opt("nvmlDeviceGetPcieReplayCounter", d.pcie_replay_counter())?,
        remapped_rows,
    })
}

impl crate::GiProfileInfo {
    /// The profile's name as NVIDIA's tools print it (`1g.10gb+me`), from what the driver reports,
    /// so GPUs the catalog does not know are named correctly too.
    pub fn name_for(&self, total_mib: u64) -> String {
        ProfileName {
            compute_slices: None,
            gpu_slices: self.slice_count,
            memory_gb: memory_gb_for_name(self.memory_mib, total_mib, NAME_SLICES),
            attrs: nvml_enum::attrs_for_enum(self.nvml_enum)
                .iter()
                .map(|a| (*a).to_string())
                .collect(),
        }
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_pci_class_reads_the_kernels_class_file_for_an_nvml_bus_id() {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("bus/pci/devices/0000:9a:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("class"), "0x030000\n").unwrap();
        assert_eq!(
            sysfs_pci_class(root.path(), "00000000:9A:00.0"),
            Some(0x03_00_00)
        );
        assert_eq!(sysfs_pci_class(root.path(), "00000000:18:00.0"), None);
        assert_eq!(sysfs_pci_class(root.path(), "garbage"), None);
        std::fs::write(dev.join("class"), "not hex").unwrap();
        assert_eq!(sysfs_pci_class(root.path(), "00000000:9A:00.0"), None);
    }
}
