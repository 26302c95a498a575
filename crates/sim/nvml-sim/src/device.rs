//! Per-device queries: identity, PCI, memory, load, clocks, fields, topology, NVLink, processes.

use crate::handles::{Handle, decode};
use crate::{Target, fill_str, now_ms, put, put_slice, put_str, query, query_gpu};
use gpuops_catalog::{Family, GpuModel};
use gpuops_sim::state::{NO_INSTANCE, NvlinkPeer, SimGpu};
use gpuops_sim::{NvmlCode, SimState};
use nvml_wrapper_sys::bindings::field_id::*;
use nvml_wrapper_sys::bindings::*;
use std::os::raw::{c_char, c_uint, c_ulong};

const MIB: u64 = 1024 * 1024;
const IDLE_SM_CLOCK_MHZ: u32 = 345;
/// CPUs per NUMA node of the simulated host (a 2-socket, 2x56-core DGX-class server).
const CPUS_PER_NUMA_NODE: u32 = 112;

fn model(t: &Target<'_>) -> Result<&'static GpuModel, NvmlCode> {
    t.gpu.catalog().ok_or(NvmlCode::Unknown)
}

/// Memory the driver keeps for itself (`reserved` in v2). *Presumed*: about 0.6% of the total.
fn reserved_mib(total_mib: u64) -> u64 {
    total_mib / 160
}

/// (total, reserved, used) in MiB for a GPU or a MIG device.
fn memory_mib(t: &Target<'_>) -> Result<(u64, u64, u64), NvmlCode> {
    match t.mig {
        None => {
            let total = model(t)?.memory_mib;
            Ok((
                total,
                reserved_mib(total),
                t.gpu.memory_used_mib().min(total),
            ))
        }
        Some((gi, ci)) => {
            let (total, _) = t.gpu.mig_device_size(gi, ci);
            let used: u64 = t
                .gpu
                .processes
                .iter()
                .filter(|p| p.gi_id == Some(gi.id))
                .map(|p| p.used_memory_mib)
                .sum();
            Ok((total, 0, used.min(total)))
        }
    }
}

fn mig_name(t: &Target<'_>) -> Result<String, NvmlCode> {
    let m = model(t)?;
    let name = t.gpu.name();
    match t.mig {
        None => Ok(name),
        Some((gi, ci)) => {
            let p = m.gi_profile_by_id(gi.profile_id).ok_or(NvmlCode::Unknown)?;
            let gi_slices = p.compute_slices;
            Ok(if ci.size == gi_slices {
                format!("{name} MIG {}", p.name)
            } else {
                format!("{name} MIG {}c.{}", ci.size, p.name)
            })
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetName");
    query(device, |t| {
        let text = mig_name(t)?;
        // SAFETY: NVML contract: `name` is null or valid for `length` bytes.
        unsafe { put_str(name, length, &text) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetUUID");
    query(device, |t| {
        let text = t
            .mig
            .map_or(t.gpu.uuid.as_str(), |(_, ci)| ci.uuid.as_str());
        // SAFETY: NVML contract: `uuid` is null or valid for `length` bytes.
        unsafe { put_str(uuid, length, text) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetSerial");
    // SAFETY: NVML contract: `serial` is null or valid for `length` bytes.
    query_gpu(device, |t| unsafe {
        put_str(serial, length, &t.gpu.serial)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetIndex");
    // SAFETY: NVML contract: `index` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(index, t.gpu.index) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMinorNumber");
    // SAFETY: NVML contract: `minor` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(minor, t.gpu.minor_number) })
}

fn pci_info(gpu: &SimGpu) -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: gpu.pci_domain,
        bus: gpu.pci_bus,
        device: 0,
        pciDeviceId: (u32::from(gpu.pci_device_id()) << 16) | 0x10DE,
        // Subsystem id: board id << 16 | vendor; *presumed* NVIDIA-built boards.
        pciSubSystemId: (0x16C1 << 16) | 0x10DE,
        busId: [0; 32],
    };
    fill_str(&mut info.busIdLegacy, &gpu.pci_bus_id_legacy());
    fill_str(&mut info.busId, &gpu.pci_bus_id());
    info
}

fn switch_pci_info(bus: u32) -> nvmlPciInfo_t {
    let mut info = nvmlPciInfo_t {
        busIdLegacy: [0; 16],
        domain: gpuops_sim::state::NVSWITCH_PCI_DOMAIN,
        bus,
        device: 0,
        // NVSwitch (third generation) device id.
        pciDeviceId: (0x22A3 << 16) | 0x10DE,
        pciSubSystemId: 0,
        busId: [0; 32],
    };
    fill_str(&mut info.busIdLegacy, &format!("0000:{bus:02X}:00.0"));
    fill_str(&mut info.busId, &format!("00000000:{bus:02X}:00.0"));
    info
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetPciInfo_v3");
    query(device, |t| {
        let info = pci_info(t.gpu);
        // SAFETY: NVML contract: `pci` is null or a valid out-pointer.
        unsafe { put(pci, info) }
    })
}

/// `NVML_STRUCT_VERSION(PciInfoExt, 1)`.
fn pci_info_ext_version() -> u32 {
    (std::mem::size_of::<nvmlPciInfoExt_v1_t>() as u32) | (1 << 24)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfoExt(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfoExt_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetPciInfoExt");
    query(device, |t| {
        if pci.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller sets `version` before the call (NVML contract).
        let version = unsafe { std::ptr::addr_of!((*pci).version).read() };
        if version != pci_info_ext_version() {
            return Err(NvmlCode::ArgumentVersionMismatch);
        }
        let base = pci_info(t.gpu);
        let class = t.gpu.pci_class();
        let mut info = nvmlPciInfoExt_v1_t {
            version,
            domain: base.domain,
            bus: base.bus,
            device: base.device,
            pciDeviceId: base.pciDeviceId,
            pciSubSystemId: base.pciSubSystemId,
            baseClass: (class >> 16) & 0xFF,
            subClass: (class >> 8) & 0xFF,
            busId: [0; 32],
        };
        fill_str(&mut info.busId, &t.gpu.pci_bus_id());
        // SAFETY: NVML contract: `pci` is a valid out-pointer (checked non-null above).
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetPciInfo_v2");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlDeviceGetPciInfo_v3(device, pci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMemoryInfo");
    query(device, |t| {
        let (total, reserved, used) = memory_mib(t)?;
        let info = nvmlMemory_t {
            total: total * MIB,
            // v1 counts the driver's reservation as used.
            used: (used + reserved) * MIB,
            free: total.saturating_sub(used + reserved) * MIB,
        };
        // SAFETY: NVML contract: `memory` is null or a valid out-pointer.
        unsafe { put(memory, info) }
    })
}

/// `NVML_STRUCT_VERSION(Memory, 2)`.
fn memory_v2_version() -> u32 {
    (std::mem::size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMemoryInfo_v2");
    query(device, |t| {
        if memory.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller passes an initialised struct whose `version` field it set.
        let version = unsafe { std::ptr::addr_of!((*memory).version).read() };
        if version != memory_v2_version() {
            return Err(NvmlCode::ArgumentVersionMismatch);
        }
        let (total, reserved, used) = memory_mib(t)?;
        let info = nvmlMemory_v2_t {
            version,
            total: total * MIB,
            reserved: reserved * MIB,
            used: used * MIB,
            free: total.saturating_sub(used + reserved) * MIB,
        };
        // SAFETY: checked non-null above; valid per the NVML contract.
        unsafe { put(memory, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    util: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetUtilizationRates");
    // Not supported on MIG devices, as on real drivers.
    query_gpu(device, |t| {
        let u = nvmlUtilization_t {
            gpu: t.gpu.load.gpu_util_pct,
            memory: t.gpu.load.mem_util_pct,
        };
        // SAFETY: NVML contract: `util` is null or a valid out-pointer.
        unsafe { put(util, u) }
    })
}

unsafe fn codec_util(
    device: nvmlDevice_t,
    util: *mut c_uint,
    period: *mut c_uint,
    decoder: bool,
) -> nvmlReturn_t {
    query_gpu(device, |t| {
        let value = if decoder {
            t.gpu.load.decoder_util_pct
        } else {
            t.gpu.load.encoder_util_pct
        };
        // SAFETY: NVML contract: both are null or valid out-pointers.
        unsafe {
            put(util, value)?;
            put(period, 167_000)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    util: *mut c_uint,
    period: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetEncoderUtilization");
    // SAFETY: forwarded with the same contract.
    unsafe { codec_util(device, util, period, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    util: *mut c_uint,
    period: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetDecoderUtilization");
    // SAFETY: forwarded with the same contract.
    unsafe { codec_util(device, util, period, true) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetTemperature");
    query_gpu(device, |t| {
        if sensor != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: NVML contract: `temp` is null or a valid out-pointer.
        unsafe { put(temp, t.gpu.load.temperature_c) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetPowerUsage");
    // SAFETY: NVML contract: `power` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(power, t.gpu.load.power_mw) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut u64,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetTotalEnergyConsumption");
    // SAFETY: NVML contract: `energy` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe {
        put(energy, t.gpu.energy_mj(now_ms()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(
    device: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetPcieReplayCounter");
    // SAFETY: NVML contract: `value` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(value, t.gpu.pcie_replay_counter) })
}

fn clock(t: &Target<'_>, clock_type: nvmlClockType_t, max: bool) -> Result<u32, NvmlCode> {
    let m = model(t)?;
    let busy = max || t.gpu.load.gpu_util_pct > 0;
    match clock_type {
        nvmlClockType_enum_NVML_CLOCK_GRAPHICS | nvmlClockType_enum_NVML_CLOCK_SM => Ok(if busy {
            m.max_sm_clock_mhz
        } else {
            IDLE_SM_CLOCK_MHZ
        }),
        nvmlClockType_enum_NVML_CLOCK_MEM => Ok(m.max_mem_clock_mhz),
        nvmlClockType_enum_NVML_CLOCK_VIDEO => Ok(m.max_sm_clock_mhz * 4 / 5),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetClockInfo");
    // SAFETY: NVML contract: `mhz` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe {
        put(mhz, clock(t, clock_type, false)?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    mhz: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMaxClockInfo");
    // SAFETY: NVML contract: `mhz` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(mhz, clock(t, clock_type, true)?) })
}

/// One field value, or the per-field error NVML puts in `nvmlReturn`.
fn field(gpu: &SimGpu, id: u32) -> Result<u64, NvmlCode> {
    match id {
        NVML_FI_DEV_MEMORY_TEMP => Ok(u64::from(gpu.load.memory_temperature_c)),
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => Ok(gpu.energy_mj(now_ms())),
        NVML_FI_DEV_REMAPPED_COR => Ok(gpu.remapped_rows_correctable),
        NVML_FI_DEV_REMAPPED_UNC => Ok(gpu.remapped_rows_uncorrectable),
        NVML_FI_DEV_REMAPPED_PENDING => Ok(u64::from(gpu.remapped_rows_pending)),
        NVML_FI_DEV_REMAPPED_FAILURE => Ok(u64::from(gpu.remapped_rows_failure)),
        // NVML_GPU_RECOVERY_ACTION_NONE until something needs a reset.
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION => Ok(u64::from(gpu.remapped_rows_pending)),
        _ => Err(NvmlCode::NotSupported),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    count: i32,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetFieldValues");
    query_gpu(device, |t| {
        if values.is_null() || count < 0 {
            return Err(NvmlCode::InvalidArgument);
        }
        let now_us = (now_ms() * 1000) as i64;
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` initialised entries whose `fieldId` it set.
            let entry = unsafe { values.add(i) };
            // SAFETY: `entry` is within the caller's array.
            let id = unsafe { std::ptr::addr_of!((*entry).fieldId).read() };
            let (value, code) = match field(t.gpu, id) {
                Ok(v) => (v, 0),
                Err(e) => (0, e.code()),
            };
            let out = nvmlFieldValue_t {
                fieldId: id,
                // SAFETY: reading the caller-set scope id of the same entry.
                scopeId: unsafe { std::ptr::addr_of!((*entry).scopeId).read() },
                timestamp: now_us,
                latencyUsec: 0,
                valueType: nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                nvmlReturn: code,
                value: nvmlValue_t { ullVal: value },
            };
            // SAFETY: `entry` is valid for writes (the caller's array).
            unsafe { entry.write(out) };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: nvmlDevice_t,
    node: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetNumaNodeId");
    // SAFETY: NVML contract: `node` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(node, t.gpu.numa_node) })
}

fn numa_cpu_mask(numa_node: u32, words: usize) -> Vec<c_ulong> {
    let bits = c_ulong::BITS;
    let mut mask = vec![0 as c_ulong; words];
    for cpu in numa_node * CPUS_PER_NUMA_NODE..(numa_node + 1) * CPUS_PER_NUMA_NODE {
        if let Some(word) = mask.get_mut((cpu / bits) as usize) {
            *word |= 1 << (cpu % bits);
        }
    }
    mask
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    cpus: *mut c_ulong,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetCpuAffinity");
    query_gpu(device, |t| {
        let mask = numa_cpu_mask(t.gpu.numa_node, size as usize);
        // SAFETY: NVML contract: `cpus` is null or valid for `size` words.
        unsafe { put_slice(cpus, size as usize, &mask) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device: nvmlDevice_t,
    size: c_uint,
    nodes: *mut c_ulong,
    _scope: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMemoryAffinity");
    query_gpu(device, |t| {
        let mut mask = vec![0 as c_ulong; size as usize];
        let node = t.gpu.numa_node;
        if let Some(word) = mask.get_mut((node / c_ulong::BITS) as usize) {
            *word |= 1 << (node % c_ulong::BITS);
        }
        // SAFETY: NVML contract: `nodes` is null or valid for `size` words.
        unsafe { put_slice(nodes, size as usize, &mask) }
    })
}

fn other_gpu(state: &SimState, device: nvmlDevice_t) -> Result<&SimGpu, NvmlCode> {
    match decode(device as usize) {
        Handle::Device { gpu } => {
            let g = state
                .gpus
                .get(gpu as usize)
                .ok_or(NvmlCode::InvalidArgument)?;
            g.live()?;
            Ok(g)
        }
        _ => Err(NvmlCode::InvalidArgument),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTopologyCommonAncestor(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    level: *mut nvmlGpuTopologyLevel_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetTopologyCommonAncestor");
    query_gpu(device1, |t| {
        let other = other_gpu(t.state, device2)?;
        let value = if other.index == t.gpu.index {
            nvmlGpuLevel_enum_NVML_TOPOLOGY_INTERNAL
        } else if other.pcie_switch == t.gpu.pcie_switch {
            nvmlGpuLevel_enum_NVML_TOPOLOGY_SINGLE
        } else if other.numa_node == t.gpu.numa_node {
            nvmlGpuLevel_enum_NVML_TOPOLOGY_NODE
        } else {
            nvmlGpuLevel_enum_NVML_TOPOLOGY_SYSTEM
        };
        // SAFETY: NVML contract: `level` is null or a valid out-pointer.
        unsafe { put(level, value) }
    })
}

/// Whether two GPUs reach each other over NVLink (directly or through NVSwitches).
fn nvlink_connected(a: &SimGpu, b: &SimGpu) -> bool {
    let via_switch = |g: &SimGpu| {
        g.nvlinks
            .iter()
            .any(|p| matches!(p, NvlinkPeer::Switch { .. }))
    };
    a.index != b.index
        && ((via_switch(a) && via_switch(b))
            || a.nvlinks.contains(&NvlinkPeer::Gpu { index: b.index }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetP2PStatus(
    device1: nvmlDevice_t,
    device2: nvmlDevice_t,
    caps: nvmlGpuP2PCapsIndex_t,
    status: *mut nvmlGpuP2PStatus_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetP2PStatus");
    query_gpu(device1, |t| {
        let other = other_gpu(t.state, device2)?;
        let ok = match caps {
            nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_NVLINK => nvlink_connected(t.gpu, other),
            nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_READ
            | nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_WRITE
            | nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_ATOMICS => {
                nvlink_connected(t.gpu, other) || other.numa_node == t.gpu.numa_node
            }
            nvmlGpuP2PCapsIndex_enum_NVML_P2P_CAPS_INDEX_PROP => true,
            _ => return Err(NvmlCode::InvalidArgument),
        };
        let value = if ok {
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_OK
        } else {
            nvmlGpuP2PStatus_enum_NVML_P2P_STATUS_NOT_SUPPORTED
        };
        // SAFETY: NVML contract: `status` is null or a valid out-pointer.
        unsafe { put(status, value) }
    })
}

fn link_peer(t: &Target<'_>, link: c_uint) -> Result<NvlinkPeer, NvmlCode> {
    if link >= NVML_NVLINK_MAX_LINKS {
        return Err(NvmlCode::InvalidArgument);
    }
    if model(t)?.nvlinks == 0 {
        return Err(NvmlCode::NotSupported);
    }
    t.gpu
        .nvlinks
        .get(link as usize)
        .copied()
        .ok_or(NvmlCode::NotSupported)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: nvmlDevice_t,
    link: c_uint,
    active: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetNvLinkState");
    query_gpu(device, |t| {
        link_peer(t, link)?;
        // SAFETY: NVML contract: `active` is null or a valid out-pointer.
        unsafe { put(active, nvmlEnableState_enum_NVML_FEATURE_ENABLED) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: nvmlDevice_t,
    link: c_uint,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    query_gpu(device, |t| {
        let info = match link_peer(t, link)? {
            NvlinkPeer::Switch { bus } => switch_pci_info(bus),
            NvlinkPeer::Gpu { index } => {
                let peer = t.state.gpus.get(index as usize).ok_or(NvmlCode::Unknown)?;
                pci_info(peer)
            }
        };
        // SAFETY: NVML contract: `pci` is null or a valid out-pointer.
        unsafe { put(pci, info) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: nvmlDevice_t,
    link: c_uint,
    kind: *mut nvmlIntNvLinkDeviceType_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetNvLinkRemoteDeviceType");
    query_gpu(device, |t| {
        let value = match link_peer(t, link)? {
            NvlinkPeer::Switch { .. } => {
                nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH
            }
            NvlinkPeer::Gpu { .. } => nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_GPU,
        };
        // SAFETY: NVML contract: `kind` is null or a valid out-pointer.
        unsafe { put(kind, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeMode(
    device: nvmlDevice_t,
    mode: *mut nvmlComputeMode_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetComputeMode");
    // SAFETY: NVML contract: `mode` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe { put(mode, t.gpu.compute_mode) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device: nvmlDevice_t,
    major: *mut i32,
    minor: *mut i32,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetCudaComputeCapability");
    query(device, |t| {
        let (ma, mi) = model(t)?.compute_capability;
        // SAFETY: NVML contract: both are null or valid out-pointers.
        unsafe {
            put(major, ma as i32)?;
            put(minor, mi as i32)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetArchitecture");
    query(device, |t| {
        let value = match model(t)?.family {
            Family::Volta => NVML_DEVICE_ARCH_VOLTA,
            Family::Turing => NVML_DEVICE_ARCH_TURING,
            Family::Ampere => NVML_DEVICE_ARCH_AMPERE,
            Family::AdaLovelace => NVML_DEVICE_ARCH_ADA,
            Family::Hopper => NVML_DEVICE_ARCH_HOPPER,
            Family::Blackwell => NVML_DEVICE_ARCH_BLACKWELL,
        };
        // SAFETY: NVML contract: `arch` is null or a valid out-pointer.
        unsafe { put(arch, value) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device: nvmlDevice_t,
    brand: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetBrand");
    // SAFETY: NVML contract: `brand` is null or a valid out-pointer.
    query(device, |_| unsafe {
        put(brand, nvmlBrandType_enum_NVML_BRAND_NVIDIA)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetComputeRunningProcesses_v3");
    query(device, |t| {
        if count.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let list: Vec<nvmlProcessInfo_t> = t
            .gpu
            .processes
            .iter()
            .filter(|p| {
                t.mig.is_none_or(|(gi, ci)| {
                    p.gi_id == Some(gi.id) && p.ci_id.is_none_or(|c| c == ci.id)
                })
            })
            .map(|p| nvmlProcessInfo_t {
                pid: p.pid,
                usedGpuMemory: p.used_memory_mib * MIB,
                gpuInstanceId: p.gi_id.unwrap_or(NO_INSTANCE),
                computeInstanceId: p.ci_id.unwrap_or(NO_INSTANCE),
            })
            .collect();
        // SAFETY: `count` checked non-null; valid per the NVML contract (in: capacity, out: needed).
        let capacity = unsafe { count.read() } as usize;
        // SAFETY: as above.
        unsafe { count.write(list.len() as c_uint) };
        if list.len() > capacity || (infos.is_null() && !list.is_empty()) {
            return Err(NvmlCode::InsufficientSize);
        }
        // SAFETY: NVML contract: `infos` is valid for `capacity` entries.
        unsafe { put_slice(infos, capacity, &list) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_mask_marks_the_numa_nodes_cpus() {
        let mask = numa_cpu_mask(1, 4);
        assert_eq!(mask[0], 0);
        assert_eq!(mask[1] & (1 << 48), 1 << 48); // cpu 112 = word 1 bit 48
        assert_eq!(
            mask.iter().map(|w| w.count_ones()).sum::<u32>(),
            CPUS_PER_NUMA_NODE
        );
        assert_eq!(reserved_mib(81_920), 512);
    }
}
