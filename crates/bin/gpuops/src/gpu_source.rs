//! Where a command gets its GPUs: the real driver, or the simulated one (`--simulate FLEET`).

use anyhow::Result;
use gpuops_nvml::Library;
use std::path::PathBuf;

pub use gpuops_gpus::{Opened, Simulation, describe, now_ms};

/// The flags every command that reads GPUs takes.
#[derive(Debug, Clone, clap::Args)]
pub struct GpuArgs {
    /// Use the simulated NVIDIA driver with this fleet instead of a real GPU: a built-in fleet
    /// (dgx-h100, dgx-a100, hgx-h200, dgx-b200, h100-nvl-x2, l4x4) or a fleet file (see `gpuops sim fleets`).
    #[arg(long, value_name = "FLEET")]
    pub simulate: Option<String>,
    /// Simulator state directory. With --simulate it is (re)created there and kept, so
    /// `gpuops sim ... --state DIR` can inject faults while this runs; alone, attach to an existing one.
    #[arg(long, value_name = "DIR", env = "GPUOPS_NVML_SIM_STATE")]
    pub sim_state: Option<PathBuf>,
    /// NVML library to load instead of the driver's libnvidia-ml.so.1 (when simulating: the
    /// simulator library, found next to this binary by default).
    #[arg(long, value_name = "PATH", env = "GPUOPS_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Where the host's sysfs is mounted, for the GPUs' PCI class (nvidia.com/gpu.mode) on drivers
    /// older than R535, which lack nvmlDeviceGetPciInfoExt.
    #[arg(long, value_name = "DIR", env = "GPUOPS_SYSFS_ROOT", default_value = gpuops_nvml::DEFAULT_SYSFS_ROOT)]
    pub sysfs_root: PathBuf,
}

impl GpuArgs {
    /// The library's description of these flags.
    pub fn source(&self) -> gpuops_gpus::GpuSource {
        gpuops_gpus::GpuSource {
            simulate: self.simulate.clone(),
            sim_state: self.sim_state.clone(),
            nvml_lib: self.nvml_lib.clone(),
            sysfs_root: self.sysfs_root.clone(),
        }
    }
}

/// Opens the GPUs the flags name. Must run before any thread is started (it may set the simulator's
/// environment variable).
pub fn open(args: &GpuArgs) -> Result<Opened> {
    Ok(gpuops_gpus::open(&args.source())?)
}

/// The library the flags name and the simulation they set up, without loading anything yet.
pub fn prepare(args: &GpuArgs) -> Result<(Library, Option<Simulation>)> {
    Ok(gpuops_gpus::prepare(&args.source())?)
}
