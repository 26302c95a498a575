//! Advice only from what accounts for every node: a pending pod's finding that would say "scale
//! up" or "nothing to do" is rewritten when the scheduler's message holds nodes back for reasons
//! the doctor does not recompute (topology spread, pod affinity, ports, volumes, claims...); any
//! other finding gets those reasons as evidence. See [`crate::sched`].

use crate::finding::Finding;
use crate::sched::{self, Kind, Message};

/// Codes whose advice assumes the GPUs, CPU and memory (or nothing) are all that holds the pod
/// back: scale up, wait, or moves planned on GPUs alone (the node they empty may be one a quoted
/// reason rules out).
const RESOURCE_ONLY: &[&str] = &[
    "insufficient-gpus",
    "fragmentation",
    "insufficient-cpu-memory",
    "gpus-freed-since",
    "pending-non-gpu",
    "not-scheduled",
];

/// One line per reason: count, text, plugin, and whether the doctor explains it or only quotes it.
fn reason_lines(m: &Message) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(pre) = &m.prefilter {
        out.push(format!(
            "all {} nodes: {pre} (a PreFilter plugin; quoted, the doctor does not check it)",
            m.nodes.unwrap_or(0)
        ));
    }
    for r in &m.reasons {
        out.push(format!(
            "{} node(s): {} ({}; {})",
            r.count,
            r.text,
            r.kind.plugin(),
            if r.kind.explained() {
                "the doctor recomputes this from the objects"
            } else {
                "quoted, the doctor does not check it"
            }
        ));
    }
    if let Some(p) = &m.preemption {
        out.push(format!("preemption: {p}"));
    }
    out
}

/// The plugins of the reasons the doctor only quotes, each once, in the message's order.
fn quoted_plugins(m: &Message) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    for r in m.quoted() {
        if !v.contains(&r.kind.plugin()) {
            v.push(r.kind.plugin());
        }
    }
    if m.prefilter.is_some() && v.is_empty() {
        v.push("a PreFilter plugin");
    }
    v
}

fn advice(m: &Message) -> String {
    let mut kinds: Vec<&Kind> = Vec::new();
    for r in m.quoted() {
        if !kinds.contains(&&r.kind) {
            kinds.push(&r.kind);
        }
    }
    let mut lines: Vec<String> = kinds.iter().map(|k| k.advice().to_string()).collect();
    if let Some(pre) = &m.prefilter {
        lines.push(format!(
            "the scheduler stopped before looking at nodes: {pre}; fix that first"
        ));
    }
    lines.join("; ")
}

/// Rewrites or annotates `f` from the scheduler's message.
pub(super) fn account(mut f: Finding, message: Option<&str>) -> Finding {
    let Some(m) = message.and_then(sched::parse) else {
        return f;
    };
    if !m.has_unexplained() {
        return f;
    }
    let nodes = m.nodes.unwrap_or(0);
    let held = if m.prefilter.is_some() {
        nodes
    } else {
        m.quoted_nodes()
    };
    let plugins = quoted_plugins(&m).join(", ");
    let resource_only = RESOURCE_ONLY.contains(&f.code);
    if !resource_only {
        let quoted: Vec<String> = m.quoted().map(ToString::to_string).collect();
        f.evidence.push(format!(
            "the scheduler also names reasons the doctor does not check ({plugins}): {}",
            if quoted.is_empty() {
                m.prefilter.clone().unwrap_or_default()
            } else {
                quoted.join(", ")
            }
        ));
        return f;
    }
    let pod = f
        .objects
        .first()
        .map(|o| format!("{}/{}", o.namespace.as_deref().unwrap_or(""), o.name))
        .unwrap_or_default();
    let gpus_fit = matches!(
        f.code,
        "gpus-freed-since" | "pending-non-gpu" | "not-scheduled"
    );
    let mut evidence: Vec<String> = f.evidence.first().cloned().into_iter().collect();
    evidence.extend(reason_lines(&m));
    for e in f.evidence.iter().skip(1) {
        evidence.push(format!("GPUs: {e}"));
    }
    let (code, title, fix) = if gpus_fit {
        (
            "pending-non-gpu",
            format!(
                "Pod {pod} has room for its GPUs but {plugins} hold{} it back on {held} of {nodes} nodes",
                if quoted_plugins(&m).len() == 1 {
                    "s"
                } else {
                    ""
                }
            ),
            format!(
                "the GPUs are not the problem, so there is no waiting it out: {}",
                advice(&m)
            ),
        )
    } else {
        (
            "scheduler-constraint",
            format!(
                "Pod {pod} is held back by {plugins} on {held} of {nodes} nodes, not only by GPUs"
            ),
            format!(
                "{}; adding GPU nodes is not the fix while these reasons hold nodes back (the GPU \
                 shortage, if any, is in the evidence)",
                advice(&m)
            ),
        )
    };
    f.code = code;
    f.title = title;
    f.evidence = evidence;
    f.fix = fix;
    // The commands belonged to the replaced advice (moves, the scheduler's pods).
    f.commands.clear();
    f
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    const SPREAD: &str = "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.";

    fn scene(message: &str, used: i64, want: i64, extra_nodes: usize) -> Vec<crate::Finding> {
        let mut nodes: Vec<_> = (1..=3)
            .map(|i| gpu_node(&format!("gpu-{i}"), "nvidia.com/gpu", 8))
            .collect();
        for i in 0..extra_nodes {
            nodes.push(node(&format!("cpu-{i}")));
        }
        let mut pods: Vec<_> = (1..=3)
            .map(|i| {
                running(
                    pod("ml", &format!("busy-{i}"), &[("nvidia.com/gpu", used)]),
                    &format!("gpu-{i}"),
                )
            })
            .collect();
        pods.push(unschedulable(
            pod("ml", "train", &[("nvidia.com/gpu", want)]),
            message,
        ));
        run(&snapshot(
            nodes,
            pods,
            vec![event("Pod", "ml", "train", "FailedScheduling", message, 20)],
        ))
    }

    fn says_nothing_wrong(f: &crate::Finding) {
        for bad in ["scale", "nothing to do", "retries and should place"] {
            assert!(!f.fix.contains(bad), "{bad}: {}", f.fix);
        }
    }

    #[test]
    fn free_gpus_with_a_topology_spread_reason_is_not_nothing_to_do() {
        // GPUs free on every node; the scheduler blames topology spread.
        let f = scene(SPREAD, 2, 2, 0);
        assert!(with_code(&f, "gpus-freed-since").is_empty(), "{f:#?}");
        let got = one(&f, "pending-non-gpu");
        says_nothing_wrong(got);
        assert!(
            got.title
                .contains("PodTopologySpread holds it back on 3 of 3 nodes"),
            "{got:#?}"
        );
        assert!(got.fix.contains("maxSkew"), "{}", got.fix);
        assert!(
            got.evidence.iter().any(|e| e.contains(
                "3 node(s): node(s) didn't match pod topology spread constraints (PodTopologySpread; quoted"
            )),
            "{got:#?}"
        );
    }

    #[test]
    fn a_shortage_beside_other_reasons_is_not_scale_up() {
        // Variants: pod anti-affinity, host ports, a volume zone, a claim, a PreFilter message,
        // each beside a real GPU shortage on the other nodes.
        for (msg, plugin) in [
            (
                "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match pod anti-affinity rules. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.",
                "InterPodAffinity",
            ),
            (
                "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 1 node(s) didn't have free ports for the requested pod ports.",
                "NodePorts",
            ),
            (
                "0/3 nodes are available: 1 node(s) had no available volume zone, 2 Insufficient nvidia.com/gpu.",
                "VolumeZone",
            ),
            (
                "0/3 nodes are available: 3 cannot allocate all claims.",
                "DynamicResources",
            ),
            (
                "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
                "a PreFilter plugin",
            ),
        ] {
            let f = scene(msg, 7, 4, 0);
            assert!(
                with_code(&f, "insufficient-gpus").is_empty(),
                "{msg}: {f:#?}"
            );
            let got = one(&f, "scheduler-constraint");
            says_nothing_wrong(got);
            assert!(got.title.contains(plugin), "{msg}: {}", got.title);
            assert!(
                got.fix.contains("adding GPU nodes is not the fix"),
                "{}",
                got.fix
            );
            assert!(
                got.evidence.iter().any(|e| e.starts_with("GPUs: ")),
                "{got:#?}"
            );
        }
        // Fragmented free GPUs behind a pod-affinity reason: no moves, no scale-up either.
        let msg = "0/3 nodes are available: 3 node(s) didn't match pod affinity rules.";
        let f = scene(msg, 6, 4, 0);
        let got = one(&f, "scheduler-constraint");
        assert!(got.commands.is_empty(), "{got:#?}");
    }

    #[test]
    fn moves_planned_on_gpus_alone_are_not_advised_behind_another_reason() {
        // gpu-1: three 2-GPU Deployment pods (2 free); gpu-2, gpu-3: a 5-GPU one each (3 free):
        // moving one pod off gpu-1 would make room, if GPUs were all that mattered.
        let owned = |mut p: k8s_openapi::api::core::v1::Pod| {
            p.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: "rs".into(),
                    uid: "u".into(),
                    controller: Some(true),
                    ..Default::default()
                },
            ]);
            p
        };
        let nodes: Vec<_> = (1..=3)
            .map(|i| gpu_node(&format!("gpu-{i}"), "nvidia.com/gpu", 8))
            .collect();
        let mut pods: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|n| owned(running(pod("ml", n, &[("nvidia.com/gpu", 2)]), "gpu-1")))
            .collect();
        for i in [2, 3] {
            pods.push(owned(running(
                pod("ml", &format!("big-{i}"), &[("nvidia.com/gpu", 5)]),
                &format!("gpu-{i}"),
            )));
        }
        pods.push(pod("ml", "train", &[("nvidia.com/gpu", 4)]));
        let plain = run(&snapshot(nodes.clone(), pods.clone(), vec![]));
        assert!(!one(&plain, "fragmentation").commands.is_empty());
        let msg = "0/3 nodes are available: 1 node(s) didn't match pod topology spread constraints, 2 Insufficient nvidia.com/gpu.";
        let f = run(&snapshot(
            nodes,
            pods,
            vec![event("Pod", "ml", "train", "FailedScheduling", msg, 5)],
        ));
        let got = one(&f, "scheduler-constraint");
        assert!(
            got.commands.is_empty() && !got.fix.contains("delete pod"),
            "{got:#?}"
        );
        assert!(
            got.evidence.iter().any(|e| e.starts_with("GPUs: planned:")),
            "{got:#?}"
        );
    }

    #[test]
    fn reasons_the_doctor_recomputes_keep_its_own_advice() {
        // Look-alikes: only resources, taints, selectors, cordons: the computed advice stands.
        let msg = "0/5 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 3 Insufficient nvidia.com/gpu. preemption: 0/5 nodes are available: 3 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.";
        let f = scene(msg, 7, 4, 2);
        assert!(one(&f, "insufficient-gpus").fix.contains("scale the"));
        let f = scene(
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            2,
            2,
            0,
        );
        one(&f, "gpus-freed-since");
        // Another finding keeps its code and gets the quoted reasons as evidence.
        let mut n = gpu_node("gpu-9", "nvidia.com/gpu", 8);
        taint(&mut n, "dedicated", "ml", "NoSchedule");
        let msg = "0/1 nodes are available: 1 node(s) didn't match pod topology spread constraints (missing required label).";
        let f = run(&snapshot(
            vec![n],
            vec![unschedulable(pod("ml", "t", &[("nvidia.com/gpu", 1)]), msg)],
            vec![event("Pod", "ml", "t", "FailedScheduling", msg, 5)],
        ));
        let got = one(&f, "untolerated-taint");
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("does not check (PodTopologySpread)")),
            "{got:#?}"
        );
    }
}
