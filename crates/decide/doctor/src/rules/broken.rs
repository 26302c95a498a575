//! Pending pods that broken capacity explains: nodes the pod's constraints pick that would have
//! room for it but for unhealthy GPUs the device plugin withholds (capacity above allocatable,
//! `GPUHealthy=False`), a MIG config that failed to apply (the agent's
//! `nvidia.com/mig.config.state=failed`), or a MIG strategy that cannot advertise its layout.
//! Their pod finding names those nodes; adding nodes is not the fix.

use super::migstrategy;
use super::{node_model, per_gpu_layout};
use crate::cluster::{Cluster, MIG_CONFIG, MIG_CONFIG_STATE, NodeView, PodView, list_some};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::fit;
use crate::resources::{self, GPU};
use gpuops_mig::config::MigPartedConfig;

/// Nodes named one by one; the rest are counted.
const LISTED: usize = 6;

/// The agent's GPU health condition.
const GPU_HEALTHY: &str = "GPUHealthy";

fn health_condition(n: &NodeView<'_>) -> Option<String> {
    n.condition(GPU_HEALTHY)
        .filter(|c| c.status == "False")
        .map(|c| {
            format!(
                "{GPU_HEALTHY}=False {}: {}",
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("").trim()
            )
        })
}

/// MIG instances of `resource` the node's wanted config would give it (whole GPUs count).
fn mig_would_offer(n: &NodeView<'_>, resource: &str, configs: &MigPartedConfig) -> Option<i64> {
    let profile = resources::mig_profile(resource)?;
    let layout = per_gpu_layout(configs, n.label(MIG_CONFIG)?, node_model(n)?)?;
    let per_gpu = layout.get(&profile).copied().unwrap_or(0);
    Some(i64::from(per_gpu) * n.gpu_count())
}

/// Why the node lacks room it would otherwise have for the pod, when that is so.
fn broken_room(n: &NodeView<'_>, p: &PodView<'_>, configs: &MigPartedConfig) -> Option<String> {
    let mig_failed = n.label(MIG_CONFIG_STATE) == Some("failed");
    let mut why = Vec::new();
    let mut broken = false;
    for (r, need) in &p.gpus {
        let free = n.free(r);
        let cap = n.capacity.get(r).copied().unwrap_or(0);
        let withheld = (cap - n.allocatable_of(r)).max(0);
        let applied = if mig_failed {
            mig_would_offer(n, r, configs)
                .map(|total| (total - n.requested.get(r).copied().unwrap_or(0)).max(0))
        } else {
            None
        };
        let room = (free + withheld).max(applied.unwrap_or(0));
        if room < *need {
            return None;
        }
        if free >= *need {
            continue;
        }
        broken = true;
        if withheld > 0 && free + withheld >= *need {
            why.push(format!(
                "{withheld} of {cap} {r} withheld as unhealthy (allocatable {}, {free} free; {need} needed)",
                n.allocatable_of(r)
            ));
        }
        if let Some(a) = applied.filter(|a| *a >= *need) {
            why.push(format!(
                "MIG config {} failed to apply; applied, it would offer {a} free {r} ({free} free now)",
                n.label(MIG_CONFIG).unwrap_or("?")
            ));
        }
    }
    if !broken {
        return None;
    }
    if let Some(h) = health_condition(n) {
        why.push(h);
    }
    Some(format!("{}: {}", n.name, why.join("; ")))
}

/// The finding for a pod that broken nodes would otherwise take, if any node is such.
pub(super) fn explains(
    c: &Cluster<'_>,
    p: &PodView<'_>,
    configs: &MigPartedConfig,
) -> Option<Finding> {
    let mut hits: Vec<(&NodeView<'_>, String)> = Vec::new();
    // Only a node that withholds devices or failed a MIG apply can lack room it would otherwise
    // have; the room check is cheaper than the pod's constraints, so it goes first.
    for n in c.broken_nodes() {
        let Some(why) = broken_room(n, p, configs) else {
            continue;
        };
        if fit::selects(p.pod, n.name, n.labels) && fit::tolerates_all(p.pod, &n.taints) {
            hits.push((n, why));
        }
    }
    if hits.is_empty() {
        return None;
    }
    let who = format!("{}/{}", p.namespace, p.name);
    let want = resources::describe(&p.gpus);
    let mut f = Finding::new(
        Severity::Warning,
        Category::Scheduling,
        "broken-capacity",
        format!(
            "Pod {who} would fit on {} node{} whose GPUs are broken: {}",
            hits.len(),
            if hits.len() == 1 { "" } else { "s" },
            list_some(hits.iter().map(|(n, _)| n.name), LISTED)
        ),
    )
    .object(ObjectRef::pod(p.namespace, p.name))
    .evidence(format!("asks for {want}"));
    for (n, why) in hits.iter().take(LISTED) {
        f = f.evidence(why.clone()).object(ObjectRef::node(n.name));
    }
    let describes: Vec<String> = hits
        .iter()
        .take(LISTED)
        .map(|(n, _)| format!("kubectl describe node {}", n.name))
        .collect();
    f = f.fix(format!(
        "repair these nodes' GPUs (their health and MIG findings say how; {}); with them back the pod \
         fits, so adding nodes or changing the pod's request is not the fix",
        describes.join(", ")
    ));
    for d in describes {
        f = f.command(d);
    }
    Some(f)
}

/// Whether a fix relabels a node with the MIG config it already has (a failed apply): the same
/// value again is no change the agent acts on.
fn repeats_a_label(c: &Cluster<'_>, f: &Finding) -> bool {
    f.commands.iter().any(|cmd| {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        match words.as_slice() {
            ["kubectl", "label", "node", node, kv, ..] => kv
                .strip_prefix(MIG_CONFIG)
                .and_then(|v| v.strip_prefix('='))
                .is_some_and(|v| c.node(node).and_then(|n| n.label(MIG_CONFIG)) == Some(v)),
            _ => false,
        }
    })
}

/// The broken-capacity finding when the other one's fix would repeat a failed node's label;
/// else the other one, naming the broken nodes too.
pub(super) fn instead_of(c: &Cluster<'_>, other: Finding, broken: Finding) -> Finding {
    if repeats_a_label(c, &other) {
        return broken;
    }
    let nodes: Vec<ObjectRef> = broken
        .objects
        .iter()
        .filter(|o| o.kind == "Node")
        .cloned()
        .collect();
    let mut f = other.evidence(format!(
        "also broken, and with room for it once repaired: {}",
        broken.evidence[1..].join("; ")
    ));
    f = f.objects(nodes);
    f
}

/// The finding for a pod whose nodes run the single strategy with a layout it cannot advertise.
pub(super) fn strategy_conflict(
    c: &Cluster<'_>,
    p: &PodView<'_>,
    configs: &MigPartedConfig,
) -> Option<Finding> {
    let mut hits = Vec::new();
    for n in c.gpu_nodes() {
        if !fit::selects(p.pod, n.name, n.labels) || !fit::tolerates_all(p.pod, &n.taints) {
            continue;
        }
        let Some(k) = migstrategy::conflict(n, configs) else {
            continue;
        };
        // Whole GPUs (what single advertises) or a profile of the layout.
        let wanted = p.gpus.keys().all(|r| {
            r == GPU
                || resources::mig_profile(r).is_some_and(|pr| {
                    k.layout
                        .as_ref()
                        .is_none_or(|l| l.get(&pr).is_some_and(|v| *v > 0))
                })
        });
        if wanted {
            hits.push((n, k));
        }
    }
    let (first, k) = hits.first()?;
    let who = format!("{}/{}", p.namespace, p.name);
    let profile = p.gpus.keys().find_map(|r| resources::mig_profile(r));
    let mut f = Finding::new(
        Severity::Critical,
        Category::Scheduling,
        "pending-mig-strategy",
        format!(
            "Pod {who} waits for {} node{} whose MIG strategy single cannot advertise their mixed layout",
            hits.len(),
            if hits.len() == 1 { "" } else { "s" }
        ),
    )
    .object(ObjectRef::pod(p.namespace, p.name))
    .evidence(format!("asks for {}", resources::describe(&p.gpus)));
    for (n, k) in hits.iter().take(LISTED) {
        f = f
            .evidence(format!(
                "{}: nvidia.com/mig.strategy=single, nvidia.com/mig.config={}: nothing advertised",
                n.name,
                k.describe()
            ))
            .object(ObjectRef::node(n.name));
    }
    let (text, cmd) = migstrategy::fix(first, k, profile.as_deref(), configs);
    // The pod's request stays as it is under either way out, but what it must say differs:
    // whole GPUs under single, the profile under mixed.
    let request = match &profile {
        Some(pr) => format!(
            "; with the single-profile layout the pod must request {GPU} instead of {}, with the mixed strategy its request works as it is",
            resources::mig_resource(pr)
        ),
        None => format!(
            "; with the mixed strategy the pod must request nvidia.com/mig-<profile> instead of {GPU}, with a single-profile layout its request works as it is"
        ),
    };
    f = f.fix(format!("{text}{request}"));
    if let Some(cmd) = cmd {
        f = f.command(cmd);
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    const FULL: &str = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";

    fn no_scale_up(f: &crate::Finding) {
        assert!(
            !f.fix.contains("scale") && f.fix.contains("not the fix"),
            "{}",
            f.fix
        );
    }

    /// gpu-1: 8 GPUs, `withheld` of them unhealthy, 4 in use; ok-1 full. The pod wants `want`.
    fn withheld(withheld: i64, want: i64, health: bool) -> Vec<crate::Finding> {
        let mut sick = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut sick, "nvidia.com/gpu", 8, 8 - withheld);
        if health {
            condition(
                &mut sick,
                "GPUHealthy",
                "False",
                "XidError",
                "GPU 3: XID 79 (fallen off the bus)",
            );
        }
        let pods = vec![
            running(pod("a", "x", &[("nvidia.com/gpu", 4)]), "gpu-1"),
            running(pod("a", "y", &[("nvidia.com/gpu", 8)]), "ok-1"),
            unschedulable(pod("ml", "train", &[("nvidia.com/gpu", want)]), FULL),
        ];
        run(&snapshot(
            vec![sick, gpu_node("ok-1", "nvidia.com/gpu", 8)],
            pods,
            vec![event("Pod", "ml", "train", "FailedScheduling", FULL, 10)],
        ))
    }

    #[test]
    fn only_nodes_that_withhold_devices_or_failed_a_mig_apply_are_looked_at() {
        // The index pending pods walk instead of every node: a healthy full node, a node with
        // a device withheld, one whose MIG apply failed, and one that is down (not a candidate:
        // the unavailable finding has it).
        let healthy = gpu_node("ok-1", "nvidia.com/gpu", 8);
        let mut sick = gpu_node("sick-1", "nvidia.com/gpu", 8);
        set_resource(&mut sick, "nvidia.com/gpu", 8, 7);
        let mut mf = gpu_node("mf-1", "nvidia.com/gpu", 8);
        label(&mut mf, "nvidia.com/mig.config.state", "failed");
        let mut down = gpu_node("down-1", "nvidia.com/gpu", 8);
        set_resource(&mut down, "nvidia.com/gpu", 8, 0);
        let s = snapshot(vec![healthy, sick, mf, down], vec![], vec![]);
        let c = crate::cluster::Cluster::build(&s);
        let names: Vec<&str> = c.broken_nodes().map(|n| n.name).collect();
        assert_eq!(names, vec!["sick-1", "mf-1"]);
    }

    #[test]
    fn withheld_unhealthy_gpus_explain_a_pending_pod() {
        // Variants: with and without the GPUHealthy condition, 2 or 4 withheld.
        for (held, want, health) in [(2, 4, true), (2, 3, false), (4, 4, true)] {
            let f = withheld(held, want, health);
            assert!(with_code(&f, "insufficient-gpus").is_empty(), "{f:#?}");
            let got = one(&f, "broken-capacity");
            no_scale_up(got);
            assert!(got.title.contains("gpu-1"), "{got:#?}");
            assert!(
                got.evidence.iter().any(|e| e.contains(&format!(
                    "gpu-1: {held} of 8 nvidia.com/gpu withheld as unhealthy (allocatable {}",
                    8 - held
                ))),
                "{got:#?}"
            );
            assert_eq!(
                got.evidence
                    .iter()
                    .any(|e| e.contains("GPUHealthy=False XidError")),
                health
            );
            assert_eq!(got.commands, vec!["kubectl describe node gpu-1"]);
        }
        // Look-alikes: with the withheld GPUs back it would still not fit; nothing withheld.
        let f = withheld(2, 6, true);
        assert!(with_code(&f, "broken-capacity").is_empty(), "{f:#?}");
        assert!(one(&f, "insufficient-gpus").fix.contains("scale the"));
        let f = withheld(0, 5, false);
        assert!(with_code(&f, "broken-capacity").is_empty(), "{f:#?}");
        one(&f, "insufficient-gpus");
    }

    #[test]
    fn a_failed_mig_apply_explains_a_pod_asking_for_its_profile() {
        // The agent put the old whole GPUs back after the failure: the node is up, but offers
        // nvidia.com/gpu, not the 1g.10gb instances its config would give.
        let mut mf = gpu_node("mf-1", "nvidia.com/gpu", 8);
        label(&mut mf, "nvidia.com/mig.config", "all-1g.10gb");
        label(&mut mf, "nvidia.com/mig.config.state", "failed");
        let f = run(&snapshot(
            vec![mf.clone()],
            vec![pod("ml", "small", &[("nvidia.com/mig-1g.10gb", 2)])],
            vec![],
        ));
        let got = one(&f, "broken-capacity");
        no_scale_up(got);
        assert!(
            got.evidence.iter().any(|e| e.contains(
                "MIG config all-1g.10gb failed to apply; applied, it would offer 56 free nvidia.com/mig-1g.10gb"
            )),
            "{got:#?}"
        );
        // Never the label the node already has as the fix.
        assert!(
            with_code(&f, "mig-profile-not-offered").is_empty()
                && !got.fix.contains("nvidia.com/mig.config=all-1g.10gb"),
            "{f:#?}"
        );
        // Variant: the pod selects the node's pool (the constraints' mismatch check comes first).
        let mut pooled = mf.clone();
        label(&mut pooled, "pool", "mfo");
        let f = run(&snapshot(
            vec![pooled],
            vec![select(
                pod("ml", "small", &[("nvidia.com/mig-1g.10gb", 2)]),
                "pool",
                "mfo",
            )],
            vec![],
        ));
        no_scale_up(one(&f, "broken-capacity"));
        assert!(
            with_code(&f, "mig-profile-not-offered").is_empty(),
            "{f:#?}"
        );
        // Look-alike: the failed config does not have the profile: not this finding.
        let f = run(&snapshot(
            vec![mf],
            vec![pod("ml", "big", &[("nvidia.com/mig-3g.40gb", 1)])],
            vec![],
        ));
        assert!(with_code(&f, "broken-capacity").is_empty(), "{f:#?}");
    }

    #[test]
    fn another_nodes_repartition_stays_the_fix_and_names_the_failed_node() {
        // A mixed-strategy node that can be repartitioned, and a failed one whose config has the
        // profile: relabelling the healthy node is a real fix; the failed node is named too.
        let mut mig = gpu_node("mig-1", "nvidia.com/mig-1g.10gb", 14);
        unlabel(&mut mig, "nvidia.com/gpu");
        label(&mut mig, "nvidia.com/mig.strategy", "mixed");
        label(&mut mig, "nvidia.com/mig.config", "all-1g.10gb");
        label(&mut mig, "nvidia.com/mig.config.state", "success");
        let mut failed = gpu_node("migfail-1", "nvidia.com/gpu", 8);
        label(&mut failed, "nvidia.com/mig.config", "all-3g.40gb");
        label(&mut failed, "nvidia.com/mig.config.state", "failed");
        let f = run(&snapshot(
            vec![mig, failed],
            vec![pod("ml", "mig-3g", &[("nvidia.com/mig-3g.40gb", 1)])],
            vec![],
        ));
        let got = one(&f, "mig-profile-not-offered");
        assert_eq!(
            got.commands,
            vec!["kubectl label node mig-1 nvidia.com/mig.config=all-3g.40gb --overwrite"]
        );
        assert!(
            got.evidence.iter().any(|e| e.starts_with("also broken")
                && e.contains("migfail-1: MIG config all-3g.40gb failed to apply")),
            "{got:#?}"
        );
        assert!(got.objects.iter().any(|o| o.name == "migfail-1"));
    }

    #[test]
    fn pods_on_a_single_strategy_node_with_a_mixed_layout() {
        let mut node = super::super::migstrategy::tests::single_balanced("mig-1");
        label(&mut node, "pool", "ms");
        for (resource, must_not) in [
            ("nvidia.com/mig-1g.10gb", "`nvidia.com/mig-1g.10gb: 1`"),
            ("nvidia.com/gpu", "request `nvidia.com/gpu"),
        ] {
            // Beside another pool that offers whole GPUs, the pod pinned to the MIG pool.
            let f = run(&snapshot(
                vec![node.clone(), gpu_node("other-1", "nvidia.com/gpu", 8)],
                vec![select(pod("ml", "t", &[(resource, 1)]), "pool", "ms")],
                vec![],
            ));
            let got = one(&f, "pending-mig-strategy");
            assert_eq!(got.objects[0].name, "t", "{got:#?}");
            assert!(!got.fix.contains(must_not), "{}", got.fix);
            assert!(
                got.commands.contains(
                    &"kubectl label node mig-1 nvidia.com/mig.config=all-1g.10gb --overwrite"
                        .to_string()
                ),
                "{got:#?}"
            );
            for code in [
                "resource-mismatch",
                "mig-profile-not-offered",
                "gpu-nodes-unavailable",
                "zero-allocatable",
            ] {
                assert!(with_code(&f, code).is_empty(), "{code}: {f:#?}");
            }
        }
    }
}
