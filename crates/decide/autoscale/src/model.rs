//! What the decision sees: pools, nodes, machines in flight, pending GPU pods and PDBs, as plain
//! values (no Kubernetes types, no clock), so the controller and a trace replay build the same
//! snapshot.

use gpuops_kubemodel::fit::{NodeConstraints, Taint, Toleration};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Milliseconds on the caller's clock (wall clock in the controller, simulated in a replay).
pub type Millis = u64;

/// Resource name of the pod count (a node's `maxPods`).
pub const PODS: &str = "pods";

/// Pods annotated with either of these (value `"true"`) are never evicted.
pub const DO_NOT_DISRUPT: [&str; 2] = ["karpenter.sh/do-not-disrupt", "gpuops.io/do-not-disrupt"];

/// Per-stage limits for a machine in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTimeouts {
    /// Machine created -> its Node registered.
    pub provision: Duration,
    /// Node registered -> Node Ready.
    pub registration: Duration,
    /// Node Ready -> every device the pool's nodes offer advertised (startup taint gone).
    pub devices: Duration,
}

impl Default for StageTimeouts {
    fn default() -> Self {
        // Cluster Autoscaler's max-node-provision-time is 15 minutes; the later stages are
        // shorter on real clusters (kubelet start, device plugin registration).
        Self {
            provision: Duration::from_secs(15 * 60),
            registration: Duration::from_secs(10 * 60),
            devices: Duration::from_secs(10 * 60),
        }
    }
}

/// What one new node of a pool offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeTemplate {
    /// Allocatable CPU (milli).
    pub cpu_milli: u64,
    /// Allocatable memory (MiB).
    pub memory_mib: u64,
    /// Physical GPUs offered as whole or shared GPUs (0 for a MIG pool: its GPUs are slices).
    pub gpus: u32,
    /// The resource whole or shared GPUs are advertised as (`nvidia.com/gpu` or `nvidia.com/gpu.shared`).
    pub gpu_resource: String,
    /// Replicas per GPU (1 without time-slicing).
    pub gpu_replicas: u32,
    /// `nvidia.com/gpu.product` of the node's GPUs (empty: unknown).
    pub gpu_product: String,
    /// Countable resources besides CPU, memory and whole/shared GPUs: `nvidia.com/mig-*`, `pods`.
    pub scalars: BTreeMap<String, u64>,
    /// Labels a new node comes up with (as the scheduler sees them once its devices are advertised).
    pub labels: BTreeMap<String, String>,
    /// Taints a new node keeps (startup taints are not listed: they go away).
    pub taints: Vec<Taint>,
}

/// One node pool (a MachineDeployment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// `namespace/name` of the MachineDeployment.
    pub name: String,
    pub min: u32,
    pub max: u32,
    /// `spec.replicas` as the API server has it now.
    pub replicas: u32,
    /// Price of one node-hour (any currency; only compared between pools).
    pub price_per_hour: f64,
    pub template: NodeTemplate,
    pub timeouts: StageTimeouts,
}

/// A ready node: registered, Ready, its devices advertised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    /// Pool (`namespace/name`) the node belongs to; `None` for nodes no pool manages.
    pub pool: Option<String>,
    /// Machine behind the node (`namespace/name`), when known.
    pub machine: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Cordoned.
    pub unschedulable: bool,
    /// Free CPU (milli) and memory (MiB): allocatable minus the requests of the node's pods.
    pub cpu_free_milli: u64,
    pub memory_free_mib: u64,
    /// Whole/shared GPUs: the resource they are advertised as, replicas per GPU, and each
    /// GPU's free milli (1000: unused).
    pub gpu_resource: String,
    pub gpu_replicas: u32,
    pub gpu_free: Vec<u16>,
    pub gpu_product: String,
    /// Free countable resources (`nvidia.com/mig-*`, `pods`).
    pub scalars_free: BTreeMap<String, u64>,
    /// Pods running on the node (DaemonSet and mirror pods left out: draining ignores them).
    pub pods: Vec<RunningPod>,
    /// Measured utilization (0..=100, DCGM_FI_DEV_GPU_UTIL) of the node's allocated GPUs, the
    /// highest of them; `None` when not measured.
    pub gpu_util: Option<f64>,
    /// True when the controller has started removing the node (cordoned by it).
    pub removing: bool,
}

/// A pod running on a node, as scale-down needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningPod {
    /// `namespace/name`.
    pub key: String,
    pub labels: BTreeMap<String, String>,
    /// Uses a GPU resource (whole, shared or MIG).
    pub gpu: bool,
    /// Annotated do-not-disrupt.
    pub do_not_disrupt: bool,
}

impl RunningPod {
    /// The pod's namespace.
    pub fn namespace(&self) -> &str {
        self.key.split_once('/').map_or("default", |(ns, _)| ns)
    }
}

/// Where a machine in flight is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Machine created, no Node yet.
    Provisioning,
    /// Node registered, not Ready.
    Registered,
    /// Node Ready, some device the pool offers not advertised yet (or the startup taint still on).
    Devices,
}

impl Stage {
    /// Lower-case name for status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Provisioning => "provisioning",
            Stage::Registered => "registered",
            Stage::Devices => "devices",
        }
    }

    /// This stage's limit.
    pub fn timeout(self, t: &StageTimeouts) -> Duration {
        match self {
            Stage::Provisioning => t.provision,
            Stage::Registered => t.registration,
            Stage::Devices => t.devices,
        }
    }
}

/// A machine launched but not yet a ready node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// `namespace/name` of the Machine.
    pub name: String,
    pub pool: String,
    pub node: Option<String>,
    pub stage: Stage,
    /// When the current stage began.
    pub stage_since: Millis,
    /// The infrastructure reported a failure (Machine phase `Failed`).
    pub failed: bool,
}

/// A pending pod asking for a GPU resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingPod {
    /// `namespace/name`.
    pub key: String,
    /// When it was created (or first seen pending).
    pub created: Millis,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Whole/shared GPU resource asked for (`nvidia.com/gpu` or `nvidia.com/gpu.shared`) and
    /// how many; empty resource with count 0 for pods asking only MIG slices.
    pub gpu_resource: String,
    pub gpu_count: u64,
    /// `gpuops.io/gpu-milli`, when given.
    pub gpu_milli: Option<u32>,
    /// Other countable resources (`nvidia.com/mig-1g.10gb: 2`); `pods: 1` is implied.
    pub scalars: BTreeMap<String, u64>,
    pub tolerations: Vec<Toleration>,
    pub constraints: NodeConstraints,
}

impl PendingPod {
    /// The kubemodel demand of the pod's whole/shared GPU request.
    pub fn ask(&self) -> gpuops_kubemodel::PodAsk {
        gpuops_kubemodel::PodAsk {
            cpu_milli: self.cpu_milli,
            memory_mib: self.memory_mib,
            replicas: self.gpu_count,
            milli: self.gpu_milli,
        }
    }
}

/// A PodDisruptionBudget as eviction sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pdb {
    /// `namespace/name`.
    pub key: String,
    pub namespace: String,
    /// `matchLabels` (expressions are folded in by the caller as far as they can be; a PDB whose
    /// selector cannot be evaluated should be given with `disruptions_allowed: 0` and an empty
    /// selector, which blocks every pod of its namespace).
    pub match_labels: BTreeMap<String, String>,
    /// `status.disruptionsAllowed`.
    pub disruptions_allowed: u32,
}

impl Pdb {
    /// Whether the budget covers this pod.
    pub fn covers(&self, pod: &RunningPod) -> bool {
        pod.namespace() == self.namespace
            && self
                .match_labels
                .iter()
                .all(|(k, v)| pod.labels.get(k) == Some(v))
    }
}

/// Everything one decision looks at.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub pools: Vec<Pool>,
    pub nodes: Vec<Node>,
    pub machines: Vec<Machine>,
    pub pending: Vec<PendingPod>,
    pub pdbs: Vec<Pdb>,
    /// Pools (`namespace/name`) skipped for invalid configuration, named in explanations.
    #[serde(default)]
    pub skipped_pools: Vec<String>,
}

/// Knobs of the decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// A node stays unneeded (no GPU pod, or its GPUs idle by measure) this long before removal.
    pub scale_down_idle: Duration,
    /// Utilization (percent) at or below which an allocated GPU counts as idle.
    pub idle_util_pct: f64,
    /// Scale up once no new pending pod appeared for this long ...
    pub batch_idle: Duration,
    /// ... or once the oldest unserved pending pod waited this long.
    pub batch_max: Duration,
    /// Back-off after a pool's first timed-out node; doubles per failure up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Most nodes removed per decision.
    pub max_scale_down_per_decision: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            scale_down_idle: Duration::from_secs(10 * 60),
            idle_util_pct: 0.0,
            batch_idle: Duration::from_secs(1),
            batch_max: Duration::from_secs(10),
            backoff_base: Duration::from_secs(5 * 60),
            backoff_max: Duration::from_secs(30 * 60),
            max_scale_down_per_decision: 10,
        }
    }
}

/// What the decision remembers between calls. Only soft state: what is in flight is read from the
/// snapshot, so losing it never causes a second scale-up for one need. The controller still
/// carries it across a restart or failover in its status ConfigMap ([`crate::memory`]): lost, a
/// scale-down's idle time would start over and a failing pool's back-off end at once.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Node -> since when it has been unneeded.
    pub unneeded_since: BTreeMap<String, Millis>,
    /// Pool -> back-off.
    pub backoff: BTreeMap<String, Backoff>,
    /// Pod -> the last explanation emitted, so an unchanged one is not repeated as an event.
    pub explained: BTreeMap<String, String>,
    /// Machines already counted as timed out (so one machine backs its pool off once).
    #[serde(default)]
    pub timed_out: BTreeMap<String, Millis>,
}

impl State {
    /// Moves every remembered instant by `delta_ms`: after the caller's wall clock jumped, an
    /// idle timer or a back-off keeps the time it had left instead of expiring at once (a jump
    /// forward) or an hour late (a jump back).
    pub fn shift(&mut self, delta_ms: i64) {
        for t in self.unneeded_since.values_mut() {
            *t = shift_ms(*t, delta_ms);
        }
        for t in self.timed_out.values_mut() {
            *t = shift_ms(*t, delta_ms);
        }
        for b in self.backoff.values_mut() {
            b.until = shift_ms(b.until, delta_ms);
        }
    }
}

pub(crate) fn shift_ms(t: Millis, delta_ms: i64) -> Millis {
    t.saturating_add_signed(delta_ms)
}

/// A pool's back-off after timed-out nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub failures: u32,
    pub until: Millis,
}
