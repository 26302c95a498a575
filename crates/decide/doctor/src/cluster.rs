//! The snapshot indexed once: GPU nodes with allocatable/requested GPUs, GPU pods, events by object.

use crate::fit;
use crate::resources::{self, GpuMap};
use crate::snapshot::Snapshot;
use k8s_openapi::api::core::v1::{Event, Node, NodeCondition, Pod, PodCondition, Taint};
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};

/// Label GFD and NVIDIA's operator put on GPU nodes.
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
pub const PRODUCT: &str = "nvidia.com/gpu.product";
pub const COUNT: &str = "nvidia.com/gpu.count";
pub const DRIVER_FULL: &str = "nvidia.com/cuda.driver-version.full";
pub const DRIVER_MAJOR: &str = "nvidia.com/cuda.driver-version.major";
/// The driver labels GFD wrote before the `cuda.driver-version.*` form (still on older nodes).
pub const OLD_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
pub const OLD_DRIVER_MINOR: &str = "nvidia.com/cuda.driver.minor";
pub const OLD_DRIVER_REV: &str = "nvidia.com/cuda.driver.rev";
pub const MIG_CONFIG: &str = "nvidia.com/mig.config";
pub const MIG_CONFIG_STATE: &str = "nvidia.com/mig.config.state";
pub const MIG_STATE_SINCE: &str = "gpuops.io/mig.config.state-since";
pub const MIG_STRATEGY: &str = "nvidia.com/mig.strategy";

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A node as the rules see it.
#[derive(Debug)]
pub struct NodeView<'a> {
    pub node: &'a Node,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub capacity: GpuMap,
    pub allocatable: GpuMap,
    /// GPU resources requested by the pods bound to it that still run.
    pub requested: GpuMap,
    /// Taints that block scheduling (cordoning included).
    pub taints: Vec<Taint>,
    /// Labelled or sized as a GPU node.
    pub is_gpu: bool,
    /// Indexes into [`Cluster::gpu_pods`] of the active GPU pods bound here.
    pub gpu_pods: Vec<usize>,
    /// Pods of the GPU agent or NVIDIA's device plugin on this node.
    pub agents: Vec<&'a Pod>,
    /// Allocatable CPU (cores) and memory (bytes); `None` when the node does not say.
    pub cpu_allocatable: Option<f64>,
    pub memory_allocatable: Option<f64>,
    /// CPU and memory requested by every active pod bound here (GPU or not).
    pub cpu_requested: f64,
    pub memory_requested: f64,
    /// Active pods here no controller recreates (kubectl drain refuses them without --force).
    pub bare_pods: Vec<&'a str>,
    /// Why the node's GPUs cannot take pods now (see [`NodeView::unavailable`]), computed once.
    down: Option<String>,
    /// The catalog model of its GPUs, looked up once (`rules::node_model`).
    pub(crate) model: std::cell::OnceCell<Option<&'static gpuops_catalog::GpuModel>>,
}

/// The taints the node lifecycle controller puts on a node whose kubelet stopped reporting.
pub const LIFECYCLE_TAINTS: &[&str] = &[
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// The pod's `PodScheduled=False` condition: the scheduler's last word on a pod it did not place.
pub fn unscheduled(pod: &Pod) -> Option<&PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
}

impl NodeView<'_> {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The node's condition of `type_`, if it reports one.
    pub fn condition(&self, type_: &str) -> Option<&NodeCondition> {
        self.node
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// The `Ready` condition when it is not `True` (`False` or `Unknown`).
    pub fn not_ready(&self) -> Option<&NodeCondition> {
        self.condition("Ready").filter(|c| c.status != "True")
    }

    /// Whether a lifecycle taint (not-ready, unreachable) is on the node.
    pub fn lifecycle_tainted(&self) -> bool {
        self.taints
            .iter()
            .any(|t| LIFECYCLE_TAINTS.contains(&t.key.as_str()))
    }

    /// How many GPUs the node has, from capacity or the `nvidia.com/gpu.count` label.
    pub fn gpu_count(&self) -> i64 {
        let label = self.label(COUNT).and_then(|c| c.parse().ok()).unwrap_or(0);
        let whole = self
            .capacity
            .get(crate::resources::GPU)
            .copied()
            .unwrap_or(0);
        label.max(whole / self.replicas(crate::resources::GPU).max(1))
    }

    /// Why the node's GPUs cannot take pods now, when they cannot: NotReady, no device plugin,
    /// every device unhealthy, the GPU-unhealthy taint, or a MIG change failed or under way.
    pub fn unavailable(&self) -> Option<&str> {
        self.down.as_deref()
    }

    fn compute_unavailable(&self, now: Timestamp) -> Option<String> {
        if let Some(c) = self.not_ready() {
            let since = c
                .last_transition_time
                .as_ref()
                .map(|t| format!(" for {}", human_duration(seconds_between(now, t.0))))
                .unwrap_or_default();
            return Some(format!(
                "NotReady{since} (Ready={} {}: {})",
                c.status,
                c.reason.as_deref().unwrap_or(""),
                c.message.as_deref().unwrap_or("").trim()
            ));
        }
        if self.lifecycle_tainted() {
            let keys: Vec<&str> = self
                .taints
                .iter()
                .filter(|t| LIFECYCLE_TAINTS.contains(&t.key.as_str()))
                .map(|t| t.key.as_str())
                .collect();
            return Some(format!("NotReady (taint {})", keys.join(", ")));
        }
        // A MIG change that failed or is under way leaves the node what it advertises (the agent
        // puts the old resources back after a failure): only with nothing allocatable is it down.
        if !self.allocatable.values().any(|v| *v > 0) {
            let config = self.label(MIG_CONFIG).unwrap_or("?");
            return Some(match self.label(MIG_CONFIG_STATE) {
                Some("failed") => format!("MIG config {config} failed, no GPU allocatable"),
                Some(s @ ("pending" | "rebooting")) => {
                    format!("MIG config {config} {s}, no GPU allocatable meanwhile")
                }
                _ if self.capacity.values().any(|v| *v > 0) => {
                    "every GPU device unhealthy (allocatable 0)".to_string()
                }
                // GFD's label when the single strategy meets MIG devices of several profiles.
                _ if self.label(MIG_STRATEGY) == Some("single")
                    && self
                        .label(PRODUCT)
                        .is_some_and(|p| p.ends_with("-MIG-INVALID")) =>
                {
                    format!(
                        "MIG strategy single cannot advertise config {config}: its MIG devices are not all one profile"
                    )
                }
                _ => "no device plugin registered (no nvidia.com/ resource)".to_string(),
            });
        }
        if self
            .taints
            .iter()
            .any(|t| t.key == gpuops_labels::DEFAULT_TAINT_KEY)
        {
            return Some("GPU unhealthy (taint gpuops.io/gpu-unhealthy)".to_string());
        }
        None
    }

    /// `kubectl drain` for this node: with `--force` when pods no controller recreates are on it
    /// (drain refuses them otherwise; they are deleted for good).
    pub fn drain(&self) -> String {
        let force = if self.bare_pods.is_empty() {
            ""
        } else {
            " --force"
        };
        format!(
            "kubectl drain {} --ignore-daemonsets --delete-emptydir-data{force}",
            self.name
        )
    }

    /// What [`NodeView::drain`]'s `--force` costs, for the fix text ("" when none).
    pub fn drain_note(&self) -> String {
        if self.bare_pods.is_empty() {
            return String::new();
        }
        format!(
            " (--force because {} not recreated by any controller: save {} first)",
            list_some(self.bare_pods.iter(), 4),
            if self.bare_pods.len() == 1 {
                "it is"
            } else {
                "they are"
            }
        )
    }

    /// CPU and memory the node has left for a pod: (cores, bytes); `None` when unknown.
    pub fn cpu_memory_free(&self) -> (Option<f64>, Option<f64>) {
        (
            self.cpu_allocatable.map(|a| a - self.cpu_requested),
            self.memory_allocatable.map(|a| a - self.memory_requested),
        )
    }

    /// Allocatable minus requested, per resource (never negative).
    pub fn free(&self, resource: &str) -> i64 {
        let a = self.allocatable.get(resource).copied().unwrap_or(0);
        let r = self.requested.get(resource).copied().unwrap_or(0);
        (a - r).max(0)
    }

    /// Devices the node has but does not offer: some capacity above allocatable (the device
    /// plugin withholds unhealthy ones), or a MIG apply that failed.
    pub fn lacks_devices(&self) -> bool {
        self.label(MIG_CONFIG_STATE) == Some("failed")
            || self
                .capacity
                .iter()
                .any(|(r, cap)| *cap > self.allocatable_of(r))
    }

    pub fn allocatable_of(&self, resource: &str) -> i64 {
        self.allocatable.get(resource).copied().unwrap_or(0)
    }

    /// The node offers the resource (has it in capacity or allocatable).
    pub fn offers(&self, resource: &str) -> bool {
        self.capacity.get(resource).copied().unwrap_or(0) > 0 || self.allocatable_of(resource) > 0
    }

    /// Configured replicas per device for a resource (`<resource>.replicas`, 1 when absent).
    pub fn replicas(&self, resource: &str) -> i64 {
        let base = resource.strip_suffix(".shared").unwrap_or(resource);
        self.label(&format!("{base}.replicas"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    }

    /// The sharing strategy label of a resource (`none`, `time-slicing`, `mps`).
    pub fn sharing_strategy(&self, resource: &str) -> Option<&str> {
        let base = resource.strip_suffix(".shared").unwrap_or(resource);
        self.label(&format!("{base}.sharing-strategy"))
    }

    /// The resource is shared replicas here.
    pub fn is_shared(&self, resource: &str) -> bool {
        resources::is_shared_name(resource)
            || self.replicas(resource) > 1
            || self
                .sharing_strategy(resource)
                .is_some_and(|s| s != "none" && !s.is_empty())
    }
}

/// A pod that asks for GPUs.
#[derive(Debug)]
pub struct PodView<'a> {
    pub pod: &'a Pod,
    pub namespace: &'a str,
    pub name: &'a str,
    pub gpus: GpuMap,
    pub node: Option<&'a str>,
    pub phase: &'a str,
}

impl PodView<'_> {
    /// Bound and not finished: its GPUs count against the node.
    pub fn active(&self) -> bool {
        self.node.is_some() && !matches!(self.phase, "Succeeded" | "Failed")
    }

    pub fn pending_unbound(&self) -> bool {
        self.node.is_none() && matches!(self.phase, "Pending" | "")
    }

    pub fn created(&self) -> Option<Timestamp> {
        self.pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
    }
}

/// Key of the events index: involved object's kind, namespace ("" for cluster objects), name.
type EventKey = (String, String, String);

/// The indexed snapshot.
#[derive(Debug)]
pub struct Cluster<'a> {
    pub snapshot: &'a Snapshot,
    pub nodes: Vec<NodeView<'a>>,
    pub node_index: HashMap<&'a str, usize>,
    pub gpu_pods: Vec<PodView<'a>>,
    events: HashMap<EventKey, Vec<&'a Event>>,
    /// Active pods bound to each node name (all pods, GPU or not), for the namespace filter.
    pub namespaces_on_node: HashMap<&'a str, Vec<&'a str>>,
    /// Indexes of the GPU nodes that are up but withhold devices (capacity above allocatable) or
    /// whose MIG apply failed: the only nodes broken capacity can name. Found once, so a pending
    /// pod looks at these few rather than at every node.
    broken: Vec<usize>,
}

fn is_agent(pod: &Pod) -> bool {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let app = pod.metadata.labels.as_ref().and_then(|l| {
        l.get("app.kubernetes.io/name")
            .or_else(|| l.get("app"))
            .or_else(|| l.get("name"))
    });
    let looks = |s: &str| s.contains("gpuops") || s.contains("nvidia-device-plugin");
    looks(name) || app.is_some_and(|a| looks(a))
}

impl<'a> Cluster<'a> {
    pub fn build(snapshot: &'a Snapshot) -> Cluster<'a> {
        let mut nodes: Vec<NodeView<'a>> = snapshot
            .nodes
            .iter()
            .map(|node| {
                let labels = node.metadata.labels.as_ref().unwrap_or(&NO_LABELS);
                let status = node.status.as_ref();
                let capacity = resources::gpu_map(status.and_then(|s| s.capacity.as_ref()));
                let allocatable = resources::gpu_map(status.and_then(|s| s.allocatable.as_ref()));
                let quantity = |key: &str| {
                    status
                        .and_then(|s| s.allocatable.as_ref())
                        .and_then(|m| m.get(key))
                        .and_then(resources::value)
                };
                let is_gpu = !capacity.is_empty()
                    || !allocatable.is_empty()
                    || labels.get(GPU_PRESENT).is_some_and(|v| v == "true")
                    || labels.contains_key(PRODUCT)
                    || labels.get(COUNT).is_some_and(|v| v != "0");
                NodeView {
                    node,
                    name: node.metadata.name.as_deref().unwrap_or(""),
                    labels,
                    capacity,
                    allocatable,
                    requested: GpuMap::new(),
                    taints: fit::blocking_taints(node),
                    is_gpu,
                    gpu_pods: Vec::new(),
                    agents: Vec::new(),
                    cpu_allocatable: quantity("cpu"),
                    memory_allocatable: quantity("memory"),
                    cpu_requested: 0.0,
                    memory_requested: 0.0,
                    bare_pods: Vec::new(),
                    down: None,
                    model: std::cell::OnceCell::new(),
                }
            })
            .collect();
        for n in &mut nodes {
            n.down = n.compute_unavailable(snapshot.now);
        }
        let node_index: HashMap<&str, usize> =
            nodes.iter().enumerate().map(|(i, n)| (n.name, i)).collect();

        let mut gpu_pods = Vec::new();
        let mut namespaces_on_node: HashMap<&str, Vec<&str>> = HashMap::new();
        for pod in &snapshot.pods {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .filter(|n| !n.is_empty());
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("");
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let finished = matches!(phase, "Succeeded" | "Failed");
            if let Some(n) = node
                && !finished
            {
                let list = namespaces_on_node.entry(n).or_default();
                if !list.contains(&namespace) {
                    list.push(namespace);
                }
                if let Some(&i) = node_index.get(n) {
                    let (cpu, memory) = resources::pod_cpu_memory(pod);
                    nodes[i].cpu_requested += cpu;
                    nodes[i].memory_requested += memory;
                    if is_agent(pod) {
                        nodes[i].agents.push(pod);
                    }
                    let controlled = pod
                        .metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.controller == Some(true));
                    let mirror = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
                    if !controlled && !mirror {
                        nodes[i]
                            .bare_pods
                            .push(pod.metadata.name.as_deref().unwrap_or(""));
                    }
                }
            }
            let gpus = resources::pod_gpus(pod);
            if gpus.is_empty() {
                continue;
            }
            let view = PodView {
                pod,
                namespace,
                name: pod.metadata.name.as_deref().unwrap_or(""),
                gpus,
                node,
                phase,
            };
            if view.active()
                && let Some(&i) = node.and_then(|n| node_index.get(n))
            {
                for (k, v) in &view.gpus {
                    *nodes[i].requested.entry(k.clone()).or_default() += v;
                }
                nodes[i].gpu_pods.push(gpu_pods.len());
            }
            gpu_pods.push(view);
        }

        let mut events: HashMap<EventKey, Vec<&'a Event>> = HashMap::new();
        for e in &snapshot.events {
            let o = &e.involved_object;
            let key = (
                o.kind.clone().unwrap_or_default(),
                o.namespace.clone().unwrap_or_default(),
                o.name.clone().unwrap_or_default(),
            );
            events.entry(key).or_default().push(e);
        }
        for list in events.values_mut() {
            list.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
        }
        let broken = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.is_gpu && n.unavailable().is_none() && n.lacks_devices())
            .map(|(i, _)| i)
            .collect();
        Cluster {
            snapshot,
            nodes,
            node_index,
            gpu_pods,
            events,
            namespaces_on_node,
            broken,
        }
    }

    /// GPU nodes that are up with devices withheld or a failed MIG apply (see `Cluster::broken`).
    pub fn broken_nodes(&self) -> impl Iterator<Item = &NodeView<'a>> {
        self.broken.iter().map(|&i| &self.nodes[i])
    }

    pub fn node(&self, name: &str) -> Option<&NodeView<'a>> {
        self.node_index.get(name).map(|&i| &self.nodes[i])
    }

    pub fn gpu_nodes(&self) -> impl Iterator<Item = &NodeView<'a>> {
        self.nodes.iter().filter(|n| n.is_gpu)
    }

    /// Events about an object, newest first.
    pub fn events_for(&self, kind: &str, namespace: &str, name: &str) -> &[&'a Event] {
        self.events
            .get(&(kind.to_string(), namespace.to_string(), name.to_string()))
            .map_or(&[], Vec::as_slice)
    }

    /// The newest event about the pod with this reason.
    pub fn pod_event(&self, pod: &PodView<'_>, reason: &str) -> Option<&'a Event> {
        self.events_for("Pod", pod.namespace, pod.name)
            .iter()
            .copied()
            .find(|e| e.reason.as_deref() == Some(reason))
    }

    /// Every event, for rules that scan by reason.
    pub fn all_events(&self) -> impl Iterator<Item = &'a Event> {
        self.snapshot.events.iter()
    }

    pub fn now(&self) -> Timestamp {
        self.snapshot.now
    }
}

/// When an event last happened: series, lastTimestamp, eventTime, firstTimestamp, creation.
pub fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// How often the event happened.
pub fn event_count(e: &Event) -> i32 {
    e.series
        .as_ref()
        .and_then(|s| s.count)
        .or(e.count)
        .unwrap_or(1)
        .max(1)
}

/// An event as evidence: `FailedScheduling (default-scheduler, 2m ago, x4): <message>`.
pub fn describe_event(e: &Event, now: Timestamp) -> String {
    let source = e
        .reporting_component
        .as_deref()
        .filter(|s| !s.is_empty())
        .or_else(|| e.source.as_ref().and_then(|s| s.component.as_deref()))
        .unwrap_or("unknown source");
    let when = event_time(e).map_or_else(|| "at an unknown time".into(), |t| ago(now, t));
    let count = match event_count(e) {
        1 => String::new(),
        n => format!(", x{n}"),
    };
    format!(
        "{} ({source}, {when}{count}): {}",
        e.reason.as_deref().unwrap_or("Event"),
        e.message.as_deref().unwrap_or("").trim()
    )
}

/// Seconds between two times (0 when `then` is in the future).
pub fn seconds_between(now: Timestamp, then: Timestamp) -> i64 {
    (now.as_second() - then.as_second()).max(0)
}

/// `5s ago`, `3m ago`, `2h ago`, `4d ago`.
pub fn ago(now: Timestamp, then: Timestamp) -> String {
    format!("{} ago", human_duration(seconds_between(now, then)))
}

/// `45s`, `3m`, `2h10m`, `4d`.
pub fn human_duration(s: i64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => match (s % 3600) / 60 {
            0 => format!("{}h", s / 3600),
            m => format!("{}h{m}m", s / 3600),
        },
        s => format!("{}d", s / 86_400),
    }
}

/// `a, b, c and 4 more` (only the items shown are formatted: lists can hold thousands of nodes).
pub fn list_some<T: std::fmt::Display>(items: impl IntoIterator<Item = T>, max: usize) -> String {
    let mut shown: Vec<String> = Vec::new();
    let mut rest = 0usize;
    for item in items {
        if shown.len() < max {
            shown.push(item.to_string());
        } else {
            rest += 1;
        }
    }
    if rest == 0 {
        return shown.join(", ");
    }
    format!("{} and {rest} more", shown.join(", "))
}
