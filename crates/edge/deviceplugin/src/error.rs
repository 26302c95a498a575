//! The device plugin crate's one error type.

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
