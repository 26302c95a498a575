//! Applying MIG layouts to a node, the pure half: what each selected GPU keeps, destroys and
//! creates (planned for every GPU before anything is touched), the plan as people read it, and
//! what a checkpoint records and restores. gpuops-migexec carries the plans out through NVML.

use crate::MigError;
use crate::checkpoint::{Checkpoint, GpuCheckpoint};
use crate::layout::{Instance, Layout, slot_map};
use crate::planner::{self, Plan};
use gpuops_catalog::GpuModel;
use gpuops_inventory::{Gpu, Inventory};
use std::collections::BTreeMap;

/// What a named config asks of each GPU it selects on this node.
pub fn targets_of(
    named: &crate::config::NamedConfig,
    inv: &Inventory,
) -> Result<Vec<Target>, MigError> {
    Ok(crate::select::select(named, &inv.gpus)?
        .into_iter()
        .map(|s| Target {
            gpu: s.gpu,
            mig_enabled: s.mig_enabled,
            wanted: s.mig_devices,
            exact: None,
        })
        .collect())
}

/// The plans that would change something: the mode, or (unless `mode_only`) the layout.
pub fn differing(plans: &[GpuPlan], mode_only: bool) -> Vec<GpuPlan> {
    plans
        .iter()
        .filter(|p| p.mode_changes() || (!mode_only && p.layout_changes()))
        .cloned()
        .collect()
}

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
pub fn plan_node(inv: &Inventory, targets: &[Target]) -> Result<Vec<GpuPlan>, MigError> {
    let mut plans = Vec::new();
    let mut problems = Vec::new();
    for t in targets {
        let gpu = inv
            .gpus
            .iter()
            .find(|g| g.index == t.gpu)
            .ok_or(MigError::NoSuchGpu(t.gpu))?;
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
        return Err(MigError::Cannot(problems));
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

/// Targets that put GPUs back as a checkpoint recorded them (matched by UUID).
pub fn restore_targets(inv: &Inventory, checkpoint: &Checkpoint) -> Result<Vec<Target>, MigError> {
    checkpoint
        .gpus
        .iter()
        .map(|c| {
            let gpu = inv.gpus.iter().find(|g| g.uuid == c.uuid).ok_or_else(|| {
                MigError::CheckpointedGpuMissing {
                    index: c.index,
                    uuid: c.uuid.clone(),
                }
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

/// The node's MIG state as a mig-parted config named `current`, grouping identical GPUs.
pub fn current_config(inv: &Inventory) -> serde_json::Value {
    let mut entries: Vec<(Vec<u32>, bool, BTreeMap<String, u32>)> = Vec::new();
    for g in inv.gpus.iter().filter(|g| g.mig.capable) {
        let counts = current_layout(g).counts();
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

/// The node's GPU models as a fleet for the workload planner: `8x H100-SXM5-80GB, ...`.
pub fn fleet_of(inv: &Inventory) -> String {
    let mut keys: Vec<String> = inv.gpus.iter().filter_map(|g| g.model.clone()).collect();
    keys.dedup();
    keys.iter()
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
        .join(", ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
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
