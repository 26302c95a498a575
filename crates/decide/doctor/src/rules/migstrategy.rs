//! A node whose MIG strategy cannot advertise the layout it was given: under the `single`
//! strategy every MIG device of the node is advertised as `nvidia.com/gpu`, so all must be one
//! profile; a layout of mixed profiles (`all-balanced`) leaves the device plugin nothing to
//! advertise and GFD labels the product `<model>-MIG-INVALID` with `nvidia.com/gpu.count=0`.
//! That is neither a registration problem nor a failed MIG apply: the layout was applied.

use super::{configs_offering, node_model, per_gpu_layout};
use crate::Options;
use crate::cluster::{Cluster, MIG_CONFIG, MIG_STRATEGY, NodeView, PRODUCT};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources::{self, GPU};
use gpuops_mig::config::MigPartedConfig;
use std::collections::BTreeMap;

/// What is wrong on one node.
pub(crate) struct Conflict {
    /// The `nvidia.com/mig.config` value.
    pub config: String,
    /// Its MIG instances per GPU for this node's model, when the config is a known one.
    pub layout: Option<BTreeMap<String, u32>>,
    /// Whether GFD already says so (`-MIG-INVALID` product).
    pub invalid_label: bool,
    /// The agent's `GPUMIGStrategyValid=False` condition message, when it wrote one.
    pub condition: Option<String>,
}

impl Conflict {
    /// `1g.10gb x2, 3g.40gb x1` (or the config name alone when its layout is unknown).
    pub fn describe(&self) -> String {
        match &self.layout {
            Some(l) => format!(
                "{} ({} per GPU)",
                self.config,
                l.iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(p, n)| format!("{p} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => self.config.clone(),
        }
    }

    /// The profiles of the layout, most instances first.
    fn profiles(&self) -> Vec<String> {
        let mut v: Vec<(&String, &u32)> = self
            .layout
            .iter()
            .flatten()
            .filter(|(_, n)| **n > 0)
            .collect();
        v.sort_by_key(|(p, n)| (std::cmp::Reverse(**n), (*p).clone()));
        v.into_iter().map(|(p, _)| p.clone()).collect()
    }
}

/// The condition the agent writes (False, reason `MIGLayoutInvalidForStrategy`) when the single
/// strategy meets a layout of mixed profiles.
pub(crate) const STRATEGY_CONDITION: &str = "GPUMIGStrategyValid";

/// The message of the agent's `GPUMIGStrategyValid=False` condition: the agent saw the layout it
/// could not advertise, so it holds even where GFD has not relabelled the node yet.
fn strategy_condition(n: &NodeView<'_>) -> Option<String> {
    n.condition(STRATEGY_CONDITION)
        .filter(|c| c.status == "False")
        .map(|c| {
            format!(
                "{} {}",
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("").trim()
            )
            .trim()
            .to_string()
        })
}

/// The node's conflict, if it has one.
pub(crate) fn conflict(n: &NodeView<'_>, configs: &MigPartedConfig) -> Option<Conflict> {
    let condition = strategy_condition(n);
    if n.label(MIG_STRATEGY) != Some("single") && condition.is_none() {
        return None;
    }
    let config = n.label(MIG_CONFIG).unwrap_or("").to_string();
    let layout = node_model(n).and_then(|m| per_gpu_layout(configs, &config, m));
    let mixed = layout
        .as_ref()
        .is_some_and(|l| l.values().filter(|v| **v > 0).count() > 1);
    let invalid_label = n
        .label(PRODUCT)
        .is_some_and(|p| p.ends_with("-MIG-INVALID"));
    (mixed || invalid_label || condition.is_some()).then_some(Conflict {
        config: if config.is_empty() {
            "<unset>".into()
        } else {
            config
        },
        layout,
        invalid_label,
        condition,
    })
}

/// The single-profile config that gives this node `profile`, and the command that asks for it.
fn single_profile_fix(
    n: &NodeView<'_>,
    profile: &str,
    configs: &MigPartedConfig,
) -> Option<(String, String)> {
    let model = node_model(n)?;
    let name = configs_offering(configs, profile, model)
        .into_iter()
        .find(|c| {
            per_gpu_layout(configs, c, model)
                .is_some_and(|l| l.values().filter(|v| **v > 0).count() == 1)
        })?;
    let cmd = format!(
        "kubectl label node {} {MIG_CONFIG}={name} --overwrite",
        n.name
    );
    Some((name, cmd))
}

/// The two ways out, for a node and a profile the workload wants: a single-profile config (pods
/// then request `nvidia.com/gpu`), or the mixed strategy (pods request `nvidia.com/mig-<p>`).
pub(crate) fn fix(
    n: &NodeView<'_>,
    c: &Conflict,
    want: Option<&str>,
    configs: &MigPartedConfig,
) -> (String, Option<String>) {
    let profile = want
        .map(str::to_string)
        .or_else(|| c.profiles().into_iter().next());
    let relabel = profile.as_deref().and_then(|p| {
        single_profile_fix(n, p, configs).map(|(name, cmd)| (p.to_string(), name, cmd))
    });
    let mixed = "or keep the layout and run the device plugin with the mixed strategy (MIG_STRATEGY=mixed \
                 in the agent's DaemonSet, migStrategy: mixed in its config), so each profile is \
                 advertised as nvidia.com/mig-<profile>";
    match relabel {
        Some((p, _config, cmd)) => (
            format!(
                "the single strategy needs one profile per node: give {} a single-profile layout \
                 ({cmd}: every GPU becomes {p} instances, advertised as {GPU}), {mixed}",
                n.name
            ),
            Some(cmd),
        ),
        None => (
            format!(
                "the single strategy needs one MIG profile per node: label {} with a config of one profile, {mixed}",
                n.name
            ),
            None,
        ),
    }
}

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut configs: Option<MigPartedConfig> = None;
    let mut out = Vec::new();
    for n in c.gpu_nodes() {
        if n.label(MIG_STRATEGY) != Some("single") && strategy_condition(n).is_none() {
            continue;
        }
        let configs = configs.get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
        let Some(k) = conflict(n, configs) else {
            continue;
        };
        let mut f = Finding::new(
            Severity::Critical,
            Category::Mig,
            "mig-strategy-conflict",
            format!(
                "Node {}: MIG strategy single cannot advertise layout {}, which mixes profiles",
                n.name, k.config
            ),
        )
        .object(ObjectRef::node(n.name))
        .evidence(format!(
            "{MIG_STRATEGY}=single, {MIG_CONFIG}={}",
            k.describe()
        ));
        if let Some(m) = &k.condition {
            f = f.evidence(format!("condition {STRATEGY_CONDITION}=False: {m}"));
        }
        if k.invalid_label {
            f = f.evidence(format!(
                "{PRODUCT}={} (GFD's label for a single-strategy node whose MIG devices are not all one profile)",
                n.label(PRODUCT).unwrap_or("")
            ));
        }
        f = f.evidence(format!(
            "status.allocatable: {}",
            if n.allocatable.is_empty() {
                "no nvidia.com/ resource".to_string()
            } else {
                resources::describe(&n.allocatable)
            }
        ));
        let (text, cmd) = fix(n, &k, None, configs);
        f = f.fix(format!(
            "the layout was applied; the device plugin is registered but has no single resource to \
             advertise it as: {text}"
        ));
        if let Some(cmd) = cmd {
            f = f.command(cmd);
        }
        out.push(f);
    }
    out
}

#[cfg(test)]
pub(super) mod tests {
    use crate::testkit::*;

    /// What the agent and GFD leave on an H100 node with strategy single and `all-balanced`.
    pub(crate) fn single_balanced(name: &str) -> k8s_openapi::api::core::v1::Node {
        let mut n = node(name);
        label(&mut n, "nvidia.com/gpu.present", "true");
        label(
            &mut n,
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3-MIG-INVALID",
        );
        label(&mut n, "nvidia.com/gpu.count", "0");
        label(&mut n, "nvidia.com/mig.strategy", "single");
        label(&mut n, "nvidia.com/mig.config", "all-balanced");
        label(&mut n, "nvidia.com/mig.config.state", "success");
        label(&mut n, "nvidia.com/cuda.driver-version.full", "550.107.02");
        n
    }

    #[test]
    fn single_strategy_with_a_mixed_layout_is_explained_not_registration() {
        let f = run(&snapshot(vec![single_balanced("mig-1")], vec![], vec![]));
        let got = one(&f, "mig-strategy-conflict");
        assert!(got.title.contains("all-balanced"), "{got:#?}");
        assert!(
            got.evidence[0].contains("1g.10gb x2, 2g.20gb x1, 3g.40gb x1"),
            "{got:#?}"
        );
        assert_eq!(
            got.commands,
            vec!["kubectl label node mig-1 nvidia.com/mig.config=all-1g.10gb --overwrite"]
        );
        assert!(got.fix.contains("MIG_STRATEGY=mixed"), "{}", got.fix);
        // Not blamed on registration, nor on a MIG apply or layout.
        for code in [
            "zero-allocatable",
            "mig-layout-mismatch",
            "mig-config-failed",
        ] {
            assert!(with_code(&f, code).is_empty(), "{code}: {f:#?}");
        }

        // Variant: no -MIG-INVALID label yet (GFD not rerun), the layout alone says it.
        let mut n = single_balanced("mig-2");
        label(&mut n, "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
        one(
            &run(&snapshot(vec![n], vec![], vec![])),
            "mig-strategy-conflict",
        );

        // Look-alikes: single with one profile, and mixed with all-balanced, are fine.
        let mut one_profile = single_balanced("mig-3");
        label(&mut one_profile, "nvidia.com/mig.config", "all-1g.10gb");
        label(
            &mut one_profile,
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        );
        set_resource(&mut one_profile, "nvidia.com/gpu", 56, 56);
        let mut mixed = single_balanced("mig-4");
        label(&mut mixed, "nvidia.com/mig.strategy", "mixed");
        label(
            &mut mixed,
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3",
        );
        set_resource(&mut mixed, "nvidia.com/mig-1g.10gb", 16, 16);
        let f = run(&snapshot(vec![one_profile, mixed], vec![], vec![]));
        assert!(with_code(&f, "mig-strategy-conflict").is_empty(), "{f:#?}");
    }

    #[test]
    fn the_agents_strategy_condition_is_read_and_quoted() {
        let msg = "MIG strategy single needs every MIG device of the node to be one profile; \
                   GPU 0 has 1g.10gb, 2g.20gb, 3g.40gb";
        // The condition alone (GFD not rerun, no strategy label): still the conflict.
        let mut n = single_balanced("mig-c1");
        label(&mut n, "nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3");
        unlabel(&mut n, "nvidia.com/mig.strategy");
        condition(
            &mut n,
            "GPUMIGStrategyValid",
            "False",
            "MIGLayoutInvalidForStrategy",
            msg,
        );
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "mig-strategy-conflict");
        assert!(
            got.evidence.iter().any(|e| e.contains(msg)
                && e.contains("GPUMIGStrategyValid=False")
                && e.contains("MIGLayoutInvalidForStrategy")),
            "{got:#?}"
        );

        // With the label too: one finding, both quoted.
        let mut n = single_balanced("mig-c2");
        condition(
            &mut n,
            "GPUMIGStrategyValid",
            "False",
            "MIGLayoutInvalidForStrategy",
            msg,
        );
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "mig-strategy-conflict");
        assert!(got.evidence.iter().any(|e| e.contains(msg)), "{got:#?}");
        assert!(
            got.evidence.iter().any(|e| e.contains("MIG-INVALID")),
            "{got:#?}"
        );

        // Look-alike: the condition True (layout valid) is no conflict.
        let mut ok = node("mig-c3");
        label(&mut ok, "nvidia.com/gpu.present", "true");
        label(&mut ok, "nvidia.com/mig.strategy", "single");
        label(&mut ok, "nvidia.com/mig.config", "all-1g.10gb");
        label(
            &mut ok,
            "nvidia.com/gpu.product",
            "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        );
        set_resource(&mut ok, "nvidia.com/gpu", 56, 56);
        condition(&mut ok, "GPUMIGStrategyValid", "True", "MIGLayoutValid", "");
        let f = run(&snapshot(vec![ok], vec![], vec![]));
        assert!(with_code(&f, "mig-strategy-conflict").is_empty(), "{f:#?}");
    }
}
