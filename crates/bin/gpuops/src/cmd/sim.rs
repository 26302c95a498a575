//! `gpuops sim`: create a simulated GPU node and inject faults and load into it.

use crate::gpu_source::now_ms;
use anyhow::{Context, Result, bail};
use clap::Subcommand;
use gpuops_sim::control::LoadChange;
use gpuops_sim::{Fleet, SimError, SimProcess, SimState, Store};
use std::path::PathBuf;
use std::process::ExitCode;

/// Drive the simulated NVIDIA driver: create a node, then inject XIDs, lost GPUs, load and processes.
///
/// A running `gpuops agent --simulate FLEET --sim-state DIR` (or anything loading libnvml_sim.so with
/// GPUOPS_NVML_SIM_STATE=DIR) sees every change on its next NVML call.
///
/// Examples:
///   gpuops sim init --fleet dgx-h100 --state /tmp/node1
///   gpuops sim xid --state /tmp/node1 --gpu 3 --xid 48
///   gpuops sim lost --state /tmp/node1 --gpu 5
///   gpuops sim load --state /tmp/node1 --gpu all --util 90 --power 650
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Args)]
struct StateArg {
    /// Simulator state directory.
    #[arg(long, value_name = "DIR", env = "GPUOPS_NVML_SIM_STATE")]
    state: PathBuf,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Create (or replace) a simulated node from a fleet.
    Init {
        #[command(flatten)]
        state: StateArg,
        /// Built-in fleet name or fleet file.
        #[arg(long, value_name = "FLEET")]
        fleet: String,
    },
    /// Give the simulated node device nodes (/dev/nvidia*, made again for every new MIG device),
    /// /proc/driver/nvidia-caps/mig-minors and placeholder driver files under DIR, for the
    /// agent's CDI spec and a container runtime to inject (docs/simulator.md).
    DevNodes {
        #[command(flatten)]
        state: StateArg,
    },
    /// List the built-in fleets and show the fleet-file format.
    Fleets,
    /// Show the simulated node's state.
    Show {
        #[command(flatten)]
        state: StateArg,
    },
    /// Raise an XID on a GPU (or on one of its MIG devices with --gi/--ci).
    Xid {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
        /// The XID number, e.g. 48 (double-bit ECC) or 94 (contained ECC).
        #[arg(long)]
        xid: u64,
        /// GPU instance id the XID is attributed to.
        #[arg(long)]
        gi: Option<u32>,
        /// Compute instance id (needs --gi).
        #[arg(long)]
        ci: Option<u32>,
    },
    /// Make a GPU fall off the bus: every NVML call on it then fails with GPU_IS_LOST.
    Lost {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
    },
    /// Reset a GPU: back on the bus, processes and MIG instances gone, MIG mode kept.
    Reset {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
    },
    /// Make a client hold a GPU (as nvidia-persistenced or nvidia_drm do), so MIG mode changes stay
    /// pending until `gpuops sim reset`; `--release` lets go.
    Hold {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
        #[arg(long)]
        release: bool,
    },
    /// Set utilization, memory use, power and temperature of one GPU or all.
    Load {
        #[command(flatten)]
        state: StateArg,
        /// GPU index, or `all`.
        #[arg(long)]
        gpu: String,
        /// GPU utilization, percent.
        #[arg(long)]
        util: Option<u32>,
        /// Memory-controller utilization, percent.
        #[arg(long)]
        mem_util: Option<u32>,
        /// Framebuffer in use, MiB.
        #[arg(long)]
        memory_used: Option<u64>,
        /// Power draw, watts.
        #[arg(long)]
        power: Option<u32>,
        /// GPU temperature, Celsius.
        #[arg(long)]
        temp: Option<u32>,
    },
    /// Start a fake process on a GPU (or MIG device), or clear all of a GPU's processes.
    Process {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
        #[arg(long, required_unless_present = "clear")]
        pid: Option<u32>,
        /// Memory it uses, MiB.
        #[arg(long, default_value_t = 1024)]
        memory: u64,
        #[arg(long)]
        gi: Option<u32>,
        #[arg(long)]
        ci: Option<u32>,
        /// Remove every process on the GPU instead.
        #[arg(long, conflicts_with = "pid")]
        clear: bool,
    },
    /// Hang the driver: every NVML call (of the agent, `gpuops mig`, anything loading the simulated
    /// library) blocks until `--clear`, as when the driver is stuck in the kernel.
    HangDriver {
        #[command(flatten)]
        state: StateArg,
        /// Let the blocked calls return and new ones answer again.
        #[arg(long)]
        clear: bool,
    },
    /// Set row-remapping counters (DCGM_FI_DEV_*_REMAPPED_ROWS, ROW_REMAP_FAILURE).
    Remap {
        #[command(flatten)]
        state: StateArg,
        #[arg(long)]
        gpu: u32,
        #[arg(long, default_value_t = 0)]
        correctable: u64,
        #[arg(long, default_value_t = 0)]
        uncorrectable: u64,
        #[arg(long)]
        pending: bool,
        #[arg(long)]
        failure: bool,
    },
}

fn change(
    state: &StateArg,
    what: impl FnOnce(&mut SimState) -> Result<(), SimError>,
) -> Result<()> {
    Store::new(&state.state)
        .update(what)
        .with_context(|| format!("simulator state in {}", state.state.display()))??;
    Ok(())
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.action {
        Action::Init { state, fleet } => {
            let f = Fleet::resolve(&fleet)?;
            let s = SimState::from_fleet(&f, now_ms())?;
            Store::create(&state.state, &s)?;
            println!(
                "simulated node {} with {} GPUs ({}) in {}\nuse it with: GPUOPS_NVML_SIM_STATE={} gpuops agent, or --sim-state {}",
                s.hostname,
                s.gpus.len(),
                s.summary(),
                state.state.display(),
                state.state.display(),
                state.state.display()
            );
        }
        Action::DevNodes { state } => {
            let s = Store::new(&state.state).load()?;
            let nodes = gpuops_sim::devnodes::create(&state.state, &s)?;
            println!(
                "device nodes in {dir}/dev, MIG capability minors in {dir}/proc, placeholder driver files in {dir}/driver",
                dir = state.state.display()
            );
            if nodes == gpuops_sim::devnodes::NodeKind::RegularFiles {
                println!(
                    "the device nodes are regular files (mknod not permitted): CDI runtimes will not inject them"
                );
            }
        }
        Action::Fleets => {
            print!("{}", gpuops_sim::render::fleets()?);
        }
        Action::Show { state } => {
            let s = Store::new(&state.state).load()?;
            print!("{}", gpuops_sim::render::show(&s));
        }
        Action::Xid {
            state,
            gpu,
            xid,
            gi,
            ci,
        } => {
            change(&state, |s| s.inject_xid(gpu, xid, gi, ci))?;
            let info = gpuops_catalog::xid::describe(xid);
            println!("XID {xid} raised on GPU {gpu}: {}", info.meaning);
        }
        Action::Lost { state, gpu } => {
            change(&state, |s| s.set_lost(gpu, true))?;
            println!("GPU {gpu} fell off the bus");
        }
        Action::Reset { state, gpu } => {
            change(&state, |s| s.reset(gpu))?;
            println!("GPU {gpu} reset");
        }
        Action::Hold {
            state,
            gpu,
            release,
        } => {
            change(&state, |s| s.set_held(gpu, !release))?;
            println!(
                "GPU {gpu} {}",
                if release {
                    "released"
                } else {
                    "held: MIG mode changes now need a reset"
                }
            );
        }
        Action::Load {
            state,
            gpu,
            util,
            mem_util,
            memory_used,
            power,
            temp,
        } => {
            let load = LoadChange {
                gpu_util_pct: util,
                mem_util_pct: mem_util,
                memory_used_mib: memory_used,
                power_mw: power.map(|w| w.saturating_mul(1000)),
                temperature_c: temp,
            };
            if load == LoadChange::default() {
                bail!(
                    "nothing to change: give at least one of --util, --mem-util, --memory-used, --power, --temp"
                );
            }
            let now = now_ms();
            change(&state, |s| s.set_load_on(&gpu, load, now))?;
            println!("load set on GPU {gpu}");
        }
        Action::Process {
            state,
            gpu,
            pid,
            memory,
            gi,
            ci,
            clear,
        } => {
            if clear {
                change(&state, |s| s.clear_processes(gpu))?;
                println!("processes on GPU {gpu} cleared");
            } else if let Some(pid) = pid {
                let process = SimProcess {
                    pid,
                    used_memory_mib: memory,
                    gi_id: gi,
                    ci_id: ci,
                };
                change(&state, |s| s.add_process(gpu, process))?;
                println!("process {pid} started on GPU {gpu} using {memory} MiB");
            }
        }
        Action::HangDriver { state, clear } => {
            change(&state, |s| {
                s.set_driver_hung(!clear);
                Ok(())
            })?;
            println!(
                "{}",
                if clear {
                    "driver answers again"
                } else {
                    "driver hung: NVML calls block until `gpuops sim hang-driver --clear`"
                }
            );
        }
        Action::Remap {
            state,
            gpu,
            correctable,
            uncorrectable,
            pending,
            failure,
        } => {
            change(&state, |s| {
                s.set_remapped_rows(gpu, correctable, uncorrectable, pending, failure)
            })?;
            println!("row-remapping counters set on GPU {gpu}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
