//! The agent's kubelet device plugin servers: one socket and registration per resource,
//! re-registering whenever the kubelet restarts.
//!
//! The resource model (which resources and device IDs, how to allocate) is pure and lives in
//! `gpuops-resources`; this crate is the I/O edge: gRPC over Unix sockets, registration, and noticing
//! a kubelet restart (its `kubelet.sock` replaced, or our socket deleted) within a second.

mod service;
mod supervisor;

pub use supervisor::{Published, serve};

use std::path::PathBuf;

/// Failures of the plugin servers.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("device plugin directory {dir}: {source}")]
    PluginDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serving {resource} on {socket}: {source}")]
    Listen {
        resource: String,
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering {resource} with the kubelet at {kubelet}: {message}")]
    Register {
        resource: String,
        kubelet: PathBuf,
        message: String,
    },
}
