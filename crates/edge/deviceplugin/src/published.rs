//! What the plugins advertise, and the host device nodes Allocate may pass.

use gpuops_inventory::Inventory;
use gpuops_resources::HostDevices;
use gpuops_resources::config::Config;
use gpuops_resources::model::Resource;
use std::path::Path;
use std::sync::Arc;

/// What the plugins advertise now: derived from one inventory snapshot and the effective config.
#[derive(Debug, Clone)]
pub struct Published {
    pub resources: Vec<Resource>,
    pub config: Config,
    pub inventory: Arc<Inventory>,
    /// The host's device nodes, as probed: Allocate passes only the ones that exist.
    pub host: Arc<HostDevices>,
}

/// Which NVIDIA control nodes exist under `dev_root`/dev, and the MIG capability minors the driver
/// lists in `proc_root`/driver/nvidia-caps/mig-minors (NVIDIA's plugin stats the same files).
pub fn probe_host(dev_root: &Path, proc_root: &Path) -> HostDevices {
    let exists = |name: &str| dev_root.join("dev").join(name).exists();
    HostDevices {
        nvidiactl: exists("nvidiactl"),
        nvidia_uvm: exists("nvidia-uvm"),
        nvidia_uvm_tools: exists("nvidia-uvm-tools"),
        nvidia_modeset: exists("nvidia-modeset"),
        mig_minors: std::fs::read_to_string(proc_root.join("driver/nvidia-caps/mig-minors"))
            .ok()
            .map(|t| gpuops_resources::parse_mig_minors(&t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_reports_the_device_nodes_and_mig_minors_that_exist() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        std::fs::write(root.path().join("dev/nvidiactl"), "").unwrap();
        std::fs::write(root.path().join("dev/nvidia-uvm"), "").unwrap();
        let proc_root = tempfile::tempdir().unwrap();
        let host = probe_host(root.path(), proc_root.path());
        assert_eq!(
            host,
            HostDevices {
                nvidiactl: true,
                nvidia_uvm: true,
                nvidia_uvm_tools: false,
                nvidia_modeset: false,
                mig_minors: None,
            }
        );
        std::fs::create_dir_all(proc_root.path().join("driver/nvidia-caps")).unwrap();
        std::fs::write(
            proc_root.path().join("driver/nvidia-caps/mig-minors"),
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n",
        )
        .unwrap();
        let minors = probe_host(root.path(), proc_root.path())
            .mig_minors
            .unwrap();
        assert_eq!(minors.get("gpu0/gi1/ci0/access"), Some(&13));
    }
}
