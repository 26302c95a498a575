//! The kubelet's gRPC APIs gpuops speaks: device plugin v1beta1,
//! PodResources v1, plugin registration v1 and DRA v1/v1beta1, generated
//! with tonic.
//!
//! The `.proto` files under `proto/` are our own, written from the public
//! Kubernetes field tables (names and field numbers match upstream). They are
//! compiled at build time by `protox` + `tonic-prost-build`; no `protoc` is
//! needed.
//!
//! - [`deviceplugin::v1beta1`]: `Registration` (served by the kubelet) and
//!   `DevicePlugin` (served by a plugin), with servers and clients.
//! - [`podresources::v1`]: `PodResourcesLister` (served by the kubelet).
//! - [`pluginregistration::v1`]: `Registration` (served by a plugin on its
//!   registration socket, called by the kubelet's plugin watcher).
//! - [`dra::v1`], [`dra::v1beta1`]: `DRAPlugin` (served by a DRA driver).
//! - [`unix`]: dialing and serving gRPC over Unix sockets.

/// Kubelet device plugin API.
pub mod deviceplugin {
    /// Device plugin API `v1beta1` (gRPC package `v1beta1`).
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )]
    pub mod v1beta1 {
        tonic::include_proto!("v1beta1");
    }
}

/// Kubelet PodResources API.
pub mod podresources {
    /// PodResources API `v1` (gRPC package `v1`).
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )]
    pub mod v1 {
        tonic::include_proto!("v1");
    }
}

/// Kubelet plugin registration API (used by DRA and CSI plugins).
pub mod pluginregistration {
    /// Plugin registration `v1` (gRPC package `pluginregistration`, which
    /// upstream never versioned).
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )]
    pub mod v1 {
        tonic::include_proto!("pluginregistration");
    }
}

/// Kubelet Dynamic Resource Allocation plugin API.
pub mod dra {
    /// DRA `v1` (gRPC package `k8s.io.kubelet.pkg.apis.dra.v1`), Kubernetes 1.34+.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )]
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }

    /// DRA `v1beta1` (gRPC package `k8s.io.kubelet.pkg.apis.dra.v1beta1`),
    /// still offered for older kubelets.
    #[allow(
        missing_docs,
        clippy::all,
        clippy::pedantic,
        clippy::nursery,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic
    )]
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
}

pub mod unix;

/// File name of the kubelet's Registration socket inside [`DEVICE_PLUGIN_DIR`].
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Directory holding the kubelet's and the device plugins' sockets.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The kubelet's PodResources socket.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Device plugin API version sent in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";
/// `Device.health` of a healthy device.
pub const HEALTHY: &str = "Healthy";
/// `Device.health` of an unhealthy device.
pub const UNHEALTHY: &str = "Unhealthy";
/// Directory the kubelet's plugin watcher scans for registration sockets.
pub const PLUGINS_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Directory under which plugins keep their own sockets and state.
pub const PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// `PluginInfo.supported_versions` entry of the DRA `v1` service.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
/// `PluginInfo.supported_versions` entry of the DRA `v1beta1` service.
pub const DRA_V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
