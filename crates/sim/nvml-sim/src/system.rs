//! Library lifetime and system-wide queries: init/shutdown, versions, device enumeration.

use crate::handles::{device_ptr, mig_ptr};
use crate::{Driver, current_state, driver, put, put_str, report, ret};
use gpuops_sim::{NvmlCode, STATE_DIR_ENV, Store};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_uint};

/// `NVML_INIT_FLAG_NO_GPUS`: succeed even when no GPU is present.
const INIT_FLAG_NO_GPUS: c_uint = 1;

fn init(flags: c_uint) -> Result<(), NvmlCode> {
    let mut guard = driver();
    if let Some(d) = guard.as_mut() {
        d.refs += 1;
        return Ok(());
    }
    let Some(dir) = std::env::var_os(STATE_DIR_ENV) else {
        eprintln!(
            "nvml-sim: {STATE_DIR_ENV} is not set; point it at a directory made by `gpuops sim init`"
        );
        return Err(NvmlCode::DriverNotLoaded);
    };
    let store = Store::new(dir);
    let mut cache = gpuops_sim::store::StateCache::default();
    let state = store.load_cached(&mut cache).map_err(|e| {
        report("loading the driver", &e);
        crate::code_for(&e)
    })?;
    // Presumed: like a driver with no GPUs, init fails unless the caller said that is fine.
    if state.gpus.is_empty() && flags & INIT_FLAG_NO_GPUS == 0 {
        return Err(NvmlCode::NotFound);
    }
    *guard = Some(Driver {
        store,
        refs: 1,
        cache,
        event_sets: Default::default(),
        next_event_set: 1,
        gpm_samples: Default::default(),
        next_gpm_sample: 1,
    });
    Ok(())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    crate::trace("nvmlInit_v2");
    ret(init(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit() -> nvmlReturn_t {
    crate::trace("nvmlInit");
    ret(init(0))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    crate::trace("nvmlInitWithFlags");
    ret(init(flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    crate::trace("nvmlShutdown");
    let mut guard = driver();
    match guard.as_mut() {
        None => NvmlCode::Uninitialized.code(),
        Some(d) if d.refs > 1 => {
            d.refs -= 1;
            0
        }
        Some(_) => {
            *guard = None;
            0
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    crate::trace("nvmlErrorString");
    let text: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        15 => c"GPU is lost",
        19 => c"In use by another client",
        23 => c"Insufficient resources",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlSystemGetDriverVersion");
    ret(current_state().and_then(|s| {
        // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
        unsafe { put_str(version, length, &s.driver_version) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    crate::trace("nvmlSystemGetNVMLVersion");
    ret(current_state().and_then(|s| {
        let text = format!("{}.{}", s.cuda_driver_version / 1000, s.driver_version);
        // SAFETY: NVML contract: `version` is null or valid for `length` bytes.
        unsafe { put_str(version, length, &text) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> nvmlReturn_t {
    crate::trace("nvmlSystemGetCudaDriverVersion");
    // SAFETY: NVML contract: `version` is null or a valid out-pointer.
    ret(current_state().and_then(|s| unsafe { put(version, s.cuda_driver_version) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> nvmlReturn_t {
    crate::trace("nvmlSystemGetCudaDriverVersion_v2");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlSystemGetCudaDriverVersion(version) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetCount_v2");
    // SAFETY: NVML contract: `count` is null or a valid out-pointer.
    ret(current_state().and_then(|s| unsafe { put(count, s.gpus.len() as c_uint) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetCount");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlDeviceGetCount_v2(count) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetHandleByIndex_v2");
    ret(current_state().and_then(|s| {
        if index as usize >= s.gpus.len() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: NVML contract: `device` is null or a valid out-pointer.
        unsafe { put(device, device_ptr(index)) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetHandleByIndex");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlDeviceGetHandleByIndex_v2(index, device) }
}

/// Reads a C string argument.
///
/// # Safety
/// `text` must be null or a NUL-terminated string.
unsafe fn arg_str(text: *const c_char) -> Result<String, NvmlCode> {
    if text.is_null() {
        return Err(NvmlCode::InvalidArgument);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let c = unsafe { CStr::from_ptr(text) };
    c.to_str()
        .map(str::to_string)
        .map_err(|_| NvmlCode::InvalidArgument)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetHandleByUUID");
    ret((|| {
        // SAFETY: NVML contract: `uuid` is a NUL-terminated string.
        let wanted = unsafe { arg_str(uuid) }?;
        let s = current_state()?;
        for g in &s.gpus {
            if g.uuid.eq_ignore_ascii_case(&wanted) {
                g.live()?;
                // SAFETY: NVML contract: `device` is null or a valid out-pointer.
                return unsafe { put(device, device_ptr(g.index)) };
            }
            for (gi, ci) in g.mig_devices() {
                if ci.uuid.eq_ignore_ascii_case(&wanted) {
                    g.live()?;
                    // SAFETY: as above.
                    return unsafe { put(device, mig_ptr(g.index, gi.id, ci.id)) };
                }
            }
        }
        Err(NvmlCode::NotFound)
    })())
}

/// Parses `domain:bus:device.function` in either NVML format (8- or 4-digit domain).
fn parse_bus_id(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split(':');
    let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !rest.contains('.') {
        return None;
    }
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
    ))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetHandleByPciBusId_v2");
    ret((|| {
        // SAFETY: NVML contract: `bus_id` is a NUL-terminated string.
        let text = unsafe { arg_str(bus_id) }?;
        let (domain, bus) = parse_bus_id(&text).ok_or(NvmlCode::InvalidArgument)?;
        let s = current_state()?;
        let g = s
            .gpus
            .iter()
            .find(|g| g.pci_domain == domain && g.pci_bus == bus)
            .ok_or(NvmlCode::NotFound)?;
        g.live()?;
        // SAFETY: NVML contract: `device` is null or a valid out-pointer.
        unsafe { put(device, device_ptr(g.index)) }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetHandleByPciBusId");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlDeviceGetHandleByPciBusId_v2(bus_id, device) }
}

#[cfg(test)]
mod tests {
    use super::parse_bus_id;

    #[test]
    fn bus_ids_in_both_formats() {
        assert_eq!(parse_bus_id("00000000:18:00.0"), Some((0, 0x18)));
        assert_eq!(parse_bus_id("0000:DB:00.0"), Some((0, 0xdb)));
        assert_eq!(parse_bus_id("db:00.0"), None);
        assert_eq!(parse_bus_id("zz:18:00.0"), None);
    }
}
