//! What `nvmlEventSetWait_v2` answers once a watched GPU fell off the bus.
//!
//! The real driver: the XID 79 raised as the GPU falls is delivered first, then every wait returns
//! `NVML_ERROR_GPU_IS_LOST` at once, without waiting out its timeout, until the GPU is reset.
//! Evidence: nvml.h lists GPU_IS_LOST among the wait's results with no blocking caveat; NVIDIA's
//! own mock driver (NVIDIA/k8s-test-infra#746, "mocknvml: return ERROR_GPU_IS_LOST from
//! nvmlEventSetWait for lost devices") does exactly this "the same as a real driver after Xid 79";
//! and the device plugin's health loop (`continue` after a non-timeout error) is reported spinning
//! on real nodes for the same reason (Project-HAMi/HAMi#2321, on NVIDIA's health.go). So NVIDIA's
//! device plugin spinning on the simulator after `gpuops sim lost` is faithful, not a simulator
//! bug; gpuops' own watcher stops waiting on a lost GPU instead (docs/compatibility.md).
//!
//! One test per file: the loaded driver and its state directory are process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use gpuops_sim::{Fleet, SimState, Store};
use nvml_wrapper_sys::bindings::*;
use std::os::raw::c_uint;
use std::time::{Duration, Instant};

const SUCCESS: u32 = 0;
const TIMEOUT: u32 = 10;
const GPU_IS_LOST: u32 = 15;
const XID_CRITICAL: u64 = 0x8;

type GetHandle = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type SetCreate = unsafe extern "C" fn(*mut nvmlEventSet_t) -> nvmlReturn_t;
type Register = unsafe extern "C" fn(nvmlDevice_t, u64, nvmlEventSet_t) -> nvmlReturn_t;
type Wait = unsafe extern "C" fn(nvmlEventSet_t, *mut nvmlEventData_t, c_uint) -> nvmlReturn_t;

#[test]
fn a_lost_gpu_is_reported_on_every_wait_at_once_after_its_xid_until_reset() {
    let dir = tempfile::tempdir().unwrap();
    let state = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
    let store = Store::create(dir.path(), &state).unwrap();
    // SAFETY: the only test in this binary; nothing else reads the environment concurrently.
    unsafe { std::env::set_var(gpuops_sim::STATE_DIR_ENV, dir.path()) };

    // SAFETY: our own cdylib; every call follows nvml.h's signatures with valid out-pointers.
    unsafe {
        let lib = common::Library::open();
        let init = lib.get::<unsafe extern "C" fn() -> nvmlReturn_t>("nvmlInit_v2");
        assert_eq!(init(), SUCCESS);
        let by_index = lib.get::<GetHandle>("nvmlDeviceGetHandleByIndex_v2");
        let create = lib.get::<SetCreate>("nvmlEventSetCreate");
        let register = lib.get::<Register>("nvmlDeviceRegisterEvents");
        let wait = lib.get::<Wait>("nvmlEventSetWait_v2");

        let (mut gpu2, mut gpu3) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(by_index(2, &mut gpu2), SUCCESS);
        assert_eq!(by_index(3, &mut gpu3), SUCCESS);
        // One set watches GPUs 2 and 3 (as NVIDIA's plugin watches all), another GPU 3 alone.
        let (mut both, mut other) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(create(&mut both), SUCCESS);
        assert_eq!(create(&mut other), SUCCESS);
        assert_eq!(register(gpu2, XID_CRITICAL, both), SUCCESS);
        assert_eq!(register(gpu3, XID_CRITICAL, both), SUCCESS);
        assert_eq!(register(gpu3, XID_CRITICAL, other), SUCCESS);

        store
            .update(|s| {
                s.inject_xid(2, 79, None, None)?;
                s.set_lost(2, true)
            })
            .unwrap()
            .unwrap();

        let mut data: nvmlEventData_t = std::mem::zeroed();
        assert_eq!(wait(both, &mut data, 5_000), SUCCESS);
        assert_eq!((data.eventType, data.eventData), (XID_CRITICAL, 79));

        // Every later wait says "lost" without waiting: many returns inside one timeout.
        const TIMEOUT_MS: u32 = 5_000;
        const WAITS: u32 = 50;
        let start = Instant::now();
        for n in 0..WAITS {
            let code = wait(both, &mut data, TIMEOUT_MS);
            assert_eq!(code, GPU_IS_LOST, "wait {n}");
        }
        let took = start.elapsed();
        assert!(
            took < Duration::from_millis(u64::from(TIMEOUT_MS)),
            "{WAITS} waits took {took:?}: a wait blocked instead of returning GPU_IS_LOST"
        );

        // A set that does not watch the lost GPU waits out its timeout as before.
        let start = Instant::now();
        assert_eq!(wait(other, &mut data, 50), TIMEOUT);
        assert!(start.elapsed() >= Duration::from_millis(50));

        // After a reset the GPU is back: the wait times out again instead of failing.
        store.update(|s| s.reset(2)).unwrap().unwrap();
        let start = Instant::now();
        assert_eq!(wait(both, &mut data, 50), TIMEOUT);
        assert!(start.elapsed() >= Duration::from_millis(50));
    }
}
