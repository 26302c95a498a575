//! A pending pod the scheduler has nominated to a node after preempting pods there: it waits for
//! its victims to exit, which is not a shortage (the 1.35 scheduler's DefaultPreemption marks
//! each victim `DisruptionTarget=True` reason `PreemptionByScheduler`, records a `Preempted`
//! event `Preempted by pod <uid> on node <node>`, deletes it, and sets the preemptor's
//! `status.nominatedNodeName`).

use crate::cluster::{
    Cluster, PodView, describe_event, human_duration, list_some, seconds_between,
};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use k8s_openapi::api::core::v1::Pod;

/// The condition and reason the scheduler puts on a victim.
const DISRUPTION_TARGET: &str = "DisruptionTarget";
const BY_SCHEDULER: &str = "PreemptionByScheduler";

/// The pod's nominated node, when the scheduler set one.
pub(super) fn nominated<'a>(p: &PodView<'a>) -> Option<&'a str> {
    p.pod
        .status
        .as_ref()?
        .nominated_node_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

/// Why a pod on the nominated node counts as a victim on its way out, if it does.
fn leaving(c: &Cluster<'_>, pod: &Pod) -> Option<String> {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| matches!(p, "Succeeded" | "Failed"));
    if finished {
        return None;
    }
    let target = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|cond| cond.type_ == DISRUPTION_TARGET && cond.status == "True");
    let deleting = pod.metadata.deletion_timestamp.as_ref().map(|t| {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| pod.spec.as_ref()?.termination_grace_period_seconds)
            .unwrap_or(30);
        format!(
            "terminating, deletion due {} (grace period {grace}s)",
            if t.0 > c.now() {
                format!("in {}", human_duration(seconds_between(t.0, c.now())))
            } else {
                format!("{} ago", human_duration(seconds_between(c.now(), t.0)))
            }
        )
    });
    match (target, deleting) {
        (Some(t), d) => Some(format!(
            "{DISRUPTION_TARGET}=True {}: {}{}",
            t.reason.as_deref().unwrap_or(""),
            t.message.as_deref().unwrap_or("").trim(),
            d.map(|d| format!("; {d}")).unwrap_or_default()
        )),
        (None, Some(d)) => Some(d),
        (None, None) => None,
    }
}

/// The finding for a pod waiting on its preemption, or `None` when no victim is seen leaving the
/// nominated node and no `Preempted` event names it (then the pod is diagnosed as any other).
pub(super) fn in_progress(c: &Cluster<'_>, p: &PodView<'_>) -> Option<Finding> {
    let node = nominated(p)?;
    let uid = p.pod.metadata.uid.as_deref().unwrap_or("");
    let mut victims: Vec<(String, String, bool)> = Vec::new();
    for pod in &c.snapshot.pods {
        let on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        if !on {
            continue;
        }
        if let Some(why) = leaving(c, pod) {
            let by_scheduler = why.contains(BY_SCHEDULER);
            victims.push((
                format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or("default"),
                    pod.metadata.name.as_deref().unwrap_or("")
                ),
                why,
                by_scheduler,
            ));
        }
    }
    // Preempted events outlive their victims: the preemption happened even when they are gone.
    let suffix = format!(" on node {node}");
    let events: Vec<String> = c
        .all_events()
        .filter(|e| e.reason.as_deref() == Some("Preempted"))
        .filter(|e| {
            let m = e.message.as_deref().unwrap_or("").trim();
            m.ends_with(&suffix) && (uid.is_empty() || m.contains(uid))
        })
        .take(4)
        .map(|e| {
            let o = &e.involved_object;
            format!(
                "{}/{}: {}",
                o.namespace.as_deref().unwrap_or(""),
                o.name.as_deref().unwrap_or(""),
                describe_event(e, c.now())
            )
        })
        .collect();
    if victims.is_empty() && events.is_empty() {
        return None;
    }
    let who = format!("{}/{}", p.namespace, p.name);
    let by_scheduler = victims.iter().filter(|v| v.2).count();
    let mut f = Finding::new(
        Severity::Info,
        Category::Scheduling,
        "preemption-in-progress",
        if victims.is_empty() {
            format!("Pod {who} preempted pods on {node}: they are gone, it binds there next")
        } else {
            format!(
                "Pod {who} is preempting {} pod{} on {node} and waits for {} to exit",
                victims.len(),
                if victims.len() == 1 { "" } else { "s" },
                if victims.len() == 1 { "it" } else { "them" }
            )
        },
    )
    .object(ObjectRef::pod(p.namespace, p.name))
    .object(ObjectRef::node(node))
    .evidence(format!("status.nominatedNodeName: {node}"));
    for (name, why, _) in victims.iter().take(6) {
        f = f.evidence(format!("{name}: {why}"));
    }
    if victims.len() > 6 {
        f = f.evidence(format!("and {} more victims", victims.len() - 6));
    }
    for e in events {
        f = f.evidence(e);
    }
    let cmd = format!("kubectl get pods -A -o wide --field-selector spec.nodeName={node}");
    let f = f.fix(format!(
        "nothing is short: the scheduler chose {node} and preempted lower-priority pods ({}) to make \
         room; the pod binds when they have exited (their termination grace period), so do not add \
         nodes or change requests for it. Watch the victims leave: {cmd}; if they stay Terminating \
         long past their grace period, the kubelet on {node} is not finishing them (kubectl describe \
         node {node})",
        if victims.is_empty() {
            "already gone".to_string()
        } else {
            format!(
                "{}{}",
                list_some(victims.iter().map(|v| v.0.as_str()), 4),
                if by_scheduler == victims.len() {
                    ", marked PreemptionByScheduler"
                } else {
                    ""
                }
            )
        }
    ))
    .command(cmd);
    Some(f)
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use k8s_openapi::api::core::v1::{Pod, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const FULL: &str = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.";

    fn nominate(mut p: Pod, node: &str) -> Pod {
        p.metadata.uid = Some("uid-high".into());
        p.status
            .get_or_insert_with(Default::default)
            .nominated_node_name = Some(node.into());
        p
    }

    fn victim(mut p: Pod, condition: bool, deleting: bool) -> Pod {
        if condition {
            p.status
                .get_or_insert_with(Default::default)
                .conditions
                .get_or_insert_with(Vec::new)
                .push(PodCondition {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                    reason: Some("PreemptionByScheduler".into()),
                    message: Some(
                        "default-scheduler: preempting to accommodate a higher priority pod".into(),
                    ),
                    ..Default::default()
                });
        }
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(now() + std::time::Duration::from_secs(20)));
            p.metadata.deletion_grace_period_seconds = Some(30);
        }
        p
    }

    fn cluster(
        victims: Vec<Pod>,
        events: Vec<k8s_openapi::api::core::v1::Event>,
    ) -> Vec<crate::Finding> {
        let nodes = vec![
            gpu_node("gpu-1", "nvidia.com/gpu", 8),
            gpu_node("gpu-2", "nvidia.com/gpu", 8),
        ];
        let mut pods = victims;
        pods.push(running(
            pod("ml", "other", &[("nvidia.com/gpu", 8)]),
            "gpu-2",
        ));
        pods.push(nominate(
            unschedulable(pod("ml", "high", &[("nvidia.com/gpu", 8)]), FULL),
            "gpu-1",
        ));
        let mut events = events;
        events.push(event("Pod", "ml", "high", "FailedScheduling", FULL, 10));
        run(&snapshot(nodes, pods, events))
    }

    #[test]
    fn a_preemption_under_way_is_not_a_shortage() {
        let preempted = event(
            "Pod",
            "batch",
            "low",
            "Preempted",
            "Preempted by pod uid-high on node gpu-1",
            12,
        );
        // Variants: the condition and a deletion; the condition alone; a deletion alone; only
        // the event left (victims gone).
        for (condition, deleting, with_victim) in [
            (true, true, true),
            (true, false, true),
            (false, true, true),
            (false, false, false),
        ] {
            let victims = if with_victim {
                vec![victim(
                    running(pod("batch", "low", &[("nvidia.com/gpu", 8)]), "gpu-1"),
                    condition,
                    deleting,
                )]
            } else {
                vec![]
            };
            let f = cluster(victims, vec![preempted.clone()]);
            let got = one(&f, "preemption-in-progress");
            assert_eq!(got.severity, crate::Severity::Info);
            assert!(got.title.contains("on gpu-1"), "{got:#?}");
            assert!(
                !got.fix.contains("scale") && got.fix.contains("do not add nodes"),
                "{}",
                got.fix
            );
            assert!(
                with_code(&f, "insufficient-gpus").is_empty()
                    && with_code(&f, "fragmentation").is_empty(),
                "{f:#?}"
            );
            if condition {
                assert!(
                    got.evidence
                        .iter()
                        .any(|e| e
                            .contains("batch/low: DisruptionTarget=True PreemptionByScheduler")),
                    "{got:#?}"
                );
            }
            assert!(
                got.evidence
                    .iter()
                    .any(|e| e.contains("Preempted by pod uid-high"))
            );
        }
    }

    #[test]
    fn a_nomination_without_victims_is_diagnosed_as_usual() {
        // Look-alike: nominated (a stale nomination), nothing leaving, no Preempted event: the
        // cluster is full and that is what the doctor says.
        let f = cluster(
            vec![running(
                pod("batch", "low", &[("nvidia.com/gpu", 8)]),
                "gpu-1",
            )],
            vec![event(
                "Pod",
                "batch",
                "x",
                "Preempted",
                "Preempted by pod someone-else on node gpu-1",
                5,
            )],
        );
        assert!(with_code(&f, "preemption-in-progress").is_empty(), "{f:#?}");
        one(&f, "insufficient-gpus");
    }
}
