//! The autoscaler's snapshot as claim demand's inputs, and the plan back as scale-ups and
//! events: pools with a GPU product become the new node they would buy, replicas in flight
//! become nodes that will publish those devices (less what claims already hold on them).

use crate::claim::{Classes, NodeDevices};
use crate::node::{self, NewNode};
use crate::plan::{Existing, ExistingKind, Outcome, Plan, PodClaims, PoolShape, plan};
use gpuops_autoscale::model::Snapshot;
use gpuops_autoscale::{Event, InFlight, ScaleUp, Target};
use std::collections::{BTreeMap, HashSet};

/// The catalog model a pool's `nvidia.com/gpu.product` (or catalog key) names, as the pool
/// parser reads it.
pub fn model_for_product(product: &str) -> Option<&'static gpuops_catalog::GpuModel> {
    gpuops_catalog::models()
        .iter()
        .find(|m| m.nvml_name.replace(' ', "-").eq_ignore_ascii_case(product))
        .or_else(|| gpuops_catalog::lookup(product).ok())
}

/// What one pass decides for pods with claims.
#[derive(Debug, Clone, Default)]
pub struct ClaimDecision {
    pub plan: Plan,
    /// New or raised scale-ups; merge them into the pass's with [`merge`].
    pub scale_ups: Vec<ScaleUp>,
    pub events: Vec<Event>,
}

/// Decides for `pods`, after `already` (this pass's other scale-ups, whose nodes are not
/// counted as room) and with `in_flight` (the decision's machines and replicas in flight).
/// `allocated` is the devices claims hold, by node (the driver's pool name).
pub fn decide(
    snap: &Snapshot,
    in_flight: &[InFlight],
    already: &[ScaleUp],
    pods: &[PodClaims],
    classes: &Classes,
    allocated: &BTreeMap<String, Vec<String>>,
) -> ClaimDecision {
    let mut shapes = Vec::new();
    let mut existing = Vec::new();
    for p in &snap.pools {
        let Some(model) = model_for_product(&p.template.gpu_product) else {
            continue;
        };
        if p.template.gpus == 0 {
            continue;
        }
        let devices = node::devices(&NewNode {
            model,
            gpus: p.template.gpus,
            dynamic_mig: false,
        });
        // Every node of the pool starts from this one: its devices' CEL values are built once
        // per pool rather than once per node (thousands of nodes, eight devices each).
        let fresh = NodeDevices::new(devices.clone());
        let planned: u32 = already
            .iter()
            .filter(|s| s.pool == p.name)
            .map(|s| s.to.saturating_sub(s.from))
            .sum();
        shapes.push(PoolShape {
            name: p.name.clone(),
            price_per_hour: p.price_per_hour,
            devices: devices.clone(),
            room: p.max.saturating_sub(p.replicas).saturating_sub(planned),
        });
        // Machines with a node: that node's claims are counted on it; the rest are anonymous.
        let mut with_node = 0u32;
        for m in snap
            .machines
            .iter()
            .filter(|m| m.pool == p.name && !m.failed)
        {
            let Some(n) = &m.node else { continue };
            with_node += 1;
            let mut d = fresh.clone();
            if let Some(held) = allocated.get(n) {
                d.mark_used(held.iter().map(String::as_str));
            }
            existing.push(Existing {
                node: n.clone(),
                devices: d,
                kind: ExistingKind::InFlight,
            });
        }
        // Registered nodes of the pool too: a node whose devices are free is the scheduler's to
        // use once its slices are published or it retries the pod, and buying in that gap
        // bought a second node on the test bed. Its modelled devices, less what claims hold.
        // A set: a list here made 5,000 nodes a quadratic scan over every node before them.
        let counted: HashSet<String> = existing.iter().map(|e| e.node.clone()).collect();
        for n in snap.nodes.iter().filter(|n| {
            n.pool.as_deref() == Some(p.name.as_str()) && !n.removing && !counted.contains(&n.name)
        }) {
            let mut d = fresh.clone();
            if let Some(held) = allocated.get(&n.name) {
                d.mark_used(held.iter().map(String::as_str));
            }
            existing.push(Existing {
                node: n.name.clone(),
                devices: d,
                kind: ExistingKind::InFlight,
            });
        }
        let flying: u32 = in_flight
            .iter()
            .filter(|f| f.pool == p.name)
            .map(|f| f.count)
            .sum::<u32>()
            + planned;
        for i in 0..flying.saturating_sub(with_node) {
            existing.push(Existing {
                node: format!("{}/in-flight-{i}", p.name),
                devices: fresh.clone(),
                kind: ExistingKind::InFlight,
            });
        }
    }
    let plan = plan(pods, classes, existing, &shapes);
    let mut out = ClaimDecision::default();
    for (pool, n) in &plan.buys {
        let Some(p) = snap.pools.iter().find(|p| &p.name == pool) else {
            continue;
        };
        let pods: Vec<String> = plan
            .outcomes
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Buy { pool: b, .. } if b == pool))
            .map(|(k, _)| k.clone())
            .collect();
        out.scale_ups.push(ScaleUp {
            pool: pool.clone(),
            from: p.replicas,
            to: p.replicas + n,
            triggered_by: pods.clone(),
            message: format!(
                "scale-up {pool} by {n} for ResourceClaims no node can allocate: {}",
                pods.join(", ")
            ),
            pods,
        });
    }
    for (pod, o) in &plan.outcomes {
        let (reason, message, warning) = match o {
            Outcome::Buy { pool, .. } => (
                "TriggeredScaleUp",
                format!("pod's ResourceClaims fit a new node of {pool}"),
                false,
            ),
            Outcome::NoPool { tried } => (
                "NotTriggerScaleUp",
                format!(
                    "no pool's new node satisfies every ResourceClaim of this pod (tried: {})",
                    if tried.is_empty() {
                        "none".to_string()
                    } else {
                        tried.join(", ")
                    }
                ),
                true,
            ),
            Outcome::Error(e) => ("NotTriggerScaleUp", e.to_string(), true),
            Outcome::InFlight { .. } | Outcome::Repartition { .. } => continue,
        };
        out.events.push(Event {
            target: Target::Pod(pod.clone()),
            reason: reason.into(),
            message,
            warning,
        });
    }
    out.plan = plan;
    out
}

/// Adds claim scale-ups to the pass's: a pool already raised is raised further, so one patch
/// carries both (two patches of one pool in a pass would conflict).
pub fn merge(into: &mut Vec<ScaleUp>, new: Vec<ScaleUp>) {
    for su in new {
        match into.iter_mut().find(|s| s.pool == su.pool) {
            Some(s) => {
                s.to += su.to - su.from;
                s.pods.extend(su.pods);
                s.triggered_by.extend(su.triggered_by);
                s.message = format!("{}; {}", s.message, su.message);
            }
            None => into.push(su),
        }
    }
}
