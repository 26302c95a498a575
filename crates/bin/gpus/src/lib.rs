//! Opens the GPUs a command names: the driver's NVML, or the simulated driver (`--simulate FLEET`).

use gpuops_nvml::{Gpus, Library, NvmlError};
use gpuops_sim::{Fleet, SimError, SimState, Store};
use std::path::{Path, PathBuf};

/// File name of the simulated driver cargo builds next to the binary.
pub const SIM_LIB: &str = "libnvml_sim.so";

type Result<T, E = GpusError> = std::result::Result<T, E>;

/// Why the GPUs could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum GpusError {
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("attaching to the simulator state in {}", dir.display())]
    Attach {
        dir: PathBuf,
        #[source]
        source: SimError,
    },
    #[error("creating a temporary simulator state directory")]
    TempDir(#[source] std::io::Error),
    #[error("locating the gpuops binary")]
    CurrentExe(#[source] std::io::Error),
    #[error(
        "the simulated driver {SIM_LIB} is not next to {exe} (looked in {looked_in}); build it with \
         `cargo build -p nvml-sim`, or point GPUOPS_NVML_SIM_LIB / --nvml-lib at it"
    )]
    NoSimLibrary { exe: String, looked_in: String },
}

/// Where a command's GPUs come from, as its flags say (`--simulate`, `--sim-state`, `--nvml-lib`,
/// `--sysfs-root`).
#[derive(Debug, Clone, Default)]
pub struct GpuSource {
    /// A built-in fleet or a fleet file to simulate.
    pub simulate: Option<String>,
    /// The simulator state directory (created with `simulate`, else attached to).
    pub sim_state: Option<PathBuf>,
    /// The NVML library to load instead of the driver's.
    pub nvml_lib: Option<PathBuf>,
    /// Where the host's sysfs is mounted.
    pub sysfs_root: PathBuf,
}

/// A simulated node this process is using.
#[derive(Debug)]
pub struct Simulation {
    pub fleet: Option<String>,
    pub state_dir: PathBuf,
    /// Holds a temporary state directory until exit.
    _temp: Option<tempfile::TempDir>,
}

/// Opened GPUs plus what they are.
#[derive(Debug)]
pub struct Opened {
    pub gpus: Gpus,
    pub simulation: Option<Simulation>,
}

/// One line saying where GPUs opened from `library` come from.
pub fn describe(library: &Library, simulation: Option<&Simulation>) -> String {
    match simulation {
        Some(sim) => format!(
            "simulated driver {} ({}state {})",
            library.describe(),
            sim.fleet
                .as_ref()
                .map(|f| format!("fleet {f}, "))
                .unwrap_or_default(),
            sim.state_dir.display()
        ),
        None => format!("NVIDIA driver ({})", library.describe()),
    }
}

/// Opens the GPUs the flags name. Must run before any thread is started (it may set the simulator's
/// environment variable).
pub fn open(args: &GpuSource) -> Result<Opened> {
    let (library, simulation) = prepare(args)?;
    let gpus = Gpus::open(library)?.with_sysfs_root(&args.sysfs_root);
    Ok(Opened { gpus, simulation })
}

/// The library the flags name and the simulation they set up, without loading anything yet.
pub fn prepare(args: &GpuSource) -> Result<(Library, Option<Simulation>)> {
    let simulation = match (&args.simulate, &args.sim_state) {
        (Some(fleet_name), dir) => Some(create_simulation(fleet_name, dir.as_deref())?),
        (None, Some(dir)) => {
            Store::new(dir).load().map_err(|source| GpusError::Attach {
                dir: dir.clone(),
                source,
            })?;
            Some(Simulation {
                fleet: None,
                state_dir: dir.clone(),
                _temp: None,
            })
        }
        (None, None) => None,
    };
    let library = match (&args.nvml_lib, &simulation) {
        (Some(path), _) => Library::Path(path.clone()),
        (None, Some(_)) => Library::Path(find_sim_library()?),
        (None, None) => Library::System,
    };
    if let Some(sim) = &simulation {
        gpuops_nvml::use_simulator_state(&sim.state_dir);
    }
    Ok((library, simulation))
}

fn create_simulation(fleet_name: &str, dir: Option<&Path>) -> Result<Simulation> {
    let fleet = Fleet::resolve(fleet_name)?;
    let state = SimState::from_fleet(&fleet, now_ms())?;
    let (state_dir, temp) = match dir {
        Some(d) => (d.to_path_buf(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("gpuops-sim-")
                .tempdir()
                .map_err(GpusError::TempDir)?;
            (t.path().to_path_buf(), Some(t))
        }
    };
    Store::create(&state_dir, &state)?;
    Ok(Simulation {
        fleet: Some(fleet_name.to_string()),
        state_dir,
        _temp: temp,
    })
}

/// Finds `libnvml_sim.so`: `GPUOPS_NVML_SIM_LIB`, else next to this binary (cargo puts it in
/// `target/<profile>/deps/`), else `../lib/gpuops/` for installed layouts.
pub fn find_sim_library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GPUOPS_NVML_SIM_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(GpusError::CurrentExe)?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let candidates = [
        dir.join(SIM_LIB),
        dir.join("deps").join(SIM_LIB),
        dir.join("..").join(SIM_LIB),
        dir.join("../lib/gpuops").join(SIM_LIB),
    ];
    // Cargo refreshes deps/ on every build of the binary but the top-level copy only when the
    // simulator is built on its own, so the newest copy is the right one.
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .filter(|(_, p)| p.is_file())
        .max_by_key(|(modified, _)| *modified);
    if let Some((_, found)) = newest {
        return Ok(found.clone());
    }
    Err(GpusError::NoSimLibrary {
        exe: exe.display().to_string(),
        looked_in: candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
