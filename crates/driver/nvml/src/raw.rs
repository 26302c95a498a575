//! Calls nvml-wrapper does not wrap, made through nvml-wrapper-sys's function pointers.
//!
//! Each function takes the loaded library and handles obtained from it, and returns owned values:
//! raw pointers never leave this module except as opaque handles passed back to NVML. A symbol the
//! library lacks is `NotSupported`, never a panic (the -sys convenience methods would panic).

use crate::NvmlError;
use crate::error::{check, raw_codes};
use nvml_wrapper_sys::bindings::*;
use std::os::raw::c_uint;

macro_rules! sym {
    ($lib:expr, $name:ident, $gpu:expr) => {
        $lib.$name.as_ref().map_err(|_| NvmlError::NotSupported {
            call: stringify!($name),
            gpu: $gpu,
        })?
    };
}

/// The -sys device handle of a wrapped device.
pub fn handle(device: &nvml_wrapper::Device<'_>) -> nvmlDevice_t {
    // SAFETY: the handle is only passed back to the same NVML library while `device` (and so the
    // library) is alive; callers never dereference it.
    unsafe { device.handle() }
}

pub fn gpu_instance_by_id(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    id: u32,
    gpu: Option<u32>,
) -> Result<nvmlGpuInstance_t, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetGpuInstanceById, gpu);
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: `dev` came from this library; `gi` is a valid out-pointer on our stack.
    check("nvmlDeviceGetGpuInstanceById", gpu, unsafe {
        f(dev, id, &mut gi)
    })?;
    Ok(gi)
}

pub fn gpu_instance_info(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    gpu: Option<u32>,
) -> Result<nvmlGpuInstanceInfo_t, NvmlError> {
    let f = sym!(lib, nvmlGpuInstanceGetInfo, gpu);
    // SAFETY: an all-zero bit pattern is valid for this plain C struct (integers and pointers).
    let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` came from this library; `info` is a valid out-pointer.
    check("nvmlGpuInstanceGetInfo", gpu, unsafe { f(gi, &mut info) })?;
    Ok(info)
}

pub fn compute_instance_by_id(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    id: u32,
    gpu: Option<u32>,
) -> Result<nvmlComputeInstance_t, NvmlError> {
    let f = sym!(lib, nvmlGpuInstanceGetComputeInstanceById, gpu);
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: `gi` came from this library; `ci` is a valid out-pointer.
    check("nvmlGpuInstanceGetComputeInstanceById", gpu, unsafe {
        f(gi, id, &mut ci)
    })?;
    Ok(ci)
}

pub fn compute_instance_info(
    lib: &NvmlLib,
    ci: nvmlComputeInstance_t,
    gpu: Option<u32>,
) -> Result<nvmlComputeInstanceInfo_t, NvmlError> {
    let f = sym!(lib, nvmlComputeInstanceGetInfo_v2, gpu);
    // SAFETY: all-zero is a valid value for this plain C struct.
    let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `ci` came from this library; `info` is a valid out-pointer.
    check("nvmlComputeInstanceGetInfo", gpu, unsafe {
        f(ci, &mut info)
    })?;
    Ok(info)
}

pub fn compute_instance_profile_info(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile: u32,
    gpu: Option<u32>,
) -> Result<nvmlComputeInstanceProfileInfo_t, NvmlError> {
    let f = sym!(lib, nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu);
    // SAFETY: all-zero is a valid value for this plain C struct.
    let mut info: nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` came from this library; engine profile 0 is the only (shared) one; valid out-pointer.
    check(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        gpu,
        unsafe { f(gi, profile, 0, &mut info) },
    )?;
    Ok(info)
}

pub fn create_gpu_instance(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    profile_id: u32,
    start: Option<u32>,
    size: u32,
    gpu: Option<u32>,
) -> Result<nvmlGpuInstance_t, NvmlError> {
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    let code = match start {
        None => {
            let f = sym!(lib, nvmlDeviceCreateGpuInstance, gpu);
            // SAFETY: `dev` came from this library; `gi` is a valid out-pointer.
            unsafe { f(dev, profile_id, &mut gi) }
        }
        Some(start) => {
            let f = sym!(lib, nvmlDeviceCreateGpuInstanceWithPlacement, gpu);
            let placement = nvmlGpuInstancePlacement_t { start, size };
            // SAFETY: as above; `placement` lives across the call.
            unsafe { f(dev, profile_id, &placement, &mut gi) }
        }
    };
    check("nvmlDeviceCreateGpuInstance", gpu, code)?;
    Ok(gi)
}

pub fn destroy_gpu_instance(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    gpu: Option<u32>,
) -> Result<(), NvmlError> {
    let f = sym!(lib, nvmlGpuInstanceDestroy, gpu);
    // SAFETY: `gi` came from this library.
    check("nvmlGpuInstanceDestroy", gpu, unsafe { f(gi) })
}

pub fn create_compute_instance(
    lib: &NvmlLib,
    gi: nvmlGpuInstance_t,
    profile_id: u32,
    start: Option<u32>,
    size: u32,
    gpu: Option<u32>,
) -> Result<nvmlComputeInstance_t, NvmlError> {
    let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
    let code = match start {
        None => {
            let f = sym!(lib, nvmlGpuInstanceCreateComputeInstance, gpu);
            // SAFETY: `gi` came from this library; `ci` is a valid out-pointer.
            unsafe { f(gi, profile_id, &mut ci) }
        }
        Some(start) => {
            let f = sym!(lib, nvmlGpuInstanceCreateComputeInstanceWithPlacement, gpu);
            let placement = nvmlComputeInstancePlacement_t { start, size };
            // SAFETY: as above; `placement` lives across the call.
            unsafe { f(gi, profile_id, &placement, &mut ci) }
        }
    };
    check("nvmlGpuInstanceCreateComputeInstance", gpu, code)?;
    Ok(ci)
}

pub fn destroy_compute_instance(
    lib: &NvmlLib,
    ci: nvmlComputeInstance_t,
    gpu: Option<u32>,
) -> Result<(), NvmlError> {
    let f = sym!(lib, nvmlComputeInstanceDestroy, gpu);
    // SAFETY: `ci` came from this library.
    check("nvmlComputeInstanceDestroy", gpu, unsafe { f(ci) })
}

pub fn gpu_instances(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    profile_id: u32,
    capacity: u32,
    gpu: Option<u32>,
) -> Result<Vec<nvmlGpuInstance_t>, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetGpuInstances, gpu);
    let mut list: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); capacity.max(1) as usize];
    let mut count: c_uint = 0;
    // SAFETY: `list` has room for the profile's instanceCount handles, as nvml.h requires.
    check("nvmlDeviceGetGpuInstances", gpu, unsafe {
        f(dev, profile_id, list.as_mut_ptr(), &mut count)
    })?;
    list.truncate(count as usize);
    Ok(list)
}

pub fn possible_placements(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    profile_id: u32,
    gpu: Option<u32>,
) -> Result<Vec<(u32, u32)>, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetGpuInstancePossiblePlacements_v2, gpu);
    let mut count: c_uint = 0;
    // SAFETY: a null array asks for the count only (nvml.h); `count` is a valid out-pointer.
    check("nvmlDeviceGetGpuInstancePossiblePlacements", gpu, unsafe {
        f(dev, profile_id, std::ptr::null_mut(), &mut count)
    })?;
    let mut list = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    if count > 0 {
        // SAFETY: `list` holds `count` entries; `count` tells NVML the capacity.
        check("nvmlDeviceGetGpuInstancePossiblePlacements", gpu, unsafe {
            f(dev, profile_id, list.as_mut_ptr(), &mut count)
        })?;
        list.truncate(count as usize);
    }
    Ok(list.into_iter().map(|p| (p.start, p.size)).collect())
}

pub fn remaining_capacity(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    profile_id: u32,
    gpu: Option<u32>,
) -> Result<u32, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetGpuInstanceRemainingCapacity, gpu);
    let mut count: c_uint = 0;
    // SAFETY: `dev` came from this library; `count` is a valid out-pointer.
    check("nvmlDeviceGetGpuInstanceRemainingCapacity", gpu, unsafe {
        f(dev, profile_id, &mut count)
    })?;
    Ok(count)
}

/// (GPU instance id, compute instance id) of a MIG device handle.
pub fn mig_ids(
    lib: &NvmlLib,
    mig: nvmlDevice_t,
    gpu: Option<u32>,
) -> Result<(u32, u32), NvmlError> {
    let gi_f = sym!(lib, nvmlDeviceGetGpuInstanceId, gpu);
    let ci_f = sym!(lib, nvmlDeviceGetComputeInstanceId, gpu);
    let (mut gi, mut ci): (c_uint, c_uint) = (0, 0);
    // SAFETY: `mig` came from this library; both out-pointers are valid.
    check("nvmlDeviceGetGpuInstanceId", gpu, unsafe {
        gi_f(mig, &mut gi)
    })?;
    // SAFETY: as above.
    check("nvmlDeviceGetComputeInstanceId", gpu, unsafe {
        ci_f(mig, &mut ci)
    })?;
    Ok((gi, ci))
}

/// Whether the far end of an NVLink is an NVSwitch.
pub fn nvlink_remote_is_switch(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    link: u32,
    gpu: Option<u32>,
) -> Result<bool, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetNvLinkRemoteDeviceType, gpu);
    let mut kind: nvmlIntNvLinkDeviceType_t = 0;
    // SAFETY: `dev` came from this library; `kind` is a valid out-pointer.
    check("nvmlDeviceGetNvLinkRemoteDeviceType", gpu, unsafe {
        f(dev, link, &mut kind)
    })?;
    Ok(kind == nvmlIntNvLinkDeviceType_enum_NVML_NVLINK_DEVICE_TYPE_SWITCH)
}

pub fn event_set_create(lib: &NvmlLib) -> Result<nvmlEventSet_t, NvmlError> {
    let f = sym!(lib, nvmlEventSetCreate, None);
    let mut set: nvmlEventSet_t = std::ptr::null_mut();
    // SAFETY: `set` is a valid out-pointer.
    check("nvmlEventSetCreate", None, unsafe { f(&mut set) })?;
    Ok(set)
}

pub fn event_set_free(lib: &NvmlLib, set: nvmlEventSet_t) {
    if let Ok(f) = lib.nvmlEventSetFree.as_ref() {
        // SAFETY: `set` came from nvmlEventSetCreate of this library and is freed once (Drop).
        let _ = unsafe { f(set) };
    }
}

pub fn supported_events(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    gpu: Option<u32>,
) -> Result<u64, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetSupportedEventTypes, gpu);
    let mut types: u64 = 0;
    // SAFETY: `dev` came from this library; `types` is a valid out-pointer.
    check("nvmlDeviceGetSupportedEventTypes", gpu, unsafe {
        f(dev, &mut types)
    })?;
    Ok(types)
}

pub fn register_events(
    lib: &NvmlLib,
    dev: nvmlDevice_t,
    types: u64,
    set: nvmlEventSet_t,
    gpu: Option<u32>,
) -> Result<(), NvmlError> {
    let f = sym!(lib, nvmlDeviceRegisterEvents, gpu);
    // SAFETY: `dev` and `set` came from this library.
    check("nvmlDeviceRegisterEvents", gpu, unsafe {
        f(dev, types, set)
    })
}

/// Waits for one event; `Ok(None)` on timeout.
pub fn event_wait(
    lib: &NvmlLib,
    set: nvmlEventSet_t,
    timeout_ms: u32,
) -> Result<Option<nvmlEventData_t>, NvmlError> {
    let f = sym!(lib, nvmlEventSetWait_v2, None);
    // SAFETY: all-zero is a valid value for this plain C struct (a null device pointer included).
    let mut data: nvmlEventData_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` came from this library; `data` is a valid out-pointer.
    let code = unsafe { f(set, &mut data, timeout_ms) };
    if code == raw_codes::TIMEOUT {
        return Ok(None);
    }
    check("nvmlEventSetWait", None, code)?;
    Ok(Some(data))
}

/// The PCI class code (`baseClass << 16 | subClass << 8`) from `nvmlDeviceGetPciInfoExt` (R535+).
pub fn pci_class(lib: &NvmlLib, dev: nvmlDevice_t, gpu: Option<u32>) -> Result<u32, NvmlError> {
    let f = sym!(lib, nvmlDeviceGetPciInfoExt, gpu);
    // SAFETY: all-zero is a valid value for this plain C struct (integers and a char array).
    let mut info: nvmlPciInfoExt_t = unsafe { std::mem::zeroed() };
    // NVML_STRUCT_VERSION(PciInfoExt, 1): the driver checks it against the layout it knows.
    info.version = (std::mem::size_of::<nvmlPciInfoExt_v1_t>() as u32) | (1 << 24);
    // SAFETY: `dev` came from this library; `info` is a valid out-pointer with `version` set.
    check("nvmlDeviceGetPciInfoExt", gpu, unsafe { f(dev, &mut info) })?;
    Ok(((info.baseClass & 0xFF) << 16) | ((info.subClass & 0xFF) << 8))
}
