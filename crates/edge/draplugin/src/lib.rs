//! The agent's kubelet DRA plugin: registration, the DRA gRPC service (v1 and v1beta1) over a
//! claim preparer, and the prepared-claims checkpoint file.
//!
//! This crate is the I/O edge only. What a claim's devices are, how CDI specs are written and what
//! the checkpoint holds belong to the caller (the agent, over `gpuops-dra`'s model), which
//! implements [`ClaimPreparer`]. The crate adds what every DRA driver needs around it:
//!
//! - a registration socket `<plugins_registry>/<driver>-reg.sock` answering the kubelet's plugin
//!   watcher (`PluginInfo` type `DRAPlugin`, versions `v1.DRAPlugin` and `v1beta1.DRAPlugin`),
//!   recreated when it vanishes (a kubelet restart or a cleanup), so the kubelet registers the
//!   driver again;
//! - the DRA service for both versions on `<plugins>/<driver>/dra.sock`, with per-claim errors (one
//!   bad claim never fails the others) and idempotence: a claim prepared once is answered with
//!   the same devices without calling the preparer again, and calls for the same claim never run
//!   side by side;
//! - shutdown that drains in-flight calls for a bounded time, then cancels them;
//! - [`CheckpointStore`]: the plugin's state file, written atomically, whose corruption is an
//!   error naming the file rather than a crash;
//! - [`regproxy`]: a proxy in front of the registration socket for kubelets whose `:authority`
//!   our HTTP/2 server would refuse (every driver on such a kubelet needs it).

mod checkpoint;
mod error;
mod locks;
mod preparer;
mod registration;
pub mod regproxy;
mod service;
mod supervisor;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use checkpoint::CheckpointStore;
pub use error::DraPluginError;
pub use preparer::{Claim, ClaimPreparer, PrepareAnswers, PreparedDevice, UnprepareAnswers};
pub use registration::RegistrationState;
pub use service::DraService;
pub use supervisor::{serve, serve_reporting};

/// The driver name NVIDIA's DRA driver uses, so DeviceClasses and claims written for it work.
pub const DRIVER_NAME: &str = "gpu.nvidia.com";
/// The DRA socket's file name inside the driver's plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";
/// The checkpoint's file name inside the driver's plugin directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";

/// Where the plugin puts its sockets and state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfig {
    /// The driver name, also the plugin name the kubelet registers.
    pub driver: String,
    /// The kubelet's plugin watcher directory (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The driver's own directory (`/var/lib/kubelet/plugins/<driver>`): DRA socket, checkpoint.
    pub plugin_dir: PathBuf,
    /// How long in-flight calls may finish at shutdown before they are cancelled.
    pub drain: Duration,
}

impl PluginConfig {
    /// The layout the kubelet expects: `<registry_dir>/<driver>-reg.sock` and
    /// `<plugins_dir>/<driver>/dra.sock`. The paths must be the same inside the agent's container
    /// as on the host, because the kubelet dials the endpoint named in `PluginInfo`.
    pub fn new(driver: &str, registry_dir: &Path, plugins_dir: &Path) -> PluginConfig {
        PluginConfig {
            driver: driver.to_string(),
            registry_dir: registry_dir.to_path_buf(),
            plugin_dir: plugins_dir.join(driver),
            drain: Duration::from_secs(5),
        }
    }

    /// The kubelet's standard directories for `driver`.
    pub fn kubelet_default(driver: &str) -> PluginConfig {
        PluginConfig::new(
            driver,
            Path::new(gpuops_kubelet_api::PLUGINS_REGISTRY_DIR),
            Path::new(gpuops_kubelet_api::PLUGINS_DIR),
        )
    }

    /// The socket the kubelet's plugin watcher finds.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }

    /// The socket serving the DRA service, named in `PluginInfo.endpoint`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET)
    }

    /// The prepared-claims checkpoint.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.plugin_dir.join(CHECKPOINT_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_layout_for_nvidias_driver_name() {
        let c = PluginConfig::kubelet_default(DRIVER_NAME);
        assert_eq!(
            c.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock")
        );
        assert_eq!(
            c.dra_socket(),
            Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
        );
        assert_eq!(
            c.checkpoint_path(),
            Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/checkpoint.json")
        );
    }
}
