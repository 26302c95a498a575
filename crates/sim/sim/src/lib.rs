//! The simulated NVIDIA driver's model: fleet files, persistent driver state, MIG rules and fault
//! injection.
//!
//! The `nvml-sim` cdylib exports NVML's C ABI on top of this crate; the `gpuops sim` command uses it
//! to create a simulated node and to inject faults. Keeping the rules here (safe, pure Rust) leaves
//! the cdylib as a thin, reviewable layer of FFI glue.
#![forbid(unsafe_code)]

pub mod activity;
pub mod control;
pub mod devnodes;
pub mod fleet;
pub mod ids;
pub mod mig;
pub mod procfs;
pub mod render;
pub mod state;
pub mod store;

pub use activity::Activity;
pub use fleet::{BUILTIN_FLEETS, Fabric, Fleet, FleetGpus};
pub use mig::NvmlCode;
pub use state::{Load, NvlinkPeer, SimCi, SimEvent, SimGi, SimGpu, SimProcess, SimState};
pub use store::Store;

use std::path::PathBuf;

/// The environment variable naming the state directory the cdylib reads.
pub const STATE_DIR_ENV: &str = "GPUOPS_NVML_SIM_STATE";

/// Everything that can go wrong while building or reading a simulated node.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("fleet file {path}: {message}")]
    FleetSyntax { path: String, message: String },
    #[error("fleet file {path}: {message}")]
    FleetInvalid { path: String, message: String },
    #[error(
        "unknown fleet {name:?}: not a built-in fleet ({}) and no such file",
        BUILTIN_FLEETS.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
    )]
    UnknownFleet { name: String },
    #[error("simulator state directory {dir} has no state.json; create it with `gpuops sim init`")]
    StateMissing { dir: PathBuf },
    #[error(
        "simulator state {path} is corrupt: {message}; delete the directory and run `gpuops sim init` again"
    )]
    StateCorrupt { path: PathBuf, message: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no GPU with index {index}: the simulated node has {count} GPUs (indices 0 to {})", count.saturating_sub(1))]
    NoSuchGpu { index: u32, count: usize },
    #[error("{0}")]
    Invalid(String),
    // A state file that breaks an invariant the cdylib relies on.
    #[error("format {format} is not the supported {}", state::STATE_FORMAT)]
    StateFormat { format: u32 },
    #[error("gpus[{position}] has index {index}")]
    GpuIndex { position: usize, index: u32 },
    #[error("gpus[{position}]: {source}")]
    GpuModel {
        position: usize,
        #[source]
        source: gpuops_catalog::CatalogError,
    },
    #[error("gpus[{position}] ({model}) has GPU instances but no MIG support")]
    InstancesWithoutMig {
        position: usize,
        model: &'static str,
    },
    // Versions given to a fleet.
    #[error("driver-version {0:?} is not of the form MAJOR.MINOR[.PATCH], e.g. 580.105.08")]
    DriverVersion(String),
    #[error("driver-version {0:?}: major number too large")]
    DriverMajorTooLarge(String),
    #[error("cuda-version {0:?} is not of the form MAJOR.MINOR, e.g. 13.0")]
    CudaVersion(String),
}

impl SimError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        SimError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
