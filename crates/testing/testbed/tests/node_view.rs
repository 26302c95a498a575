//! The simulated node's procfs/sysfs view, as a tool inside the private mount namespace sees it.
//! Needs root and `unshare` (as the real-node tier does); runs in a second or so.

use gpuops_sim::{Fleet, SimState, Store};
use gpuops_testbed::node_view::run_in_node_view;

#[test]
fn a_tool_in_the_namespace_sees_the_simulated_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let state = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
    Store::create(dir.path(), &state).unwrap();
    let host_had_nvidia = std::path::Path::new("/proc/driver/nvidia").exists();

    let out = run_in_node_view(
        dir.path(),
        "cat /proc/driver/nvidia/gpus/*/information; \
         cat /sys/bus/pci/devices/*/vendor; \
         cat /proc/driver/nvidia/version; \
         cat /proc/driver/nvidia/capabilities/mig/config",
    )
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    for g in &state.gpus {
        assert!(
            stdout.contains(&format!("GPU UUID: \t {}\n", g.uuid)),
            "{}: {stdout}",
            g.uuid
        );
    }
    assert_eq!(
        stdout
            .matches("Model: \t\t NVIDIA H100 80GB HBM3\n")
            .count(),
        8
    );
    // Only the simulated GPUs: the host's own PCI devices are hidden.
    assert_eq!(
        stdout.lines().filter(|l| *l == "0x10de").count(),
        8,
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("0x")).count(),
        8,
        "{stdout}"
    );
    let version = format!("Kernel Module  {}  ", state.driver_version);
    assert!(stdout.contains(&version), "{stdout}");
    assert!(
        stdout.ends_with("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"),
        "{stdout}"
    );

    // The mounts stayed in the namespace.
    assert_eq!(
        std::path::Path::new("/proc/driver/nvidia").exists(),
        host_had_nvidia
    );
    let host_devices = std::fs::read_dir("/sys/bus/pci/devices").unwrap().count();
    assert!(
        !std::path::Path::new("/sys/bus/pci/devices/0000:18:00.0/information").exists()
            && host_devices > 0
    );
}
