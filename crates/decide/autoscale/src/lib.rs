//! GPU node-pool autoscaling decisions over Cluster API pools, pure: no client, no clock.
//!
//! [`pool::parse_pool`] reads a MachineDeployment's annotations (Cluster Autoscaler's clusterapi
//! ones plus `gpuops.io/*`) into a [`Pool`]; [`decide`] takes a [`Snapshot`] (pools, ready
//! nodes, machines in flight with their stage, pending GPU pods, PDBs), the [`State`] kept
//! between calls and the time, and returns a [`Decision`]: scale-ups, nodes to remove, machines
//! that timed out, the plan of every pending pod and the explanations for events. The
//! controller builds the snapshot from the API server ([`snapshot`], with the `k8s` feature);
//! a trace replay builds it in simulated time. See `docs/autoscaling.md`.
//!
//! Also the controller's other pure parts: the MIG demand reconciler's view of the Nodes and
//! what it owes booting nodes ([`mig_owed`], [`mig_plan`], `mig_view` with `k8s`), the status
//! it publishes ([`status`]), what it remembers across a restart ([`memory`]), and Kubernetes
//! times against its clock ([`time`]).
#![forbid(unsafe_code)]

mod decide;
pub mod decision;
pub mod error;
pub mod memory;
pub mod mig_demand;
pub mod mig_owed;
pub mod mig_plan;
#[cfg(feature = "k8s")]
pub mod mig_view;
pub mod model;
pub mod pool;
mod scaledown;
#[cfg(feature = "k8s")]
pub mod snapshot;
pub mod status;
pub mod time;

pub use decision::{Decision, Event, InFlight, Plan, PodPlan, Removal, ScaleUp, Target, TimedOut};
pub use error::AutoscaleError;
pub use mig_demand::{MigConfig, MigDecision, MigMemory, decide_mig};
pub use model::{
    Backoff, Config, DO_NOT_DISRUPT, Machine, Millis, Node, NodeTemplate, PODS, Pdb, PendingPod,
    Pool, RunningPod, Snapshot, Stage, StageTimeouts, State,
};

/// One decision. Level-triggered: the same snapshot gives the same actions, and actions already
/// taken show up in the snapshot (raised replicas as nodes in flight), so calling it again after
/// acting never buys twice for the same need.
pub fn decide(snapshot: &Snapshot, state: &mut State, now: Millis, config: &Config) -> Decision {
    let mut out = Decision::default();
    let needed = decide::scale_up(snapshot, state, now, config, &mut out);
    scaledown::scale_down(snapshot, state, now, config, &needed, &mut out);
    out
}

/// Why an empty node of `template` cannot run `pod` (`None`: it can), for tests and replays
/// that need the same feasibility rule the decision uses.
pub fn template_misfit(template: &NodeTemplate, pod: &PendingPod) -> Option<String> {
    decide::template_misfit(template, pod)
}

#[cfg(test)]
mod tests;
