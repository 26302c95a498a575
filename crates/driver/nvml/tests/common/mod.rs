//! Shared harness for the NVML layer's integration tests: a simulated node in a temporary state
//! directory, loaded through `nvml-sim` (the cdylib) exactly as a real `libnvidia-ml.so.1` would be.
//!
//! The cdylib keeps one driver per process, released when the last `Gpus` is dropped, and it reads
//! `GPUOPS_NVML_SIM_STATE` at `nvmlInit`. So every test that loads it runs under [`LOCK`]: set the
//! variable, open, run, drop, and only then let the next test in.

// Each test binary uses a different subset of the helpers.
#![allow(dead_code)]

use gpuops_nvml::{Gpus, Library, NvmlError};
use gpuops_sim::{Fleet, SimState, Store};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

static LOCK: Mutex<()> = Mutex::new(());

/// Serialises tests that touch the process-global simulated driver or the environment. A test that
/// panicked while holding the lock has already released its `Gpus` (drop runs on unwind), so a
/// poisoned lock is safe to take over.
pub fn serial() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The simulator cdylib cargo built next to this test binary (it is a dev-dependency).
pub fn sim_library() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    let name = format!(
        "{}nvml_sim{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let mut dirs = Vec::new();
    if let Some(dir) = exe.parent() {
        dirs.push(dir.to_path_buf());
        if let Some(parent) = dir.parent() {
            dirs.push(parent.to_path_buf());
            dirs.push(parent.join("deps"));
        }
    }
    dirs.iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the simulated NVML library {name} was not found in {dirs:?}; it is built by cargo \
                 because nvml-sim is a dev-dependency of gpuops-nvml: run `cargo test -p gpuops-nvml`"
            )
        })
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A freshly loaded driver for a built-in fleet.
pub fn fleet_state(fleet: &str) -> SimState {
    let fleet = Fleet::resolve(fleet).unwrap_or_else(|e| panic!("fleet {fleet}: {e}"));
    SimState::from_fleet(&fleet, now_ms()).expect("state from fleet")
}

/// A simulated node: its state directory and the store the tests inject faults through.
pub struct Sim {
    _dir: tempfile::TempDir,
    pub store: Store,
}

impl Sim {
    pub fn new(state: &SimState) -> Sim {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Store::create(dir.path().join("sim"), state).expect("create simulator state");
        Sim { _dir: dir, store }
    }

    pub fn fleet(fleet: &str) -> Sim {
        Sim::new(&fleet_state(fleet))
    }

    pub fn dir(&self) -> &Path {
        self.store.dir()
    }

    /// Changes the driver's state as `gpuops sim` would (from outside the library).
    pub fn apply<T>(
        &self,
        change: impl FnOnce(&mut SimState) -> Result<T, gpuops_sim::SimError>,
    ) -> T {
        self.store
            .update(change)
            .expect("update simulator state")
            .expect("simulator state change")
    }

    pub fn state(&self) -> SimState {
        self.store.load().expect("load simulator state")
    }
}

/// Points the simulator at `dir` (or unsets the variable). Callers hold [`serial`].
pub fn set_state_env(dir: Option<&Path>) {
    // SAFETY: every test that sets or reads this variable (through nvmlInit) holds `serial()`, and
    // the standard library serialises its own environment accesses from other threads.
    unsafe {
        match dir {
            Some(dir) => std::env::set_var(gpuops_sim::STATE_DIR_ENV, dir),
            None => std::env::remove_var(gpuops_sim::STATE_DIR_ENV),
        }
    }
}

/// Opens the simulator with its state in `dir` (or without the variable), under the caller's lock.
pub fn open_at(dir: Option<&Path>) -> Result<Gpus, NvmlError> {
    set_state_env(dir);
    Gpus::open(Library::Path(sim_library()))
}

/// Runs `body` with `Gpus` opened on `sim`, one test at a time; `Gpus` is dropped (nvmlShutdown)
/// before the next test may start.
pub fn with_gpus<R>(sim: &Sim, body: impl FnOnce(&Gpus) -> R) -> R {
    let _guard = serial();
    let gpus = open_at(Some(sim.dir())).unwrap_or_else(|e| panic!("opening the simulator: {e}"));
    let result = body(&gpus);
    drop(gpus);
    result
}

/// The same for a built-in fleet, handing the body the simulator too.
pub fn with_fleet<R>(fleet: &str, body: impl FnOnce(&Sim, &Gpus) -> R) -> R {
    let sim = Sim::fleet(fleet);
    with_gpus(&sim, |gpus| body(&sim, gpus))
}
