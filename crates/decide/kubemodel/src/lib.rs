//! gpuops-kubemodel: Kubernetes Nodes and Pods as the packing engine's model, for the scheduler
//! extender and the cluster controller.
//!
//! From Kubernetes objects to the packing engine: each node's GPUs, CPU and memory, what the pods
//! bound to it use, and the GPU demand of the pod being scheduled.
//!
//! What the API says and what it does not:
//! - A node's GPUs: GFD's `nvidia.com/gpu.count` label, else its `nvidia.com/gpu` (or
//!   `nvidia.com/gpu.shared`) capacity divided by the replicas; replicas from GFD's
//!   `nvidia.com/gpu.replicas` (time-slicing), else the shared capacity over the GPU count, else 1.
//!   The model is `nvidia.com/gpu.product` (the engine only uses it to group equal GPUs).
//! - A pod's demand: `k` replicas of `nvidia.com/gpu` or `nvidia.com/gpu.shared` on a node with
//!   `R` replicas per GPU is `k x 1000/R` milli of one GPU while that is below 1000, else
//!   `ceil(k/R)` whole GPUs. The annotation `gpuops.io/gpu-milli` states the share explicitly
//!   (e.g. `300`: 30% of one GPU; `2000`: two whole GPUs) and overrides the replica arithmetic.
//!   Pods that request neither resource are not GPU-sharing pods: the extender passes them through.
//! - Which GPU each bound replica landed on is known only to the node's device plugin; the API
//!   does not say. The extender assumes the engine's own model: bound pods, oldest first, are put
//!   on GPUs with the engine's GPU-level choice (the one `GetPreferredAllocation` makes with the
//!   `fragmentation-aware` policy). Time-sliced replicas isolate nothing, so this is an estimate
//!   of where the load is, not a reservation.

use gpuops_packing::PodReq;
#[cfg(feature = "k8s")]
use gpuops_packing::{Cluster, NodeSpec, PodSpec, TypicalPods};
#[cfg(feature = "k8s")]
use k8s_openapi::api::core::v1::{Container, Node, Pod};
#[cfg(feature = "k8s")]
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
#[cfg(feature = "k8s")]
use std::collections::BTreeMap;

pub mod fit;
#[cfg(all(feature = "k8s", any(test, feature = "testkit")))]
pub mod testkit;

/// Nodes and pods the engine cannot model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot model the nodes: {0}")]
    Nodes(#[source] gpuops_packing::PackingError),
    #[error("node {node}: {source}")]
    Node {
        node: String,
        #[source]
        source: gpuops_packing::PackingError,
    },
}

/// NVIDIA's whole-GPU resource (also the time-sliced one unless renamed).
pub const GPU: &str = "nvidia.com/gpu";
/// NVIDIA's renamed time-sliced resource (`renameByDefault: true`).
pub const GPU_SHARED: &str = "nvidia.com/gpu.shared";
/// GFD: number of physical GPUs.
pub const LABEL_COUNT: &str = "nvidia.com/gpu.count";
/// GFD: replicas per GPU under time-slicing.
pub const LABEL_REPLICAS: &str = "nvidia.com/gpu.replicas";
/// GFD: GPU product name.
pub const LABEL_PRODUCT: &str = "nvidia.com/gpu.product";
/// Our annotation: the pod's GPU share in milli-GPU (1..=1000 for a share of one GPU, a multiple
/// of 1000 for whole GPUs).
pub const ANNOTATION_MILLI: &str = "gpuops.io/gpu-milli";

/// One node as the engine sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    pub name: String,
    /// Allocatable CPU (milli).
    pub cpu_milli: u64,
    /// Allocatable memory (MiB).
    pub memory_mib: u64,
    /// Physical GPUs.
    pub gpus: u32,
    /// Replicas per GPU (1 without time-slicing).
    pub replicas: u32,
    /// GPU product (empty when unknown).
    pub model: String,
}

/// A pod's GPU demand on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// GPUs (1 for a share of one GPU).
    pub num_gpu: u32,
    /// Milli per GPU (< 1000 only with one GPU).
    pub gpu_milli: u32,
}

/// What the pod asks for, before a node is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAsk {
    /// CPU request (milli).
    pub cpu_milli: u64,
    /// Memory request (MiB, rounded up).
    pub memory_mib: u64,
    /// Replicas of `nvidia.com/gpu` plus `nvidia.com/gpu.shared` requested.
    pub replicas: u64,
    /// The `gpuops.io/gpu-milli` annotation, when present and valid.
    pub milli: Option<u32>,
}

impl PodAsk {
    /// True for pods the extender handles (they request a GPU resource).
    pub fn is_gpu(&self) -> bool {
        self.replicas > 0
    }

    /// The GPU demand on a node with `replicas` replicas per GPU.
    pub fn demand(&self, replicas: u32) -> Demand {
        if let Some(m) = self.milli {
            return if m < 1000 {
                Demand {
                    num_gpu: 1,
                    gpu_milli: m,
                }
            } else {
                Demand {
                    num_gpu: m.div_ceil(1000),
                    gpu_milli: 1000,
                }
            };
        }
        let r = u64::from(replicas.max(1));
        let milli = (self.replicas * 1000).div_ceil(r);
        if milli < 1000 {
            Demand {
                num_gpu: 1,
                gpu_milli: u32::try_from(milli).unwrap_or(1000),
            }
        } else {
            Demand {
                num_gpu: u32::try_from(self.replicas.div_ceil(r)).unwrap_or(u32::MAX),
                gpu_milli: 1000,
            }
        }
    }

    /// The engine's request on a node with `replicas` replicas per GPU.
    pub fn request(&self, replicas: u32) -> PodReq {
        let d = if self.is_gpu() {
            self.demand(replicas)
        } else {
            Demand {
                num_gpu: 0,
                gpu_milli: 0,
            }
        };
        PodReq {
            cpu_milli: u32::try_from(self.cpu_milli).unwrap_or(u32::MAX),
            memory_mib: self.memory_mib,
            num_gpu: u8::try_from(d.num_gpu).unwrap_or(u8::MAX),
            gpu_milli: u16::try_from(d.gpu_milli.min(1000)).unwrap_or(1000),
            models: gpuops_packing::ModelSet::ANY,
        }
    }
}

/// Parses a Kubernetes quantity (`500m`, `2`, `1.5Gi`, `1e3`, `128974848`) as a number.
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    const SUFFIXES: [(&str, f64); 14] = [
        ("Ki", 1024.0),
        ("Mi", 1_048_576.0),
        ("Gi", 1_073_741_824.0),
        ("Ti", 1_099_511_627_776.0),
        ("Pi", 1_125_899_906_842_624.0),
        ("Ei", 1_152_921_504_606_846_976.0),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
    ];
    let (number, factor) = SUFFIXES
        .iter()
        .find_map(|(s, f)| q.strip_suffix(s).map(|n| (n, *f)))
        .or_else(|| q.strip_suffix('E').map(|n| (n, 1e18)))
        .unwrap_or((q, 1.0));
    if number.is_empty() || number.ends_with(['e', 'E', '+', '-']) {
        return None;
    }
    let v: f64 = number.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v * factor)
}

#[cfg(feature = "k8s")]
fn q_milli(q: &Quantity) -> u64 {
    quantity(&q.0).map_or(0, |v| (v * 1000.0).ceil() as u64)
}

#[cfg(feature = "k8s")]
fn q_mib(q: &Quantity) -> u64 {
    quantity(&q.0).map_or(0, |v| (v / 1_048_576.0).ceil() as u64)
}

#[cfg(feature = "k8s")]
fn q_count(q: &Quantity) -> u64 {
    quantity(&q.0).map_or(0, |v| v.ceil() as u64)
}

#[cfg(feature = "k8s")]
/// One container's request for `name` (a limit stands in for a request not given, as the API
/// server's defaulting does for extended resources). Borrowed, not a merged copy of the maps:
/// the controller asks this five times for each of 50,000 pending pods in a pass.
fn container_request<'a>(c: &'a Container, name: &str) -> Option<&'a Quantity> {
    let r = c.resources.as_ref()?;
    r.requests
        .as_ref()
        .and_then(|m| m.get(name))
        .or_else(|| r.limits.as_ref().and_then(|m| m.get(name)))
}

#[cfg(feature = "k8s")]
/// Every request of one container, limits standing in as in [`container_request`].
fn each_container_request(c: &Container, mut f: impl FnMut(&String, &Quantity)) {
    let Some(r) = &c.resources else {
        return;
    };
    for (k, q) in r.requests.iter().flatten() {
        f(k, q);
    }
    for (k, q) in r.limits.iter().flatten() {
        if !r.requests.as_ref().is_some_and(|m| m.contains_key(k)) {
            f(k, q);
        }
    }
}

#[cfg(feature = "k8s")]
/// The effective request of a pod for one resource: the larger of the containers' sum and the
/// largest init container (Kubernetes' rule), in the unit `conv` gives.
fn effective(pod: &Pod, name: &str, conv: fn(&Quantity) -> u64) -> u64 {
    let Some(spec) = &pod.spec else {
        return 0;
    };
    let sum: u64 = spec
        .containers
        .iter()
        .filter_map(|c| container_request(c, name).map(conv))
        .sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(|c| container_request(c, name).map(conv))
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// Every resource the pod requests, with Kubernetes' effective-request rule (the larger of the
/// containers' sum and the largest init container), as numbers (CPU in cores, memory in bytes).
#[cfg(feature = "k8s")]
pub fn requests(pod: &Pod) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let Some(spec) = &pod.spec else {
        return out;
    };
    for c in &spec.containers {
        each_container_request(c, |k, q| {
            let v = quantity(&q.0).unwrap_or(0.0);
            match out.get_mut(k) {
                Some(e) => *e += v,
                None => {
                    out.insert(k.clone(), v);
                }
            }
        });
    }
    for c in spec.init_containers.iter().flatten() {
        each_container_request(c, |k, q| {
            let v = quantity(&q.0).unwrap_or(0.0);
            match out.get_mut(k) {
                Some(e) if v > *e => *e = v,
                Some(_) => {}
                None => {
                    out.insert(k.clone(), v.max(0.0));
                }
            }
        });
    }
    out
}

/// What `pod` asks for.
#[cfg(feature = "k8s")]
pub fn pod_ask(pod: &Pod) -> PodAsk {
    let milli = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_MILLI))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|m| {
            (1..1000).contains(m) || (*m >= 1000 && m.is_multiple_of(1000) && *m <= 64_000)
        });
    PodAsk {
        cpu_milli: effective(pod, "cpu", q_milli),
        memory_mib: effective(pod, "memory", q_mib),
        replicas: effective(pod, GPU, q_count) + effective(pod, GPU_SHARED, q_count),
        milli,
    }
}

#[cfg(feature = "k8s")]
/// `namespace/name` of a pod, for messages.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

#[cfg(feature = "k8s")]
/// The engine's view of a node.
pub fn node_gpus(node: &Node) -> NodeGpus {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let label_u32 = |k: &str| {
        labels
            .get(k)
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|v| *v > 0)
    };
    let status = node.status.as_ref();
    let resource = |name: &str, conv: fn(&Quantity) -> u64| -> Option<u64> {
        let s = status?;
        s.allocatable
            .as_ref()
            .and_then(|a| a.get(name))
            .or_else(|| s.capacity.as_ref().and_then(|c| c.get(name)))
            .map(conv)
    };
    let capacity = |name: &str| -> Option<u64> {
        let s = status?;
        s.capacity
            .as_ref()
            .and_then(|c| c.get(name))
            .or_else(|| s.allocatable.as_ref().and_then(|a| a.get(name)))
            .map(q_count)
    };
    let count = label_u32(LABEL_COUNT);
    let shared = capacity(GPU_SHARED).filter(|c| *c > 0);
    let whole = capacity(GPU).filter(|c| *c > 0);
    let replicas = label_u32(LABEL_REPLICAS)
        .or_else(|| match (shared, count) {
            (Some(s), Some(c)) if s >= u64::from(c) => u32::try_from(s / u64::from(c)).ok(),
            _ => None,
        })
        .unwrap_or(1);
    let gpus = count
        .or_else(|| {
            let advertised = shared.or(whole)?;
            u32::try_from(advertised / u64::from(replicas)).ok()
        })
        .unwrap_or(0)
        .min(64);
    NodeGpus {
        name: node.metadata.name.clone().unwrap_or_default(),
        cpu_milli: resource("cpu", q_milli).unwrap_or(0),
        memory_mib: resource("memory", q_mib).unwrap_or(0),
        gpus,
        replicas,
        model: labels.get(LABEL_PRODUCT).cloned().unwrap_or_default(),
    }
}

#[cfg(feature = "k8s")]
fn is_active(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(feature = "k8s")]
/// The cluster as the engine sees it, with the names and replicas behind each node index.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub cluster: Cluster,
    pub nodes: Vec<NodeGpus>,
    /// Typical pods (for FGD and ours): from `--workload` if given, else the shapes of the bound
    /// GPU pods plus the pod being scheduled.
    pub typical: TypicalPods,
    /// Problems met while building (over-committed GPUs and the like), for the log.
    pub notes: Vec<String>,
}

#[cfg(feature = "k8s")]
impl Snapshot {
    /// Node index by name. [`snapshot`] builds `nodes` sorted by name without duplicates, so
    /// this is a binary search: the controller asks it for each of 5,000 nodes in a pass, and a
    /// linear scan made that 12.5 million name comparisons. A miss falls back to the scan, for
    /// a caller that reordered `nodes`.
    pub fn position(&self, name: &str) -> Option<usize> {
        match self.nodes.binary_search_by(|n| n.name.as_str().cmp(name)) {
            Ok(i) => Some(i),
            Err(_) => self.nodes.iter().position(|n| n.name == name),
        }
    }
}

#[cfg(feature = "k8s")]
/// Builds the engine's cluster from nodes and pods: nodes sorted by name; pods bound to a node
/// and not finished use its CPU, memory and GPUs; GPU pods are put on GPUs oldest first with the
/// engine's GPU-level choice. `incoming` (the pod being scheduled) joins the typical pods, as do
/// the shapes in `workload` when given (then only those).
///
/// # Errors
/// When the engine cannot model the nodes (none, or a capacity beyond its integer types).
pub fn snapshot(
    nodes: &[&Node],
    pods: &[&Pod],
    incoming: Option<&PodAsk>,
    workload: Option<&[PodSpec]>,
) -> Result<Snapshot, ModelError> {
    let mut views: Vec<NodeGpus> = nodes.iter().map(|n| node_gpus(n)).collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    views.dedup_by(|a, b| a.name == b.name);
    let specs: Vec<NodeSpec> = views
        .iter()
        .map(|v| NodeSpec {
            name: v.name.clone(),
            cpu_milli: v.cpu_milli,
            memory_mib: v.memory_mib,
            gpus: v.gpus,
            model: v.model.clone(),
        })
        .collect();
    let mut cluster = Cluster::new(&specs).map_err(ModelError::Nodes)?;

    // Bound pods per node, oldest first.
    let mut bound: Vec<Vec<(&Pod, PodAsk)>> = vec![Vec::new(); views.len()];
    for pod in pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        if !is_active(pod) {
            continue;
        }
        if let Ok(i) = views.binary_search_by(|v| v.name.as_str().cmp(node)) {
            bound[i].push((pod, pod_ask(pod)));
        }
    }
    let mut shapes: Vec<PodSpec> = Vec::new();
    let mut notes = Vec::new();
    let mut placements: Vec<Vec<PodReq>> = vec![Vec::new(); views.len()];
    for (i, list) in bound.iter_mut().enumerate() {
        list.sort_by(|(a, _), (b, _)| {
            let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b)).then_with(|| pod_key(a).cmp(&pod_key(b)))
        });
        for (_, ask) in list.iter() {
            let req = ask.request(views[i].replicas);
            if ask.is_gpu() {
                shapes.push(shape(ask, &req));
            }
            placements[i].push(req);
        }
    }
    let typical_list: Vec<PodSpec> = match workload {
        Some(w) => w.to_vec(),
        None => {
            if let Some(ask) = incoming.filter(|a| a.is_gpu()) {
                let replicas = views.first().map_or(1, |v| v.replicas);
                shapes.push(shape(ask, &ask.request(replicas)));
            }
            shapes
        }
    };
    let typical = TypicalPods::from_trace(&cluster, &typical_list);
    let typical_for_gpus = (!typical.pods.is_empty()).then_some(&typical);
    for (i, list) in placements.iter().enumerate() {
        let view = &views[i];
        let mut cpu: u64 = 0;
        let mut mem: u64 = 0;
        let mut free: Vec<u16> = vec![1000; view.gpus as usize];
        let mut affinity: Vec<(u8, u32)> = Vec::new();
        for req in list.iter() {
            cpu += u64::from(req.cpu_milli);
            mem += req.memory_mib;
            if req.num_gpu == 0 {
                continue;
            }
            let tag = if req.is_fractional() { 0 } else { req.num_gpu };
            match affinity.iter_mut().find(|(t, _)| *t == tag) {
                Some((_, c)) => *c += 1,
                None => affinity.push((tag, 1)),
            }
            let chosen = gpuops_packing::extender::preferred_gpus(
                &free,
                req.num_gpu,
                req.gpu_milli,
                typical_for_gpus,
            )
            .unwrap_or_else(|| {
                // Over-committed in the engine's model (replicas are not GPUs): charge the
                // GPUs with the most free milli, never below zero.
                let mut order: Vec<usize> = (0..free.len()).collect();
                order.sort_by_key(|&g| std::cmp::Reverse(free[g]));
                order.truncate(usize::from(req.num_gpu));
                notes.push(format!(
                    "node {}: the bound pods need more GPU than it has in the engine's model",
                    view.name
                ));
                order
            });
            for &g in &chosen {
                if let Some(f) = free.get_mut(g) {
                    *f = f.saturating_sub(req.gpu_milli);
                }
            }
        }
        let cpu_used = u32::try_from(cpu.min(view.cpu_milli)).unwrap_or(u32::MAX);
        cluster
            .set_usage(i, cpu_used, mem.min(view.memory_mib), &free, &affinity)
            .map_err(|source| ModelError::Node {
                node: view.name.clone(),
                source,
            })?;
    }
    Ok(Snapshot {
        cluster,
        nodes: views,
        typical,
        notes,
    })
}

#[cfg(feature = "k8s")]
fn shape(ask: &PodAsk, req: &PodReq) -> PodSpec {
    PodSpec {
        name: String::new(),
        cpu_milli: ask.cpu_milli,
        memory_mib: ask.memory_mib,
        num_gpu: u32::from(req.num_gpu),
        gpu_milli: u32::from(req.gpu_milli),
        gpu_spec: Vec::new(),
    }
}

/// A pod's tolerations and its nodeSelector and required node affinity, as plain values for the
/// scheduler's filter rules in [`fit`].
#[cfg(feature = "k8s")]
pub fn pod_constraints(p: &Pod) -> (Vec<fit::Toleration>, fit::NodeConstraints) {
    let Some(spec) = &p.spec else {
        return (Vec::new(), fit::NodeConstraints::default());
    };
    let tolerations = spec
        .tolerations
        .iter()
        .flatten()
        .map(|t| fit::Toleration {
            key: t.key.clone().unwrap_or_default(),
            operator: t.operator.clone().unwrap_or_default(),
            value: t.value.clone().unwrap_or_default(),
            effect: t.effect.clone().unwrap_or_default(),
        })
        .collect();
    let req = |r: &k8s_openapi::api::core::v1::NodeSelectorRequirement| fit::Requirement {
        key: r.key.clone(),
        operator: r.operator.clone(),
        values: r.values.clone().unwrap_or_default(),
    };
    let affinity = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|sel| {
            sel.node_selector_terms
                .iter()
                .map(|t| fit::Term {
                    expressions: t.match_expressions.iter().flatten().map(req).collect(),
                    fields: t.match_fields.iter().flatten().map(req).collect(),
                })
                .collect()
        });
    (
        tolerations,
        fit::NodeConstraints {
            node_selector: spec.node_selector.clone().unwrap_or_default(),
            affinity,
        },
    )
}

#[cfg(all(test, feature = "k8s"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::testkit::{node, pod};
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("1.5Gi"), Some(1.5 * 1_073_741_824.0));
        assert_eq!(quantity("1e3"), Some(1000.0));
        assert_eq!(quantity("2k"), Some(2000.0));
        assert_eq!(quantity("1E"), Some(1e18));
        assert_eq!(quantity("abc"), None);
        assert_eq!(quantity(""), None);
        assert_eq!(quantity("-1"), None);
    }

    #[test]
    fn nodes_from_labels_and_capacity() {
        let n = node_gpus(&node("a", 4, 4, false));
        assert_eq!(
            n,
            NodeGpus {
                name: "a".into(),
                cpu_milli: 31_500,
                memory_mib: 63 * 1024,
                gpus: 4,
                replicas: 4,
                model: "Tesla-T4".into()
            }
        );
        // No GFD labels: renamed shared resource and the count label missing -> capacity / 1.
        let mut bare = node("b", 2, 1, false);
        bare.metadata.labels = None;
        let v = node_gpus(&bare);
        assert_eq!((v.gpus, v.replicas, v.model.as_str()), (2, 1, ""));
        // gpu.shared with the count label but no replicas label: replicas = capacity / count.
        let mut s = node("c", 2, 5, true);
        s.metadata.labels.as_mut().unwrap().remove(LABEL_REPLICAS);
        let v = node_gpus(&s);
        assert_eq!((v.gpus, v.replicas), (2, 5));
        let cpu_only: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "cpu"}})).unwrap();
        assert_eq!(node_gpus(&cpu_only).gpus, 0);
    }

    #[test]
    fn demands() {
        let ask = pod_ask(&pod("p", None, GPU, 1, None));
        assert!(ask.is_gpu());
        assert_eq!((ask.cpu_milli, ask.memory_mib), (1000, 2048));
        assert_eq!(
            ask.demand(4),
            Demand {
                num_gpu: 1,
                gpu_milli: 250
            }
        );
        assert_eq!(
            ask.demand(1),
            Demand {
                num_gpu: 1,
                gpu_milli: 1000
            }
        );
        let three = pod_ask(&pod("p", None, GPU_SHARED, 3, None));
        assert_eq!(three.demand(3).gpu_milli, 1000);
        assert_eq!(three.demand(2).num_gpu, 2);
        assert_eq!(three.demand(10).gpu_milli, 300);
        // The annotation overrides the replica arithmetic.
        let a = pod_ask(&pod("p", None, GPU, 1, Some(600)));
        assert_eq!(
            a.demand(4),
            Demand {
                num_gpu: 1,
                gpu_milli: 600
            }
        );
        assert_eq!(
            pod_ask(&pod("p", None, GPU, 2, Some(2000)))
                .demand(4)
                .num_gpu,
            2
        );
        // Invalid annotations are ignored; an annotation without a GPU request is not a GPU pod.
        assert_eq!(pod_ask(&pod("p", None, GPU, 1, Some(1500))).milli, None);
        assert!(!pod_ask(&pod("p", None, GPU, 0, Some(300))).is_gpu());
    }

    #[test]
    fn snapshot_places_bound_pods() {
        let a = node("a", 2, 4, false);
        let b = node("b", 1, 1, false);
        let p1 = pod("p1", Some("a"), GPU, 1, None); // 250 milli
        let p2 = pod("p22", Some("a"), GPU, 1, Some(600));
        let p3 = pod("p333", Some("b"), GPU, 1, None); // whole GPU
        let mut done = pod("done", Some("a"), GPU, 4, None);
        done.status =
            Some(serde_json::from_value(serde_json::json!({"phase": "Succeeded"})).unwrap());
        let pending = pod("pending", None, GPU, 1, None);
        let s = snapshot(&[&b, &a], &[&p1, &p2, &p3, &done, &pending], None, None).unwrap();
        assert_eq!(s.nodes[0].name, "a");
        let a_free = s.cluster.gpus(0);
        // 250 then 600 on the same GPU (the engine completes GPUs) or split: total 850 used.
        assert_eq!(
            a_free.iter().map(|&f| 1000 - u32::from(f)).sum::<u32>(),
            850
        );
        assert_eq!(s.cluster.gpus(1), &[0]);
        assert_eq!(s.cluster.node(0).cpu_left, 31_500 - 2000);
        assert_eq!(s.cluster.node(0).affinity_count(0), 2);
        assert_eq!(s.typical.pods.len(), 3);
    }
}
