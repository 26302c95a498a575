//! Diagnosis of GPU clusters on Kubernetes: pure rules over a [`Snapshot`] of nodes, pods, events,
//! metric samples and log excerpts, returning [`Finding`]s with evidence and a concrete fix; plus
//! the aggregation behind `gpuops top`.
//!
//! No I/O: the binary lists each kind once and hands the objects over, so the rules are
//! table-tested with hand-written objects and run in milliseconds on thousands of nodes.
#![forbid(unsafe_code)]

mod cluster;
mod error;
mod finding;
pub mod fit;
pub mod metrics;
pub mod render;
pub mod report;
pub mod resources;
mod rules;
pub mod sched;
mod snapshot;
#[cfg(test)]
mod testkit;
pub mod top;

pub use error::DoctorError;
pub use finding::{Category, Finding, ObjectRef, Severity};
pub use snapshot::{Controller, Dra, LogExcerpt, Sample, Snapshot};

/// Node labels that name a node pool, most specific first; the instance type last, as the pool
/// of nodes no provider labelled. The doctor groups nodes by it (drivers that differ within a
/// pool) and `gpuops-observe` reads a `--node`'s peers by it, so the two must be one list.
pub const POOL_LABELS: &[&str] = &[
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "cluster.x-k8s.io/deployment-name",
    "node.kubernetes.io/instance-type",
];

use std::collections::HashMap;
use std::time::Duration;

/// Thresholds and filters.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Only findings about this namespace (its pods, and nodes running its pods).
    pub namespace: Option<String>,
    /// Only findings about this node (and pods on it).
    pub node: Option<String>,
    /// A pending pod younger than this with no scheduling failure is just new.
    pub pending_grace: Duration,
    /// A MIG config state `pending`/`rebooting` older than this is stuck.
    pub mig_stuck_after: Duration,
    /// Allocated GPUs below `idle_util_percent` for this long are idle.
    pub idle_after: Duration,
    pub idle_util_percent: f64,
    /// Driver branches older than this get a warning (535 is the oldest long-term branch in support).
    pub min_driver_major: u32,
    /// Price of one GPU-hour, for cost findings; a node's [`PRICE_KEY`] annotation or label wins.
    pub gpu_hour_price: Option<f64>,
}

/// Node annotation (or label) with the price of one of its GPUs for an hour, in the user's
/// currency (`2.5`), for the cost findings.
pub const PRICE_KEY: &str = "gpuops.io/gpu-hour-price";

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: None,
            node: None,
            pending_grace: Duration::from_secs(60),
            mig_stuck_after: Duration::from_secs(15 * 60),
            idle_after: Duration::from_secs(3600),
            idle_util_percent: 5.0,
            min_driver_major: 535,
            gpu_hour_price: None,
        }
    }
}

/// Runs every rule; findings sorted by severity, category, then title.
pub fn diagnose(snapshot: &Snapshot, options: &Options) -> Vec<Finding> {
    let cluster = cluster::Cluster::build(snapshot);
    let mut findings = rules::run_all(&cluster, options);
    if options.namespace.is_some() || options.node.is_some() {
        let pod_nodes: HashMap<(&str, &str), &str> = cluster
            .gpu_pods
            .iter()
            .filter_map(|p| Some(((p.namespace, p.name), p.node?)))
            .collect();
        findings.retain(|f| keep(f, &cluster, &pod_nodes, options));
    }
    findings.sort_by(|a, b| {
        (a.severity, a.category, &a.title).cmp(&(b.severity, b.category, &b.title))
    });
    findings
}

/// Whether a finding passes `--namespace` and `--node`.
fn keep(
    f: &Finding,
    cluster: &cluster::Cluster<'_>,
    pod_nodes: &HashMap<(&str, &str), &str>,
    options: &Options,
) -> bool {
    let pod_node = |o: &ObjectRef| -> Option<&str> {
        pod_nodes
            .get(&(o.namespace.as_deref().unwrap_or(""), o.name.as_str()))
            .copied()
    };
    if let Some(ns) = options.namespace.as_deref() {
        let namespaced: Vec<&ObjectRef> =
            f.objects.iter().filter(|o| o.namespace.is_some()).collect();
        let ok = if namespaced.is_empty() {
            // Node findings: kept when a pod of the namespace runs on one of the nodes.
            f.objects.iter().any(|o| {
                o.kind == "Node"
                    && cluster
                        .namespaces_on_node
                        .get(o.name.as_str())
                        .is_some_and(|list| list.contains(&ns))
            })
        } else {
            namespaced
                .iter()
                .any(|o| o.namespace.as_deref() == Some(ns))
        };
        if !ok {
            return false;
        }
    }
    if let Some(node) = options.node.as_deref() {
        let ok = f.objects.iter().any(|o| {
            (o.kind == "Node" && o.name == node) || (o.kind == "Pod" && pod_node(o) == Some(node))
        });
        if !ok {
            return false;
        }
    }
    true
}

/// Counts per severity: (critical, warning, info).
pub fn counts(findings: &[Finding]) -> (usize, usize, usize) {
    let n = |s| findings.iter().filter(|f| f.severity == s).count();
    (
        n(Severity::Critical),
        n(Severity::Warning),
        n(Severity::Info),
    )
}

/// Whether any finding is critical (the doctor then exits non-zero).
pub fn has_critical(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Critical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::*;

    #[test]
    fn namespace_and_node_filters() {
        let mut bad = gpu_node("gpu-1", "nvidia.com/gpu", 8);
        condition(&mut bad, "GPUHealthy", "False", "XidError", "GPU 0: XID 48");
        let other = gpu_node("gpu-2", "nvidia.com/gpu", 8);
        let pods = vec![
            running(pod("team-a", "x", &[("nvidia.com/gpu", 1)]), "gpu-1"),
            running(pod("team-b", "y", &[("nvidia.com/gpu", 1)]), "gpu-2"),
            pod("team-b", "z", &[("nvidia.com/gpu", 16)]),
        ];
        let s = snapshot(vec![bad, other], pods, vec![]);
        let by = |namespace: Option<&str>, node: Option<&str>| {
            let o = Options {
                namespace: namespace.map(Into::into),
                node: node.map(Into::into),
                ..Options::default()
            };
            let mut c: Vec<&str> = diagnose(&s, &o).iter().map(|f| f.code).collect();
            c.sort_unstable();
            c
        };
        assert_eq!(
            by(None, None),
            vec!["gpu-unhealthy", "request-exceeds-node"]
        );
        // team-a runs on the broken node; team-b's pending pod is not theirs.
        assert_eq!(by(Some("team-a"), None), vec!["gpu-unhealthy"]);
        assert_eq!(by(Some("team-b"), None), vec!["request-exceeds-node"]);
        assert_eq!(by(None, Some("gpu-2")), Vec::<&str>::new());
        assert_eq!(by(None, Some("gpu-1")), vec!["gpu-unhealthy"]);
        assert!(has_critical(&diagnose(&s, &Options::default())));
    }
}
