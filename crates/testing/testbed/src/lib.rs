//! Test support: a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler, optionally
//! kube-controller-manager and KWOK) on loopback, plus GPU harness nodes that embed the kubelet's
//! device manager, and real nodes: a kubelet with containerd and runc running real pods.
//!
//! Binaries come from `tests/k8s/build.sh` (built from Go modules, cached under
//! `~/.cache/gpuops/k8s/<key>/bin`); point `GPUOPS_K8S_BIN` at that directory. Every process runs on
//! free loopback ports with its own temporary directory, and everything is stopped when the
//! [`Cluster`] (or [`HarnessNode`]) is dropped — also when a test panics.
#![forbid(unsafe_code)]

mod capi;
pub mod child;
mod cluster;
mod harness;
mod infra;
mod karpenter;
mod kubectl;
pub mod node_view;
pub mod rbac;
mod real_node;
pub mod scenario;

pub use capi::{CAPI_BIN_ENV, CapiOptions, ClusterApi, DELETE_MACHINE, MachineInfo, PoolSpec};
pub use child::ChildGuard;
pub use child::{RUN_DIR_ENV, start_time};
pub use cluster::{Cluster, ClusterOptions, DRA_FEATURE_GATES, User};
pub use harness::{Allocation, HarnessNode, TestPlugin};
pub use infra::{MACHINE_LABEL, NodeShape, PROVIDER_ID_PREFIX, STARTUP_TAINT};
pub use karpenter::{InstanceType, KARPENTER_BIN_ENV, Karpenter, KarpenterOptions, NodeClaimInfo};
pub use real_node::{NodeImages, RealNode, RealNodeOptions, node_images};

use std::path::PathBuf;

/// The environment variable naming the directory of built control-plane binaries.
pub const BIN_ENV: &str = "GPUOPS_K8S_BIN";

/// Why the test bed could not do something.
#[derive(Debug, thiserror::Error)]
pub enum BedError {
    #[error(
        "{BIN_ENV} is not set: build the control plane with `eval $(tests/k8s/build.sh)` (needs Go; \
         the first build takes 15-30 minutes, later ones seconds), or run scripts/test which does it"
    )]
    NoBinaries,
    #[error(
        "{var} is not set: build it with `eval $(tests/k8s/build.sh {part})` (needs Go and the Go \
         module proxy the first time, a few minutes; seconds once cached)"
    )]
    NoAddon {
        var: &'static str,
        part: &'static str,
    },
    #[error("{name} is missing from {dir}: run tests/k8s/build.sh again")]
    MissingBinary { name: String, dir: PathBuf },
    #[error("starting {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} did not become ready within {seconds}s; its log ({log}) ends with:\n{tail}")]
    NotReady {
        what: String,
        seconds: u64,
        log: PathBuf,
        tail: String,
    },
    #[error("{what} exited early ({status}); its log ({log}) ends with:\n{tail}")]
    Exited {
        what: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kubectl {args}: {message}")]
    Kubectl { args: String, message: String },
    #[error("helm {args} failed:\n{message}")]
    Helm { args: String, message: String },
    #[error("{what}: {message}")]
    Manifest { what: String, message: String },
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    /// A test provider's object whose spec it cannot use: the field (`spec.devices.x`) and why.
    #[error("{field}: {problem}")]
    Spec { field: String, problem: String },
    /// A mig-parted config a test provider read (its origin is in the error).
    #[error(transparent)]
    MigConfig(Box<gpuops_mig::MigError>),
    /// A config name the file does not define (the error lists the names it does).
    #[error("{origin}: {source}")]
    MigConfigName {
        origin: String,
        #[source]
        source: Box<gpuops_mig::MigError>,
    },
    #[error("{what} panicked")]
    Panicked { what: &'static str },
    /// The kubectl calls of one reconciler pass that failed, each with kubectl's message.
    #[error("{}", .0.join("; "))]
    Actions(Vec<String>),
}

impl BedError {
    pub(crate) fn io(action: impl Into<String>, source: std::io::Error) -> BedError {
        BedError::Io {
            action: action.into(),
            source,
        }
    }
}

/// The directory of built binaries, checked to contain `names`.
pub fn binaries(names: &[&str]) -> Result<PathBuf, BedError> {
    let dir = std::env::var_os(BIN_ENV)
        .map(PathBuf::from)
        .ok_or(BedError::NoBinaries)?;
    for name in names {
        if !dir.join(name).is_file() {
            return Err(BedError::MissingBinary {
                name: (*name).to_string(),
                dir,
            });
        }
    }
    Ok(dir)
}

/// A free TCP port on loopback (the OS picks one; a tiny race with other processes is accepted).
pub fn free_port() -> Result<u16, BedError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| BedError::io("finding a free port", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| BedError::io("finding a free port", e))
}

/// Polls `check` every 200 ms until it is true or `timeout` passes.
pub fn wait_until(
    what: &str,
    timeout: std::time::Duration,
    mut check: impl FnMut() -> bool,
) -> Result<(), BedError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if check() {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(BedError::Timeout {
                what: what.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
