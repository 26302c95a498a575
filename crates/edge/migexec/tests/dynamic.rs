//! Dynamic MIG on the simulated driver: create at a placement, adopt on a retried prepare, clean a
//! GPU instance a crash left without its compute instance, destroy by UUID, and turn a GPU whole.
//! One test: the simulator keeps one driver per process and reads its state directory at init.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpuops_catalog::lookup;
use gpuops_migexec::dynamic::{Wanted, create, destroy, make_whole};
use gpuops_nvml::{Gpus, Library, PlacementSlot};
use std::path::PathBuf;

fn sim_library() -> PathBuf {
    let name = format!(
        "{}nvml_sim{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .take(2)
        .flat_map(|d| [d.join(&name), d.join("deps").join(&name)])
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not built beside {}", exe.display()))
}

#[test]
fn a_claims_mig_device_is_created_at_its_placement_adopted_on_retry_and_destroyed_by_uuid() {
    let dir = tempfile::tempdir().unwrap();
    let fleet =
        gpuops_sim::Fleet::parse("gpus:\n- model: H100-SXM5-80GB\n  count: 1\n", "test fleet")
            .unwrap();
    let state = gpuops_sim::SimState::from_fleet(&fleet, 0).unwrap();
    gpuops_sim::Store::create(dir.path(), &state).unwrap();
    gpuops_nvml::use_simulator_state(dir.path());
    let gpus = Gpus::open(Library::Path(sim_library())).unwrap();
    let model = lookup("H100-SXM5-80GB").unwrap();
    let profile = |name: &str| {
        let p = model.gi_profile(name).unwrap();
        (p.nvml_id, p.memory_slices)
    };

    // MIG mode off: the first create turns it on (Hopper needs no reset).
    assert!(!gpus.mig_mode_enabled(0).unwrap());
    let (id, size) = profile("3g.40gb");
    let three = Wanted {
        gpu: 0,
        gi_profile_id: id,
        start: 4,
        size,
    };
    let made = create(&gpus, &three).unwrap();
    assert!(!made.adopted);
    assert!(made.uuid.starts_with("MIG-"), "{made:?}");
    let devices = gpus.mig_devices_of(0).unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        (devices[0].profile.as_str(), devices[0].placement_start),
        ("3g.40gb", 4)
    );

    // A prepare retried after a crash finds its device: nothing new is made.
    let again = create(&gpus, &three).unwrap();
    assert!(again.adopted);
    assert_eq!(again.uuid, made.uuid);
    assert_eq!(gpus.mig_devices_of(0).unwrap().len(), 1);

    // A crash between the GPU instance and its compute instance leaves slices held by no
    // device; the next create removes it and succeeds.
    let (one, one_size) = profile("1g.10gb");
    gpus.create_gpu_instance(
        0,
        one,
        Some(PlacementSlot {
            start: 0,
            size: one_size,
        }),
    )
    .unwrap();
    assert_eq!(gpus.empty_gpu_instances(0).unwrap().len(), 1);
    let small = Wanted {
        gpu: 0,
        gi_profile_id: one,
        start: 0,
        size: one_size,
    };
    let small_made = create(&gpus, &small).unwrap();
    assert!(!small_made.adopted);
    assert!(gpus.empty_gpu_instances(0).unwrap().is_empty());
    assert_eq!(gpus.mig_devices_of(0).unwrap().len(), 2);

    // A placement that overlaps an existing device is the driver's error, named.
    let (seven, seven_size) = profile("7g.80gb");
    let whole = Wanted {
        gpu: 0,
        gi_profile_id: seven,
        start: 0,
        size: seven_size,
    };
    let e = create(&gpus, &whole).unwrap_err();
    assert!(e.to_string().contains("GPU-instance profile"), "{e}");
    assert_eq!(
        gpus.mig_devices_of(0).unwrap().len(),
        2,
        "nothing left over"
    );

    // A whole GPU cannot be made while MIG devices remain.
    let e = make_whole(&gpus, 0).unwrap_err();
    assert!(e.to_string().contains(&made.uuid), "{e}");

    // Unprepare destroys by UUID; a second unprepare finds it gone.
    assert!(destroy(&gpus, &three, &made.uuid).unwrap());
    assert!(!destroy(&gpus, &three, &made.uuid).unwrap());
    // Without a UUID read back (a crash right after the create), by placement.
    assert!(destroy(&gpus, &small, "").unwrap());
    assert!(gpus.mig_devices_of(0).unwrap().is_empty());

    make_whole(&gpus, 0).unwrap();
    assert!(!gpus.mig_mode_enabled(0).unwrap());
}
