//! Applying MIG layouts to a node: plan every selected GPU first, checkpoint, then act through the
//! NVML layer with explicit placements, running mig-parted's hooks at the same points.

use anyhow::{Context, Result, anyhow, bail};
use gpuops_catalog::GpuModel;
use gpuops_inventory::{Gpu, Inventory};
use gpuops_mig::checkpoint::{Checkpoint, GpuCheckpoint};
use gpuops_mig::hooks::{HookPoint, Hooks};
use gpuops_mig::layout::{Instance, Layout, gi_profile_of, slot_map};
use gpuops_mig::planner::{self, Plan};
use gpuops_nvml::{Gpus, MigModeChange, PlacementSlot};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// What one GPU should become.
#[derive(Debug, Clone)]
pub struct Target {
    pub gpu: u32,
    pub mig_enabled: bool,
    /// Wanted MIG device counts (ignored when MIG is to be disabled).
    pub wanted: BTreeMap<String, u32>,
    /// An exact layout to restore instead of planning one from `wanted`.
    pub exact: Option<Layout>,
}

/// The plan for one GPU.
#[derive(Debug, Clone)]
pub struct GpuPlan {
    pub gpu: u32,
    pub uuid: String,
    pub model: &'static GpuModel,
    pub mode_from: bool,
    pub mode_to: bool,
    pub before: Layout,
    pub plan: Plan,
    /// Processes running in instances the plan destroys: (pid, instance).
    pub blocking: Vec<(u32, Instance)>,
}

impl GpuPlan {
    pub fn mode_changes(&self) -> bool {
        self.mode_from != self.mode_to
    }

    pub fn layout_changes(&self) -> bool {
        !self.plan.destroy.is_empty() || !self.plan.create.is_empty()
    }
}

/// The MIG devices a GPU has now, as a layout.
pub fn current_layout(gpu: &Gpu) -> Layout {
    Layout::new(
        gpu.mig_devices
            .iter()
            .map(|m| Instance::new(m.ci_profile.clone(), m.placement_start))
            .collect(),
    )
}

/// The change from `current` to exactly `target` (both valid layouts of one GPU).
pub fn exact_plan(current: &Layout, target: &Layout) -> Plan {
    let keep: Vec<Instance> = current
        .instances
        .iter()
        .filter(|i| target.instances.contains(i))
        .cloned()
        .collect();
    let destroy = current
        .instances
        .iter()
        .filter(|i| !keep.contains(i))
        .cloned()
        .collect();
    let create = target
        .instances
        .iter()
        .filter(|i| !keep.contains(i))
        .cloned()
        .collect();
    Plan {
        target: target.clone(),
        keep,
        destroy,
        create,
    }
}

/// Plans every target against the inventory; fails before anything is touched when one GPU cannot
/// take its layout.
pub fn plan_node(inv: &Inventory, targets: &[Target]) -> Result<Vec<GpuPlan>> {
    let mut plans = Vec::new();
    let mut problems = Vec::new();
    for t in targets {
        let gpu = inv
            .gpus
            .iter()
            .find(|g| g.index == t.gpu)
            .ok_or_else(|| anyhow!("GPU {} is not on this node", t.gpu))?;
        let model = match gpu
            .model
            .as_deref()
            .and_then(|m| gpuops_catalog::lookup(m).ok())
        {
            Some(m) if m.mig_capable() => m,
            Some(m) => {
                problems.push(format!("GPU {} ({}) does not support MIG", t.gpu, m.key));
                continue;
            }
            None => {
                problems.push(format!(
                    "GPU {} ({}) is not in the catalog, so its MIG placements are unknown; gpuops cannot plan it",
                    t.gpu, gpu.name
                ));
                continue;
            }
        };
        let before = current_layout(gpu);
        let result = match (&t.exact, t.mig_enabled) {
            (_, false) => Ok(exact_plan(&before, &Layout::default())),
            (Some(exact), true) => Ok(exact_plan(&before, exact)),
            (None, true) => planner::plan(model, &t.wanted, &before),
        };
        let plan = match result {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("GPU {}: {e}", t.gpu));
                continue;
            }
        };
        let blocking = plan
            .destroy
            .iter()
            .flat_map(|inst| {
                let gi_id = gpu
                    .mig_devices
                    .iter()
                    .find(|m| m.ci_profile == inst.profile && m.placement_start == inst.start)
                    .map(|m| m.gi_id);
                gpu.processes
                    .iter()
                    .filter(move |p| gi_id.is_some() && p.gi_id == gi_id)
                    .map(move |p| (p.pid, inst.clone()))
            })
            .collect();
        plans.push(GpuPlan {
            gpu: t.gpu,
            uuid: gpu.uuid.clone(),
            model,
            mode_from: gpu.mig.current_enabled,
            mode_to: t.mig_enabled,
            before,
            plan,
            blocking,
        });
    }
    if !problems.is_empty() {
        bail!("cannot apply:\n  {}", problems.join("\n  "));
    }
    Ok(plans)
}

/// The plan as people read it: per GPU, what changes, with slot maps before and after.
pub fn render(plans: &[GpuPlan]) -> String {
    let mut out = String::new();
    for p in plans {
        out.push_str(&format!("GPU {} ({}, {})\n", p.gpu, p.model.key, p.uuid));
        if p.mode_changes() {
            out.push_str(&format!(
                "  MIG mode: {} -> {}\n",
                if p.mode_from { "enabled" } else { "disabled" },
                if p.mode_to { "enabled" } else { "disabled" }
            ));
        }
        if !p.layout_changes() && !p.mode_changes() {
            out.push_str("  already as wanted: nothing to do\n");
            continue;
        }
        let list = |v: &[Instance]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        out.push_str(&format!("  keep:    {}\n", list(&p.plan.keep)));
        out.push_str(&format!("  destroy: {}\n", list(&p.plan.destroy)));
        out.push_str(&format!("  create:  {}\n", list(&p.plan.create)));
        if p.mode_to || p.mode_from {
            out.push_str(&indent(
                &format!("before\n{}", slot_map(p.model, &p.before)),
                2,
            ));
            out.push_str(&indent(
                &format!("after\n{}", slot_map(p.model, &p.plan.target)),
                2,
            ));
        }
        for (pid, inst) in &p.blocking {
            out.push_str(&format!(
                "  ! process {pid} runs in {inst}, which would be destroyed\n"
            ));
        }
    }
    out
}

fn indent(text: &str, n: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(n)))
        .collect()
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
    /// Exit abruptly (as if killed) before the change after this many (fault injection for tests).
    pub crash_after: Option<usize>,
}

/// What an apply did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub nvml_changes: usize,
    /// GPUs whose mode change waits for a reset.
    pub pending_reset: Vec<(u32, String)>,
}

/// Applies the plans. Never resets a GPU; reports mode changes that need one.
pub fn execute(gpus: &Gpus, plans: &[GpuPlan], opts: &Options) -> Result<Outcome> {
    let blocked: Vec<String> = plans
        .iter()
        .flat_map(|p| {
            p.blocking
                .iter()
                .map(move |(pid, inst)| format!("GPU {} {inst}: pid {pid}", p.gpu))
        })
        .collect();
    if !blocked.is_empty() && !opts.force {
        bail!(
            "refusing to destroy MIG devices that have running processes (use --force to try anyway):\n  {}",
            blocked.join("\n  ")
        );
    }
    run_hooks(opts, HookPoint::ApplyStart)?;
    let result = apply_steps(gpus, plans, opts);
    let exit = run_hooks(opts, HookPoint::ApplyExit);
    let outcome = result?;
    exit?;
    Ok(outcome)
}

fn apply_steps(gpus: &Gpus, plans: &[GpuPlan], opts: &Options) -> Result<Outcome> {
    let mut outcome = Outcome::default();
    let step = |outcome: &mut Outcome| {
        if opts.crash_after.is_some_and(|n| outcome.nvml_changes >= n) {
            eprintln!(
                "crashing on purpose after {} changes (--crash-after)",
                outcome.nvml_changes
            );
            std::process::exit(137);
        }
        outcome.nvml_changes += 1;
        if let Some(d) = opts.step_delay {
            std::thread::sleep(d);
        }
    };
    if plans.iter().any(GpuPlan::mode_changes) {
        run_hooks(opts, HookPoint::PreApplyMode)?;
        for p in plans.iter().filter(|p| p.mode_changes()) {
            if !p.mode_to {
                // Instances must go before MIG can be turned off.
                remove_leftovers(gpus, p.gpu, &mut || step(&mut outcome))?;
                destroy(gpus, p, &p.before.instances, &mut || step(&mut outcome))?;
            }
            step(&mut outcome);
            match gpus
                .set_mig_mode(p.gpu, p.mode_to)
                .with_context(|| format!("setting MIG mode on GPU {}", p.gpu))?
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
        remove_leftovers(gpus, p.gpu, &mut || step(&mut outcome))?;
        destroy(gpus, p, &p.plan.destroy, &mut || step(&mut outcome))?;
        for inst in &p.plan.create {
            create(gpus, p, inst, &mut || step(&mut outcome))?;
        }
    }
    Ok(outcome)
}

/// Destroys GPU instances an interrupted apply left without a compute instance.
fn remove_leftovers(gpus: &Gpus, gpu: u32, step: &mut dyn FnMut()) -> Result<()> {
    if !gpus.mig_mode_enabled(gpu)? {
        return Ok(());
    }
    for gi in gpus.empty_gpu_instances(gpu)? {
        println!(
            "GPU {gpu}: removing GPU instance {gi}, left without a compute instance by an interrupted apply"
        );
        step();
        gpus.destroy_gpu_instance(gpu, gi)
            .with_context(|| format!("removing leftover GPU instance {gi} on GPU {gpu}"))?;
    }
    Ok(())
}

fn destroy(gpus: &Gpus, p: &GpuPlan, instances: &[Instance], step: &mut dyn FnMut()) -> Result<()> {
    if instances.is_empty() {
        return Ok(());
    }
    // Ids are read fresh: a previous, interrupted apply may have left the GPU in between.
    let devices = gpus.mig_devices_of(p.gpu)?;
    let mut gone: Vec<(u32, u32)> = Vec::new();
    for inst in instances {
        let Some(dev) = devices
            .iter()
            .find(|m| m.ci_profile == inst.profile && m.placement_start == inst.start)
        else {
            continue;
        };
        step();
        gpus.destroy_compute_instance(p.gpu, dev.gi_id, dev.ci_id)
            .with_context(|| format!("destroying {inst} on GPU {}", p.gpu))?;
        gone.push((dev.gi_id, dev.ci_id));
        // A GPU instance can go only once all its compute instances have.
        let left = devices
            .iter()
            .filter(|m| m.gi_id == dev.gi_id && !gone.contains(&(m.gi_id, m.ci_id)))
            .count();
        if left == 0 {
            step();
            gpus.destroy_gpu_instance(p.gpu, dev.gi_id)
                .with_context(|| {
                    format!("destroying the GPU instance of {inst} on GPU {}", p.gpu)
                })?;
        }
    }
    Ok(())
}

fn create(gpus: &Gpus, p: &GpuPlan, inst: &Instance, step: &mut dyn FnMut()) -> Result<()> {
    let gi = gi_profile_of(p.model, &inst.profile)
        .ok_or_else(|| anyhow!("{} is not a MIG profile of {}", inst.profile, p.model.key))?;
    let name: gpuops_catalog::ProfileName = inst
        .profile
        .parse()
        .map_err(|e| anyhow!("MIG device name {}: {e}", inst.profile))?;
    let ci_slices = name.compute_slices_or_gpu();
    let ci_profile =
        gpuops_catalog::nvml_enum::ci_profile_for_slices(ci_slices).ok_or_else(|| {
            anyhow!(
                "{}: no compute-instance profile has {ci_slices} slices",
                inst.profile
            )
        })?;
    step();
    let gi_id = gpus
        .create_gpu_instance(
            p.gpu,
            gi.nvml_id,
            Some(PlacementSlot {
                start: inst.start,
                size: gi.memory_slices,
            }),
        )
        .with_context(|| format!("creating {inst} on GPU {}", p.gpu))?;
    step();
    gpus.create_compute_instance(p.gpu, gi_id, ci_profile, None)
        .with_context(|| format!("creating the compute instance of {inst} on GPU {}", p.gpu))?;
    Ok(())
}

fn run_hooks(opts: &Options, point: HookPoint) -> Result<()> {
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
        let status = cmd
            .status()
            .with_context(|| format!("running {} hook {:?}", point.name(), hook.command))?;
        if !status.success() {
            bail!("{} hook {:?} failed ({status})", point.name(), hook.command);
        }
    }
    Ok(())
}

/// The checkpoint of the GPUs about to change.
pub fn checkpoint_of(inv: &Inventory, gpus: &[u32], applying: Option<String>) -> Checkpoint {
    Checkpoint {
        version: Checkpoint::VERSION.into(),
        applying,
        gpus: inv
            .gpus
            .iter()
            .filter(|g| gpus.contains(&g.index))
            .map(|g| GpuCheckpoint {
                index: g.index,
                uuid: g.uuid.clone(),
                mig_enabled: g.mig.current_enabled,
                layout: current_layout(g),
            })
            .collect(),
    }
}

/// Reads a checkpoint file; `Ok(None)` when there is none.
pub fn read_checkpoint(path: &Path) -> Result<Option<Checkpoint>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Checkpoint::parse(&text, &path.display().to_string())
            .map(Some)
            .map_err(|e| anyhow!(e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading checkpoint {}", path.display())),
    }
}

/// Writes a checkpoint atomically and durably, so a crash or power cut never leaves half of one.
pub fn write_checkpoint(path: &Path, checkpoint: &Checkpoint) -> Result<()> {
    let text = serde_json::to_string_pretty(checkpoint)?;
    gpuops_atomicfile::write(path, text)?;
    Ok(())
}

/// Targets that put GPUs back as a checkpoint recorded them (matched by UUID).
pub fn restore_targets(inv: &Inventory, checkpoint: &Checkpoint) -> Result<Vec<Target>> {
    checkpoint
        .gpus
        .iter()
        .map(|c| {
            let gpu = inv.gpus.iter().find(|g| g.uuid == c.uuid).ok_or_else(|| {
                anyhow!(
                    "checkpointed GPU {} ({}) is not on this node",
                    c.index,
                    c.uuid
                )
            })?;
            Ok(Target {
                gpu: gpu.index,
                mig_enabled: c.mig_enabled,
                wanted: c.layout.counts(),
                exact: Some(c.layout.clone()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_plans_keep_what_both_layouts_share() {
        let a = Layout::new(vec![
            Instance::new("1g.10gb", 0),
            Instance::new("3g.40gb", 4),
        ]);
        let b = Layout::new(vec![
            Instance::new("2g.20gb", 0),
            Instance::new("3g.40gb", 4),
        ]);
        let p = exact_plan(&a, &b);
        assert_eq!(p.keep, vec![Instance::new("3g.40gb", 4)]);
        assert_eq!(p.destroy, vec![Instance::new("1g.10gb", 0)]);
        assert_eq!(p.create, vec![Instance::new("2g.20gb", 0)]);
        assert!(exact_plan(&a, &a).destroy.is_empty());
    }
}
