//! The doctor's input: plain Kubernetes objects, metric samples and log excerpts, taken at `now`.

use k8s_openapi::api::core::v1::{Event, Node, Pod, PodTemplateSpec, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

/// One metric sample (`name{labels} value`), from an agent's exposition or a Prometheus query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// The node: DCGM's `Hostname` (renamed `hostname` in dcgm-exporter 4.6), else Prometheus's
    /// `node` or `instance` target label.
    pub fn host(&self) -> Option<&str> {
        ["Hostname", "hostname", "node", "kubernetes_node"]
            .iter()
            .find_map(|k| self.label(k))
    }
}

/// The last lines of one container's log (the current or the previous instance).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogExcerpt {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// From the previous (crashed) instance of the container.
    pub previous: bool,
    pub text: String,
}

/// A controller a Warning event names (ReplicaSet, Job, StatefulSet, DaemonSet) or the Deployment
/// owning such a ReplicaSet, reduced to what the fixes are computed from: how many pods it wants
/// and the template it creates them from. Read one by one, only for the objects events name.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Controller {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// Pods it wants (`spec.replicas`, a Job's `spec.parallelism`); `None` when it does not say.
    pub replicas: Option<i64>,
    /// Pods it has now (`status.replicas`, a Job's `status.active`).
    pub current: Option<i64>,
    /// The controller owning it (a ReplicaSet's Deployment): kind and name.
    pub owner: Option<(String, String)>,
    pub template: Option<PodTemplateSpec>,
}

/// What Dynamic Resource Allocation (`resource.k8s.io/v1`) objects say: the claims of the pods
/// read, every ResourceSlice and DeviceClass. Read apart because an older cluster has no such API
/// and a doctor's token may not list them: then `unread` says why, and the claim rules tell only
/// what the scheduler and the kubelet wrote.
#[derive(Debug, Clone, Default)]
pub struct Dra {
    pub claims: Vec<ResourceClaim>,
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    /// Why the objects above could not be read (API missing, forbidden); `None` when they were.
    pub unread: Option<String>,
}

/// Everything the rules look at. Build it with one list per kind; the rules never call out.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub events: Vec<Event>,
    pub metrics: Vec<Sample>,
    /// The window `DCGM_FI_DEV_GPU_UTIL` samples were averaged over (`None`: instant values, as an
    /// agent's exposition gives).
    pub utilization_window: Option<Duration>,
    pub logs: Vec<LogExcerpt>,
    /// ResourceQuotas (all, or those of the namespaces read).
    pub quotas: Vec<ResourceQuota>,
    /// Controllers named by Warning events, and their owners (see [`Controller`]).
    pub controllers: Vec<Controller>,
    /// ResourceClaims, ResourceSlices and DeviceClasses (see [`Dra`]).
    pub dra: Dra,
    /// `false` when only some pods were read (`--node`): rules that must see every pod (who
    /// tolerates a taint) then say nothing rather than guess.
    pub all_pods: bool,
    pub now: Timestamp,
}

impl Snapshot {
    /// An empty cluster at `now`.
    pub fn at(now: Timestamp) -> Snapshot {
        Snapshot {
            nodes: Vec::new(),
            pods: Vec::new(),
            events: Vec::new(),
            metrics: Vec::new(),
            utilization_window: None,
            logs: Vec::new(),
            quotas: Vec::new(),
            controllers: Vec::new(),
            dra: Dra::default(),
            all_pods: true,
            now,
        }
    }
}
