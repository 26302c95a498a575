//! Cost: allocated GPUs idle for long, and free GPUs that nothing can use.

use crate::Options;
use crate::cluster::{Cluster, NodeView, human_duration, seconds_between};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::fit;
use crate::resources;
use std::collections::BTreeMap;

pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let mut out = idle_allocated(c, o);
    for n in c.gpu_nodes() {
        out.extend(unusable_free(c, n));
    }
    out
}

fn idle_allocated(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    // (namespace, pod) -> devices with their utilization
    let mut by_pod: BTreeMap<(&str, &str), Vec<(String, f64)>> = BTreeMap::new();
    for s in &c.snapshot.metrics {
        if s.name != "DCGM_FI_DEV_GPU_UTIL" {
            continue;
        }
        let (Some(ns), Some(pod)) = (s.label("namespace"), s.label("pod")) else {
            continue;
        };
        let dev = format!(
            "GPU {} {} on {}",
            s.label("gpu").unwrap_or("?"),
            s.label("UUID").unwrap_or(""),
            s.host().unwrap_or("?")
        );
        by_pod.entry((ns, pod)).or_default().push((dev, s.value));
    }
    if by_pod.is_empty() {
        return Vec::new();
    }
    let pods: BTreeMap<(&str, &str), &crate::cluster::PodView<'_>> = c
        .gpu_pods
        .iter()
        .filter(|p| p.active())
        .map(|p| ((p.namespace, p.name), p))
        .collect();
    let averaged = c
        .snapshot
        .utilization_window
        .is_some_and(|w| w >= o.idle_after);
    let mut out = Vec::new();
    for ((ns, name), devices) in by_pod {
        let Some(p) = pods.get(&(ns, name)) else {
            continue;
        };
        if devices.iter().any(|(_, u)| *u >= o.idle_util_percent) {
            continue;
        }
        let started = p
            .pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or(p.created());
        let Some(started) = started else { continue };
        let up = seconds_between(c.now(), started);
        if up < o.idle_after.as_secs() as i64 {
            continue;
        }
        let window = match c.snapshot.utilization_window {
            Some(w) => format!("average over {}", human_duration(w.as_secs() as i64)),
            None => "now (one sample)".to_string(),
        };
        let mut f = Finding::new(
            if averaged {
                Severity::Warning
            } else {
                Severity::Info
            },
            Category::Cost,
            "idle-allocated-gpu",
            format!(
                "Pod {ns}/{name} holds {} GPU(s) it does not use",
                devices.len()
            ),
        )
        .object(ObjectRef::pod(ns, name))
        .evidence(format!(
            "running for {}; holds {}",
            human_duration(up),
            resources::describe(&p.gpus)
        ));
        for (dev, u) in &devices {
            f = f.evidence(format!("DCGM_FI_DEV_GPU_UTIL {u:.0}% ({window}) on {dev}"));
        }
        if !averaged {
            f = f.evidence(
                "an instant sample: pass --prometheus for the average over the last hour"
                    .to_string(),
            );
        }
        out.push(f.fix(format!(
            "free the GPU if the work is done (kubectl -n {ns} delete pod {name}, or scale its controller to 0); \
             for light or bursty work request a MIG instance or a time-sliced replica instead of a whole GPU"
        )));
    }
    out
}

fn unusable_free(c: &Cluster<'_>, n: &NodeView<'_>) -> Vec<Finding> {
    let free: Vec<(&String, i64)> = n
        .allocatable
        .keys()
        .map(|r| (r, n.free(r)))
        .filter(|(_, f)| *f > 0)
        .collect();
    if free.is_empty() {
        return Vec::new();
    }
    let free_text = free
        .iter()
        .map(|(r, f)| format!("{r} {f}/{} free", n.allocatable_of(r)))
        .collect::<Vec<_>>()
        .join(", ");
    let cordoned = n.taints.iter().any(|t| t.key == fit::UNSCHEDULABLE_TAINT);
    if cordoned {
        return vec![
            Finding::new(
                Severity::Info,
                Category::Cost,
                "unusable-free-gpus",
                format!("Node {} is cordoned with free GPUs", n.name),
            )
            .object(ObjectRef::node(n.name))
            .evidence(free_text)
            .fix(format!(
                "uncordon it when maintenance is done (kubectl uncordon {0}), or remove the node to stop paying for it",
                n.name
            )),
        ];
    }
    // Taints no GPU pod in the cluster tolerates (the unhealthy taint is the health rule's).
    let blocking: Vec<&k8s_openapi::api::core::v1::Taint> = n
        .taints
        .iter()
        .filter(|t| t.key != crate::rules::health::TAINT)
        .collect();
    if !blocking.is_empty() && !c.gpu_pods.is_empty() {
        let anyone = c.gpu_pods.iter().any(|p| {
            free.iter().any(|(r, _)| p.gpus.contains_key(*r))
                && blocking
                    .iter()
                    .all(|t| fit::untolerated(p.pod, std::slice::from_ref(*t)).is_empty())
        });
        if !anyone {
            let taints: Vec<String> = blocking.iter().map(|t| fit::describe_taint(t)).collect();
            return vec![
                Finding::new(
                    Severity::Warning,
                    Category::Cost,
                    "unusable-free-gpus",
                    format!("Node {}: free GPUs that no GPU pod tolerates", n.name),
                )
                .object(ObjectRef::node(n.name))
                .evidence(free_text)
                .evidence(format!("taints: {}; none of the {} GPU pods tolerates them", taints.join(", "), c.gpu_pods.len()))
                .fix(format!(
                    "remove the taint if it is stale (kubectl taint node {} {}-), add the toleration to the workloads meant for it, or scale the node away",
                    n.name,
                    blocking.first().map_or(String::new(), |t| format!("{}:{}", t.key, t.effect))
                )),
            ];
        }
    }
    // A pod on its way here makes the node busy, not idle.
    let awaited = c
        .gpu_pods
        .iter()
        .any(|p| p.pending_unbound() && p.gpus.keys().any(|r| n.offers(r)));
    if n.gpu_pods.is_empty() && n.requested.is_empty() && !awaited {
        let idle_for = n
            .node
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| human_duration(seconds_between(c.now(), t.0)));
        return vec![
            Finding::new(
                Severity::Info,
                Category::Cost,
                "idle-gpu-node",
                format!("Node {}: no pod uses its GPUs", n.name),
            )
            .object(ObjectRef::node(n.name))
            .evidence(free_text)
            .evidence(format!(
                "no GPU pod bound{}",
                idle_for
                    .map(|d| format!("; node age {d}"))
                    .unwrap_or_default()
            ))
            .fix(
                "if it stays idle, let the autoscaler remove it (or scale its pool down)"
                    .to_string(),
            ),
        ];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;
    use std::time::Duration;

    fn util(pod: &str, v: f64) -> crate::Sample {
        sample(
            "DCGM_FI_DEV_GPU_UTIL",
            &[
                ("Hostname", "gpu-1"),
                ("gpu", "0"),
                ("UUID", "GPU-0"),
                ("namespace", "ml"),
                ("pod", pod),
            ],
            v,
        )
    }

    #[test]
    fn idle_allocated_gpus() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let pods = vec![
            running(pod("ml", "idle", &[("nvidia.com/gpu", 1)]), "gpu-1"),
            running(pod("ml", "busy", &[("nvidia.com/gpu", 1)]), "gpu-1"),
        ];
        let mut s = snapshot(vec![n], pods, vec![]);
        s.metrics = vec![util("idle", 0.0), util("busy", 93.0)];
        s.utilization_window = Some(Duration::from_secs(3600));
        let f = run(&s);
        let got = one(&f, "idle-allocated-gpu");
        assert_eq!(got.severity, crate::Severity::Warning);
        assert_eq!(got.objects[0].name, "idle");
        // An instant sample is only a hint.
        s.utilization_window = None;
        assert_eq!(
            one(&run(&s), "idle-allocated-gpu").severity,
            crate::Severity::Info
        );
    }

    #[test]
    fn free_gpus_nothing_can_use() {
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        taint(&mut a, "team", "research", "NoSchedule");
        let b = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        let pods = vec![running(pod("ml", "x", &[("nvidia.com/gpu", 1)]), "gpu-2")];
        let f = run(&snapshot(vec![a.clone(), b.clone()], pods, vec![]));
        let got = one(&f, "unusable-free-gpus");
        assert_eq!(got.objects[0].name, "gpu-1");
        // Look-alike: a pod tolerates the taint.
        let pods = vec![
            running(pod("ml", "x", &[("nvidia.com/gpu", 1)]), "gpu-2"),
            running(
                tolerate(pod("r", "y", &[("nvidia.com/gpu", 1)]), "team"),
                "gpu-1",
            ),
        ];
        assert!(
            with_code(
                &run(&snapshot(vec![a, b], pods, vec![])),
                "unusable-free-gpus"
            )
            .is_empty()
        );
    }
}
