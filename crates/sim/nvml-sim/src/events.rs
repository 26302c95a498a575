//! Event sets: XID (and other) events delivered to `nvmlEventSetWait_v2` in every process that waits.
//!
//! Events live in the shared state with sequence numbers; each event set remembers the last one it
//! delivered, so a set sees only events raised after it was created, each once.

use crate::handles::{Handle, decode, device_ptr, encode};
use crate::{current_state, driver, put, query_gpu, ret};
use gpuops_sim::NvmlCode;
use nvml_wrapper_sys::bindings::*;
use std::time::{Duration, Instant};

/// Event types the simulated GPUs can raise: single/double-bit ECC and critical XIDs.
const SUPPORTED_EVENTS: u64 = 0x1 | 0x2 | 0x8;
const POLL: Duration = Duration::from_millis(20);

/// One process-local event set.
#[derive(Debug, Default)]
pub struct EventSet {
    /// (GPU index, event mask) registrations.
    registrations: Vec<(u32, u64)>,
    last_seq: u64,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    crate::trace("nvmlEventSetCreate");
    ret((|| {
        let state = current_state()?;
        let mut guard = driver();
        let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
        let id = d.next_event_set;
        d.next_event_set += 1;
        d.event_sets.insert(
            id,
            EventSet {
                registrations: Vec::new(),
                last_seq: state.next_event_seq.saturating_sub(1),
            },
        );
        // SAFETY: NVML contract: `set` is null or a valid out-pointer.
        unsafe { put(set, encode(Handle::EventSet { id }) as nvmlEventSet_t) }
    })())
}

fn set_id(set: nvmlEventSet_t) -> Result<u64, NvmlCode> {
    match decode(set as usize) {
        Handle::EventSet { id } => Ok(id),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    crate::trace("nvmlEventSetFree");
    ret((|| {
        let id = set_id(set)?;
        let mut guard = driver();
        let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
        d.event_sets
            .remove(&id)
            .map(|_| ())
            .ok_or(NvmlCode::InvalidArgument)
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut u64,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceGetSupportedEventTypes");
    // SAFETY: NVML contract: `types` is null or a valid out-pointer.
    query_gpu(device, |_| unsafe { put(types, SUPPORTED_EVENTS) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: u64,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    crate::trace("nvmlDeviceRegisterEvents");
    query_gpu(device, |t| {
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NvmlCode::NotSupported);
        }
        let id = set_id(set)?;
        let mut guard = driver();
        let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
        let s = d.event_sets.get_mut(&id).ok_or(NvmlCode::InvalidArgument)?;
        s.registrations.retain(|(g, _)| *g != t.gpu.index);
        s.registrations.push((t.gpu.index, types));
        Ok(())
    })
}

/// One non-blocking look for the next event of a set; `Ok(None)` when there is none yet.
fn poll(id: u64) -> Result<Option<nvmlEventData_t>, NvmlCode> {
    let state = current_state()?;
    let mut guard = driver();
    let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
    let set = d.event_sets.get_mut(&id).ok_or(NvmlCode::InvalidArgument)?;
    // The queue is in sequence order: skip what this set has seen without looking at it, since a
    // reader draining a storm comes here once per event.
    let unseen = state.events.partition_point(|e| e.seq <= set.last_seq);
    let next = state.events[unseen..].iter().find(|e| {
        set.registrations
            .iter()
            .any(|(g, mask)| *g == e.gpu_index && mask & e.event_type != 0)
    });
    // Events already queued are delivered first; then a registered GPU that fell off the bus is
    // reported as such on every wait, as the real driver does.
    let lost = set
        .registrations
        .iter()
        .any(|(g, _)| state.gpus.get(*g as usize).is_some_and(|gpu| gpu.lost));
    match next {
        None if lost => Err(NvmlCode::GpuIsLost),
        None => {
            set.last_seq = set.last_seq.max(state.next_event_seq.saturating_sub(1));
            Ok(None)
        }
        Some(e) => {
            set.last_seq = e.seq;
            Ok(Some(nvmlEventData_t {
                device: device_ptr(e.gpu_index),
                eventType: e.event_type,
                eventData: e.data,
                gpuInstanceId: e.gi_id,
                computeInstanceId: e.ci_id,
            }))
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: u32,
) -> nvmlReturn_t {
    crate::trace("nvmlEventSetWait_v2");
    ret((|| {
        let id = set_id(set)?;
        if data.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            if let Some(event) = poll(id)? {
                // SAFETY: checked non-null; valid per the NVML contract.
                return unsafe { put(data, event) };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NvmlCode::Timeout);
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    })())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: u32,
) -> nvmlReturn_t {
    crate::trace("nvmlEventSetWait");
    // SAFETY: forwarded with the same contract.
    unsafe { nvmlEventSetWait_v2(set, data, timeout_ms) }
}
