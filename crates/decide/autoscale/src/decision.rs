//! What a decision says: the actions, the plan for each pending pod, and the explanations.

use crate::model::Stage;
use serde::{Deserialize, Serialize};

/// The outcome of one [`crate::decide`] call. Actions are idempotent against the cluster: the
/// controller applies them, the next snapshot shows them as in flight.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub scale_ups: Vec<ScaleUp>,
    pub removals: Vec<Removal>,
    pub timed_out: Vec<TimedOut>,
    pub plans: Vec<PodPlan>,
    /// Machines in flight per pool and stage, plus replicas not yet backed by a Machine.
    pub in_flight: Vec<InFlight>,
    /// Explanations that changed since the last call (the controller emits them as events).
    pub events: Vec<Event>,
    /// While pods wait for the scale-up batch window: how long until it closes (the idle or
    /// the maximum period runs out), so the caller can decide again exactly then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_closes_in: Option<std::time::Duration>,
}

impl Decision {
    /// True when the decision changes nothing in the cluster.
    pub fn is_noop(&self) -> bool {
        self.scale_ups.is_empty() && self.removals.is_empty() && self.timed_out.is_empty()
    }
}

/// Raise a pool's replicas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleUp {
    pub pool: String,
    pub from: u32,
    pub to: u32,
    /// Pods planned onto the new nodes.
    pub pods: Vec<String>,
    /// The pods that made the decision open each new node (one per node): none of them fits
    /// what is free or in flight, and this pool was the cheapest feasible one with room.
    pub triggered_by: Vec<String>,
    pub message: String,
}

/// Drain and remove one node of a pool (cordon, evict, mark its Machine, replicas - 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removal {
    pub pool: String,
    pub node: String,
    pub machine: Option<String>,
    /// Pods to evict (GPU and other non-DaemonSet pods).
    pub evict: Vec<String>,
    pub message: String,
}

/// A machine that overran its stage's limit: delete it (its replica goes with it) and back off
/// the pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimedOut {
    pub pool: String,
    pub machine: String,
    pub stage: Stage,
    pub message: String,
}

/// Machines of one pool in one stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlight {
    pub pool: String,
    /// `None`: replicas requested but no Machine created yet.
    pub stage: Option<Stage>,
    pub count: u32,
}

/// Where a pending pod is expected to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Plan {
    /// Free capacity on a ready node (the scheduler should bind it; nothing to buy).
    Existing { node: String },
    /// A node already launched (`slot`: the Machine, or `pool#n` for a replica without one yet).
    InFlight { pool: String, slot: String },
    /// A node this decision buys.
    NewNode { pool: String },
    /// Would need a new node, but the batch window is still open.
    Waiting { pool: String },
    /// No pool can run it.
    Unschedulable { reasons: Vec<String> },
}

/// The plan of one pending pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPlan {
    pub pod: String,
    pub plan: Plan,
    pub message: String,
}

/// What an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "kebab-case")]
pub enum Target {
    Pod(String),
    Pool(String),
    Node(String),
}

/// One explanation for the event recorder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub target: Target,
    /// CamelCase reason (`TriggeredScaleUp`, `NotTriggerScaleUp`, ...).
    pub reason: String,
    pub message: String,
    pub warning: bool,
}
