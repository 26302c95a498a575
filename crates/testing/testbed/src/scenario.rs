//! Autoscaling scenarios measured the same way whichever autoscaler runs in the test bed: pending
//! GPU pods go in, and out come the instances launched (vs the fewest that fit, computed
//! independently), time to capacity per pod (created -> Running) and GPU-hours bought until every
//! pod runs (instance-seconds from launch x its GPUs), and per pod and per instance the time of
//! each stage on the way (decided, instance created, node registered, GPUs, startup taint gone,
//! bound, running), from the objects' own timestamps where they have one.

pub use crate::infra::parse_rfc3339;
use crate::infra::{STARTUP_TAINT, TAINT_REMOVED_AT};
use crate::{BedError, Cluster};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The GPU resource the scenarios ask for.
pub const GPU: &str = "nvidia.com/gpu";

/// An instance (a Karpenter NodeClaim, a Cluster API Machine) an autoscaler launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub name: String,
    pub gpus: u32,
    /// Its `metadata.creationTimestamp` (RFC 3339).
    pub created: Option<String>,
    /// The Node it became, once it has one.
    pub node: Option<String>,
}

/// What a scenario needs from an autoscaler under test.
pub trait Autoscaler {
    /// For the table: "karpenter", "karpenter+startup-taint", "gpuops".
    fn name(&self) -> String;
    /// The instances that exist now; the runner records when each first appeared.
    fn instances(&self) -> Result<Vec<Instance>, BedError>;
}

/// What one pending pod asks for: `count` of the device resource `resource`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub resource: String,
    pub count: u32,
}

impl Ask {
    pub fn new(resource: &str, count: u32) -> Ask {
        Ask {
            resource: resource.to_string(),
            count,
        }
    }
}

/// A kind of node the autoscalers may buy. Both sides are built from the same offers (a
/// Karpenter instance type, a Cluster API pool), so they choose among the same nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub name: String,
    /// The `nvidia.com/gpu.product` label of its nodes.
    pub product: String,
    /// Physical GPUs: what GPU-hours count.
    pub gpus: u32,
    /// The device resource its nodes advertise once the device plugin registers, and how many.
    pub resource: String,
    pub devices: u32,
    /// Per node-hour.
    pub price: f64,
    /// The mig-parted config its nodes come up with (`nvidia.com/mig.config`).
    pub mig_config: Option<String>,
    /// Time-slicing replicas per GPU.
    pub replicas: Option<u32>,
}

impl Offer {
    /// Whole GPUs (`nvidia.com/gpu`).
    pub fn whole(name: &str, product: &str, gpus: u32, price: f64) -> Offer {
        Offer {
            name: name.to_string(),
            product: product.to_string(),
            gpus,
            resource: GPU.to_string(),
            devices: gpus,
            price,
            mig_config: None,
            replicas: None,
        }
    }

    /// H100 nodes of 8, 4 and 1 whole GPUs at the same price per GPU: only packing decides.
    pub fn h100_whole() -> Vec<Offer> {
        vec![
            Offer::whole("gpu-h100-8x", H100, 8, 98.32),
            Offer::whole("gpu-h100-4x", H100, 4, 49.16),
            Offer::whole("gpu-h100-1x", H100, 1, 12.29),
        ]
    }

    /// An 8x H100 node under NVIDIA's `all-1g.10gb`: 7 `nvidia.com/mig-1g.10gb` per GPU.
    pub fn h100_mig_1g() -> Offer {
        Offer {
            name: "gpu-h100-mig-1g".into(),
            product: H100.into(),
            gpus: 8,
            resource: "nvidia.com/mig-1g.10gb".into(),
            devices: 56,
            price: 98.32,
            mig_config: Some("all-1g.10gb".into()),
            replicas: None,
        }
    }

    /// A 4x L4 node time-sliced 4 ways: 16 `nvidia.com/gpu.shared` (the device plugin's rename).
    pub fn l4_shared() -> Offer {
        Offer {
            name: "gpu-l4-shared".into(),
            product: "NVIDIA-L4".into(),
            gpus: 4,
            resource: "nvidia.com/gpu.shared".into(),
            devices: 16,
            price: 3.2,
            mig_config: None,
            replicas: Some(4),
        }
    }
}

const H100: &str = "NVIDIA-H100-80GB-HBM3";

/// One batch of pending pods and the nodes on offer for them.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub pods: Vec<Ask>,
    pub offers: Vec<Offer>,
}

impl Scenario {
    /// (a) Scale from zero for one pod asking 4 GPUs.
    pub fn scale_from_zero() -> Scenario {
        Scenario {
            name: "a: 1 pod x 4 GPUs from zero".into(),
            pods: vec![Ask::new(GPU, 4)],
            offers: Offer::h100_whole(),
        }
    }

    /// (b) A burst of 20 pods: 8 x 1, 6 x 2, 4 x 4 and 2 x 8 GPUs (52 GPUs).
    pub fn burst() -> Scenario {
        Scenario {
            name: "b: burst of 20 pods (52 GPUs)".into(),
            pods: asks(GPU, &[(8, 1), (6, 2), (4, 4), (2, 8)]),
            offers: Offer::h100_whole(),
        }
    }

    /// (c) A burst of 20 pods of three kinds, on whole-GPU, MIG (`all-1g.10gb`) and
    /// time-sliced offers: 6 whole (16 GPUs: two 8x nodes are both the cheapest and the fewest),
    /// 7 MIG (63 x 1g.10gb, more than one node's 56) and 7 shared (22 replicas, more than one
    /// node's 16). Within a kind the largest come first.
    pub fn mixed() -> Scenario {
        let mig = Offer::h100_mig_1g();
        let shared = Offer::l4_shared();
        let mut pods = asks(GPU, &[(2, 4), (4, 2)]);
        pods.extend(asks(&mig.resource, &[(3, 14), (2, 7), (1, 4), (1, 3)]));
        pods.extend(asks(&shared.resource, &[(3, 4), (2, 3), (2, 2)]));
        let mut offers = Offer::h100_whole();
        offers.extend([mig, shared]);
        Scenario {
            name: "c: mixed burst of 20 pods (whole, MIG, shared)".into(),
            pods,
            offers,
        }
    }

    /// A KubeSchedulerConfiguration whose default profile scores nodes by how full the
    /// scenario's device resources are (NodeResourcesFit, MostAllocated), as GPU clusters often
    /// run the scheduler; the default (LeastAllocated) spreads a burst's pods over nodes that
    /// become schedulable together, so that a large pod may fit none of them.
    pub fn bin_packing_profile(&self) -> String {
        let mut resources: Vec<&str> = self.offers.iter().map(|o| o.resource.as_str()).collect();
        resources.sort_unstable();
        resources.dedup();
        let mut config = "profiles:\n- schedulerName: default-scheduler\n  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      scoringStrategy:\n        type: MostAllocated\n        resources:\n".to_string();
        for r in resources {
            config.push_str(&format!("        - name: {r}\n          weight: 1\n"));
        }
        config
    }

    /// The fewest nodes that hold every pod: per resource, an exact bin packing onto the
    /// largest offer of it (each offer advertises one resource, so the kinds never share a
    /// node). Pods whose resource nobody offers are left out.
    pub fn min_instances(&self) -> usize {
        let mut by_resource: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for a in &self.pods {
            by_resource.entry(&a.resource).or_default().push(a.count);
        }
        by_resource
            .iter()
            .filter_map(|(resource, counts)| {
                let cap = self
                    .offers
                    .iter()
                    .filter(|o| o.resource == *resource)
                    .map(|o| o.devices)
                    .max()?;
                Some(fewest_bins(counts, cap))
            })
            .sum()
    }
}

/// `(how many, count)` pairs as asks of `resource`.
fn asks(resource: &str, groups: &[(usize, u32)]) -> Vec<Ask> {
    groups
        .iter()
        .flat_map(|&(n, count)| std::iter::repeat_n(Ask::new(resource, count), n))
        .collect()
}

/// The fewest bins of `cap` that hold `items`, exactly (branch and bound, largest first; the
/// scenarios have at most a few dozen items). An item over `cap` gets a bin of its own.
pub fn fewest_bins(items: &[u32], cap: u32) -> usize {
    fn go(i: usize, items: &[u32], bins: &mut Vec<u32>, cap: u32, lower: usize, best: &mut usize) {
        if bins.len() >= *best || *best == lower {
            return;
        }
        if i == items.len() {
            *best = bins.len();
            return;
        }
        let mut tried = Vec::new();
        for b in 0..bins.len() {
            // Two bins equally full lead to the same packings.
            if bins[b] + items[i] <= cap && !tried.contains(&bins[b]) {
                tried.push(bins[b]);
                bins[b] += items[i];
                go(i + 1, items, bins, cap, lower, best);
                bins[b] -= items[i];
            }
        }
        bins.push(items[i]);
        go(i + 1, items, bins, cap, lower, best);
        bins.pop();
    }
    if cap == 0 {
        return items.len();
    }
    let mut sorted = items.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = sorted.iter().map(|&x| u64::from(x)).sum();
    let lower = usize::try_from(total.div_ceil(u64::from(cap))).unwrap_or(usize::MAX);
    let mut best = usize::MAX;
    go(0, &sorted, &mut Vec::new(), cap, lower, &mut best);
    best
}

/// What one scenario measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub scenario: String,
    pub autoscaler: String,
    pub pods: usize,
    pub all_running: bool,
    /// Instances seen until the settle window after the last pod ran closed.
    pub launched: usize,
    pub min_instances: usize,
    /// Per pod: created -> Running (None: it never ran).
    pub time_to_capacity: Vec<Option<Duration>>,
    /// Sum over instances of (all pods Running - first seen) x GPUs, in GPU-hours.
    pub gpu_hours_bought: f64,
    /// When the first new Node appeared, and the first Node with GPUs in allocatable (the
    /// device-plugin delay shows between the two).
    pub first_node: Option<Duration>,
    pub first_gpus: Option<Duration>,
    /// Per pod, each of [`STAGES`] (seconds since the Unix epoch).
    pub pod_stages: Vec<Stages>,
    /// Per instance, [`STAGES`] from "instance created" to "startup taint gone".
    pub instance_stages: Vec<Stages>,
}

/// The stages on a pod's way to capacity, in order.
pub const STAGES: [&str; 8] = [
    "pod created",
    "autoscaler decided",
    "instance created",
    "node registered",
    "GPUs in allocatable",
    "startup taint gone",
    "pod bound",
    "pod running",
];
const DECIDED: usize = 1;
const INSTANCE: usize = 2;
const REGISTERED: usize = 3;
const GPUS: usize = 4;
const UNTAINTED: usize = 5;
const BOUND: usize = 6;
const RUNNING: usize = 7;

/// When one pod (or instance) reached each of [`STAGES`], seconds since the Unix epoch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stages {
    /// The pod's name (or the instance's).
    pub name: String,
    /// The instance its node came from.
    pub instance: Option<String>,
    pub at: [Option<f64>; STAGES.len()],
}

impl Outcome {
    /// The slowest pod's time to capacity.
    pub fn max_time_to_capacity(&self) -> Option<Duration> {
        self.time_to_capacity.iter().flatten().max().copied()
    }

    /// One row of the side-by-side table.
    pub fn row(&self) -> String {
        let ttc =
            |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}", d.as_secs_f64()));
        let mut sorted: Vec<Duration> = self.time_to_capacity.iter().flatten().copied().collect();
        sorted.sort();
        let p50 = sorted.get(sorted.len() / 2).copied();
        format!(
            "| {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {:.4} |",
            self.scenario,
            self.autoscaler,
            self.time_to_capacity.iter().flatten().count(),
            self.pods,
            self.launched,
            self.min_instances,
            ttc(self.first_node),
            ttc(self.first_gpus),
            ttc(p50),
            ttc(self.max_time_to_capacity()),
            self.gpu_hours_bought,
        )
    }

    /// The table's header.
    pub fn header() -> &'static str {
        "| scenario | autoscaler | pods running | instances launched | fewest that fit | first node (s) | first GPUs (s) | time to capacity p50 (s) | max (s) | GPU-hours bought |\n|---|---|---|---|---|---|---|---|---|---|"
    }
}

/// Creates the scenario's pods in `namespace`, then watches until all run (or `timeout`), and
/// `settle` longer to catch instances launched late.
pub fn run(
    cluster: &Cluster,
    autoscaler: &dyn Autoscaler,
    scenario: &Scenario,
    namespace: &str,
    timeout: Duration,
    settle: Duration,
) -> Result<Outcome, BedError> {
    let names: Vec<String> = (0..scenario.pods.len())
        .map(|i| format!("gpu-pod-{i}"))
        .collect();
    let items: Vec<_> = names
        .iter()
        .zip(&scenario.pods)
        .map(|(name, ask)| {
            json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "labels": {"gpuops.io/scenario": "1"}},
                "spec": {"containers": [{"name": "cuda", "image": "example.invalid/cuda:12",
                    "resources": {"requests": {"cpu": "1"}, "limits": {&ask.resource: ask.count.to_string()}}}]}})
        })
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let start = Instant::now();
    let start_unix = unix_now();
    cluster.apply(&list)?;

    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    let mut instances: BTreeMap<String, (Duration, Instance)> = BTreeMap::new();
    let mut all_at: Option<Duration> = None;
    let (mut first_node, mut first_gpus) = (None, None);
    let before: Vec<String> = nodes_now(cluster)?
        .iter()
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let mut seen: BTreeMap<String, NodeSeen> = BTreeMap::new();
    loop {
        let now = start.elapsed();
        let now_unix = unix_now();
        for node in nodes_now(cluster)? {
            let Some(name) = node["metadata"]["name"].as_str().map(str::to_string) else {
                continue;
            };
            if before.contains(&name) {
                continue;
            }
            first_node.get_or_insert(now);
            let gpus = has_gpus(&node);
            if gpus {
                first_gpus.get_or_insert(now);
            }
            let s = seen.entry(name).or_default();
            let tainted = has_taint(&node, STARTUP_TAINT);
            s.tainted |= tainted;
            if gpus {
                s.gpus_polled.get_or_insert(now_unix);
            }
            if s.tainted && !tainted {
                s.untainted_polled.get_or_insert(now_unix);
            }
            s.node = node;
        }
        for i in autoscaler.instances()? {
            instances
                .entry(i.name.clone())
                .and_modify(|(_, known)| {
                    // A NodeClaim gets its instance type (so its GPUs) and its node after it
                    // is first seen: counted as 0 GPUs, (b) once came out at 0 GPU-hours.
                    if known.gpus == 0 {
                        known.gpus = i.gpus;
                    }
                    if known.node.is_none() {
                        known.node.clone_from(&i.node);
                    }
                })
                .or_insert((now, i));
        }
        let pods = cluster.get_json(&["pods", "-n", namespace, "-l", "gpuops.io/scenario=1"])?;
        for p in pods["items"].as_array().into_iter().flatten() {
            if p["status"]["phase"] == "Running"
                && let Some(name) = p["metadata"]["name"].as_str()
            {
                running.entry(name.to_string()).or_insert(now);
            }
        }
        if all_at.is_none() && running.len() == names.len() {
            all_at = Some(now);
        }
        match all_at {
            Some(at) if now >= at + settle => break,
            None if now >= timeout => break,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let end = all_at.unwrap_or_else(|| start.elapsed());
    let gpu_hours_bought = instances
        .values()
        .filter(|(seen, _)| *seen <= end)
        .map(|(seen, i)| (end - *seen).as_secs_f64() * f64::from(i.gpus) / 3600.0)
        .sum();
    let time_to_capacity: Vec<Option<Duration>> =
        names.iter().map(|n| running.get(n).copied()).collect();

    // The stages, from the objects as they ended up (kubectl leaves managedFields out unless
    // asked; they hold the only time a GPU or taint change has).
    let last = cluster.get_json(&["nodes", "--show-managed-fields"])?;
    for node in last["items"].as_array().into_iter().flatten() {
        if let Some(s) = node["metadata"]["name"]
            .as_str()
            .and_then(|n| seen.get_mut(n))
        {
            s.node = node.clone();
        }
    }
    let pods = cluster.get_json(&["pods", "-n", namespace, "-l", "gpuops.io/scenario=1"])?;
    let events = cluster.get_json(&["events", "-n", namespace])?;
    let events: Vec<Value> = events["items"].as_array().cloned().unwrap_or_default();
    let instance_list: Vec<Instance> = instances.into_values().map(|(_, i)| i).collect();
    let running_unix: BTreeMap<String, f64> = running
        .iter()
        .map(|(n, d)| (n.clone(), start_unix + d.as_secs_f64()))
        .collect();
    let pod_stages = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| pod_stages(p, &events, &instance_list, &seen, &running_unix))
        .collect();
    let instance_stages = instance_list
        .iter()
        .map(|i| instance_stages(i, &seen))
        .collect();
    Ok(Outcome {
        scenario: scenario.name.clone(),
        autoscaler: autoscaler.name(),
        pods: names.len(),
        all_running: all_at.is_some(),
        launched: instance_list.len(),
        min_instances: scenario.min_instances(),
        time_to_capacity,
        gpu_hours_bought,
        first_node,
        first_gpus,
        pod_stages,
        instance_stages,
    })
}

/// A Node as the measuring loop last saw it, and what only the loop could see: when its GPUs
/// and the loss of its startup taint were first observed.
#[derive(Debug, Clone, Default)]
pub struct NodeSeen {
    pub node: Value,
    pub tainted: bool,
    pub gpus_polled: Option<f64>,
    pub untainted_polled: Option<f64>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn nodes_now(cluster: &Cluster) -> Result<Vec<Value>, BedError> {
    let nodes = cluster.get_json(&["nodes"])?;
    Ok(nodes["items"].as_array().cloned().unwrap_or_default())
}

/// Whether any GPU device resource (`nvidia.com/gpu`, `nvidia.com/mig-*`, `*.shared`, ...) is in
/// the node's allocatable.
fn has_gpus(node: &Value) -> bool {
    node["status"]["allocatable"].as_object().is_some_and(|a| {
        a.iter()
            .any(|(k, v)| is_device(k) && v.as_str().is_some_and(|g| g != "0"))
    })
}

fn is_device(resource: &str) -> bool {
    resource.starts_with("nvidia.com/")
}

fn has_taint(node: &Value, key: &str) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"].as_str() == Some(key)))
}

fn time_of(v: &Value) -> Option<f64> {
    v.as_str().and_then(parse_rfc3339)
}

fn condition_time(object: &Value, kind: &str) -> Option<f64> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["status"] == "True")
        .and_then(|c| time_of(&c["lastTransitionTime"]))
}

/// The time of the last write by `manager` (a prefix) of `field` under `status.allocatable` or
/// of `spec.taints`: the only timestamps an apiserver keeps for a field, in managedFields.
fn managed_time(node: &Value, manager: &str, subresource: Option<&str>) -> Option<f64> {
    node["metadata"]["managedFields"]
        .as_array()?
        .iter()
        .filter(|e| {
            e["manager"]
                .as_str()
                .is_some_and(|m| m.starts_with(manager))
                && e["subresource"].as_str() == subresource
        })
        .filter(|e| match subresource {
            Some(_) => e["fieldsV1"]["f:status"]["f:allocatable"]
                .as_object()
                .is_some_and(|a| {
                    a.keys()
                        .any(|k| k.strip_prefix("f:").is_some_and(is_device))
                }),
            None => !e["fieldsV1"]["f:spec"]["f:taints"].is_null(),
        })
        .filter_map(|e| time_of(&e["time"]))
        .reduce(f64::max)
}

/// Node registered, GPUs in allocatable and startup taint gone of one node: registration from
/// its creationTimestamp; the GPUs and the taint from the managedFields time of the test bed's
/// kubectl patch that made them so (the device-lag loops write nothing else with kubectl) and
/// the annotation the loops leave with the taint's removal, else when the measuring loop first
/// saw them.
fn node_stages(seen: &NodeSeen, at: &mut [Option<f64>; STAGES.len()]) {
    let node = &seen.node;
    at[REGISTERED] = time_of(&node["metadata"]["creationTimestamp"]);
    if has_gpus(node) {
        at[GPUS] = managed_time(node, "kubectl", Some("status")).or(seen.gpus_polled);
    }
    if seen.tainted && !has_taint(node, STARTUP_TAINT) {
        at[UNTAINTED] = time_of(&node["metadata"]["annotations"][TAINT_REMOVED_AT])
            .or_else(|| managed_time(node, "kubectl-patch", None))
            .or(seen.untainted_polled);
    }
}

/// The stages of one instance: created, its node registered, GPUs, startup taint gone.
fn instance_stages(instance: &Instance, nodes: &BTreeMap<String, NodeSeen>) -> Stages {
    let mut at = [None; STAGES.len()];
    at[INSTANCE] = instance.created.as_deref().and_then(parse_rfc3339);
    if let Some(seen) = instance.node.as_ref().and_then(|n| nodes.get(n)) {
        node_stages(seen, &mut at);
    }
    Stages {
        name: instance.name.clone(),
        instance: Some(instance.name.clone()),
        at,
    }
}

/// Event reasons that say an autoscaler has decided what a pending pod gets: gpuops's
/// (`TriggeredScaleUp`, `WaitingForNode` for a node already on its way) and Karpenter's
/// (`Nominated`, to a NodeClaim).
const DECIDED_REASONS: [&str; 3] = ["TriggeredScaleUp", "WaitingForNode", "Nominated"];

/// The stages of one pod. Decided: its first deciding event (eventTime has microseconds;
/// Karpenter's core events only firstTimestamp, seconds), else its instance's creation. Bound:
/// the PodScheduled condition; running: the Ready condition, else when the loop saw Running.
fn pod_stages(
    pod: &Value,
    events: &[Value],
    instances: &[Instance],
    nodes: &BTreeMap<String, NodeSeen>,
    running_polled: &BTreeMap<String, f64>,
) -> Stages {
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut at = [None; STAGES.len()];
    at[0] = time_of(&pod["metadata"]["creationTimestamp"]);
    let node = pod["spec"]["nodeName"].as_str();
    let instance = node.and_then(|n| instances.iter().find(|i| i.node.as_deref() == Some(n)));
    if let Some(i) = instance {
        let s = instance_stages(i, nodes);
        at[INSTANCE..=UNTAINTED].copy_from_slice(&s.at[INSTANCE..=UNTAINTED]);
    }
    at[DECIDED] = events
        .iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == "Pod"
                && e["involvedObject"]["name"].as_str() == Some(name.as_str())
                && e["reason"]
                    .as_str()
                    .is_some_and(|r| DECIDED_REASONS.contains(&r))
        })
        .filter_map(|e| {
            time_of(&e["eventTime"])
                .or_else(|| time_of(&e["firstTimestamp"]))
                .or_else(|| time_of(&e["metadata"]["creationTimestamp"]))
        })
        .reduce(f64::min)
        .or(at[INSTANCE]);
    at[BOUND] = condition_time(pod, "PodScheduled");
    at[RUNNING] = condition_time(pod, "Ready").or_else(|| running_polled.get(&name).copied());
    Stages {
        name,
        instance: instance.map(|i| i.name.clone()),
        at,
    }
}

fn p50_max(mut xs: Vec<f64>) -> Option<(f64, f64)> {
    xs.sort_by(f64::total_cmp);
    Some((*xs.get(xs.len() / 2)?, *xs.last()?))
}

/// Per stage and side, p50 / max of the seconds from the pod's creation to the stage, and of
/// the seconds spent in it (from the latest earlier stage the pod went through). Timestamps
/// are the objects' own, whole seconds, so each figure is good to about 1 s.
pub fn stage_table(outcomes: &[&Outcome]) -> String {
    let mut out = String::new();
    out.push_str("| stage |");
    for o in outcomes {
        out.push_str(&format!(
            " {}: since pod created p50 / max (s) | in stage p50 / max (s) |",
            o.autoscaler
        ));
    }
    out.push_str("\n|---|");
    for _ in outcomes {
        out.push_str("---|---|");
    }
    for (k, stage) in STAGES.iter().enumerate().skip(1) {
        out.push_str(&format!("\n| {stage} |"));
        for o in outcomes {
            let (mut since, mut step) = (Vec::new(), Vec::new());
            for s in &o.pod_stages {
                let (Some(created), Some(t)) = (s.at[0], s.at[k]) else {
                    continue;
                };
                since.push(t - created);
                if let Some(prev) = s.at[..k].iter().rev().flatten().next() {
                    step.push(t - prev);
                }
            }
            let cell = |xs: Vec<f64>| {
                p50_max(xs).map_or("-".to_string(), |(p, m)| format!("{p:.1} / {m:.1}"))
            };
            out.push_str(&format!(" {} | {} |", cell(since), cell(step)));
        }
    }
    out
}

/// Every instance's stages, seconds after the first pod was created.
pub fn instance_lines(outcome: &Outcome) -> Vec<String> {
    let zero = outcome
        .pod_stages
        .iter()
        .filter_map(|s| s.at[0])
        .reduce(f64::min)
        .unwrap_or(0.0);
    let fmt = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{:.1}", t - zero));
    outcome
        .instance_stages
        .iter()
        .map(|s| {
            format!(
                "{} / {}: instance {}: created {}, node {}, GPUs {}, taint gone {}",
                outcome.scenario,
                outcome.autoscaler,
                s.name,
                fmt(s.at[INSTANCE]),
                fmt(s.at[REGISTERED]),
                fmt(s.at[GPUS]),
                fmt(s.at[UNTAINTED]),
            )
        })
        .chain(outcome.pod_stages.iter().map(|s| {
            format!(
                "{} / {}: pod {} on {}: {}",
                outcome.scenario,
                outcome.autoscaler,
                s.name,
                s.instance.as_deref().unwrap_or("-"),
                s.at.iter().map(|t| fmt(*t)).collect::<Vec<_>>().join(" ")
            )
        }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_instances_meet_the_lower_bound() {
        for s in [Scenario::scale_from_zero(), Scenario::burst()] {
            let total: u32 = s.pods.iter().map(|a| a.count).sum();
            let lower = total.div_ceil(8) as usize;
            assert_eq!(s.min_instances(), lower, "{}", s.name);
        }
        assert_eq!(Scenario::burst().pods.len(), 20);
        assert_eq!(Scenario::burst().min_instances(), 7);
        assert_eq!(Scenario::scale_from_zero().min_instances(), 1);
        let odd = Scenario {
            name: "x".into(),
            pods: vec![Ask::new(GPU, 5); 3],
            offers: Offer::h100_whole(),
        };
        assert_eq!(
            odd.min_instances(),
            3,
            "no two 5-GPU pods share an 8-GPU node"
        );
    }

    #[test]
    fn the_mixed_burst_needs_two_nodes_of_each_kind() {
        let s = Scenario::mixed();
        assert_eq!(s.pods.len(), 20);
        let total = |r: &str| -> u32 {
            s.pods
                .iter()
                .filter(|a| a.resource == r)
                .map(|a| a.count)
                .sum()
        };
        // Each kind is more than one node holds and fits two.
        assert_eq!(total(GPU), 16);
        assert_eq!(total("nvidia.com/mig-1g.10gb"), 63);
        assert_eq!(total("nvidia.com/gpu.shared"), 22);
        assert_eq!(s.min_instances(), 6);
        // A resource nobody offers is left out rather than counted.
        let mut extra = s.clone();
        extra.pods.push(Ask::new("example.com/fpga", 1));
        assert_eq!(extra.min_instances(), 6);
        let profile = s.bin_packing_profile();
        assert!(profile.contains("type: MostAllocated"), "{profile}");
        for r in [GPU, "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"] {
            assert_eq!(
                profile.matches(&format!("- name: {r}\n")).count(),
                1,
                "{profile}"
            );
        }
    }

    #[test]
    fn fewest_bins_is_exact_where_first_fit_decreasing_is_not() {
        // First-fit decreasing fills 5,4 | 3,3,3 | 2 (3 bins of 10); 5,3,2 | 4,3,3 is 2.
        assert_eq!(fewest_bins(&[5, 4, 3, 3, 3, 2], 10), 2);
        assert_eq!(fewest_bins(&[6, 6, 6], 10), 3);
        assert_eq!(fewest_bins(&[], 8), 0);
        assert_eq!(
            fewest_bins(&[9], 8),
            1,
            "an item over the capacity gets its own bin"
        );
        assert_eq!(fewest_bins(&[1, 1], 0), 2);
    }

    #[test]
    fn rfc3339_times_parse_with_and_without_a_fraction() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0.0));
        assert_eq!(parse_rfc3339("2026-12-01T13:45:00Z"), Some(1_796_132_700.0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:01Z"), Some(951_868_801.0));
        let micro = parse_rfc3339("2026-12-01T13:45:00.250000Z").unwrap();
        assert!((micro - 1_796_132_700.25).abs() < 1e-6);
        for bad in [
            "",
            "2026-12-01T13:45:00",
            "2026-12-01 13:45:00Z",
            "2026-13-01T13:45:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T13:45:00.Z",
            "2026-12-01T13:45:00+01:00",
            "x026-12-01T13:45:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }

    fn t(secs: u64) -> String {
        format!("2026-12-01T00:00:{secs:02}Z")
    }

    #[test]
    fn a_pods_stages_come_from_its_objects_own_timestamps() {
        let pod = json!({"metadata": {"name": "gpu-pod-0", "creationTimestamp": t(0)},
            "spec": {"nodeName": "n1"},
            "status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": t(20)},
                {"type": "Ready", "status": "True", "lastTransitionTime": t(21)}]}});
        let events = vec![
            json!({"involvedObject": {"kind": "Pod", "name": "gpu-pod-0"}, "reason": "FailedScheduling",
                "firstTimestamp": t(0)}),
            json!({"involvedObject": {"kind": "Pod", "name": "gpu-pod-0"}, "reason": "TriggeredScaleUp",
                "eventTime": "2026-12-01T00:00:02.500000Z", "firstTimestamp": null}),
            json!({"involvedObject": {"kind": "Pod", "name": "gpu-pod-1"}, "reason": "TriggeredScaleUp",
                "eventTime": "2026-12-01T00:00:01.000000Z"}),
        ];
        let instances = vec![Instance {
            name: "m1".into(),
            gpus: 8,
            created: Some(t(3)),
            node: Some("n1".into()),
        }];
        let node = json!({"metadata": {"name": "n1", "creationTimestamp": t(9),
            "managedFields": [
                {"manager": "kubectl-create", "operation": "Update", "time": t(9),
                    "fieldsV1": {"f:spec": {"f:taints": {}}}},
                {"manager": "kwok", "operation": "Update", "subresource": "status", "time": t(30),
                    "fieldsV1": {"f:status": {"f:allocatable": {"f:nvidia.com/gpu": {}}}}},
                {"manager": "kubectl-patch", "operation": "Update", "subresource": "status", "time": t(15),
                    "fieldsV1": {"f:status": {"f:allocatable": {"f:nvidia.com/gpu": {}}}}},
                {"manager": "kubectl-patch", "operation": "Update", "time": t(16),
                    "fieldsV1": {"f:spec": {"f:taints": {}}}}]},
            "spec": {"taints": []},
            "status": {"allocatable": {GPU: "8"}}});
        let nodes = BTreeMap::from([(
            "n1".to_string(),
            NodeSeen {
                node,
                tainted: true,
                gpus_polled: Some(1e12),
                untainted_polled: Some(1e12),
            },
        )]);
        let s = pod_stages(&pod, &events, &instances, &nodes, &BTreeMap::new());
        let zero = parse_rfc3339(&t(0)).unwrap();
        let rel: Vec<Option<f64>> = s.at.iter().map(|x| x.map(|x| x - zero)).collect();
        assert_eq!(
            rel,
            vec![
                Some(0.0),
                Some(2.5),
                Some(3.0),
                Some(9.0),
                Some(15.0),
                Some(16.0),
                Some(20.0),
                Some(21.0)
            ]
        );
        assert_eq!(s.instance.as_deref(), Some("m1"));

        // No deciding event: the instance's creation stands in; no taint ever: no such stage;
        // no managedFields: what the loop saw.
        let mut plain = nodes.clone();
        let n = plain.get_mut("n1").unwrap();
        n.tainted = false;
        n.node["metadata"]["managedFields"] = json!([]);
        n.gpus_polled = Some(zero + 14.0);
        let s = pod_stages(&pod, &[], &instances, &plain, &BTreeMap::new());
        assert_eq!(s.at[DECIDED], Some(zero + 3.0));
        assert_eq!(s.at[GPUS], Some(zero + 14.0));
        assert_eq!(s.at[UNTAINTED], None);
        // The test bed's own note of the taint's removal wins over managedFields.
        let mut noted = nodes.clone();
        let n = noted.get_mut("n1").unwrap();
        n.node["metadata"]["annotations"] =
            json!({TAINT_REMOVED_AT: "2026-12-01T00:00:15.750000Z"});
        let s = pod_stages(&pod, &events, &instances, &noted, &BTreeMap::new());
        assert_eq!(s.at[UNTAINTED], Some(zero + 15.75));

        // A pod never bound has only its creation (and what the loop saw running: nothing).
        let pending = json!({"metadata": {"name": "gpu-pod-9", "creationTimestamp": t(0)},
            "spec": {}, "status": {"conditions": [
                {"type": "PodScheduled", "status": "False", "lastTransitionTime": t(0)}]}});
        let s = pod_stages(&pending, &events, &instances, &nodes, &BTreeMap::new());
        assert_eq!(s.at.iter().flatten().count(), 1);
        assert_eq!(s.instance, None);
    }

    #[test]
    fn the_stage_table_has_p50_and_max_per_stage_and_side() {
        let at = |xs: [Option<f64>; 8]| Stages {
            name: "p".into(),
            instance: None,
            at: xs,
        };
        let outcome = Outcome {
            scenario: "s".into(),
            autoscaler: "side".into(),
            pods: 2,
            all_running: true,
            launched: 1,
            min_instances: 1,
            time_to_capacity: vec![],
            gpu_hours_bought: 0.0,
            first_node: None,
            first_gpus: None,
            pod_stages: vec![
                at([
                    Some(0.0),
                    Some(1.0),
                    Some(2.0),
                    Some(7.0),
                    Some(17.0),
                    None,
                    Some(18.0),
                    Some(19.0),
                ]),
                at([
                    Some(0.0),
                    Some(3.0),
                    Some(4.0),
                    Some(9.0),
                    Some(19.0),
                    None,
                    Some(30.0),
                    Some(30.0),
                ]),
            ],
            instance_stages: vec![],
        };
        let table = stage_table(&[&outcome]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2 + STAGES.len() - 1, "{table}");
        assert!(lines[0].contains("side: since pod created"), "{table}");
        assert_eq!(lines[2], "| autoscaler decided | 3.0 / 3.0 | 3.0 / 3.0 |");
        assert_eq!(lines[6], "| startup taint gone | - | - |");
        // Bound: from the GPUs (the taint stage is skipped): 1 and 11.
        assert_eq!(lines[7], "| pod bound | 30.0 / 30.0 | 11.0 / 11.0 |");
    }
}
