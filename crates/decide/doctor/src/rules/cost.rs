//! Cost: allocated GPUs idle for long, and free GPUs that nothing can use.

use crate::Options;
use crate::cluster::{Cluster, NodeView, human_duration, seconds_between};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::fit;
use crate::resources;
use std::collections::BTreeMap;

pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let mut out = idle_allocated(c, o);
    // The resources pending GPU pods ask for (a node offering one is awaited, not idle).
    let wanted: std::collections::BTreeSet<&str> = c
        .gpu_pods
        .iter()
        .filter(|p| p.pending_unbound())
        .flat_map(|p| p.gpus.keys().map(String::as_str))
        .collect();
    for n in c.gpu_nodes() {
        // A node that is down is the node rules' (and its taints are no one's to remove).
        if n.not_ready().is_some() || n.lifecycle_tainted() {
            continue;
        }
        out.extend(unusable_free(c, o, n, &wanted));
    }
    out
}

/// The price of one GPU-hour on a node: its annotation, its label, else `--gpu-hour-price`.
fn price(o: &Options, n: Option<&NodeView<'_>>) -> Option<f64> {
    let own = n.and_then(|n| {
        n.node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::PRICE_KEY))
            .map(String::as_str)
            .or_else(|| n.label(crate::PRICE_KEY))
            .and_then(|v| v.trim().trim_start_matches('$').parse::<f64>().ok())
            .filter(|p| p.is_finite() && *p >= 0.0)
    });
    own.or(o.gpu_hour_price)
}

fn money(v: f64) -> String {
    format!("{v:.2}")
}

/// `N GPU-hours per hour (at 2.50/GPU-hour: 20.00/hour, 480.00/day)`.
fn waste_rate(gpus: f64, price: Option<f64>) -> String {
    let mut s = format!(
        "wastes {} GPU-hour{} per hour",
        trim(gpus),
        if gpus == 1.0 { "" } else { "s" }
    );
    if let Some(p) = price {
        s.push_str(&format!(
            " (at {}/GPU-hour: {}/hour, {}/day)",
            money(p),
            money(gpus * p),
            money(gpus * p * 24.0)
        ));
    } else {
        s.push_str(&format!(
            " (set --gpu-hour-price or the node annotation {} for money)",
            crate::PRICE_KEY
        ));
    }
    s
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.strip_suffix(".0").map_or(s.clone(), str::to_string)
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
        let node = p.node.and_then(|n| c.node(n));
        let gpus = devices.len() as f64;
        let per_hour = price(o, node);
        let wasted = match c.snapshot.utilization_window.filter(|_| averaged) {
            Some(w) => {
                let hours = gpus * w.as_secs_f64() / 3600.0;
                let mut s = format!(
                    "{} GPU-hour{} wasted over the last {}",
                    trim(hours),
                    if hours == 1.0 { "" } else { "s" },
                    human_duration(w.as_secs() as i64)
                );
                if let Some(p) = per_hour {
                    s.push_str(&format!(" ({} at {}/GPU-hour)", money(hours * p), money(p)));
                }
                s.push_str(&format!("; it {}", waste_rate(gpus, per_hour)));
                s
            }
            None => format!("while idle it {}", waste_rate(gpus, per_hour)),
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
        ))
        .evidence(wasted);
        for (dev, u) in &devices {
            f = f.evidence(format!("DCGM_FI_DEV_GPU_UTIL {u:.0}% ({window}) on {dev}"));
        }
        if !averaged {
            f = f.evidence(
                "an instant sample: pass --prometheus for the average over the last hour"
                    .to_string(),
            );
        }
        out.push(
            f.fix(format!(
                "free the GPU if the work is done (kubectl -n {ns} delete pod {name}, or scale its controller to 0); \
                 for light or bursty work request a MIG instance or a time-sliced replica instead of a whole GPU"
            ))
            .command(format!("kubectl -n {ns} delete pod {name}")),
        );
    }
    out
}

fn unusable_free(
    c: &Cluster<'_>,
    o: &Options,
    n: &NodeView<'_>,
    wanted: &std::collections::BTreeSet<&str>,
) -> Vec<Finding> {
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
            .evidence(format!("{} free GPUs: {}", trim(free_gpus(n)), waste_rate(free_gpus(n), price(o, Some(n)))))
            .fix(format!(
                "uncordon it when maintenance is done (kubectl uncordon {0}), or remove the node to stop paying for it",
                n.name
            ))
            .command(format!("kubectl uncordon {}", n.name)),
        ];
    }
    // Taints no GPU pod in the cluster tolerates (the unhealthy taint is the health rule's).
    let blocking: Vec<&k8s_openapi::api::core::v1::Taint> = n
        .taints
        .iter()
        .filter(|t| t.key != crate::rules::health::TAINT)
        .collect();
    // Who tolerates a taint can only be told with every pod read (not with --node).
    if !blocking.is_empty() && !c.gpu_pods.is_empty() && c.snapshot.all_pods {
        let anyone = c.gpu_pods.iter().any(|p| {
            free.iter().any(|(r, _)| p.gpus.contains_key(*r))
                && blocking
                    .iter()
                    .all(|t| fit::tolerates_all(p.pod, std::slice::from_ref(*t)))
        });
        if !anyone {
            let taints: Vec<String> = blocking.iter().map(|t| fit::describe_taint(t)).collect();
            let remove = blocking
                .first()
                .map(|t| format!("kubectl taint node {} {}:{}-", n.name, t.key, t.effect));
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
                .evidence(format!("{} free GPUs: {}", trim(free_gpus(n)), waste_rate(free_gpus(n), price(o, Some(n)))))
                .fix(format!(
                    "remove the taint if it is stale ({}), add the toleration to the workloads meant for it, or scale the node away",
                    remove.clone().unwrap_or_default()
                ))
                .commands_from(remove),
            ];
        }
    }
    // A pod on its way here makes the node busy, not idle.
    let awaited = wanted.iter().any(|r| n.offers(r));
    // A node that just joined is not idle: pods may be on their way (autoscaler scale-up).
    let age = n
        .node
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| seconds_between(c.now(), t.0));
    let young = age.is_none_or(|a| a < o.idle_after.as_secs() as i64);
    if n.gpu_pods.is_empty() && n.requested.is_empty() && !awaited && !young {
        let idle_for = age.map(human_duration);
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
            .evidence(format!(
                "{} free GPUs: {}",
                trim(free_gpus(n)),
                waste_rate(free_gpus(n), price(o, Some(n)))
            ))
            .fix(
                "if it stays idle, let the autoscaler remove it (or scale its pool down)"
                    .to_string(),
            ),
        ];
    }
    Vec::new()
}

/// Free GPUs of a node in whole-GPU terms (MIG instances and replicas count as their share).
fn free_gpus(n: &NodeView<'_>) -> f64 {
    let gpus = n.gpu_count().max(1) as f64;
    n.allocatable
        .keys()
        .map(|r| {
            let alloc = n.allocatable_of(r).max(1) as f64;
            n.free(r) as f64 / alloc * gpus
        })
        .fold(0.0, f64::max)
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
    fn idle_gpus_carry_gpu_hours_and_money() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        annotate(&mut n, "gpuops.io/gpu-hour-price", "2.5");
        let pods = vec![running(
            pod("ml", "idle", &[("nvidia.com/gpu", 1)]),
            "gpu-1",
        )];
        let mut s = snapshot(vec![n.clone()], pods.clone(), vec![]);
        s.metrics = vec![util("idle", 0.0)];
        s.utilization_window = Some(Duration::from_secs(3600));
        let got = run(&s);
        let got = one(&got, "idle-allocated-gpu");
        assert!(
            got.evidence.iter().any(|e| e
                == "1 GPU-hour wasted over the last 1h (2.50 at 2.50/GPU-hour); it wastes 1 GPU-hour per hour (at 2.50/GPU-hour: 2.50/hour, 60.00/day)"),
            "{got:#?}"
        );
        assert_eq!(got.commands, vec!["kubectl -n ml delete pod idle"]);
        // The flag's price when the node has none; no price: GPU-hours only.
        let bare = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(vec![bare], pods, vec![]);
        s.metrics = vec![util("idle", 0.0)];
        let o = crate::Options {
            gpu_hour_price: Some(4.0),
            ..crate::Options::default()
        };
        let f = crate::diagnose(&s, &o);
        assert!(
            one(&f, "idle-allocated-gpu")
                .evidence
                .iter()
                .any(|e| e.contains("while idle it wastes 1 GPU-hour per hour (at 4.00/GPU-hour: 4.00/hour, 96.00/day)")),
            "{f:#?}"
        );
        let f = run(&s);
        assert!(
            one(&f, "idle-allocated-gpu")
                .evidence
                .iter()
                .any(|e| e.contains("set --gpu-hour-price")),
            "{f:#?}"
        );
    }

    #[test]
    fn an_idle_gpu_node_is_old_enough_to_be_idle() {
        let mut old = gpu_node("old", "nvidia.com/gpu", 8);
        label(&mut old, "gpuops.io/gpu-hour-price", "3");
        let mut new = gpu_node("new", "nvidia.com/gpu", 8);
        new.metadata.creation_timestamp = Some(ago(5));
        let f = run(&snapshot(vec![old, new], vec![], vec![]));
        let got = one(&f, "idle-gpu-node");
        assert_eq!(got.objects[0].name, "old");
        assert!(
            got.evidence
                .iter()
                .any(|e| e.contains("8 free GPUs: wastes 8 GPU-hours per hour (at 3.00/GPU-hour: 24.00/hour, 576.00/day)")),
            "{got:#?}"
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
