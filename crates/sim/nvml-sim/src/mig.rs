//! MIG calls: mode, GPU/compute instance profiles, placements, creation, listing, MIG device handles.

use crate::handles::{Handle, decode, device_ptr, encode, mig_ptr};
use crate::{current_state, mutate, put, put_slice, query, query_gpu, ret};
use gpuops_sim::{NvmlCode, SimGpu, SimState, ids};
use nvml_wrapper_sys::bindings::*;
use std::os::raw::c_uint;

fn gi_ptr(gpu: u32, gi: u32) -> nvmlGpuInstance_t {
    encode(Handle::GpuInstance { gpu, gi }) as _
}

fn ci_ptr(gpu: u32, gi: u32, ci: u32) -> nvmlComputeInstance_t {
    encode(Handle::ComputeInstance { gpu, gi, ci }) as _
}

fn device_index(device: nvmlDevice_t) -> Result<u32, NvmlCode> {
    match decode(device as usize) {
        Handle::Device { gpu } => Ok(gpu),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

fn gi_of(handle: nvmlGpuInstance_t) -> Result<(u32, u32), NvmlCode> {
    match decode(handle as usize) {
        Handle::GpuInstance { gpu, gi } => Ok((gpu, gi)),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

fn ci_of(handle: nvmlComputeInstance_t) -> Result<(u32, u32, u32), NvmlCode> {
    match decode(handle as usize) {
        Handle::ComputeInstance { gpu, gi, ci } => Ok((gpu, gi, ci)),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

fn gpu_of(state: &SimState, index: u32) -> Result<&SimGpu, NvmlCode> {
    let g = state
        .gpus
        .get(index as usize)
        .ok_or(NvmlCode::InvalidArgument)?;
    g.live()?;
    Ok(g)
}

fn gpu_mut(state: &mut SimState, index: u32) -> Result<&mut SimGpu, NvmlCode> {
    let g = state
        .gpus
        .get_mut(index as usize)
        .ok_or(NvmlCode::InvalidArgument)?;
    g.live()?;
    Ok(g)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMigMode");
    query_gpu(device, |t| {
        t.gpu.mig_geometry()?;
        // SAFETY: NVML contract: both are null or valid out-pointers.
        unsafe {
            put(current, c_uint::from(t.gpu.mig_current))?;
            put(pending, c_uint::from(t.gpu.mig_pending))
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: nvmlDevice_t,
    mode: c_uint,
    status: *mut nvmlReturn_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceSetMigMode");
    ret((|| {
        let index = device_index(device)?;
        if mode > NVML_DEVICE_MIG_ENABLE {
            return Err(NvmlCode::InvalidArgument);
        }
        let activation =
            mutate(|s| gpu_mut(s, index)?.set_mig_mode(mode == NVML_DEVICE_MIG_ENABLE))?;
        // SAFETY: NVML contract: `status` is null or a valid out-pointer.
        unsafe { put(status, activation.code()) }
    })())
}

fn gi_profile_info(
    gpu: &SimGpu,
    profile_enum: c_uint,
) -> Result<nvmlGpuInstanceProfileInfo_t, NvmlCode> {
    let p = gpu.gi_profile_by_enum(profile_enum)?;
    Ok(nvmlGpuInstanceProfileInfo_t {
        id: p.nvml_id,
        isP2pSupported: 0,
        sliceCount: p.compute_slices,
        instanceCount: p.max_count,
        multiprocessorCount: p.sm_count,
        copyEngineCount: p.copy_engines,
        decoderCount: p.decoders,
        encoderCount: p.encoders,
        jpegCount: p.jpegs,
        ofaCount: p.ofas,
        memorySizeMB: p.memory_mib,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstanceProfileInfo");
    // SAFETY: NVML contract: `info` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe {
        put(info, gi_profile_info(t.gpu, profile)?)
    })
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)`.
fn gi_info_v2_version() -> u32 {
    (std::mem::size_of::<nvmlGpuInstanceProfileInfo_v2_t>() as u32) | (2 << 24)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: nvmlDevice_t,
    profile: c_uint,
    info: *mut nvmlGpuInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstanceProfileInfoV");
    query_gpu(device, |t| {
        if info.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller initialised `version`.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        if version != gi_info_v2_version() {
            return Err(NvmlCode::ArgumentVersionMismatch);
        }
        let v1 = gi_profile_info(t.gpu, profile)?;
        let name = t.gpu.gi_profile_by_enum(profile)?.name;
        let mut out = nvmlGpuInstanceProfileInfo_v2_t {
            version,
            id: v1.id,
            isP2pSupported: v1.isP2pSupported,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            copyEngineCount: v1.copyEngineCount,
            decoderCount: v1.decoderCount,
            encoderCount: v1.encoderCount,
            jpegCount: v1.jpegCount,
            ofaCount: v1.ofaCount,
            memorySizeMB: v1.memorySizeMB,
            name: [0; 96],
        };
        crate::fill_str(&mut out.name, &format!("MIG {name}"));
        // SAFETY: checked non-null; valid per the NVML contract.
        unsafe { put(info, out) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placements: *mut nvmlGpuInstancePlacement_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstancePossiblePlacements_v2");
    query_gpu(device, |t| {
        let list: Vec<nvmlGpuInstancePlacement_t> = t
            .gpu
            .possible_placements(profile_id)?
            .into_iter()
            .map(|(start, size)| nvmlGpuInstancePlacement_t { start, size })
            .collect();
        if count.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // A null array asks only for the count (nvml.h).
        if placements.is_null() {
            // SAFETY: `count` checked non-null.
            return unsafe { put(count, list.len() as c_uint) };
        }
        // SAFETY: `count` non-null; in: capacity of `placements`.
        let capacity = unsafe { count.read() } as usize;
        // SAFETY: `placements` valid for `capacity` entries per the contract.
        unsafe {
            put_slice(placements, capacity, &list)?;
            put(count, list.len() as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: nvmlDevice_t,
    profile_id: c_uint,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstanceRemainingCapacity");
    // SAFETY: NVML contract: `count` is null or a valid out-pointer.
    query_gpu(device, |t| unsafe {
        put(count, t.gpu.remaining_capacity(profile_id)?)
    })
}

unsafe fn create_gi(
    device: nvmlDevice_t,
    profile_id: c_uint,
    start: Option<u32>,
    out: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    ret((|| {
        let index = device_index(device)?;
        if out.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let gi = mutate(|s| gpu_mut(s, index)?.create_gi(profile_id, start))?;
        // SAFETY: checked non-null; valid per the NVML contract.
        unsafe { put(out, gi_ptr(index, gi)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceCreateGpuInstance");
    // SAFETY: forwarded with the same contract.
    unsafe { create_gi(device, profile_id, None, gi) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: nvmlDevice_t,
    profile_id: c_uint,
    placement: *const nvmlGpuInstancePlacement_t,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceCreateGpuInstanceWithPlacement");
    if placement.is_null() {
        return NvmlCode::InvalidArgument.code();
    }
    // SAFETY: non-null; the caller passes a valid placement struct.
    let p = unsafe { placement.read() };
    // SAFETY: forwarded with the same contract.
    unsafe { create_gi(device, profile_id, Some(p.start), gi) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: nvmlGpuInstance_t) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceDestroy");
    ret(gi_of(gi).and_then(|(gpu, id)| mutate(|s| gpu_mut(s, gpu)?.destroy_gi(id))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: nvmlDevice_t,
    profile_id: c_uint,
    gis: *mut nvmlGpuInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstances");
    query_gpu(device, |t| {
        t.gpu.gi_profile_by_id(profile_id)?;
        if count.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let list: Vec<nvmlGpuInstance_t> = t
            .gpu
            .gpu_instances
            .iter()
            .filter(|g| g.profile_id == profile_id)
            .map(|g| gi_ptr(t.gpu.index, g.id))
            .collect();
        // The caller sizes `gis` from the profile's instanceCount; nvml.h has no capacity argument.
        let capacity = t.gpu.gi_profile_by_id(profile_id)?.max_count as usize;
        // SAFETY: `gis` is valid for instanceCount entries per the contract; `count` non-null.
        unsafe {
            put_slice(gis, capacity, &list)?;
            put(count, list.len() as c_uint)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: nvmlDevice_t,
    id: c_uint,
    gi: *mut nvmlGpuInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstanceById");
    query_gpu(device, |t| {
        let found = t.gpu.gi(id).map_err(|_| NvmlCode::NotFound)?;
        // SAFETY: NVML contract: `gi` is null or a valid out-pointer.
        unsafe { put(gi, gi_ptr(t.gpu.index, found.id)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: nvmlGpuInstance_t,
    info: *mut nvmlGpuInstanceInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceGetInfo");
    ret((|| {
        let (gpu, id) = gi_of(gi)?;
        let s = current_state()?;
        let g = gpu_of(&s, gpu)?;
        let instance = g.gi(id)?;
        let out = nvmlGpuInstanceInfo_t {
            device: device_ptr(gpu),
            id: instance.id,
            profileId: instance.profile_id,
            placement: nvmlGpuInstancePlacement_t {
                start: instance.start,
                size: instance.size,
            },
        };
        // SAFETY: NVML contract: `info` is null or a valid out-pointer.
        unsafe { put(info, out) }
    })())
}

fn ci_profile_info(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
) -> Result<nvmlComputeInstanceProfileInfo_t, NvmlCode> {
    let (gpu, id) = gi_of(gi)?;
    let s = current_state()?;
    let p = gpu_of(&s, gpu)?.ci_profile_info(id, profile)?;
    Ok(nvmlComputeInstanceProfileInfo_t {
        id: p.id,
        sliceCount: p.slice_count,
        instanceCount: p.instance_count,
        multiprocessorCount: p.sm_count,
        sharedCopyEngineCount: p.shared.copy_engines,
        sharedDecoderCount: p.shared.decoders,
        sharedEncoderCount: p.shared.encoders,
        sharedJpegCount: p.shared.jpegs,
        sharedOfaCount: p.shared.ofas,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceGetComputeInstanceProfileInfo");
    // Only the shared engine profile exists (nvml.h).
    if eng_profile != 0 {
        return NvmlCode::NotSupported.code();
    }
    // SAFETY: NVML contract: `info` is null or a valid out-pointer.
    ret(ci_profile_info(gi, profile).and_then(|p| unsafe { put(info, p) }))
}

/// `NVML_STRUCT_VERSION(ComputeInstanceProfileInfo, n)` for the v2 and v3 structs.
fn ci_info_version(n: u32) -> u32 {
    let size = match n {
        2 => std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>(),
        _ => std::mem::size_of::<nvmlComputeInstanceProfileInfo_v3_t>(),
    };
    (size as u32) | (n << 24)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gi: nvmlGpuInstance_t,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceGetComputeInstanceProfileInfoV");
    if eng_profile != 0 {
        return NvmlCode::NotSupported.code();
    }
    ret((|| {
        if info.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller initialised `version`, the first field of v2 and v3.
        let version = unsafe { std::ptr::addr_of!((*info).version).read() };
        let v3 = if version == ci_info_version(2) {
            false
        } else if version == ci_info_version(3) {
            true
        } else {
            return Err(NvmlCode::ArgumentVersionMismatch);
        };
        let v1 = ci_profile_info(gi, profile)?;
        let (gpu, gi_id) = gi_of(gi)?;
        let s = current_state()?;
        let name = gpu_of(&s, gpu)?.ci_profile_name(gi_id, profile)?;
        let mut out = nvmlComputeInstanceProfileInfo_v3_t {
            version,
            id: v1.id,
            sliceCount: v1.sliceCount,
            instanceCount: v1.instanceCount,
            multiprocessorCount: v1.multiprocessorCount,
            sharedCopyEngineCount: v1.sharedCopyEngineCount,
            sharedDecoderCount: v1.sharedDecoderCount,
            sharedEncoderCount: v1.sharedEncoderCount,
            sharedJpegCount: v1.sharedJpegCount,
            sharedOfaCount: v1.sharedOfaCount,
            name: [0; 96],
            capabilities: 0,
        };
        crate::fill_str(&mut out.name, &format!("MIG {name}"));
        if v3 {
            // SAFETY: the caller's version says the struct is a v3.
            unsafe { put(info.cast::<nvmlComputeInstanceProfileInfo_v3_t>(), out) }
        } else {
            let v2 = nvmlComputeInstanceProfileInfo_v2_t {
                version,
                id: out.id,
                sliceCount: out.sliceCount,
                instanceCount: out.instanceCount,
                multiprocessorCount: out.multiprocessorCount,
                sharedCopyEngineCount: out.sharedCopyEngineCount,
                sharedDecoderCount: out.sharedDecoderCount,
                sharedEncoderCount: out.sharedEncoderCount,
                sharedJpegCount: out.sharedJpegCount,
                sharedOfaCount: out.sharedOfaCount,
                name: out.name,
            };
            // SAFETY: checked non-null; valid per the NVML contract.
            unsafe { put(info, v2) }
        }
    })())
}

/// `nvmlDeviceGetAttributes_v2`. nvml.h: "This API currently only supports MIG device handles",
/// so a whole GPU answers `NOT_SUPPORTED`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetAttributes_v2");
    query(device, |t| {
        let (gi, ci) = t.mig.ok_or(NvmlCode::NotSupported)?;
        let a = t.gpu.mig_attributes(gi, ci)?;
        let out = nvmlDeviceAttributes_t {
            multiprocessorCount: a.sm_count,
            sharedCopyEngineCount: a.shared.copy_engines,
            sharedDecoderCount: a.shared.decoders,
            sharedEncoderCount: a.shared.encoders,
            sharedJpegCount: a.shared.jpegs,
            sharedOfaCount: a.shared.ofas,
            gpuInstanceSliceCount: a.gi_slices,
            computeInstanceSliceCount: a.ci_slices,
            memorySizeMB: a.memory_mib,
        };
        // SAFETY: NVML contract: `attributes` is null or a valid out-pointer.
        unsafe { put(attributes, out) }
    })
}

/// The unversioned name, which go-nvml calls when the library lacks `_v2` (same struct).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes(
    device: nvmlDevice_t,
    attributes: *mut nvmlDeviceAttributes_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetAttributes");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlDeviceGetAttributes_v2(device, attributes) }
}

unsafe fn create_ci(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    start: Option<u32>,
    out: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    ret((|| {
        let (gpu, gi_id) = gi_of(gi)?;
        if out.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let ci = mutate(|s| {
            let serial = s.next_instance_serial;
            s.next_instance_serial += 1;
            let uuid = ids::uuid("MIG-", ids::seed_of(&s.hostname), &[u64::from(gpu), serial]);
            gpu_mut(s, gpu)?.create_ci(gi_id, profile_id, start, uuid)
        })?;
        // SAFETY: checked non-null; valid per the NVML contract.
        unsafe { put(out, ci_ptr(gpu, gi_id, ci)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceCreateComputeInstance");
    // SAFETY: forwarded with the same contract.
    unsafe { create_ci(gi, profile_id, None, ci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    placement: *const nvmlComputeInstancePlacement_t,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceCreateComputeInstanceWithPlacement");
    if placement.is_null() {
        return NvmlCode::InvalidArgument.code();
    }
    // SAFETY: non-null; the caller passes a valid placement struct.
    let p = unsafe { placement.read() };
    // SAFETY: forwarded with the same contract.
    unsafe { create_ci(gi, profile_id, Some(p.start), ci) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: nvmlComputeInstance_t) -> nvmlReturn_t {
    crate::trace("nvmlComputeInstanceDestroy");
    ret(ci_of(ci).and_then(|(gpu, gi, id)| mutate(|s| gpu_mut(s, gpu)?.destroy_ci(gi, id))))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: nvmlGpuInstance_t,
    profile_id: c_uint,
    cis: *mut nvmlComputeInstance_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceGetComputeInstances");
    ret((|| {
        let (gpu, gi_id) = gi_of(gi)?;
        let s = current_state()?;
        let g = gpu_of(&s, gpu)?;
        let info = g.ci_profile_info(gi_id, profile_id)?;
        if count.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let list: Vec<nvmlComputeInstance_t> = g
            .gi(gi_id)?
            .compute_instances
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .map(|c| ci_ptr(gpu, gi_id, c.id))
            .collect();
        // SAFETY: `cis` is valid for the profile's instanceCount entries; `count` non-null.
        unsafe {
            put_slice(cis, info.instance_count as usize, &list)?;
            put(count, list.len() as c_uint)
        }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gi: nvmlGpuInstance_t,
    id: c_uint,
    ci: *mut nvmlComputeInstance_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpuInstanceGetComputeInstanceById");
    ret((|| {
        let (gpu, gi_id) = gi_of(gi)?;
        let s = current_state()?;
        let found = gpu_of(&s, gpu)?
            .gi(gi_id)?
            .compute_instances
            .iter()
            .any(|c| c.id == id);
        if !found {
            return Err(NvmlCode::NotFound);
        }
        // SAFETY: NVML contract: `ci` is null or a valid out-pointer.
        unsafe { put(ci, ci_ptr(gpu, gi_id, id)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlComputeInstanceGetInfo_v2");
    ret((|| {
        let (gpu, gi_id, id) = ci_of(ci)?;
        let s = current_state()?;
        let c = gpu_of(&s, gpu)?
            .gi(gi_id)?
            .compute_instances
            .iter()
            .find(|c| c.id == id)
            .ok_or(NvmlCode::InvalidArgument)?;
        let out = nvmlComputeInstanceInfo_t {
            device: device_ptr(gpu),
            gpuInstance: gi_ptr(gpu, gi_id),
            id: c.id,
            profileId: c.profile_id,
            placement: nvmlComputeInstancePlacement_t {
                start: c.start,
                size: c.size,
            },
        };
        // SAFETY: NVML contract: `info` is null or a valid out-pointer.
        unsafe { put(info, out) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    ci: nvmlComputeInstance_t,
    info: *mut nvmlComputeInstanceInfo_t,
) -> nvmlReturn_t {
    crate::trace("nvmlComputeInstanceGetInfo");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlComputeInstanceGetInfo_v2(ci, info) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMaxMigDeviceCount");
    query_gpu(device, |t| {
        let max = t.gpu.mig_geometry().map_or(0, |g| g.compute_slices);
        // SAFETY: NVML contract: `count` is null or a valid out-pointer.
        unsafe { put(count, max) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetMigDeviceHandleByIndex");
    query_gpu(device, |t| {
        let devices = t.gpu.mig_devices();
        let (gi, ci) = devices.get(index as usize).ok_or(NvmlCode::NotFound)?;
        // SAFETY: NVML contract: `mig` is null or a valid out-pointer.
        unsafe { put(mig, mig_ptr(t.gpu.index, gi.id, ci.id)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceIsMigDeviceHandle");
    // SAFETY: NVML contract: `is_mig` is null or a valid out-pointer.
    query(device, |t| unsafe {
        put(is_mig, c_uint::from(t.mig.is_some()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: nvmlDevice_t,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    query(mig, |t| {
        if t.mig.is_none() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: NVML contract: `device` is null or a valid out-pointer.
        unsafe { put(device, device_ptr(t.gpu.index)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetGpuInstanceId");
    query(device, |t| {
        let (gi, _) = t.mig.ok_or(NvmlCode::NotSupported)?;
        // SAFETY: NVML contract: `id` is null or a valid out-pointer.
        unsafe { put(id, gi.id) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetComputeInstanceId");
    query(device, |t| {
        let (_, ci) = t.mig.ok_or(NvmlCode::NotSupported)?;
        // SAFETY: NVML contract: `id` is null or a valid out-pointer.
        unsafe { put(id, ci.id) }
    })
}
