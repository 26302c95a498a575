//! `gpuops mig`: MIG partitioning from mig-parted configs — validate, plan, apply, assert, export,
//! checkpoint, restore.

use crate::gpu_source::{self, GpuArgs};
use crate::output::{self, Format};
use anyhow::{Result, bail};
use clap::Subcommand;
use gpuops_mig::apply as plan;
use gpuops_mig::config::MigPartedConfig;
use gpuops_mig::workload;
use gpuops_migexec::{self as exec, Options};
use std::path::PathBuf;
use std::process::ExitCode;

/// Partition GPUs with MIG from the mig-parted configs you already have, with exact placements and
/// minimal disruption (only instances that must change are destroyed).
///
/// Examples:
///   gpuops mig validate -f mig-config.yaml --gpu H100-SXM5-80GB
///   gpuops mig apply -f mig-config.yaml -c all-1g.10gb --dry-run --simulate dgx-h100
///   gpuops mig apply -f mig-config.yaml -c mixed-inference --sim-state /tmp/node1
///   gpuops mig assert -f mig-config.yaml -c mixed-inference --sim-state /tmp/node1
///   gpuops mig export --sim-state /tmp/node1
///   gpuops mig plan --demand "12x 10GiB, 3x 40GiB" --gpus H100-SXM5-80GB
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Args)]
struct ConfigArgs {
    /// mig-parted config file (`version: v1`, or a ConfigMap holding `config.yaml`, alone or among
    /// other manifests); `-` reads stdin.
    #[arg(
        short = 'f',
        long = "config-file",
        env = "MIG_PARTED_CONFIG_FILE",
        value_name = "FILE"
    )]
    file: String,
    /// In a file of several YAML documents (e.g. NVIDIA's mig-manager manifests), the ConfigMap
    /// to take the config from (default: the only one holding a mig-parted config).
    #[arg(long, value_name = "NAME")]
    configmap: Option<String>,
}

#[derive(Debug, clap::Args)]
struct SelectedConfig {
    #[command(flatten)]
    config: ConfigArgs,
    /// The named config to use (a key of `mig-configs`).
    #[arg(
        short = 'c',
        long = "selected-config",
        env = "MIG_PARTED_SELECTED_CONFIG",
        value_name = "NAME"
    )]
    name: String,
}

#[derive(Debug, clap::Args)]
struct CheckpointArg {
    /// Checkpoint file (default: mig-checkpoint.json in the simulator state, else
    /// /var/lib/gpuops/mig-checkpoint.json).
    #[arg(long, env = "GPUOPS_MIG_CHECKPOINT", value_name = "FILE")]
    checkpoint: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Check a config offline against the GPU catalog: syntax, profile names, counts and placements.
    Validate {
        #[command(flatten)]
        config: ConfigArgs,
        /// Only this named config (default: all).
        #[arg(short = 'c', long = "selected-config", value_name = "NAME")]
        name: Option<String>,
        /// Check against this GPU model (default: the models the device-filters name, else every
        /// MIG-capable model, reporting where each config fits).
        #[arg(long, value_name = "MODEL")]
        gpu: Option<String>,
    },
    /// Apply a named config to this node's GPUs.
    Apply {
        #[command(flatten)]
        selected: SelectedConfig,
        #[command(flatten)]
        gpus: GpuArgs,
        #[command(flatten)]
        checkpoint: CheckpointArg,
        /// mig-parted hooks file (apply-start, pre-apply-mode, pre-apply-config, apply-exit).
        #[arg(
            short = 'k',
            long = "hooks-file",
            env = "MIG_PARTED_HOOKS_FILE",
            value_name = "FILE"
        )]
        hooks: Option<PathBuf>,
        /// Only change MIG mode, not the instances.
        #[arg(long)]
        mode_only: bool,
        /// Show the plan and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Destroy MIG devices even when processes run in them (the driver may still refuse).
        #[arg(long)]
        force: bool,
        #[cfg(feature = "test-hooks")]
        #[command(flatten)]
        test_hooks: TestHooks,
    },
    /// Exit 0 if the node already has the named config, 1 (with the differences) if not.
    Assert {
        #[command(flatten)]
        selected: SelectedConfig,
        #[command(flatten)]
        gpus: GpuArgs,
        /// Only compare MIG mode.
        #[arg(long)]
        mode_only: bool,
        /// Only check that the config is valid for this node's GPUs.
        #[arg(long)]
        valid_config: bool,
    },
    /// Print the node's current MIG state as a mig-parted config named `current`.
    Export {
        #[command(flatten)]
        gpus: GpuArgs,
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = ExportFormat::Yaml)]
        output: ExportFormat,
    },
    /// Save the node's current MIG state to the checkpoint file.
    Checkpoint {
        #[command(flatten)]
        gpus: GpuArgs,
        #[command(flatten)]
        checkpoint: CheckpointArg,
    },
    /// Put the GPUs back exactly as the checkpoint recorded them (after a failed or unwanted apply).
    Restore {
        #[command(flatten)]
        gpus: GpuArgs,
        #[command(flatten)]
        checkpoint: CheckpointArg,
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        force: bool,
    },
    /// Find the fewest GPUs and their MIG layouts for a workload mix; prints a mig-parted config and
    /// the nvidia.com/mig.config label values.
    Plan {
        /// Demand: counts per profile or per memory size, e.g. "12x 10GiB, 3x 40GiB" or "7x 1g.10gb".
        #[arg(long)]
        demand: String,
        /// GPU models to use, optionally with counts: "H100-SXM5-80GB" or "8x H100-SXM5-80GB, 4x A100-SXM4-40GB"
        /// (default: the models of this node's GPUs).
        #[arg(long = "gpus", value_name = "FLEET")]
        fleet: Option<String>,
        #[command(flatten)]
        source: GpuArgs,
        /// Output: a table with the config, or just the mig-parted YAML.
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ExportFormat {
    Yaml,
    Json,
}

fn read_config(args: &ConfigArgs) -> Result<MigPartedConfig> {
    Ok(exec::read_config(&args.file, args.configmap.as_deref())?)
}

fn checkpoint_path(arg: &CheckpointArg, opened: &gpu_source::Opened) -> PathBuf {
    exec::checkpoint_path(
        arg.checkpoint.as_deref(),
        opened.simulation.as_ref().map(|s| s.state_dir.as_path()),
    )
}

/// Test-only knobs for interrupted applies (cargo feature `test-hooks`; not in the shipped binary).
#[cfg(feature = "test-hooks")]
#[derive(Debug, Clone, clap::Args)]
pub struct TestHooks {
    /// Pause between driver calls (the environment variable reaches the applies the agent's MIG
    /// flow starts).
    #[arg(long, hide = true, env = "GPUOPS_MIG_STEP_DELAY", value_parser = super::parse_duration)]
    step_delay: Option<std::time::Duration>,
    /// Exit as if killed after this many driver changes.
    #[arg(long, hide = true)]
    crash_after: Option<usize>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    match args.action {
        Action::Validate { config, name, gpu } => {
            validate(&config, name.as_deref(), gpu.as_deref())
        }
        Action::Apply {
            selected,
            gpus,
            checkpoint,
            hooks,
            mode_only,
            dry_run,
            force,
            #[cfg(feature = "test-hooks")]
            test_hooks,
        } => {
            #[cfg(feature = "test-hooks")]
            let (step_delay, crash_after) = (test_hooks.step_delay, test_hooks.crash_after);
            #[cfg(not(feature = "test-hooks"))]
            let (step_delay, crash_after) = (None, None);
            let cfg = read_config(&selected.config)?;
            let named = cfg.get(&selected.name)?;
            let hooks = hooks.as_deref().map(exec::read_hooks).transpose()?;
            let opened = gpu_source::open(&gpus)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let targets = plan::targets_of(named, &inv)?;
            let plans = plan::plan_node(&inv, &targets)?;
            print!("{}", plan::render(&plans));
            if dry_run {
                println!("dry run: nothing changed");
                return Ok(ExitCode::SUCCESS);
            }
            let path = checkpoint_path(&checkpoint, &opened);
            let opts = Options {
                config_name: selected.name.clone(),
                config_file: selected.config.file.clone(),
                hooks,
                mode_only,
                force,
                step_delay,
                crash_after,
                cancel: None,
            };
            let gpus_changed: Vec<u32> = plans.iter().map(|p| p.gpu).collect();
            apply_with_checkpoint(
                &opened,
                &plans,
                &opts,
                &path,
                &gpus_changed,
                &inv,
                Some(selected.name.clone()),
                |inv| Ok(plan::differing(&plan::plan_node(inv, &targets)?, mode_only).is_empty()),
            )
        }
        Action::Assert {
            selected,
            gpus,
            mode_only,
            valid_config,
        } => {
            let cfg = read_config(&selected.config)?;
            let named = cfg.get(&selected.name)?;
            let opened = gpu_source::open(&gpus)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let targets = plan::targets_of(named, &inv)?;
            let plans = plan::plan_node(&inv, &targets)?;
            if valid_config {
                println!("config {} is valid for this node's GPUs", selected.name);
                return Ok(ExitCode::SUCCESS);
            }
            let differing = plan::differing(&plans, mode_only);
            if differing.is_empty() {
                println!("MIG config {} is applied", selected.name);
                Ok(ExitCode::SUCCESS)
            } else {
                println!("MIG config {} is NOT applied:", selected.name);
                print!("{}", plan::render(&differing));
                Ok(ExitCode::FAILURE)
            }
        }
        Action::Export { gpus, output } => {
            let opened = gpu_source::open(&gpus)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let value = plan::current_config(&inv);
            match output {
                ExportFormat::Yaml => print!("{}", serde_saphyr::to_string(&value)?),
                ExportFormat::Json => println!("{}", serde_json::to_string_pretty(&value)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Checkpoint { gpus, checkpoint } => {
            let opened = gpu_source::open(&gpus)?;
            let path = checkpoint_path(&checkpoint, &opened);
            let count = exec::checkpoint_all(&opened.gpus, &path)?;
            println!("checkpoint of {count} GPUs written to {}", path.display());
            Ok(ExitCode::SUCCESS)
        }
        Action::Restore {
            gpus,
            checkpoint,
            dry_run,
            force,
        } => {
            let opened = gpu_source::open(&gpus)?;
            let path = checkpoint_path(&checkpoint, &opened);
            let (saved, plans) = exec::restore_plan(&opened.gpus, &path)?;
            print!("{}", plan::render(&plans));
            if dry_run {
                println!("dry run: nothing changed");
                return Ok(ExitCode::SUCCESS);
            }
            let outcome = exec::restore(&opened.gpus, &plans, saved, &path, force, |p| {
                println!("{p}")
            })?;
            println!(
                "restored {} GPUs from {} ({} changes through the driver)",
                plans.len(),
                path.display(),
                outcome.nvml_changes
            );
            report_pending(&outcome)
        }
        Action::Plan {
            demand,
            fleet,
            source,
            output,
        } => plan(&demand, fleet.as_deref(), &source, output),
    }
}

/// Checkpoint, apply, mark the checkpoint done, and check the node converged (gpuops-migexec),
/// saying what happens as it does.
#[allow(clippy::too_many_arguments)]
fn apply_with_checkpoint(
    opened: &gpu_source::Opened,
    plans: &[plan::GpuPlan],
    opts: &Options,
    path: &std::path::Path,
    gpus_changed: &[u32],
    inv: &gpuops_inventory::Inventory,
    applying: Option<String>,
    converged: impl Fn(&gpuops_inventory::Inventory) -> Result<bool, exec::ExecError>,
) -> Result<ExitCode> {
    let mut nothing = false;
    let outcome = exec::apply_checkpointed(
        &opened.gpus,
        plans,
        opts,
        path,
        gpus_changed,
        inv,
        applying,
        converged,
        |p| {
            nothing |= matches!(p, exec::Progress::NothingToDo { .. });
            println!("{p}");
        },
    )?;
    if nothing {
        return Ok(ExitCode::SUCCESS);
    }
    report_pending(&outcome)
}

fn report_pending(outcome: &exec::Outcome) -> Result<ExitCode> {
    let pending = outcome.pending_messages();
    for line in &pending {
        eprintln!("{line}");
    }
    Ok(ExitCode::from(if pending.is_empty() { 0 } else { 2 }))
}

fn validate(args: &ConfigArgs, only: Option<&str>, gpu: Option<&str>) -> Result<ExitCode> {
    let cfg = read_config(args)?;
    let forced = gpu.map(gpuops_catalog::lookup).transpose()?;
    if let Some(m) = forced
        && !m.mig_capable()
    {
        bail!("{} does not support MIG", m.key);
    }
    let tally = gpuops_mig::validate::check(&cfg, only, forced)?;
    print!("{}", tally.text());
    Ok(if tally.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn plan(demand: &str, fleet: Option<&str>, source: &GpuArgs, format: Format) -> Result<ExitCode> {
    let demand = workload::parse_demand(demand)?;
    let offers = match fleet {
        Some(text) => workload::parse_fleet(text)?,
        None => {
            if source.simulate.is_none() && source.sim_state.is_none() && source.nvml_lib.is_none()
            {
                // Reading the node's GPUs is the default; say what is missing if there are none.
                eprintln!("no --gpus given: planning for this node's GPU models");
            }
            let opened = gpu_source::open(source)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let text = plan::fleet_of(&inv);
            if text.is_empty() {
                bail!("this node has no GPU model gpuops knows; pass --gpus MODEL");
            }
            workload::parse_fleet(&text)?
        }
    };
    let plan = workload::plan_fleet(&demand, &offers)?;
    match format {
        Format::Table | Format::Wide => print!("{}", plan.text()),
        Format::Yaml => print!("{}", plan.mig_parted_yaml()),
        Format::Json => {
            let v: serde_json::Value = serde_saphyr::from_str(&plan.mig_parted_yaml())?;
            print!("{}", output::json(&v)?);
        }
    }
    Ok(if plan.unmet.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
