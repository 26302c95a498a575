//! GPU nodes: zero allocatable GPUs (plugin or driver), old drivers, mixed drivers in a pool.

use super::node_model;
use crate::Options;
use crate::cluster::{
    COUNT, Cluster, DRIVER_FULL, DRIVER_MAJOR, MIG_CONFIG_STATE, NodeView, OLD_DRIVER_MAJOR,
    OLD_DRIVER_MINOR, OLD_DRIVER_REV, PRODUCT, list_some,
};
use crate::finding::{Category, Finding, ObjectRef, Severity};
use std::collections::BTreeMap;

pub(super) fn check(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut configs = None;
    for n in c.gpu_nodes() {
        out.extend(not_ready(c, n));
        // A single-strategy node with a mixed layout advertises nothing by design, not for want
        // of registration: its own finding says so (mig-strategy-conflict).
        let conflict = n.label(crate::cluster::MIG_STRATEGY) == Some("single")
            && super::migstrategy::conflict(
                n,
                configs.get_or_insert_with(gpuops_mig::config::nvidia_default_configs),
            )
            .is_some();
        if !conflict {
            out.extend(zero_allocatable(n));
        }
        out.extend(old_driver(n, o));
    }
    out.extend(mixed_drivers(c));
    out
}

/// The driver version and its major number, from GFD's `cuda.driver-version.*` labels or the
/// older `cuda.driver.major/.minor/.rev` ones; the label it came from, for evidence.
fn driver(n: &NodeView<'_>) -> Option<(String, u32, &'static str)> {
    let full = n.label(DRIVER_FULL);
    let major = n
        .label(DRIVER_MAJOR)
        .and_then(|m| m.parse().ok())
        .or_else(|| {
            full.and_then(|f| f.split('.').next())
                .and_then(|m| m.parse().ok())
        });
    if let Some(major) = major {
        let text = full.or(n.label(DRIVER_MAJOR)).unwrap_or("").to_string();
        let from = if full.is_some() {
            DRIVER_FULL
        } else {
            DRIVER_MAJOR
        };
        return Some((text, major, from));
    }
    let major: u32 = n.label(OLD_DRIVER_MAJOR)?.trim().parse().ok()?;
    let parts: Vec<&str> = [OLD_DRIVER_MINOR, OLD_DRIVER_REV]
        .iter()
        .filter_map(|k| n.label(k).map(str::trim).filter(|v| !v.is_empty()))
        .collect();
    let mut text = major.to_string();
    for p in parts {
        text.push('.');
        text.push_str(p);
    }
    Some((text, major, OLD_DRIVER_MAJOR))
}

/// Whether any driver label, new or old, is on the node.
fn has_driver_label(n: &NodeView<'_>) -> bool {
    [DRIVER_FULL, DRIVER_MAJOR, OLD_DRIVER_MAJOR]
        .iter()
        .any(|k| n.label(k).is_some())
}

/// A GPU node whose kubelet stopped reporting (Ready False/Unknown, or the lifecycle taints).
fn not_ready(_c: &Cluster<'_>, n: &NodeView<'_>) -> Option<Finding> {
    if n.not_ready().is_none() && !n.lifecycle_tainted() {
        return None;
    }
    let why = n.unavailable().unwrap_or_default().to_string();
    let mut f = Finding::new(
        Severity::Warning,
        Category::Node,
        "gpu-node-not-ready",
        format!(
            "GPU node {} is NotReady: its {} GPUs take no pods",
            n.name,
            n.gpu_count()
        ),
    )
    .object(ObjectRef::node(n.name))
    .evidence(why);
    let lifecycle: Vec<String> = n
        .taints
        .iter()
        .filter(|t| crate::cluster::LIFECYCLE_TAINTS.contains(&t.key.as_str()))
        .map(crate::fit::describe_taint)
        .collect();
    if !lifecycle.is_empty() {
        f = f.evidence(format!(
            "taints set by the node lifecycle controller: {}",
            lifecycle.join(", ")
        ));
    }
    Some(
        f.fix(format!(
            "the taints lift by themselves when the kubelet reports again (do not remove them or \
             tolerate them): check the node (kubectl describe node {0}: conditions and last heartbeat); \
             on it: systemctl status kubelet, journalctl -u kubelet, the container runtime, its network \
             to the API server; a node that stays down: {1} and replace it",
            n.name,
            n.drain()
        ))
        .command(format!("kubectl describe node {}", n.name)),
    )
}

fn zero_allocatable(n: &NodeView<'_>) -> Option<Finding> {
    if n.allocatable.values().any(|v| *v > 0) {
        return None;
    }
    let mig_state = n.label(MIG_CONFIG_STATE);
    let capacity: i64 = n.capacity.values().sum();
    let mut f = Finding::new(
        Severity::Critical,
        Category::Node,
        "zero-allocatable",
        format!("GPU node {} has no allocatable GPUs", n.name),
    )
    .object(ObjectRef::node(n.name))
    .evidence(format!(
        "labels: {}={}, {}={}, {}={}",
        PRODUCT,
        n.label(PRODUCT).unwrap_or("<absent>"),
        COUNT,
        n.label(COUNT).unwrap_or("<absent>"),
        DRIVER_FULL,
        n.label(DRIVER_FULL).unwrap_or("<absent>")
    ))
    .evidence(format!(
        "status.capacity: {}; status.allocatable: {}",
        if n.capacity.is_empty() {
            "no nvidia.com/ resource".into()
        } else {
            crate::resources::describe(&n.capacity)
        },
        if n.allocatable.is_empty() {
            "no nvidia.com/ resource".into()
        } else {
            crate::resources::describe(&n.allocatable)
        },
    ));
    for a in &n.agents {
        let name = a.metadata.name.as_deref().unwrap_or("");
        let ns = a.metadata.namespace.as_deref().unwrap_or("");
        let status = a.status.as_ref();
        let waiting = status
            .and_then(|s| s.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .find_map(|cs| cs.state.as_ref()?.waiting.as_ref()?.reason.clone());
        f = f.evidence(format!(
            "agent pod {ns}/{name}: {}{}",
            status.and_then(|s| s.phase.as_deref()).unwrap_or("?"),
            waiting.map(|w| format!(" ({w})")).unwrap_or_default()
        ));
        f = f.object(ObjectRef::pod(ns, name));
    }
    let (agent_hint, agent_cmd) = match n.agents.first() {
        Some(a) => {
            let cmd = format!(
                "kubectl -n {} logs {}",
                a.metadata.namespace.as_deref().unwrap_or("default"),
                a.metadata.name.as_deref().unwrap_or("")
            );
            (cmd.clone(), cmd)
        }
        None => (
            format!(
                "no agent or device plugin pod runs on {}: check the DaemonSet's nodeSelector/tolerations (kubectl get ds -A -o wide)",
                n.name
            ),
            "kubectl get ds -A -o wide".to_string(),
        ),
    };
    f = f.command(agent_cmd);
    if matches!(mig_state, Some("pending" | "rebooting")) {
        f.severity = Severity::Info;
        f.title = format!(
            "GPU node {} has no allocatable GPUs while MIG is being reconfigured",
            n.name
        );
        return Some(f.evidence(format!("{MIG_CONFIG_STATE}={}", mig_state.unwrap_or(""))).fix(
            "wait for the MIG reconfiguration to finish (the state becomes success); see the MIG finding if it takes long",
        ));
    }
    f = f.command(format!("kubectl describe node {}", n.name));
    let fix = if mig_state == Some("failed") {
        f.title = format!(
            "GPU node {} has no allocatable GPUs: applying its MIG config failed",
            n.name
        );
        f = f.evidence(format!("{MIG_CONFIG_STATE}=failed"));
        f.commands
            .retain(|c| c.starts_with("kubectl describe node"));
        "the MIG change failed before the device plugin advertised the new layout: see the MIG finding \
         (mig-config-failed) for why and how to retry"
            .to_string()
    } else if capacity > 0 {
        f.title = format!(
            "GPU node {} has {capacity} GPU devices, all unhealthy",
            n.name
        );
        format!(
            "the device plugin reports every device unhealthy: see the GPUHealthy condition \
             (kubectl describe node {}) and the agent's log ({agent_hint})",
            n.name
        )
    } else if !has_driver_label(n) {
        f.title = format!(
            "GPU node {}: no device plugin registered and no driver version label",
            n.name
        );
        format!(
            "the NVIDIA driver is probably not loaded or the agent is not running: on the node run \
             `nvidia-smi` (load the driver / install the driver package), then check the agent ({agent_hint})"
        )
    } else {
        f.title = format!(
            "GPU node {}: the device plugin is not registered with the kubelet",
            n.name
        );
        format!(
            "the driver is loaded but no nvidia.com/ resource is registered: check the agent ({agent_hint}); \
             restarting the agent pod re-registers it; the kubelet's device-plugins directory must be mounted"
        )
    };
    Some(f.fix(format!(
        "{fix}; the node's state: kubectl describe node {}",
        n.name
    )))
}

fn old_driver(n: &NodeView<'_>, o: &Options) -> Option<Finding> {
    let (full, major, from) = driver(n)?;
    let model = node_model(n);
    if let Some(m) = model
        && major < m.min_driver_major
    {
        return Some(
            Finding::new(
                Severity::Critical,
                Category::Node,
                "driver-below-model-minimum",
                format!(
                    "Node {}: driver {full} is older than {} needs",
                    n.name, m.key
                ),
            )
            .object(ObjectRef::node(n.name))
            .evidence(format!(
                "{from}={}; {} needs driver R{} or newer",
                n.label(from).unwrap_or(""),
                m.key,
                m.min_driver_major
            ))
            .evidence(format!("driver {full}"))
            .fix(format!(
                "upgrade the NVIDIA driver on {} to R{} or newer (drain first: {}{})",
                n.name,
                m.min_driver_major.max(o.min_driver_major),
                n.drain(),
                n.drain_note()
            ))
            .command(n.drain()),
        );
    }
    (major < o.min_driver_major).then(|| {
        Finding::new(
            Severity::Warning,
            Category::Node,
            "driver-too-old",
            format!("Node {}: driver {full} is older than R{}", n.name, o.min_driver_major),
        )
        .object(ObjectRef::node(n.name))
        .evidence(format!("{from}={}", n.label(from).unwrap_or("")))
        .evidence(format!("driver {full}"))
        .fix(format!(
            "upgrade to a supported branch (R{} or newer): {}{}, install the driver, reboot, kubectl uncordon {}",
            o.min_driver_major, n.drain(), n.drain_note(), n.name
        ))
        .command(n.drain())
        .command(format!("kubectl uncordon {}", n.name))
    })
}

fn pool_of<'a>(n: &'a NodeView<'_>) -> (String, &'a str) {
    for key in crate::POOL_LABELS {
        if let Some(v) = n.label(key) {
            return ((*key).to_string(), v);
        }
    }
    (PRODUCT.to_string(), n.label(PRODUCT).unwrap_or("unknown"))
}

fn mixed_drivers(c: &Cluster<'_>) -> Vec<Finding> {
    // pool -> driver -> nodes
    let mut pools: BTreeMap<(String, &str), BTreeMap<String, Vec<&str>>> = BTreeMap::new();
    for n in c.gpu_nodes() {
        let Some((full, _, _)) = driver(n) else {
            continue;
        };
        pools
            .entry(pool_of(n))
            .or_default()
            .entry(full)
            .or_default()
            .push(n.name);
    }
    pools
        .into_iter()
        .filter(|(_, drivers)| drivers.len() > 1)
        .map(|((key, pool), drivers)| {
            let newest = drivers
                .keys()
                .max_by_key(|v| v.split('.').map(|p| p.parse::<u64>().unwrap_or(0)).collect::<Vec<_>>())
                .cloned()
                .unwrap_or_default();
            let stragglers: Vec<&str> = drivers
                .iter()
                .filter(|(v, _)| **v != newest)
                .flat_map(|(_, nodes)| nodes.iter().copied())
                .collect();
            let mut f = Finding::new(
                Severity::Warning,
                Category::Node,
                "mixed-drivers",
                format!("Pool {key}={pool} runs {} different NVIDIA driver versions", drivers.len()),
            );
            for (v, nodes) in &drivers {
                f = f.evidence(format!("{v}: {} node(s): {}", nodes.len(), list_some(nodes, 5)));
            }
            f = f.objects(stragglers.iter().take(10).map(|n| ObjectRef::node(n)));
            f.fix(format!(
                "upgrade {} to {newest} so jobs behave the same on every node of the pool (CUDA compatibility, NCCL)",
                list_some(&stragglers, 5)
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::testkit::*;

    #[test]
    fn one_pool_label_list_holds_every_provider_and_the_instance_type_last() {
        // The union of the doctor's and gpuops-observe's former lists, each key once; the
        // instance type is the fallback for nodes no provider labelled, so it comes last.
        let labels = crate::POOL_LABELS;
        for key in [
            "cloud.google.com/gke-nodepool",
            "eks.amazonaws.com/nodegroup",
            "karpenter.sh/nodepool",
            "kubernetes.azure.com/agentpool",
            "agentpool",
            "cluster.x-k8s.io/deployment-name",
        ] {
            assert!(labels.contains(&key), "{key} missing from {labels:?}");
        }
        assert_eq!(labels.last(), Some(&"node.kubernetes.io/instance-type"));
        let unique: std::collections::BTreeSet<_> = labels.iter().collect();
        assert_eq!(unique.len(), labels.len(), "{labels:?}");
    }

    #[test]
    fn zero_allocatable_and_its_look_alikes() {
        // No plugin registered, driver label present.
        let mut a = node("gpu-1");
        label(&mut a, "nvidia.com/gpu.present", "true");
        label(&mut a, "nvidia.com/cuda.driver-version.full", "550.107.02");
        let f = run(&snapshot(vec![a], vec![], vec![]));
        let got = one(&f, "zero-allocatable");
        assert!(got.title.contains("not registered"), "{got:#?}");

        // No driver label: the driver.
        let mut b = node("gpu-2");
        label(&mut b, "nvidia.com/gpu.present", "true");
        assert!(
            one(&run(&snapshot(vec![b], vec![], vec![])), "zero-allocatable")
                .fix
                .contains("nvidia-smi")
        );

        // Capacity but nothing allocatable: unhealthy devices.
        let mut c = gpu_node("gpu-3", "nvidia.com/gpu", 8);
        set_resource(&mut c, "nvidia.com/gpu", 8, 0);
        assert!(
            one(&run(&snapshot(vec![c], vec![], vec![])), "zero-allocatable")
                .title
                .contains("all unhealthy")
        );

        // MIG being reconfigured: info.
        let mut d = gpu_node("gpu-4", "nvidia.com/gpu", 0);
        label(&mut d, "nvidia.com/mig.config.state", "pending");
        assert_eq!(
            one(&run(&snapshot(vec![d], vec![], vec![])), "zero-allocatable").severity,
            crate::Severity::Info
        );

        // Look-alikes: all GPUs allocated; a CPU node.
        let full = gpu_node("gpu-5", "nvidia.com/gpu", 8);
        let p = running(pod("ml", "all", &[("nvidia.com/gpu", 8)]), "gpu-5");
        let f = run(&snapshot(vec![full, node("cpu-1")], vec![p], vec![]));
        assert!(with_code(&f, "zero-allocatable").is_empty(), "{f:#?}");
    }

    #[test]
    fn not_ready_gpu_nodes() {
        let mut a = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        ready(
            &mut a,
            "Unknown",
            "NodeStatusUnknown",
            "Kubelet stopped posting node status.",
            600,
        );
        taint(&mut a, "node.kubernetes.io/unreachable", "", "NoSchedule");
        let f = run(&snapshot(
            vec![a, gpu_node("gpu-2", "nvidia.com/gpu", 8)],
            vec![],
            vec![],
        ));
        let got = one(&f, "gpu-node-not-ready");
        assert_eq!(got.objects[0].name, "gpu-1");
        assert!(
            got.evidence[0].contains("NotReady for 10m (Ready=Unknown NodeStatusUnknown")
                && got.evidence[1].contains("node.kubernetes.io/unreachable:NoSchedule"),
            "{got:#?}"
        );
        // NotReady nodes are not cost findings (their taints are not "no one tolerates").
        assert!(with_code(&f, "unusable-free-gpus").is_empty(), "{f:#?}");
    }

    #[test]
    fn older_gfd_driver_labels_are_read() {
        // GFD before the cuda.driver-version.* form wrote cuda.driver.major/minor/rev.
        let mut old = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        unlabel(&mut old, "nvidia.com/cuda.driver-version.full");
        unlabel(&mut old, "nvidia.com/cuda.driver-version.major");
        label(&mut old, "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB");
        label(&mut old, "nvidia.com/cuda.driver.major", "470");
        label(&mut old, "nvidia.com/cuda.driver.minor", "57");
        label(&mut old, "nvidia.com/cuda.driver.rev", "02");
        let f = run(&snapshot(vec![old.clone()], vec![], vec![]));
        let got = one(&f, "driver-too-old");
        assert!(
            got.evidence
                .iter()
                .any(|e| e == "nvidia.com/cuda.driver.major=470")
                && got.evidence.iter().any(|e| e == "driver 470.57.02"),
            "{got:#?}"
        );
        // Look-alike: a current driver in the old labels is fine, and counts as a driver label
        // (a node with no plugin is then "not registered", not "no driver").
        let mut new = old.clone();
        label(&mut new, "nvidia.com/cuda.driver.major", "550");
        assert!(
            with_code(
                &run(&snapshot(vec![new.clone()], vec![], vec![])),
                "driver-too-old"
            )
            .is_empty()
        );
        let mut bare = node("gpu-2");
        label(&mut bare, "nvidia.com/gpu.present", "true");
        label(&mut bare, "nvidia.com/cuda.driver.major", "550");
        let f = run(&snapshot(vec![bare], vec![], vec![]));
        assert!(
            one(&f, "zero-allocatable").title.contains("not registered"),
            "{f:#?}"
        );
    }

    #[test]
    fn drivers_old_below_minimum_and_mixed() {
        let mut old = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        label(&mut old, "nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB");
        label(&mut old, "nvidia.com/cuda.driver-version.full", "525.60.13");
        label(&mut old, "nvidia.com/cuda.driver-version.major", "525");
        let f = run(&snapshot(vec![old.clone()], vec![], vec![]));
        assert_eq!(one(&f, "driver-too-old").severity, crate::Severity::Warning);

        let mut h200 = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        label(&mut h200, "nvidia.com/gpu.product", "NVIDIA-H200");
        label(
            &mut h200,
            "nvidia.com/cuda.driver-version.full",
            "535.183.01",
        );
        label(&mut h200, "nvidia.com/cuda.driver-version.major", "535");
        let f = run(&snapshot(vec![h200], vec![], vec![]));
        assert!(one(&f, "driver-below-model-minimum").fix.contains("R550"));

        let mut a = gpu_node("a", "nvidia.com/gpu", 8);
        let mut b = gpu_node("b", "nvidia.com/gpu", 8);
        let mut c = gpu_node("c", "nvidia.com/gpu", 8);
        for n in [&mut a, &mut b, &mut c] {
            label(n, "karpenter.sh/nodepool", "h100");
        }
        label(&mut c, "nvidia.com/cuda.driver-version.full", "550.54.15");
        let f = run(&snapshot(vec![a.clone(), b.clone(), c], vec![], vec![]));
        let got = one(&f, "mixed-drivers");
        assert!(got.fix.contains("upgrade c to 550.107.02"), "{}", got.fix);

        // Look-alike: same versions; different versions in different pools.
        let mut d = gpu_node("d", "nvidia.com/gpu", 8);
        label(&mut d, "karpenter.sh/nodepool", "other");
        label(&mut d, "nvidia.com/cuda.driver-version.full", "550.54.15");
        let f = run(&snapshot(vec![a, b, d], vec![], vec![]));
        assert!(
            with_code(&f, "mixed-drivers").is_empty() && with_code(&f, "driver-too-old").is_empty(),
            "{f:#?}"
        );
    }
}
