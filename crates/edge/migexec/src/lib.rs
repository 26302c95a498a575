//! gpuops-migexec: carries out gpuops-mig's MIG plans on a node through gpuops-nvml, with
//! mig-parted's hooks at the same points, and keeps the checkpoint file.
//!
//! The plan (what to keep, destroy and create) is pure and lives in gpuops-mig; this crate is the
//! I/O half: driver calls in a safe order (leftover GPU instances first, destroys before creates,
//! explicit placements), hook processes, and the checkpoint written atomically and durably. Both
//! `gpuops mig apply` and the agent call it.

pub mod dynamic;

use gpuops_mig::apply::GpuPlan;
use gpuops_mig::checkpoint::Checkpoint;
use gpuops_mig::hooks::{HookPoint, Hooks};
use gpuops_mig::layout::{Instance, gi_profile_of};
use gpuops_nvml::{Gpus, MigModeChange, NvmlError, PlacementSlot};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// What a failure asks of whoever drives the apply (the agent's MIG flow decides by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    /// May pass on its own (a busy device, a hook, a file being replaced, an apply cut short):
    /// try again later.
    Retryable,
    /// The config, the hooks file or what they ask of this node's GPUs is wrong: the same
    /// config fails the same way, only a new one can succeed.
    Config,
    /// The GPU or its driver refuses or is gone (lost GPU, driver not loaded, reset required):
    /// someone has to look at the node; trying again soon only repeats the failure.
    Hardware,
}

/// Failures while applying.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(
        "refusing to destroy MIG devices that have running processes (use --force to try anyway):\n  {}",
        .0.join("\n  ")
    )]
    Busy(Vec<String>),
    #[error("{what}: {source}")]
    Nvml {
        what: String,
        #[source]
        source: NvmlError,
    },
    #[error("{0}")]
    Profile(String),
    #[error("running {point} hook {command:?}: {source}")]
    HookStart {
        point: &'static str,
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{point} hook {command:?} failed ({status})")]
    HookFailed {
        point: &'static str,
        command: String,
        status: String,
    },
    #[error("{0}")]
    Checkpoint(String),
    #[error("reading checkpoint {path}: {source}")]
    ReadCheckpoint {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    WriteCheckpoint(#[from] gpuops_atomicfile::AtomicWriteError),
    /// A config, hooks file or node's targets gpuops-mig rejected.
    #[error(transparent)]
    Mig(#[from] gpuops_mig::MigError),
    #[error(transparent)]
    Snapshot(NvmlError),
    #[error("the apply finished but the node does not match config {0}; run apply again")]
    NotConverged(String),
    #[error("no checkpoint at {0}; `gpuops mig apply` writes one before changing anything")]
    NoCheckpoint(PathBuf),
    // The io error is in the message and not a source, so `{:#}` does not say it twice.
    #[error("reading {what} {path}: {error}")]
    Read {
        what: &'static str,
        path: String,
        error: std::io::Error,
    },
    /// [`Options::cancel`] was set: the apply stopped before its next driver call.
    #[error(
        "stopped before its next driver call after {changes} changes (cancelled); the checkpoint lets the next apply finish"
    )]
    Cancelled { changes: usize },
    /// The driver took a MIG mode change but applies it only after a GPU reset.
    #[error("GPU {gpu}: the MIG mode change is pending until the GPU is reset ({reason})")]
    ModePending { gpu: u32, reason: String },
}

impl ExecError {
    /// Whether to retry, wait for a new config, or report the node.
    pub fn category(&self) -> Category {
        match self {
            ExecError::Nvml { source, .. } | ExecError::Snapshot(source) => nvml_category(source),
            ExecError::Profile(_)
            | ExecError::Mig(_)
            | ExecError::HookStart { .. }
            | ExecError::NoCheckpoint(_) => Category::Config,
            // A checkpoint that does not parse will not parse next time either, and no config
            // changes it: someone has to look at the node.
            ExecError::Checkpoint(_) | ExecError::ModePending { .. } => Category::Hardware,
            ExecError::Busy(_)
            | ExecError::HookFailed { .. }
            | ExecError::ReadCheckpoint { .. }
            | ExecError::WriteCheckpoint(_)
            | ExecError::NotConverged(_)
            | ExecError::Read { .. }
            | ExecError::Cancelled { .. } => Category::Retryable,
        }
    }
}

/// What a driver error asks for: a busy or slow driver may answer next time; a lost GPU, a
/// driver that is not there or refuses outright will not.
fn nvml_category(e: &NvmlError) -> Category {
    use gpuops_nvml::raw_codes::{IN_USE, INSUFFICIENT_RESOURCES, NOT_FOUND, TIMEOUT};
    match e {
        NvmlError::GpuLost { .. }
        | NvmlError::LibraryNotLoaded { .. }
        | NvmlError::Init { .. }
        | NvmlError::NotSupported { .. } => Category::Hardware,
        NvmlError::Call { code, .. } => match code {
            // In use by a client, timed out, a slot an interrupted apply still holds, an
            // instance gone between listing and destroying it.
            Some(IN_USE | TIMEOUT | INSUFFICIENT_RESOURCES | NOT_FOUND) | None => {
                Category::Retryable
            }
            // Permissions, driver not loaded, reset required, argument mismatches: the node's
            // driver, not the moment.
            Some(_) => Category::Hardware,
        },
    }
}

/// Reads a mig-parted config file (`-`: stdin), taking the ConfigMap named `configmap` when the
/// file holds several.
pub fn read_config(
    file: &str,
    configmap: Option<&str>,
) -> Result<gpuops_mig::config::MigPartedConfig, ExecError> {
    let read = |error| ExecError::Read {
        what: "config file",
        path: file.to_string(),
        error,
    };
    // Size and encoding are checked while reading, so a huge or UTF-16 file gets its message.
    if file == "-" {
        return Ok(gpuops_mig::config::read_selecting(
            std::io::stdin().lock(),
            "<stdin>",
            configmap,
        )?);
    }
    let opened = std::fs::File::open(file).map_err(read)?;
    Ok(gpuops_mig::config::read_selecting(opened, file, configmap)?)
}

/// Reads and checks a mig-parted hooks file.
pub fn read_hooks(path: &Path) -> Result<Hooks, ExecError> {
    let origin = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|error| ExecError::Read {
        what: "hooks file",
        path: origin.clone(),
        error,
    })?;
    Ok(Hooks::read(file, &origin)?)
}

fn nvml(what: String) -> impl FnOnce(NvmlError) -> ExecError {
    move |source| ExecError::Nvml { what, source }
}

/// How to apply.
#[derive(Debug, Default)]
pub struct Options {
    pub config_name: String,
    pub config_file: String,
    pub hooks: Option<Hooks>,
    pub mode_only: bool,
    pub force: bool,
    /// Pause between driver calls (tests use it to kill an apply half-way).
    pub step_delay: Option<Duration>,
    /// Exit abruptly (as if killed) before the change after this many (fault injection for tests;
    /// it ends the whole process, so a long-running caller such as the agent never sets it).
    pub crash_after: Option<usize>,
    /// Set by the caller to stop the apply before its next driver call ([`ExecError::Cancelled`]):
    /// a driver call cannot be interrupted, but nothing new is started once the caller gave up.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl Options {
    fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
    }
}

/// What an apply did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub nvml_changes: usize,
    /// GPUs whose mode change waits for a reset.
    pub pending_reset: Vec<(u32, String)>,
}

/// Applies the plans. Never resets a GPU; reports mode changes that need one.
pub fn execute(
    gpus: &Gpus,
    plans: &[GpuPlan],
    opts: &Options,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Outcome, ExecError> {
    let blocked: Vec<String> = plans
        .iter()
        .flat_map(|p| {
            p.blocking
                .iter()
                .map(move |(pid, inst)| format!("GPU {} {inst}: pid {pid}", p.gpu))
        })
        .collect();
    if !blocked.is_empty() && !opts.force {
        return Err(ExecError::Busy(blocked));
    }
    run_hooks(opts, HookPoint::ApplyStart)?;
    let result = apply_steps(gpus, plans, opts, progress);
    let exit = run_hooks(opts, HookPoint::ApplyExit);
    let outcome = result?;
    exit?;
    Ok(outcome)
}

fn apply_steps(
    gpus: &Gpus,
    plans: &[GpuPlan],
    opts: &Options,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Outcome, ExecError> {
    let mut outcome = Outcome::default();
    // Before every driver change: the test knobs, and the caller's cancel (checked again after
    // the delay, so a cancel during it stops the change that was about to follow).
    let step = |outcome: &mut Outcome| -> Result<(), ExecError> {
        if opts.crash_after.is_some_and(|n| outcome.nvml_changes >= n) {
            eprintln!(
                "crashing on purpose after {} changes (--crash-after)",
                outcome.nvml_changes
            );
            std::process::exit(137);
        }
        let stop = |outcome: &Outcome| ExecError::Cancelled {
            changes: outcome.nvml_changes,
        };
        if opts.cancelled() {
            return Err(stop(outcome));
        }
        if let Some(d) = opts.step_delay {
            std::thread::sleep(d);
            if opts.cancelled() {
                return Err(stop(outcome));
            }
        }
        outcome.nvml_changes += 1;
        Ok(())
    };
    if plans.iter().any(GpuPlan::mode_changes) {
        run_hooks(opts, HookPoint::PreApplyMode)?;
        for p in plans.iter().filter(|p| p.mode_changes()) {
            if !p.mode_to {
                // Instances must go before MIG can be turned off.
                remove_leftovers(gpus, p.gpu, &mut || step(&mut outcome), progress)?;
                destroy(gpus, p, &p.before.instances, &mut || step(&mut outcome))?;
            }
            step(&mut outcome)?;
            match gpus
                .set_mig_mode(p.gpu, p.mode_to)
                .map_err(nvml(format!("setting MIG mode on GPU {}", p.gpu)))?
            {
                MigModeChange::Active => {}
                MigModeChange::NeedsReset { reason } => outcome.pending_reset.push((p.gpu, reason)),
            }
        }
    }
    if opts.mode_only {
        return Ok(outcome);
    }
    let changing: Vec<&GpuPlan> = plans
        .iter()
        .filter(|p| {
            p.mode_to
                && p.layout_changes()
                && !outcome.pending_reset.iter().any(|(g, _)| *g == p.gpu)
        })
        .collect();
    if !changing.is_empty() {
        run_hooks(opts, HookPoint::PreApplyConfig)?;
    }
    for p in changing {
        remove_leftovers(gpus, p.gpu, &mut || step(&mut outcome), progress)?;
        destroy(gpus, p, &p.plan.destroy, &mut || step(&mut outcome))?;
        for inst in &p.plan.create {
            create(gpus, p, inst, &mut || step(&mut outcome))?;
        }
    }
    Ok(outcome)
}

/// Destroys GPU instances an interrupted apply left without a compute instance.
fn remove_leftovers(
    gpus: &Gpus,
    gpu: u32,
    step: &mut dyn FnMut() -> Result<(), ExecError>,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(), ExecError> {
    if !gpus
        .mig_mode_enabled(gpu)
        .map_err(nvml(format!("reading the MIG mode of GPU {gpu}")))?
    {
        return Ok(());
    }
    for gi in gpus
        .empty_gpu_instances(gpu)
        .map_err(nvml(format!("listing the GPU instances of GPU {gpu}")))?
    {
        progress(Progress::RemovingLeftover {
            gpu,
            gpu_instance: gi,
        });
        step()?;
        gpus.destroy_gpu_instance(gpu, gi).map_err(nvml(format!(
            "removing leftover GPU instance {gi} on GPU {gpu}"
        )))?;
    }
    Ok(())
}

fn destroy(
    gpus: &Gpus,
    p: &GpuPlan,
    instances: &[Instance],
    step: &mut dyn FnMut() -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    if instances.is_empty() {
        return Ok(());
    }
    // Ids are read fresh: a previous, interrupted apply may have left the GPU in between.
    let devices = gpus
        .mig_devices_of(p.gpu)
        .map_err(nvml(format!("listing the MIG devices of GPU {}", p.gpu)))?;
    let mut gone: Vec<(u32, u32)> = Vec::new();
    for inst in instances {
        let Some(dev) = devices
            .iter()
            .find(|m| m.ci_profile == inst.profile && m.placement_start == inst.start)
        else {
            continue;
        };
        step()?;
        gpus.destroy_compute_instance(p.gpu, dev.gi_id, dev.ci_id)
            .map_err(nvml(format!("destroying {inst} on GPU {}", p.gpu)))?;
        gone.push((dev.gi_id, dev.ci_id));
        // A GPU instance can go only once all its compute instances have.
        let left = devices
            .iter()
            .filter(|m| m.gi_id == dev.gi_id && !gone.contains(&(m.gi_id, m.ci_id)))
            .count();
        if left == 0 {
            step()?;
            gpus.destroy_gpu_instance(p.gpu, dev.gi_id)
                .map_err(nvml(format!(
                    "destroying the GPU instance of {inst} on GPU {}",
                    p.gpu
                )))?;
        }
    }
    Ok(())
}

fn create(
    gpus: &Gpus,
    p: &GpuPlan,
    inst: &Instance,
    step: &mut dyn FnMut() -> Result<(), ExecError>,
) -> Result<(), ExecError> {
    let gi = gi_profile_of(p.model, &inst.profile).ok_or_else(|| {
        ExecError::Profile(format!(
            "{} is not a MIG profile of {}",
            inst.profile, p.model.key
        ))
    })?;
    let name: gpuops_catalog::ProfileName = inst
        .profile
        .parse()
        .map_err(|e| ExecError::Profile(format!("MIG device name {}: {e}", inst.profile)))?;
    let ci_slices = name.compute_slices_or_gpu();
    let ci_profile =
        gpuops_catalog::nvml_enum::ci_profile_for_slices(ci_slices).ok_or_else(|| {
            ExecError::Profile(format!(
                "{}: no compute-instance profile has {ci_slices} slices",
                inst.profile
            ))
        })?;
    step()?;
    let gi_id = gpus
        .create_gpu_instance(
            p.gpu,
            gi.nvml_id,
            Some(PlacementSlot {
                start: inst.start,
                size: gi.memory_slices,
            }),
        )
        .map_err(nvml(format!("creating {inst} on GPU {}", p.gpu)))?;
    step()?;
    gpus.create_compute_instance(p.gpu, gi_id, ci_profile, None)
        .map_err(nvml(format!(
            "creating the compute instance of {inst} on GPU {}",
            p.gpu
        )))?;
    Ok(())
}

fn run_hooks(opts: &Options, point: HookPoint) -> Result<(), ExecError> {
    let Some(hooks) = &opts.hooks else {
        return Ok(());
    };
    for hook in hooks.at(point) {
        let mut cmd = std::process::Command::new(&hook.command);
        cmd.args(&hook.args)
            .envs(&hook.envs)
            .env("MIG_PARTED_CONFIG_FILE", &opts.config_file)
            .env("MIG_PARTED_SELECTED_CONFIG", &opts.config_name)
            .env("MIG_PARTED_HOOK", point.name());
        if let Some(dir) = &hook.workdir {
            cmd.current_dir(dir);
        }
        let status = cmd.status().map_err(|source| ExecError::HookStart {
            point: point.name(),
            command: hook.command.clone(),
            source,
        })?;
        if !status.success() {
            return Err(ExecError::HookFailed {
                point: point.name(),
                command: hook.command.clone(),
                status: status.to_string(),
            });
        }
    }
    Ok(())
}

impl std::fmt::Display for Progress<'_> {
    /// What `gpuops mig apply` prints when it happens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::Interrupted {
                applying,
                checkpoint,
            } => write!(
                f,
                "an earlier apply of {} was interrupted; converging (checkpoint {} keeps the layout from before it)",
                applying.unwrap_or("?"),
                checkpoint.display()
            ),
            Progress::NothingToDo { config } => {
                write!(f, "nothing to do: the node already has config {config}")
            }
            Progress::Applied { config, changes } => {
                write!(
                    f,
                    "applied config {config} ({changes} changes through the driver)"
                )
            }
            Progress::RemovingLeftover { gpu, gpu_instance } => write!(
                f,
                "GPU {gpu}: removing GPU instance {gpu_instance}, left without a compute instance by an interrupted apply"
            ),
        }
    }
}

impl Outcome {
    /// One line per GPU whose MIG mode change waits for a reset, saying what to do.
    pub fn pending_messages(&self) -> Vec<String> {
        self.pending_reset
            .iter()
            .map(|(gpu, reason)| {
                format!(
                    "GPU {gpu}: the MIG mode change is pending a GPU reset ({reason}); gpuops never resets GPUs itself: \
                     stop the GPU's clients (e.g. nvidia-persistenced, nvidia_drm) and reset it, or reboot the node, then apply again"
                )
            })
            .collect()
    }
}

/// What [`apply_checkpointed`] is doing, for the caller to tell the user as it happens.
#[derive(Debug)]
pub enum Progress<'a> {
    /// An earlier apply died half-way; its checkpoint keeps the layout from before it.
    Interrupted {
        applying: Option<&'a str>,
        checkpoint: &'a Path,
    },
    /// The node already has the config: hooks run, nothing else changes.
    NothingToDo { config: &'a str },
    /// Applied and converged.
    Applied { config: &'a str, changes: usize },
    /// A GPU instance an interrupted apply left without a compute instance is being destroyed.
    RemovingLeftover { gpu: u32, gpu_instance: u32 },
}

/// Checkpoint, apply, mark the checkpoint done, and check the node converged (`converged` on a
/// fresh snapshot; not checked while a mode change waits for a reset).
#[allow(clippy::too_many_arguments)]
pub fn apply_checkpointed(
    gpus: &Gpus,
    plans: &[GpuPlan],
    opts: &Options,
    path: &Path,
    gpus_changed: &[u32],
    inv: &gpuops_inventory::Inventory,
    applying: Option<String>,
    converged: impl Fn(&gpuops_inventory::Inventory) -> Result<bool, ExecError>,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Outcome, ExecError> {
    let nothing_to_do = plans
        .iter()
        .all(|p| !p.mode_changes() && !p.layout_changes());
    let previous = read_checkpoint(path)?;
    let base = match previous {
        Some(c) if c.interrupted() => {
            progress(Progress::Interrupted {
                applying: c.applying.as_deref(),
                checkpoint: path,
            });
            c
        }
        _ if nothing_to_do => {
            progress(Progress::NothingToDo {
                config: &opts.config_name,
            });
            return execute(gpus, &[], opts, &mut progress).map(|_| Outcome::default());
        }
        _ => {
            let c = gpuops_mig::apply::checkpoint_of(inv, gpus_changed, applying);
            write_checkpoint(path, &c)?;
            c
        }
    };
    let outcome = execute(gpus, plans, opts, &mut progress)?;
    let after = gpus
        .snapshot_with(gpuops_nvml::Scope::Mig)
        .map_err(ExecError::Snapshot)?;
    if outcome.pending_reset.is_empty() && !converged(&after)? {
        return Err(ExecError::NotConverged(opts.config_name.clone()));
    }
    let mut done = base;
    done.applying = None;
    write_checkpoint(path, &done)?;
    progress(Progress::Applied {
        config: &opts.config_name,
        changes: outcome.nvml_changes,
    });
    Ok(outcome)
}

/// A named config of a config file, planned against the GPUs as they are now: what
/// `gpuops mig apply` and `assert` start from, in the same order (config, name, hooks, GPUs).
#[derive(Debug)]
pub struct Planned {
    pub hooks: Option<Hooks>,
    pub inventory: gpuops_inventory::Inventory,
    pub targets: Vec<gpuops_mig::apply::Target>,
    pub plans: Vec<GpuPlan>,
}

/// Reads config `name` of `file` (and the hooks file) and plans it on the GPUs.
pub fn plan_named(
    gpus: &Gpus,
    file: &str,
    name: &str,
    hooks: Option<&Path>,
) -> Result<Planned, ExecError> {
    let cfg = read_config(file, None)?;
    let named = cfg.get(name)?;
    let hooks = hooks.map(read_hooks).transpose()?;
    let inventory = gpus
        .snapshot_with(gpuops_nvml::Scope::Mig)
        .map_err(ExecError::Snapshot)?;
    let targets = gpuops_mig::apply::targets_of(named, &inventory)?;
    let plans = gpuops_mig::apply::plan_node(&inventory, &targets)?;
    Ok(Planned {
        hooks,
        inventory,
        targets,
        plans,
    })
}

impl Planned {
    /// Whether the GPUs already have the config (`gpuops mig assert` passes).
    pub fn applied(&self) -> bool {
        gpuops_mig::apply::differing(&self.plans, false).is_empty()
    }

    /// Applies the plan as `gpuops mig apply` does (checkpoint, apply, converged check), with
    /// `opts`' hooks taken from the plan.
    pub fn apply(
        self,
        gpus: &Gpus,
        mut opts: Options,
        checkpoint: &Path,
        progress: impl FnMut(Progress<'_>),
    ) -> Result<Outcome, ExecError> {
        opts.hooks = self.hooks;
        let gpus_changed: Vec<u32> = self.plans.iter().map(|p| p.gpu).collect();
        let mode_only = opts.mode_only;
        let targets = self.targets;
        apply_checkpointed(
            gpus,
            &self.plans,
            &opts,
            checkpoint,
            &gpus_changed,
            &self.inventory,
            Some(opts.config_name.clone()),
            |inv| {
                let plans = gpuops_mig::apply::plan_node(inv, &targets)?;
                Ok(gpuops_mig::apply::differing(&plans, mode_only).is_empty())
            },
            progress,
        )
    }
}

/// The checkpoint file: the one given, else `mig-checkpoint.json` in the simulator state, else
/// /var/lib/gpuops/mig-checkpoint.json.
pub fn checkpoint_path(given: Option<&Path>, sim_state: Option<&Path>) -> PathBuf {
    match (given, sim_state) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(dir)) => dir.join("mig-checkpoint.json"),
        (None, None) => PathBuf::from("/var/lib/gpuops/mig-checkpoint.json"),
    }
}

/// Reads a checkpoint file; `Ok(None)` when there is none.
pub fn read_checkpoint(path: &Path) -> Result<Option<Checkpoint>, ExecError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Checkpoint::parse(&text, &path.display().to_string())
            .map(Some)
            .map_err(|e| ExecError::Checkpoint(e.to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ExecError::ReadCheckpoint {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes a checkpoint atomically and durably, so a crash or power cut never leaves half of one.
pub fn write_checkpoint(path: &Path, checkpoint: &Checkpoint) -> Result<(), ExecError> {
    let text = serde_json::to_string_pretty(checkpoint)
        .map_err(|e| ExecError::Checkpoint(e.to_string()))?;
    gpuops_atomicfile::write(path, text)?;
    Ok(())
}

/// Writes a checkpoint of every MIG-capable GPU's current layout; returns how many GPUs.
pub fn checkpoint_all(gpus: &Gpus, path: &Path) -> Result<usize, ExecError> {
    let inv = gpus
        .snapshot_with(gpuops_nvml::Scope::Mig)
        .map_err(ExecError::Snapshot)?;
    let all: Vec<u32> = inv
        .gpus
        .iter()
        .filter(|g| g.mig.capable)
        .map(|g| g.index)
        .collect();
    write_checkpoint(path, &gpuops_mig::apply::checkpoint_of(&inv, &all, None))?;
    Ok(all.len())
}

/// The checkpoint at `path` and the plans that bring the node back to it.
pub fn restore_plan(gpus: &Gpus, path: &Path) -> Result<(Checkpoint, Vec<GpuPlan>), ExecError> {
    let saved = read_checkpoint(path)?.ok_or_else(|| ExecError::NoCheckpoint(path.into()))?;
    let inv = gpus
        .snapshot_with(gpuops_nvml::Scope::Mig)
        .map_err(ExecError::Snapshot)?;
    let targets = gpuops_mig::apply::restore_targets(&inv, &saved)?;
    let plans = gpuops_mig::apply::plan_node(&inv, &targets)?;
    Ok((saved, plans))
}

/// Carries out [`restore_plan`]'s plans and marks the checkpoint done.
pub fn restore(
    gpus: &Gpus,
    plans: &[GpuPlan],
    mut saved: Checkpoint,
    path: &Path,
    force: bool,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Outcome, ExecError> {
    let opts = Options {
        config_name: "restore".into(),
        config_file: path.display().to_string(),
        force,
        ..Options::default()
    };
    let outcome = execute(gpus, plans, &opts, &mut progress)?;
    saved.applying = None;
    write_checkpoint(path, &saved)?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use gpuops_mig::checkpoint::GpuCheckpoint;
    use gpuops_mig::layout::Layout;

    #[test]
    fn unreadable_or_bad_config_and_hooks_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.yaml");
        let e = read_config(missing.to_str().unwrap(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("reading config file {}: ", missing.display())),
            "{e}"
        );
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "version: v1\nmig-configs:\n  x: 3\n").unwrap();
        let e = read_config(bad.to_str().unwrap(), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.yaml:3"), "{e}");
        let e = read_hooks(&missing).unwrap_err().to_string();
        assert!(e.starts_with("reading hooks file "), "{e}");
        std::fs::write(&bad, "version: v1\nhooks: 7\n").unwrap();
        let e = read_hooks(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("hooks file {}", bad.display())),
            "{e}"
        );
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            version: Checkpoint::VERSION.into(),
            applying: Some("all-1g.10gb".into()),
            gpus: vec![GpuCheckpoint {
                index: 0,
                uuid: "GPU-0".into(),
                mig_enabled: true,
                layout: Layout::new(vec![Instance::new("3g.40gb", 4)]),
            }],
        }
    }

    #[test]
    fn a_checkpoint_survives_the_round_trip_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/mig-checkpoint.json");
        assert!(read_checkpoint(&path).unwrap().is_none());
        write_checkpoint(&path, &checkpoint()).unwrap();
        let back = read_checkpoint(&path).unwrap().unwrap();
        assert_eq!(back.applying.as_deref(), Some("all-1g.10gb"));
        assert_eq!(back.gpus[0].layout, checkpoint().gpus[0].layout);
    }

    #[test]
    fn each_failure_says_whether_to_retry_wait_for_a_new_config_or_report_the_node() {
        let call = |code| NvmlError::Call {
            call: "nvmlDeviceCreateGpuInstance",
            gpu: Some(0),
            reason: "x".into(),
            code,
        };
        let nvml = |source| ExecError::Nvml {
            what: "creating 1g.10gb@0 on GPU 0".into(),
            source,
        };
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let cases = [
            (
                ExecError::Busy(vec!["GPU 0 1g.10gb@0: pid 7".into()]),
                Category::Retryable,
            ),
            (
                nvml(call(Some(gpuops_nvml::raw_codes::IN_USE))),
                Category::Retryable,
            ),
            (
                nvml(call(Some(gpuops_nvml::raw_codes::INSUFFICIENT_RESOURCES))),
                Category::Retryable,
            ),
            (nvml(call(None)), Category::Retryable),
            (nvml(call(Some(4))), Category::Hardware),
            (
                nvml(NvmlError::GpuLost { gpu: Some(0) }),
                Category::Hardware,
            ),
            (
                ExecError::Snapshot(NvmlError::Init {
                    path: "libnvidia-ml.so.1".into(),
                    reason: "driver not loaded".into(),
                }),
                Category::Hardware,
            ),
            (
                ExecError::Mig(gpuops_mig::MigError::UnknownConfig {
                    name: "x".into(),
                    known: vec![],
                }),
                Category::Config,
            ),
            (ExecError::Profile("9g.90gb".into()), Category::Config),
            (
                ExecError::HookStart {
                    point: "apply-start",
                    command: "/nope".into(),
                    source: io(),
                },
                Category::Config,
            ),
            (
                ExecError::HookFailed {
                    point: "apply-start",
                    command: "/bin/false".into(),
                    status: "exit status: 1".into(),
                },
                Category::Retryable,
            ),
            (ExecError::Checkpoint("bad json".into()), Category::Hardware),
            (ExecError::NotConverged("c".into()), Category::Retryable),
            (
                ExecError::Read {
                    what: "config file",
                    path: "/etc/mig.yaml".into(),
                    error: io(),
                },
                Category::Retryable,
            ),
            (ExecError::Cancelled { changes: 3 }, Category::Retryable),
        ];
        for (e, want) in cases {
            assert_eq!(e.category(), want, "{e}");
        }
    }

    #[test]
    fn a_corrupt_checkpoint_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mig-checkpoint.json");
        std::fs::write(&path, "{\"version\": ").unwrap();
        let err = read_checkpoint(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}
