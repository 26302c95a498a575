//! The only code that talks to NVML: turns the driver into an inventory snapshot and applies actions.
//!
//! Uses nvml-wrapper where it covers a call and nvml-wrapper-sys (through [`raw`]) where it does
//! not: GPU/compute instance creation, listing and info, placements, and event data with MIG ids.
//! Point it at `libnvidia-ml.so.1` on a GPU node, or at the `nvml-sim` cdylib anywhere else.

mod error;
mod events;
mod gpm;
mod mig;
mod raw;
mod snapshot;

pub use error::{NvmlError, raw_codes};
pub use events::{GpuEvent, XidWatcher};
pub use mig::{GiProfileInfo, MigModeChange, PlacementSlot};
pub use snapshot::Scope;

use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Where sysfs is read by default.
pub const DEFAULT_SYSFS_ROOT: &str = "/sys";

/// Where the NVML library comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Library {
    /// The driver's `libnvidia-ml.so.1`, found by the dynamic loader.
    System,
    /// A library at this path (the simulator, or a driver in a non-standard root).
    Path(PathBuf),
}

impl Library {
    /// How the library is named in messages.
    pub fn describe(&self) -> String {
        match self {
            Library::System => "libnvidia-ml.so.1".into(),
            Library::Path(p) => p.display().to_string(),
        }
    }
}

/// An initialised NVML: the node's GPUs.
pub struct Gpus {
    nvml: Nvml,
    library: Library,
    /// Identity of each GPU as last read, so a GPU that falls off the bus is still named.
    last_seen: Mutex<HashMap<u32, (String, String)>>,
    /// GI profiles per GPU: immutable for the lifetime of a MIG mode (nvml.h), so read once.
    gi_profiles: Mutex<HashMap<u32, Vec<GiProfileInfo>>>,
    /// Where sysfs is mounted (`/sys`; a host mount in a container), for the PCI class on drivers
    /// without `nvmlDeviceGetPciInfoExt`.
    sysfs_root: PathBuf,
    /// The previous snapshot's GPM samples (activity is the difference to the next).
    gpm: Mutex<gpm::GpmState>,
}

impl Drop for Gpus {
    fn drop(&mut self) {
        // Samples are driver buffers: give them back before `nvml` shuts the library down.
        if let Ok(mut state) = self.gpm.lock() {
            state.free_all(&self.nvml);
        }
    }
}

impl std::fmt::Debug for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpus")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl Gpus {
    /// Loads and initialises NVML.
    pub fn open(library: Library) -> Result<Gpus, NvmlError> {
        let described = library.describe();
        let nvml = match &library {
            Library::System => Nvml::init(),
            Library::Path(path) => {
                check_library_file(path)?;
                Nvml::builder().lib_path(path.as_os_str()).init()
            }
        }
        .map_err(|e| error::init_error(&described, e))?;
        Ok(Gpus {
            nvml,
            library,
            last_seen: Mutex::new(HashMap::new()),
            gi_profiles: Mutex::new(HashMap::new()),
            sysfs_root: PathBuf::from(DEFAULT_SYSFS_ROOT),
            gpm: Mutex::new(gpm::GpmState::default()),
        })
    }

    /// Reads sysfs under `root` instead of `/sys` (e.g. a host's sysfs mounted into a container).
    pub fn with_sysfs_root(mut self, root: impl Into<PathBuf>) -> Gpus {
        self.sysfs_root = root.into();
        self
    }

    /// The library this was loaded from.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// Number of GPUs the driver reports (lost ones included).
    pub fn count(&self) -> Result<u32, NvmlError> {
        self.nvml
            .device_count()
            .map_err(|e| error::call("nvmlDeviceGetCount", None, e))
    }
}

fn check_library_file(path: &Path) -> Result<(), NvmlError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(NvmlError::LibraryNotLoaded {
            path: path.display().to_string(),
            reason: "not a file".into(),
        }),
        Err(e) => Err(NvmlError::LibraryNotLoaded {
            path: path.display().to_string(),
            reason: e.to_string(),
        }),
    }
}

/// Where the driver's NVML is looked for: `libnvidia-ml.so.1` under each driver root (a
/// container mounts the host's driver there, e.g. CONTAINER_DRIVER_ROOT=/driver-root), then the
/// dynamic loader's search path.
pub fn driver_libraries(roots: &[&str]) -> Vec<Library> {
    const DIRS: [&str; 4] = [
        "usr/lib64",
        "usr/lib/x86_64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "lib64",
    ];
    let mut out = Vec::new();
    for root in roots.iter().filter(|r| !r.is_empty() && **r != "/") {
        for dir in DIRS {
            // Listed even when absent now: a driver container may install it later.
            let candidate = Library::Path(Path::new(root).join(dir).join("libnvidia-ml.so.1"));
            if !out.contains(&candidate) {
                out.push(candidate);
            }
        }
    }
    out.push(Library::System);
    out
}

/// Points the simulated driver at a state directory: sets `GPUOPS_NVML_SIM_STATE` for this process.
///
/// Call before any thread is started (the binary does so first thing in `main`): changing the
/// environment while another thread reads it is undefined behaviour on glibc.
pub fn use_simulator_state(dir: &Path) {
    // SAFETY: documented precondition: the process is still single-threaded, so no other thread can
    // be reading the environment concurrently.
    unsafe { std::env::set_var(gpuops_sim_env::STATE_DIR_ENV, dir) };
}

/// The simulator's environment contract, repeated here so the product does not link the simulator.
pub mod gpuops_sim_env {
    /// Must equal `gpuops_sim::STATE_DIR_ENV` (checked by a test).
    pub const STATE_DIR_ENV: &str = "GPUOPS_NVML_SIM_STATE";
}

#[cfg(test)]
mod tests {
    #[test]
    fn simulator_env_contract_matches_the_simulator() {
        assert_eq!(
            super::gpuops_sim_env::STATE_DIR_ENV,
            gpuops_sim::STATE_DIR_ENV
        );
    }
}
