//! `gpuops mig`: MIG partitioning from mig-parted configs — validate, plan, apply, assert, export,
//! checkpoint, restore.

use crate::gpu_source::{self, GpuArgs};
use crate::output::{self, Format};
use anyhow::{Context, Result, anyhow, bail};
use clap::Subcommand;
use gpuops_mig::apply::{self as plan, Target};
use gpuops_mig::config::{self, Devices, MigPartedConfig};
use gpuops_mig::hooks::Hooks;
use gpuops_mig::layout::describe_counts;
use gpuops_mig::{planner, select, workload};
use gpuops_migexec::{self as exec, Options};
use std::io::Read;
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
    let (text, origin) = if args.file == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the config from stdin")?;
        (text, "<stdin>".to_string())
    } else {
        let text = std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading config file {}", args.file))?;
        (text, args.file.clone())
    };
    Ok(config::parse_selecting(
        &text,
        &origin,
        args.configmap.as_deref(),
    )?)
}

/// What a named config asks of each GPU it selects on this node.
fn targets_of(
    named: &config::NamedConfig,
    inv: &gpuops_inventory::Inventory,
) -> Result<Vec<Target>> {
    Ok(select::select(named, &inv.gpus)?
        .into_iter()
        .map(|s| Target {
            gpu: s.gpu,
            mig_enabled: s.mig_enabled,
            wanted: s.mig_devices,
            exact: None,
        })
        .collect())
}

fn checkpoint_path(arg: &CheckpointArg, opened: &gpu_source::Opened) -> PathBuf {
    arg.checkpoint
        .clone()
        .unwrap_or_else(|| match &opened.simulation {
            Some(sim) => sim.state_dir.join("mig-checkpoint.json"),
            None => PathBuf::from("/var/lib/gpuops/mig-checkpoint.json"),
        })
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
            let hooks = match hooks {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("reading hooks file {}", path.display()))?;
                    Some(Hooks::parse(&text, &path.display().to_string())?)
                }
                None => None,
            };
            let opened = gpu_source::open(&gpus)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let targets = targets_of(named, &inv)?;
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
                |inv| {
                    let again = plan::plan_node(inv, &targets)?;
                    Ok(again
                        .iter()
                        .all(|p| !p.mode_changes() && (mode_only || !p.layout_changes())))
                },
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
            let targets = targets_of(named, &inv)?;
            let plans = plan::plan_node(&inv, &targets)?;
            if valid_config {
                println!("config {} is valid for this node's GPUs", selected.name);
                return Ok(ExitCode::SUCCESS);
            }
            let differing: Vec<_> = plans
                .iter()
                .filter(|p| p.mode_changes() || (!mode_only && p.layout_changes()))
                .cloned()
                .collect();
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
            let value = export(&inv);
            match output {
                ExportFormat::Yaml => print!("{}", serde_saphyr::to_string(&value)?),
                ExportFormat::Json => println!("{}", serde_json::to_string_pretty(&value)?),
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Checkpoint { gpus, checkpoint } => {
            let opened = gpu_source::open(&gpus)?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let path = checkpoint_path(&checkpoint, &opened);
            let all: Vec<u32> = inv
                .gpus
                .iter()
                .filter(|g| g.mig.capable)
                .map(|g| g.index)
                .collect();
            exec::write_checkpoint(&path, &plan::checkpoint_of(&inv, &all, None))?;
            println!(
                "checkpoint of {} GPUs written to {}",
                all.len(),
                path.display()
            );
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
            let saved = exec::read_checkpoint(&path)?.ok_or_else(|| {
                anyhow!(
                    "no checkpoint at {}; `gpuops mig apply` writes one before changing anything",
                    path.display()
                )
            })?;
            let inv = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
            let targets = plan::restore_targets(&inv, &saved)?;
            let plans = plan::plan_node(&inv, &targets)?;
            print!("{}", plan::render(&plans));
            if dry_run {
                println!("dry run: nothing changed");
                return Ok(ExitCode::SUCCESS);
            }
            let opts = Options {
                config_name: "restore".into(),
                config_file: path.display().to_string(),
                force,
                ..Options::default()
            };
            let outcome = exec::execute(&opened.gpus, &plans, &opts)?;
            let mut done = saved;
            done.applying = None;
            exec::write_checkpoint(&path, &done)?;
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

/// Checkpoint, apply, mark the checkpoint done, and check the node converged.
#[allow(clippy::too_many_arguments)]
fn apply_with_checkpoint(
    opened: &gpu_source::Opened,
    plans: &[plan::GpuPlan],
    opts: &Options,
    path: &std::path::Path,
    gpus_changed: &[u32],
    inv: &gpuops_inventory::Inventory,
    applying: Option<String>,
    converged: impl Fn(&gpuops_inventory::Inventory) -> Result<bool>,
) -> Result<ExitCode> {
    let nothing_to_do = plans
        .iter()
        .all(|p| !p.mode_changes() && !p.layout_changes());
    let previous = exec::read_checkpoint(path)?;
    let base = match previous {
        // An earlier apply died half-way: its checkpoint still holds the layout from before it.
        Some(c) if c.interrupted() => {
            println!(
                "an earlier apply of {} was interrupted; converging (checkpoint {} keeps the layout from before it)",
                c.applying.as_deref().unwrap_or("?"),
                path.display()
            );
            c
        }
        _ if nothing_to_do => {
            println!(
                "nothing to do: the node already has config {}",
                opts.config_name
            );
            exec::execute(&opened.gpus, &[], opts)?;
            return Ok(ExitCode::SUCCESS);
        }
        _ => {
            let c = plan::checkpoint_of(inv, gpus_changed, applying);
            exec::write_checkpoint(path, &c)?;
            c
        }
    };
    let outcome = exec::execute(&opened.gpus, plans, opts)?;
    let after = opened.gpus.snapshot_with(gpuops_nvml::Scope::Mig)?;
    if outcome.pending_reset.is_empty() && !converged(&after)? {
        bail!(
            "the apply finished but the node does not match config {}; run apply again",
            opts.config_name
        );
    }
    let mut done = base;
    done.applying = None;
    exec::write_checkpoint(path, &done)?;
    println!(
        "applied config {} ({} changes through the driver)",
        opts.config_name, outcome.nvml_changes
    );
    report_pending(&outcome)
}

fn report_pending(outcome: &exec::Outcome) -> Result<ExitCode> {
    if outcome.pending_reset.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for (gpu, reason) in &outcome.pending_reset {
        eprintln!(
            "GPU {gpu}: the MIG mode change is pending a GPU reset ({reason}); gpuops never resets GPUs itself: \
             stop the GPU's clients (e.g. nvidia-persistenced, nvidia_drm) and reset it, or reboot the node, then apply again"
        );
    }
    Ok(ExitCode::from(2))
}

fn validate(args: &ConfigArgs, only: Option<&str>, gpu: Option<&str>) -> Result<ExitCode> {
    let cfg = read_config(args)?;
    let forced = gpu.map(gpuops_catalog::lookup).transpose()?;
    if let Some(m) = forced
        && !m.mig_capable()
    {
        bail!("{} does not support MIG", m.key);
    }
    let names: Vec<String> = match only {
        Some(n) => vec![cfg.get(n)?.name.clone()],
        None => cfg.names().into_iter().map(str::to_string).collect(),
    };
    let mut tally = Tally::default();
    for name in names {
        let named = cfg.get(&name)?;
        for (i, entry) in named.entries.iter().enumerate() {
            let at = format!("{name} entry {} (line {})", i + 1, entry.line);
            if let Some(m) = forced
                && !filter_selects(&entry.filters, m)
            {
                let filters: Vec<String> = entry.filters.iter().map(ToString::to_string).collect();
                println!(
                    "skip  {at}: device-filter {} does not select {}",
                    filters.join(", "),
                    m.key
                );
                tally.skipped += 1;
                continue;
            }
            if !entry.mig_enabled {
                println!("ok    {at}: MIG disabled");
                tally.ok += 1;
                continue;
            }
            let unknown: Vec<String> = entry
                .filters
                .iter()
                .filter(|f| gpuops_catalog::by_pci_device_id((f.device >> 16) as u16).is_none())
                .map(ToString::to_string)
                .collect();
            if !unknown.is_empty() && forced.is_none() {
                println!(
                    "note  {at}: device-filter {} names no GPU model gpuops knows; not checked for it",
                    unknown.join(", ")
                );
            }
            let filtered: Vec<&'static gpuops_catalog::GpuModel> = entry
                .filters
                .iter()
                .filter_map(|f| gpuops_catalog::by_pci_device_id((f.device >> 16) as u16))
                .collect();
            let (models, strict): (Vec<&'static gpuops_catalog::GpuModel>, bool) = match forced {
                Some(m) => (vec![m], true),
                None if !filtered.is_empty() => (filtered, true),
                None => (
                    gpuops_catalog::models()
                        .iter()
                        .filter(|m| m.mig_capable())
                        .collect(),
                    false,
                ),
            };
            let devices = match &entry.devices {
                Devices::All => "all GPUs".to_string(),
                Devices::List(l) => format!("GPUs {l:?}"),
            };
            let wanted = describe_counts(&entry.mig_devices);
            let mut fits = Vec::new();
            let mut misfits = Vec::new();
            for m in models {
                match planner::check(m, &entry.mig_devices) {
                    Ok(_) => fits.push(m.key),
                    Err(e) => misfits.push(e.to_string()),
                }
            }
            if strict {
                for e in &misfits {
                    println!("FAIL  {at}: {e}");
                }
                if misfits.is_empty() {
                    println!("ok    {at}: {wanted} on {devices} ({})", fits.join(", "));
                    tally.ok += 1;
                } else {
                    tally.failed += 1;
                }
            } else if fits.is_empty() {
                println!("FAIL  {at}: {wanted} fits no MIG-capable GPU:");
                for e in &misfits {
                    println!("        {e}");
                }
                tally.failed += 1;
            } else {
                println!(
                    "ok    {at}: {wanted} fits {} (pass --gpu MODEL to check one model)",
                    fits.join(", ")
                );
                tally.ok += 1;
            }
        }
    }
    println!(
        "{} entries: {} ok, {} skipped (device-filter), {} failed",
        tally.ok + tally.skipped + tally.failed,
        tally.ok,
        tally.skipped,
        tally.failed
    );
    Ok(if tally.failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[derive(Default)]
struct Tally {
    ok: usize,
    skipped: usize,
    failed: usize,
}

/// Whether an entry's device-filter lets a GPU of this model through: no filter selects every
/// model; otherwise one of the filters must name one of the model's PCI device ids (a filter's
/// subsystem part depends on the board, so a device-id match is taken to select it).
fn filter_selects(filters: &[config::DeviceFilter], model: &gpuops_catalog::GpuModel) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| {
            f.device & 0xFFFF == 0x10DE && model.pci_device_ids.contains(&((f.device >> 16) as u16))
        })
}

/// The node's MIG state as a mig-parted config named `current`, grouping identical GPUs.
fn export(inv: &gpuops_inventory::Inventory) -> serde_json::Value {
    let mut entries: Vec<(Vec<u32>, bool, std::collections::BTreeMap<String, u32>)> = Vec::new();
    for g in inv.gpus.iter().filter(|g| g.mig.capable) {
        let counts = plan::current_layout(g).counts();
        let enabled = g.mig.current_enabled;
        match entries.last_mut() {
            Some((list, e, c)) if *e == enabled && *c == counts => list.push(g.index),
            _ => entries.push((vec![g.index], enabled, counts)),
        }
    }
    let list: Vec<serde_json::Value> = entries
        .into_iter()
        .map(|(devices, enabled, counts)| {
            let mut e = serde_json::json!({"devices": devices, "mig-enabled": enabled});
            if enabled {
                e["mig-devices"] = serde_json::json!(counts);
            }
            e
        })
        .collect();
    serde_json::json!({"version": "v1", "mig-configs": {"current": list}})
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
            let mut keys: Vec<String> = inv.gpus.iter().filter_map(|g| g.model.clone()).collect();
            keys.dedup();
            let text = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}x {k}",
                        inv.gpus
                            .iter()
                            .filter(|g| g.model.as_deref() == Some(k))
                            .count()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            if text.is_empty() {
                bail!("this node has no GPU model gpuops knows; pass --gpus MODEL");
            }
            workload::parse_fleet(&text)?
        }
    };
    let plan = workload::plan_fleet(&demand, &offers)?;
    match format {
        Format::Table | Format::Wide => {
            println!("{}", plan.summary());
            println!("mig-parted config:\n{}", plan.mig_parted_yaml());
            println!("node labels (nvidia.com/mig.config):");
            for (name, n) in plan.node_labels() {
                println!("  {n} GPU(s): nvidia.com/mig.config={name}");
            }
        }
        Format::Yaml => print!("{}", plan.mig_parted_yaml()),
        Format::Json => {
            let v: serde_json::Value = serde_saphyr::from_str(&plan.mig_parted_yaml())?;
            if let Some(text) = output::structured(&v, Format::Json)? {
                print!("{text}");
            }
        }
    }
    Ok(if plan.unmet.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
