//! The procfs and sysfs view of a simulated node, written under the state directory so that a
//! test can bind-mount it over `/proc/driver/nvidia` and `/sys/bus/pci/devices` in a private mount
//! namespace and a tool reading them sees the simulated GPUs: `proc/modules`,
//! `proc/driver/nvidia/{version, gpus/<bus id>/information, capabilities/mig/{config,monitor}}`
//! and `sys/bus/pci/devices/<bus id>/{vendor, device, subsystem_vendor, subsystem_device, class,
//! numa_node, driver}`, in the formats NVIDIA's kernel module and the kernel's PCI core write.
//!
//! Faked: IRQ, video BIOS, DMA width, module sizes and the build line of `version` are fixed
//! values; `driver` is a symbolic link whose target need not exist (readers take its last part).

use crate::{SimError, SimState, state::SimGpu};
use std::path::Path;

/// NVIDIA's PCI vendor id.
pub const NVIDIA_VENDOR: u16 = 0x10de;
/// Where the view lives in the state directory.
pub const PROC_NVIDIA: &str = "proc/driver/nvidia";
pub const SYS_PCI_DEVICES: &str = "sys/bus/pci/devices";

/// `0000:18:00.0`: the bus id as the kernel names PCI devices (lower-case hex).
pub fn sysfs_bus_id(g: &SimGpu) -> String {
    format!("{:04x}:{:02x}:00.0", g.pci_domain, g.pci_bus)
}

/// `/proc/driver/nvidia/version`, as the kernel module prints it.
pub fn version(driver_version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version}  (gpuops simulator)\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
}

/// `/proc/driver/nvidia/gpus/<bus id>/information`, with the driver's labels and tab layout.
pub fn information(g: &SimGpu) -> String {
    format!(
        "Model: \t\t {}\nIRQ:   \t\t {}\nGPU UUID: \t {}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {}\nDevice Minor: \t {}\nGPU Excluded:\t No\n",
        g.name(),
        100 + g.minor_number,
        g.uuid,
        sysfs_bus_id(g),
        g.minor_number
    )
}

/// A capability file under `/proc/driver/nvidia/capabilities/`: the `nvidia-cap<minor>` node that
/// grants it, which mig-parted and the device plugin read as `DeviceFileMinor`.
pub fn capability(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
}

/// `/proc/modules` lines of the loaded NVIDIA modules.
pub fn modules() -> String {
    "nvidia_uvm 4956160 0 - Live 0x0000000000000000 (POE)\n\
     nvidia_modeset 1638400 0 - Live 0x0000000000000000 (POE)\n\
     nvidia 60760064 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n"
        .to_string()
}

/// The sysfs PCI attributes of a GPU: (file, text).
pub fn pci_attributes(g: &SimGpu) -> Vec<(&'static str, String)> {
    vec![
        ("vendor", format!("{NVIDIA_VENDOR:#06x}\n")),
        ("device", format!("{:#06x}\n", g.pci_device_id())),
        ("subsystem_vendor", format!("{NVIDIA_VENDOR:#06x}\n")),
        ("subsystem_device", format!("{:#06x}\n", 0x1600 + g.index)),
        ("class", format!("{:#08x}\n", g.pci_class())),
        ("numa_node", format!("{}\n", g.numa_node)),
    ]
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    let io = |action: &'static str, p: &Path| {
        let path = p.to_path_buf();
        move |source| SimError::Io {
            action,
            path,
            source,
        }
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    std::fs::write(path, text).map_err(io("writing", path))
}

/// Writes the view of `state` under `state_dir`; existing files are replaced.
pub fn create(state_dir: &Path, state: &SimState) -> Result<(), SimError> {
    write(&state_dir.join("proc/modules"), &modules())?;
    let nv = state_dir.join(PROC_NVIDIA);
    write(&nv.join("version"), &version(&state.driver_version))?;
    write(&nv.join("capabilities/mig/config"), &capability(1))?;
    write(&nv.join("capabilities/mig/monitor"), &capability(2))?;
    let sys = state_dir.join(SYS_PCI_DEVICES);
    for g in &state.gpus {
        let bus = sysfs_bus_id(g);
        write(
            &nv.join("gpus").join(&bus).join("information"),
            &information(g),
        )?;
        let dev = sys.join(&bus);
        for (file, text) in pci_attributes(g) {
            write(&dev.join(file), &text)?;
        }
        let link = dev.join("driver");
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink("../../../../bus/pci/drivers/nvidia", &link).map_err(
                |source| SimError::Io {
                    action: "linking",
                    path: link.clone(),
                    source,
                },
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fleet;

    #[test]
    fn the_view_has_each_gpu_in_nvidias_formats() {
        let s = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        create(dir.path(), &s).unwrap();
        let g = &s.gpus[0];
        let bus = sysfs_bus_id(g);
        assert_eq!(bus, "0000:18:00.0");
        let info = std::fs::read_to_string(
            dir.path()
                .join(PROC_NVIDIA)
                .join("gpus")
                .join(&bus)
                .join("information"),
        )
        .unwrap();
        assert!(
            info.starts_with("Model: \t\t NVIDIA H100 80GB HBM3\n"),
            "{info}"
        );
        assert!(
            info.contains(&format!("GPU UUID: \t {}\n", g.uuid)),
            "{info}"
        );
        assert!(
            info.contains("Bus Location: \t 0000:18:00.0\nDevice Minor: \t 0\n"),
            "{info}"
        );
        let sys = dir.path().join(SYS_PCI_DEVICES).join(&bus);
        let read = |f: &str| std::fs::read_to_string(sys.join(f)).unwrap();
        assert_eq!(read("vendor"), "0x10de\n");
        assert_eq!(read("device"), "0x2330\n");
        assert_eq!(read("class"), "0x030200\n");
        assert_eq!(read("numa_node"), "0\n");
        assert_eq!(
            std::fs::read_link(sys.join("driver"))
                .unwrap()
                .file_name()
                .unwrap(),
            "nvidia"
        );
        let config = dir.path().join(PROC_NVIDIA).join("capabilities/mig/config");
        assert!(
            std::fs::read_to_string(config)
                .unwrap()
                .starts_with("DeviceFileMinor: 1\n")
        );
        let entries = std::fs::read_dir(dir.path().join(SYS_PCI_DEVICES))
            .unwrap()
            .count();
        assert_eq!(entries, 8);
        // Again: files are replaced, the link is kept.
        create(dir.path(), &s).unwrap();
    }
}
