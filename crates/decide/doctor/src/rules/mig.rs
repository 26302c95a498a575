//! MIG: a config state failed or stuck, and a layout that differs from the wanted config.

use super::{node_model, per_gpu_layout};
use crate::Options;
use crate::cluster::{
    COUNT, Cluster, MIG_CONFIG, MIG_CONFIG_STATE, MIG_STATE_SINCE, NodeView, describe_event,
    human_duration, seconds_between,
};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::resources;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let mut configs = None;
    let mut out = Vec::new();
    for n in c.gpu_nodes() {
        let Some(wanted) = n.label(MIG_CONFIG) else {
            continue;
        };
        match n.label(MIG_CONFIG_STATE) {
            Some("failed") => out.push(failed(c, n, wanted)),
            Some(state @ ("pending" | "rebooting")) => out.extend(stuck(c, o, n, wanted, state)),
            Some("success") | None => {
                let configs =
                    configs.get_or_insert_with(gpuops_mig::config::nvidia_default_configs);
                // Applied, but the single strategy cannot advertise it: mig-strategy-conflict.
                if super::migstrategy::conflict(n, configs).is_none() {
                    out.extend(layout_differs(n, wanted, configs));
                }
            }
            Some(_) => {}
        }
    }
    out
}

fn since(n: &NodeView<'_>) -> Option<Timestamp> {
    n.node
        .metadata
        .annotations
        .as_ref()?
        .get(MIG_STATE_SINCE)?
        .parse()
        .ok()
}

/// The node's MIG-related events and condition messages, newest first.
fn mig_evidence(c: &Cluster<'_>, n: &NodeView<'_>) -> Vec<String> {
    let mut out: Vec<String> = c
        .events_for("Node", "", n.name)
        .iter()
        .chain(c.events_for("Node", "default", n.name))
        .filter(|e| {
            let r = e.reason.as_deref().unwrap_or("").to_ascii_lowercase();
            let m = e.message.as_deref().unwrap_or("").to_ascii_lowercase();
            r.contains("mig") || m.contains("mig")
        })
        .take(3)
        .map(|e| describe_event(e, c.now()))
        .collect();
    for cond in n
        .node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        let r = cond.reason.as_deref().unwrap_or("");
        if cond.type_.to_ascii_lowercase().contains("mig") || r.to_ascii_lowercase().contains("mig")
        {
            out.push(format!(
                "condition {}={} {r}: {}",
                cond.type_,
                cond.status,
                cond.message.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

fn failed(c: &Cluster<'_>, n: &NodeView<'_>, wanted: &str) -> Finding {
    let mut f = Finding::new(
        Severity::Critical,
        Category::Mig,
        "mig-config-failed",
        format!("Node {}: applying MIG config {wanted} failed", n.name),
    )
    .object(ObjectRef::node(n.name))
    .evidence(format!("{MIG_CONFIG}={wanted}, {MIG_CONFIG_STATE}=failed"));
    if let Some(t) = since(n) {
        f = f.evidence(format!(
            "failed since {t} ({})",
            crate::cluster::ago(c.now(), t)
        ));
    }
    for e in mig_evidence(c, n) {
        f = f.evidence(e);
    }
    let (restart, restart_cmd) = restart_agent(n);
    let mut f = f.fix(format!(
        "read why in the node's events (kubectl describe node {0}) and the agent's log; check the config \
         exists and fits the GPU (gpuops mig validate), free the GPUs (no pod may hold them while MIG \
         changes). The agent retries by itself with backoff; setting the same label value again does \
         nothing. To retry now, {restart}{other}",
        n.name,
        other = other_config(n, wanted)
            .map(|(_, cmd)| format!("; or ask for another config: {cmd}"))
            .unwrap_or_default(),
    ))
    .command(format!("kubectl describe node {}", n.name))
    .command(restart_cmd);
    if let Some((_, cmd)) = other_config(n, wanted) {
        f = f.command(cmd);
    }
    f
}

/// How to make the agent apply the node's MIG config again now: restart it (a fresh agent applies
/// the label's config at once; the label's value unchanged is no event).
fn restart_agent(n: &NodeView<'_>) -> (String, String) {
    match n.agents.first() {
        Some(a) => {
            let cmd = format!(
                "kubectl -n {} delete pod {}",
                a.metadata.namespace.as_deref().unwrap_or("default"),
                a.metadata.name.as_deref().unwrap_or("")
            );
            (format!("restart the agent on {}: {cmd}", n.name), cmd)
        }
        None => {
            let cmd = format!(
                "kubectl get pods -A -o wide --field-selector spec.nodeName={}",
                n.name
            );
            (
                format!(
                    "restart the gpuops agent (or NVIDIA's MIG manager) pod on {}: find it with {cmd} and delete it",
                    n.name
                ),
                cmd,
            )
        }
    }
}

/// A different NVIDIA default config (a changed label value is an event the agent acts on).
fn other_config(n: &NodeView<'_>, wanted: &str) -> Option<(&'static str, String)> {
    let other = ["all-balanced", "all-disabled"]
        .into_iter()
        .find(|c| *c != wanted)?;
    Some((
        other,
        format!(
            "kubectl label node {} {MIG_CONFIG}={other} --overwrite",
            n.name
        ),
    ))
}

fn stuck(
    c: &Cluster<'_>,
    o: &Options,
    n: &NodeView<'_>,
    wanted: &str,
    state: &str,
) -> Option<Finding> {
    let t = since(n)?;
    let age = seconds_between(c.now(), t);
    if age < o.mig_stuck_after.as_secs() as i64 {
        return None;
    }
    let mut f = Finding::new(
        Severity::Warning,
        Category::Mig,
        "mig-config-stuck",
        format!(
            "Node {}: MIG config {wanted} has been {state} for {}",
            n.name,
            human_duration(age)
        ),
    )
    .object(ObjectRef::node(n.name))
    .evidence(format!(
        "{MIG_CONFIG}={wanted}, {MIG_CONFIG_STATE}={state} since {t}"
    ));
    for e in mig_evidence(c, n) {
        f = f.evidence(e);
    }
    let holders: Vec<String> = n
        .gpu_pods
        .iter()
        .map(|&i| &c.gpu_pods[i])
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    if !holders.is_empty() {
        f = f.evidence(format!(
            "GPU pods still on the node: {}",
            crate::cluster::list_some(&holders, 5)
        ));
    }
    Some(if state == "rebooting" {
        f.fix(format!("the node was to reboot to change MIG mode: check it came back (kubectl get node {0}) and the agent runs on it", n.name))
            .command(format!("kubectl get node {}", n.name))
    } else {
        let drain = n.drain();
        let note = n.drain_note();
        f.fix(format!(
            "MIG changes wait for the GPUs to be free: move the GPU pods off ({drain}{note}, then \
             kubectl uncordon {0} once the state is success) or check the agent's log on {0}",
            n.name
        ))
        .command(drain)
        .command(format!("kubectl uncordon {}", n.name))
    })
}

fn layout_differs(
    n: &NodeView<'_>,
    wanted: &str,
    configs: &gpuops_mig::config::MigPartedConfig,
) -> Option<Finding> {
    let model = node_model(n)?;
    let per_gpu = per_gpu_layout(configs, wanted, model)?;
    // What the node shows: MIG resources in capacity, else their count labels.
    let mut actual: BTreeMap<String, i64> = n
        .capacity
        .iter()
        .filter_map(|(r, v)| resources::mig_profile(r).map(|p| (p, *v)))
        .collect();
    if actual.is_empty() {
        actual = n
            .labels
            .iter()
            .filter_map(|(k, v)| {
                let r = k.strip_suffix(".count")?;
                Some((resources::mig_profile(r)?, v.parse().ok()?))
            })
            .collect();
    }
    actual.retain(|_, v| *v > 0);
    if n.label(crate::cluster::MIG_STRATEGY) == Some("single") {
        return None; // MIG devices show as nvidia.com/gpu; nothing to compare by name.
    }
    let gpus = n.label(COUNT).and_then(|c| c.parse::<i64>().ok());
    let same_profiles = actual.keys().collect::<Vec<_>>() == per_gpu.keys().collect::<Vec<_>>();
    let consistent = same_profiles && {
        let mut ratios = per_gpu
            .iter()
            .map(|(p, c)| (actual.get(p).copied().unwrap_or(0), i64::from(*c)))
            .filter(|(_, c)| *c > 0)
            .map(|(a, c)| if a % c == 0 { Some(a / c) } else { None });
        let first = ratios.next().flatten();
        first.is_some_and(|k| k > 0 && gpus.is_none_or(|g| k <= g)) && ratios.all(|r| r == first)
            || per_gpu.is_empty()
    };
    if consistent {
        return None;
    }
    let describe = |m: &BTreeMap<String, i64>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(p, n)| format!("{p} x{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let expected: BTreeMap<String, i64> = per_gpu
        .iter()
        .map(|(p, c)| (p.clone(), i64::from(*c)))
        .collect();
    Some(
        Finding::new(
            Severity::Warning,
            Category::Mig,
            "mig-layout-mismatch",
            format!("Node {}: MIG layout differs from its config {wanted}", n.name),
        )
        .object(ObjectRef::node(n.name))
        .evidence(format!(
            "{wanted} gives each {} GPU: {}",
            model.key,
            describe(&expected)
        ))
        .evidence(format!(
            "the node advertises: {}{}",
            describe(&actual),
            gpus.map(|g| format!(" ({g} GPUs)")).unwrap_or_default()
        ))
        .fix(format!(
            "someone changed MIG outside the label, or the apply did not finish; the label's value is \
             unchanged, so setting it again does nothing: compare with `gpuops mig assert` on the node, \
             then {}",
            restart_agent(n).0
        ))
        .command(restart_agent(n).1),
    )
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    fn mig_node(config: &str, state: &str, since_secs: i64) -> k8s_openapi::api::core::v1::Node {
        let mut n = gpu_node("gpu-1", "nvidia.com/mig-1g.10gb", 56);
        label(&mut n, "nvidia.com/mig.config", config);
        label(&mut n, "nvidia.com/mig.config.state", state);
        label(&mut n, "nvidia.com/mig.strategy", "mixed");
        annotate(
            &mut n,
            "gpuops.io/mig.config.state-since",
            &ago(since_secs).0.to_string(),
        );
        n
    }

    #[test]
    fn failed_and_stuck_states() {
        let n = mig_node("all-1g.10gb", "failed", 300);
        let e = event(
            "Node",
            "",
            "gpu-1",
            "MigConfigFailed",
            "creating 1g.10gb on GPU 3: Insufficient Resources",
            300,
        );
        let f = run(&snapshot(vec![n], vec![], vec![e]));
        let got = one(&f, "mig-config-failed");
        // The same label value again is no event: restart the agent, or ask for another config.
        assert!(
            !got.fix
                .contains("nvidia.com/mig.config=all-1g.10gb --overwrite"),
            "{}",
            got.fix
        );
        assert!(
            got.commands.contains(
                &"kubectl get pods -A -o wide --field-selector spec.nodeName=gpu-1".to_string()
            ) && got.commands.contains(
                &"kubectl label node gpu-1 nvidia.com/mig.config=all-balanced --overwrite"
                    .to_string()
            ),
            "{got:#?}"
        );
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("Insufficient Resources")),
            "{got:#?}"
        );

        let f = run(&snapshot(
            vec![mig_node("all-1g.10gb", "pending", 3600)],
            vec![],
            vec![],
        ));
        one(&f, "mig-config-stuck");
        // Look-alikes: pending for two minutes; success with the right layout.
        let f = run(&snapshot(
            vec![mig_node("all-1g.10gb", "pending", 120)],
            vec![],
            vec![],
        ));
        assert!(
            f.iter().all(|f| f.category != crate::Category::Mig),
            "{f:#?}"
        );
        let f = run(&snapshot(
            vec![mig_node("all-1g.10gb", "success", 120)],
            vec![],
            vec![],
        ));
        assert!(
            f.iter().all(|f| f.category != crate::Category::Mig),
            "{f:#?}"
        );
    }

    #[test]
    fn layout_differing_from_the_label() {
        // all-3g.40gb wanted, 1g.10gb instances advertised.
        let f = run(&snapshot(
            vec![mig_node("all-3g.40gb", "success", 120)],
            vec![],
            vec![],
        ));
        let got = one(&f, "mig-layout-mismatch");
        assert!(
            got.evidence[0].contains("3g.40gb x2") && got.evidence[1].contains("1g.10gb x56"),
            "{got:#?}"
        );
        // Look-alike: all-balanced on 8 GPUs, right counts.
        let mut n = mig_node("all-balanced", "success", 120);
        let s = n.status.as_mut().unwrap();
        s.capacity.as_mut().unwrap().clear();
        s.allocatable.as_mut().unwrap().clear();
        for (p, c) in [("1g.10gb", 16), ("2g.20gb", 8), ("3g.40gb", 8)] {
            set_resource(&mut n, &format!("nvidia.com/mig-{p}"), c, c);
        }
        let f = run(&snapshot(vec![n], vec![], vec![]));
        assert!(with_code(&f, "mig-layout-mismatch").is_empty(), "{f:#?}");
    }
}
