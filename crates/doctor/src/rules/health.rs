//! GPU health: the agent's GPUHealthy condition, XID counters, lost GPUs and devices withheld as
//! unhealthy, with the action per XID class.

use crate::Options;
use crate::cluster::{Cluster, NodeView};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use crate::snapshot::Sample;
use gpuops_catalog::xid::{self, XidClass};
use std::collections::{BTreeMap, BTreeSet};

pub const CONDITION: &str = "GPUHealthy";
pub const TAINT: &str = "gpuops.io/gpu-unhealthy";

#[derive(Default)]
struct Host {
    /// (gpu, UUID, xid) -> (count, pods)
    xids: BTreeMap<(String, String, u64), (f64, BTreeSet<String>)>,
    unhealthy: BTreeSet<String>,
    gpus: Option<f64>,
    healthy: Option<f64>,
}

fn device(s: &Sample) -> String {
    let gpu = s.label("gpu").unwrap_or("?");
    let uuid = s.label("UUID").unwrap_or("");
    match s.label("GPU_I_ID") {
        Some(gi) => format!("GPU {gpu} ({uuid}) MIG instance {gi}"),
        None if uuid.is_empty() => format!("GPU {gpu}"),
        None => format!("GPU {gpu} ({uuid})"),
    }
}

fn hosts(samples: &[Sample]) -> BTreeMap<String, Host> {
    let mut out: BTreeMap<String, Host> = BTreeMap::new();
    for s in samples {
        let Some(host) = s.host() else { continue };
        match s.name.as_str() {
            "gpuops_xid_errors_total" if s.value > 0.0 => {
                let Some(code) = s.label("err_code").and_then(|c| c.parse::<u64>().ok()) else {
                    continue;
                };
                let e = out
                    .entry(host.to_string())
                    .or_default()
                    .xids
                    .entry((
                        s.label("gpu").unwrap_or("?").to_string(),
                        s.label("UUID").unwrap_or("").to_string(),
                        code,
                    ))
                    .or_default();
                e.0 = e.0.max(s.value);
                if let (Some(ns), Some(pod)) = (s.label("namespace"), s.label("pod")) {
                    e.1.insert(format!("{ns}/{pod}"));
                }
            }
            "gpuops_device_healthy" if s.value < 1.0 => {
                out.entry(host.to_string())
                    .or_default()
                    .unhealthy
                    .insert(device(s));
            }
            "gpuops_node_gpus" => out.entry(host.to_string()).or_default().gpus = Some(s.value),
            "gpuops_node_gpus_healthy" => {
                out.entry(host.to_string()).or_default().healthy = Some(s.value);
            }
            _ => {}
        }
    }
    out
}

/// GPU indexes named in a condition message (`GPU 3 (GPU-...)`); not the `GPU` of
/// `1 of 1 GPU unhealthy` or `reset the GPU`.
fn gpus_in(message: &str) -> BTreeSet<String> {
    message
        .match_indices("GPU ")
        .filter_map(|(i, _)| {
            let idx: String = message[i + 4..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            (!idx.is_empty()).then_some(idx)
        })
        .collect()
}

/// XID numbers named in a condition message (`XID 48`, `Xid 79`).
fn xids_in(message: &str) -> Vec<u64> {
    let lower = message.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut rest = lower.as_str();
    while let Some(i) = rest.find("xid") {
        rest = &rest[i + 3..];
        let digits: String = rest
            .trim_start_matches([' ', ':', '='])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(x) = digits.parse() {
            out.push(x);
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn class_rank(c: XidClass) -> u8 {
    match c {
        XidClass::RebootNode => 6,
        XidClass::Drain => 5,
        XidClass::ResetGpu => 4,
        XidClass::Unknown => 3,
        XidClass::RestartApp => 2,
        XidClass::Watch => 1,
        XidClass::Application => 0,
    }
}

fn fix_for(class: XidClass, node: &str, gpus: &str, lost: bool) -> String {
    let drain = format!(
        "kubectl cordon {node} && kubectl drain {node} --ignore-daemonsets --delete-emptydir-data"
    );
    if lost || class == XidClass::RebootNode {
        return format!(
            "{drain}; reboot the node (a GPU off the bus needs it); if the GPU is still missing after the reboot, \
             have it replaced; then kubectl uncordon {node}"
        );
    }
    match class {
        XidClass::Drain => format!(
            "{drain}; reset the GPU (nvidia-smi -r -i {gpus}) or reboot; if it repeats, replace the GPU; then kubectl uncordon {node}"
        ),
        XidClass::ResetGpu => format!(
            "move the pods off {gpus} (or {drain}), reset it: nvidia-smi -r -i {gpus}; the agent marks it healthy again after its quiet period"
        ),
        XidClass::RestartApp => {
            "restart the application's pod (kubectl delete pod NS/NAME); the GPU itself is usable"
                .into()
        }
        XidClass::Watch | XidClass::Unknown | XidClass::RebootNode => format!(
            "watch for repeats (gpuops_xid_errors_total on {node}); look the XID up in NVIDIA's catalogue"
        ),
        XidClass::Application => {
            "fix the application (illegal memory access, bad kernel); the GPU is fine".into()
        }
    }
}

pub(super) fn check(c: &Cluster<'_>, _o: &Options) -> Vec<Finding> {
    let mut hosts = hosts(&c.snapshot.metrics);
    let mut out = Vec::new();
    for n in c.gpu_nodes() {
        let host = hosts.remove(n.name);
        out.extend(node_health(n, host.as_ref()));
    }
    // Metrics from nodes the cluster does not list (yet, or any more).
    for (name, host) in hosts {
        out.extend(metrics_only(&name, &host));
    }
    out
}

fn node_health(n: &NodeView<'_>, host: Option<&Host>) -> Vec<Finding> {
    let mut evidence = Vec::new();
    let mut severity: Option<Severity> = None;
    let raise = |s: Severity, sev: &mut Option<Severity>| {
        *sev = Some(sev.map_or(s, |cur| cur.min(s)));
    };
    let mut classes: Vec<XidClass> = Vec::new();
    let mut lost = false;
    let mut gpus: BTreeSet<String> = BTreeSet::new();
    let mut app_only = true;

    let cond = n
        .node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == CONDITION);
    if let Some(cond) = cond.filter(|c| c.status == "False") {
        let reason = cond.reason.as_deref().unwrap_or("");
        let msg = cond.message.as_deref().unwrap_or("");
        evidence.push(format!("condition {CONDITION}=False {reason}: {msg}"));
        raise(Severity::Critical, &mut severity);
        app_only = false;
        lost |= reason == "GPULost" || msg.contains("lost") || msg.contains("fell off the bus");
        for x in xids_in(msg) {
            classes.push(xid::describe(x).class);
        }
        gpus.extend(gpus_in(msg));
    }
    if let Some(t) = n.taints.iter().find(|t| t.key == TAINT) {
        evidence.push(format!("taint {}", crate::fit::describe_taint(t)));
    }
    if let Some(h) = host {
        for ((gpu, uuid, code), (count, pods)) in &h.xids {
            let info = xid::describe(*code);
            let on = if pods.is_empty() {
                String::new()
            } else {
                format!(" (pods: {})", crate::cluster::list_some(pods, 4))
            };
            evidence.push(format!(
                "XID {code} x{count} on GPU {gpu} {uuid}: {}; action: {}{on}",
                info.meaning, info.action
            ));
            classes.push(info.class);
            if info.class == XidClass::Application {
                raise(Severity::Info, &mut severity);
            } else {
                app_only = false;
                gpus.insert(gpu.clone());
                let s = if xid::is_fatal(*code) && !h.unhealthy.is_empty() {
                    Severity::Critical
                } else {
                    Severity::Warning
                };
                raise(s, &mut severity);
            }
        }
        if !h.unhealthy.is_empty() {
            evidence.push(format!(
                "gpuops_device_healthy=0: {}",
                crate::cluster::list_some(&h.unhealthy, 8)
            ));
            raise(Severity::Critical, &mut severity);
            app_only = false;
        }
        if let (Some(all), Some(ok)) = (h.gpus, h.healthy)
            && ok < all
        {
            evidence.push(format!(
                "gpuops_node_gpus_healthy {ok} < gpuops_node_gpus {all}"
            ));
            raise(Severity::Critical, &mut severity);
            app_only = false;
            if h.xids.is_empty() && h.unhealthy.is_empty() {
                lost = true;
            }
        }
    }
    for (r, cap) in &n.capacity {
        let alloc = n.allocatable_of(r);
        if alloc > 0 && alloc < *cap {
            evidence.push(format!(
                "{r}: capacity {cap}, allocatable {alloc}: the device plugin withholds {} unhealthy device(s)",
                cap - alloc
            ));
            raise(Severity::Warning, &mut severity);
            app_only = false;
        }
    }
    let Some(severity) = severity else {
        return Vec::new();
    };
    let worst = classes
        .iter()
        .copied()
        .filter(|c| *c != XidClass::Application || app_only)
        .max_by_key(|c| class_rank(*c))
        .unwrap_or(XidClass::ResetGpu);
    let gpu_list = if gpus.is_empty() {
        "<index>".to_string()
    } else {
        gpus.iter().cloned().collect::<Vec<_>>().join(",")
    };
    let (code, title) = if app_only {
        (
            "xid-application",
            format!("Node {}: application XIDs (the GPUs are fine)", n.name),
        )
    } else if lost {
        (
            "gpu-lost",
            format!("Node {}: a GPU fell off the bus or is lost", n.name),
        )
    } else if cond.is_some_and(|c| c.status == "False")
        || classes.iter().any(|c| class_rank(*c) >= 4)
    {
        (
            "gpu-unhealthy",
            format!("Node {}: GPU {gpu_list} unhealthy", n.name),
        )
    } else {
        (
            "unhealthy-devices",
            format!(
                "Node {}: unhealthy GPU devices withheld from scheduling",
                n.name
            ),
        )
    };
    let mut f =
        Finding::new(severity, Category::Health, code, title).object(ObjectRef::node(n.name));
    f.evidence = evidence;
    let fix = if code == "unhealthy-devices" && classes.is_empty() {
        withheld_fix(n)
    } else {
        fix_for(worst, n.name, &gpu_list, lost)
    };
    vec![f.fix(fix)]
}

/// Devices withheld with no condition or XID saying which: the agent's log does.
fn withheld_fix(n: &NodeView<'_>) -> String {
    let log = match n.agents.first() {
        Some(a) => format!(
            "kubectl -n {} logs {}",
            a.metadata.namespace.as_deref().unwrap_or("NS"),
            a.metadata.name.as_deref().unwrap_or("POD")
        ),
        None => format!(
            "find its pod with kubectl get pods -A -o wide --field-selector spec.nodeName={}",
            n.name
        ),
    };
    format!(
        "the device plugin's log says which devices it marks unhealthy and why ({log}); so does \
         kubectl describe node {0} when the agent sets GPUHealthy; reset a faulty GPU \
         (nvidia-smi -r -i <index>) or drain and reboot {0}; the plugin advertises the device again \
         once it is healthy",
        n.name
    )
}

fn metrics_only(name: &str, host: &Host) -> Vec<Finding> {
    let fatal: Vec<&(String, String, u64)> = host
        .xids
        .keys()
        .filter(|(_, _, x)| xid::is_fatal(*x))
        .collect();
    if fatal.is_empty() && host.unhealthy.is_empty() {
        return Vec::new();
    }
    let mut f = Finding::new(
        Severity::Warning,
        Category::Health,
        "gpu-unhealthy",
        format!("Host {name} (in metrics, not a cluster node) reports GPU faults"),
    )
    .object(ObjectRef::node(name));
    for (gpu, uuid, x) in fatal {
        let info = xid::describe(*x);
        f = f.evidence(format!(
            "XID {x} on GPU {gpu} {uuid}: {}; action: {}",
            info.meaning, info.action
        ));
    }
    vec![f.fix(format!(
        "check the host {name}: its metrics name it, but no node of that name exists"
    ))]
}

#[cfg(test)]
mod tests {
    use super::{gpus_in, xids_in};
    use crate::testkit::*;

    #[test]
    fn xids_from_condition_messages() {
        assert_eq!(
            xids_in("GPU 3 (GPU-a): XID 48 (double-bit ECC error): drain; GPU 4: Xid 79"),
            vec![48, 79]
        );
        assert!(xids_in("all healthy").is_empty());
    }

    #[test]
    fn gpu_indexes_from_condition_messages() {
        let got = |m: &str| gpus_in(m).into_iter().collect::<Vec<_>>();
        // The agent's wording on a one-GPU node: `GPU unhealthy` is no index.
        assert_eq!(
            got(
                "1 of 1 GPU unhealthy: GPU 0 (GPU-0): XID 79 (GPU has fallen off the bus): reboot the node"
            ),
            vec!["0"]
        );
        assert_eq!(
            got(
                "2 of 8 GPUs unhealthy: GPU 2 (GPU-2): XID 48 (double-bit ECC error): drain the node and reset the GPU; GPU 6 (GPU-6): lost"
            ),
            vec!["2", "6"]
        );
        assert!(got("all 8 GPUs are healthy").is_empty());
    }

    #[test]
    fn withheld_devices_without_a_cause_point_at_the_plugin_log() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 6);
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "unhealthy-devices");
        assert_eq!(got.severity, crate::Severity::Warning);
        assert!(got.evidence[0].contains("withholds 2"), "{got:#?}");
        assert!(
            got.fix.contains("--field-selector spec.nodeName=gpu-1")
                && got.fix.contains("kubectl describe node gpu-1")
                && !got.fix.contains("  "),
            "{}",
            got.fix
        );
    }

    #[test]
    fn condition_false_with_a_fatal_xid() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        set_resource(&mut n, "nvidia.com/gpu", 8, 7);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "XidError",
            "GPU 3 (GPU-3): XID 48 (double-bit ECC error): drain the node and reset the GPU",
        );
        taint(&mut n, "gpuops.io/gpu-unhealthy", "XidError", "NoSchedule");
        let f = run(&snapshot(vec![n], vec![], vec![]));
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.severity, crate::Severity::Critical);
        assert!(
            got.fix.contains("kubectl drain gpu-1") && got.fix.contains("nvidia-smi -r -i 3"),
            "{}",
            got.fix
        );
        assert!(
            got.evidence.iter().any(|e| e.contains("withholds 1")),
            "{got:#?}"
        );
    }

    #[test]
    fn lost_gpu_from_metrics_and_condition() {
        let mut n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        condition(
            &mut n,
            "GPUHealthy",
            "False",
            "GPULost",
            "GPU 5 (GPU-5): lost, fell off the bus: reboot the node",
        );
        let mut s = snapshot(vec![n], vec![], vec![]);
        s.metrics = vec![
            sample("gpuops_node_gpus", &[("Hostname", "gpu-1")], 8.0),
            sample("gpuops_node_gpus_healthy", &[("Hostname", "gpu-1")], 7.0),
        ];
        let f = run(&s);
        assert!(one(&f, "gpu-lost").fix.contains("reboot"));
    }

    #[test]
    fn application_xids_are_info_and_healthy_nodes_are_quiet() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(vec![n.clone()], vec![], vec![]);
        s.metrics = vec![sample(
            "gpuops_xid_errors_total",
            &[
                ("Hostname", "gpu-1"),
                ("gpu", "0"),
                ("UUID", "GPU-0"),
                ("err_code", "13"),
                ("namespace", "ml"),
                ("pod", "t"),
            ],
            2.0,
        )];
        let f = run(&s);
        let got = one(&f, "xid-application");
        assert_eq!(got.severity, crate::Severity::Info);
        assert!(got.evidence[0].contains("ml/t"));

        let mut healthy = n;
        condition(
            &mut healthy,
            "GPUHealthy",
            "True",
            "AllGPUsHealthy",
            "8 GPUs healthy",
        );
        let mut s = snapshot(vec![healthy], vec![], vec![]);
        s.metrics = vec![
            sample("gpuops_node_gpus", &[("Hostname", "gpu-1")], 8.0),
            sample("gpuops_node_gpus_healthy", &[("Hostname", "gpu-1")], 8.0),
            sample(
                "gpuops_device_healthy",
                &[("Hostname", "gpu-1"), ("gpu", "0")],
                1.0,
            ),
        ];
        assert!(
            run(&s)
                .iter()
                .all(|f| f.category != crate::Category::Health)
        );
    }

    #[test]
    fn fatal_xid_that_recovered_is_a_warning() {
        let n = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        let mut s = snapshot(vec![n], vec![], vec![]);
        s.metrics = vec![sample(
            "gpuops_xid_errors_total",
            &[
                ("Hostname", "gpu-1"),
                ("gpu", "2"),
                ("UUID", "GPU-2"),
                ("err_code", "79"),
            ],
            1.0,
        )];
        let f = run(&s);
        let got = one(&f, "gpu-unhealthy");
        assert_eq!(got.severity, crate::Severity::Warning);
        assert!(got.fix.contains("reboot"));
    }
}
