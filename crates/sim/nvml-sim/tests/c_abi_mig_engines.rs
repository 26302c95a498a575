//! MIG engine counts through the C ABI, as NVIDIA's tools read them: `nvmlDeviceGetAttributes_v2`
//! on MIG device handles, and the shared engines of every compute-instance profile.
//!
//! One test per file: the loaded driver and its state directory are process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use gpuops_sim::{Fleet, SimState, Store};
use nvml_wrapper_sys::bindings::*;
use std::os::raw::c_uint;

const SUCCESS: u32 = 0;
const NOT_SUPPORTED: u32 = 3;
const ARGUMENT_VERSION_MISMATCH: u32 = 25;
// GPU-instance profile ids and enums on an H100 80GB.
const P_3G_ID: u32 = 9;
const P_3G_ENUM: u32 = 2;
const P_7G_ID: u32 = 0;
const P_7G_ENUM: u32 = 4;

type GetHandle = unsafe extern "C" fn(c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type GetMig = unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut nvmlDevice_t) -> nvmlReturn_t;
type GetAttributes =
    unsafe extern "C" fn(nvmlDevice_t, *mut nvmlDeviceAttributes_t) -> nvmlReturn_t;
type GetGi = unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut nvmlGpuInstance_t) -> nvmlReturn_t;
type GetGiInfo =
    unsafe extern "C" fn(nvmlGpuInstance_t, *mut nvmlGpuInstanceInfo_t) -> nvmlReturn_t;
type GiProfile =
    unsafe extern "C" fn(nvmlDevice_t, c_uint, *mut nvmlGpuInstanceProfileInfo_t) -> nvmlReturn_t;
type CiProfile = unsafe extern "C" fn(
    nvmlGpuInstance_t,
    c_uint,
    c_uint,
    *mut nvmlComputeInstanceProfileInfo_t,
) -> nvmlReturn_t;
type CiProfileV = unsafe extern "C" fn(
    nvmlGpuInstance_t,
    c_uint,
    c_uint,
    *mut nvmlComputeInstanceProfileInfo_v2_t,
) -> nvmlReturn_t;

fn shared(p: &nvmlComputeInstanceProfileInfo_t) -> [u32; 5] {
    [
        p.sharedCopyEngineCount,
        p.sharedDecoderCount,
        p.sharedEncoderCount,
        p.sharedJpegCount,
        p.sharedOfaCount,
    ]
}

fn engines(p: &nvmlGpuInstanceProfileInfo_t) -> [u32; 5] {
    [
        p.copyEngineCount,
        p.decoderCount,
        p.encoderCount,
        p.jpegCount,
        p.ofaCount,
    ]
}

fn c_str(bytes: &[std::os::raw::c_char]) -> String {
    bytes
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8 as char)
        .collect()
}

// Long on purpose: one scenario on one simulated GPU, its checks in order on one shared setup.
#[test]
fn mig_devices_report_attributes_and_ci_profiles_share_their_gpu_instances_engines() {
    // The struct NVIDIA's tools pass: eight unsigned ints and an unsigned long long (nvml.h).
    assert_eq!(std::mem::size_of::<nvmlDeviceAttributes_t>(), 40);
    assert_eq!(
        std::mem::offset_of!(nvmlDeviceAttributes_t, memorySizeMB),
        32
    );

    let dir = tempfile::tempdir().unwrap();
    let mut state = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
    // GPU 0: a 3g split into a 1-slice and a 2-slice compute instance, and a 7g on GPU 1 whole.
    let g = &mut state.gpus[0];
    g.set_mig_mode(true).unwrap();
    let gi3 = g.create_gi(P_3G_ID, None).unwrap();
    // The 2-slice CI first: placed after the 1-slice one there would be no aligned start left.
    g.create_ci(gi3, 1, None, "MIG-a".into()).unwrap();
    g.create_ci(gi3, 0, None, "MIG-b".into()).unwrap();
    let g = &mut state.gpus[1];
    g.set_mig_mode(true).unwrap();
    let gi7 = g.create_gi(P_7G_ID, None).unwrap();
    g.create_ci(gi7, 4, None, "MIG-c".into()).unwrap();
    Store::create(dir.path(), &state).unwrap();
    // SAFETY: the only test in this binary; nothing else reads the environment concurrently.
    unsafe { std::env::set_var(gpuops_sim::STATE_DIR_ENV, dir.path()) };

    // SAFETY: our own cdylib; every call below follows nvml.h's signatures (from
    // nvml-wrapper-sys) and passes valid out-pointers.
    unsafe {
        let lib = common::Library::open();
        let init = lib.get::<unsafe extern "C" fn() -> nvmlReturn_t>("nvmlInit_v2");
        assert_eq!(init(), SUCCESS);
        let by_index = lib.get::<GetHandle>("nvmlDeviceGetHandleByIndex_v2");
        let mig_by_index = lib.get::<GetMig>("nvmlDeviceGetMigDeviceHandleByIndex");
        let attrs = lib.get::<GetAttributes>("nvmlDeviceGetAttributes_v2");
        let attrs_v1 = lib.get::<GetAttributes>("nvmlDeviceGetAttributes");
        let gi_by_id = lib.get::<GetGi>("nvmlDeviceGetGpuInstanceById");
        let gi_info = lib.get::<GetGiInfo>("nvmlGpuInstanceGetInfo");
        let gi_profile = lib.get::<GiProfile>("nvmlDeviceGetGpuInstanceProfileInfo");
        let ci_profile = lib.get::<CiProfile>("nvmlGpuInstanceGetComputeInstanceProfileInfo");
        let ci_profile_v = lib.get::<CiProfileV>("nvmlGpuInstanceGetComputeInstanceProfileInfoV");

        let mut gpu0: nvmlDevice_t = std::ptr::null_mut();
        let mut gpu1: nvmlDevice_t = std::ptr::null_mut();
        let mut gpu2: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(by_index(0, &mut gpu0), SUCCESS);
        assert_eq!(by_index(1, &mut gpu1), SUCCESS);
        assert_eq!(by_index(2, &mut gpu2), SUCCESS);

        // A whole GPU: nvml.h says the call supports MIG device handles only.
        let mut a: nvmlDeviceAttributes_t = std::mem::zeroed();
        assert_eq!(attrs(gpu2, &mut a), NOT_SUPPORTED);
        assert_eq!(
            attrs(gpu0, &mut a),
            NOT_SUPPORTED,
            "a MIG-enabled parent too"
        );

        let mut p3: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(gi_profile(gpu0, P_3G_ENUM, &mut p3), SUCCESS);
        let mut p7: nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
        assert_eq!(gi_profile(gpu1, P_7G_ENUM, &mut p7), SUCCESS);
        assert!(p3.copyEngineCount > 0 && p3.decoderCount > 0, "{p3:?}");

        // MIG device 0 of GPU 0: the 2-slice CI; 1: the 1-slice CI, both in the 3g.
        let mut seen_sms = Vec::new();
        for (index, ci_slices) in [(0, 2), (1, 1)] {
            let mut mig: nvmlDevice_t = std::ptr::null_mut();
            assert_eq!(mig_by_index(gpu0, index, &mut mig), SUCCESS);
            let mut a: nvmlDeviceAttributes_t = std::mem::zeroed();
            assert_eq!(attrs(mig, &mut a), SUCCESS);
            let mut plain: nvmlDeviceAttributes_t = std::mem::zeroed();
            assert_eq!(attrs_v1(mig, &mut plain), SUCCESS);
            assert_eq!(format!("{a:?}"), format!("{plain:?}"));
            assert_eq!(a.gpuInstanceSliceCount, p3.sliceCount);
            assert_eq!(a.computeInstanceSliceCount, ci_slices);
            assert_eq!(a.memorySizeMB, p3.memorySizeMB);
            assert_eq!(
                [
                    a.sharedCopyEngineCount,
                    a.sharedDecoderCount,
                    a.sharedEncoderCount,
                    a.sharedJpegCount,
                    a.sharedOfaCount
                ],
                engines(&p3)
            );
            assert!(a.multiprocessorCount > 0 && a.multiprocessorCount <= p3.multiprocessorCount);
            seen_sms.push(a.multiprocessorCount);
        }
        assert!(seen_sms[0] > seen_sms[1], "{seen_sms:?}");
        let mut mig: nvmlDevice_t = std::ptr::null_mut();
        assert_eq!(mig_by_index(gpu1, 0, &mut mig), SUCCESS);
        let mut a: nvmlDeviceAttributes_t = std::mem::zeroed();
        assert_eq!(attrs(mig, &mut a), SUCCESS);
        assert_eq!(
            (
                a.multiprocessorCount,
                a.gpuInstanceSliceCount,
                a.computeInstanceSliceCount
            ),
            (p7.multiprocessorCount, 7, 7)
        );
        assert_eq!(a.sharedOfaCount, p7.ofaCount);

        // Every CI profile of a GI reports the GI's engines as shared, v1 and V alike.
        for (gpu, gi_id, p, names) in [
            (
                gpu0,
                gi3,
                &p3,
                &["MIG 1c.3g.40gb", "MIG 2c.3g.40gb", "MIG 3g.40gb"][..],
            ),
            (gpu1, gi7, &p7, &["MIG 1c.7g.80gb"][..]),
        ] {
            let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
            assert_eq!(gi_by_id(gpu, gi_id, &mut gi), SUCCESS);
            let mut info: nvmlGpuInstanceInfo_t = std::mem::zeroed();
            assert_eq!(gi_info(gi, &mut info), SUCCESS);
            let mut supported = 0;
            for ci_enum in 0..8 {
                let mut c: nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                if ci_profile(gi, ci_enum, 0, &mut c) != SUCCESS {
                    continue;
                }
                assert_eq!(shared(&c), engines(p), "gi {gi_id} ci enum {ci_enum}");
                let mut v: nvmlComputeInstanceProfileInfo_v2_t = std::mem::zeroed();
                v.version =
                    std::mem::size_of::<nvmlComputeInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
                assert_eq!(ci_profile_v(gi, ci_enum, 0, &mut v), SUCCESS);
                assert_eq!(
                    [
                        v.sharedCopyEngineCount,
                        v.sharedDecoderCount,
                        v.sharedEncoderCount,
                        v.sharedJpegCount,
                        v.sharedOfaCount
                    ],
                    engines(p)
                );
                assert_eq!((v.id, v.sliceCount), (c.id, c.sliceCount));
                if let Some(name) = names.get(supported) {
                    assert_eq!(&c_str(&v.name), name);
                }
                let mut v3: nvmlComputeInstanceProfileInfo_v3_t = std::mem::zeroed();
                v3.version =
                    std::mem::size_of::<nvmlComputeInstanceProfileInfo_v3_t>() as u32 | (3 << 24);
                assert_eq!(ci_profile_v(gi, ci_enum, 0, (&raw mut v3).cast()), SUCCESS);
                assert_eq!(v3.sharedCopyEngineCount, p.copyEngineCount);
                assert_eq!(c_str(&v3.name), c_str(&v.name));
                supported += 1;
            }
            assert!(
                supported >= names.len(),
                "gi {gi_id}: {supported} CI profiles"
            );
            let mut bad: nvmlComputeInstanceProfileInfo_v2_t = std::mem::zeroed();
            bad.version = 7;
            assert_eq!(ci_profile_v(gi, 0, 0, &mut bad), ARGUMENT_VERSION_MISMATCH);
        }
    }
}
