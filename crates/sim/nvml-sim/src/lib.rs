//! A simulated NVIDIA driver: a cdylib exporting the NVML C functions gpuops uses, backed by
//! `gpuops-sim`.
//!
//! Load it in place of `libnvidia-ml.so.1` (nvml-wrapper's `lib_path`) with `GPUOPS_NVML_SIM_STATE`
//! naming a state directory made by `gpuops sim init`. Signatures and struct layouts come from
//! nvml-wrapper-sys (generated from `nvml.h`), so they match the real library by construction.
//! All `unsafe` of the simulator lives in this crate: raw out-pointers from C callers.
#![allow(non_snake_case, non_upper_case_globals, clippy::missing_safety_doc)]

mod device;
mod events;
mod gpm;
mod handles;
mod mig;
mod system;

use gpuops_sim::store::StateCache;
use gpuops_sim::{NvmlCode, SimCi, SimError, SimGi, SimGpu, SimState, Store};
use handles::Handle;
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlReturn_t};
use std::collections::HashMap;
use std::os::raw::{c_char, c_uint};
use std::sync::{Arc, Mutex, MutexGuard};

/// The loaded driver: where its state lives and what this process has cached or opened.
struct Driver {
    store: Store,
    refs: u32,
    cache: StateCache,
    event_sets: HashMap<u64, events::EventSet>,
    next_event_set: u64,
    /// Allocated GPM samples (`None` until `nvmlGpmSampleGet` fills one).
    gpm_samples: HashMap<u64, Option<gpm::Sample>>,
    next_gpm_sample: u64,
}

static DRIVER: Mutex<Option<Driver>> = Mutex::new(None);

fn driver() -> MutexGuard<'static, Option<Driver>> {
    // A panic elsewhere cannot leave the map half-updated in a way that matters: keep serving.
    DRIVER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Explains a failure on stderr: NVML has only return codes, and a user needs the path and reason.
fn report(context: &str, err: &SimError) {
    eprintln!("nvml-sim: {context}: {err}");
}

fn code_for(err: &SimError) -> NvmlCode {
    match err {
        SimError::StateMissing { .. } => NvmlCode::DriverNotLoaded,
        SimError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            NvmlCode::NoPermission
        }
        SimError::Io { .. } => NvmlCode::NoPermission,
        _ => NvmlCode::Unknown,
    }
}

/// How often a call blocked by `gpuops sim hang-driver` looks whether the hang was cleared.
const HUNG_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// The current state. While the driver is hung (`gpuops sim hang-driver`) this does not return,
/// as a call into a wedged driver does not: every NVML call goes through here. The driver lock is
/// not held while waiting, so calls on other threads hang in the driver too, not on our mutex.
fn current_state() -> Result<Arc<SimState>, NvmlCode> {
    loop {
        let state = read_state()?;
        if !state.driver_hung {
            return Ok(state);
        }
        std::thread::sleep(HUNG_POLL);
    }
}

/// The state file, re-parsed only when a writer saved it since (see `Store::load_cached`): every
/// NVML call comes through here, and the state can be rewritten many times a second (an XID storm).
fn read_state() -> Result<Arc<SimState>, NvmlCode> {
    let mut guard = driver();
    let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
    d.store.load_cached(&mut d.cache).map_err(|e| {
        report("reading state", &e);
        code_for(&e)
    })
}

/// Applies a change to the persistent state under the writer lock.
fn mutate<T>(change: impl FnOnce(&mut SimState) -> Result<T, NvmlCode>) -> Result<T, NvmlCode> {
    // A hung driver changes nothing either.
    current_state()?;
    let store = driver()
        .as_ref()
        .ok_or(NvmlCode::Uninitialized)?
        .store
        .clone();
    store.update(change).unwrap_or_else(|e| {
        report("writing state", &e);
        Err(code_for(&e))
    })
}

/// What a device handle points at: a whole GPU, or one MIG device of it.
struct Target<'a> {
    state: &'a SimState,
    gpu: &'a SimGpu,
    mig: Option<(&'a SimGi, &'a SimCi)>,
}

fn resolve<'a>(state: &'a SimState, handle: Handle) -> Result<Target<'a>, NvmlCode> {
    let (gpu_index, mig) = match handle {
        Handle::Device { gpu } => (gpu, None),
        Handle::MigDevice { gpu, gi, ci } => (gpu, Some((gi, ci))),
        _ => return Err(NvmlCode::InvalidArgument),
    };
    let gpu = state
        .gpus
        .get(gpu_index as usize)
        .ok_or(NvmlCode::InvalidArgument)?;
    gpu.live()?;
    let mig = match mig {
        None => None,
        Some((gi_id, ci_id)) => {
            let gi = gpu
                .gpu_instances
                .iter()
                .find(|g| g.id == gi_id)
                .ok_or(NvmlCode::InvalidArgument)?;
            let ci = gi
                .compute_instances
                .iter()
                .find(|c| c.id == ci_id)
                .ok_or(NvmlCode::InvalidArgument)?;
            Some((gi, ci))
        }
    };
    Ok(Target { state, gpu, mig })
}

/// Runs a read-only query against the device a handle names.
fn query(
    device: nvmlDevice_t,
    f: impl FnOnce(&Target<'_>) -> Result<(), NvmlCode>,
) -> nvmlReturn_t {
    ret((|| {
        let state = current_state()?;
        let target = resolve(&state, handles::decode(device as usize))?;
        f(&target)
    })())
}

/// Like [`query`], for calls that are meaningless on a MIG device handle.
fn query_gpu(
    device: nvmlDevice_t,
    f: impl FnOnce(&Target<'_>) -> Result<(), NvmlCode>,
) -> nvmlReturn_t {
    query(device, |t| {
        if t.mig.is_some() {
            Err(NvmlCode::NotSupported)
        } else {
            f(t)
        }
    })
}

fn ret(result: Result<(), NvmlCode>) -> nvmlReturn_t {
    match result {
        Ok(()) => 0,
        Err(code) => code.code(),
    }
}

/// Writes `value` through an out-pointer from the C caller.
///
/// # Safety
/// `ptr` must be null or valid for a write of `T` (the NVML calling contract).
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), NvmlCode> {
    if ptr.is_null() {
        return Err(NvmlCode::InvalidArgument);
    }
    // SAFETY: non-null, and the caller guarantees it is valid and aligned for a write of T.
    unsafe { ptr.write(value) };
    Ok(())
}

/// Copies `items` into a caller array of `capacity` elements.
///
/// # Safety
/// `ptr` must be null or valid for `capacity` writes of `T`.
unsafe fn put_slice<T: Copy>(ptr: *mut T, capacity: usize, items: &[T]) -> Result<(), NvmlCode> {
    if items.len() > capacity {
        return Err(NvmlCode::InsufficientSize);
    }
    if items.is_empty() {
        return Ok(());
    }
    if ptr.is_null() {
        return Err(NvmlCode::InvalidArgument);
    }
    // SAFETY: non-null, the caller guarantees room for `capacity` >= items.len() elements, and the
    // source is a distinct Rust slice, so the ranges cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), ptr, items.len()) };
    Ok(())
}

/// Writes a NUL-terminated string into a caller buffer of `length` bytes.
///
/// # Safety
/// `buf` must be null or valid for `length` bytes of writes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, text: &str) -> Result<(), NvmlCode> {
    let bytes = text.as_bytes();
    if bytes.len() + 1 > length as usize {
        return Err(NvmlCode::InsufficientSize);
    }
    if buf.is_null() {
        return Err(NvmlCode::InvalidArgument);
    }
    // SAFETY: non-null and the caller guarantees `length` > bytes.len() writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Fills a fixed-size C string field of an NVML struct.
fn fill_str<const N: usize>(field: &mut [c_char; N], text: &str) {
    let n = text.len().min(N - 1);
    for (dst, src) in field.iter_mut().zip(text.as_bytes()[..n].iter()) {
        *dst = *src as c_char;
    }
    field[n] = 0;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Call tracing for benchmarks: with `GPUOPS_NVML_SIM_TRACE=FILE`, every NVML call appends its
/// name to FILE, so a run's driver calls can be counted (real NVML has no such counter).
fn trace(call: &str) {
    static TRACE: std::sync::OnceLock<Option<Mutex<std::fs::File>>> = std::sync::OnceLock::new();
    let sink = TRACE.get_or_init(|| {
        let path = std::env::var_os("GPUOPS_NVML_SIM_TRACE")?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .ok()
            .map(Mutex::new)
    });
    if let Some(file) = sink {
        use std::io::Write;
        let mut f = file.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = writeln!(f, "{call}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_sim::Fleet;

    /// The only test here that loads the driver (it is one per process) or sets its variable.
    #[test]
    fn every_call_sees_the_last_save_and_the_state_is_parsed_only_after_saves() {
        let dir = tempfile::tempdir().unwrap();
        let state = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        let store = Store::create(dir.path(), &state).unwrap();
        // SAFETY: no other test in this crate reads or writes the environment.
        unsafe { std::env::set_var(gpuops_sim::STATE_DIR_ENV, dir.path()) };
        assert_eq!(system::nvmlInit_v2(), 0);
        let parses = || driver().as_ref().map(|d| d.cache.parses());
        let first = read_state().unwrap();
        assert!(Arc::ptr_eq(&first, &read_state().unwrap()));
        assert_eq!(parses(), Some(1), "init's parse serves the calls after it");
        for round in 1..=3u64 {
            store
                .update(|s| s.inject_xid(1, 48, None, None))
                .unwrap()
                .unwrap();
            let now = read_state().unwrap();
            assert_eq!(
                now.events.len() as u64,
                round,
                "the save is seen by the next call"
            );
            read_state().unwrap();
            assert_eq!(parses(), Some(1 + round));
        }
        assert_eq!(system::nvmlShutdown(), 0);
    }
}
