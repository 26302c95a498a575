//! The answer and its renderings: per-GPU layouts, the mig-parted config (through the one
//! emitter, `config::MigPartedConfig::to_yaml`), the node label values and the summary.

use crate::config::{DeviceFilter, DeviceSpec, Devices, MigPartedConfig, NamedConfig};
use crate::layout::{Layout, describe_counts, gi_profile_of};
use gpuops_catalog::GpuModel;
use std::collections::BTreeMap;

/// One GPU of the plan: its model, layout, and which demand it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuAssignment {
    pub model: &'static GpuModel,
    pub layout: Layout,
    /// `(demand item index, MIG device name, count)`.
    pub serves: Vec<(usize, String, u32)>,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetPlan {
    /// The GPUs used, identical layouts adjacent (largest group first).
    pub gpus: Vec<GpuAssignment>,
    /// GPUs any plan serving the whole demand needs (ignoring fleet limits when they make the
    /// demand unservable).
    pub lower_bound: u32,
    /// Why, e.g. `memory slices: 37 needed, 8 per GPU -> at least 5 GPUs`.
    pub bound_reason: String,
    /// `(demand item index, units)` that no available GPU could take.
    pub unmet: Vec<(usize, u32)>,
}

/// One distinct layout of a plan, as a mig-parted config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// The mig-parted config name and `nvidia.com/mig.config` value.
    pub name: String,
    pub model: &'static GpuModel,
    pub layout: Layout,
    pub counts: BTreeMap<String, u32>,
    /// How many GPUs of the plan get it.
    pub gpus: u32,
}

/// The mig-parted config name for `counts` on `model`: `gpuops-<model>-<N>x<profile>-...`,
/// lowercase, `+` and `,` written as `.`, at most 63 characters (a label value); longer names are
/// cut and end in a hash of the full name so they stay distinct.
pub fn config_name(model: &GpuModel, counts: &BTreeMap<String, u32>) -> String {
    let mut raw = format!("gpuops-{}", model.key);
    for (p, n) in counts {
        raw.push_str(&format!("-{n}x{p}"));
    }
    let clean: String = raw
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-') => c,
            '+' | ',' => '.',
            _ => '-',
        })
        .collect();
    if clean.len() <= 63 {
        return clean;
    }
    // FNV-1a over the full name keeps truncated names distinct and deterministic.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in clean.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let prefix = clean[..54].trim_end_matches(['-', '.']);
    format!("{prefix}-{:08x}", h as u32)
}

impl FleetPlan {
    /// Whether the answer equals the proved lower bound (and serves all demand).
    pub fn proven_optimal(&self) -> bool {
        self.unmet.is_empty() && self.gpus.len() as u64 == u64::from(self.lower_bound)
    }

    /// The distinct (model, layout) pairs in plan order, with config names and GPU counts.
    pub fn configs(&self) -> Vec<PlanConfig> {
        let mut out: Vec<PlanConfig> = Vec::new();
        for g in &self.gpus {
            if let Some(c) = out
                .iter_mut()
                .find(|c| c.model.key == g.model.key && c.layout == g.layout)
            {
                c.gpus += 1;
                continue;
            }
            let counts = g.layout.counts();
            out.push(PlanConfig {
                name: config_name(g.model, &counts),
                model: g.model,
                layout: g.layout.clone(),
                counts,
                gpus: 1,
            });
        }
        out
    }

    /// A mig-parted `version: v1` config with one named config per distinct (model, layout),
    /// each selecting the model by PCI device id; written by the one mig-parted emitter
    /// ([`MigPartedConfig::to_yaml`]) after a comment saying what each config holds.
    pub fn mig_parted_yaml(&self) -> String {
        let configs = self.configs();
        let mut y = format!(
            "# gpuops mig plan: {} GPUs (lower bound {}: {})\n",
            self.gpus.len(),
            self.lower_bound,
            self.bound_reason
        );
        for c in &configs {
            y.push_str(&format!(
                "# {}: {}x {}: {}\n",
                c.name,
                c.gpus,
                c.model.key,
                describe_counts(&c.counts)
            ));
        }
        let config = MigPartedConfig {
            configs: configs
                .iter()
                .map(|c| NamedConfig {
                    name: c.name.clone(),
                    entries: vec![DeviceSpec {
                        devices: Devices::All,
                        filters: c
                            .model
                            .pci_device_ids
                            .iter()
                            .map(|&id| DeviceFilter::nvidia(id))
                            .collect(),
                        mig_enabled: true,
                        mig_devices: c.counts.clone(),
                        line: 0,
                    }],
                })
                .collect(),
        };
        y.push_str(&config.to_yaml());
        y
    }

    /// `(config name, GPUs that get it)`: the `nvidia.com/mig.config` values to set.
    pub fn node_labels(&self) -> Vec<(String, u32)> {
        self.configs()
            .into_iter()
            .map(|c| (c.name, c.gpus))
            .collect()
    }

    /// What `gpuops mig plan` prints: the summary, the mig-parted config and the node labels.
    pub fn text(&self) -> String {
        let mut out = format!(
            "{}\nmig-parted config:\n{}\nnode labels (nvidia.com/mig.config):\n",
            self.summary(),
            self.mig_parted_yaml()
        );
        for (name, n) in self.node_labels() {
            out.push_str(&format!("  {n} GPU(s): nvidia.com/mig.config={name}\n"));
        }
        out
    }

    /// A human-readable table: GPUs per model and layout, the lower bound, slack and unmet demand.
    pub fn summary(&self) -> String {
        let configs = self.configs();
        let mut s = String::new();
        let verdict = if !self.unmet.is_empty() {
            "fleet too small"
        } else if self.proven_optimal() {
            "proven optimal"
        } else {
            "not proven optimal"
        };
        s.push_str(&format!(
            "{} GPUs; lower bound {} ({}); {verdict}\n",
            self.gpus.len(),
            self.lower_bound,
            self.bound_reason
        ));
        let rows: Vec<[String; 4]> = configs
            .iter()
            .map(|c| {
                [
                    c.gpus.to_string(),
                    c.model.key.to_string(),
                    describe_counts(&c.counts),
                    c.name.clone(),
                ]
            })
            .collect();
        let head = [
            "GPUs".to_string(),
            "model".to_string(),
            "layout".to_string(),
            "config (nvidia.com/mig.config)".to_string(),
        ];
        let mut widths = head.iter().map(String::len).collect::<Vec<_>>();
        for r in &rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String; 4]| -> String {
            let mut l = format!("{:>w$}", cells[0], w = widths[0]);
            for (i, cell) in cells.iter().enumerate().skip(1) {
                l.push_str(&format!("  {:<w$}", cell, w = widths[i]));
            }
            l.trim_end().to_string() + "\n"
        };
        s.push_str(&line(&head));
        for r in &rows {
            s.push_str(&line(r));
        }
        let (mut total, mut used) = (0u64, 0u64);
        for g in &self.gpus {
            total += u64::from(g.model.mig.as_ref().map_or(8, |m| m.memory_slices));
            for i in &g.layout.instances {
                used +=
                    u64::from(gi_profile_of(g.model, &i.profile).map_or(0, |p| p.memory_slices));
            }
        }
        let mut per_model: Vec<(&str, u32)> = Vec::new();
        for c in &configs {
            match per_model.iter_mut().find(|e| e.0 == c.model.key) {
                Some(e) => e.1 += c.gpus,
                None => per_model.push((c.model.key, c.gpus)),
            }
        }
        if per_model.len() > 1 {
            let parts: Vec<String> = per_model.iter().map(|(m, n)| format!("{n}x {m}")).collect();
            s.push_str(&format!(
                "per model: {}
",
                parts.join(", ")
            ));
        }
        let slack = (self.gpus.len() as u64).saturating_sub(u64::from(self.lower_bound));
        s.push_str(&format!(
            "slack: {slack} GPUs above the bound; {} of {total} memory slices left unpartitioned\n",
            total - used
        ));
        if self.unmet.is_empty() {
            s.push_str("unmet demand: none\n");
        } else {
            let parts: Vec<String> = self
                .unmet
                .iter()
                .map(|(i, n)| format!("item {i}: {n}"))
                .collect();
            s.push_str(&format!("unmet demand: {}\n", parts.join(", ")));
        }
        s.push_str(
            "memory sizes are matched to profiles by nominal size (1g.10gb serves 10GiB; its usable memory is a few percent less)\n",
        );
        s
    }
}
