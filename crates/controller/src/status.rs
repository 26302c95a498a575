//! The status the controller publishes in a ConfigMap (like Cluster Autoscaler's
//! `cluster-autoscaler-status`), and its table rendering for `gpuops autoscaler status`.

use gpuops_autoscale::{Decision, Millis, Plan, Snapshot};
use serde::{Deserialize, Serialize};

/// Name of the status ConfigMap (in the controller's namespace).
pub const CONFIGMAP: &str = "gpuops-autoscaler-status";
/// Key of the JSON document inside it.
pub const KEY: &str = "status.json";
/// How many past decisions the status keeps.
pub const HISTORY: usize = 20;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// When the last decision ran (RFC 3339).
    pub time: String,
    /// Identity of the replica that wrote it.
    pub leader: String,
    pub pools: Vec<PoolStatus>,
    /// MachineDeployments skipped for invalid annotations, with the reason.
    pub errors: Vec<String>,
    pub in_flight: Vec<InFlightStatus>,
    pub pending: Vec<PendingStatus>,
    /// The most recent actions, newest first.
    pub decisions: Vec<String>,
    /// MIG changes under way or failed (the MIG demand reconciler's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_changes: Vec<crate::mig::MigChangeStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub name: String,
    pub min: u32,
    pub max: u32,
    pub replicas: u32,
    pub ready: u32,
    pub price_per_hour: f64,
    /// e.g. `8x nvidia.com/gpu`, `56x nvidia.com/mig-1g.10gb`.
    pub offers: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InFlightStatus {
    pub pool: String,
    /// `provisioning`, `registered`, `devices`, or `requested` (replica without a Machine yet).
    pub stage: String,
    pub count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingStatus {
    pub pod: String,
    /// `existing`, `in-flight`, `new-node`, `waiting`, `unschedulable`.
    pub plan: String,
    pub message: String,
}

fn offers(t: &gpuops_autoscale::NodeTemplate) -> String {
    let mut parts = Vec::new();
    if t.gpus > 0 {
        parts.push(format!(
            "{}x {}",
            u64::from(t.gpus) * u64::from(t.gpu_replicas.max(1)),
            t.gpu_resource
        ));
    }
    for (k, v) in &t.scalars {
        if k.starts_with("nvidia.com/mig-") {
            parts.push(format!("{v}x {k}"));
        }
    }
    if parts.is_empty() {
        "no GPU".into()
    } else {
        parts.join(", ")
    }
}

/// The status after a decision; `previous` supplies the decision history.
pub fn build(
    snap: &Snapshot,
    errors: &[String],
    d: &Decision,
    now: Millis,
    leader: &str,
    previous: Option<&Status>,
) -> Status {
    let pools = snap
        .pools
        .iter()
        .map(|p| PoolStatus {
            name: p.name.clone(),
            min: p.min,
            max: p.max,
            replicas: p.replicas,
            ready: u32::try_from(
                snap.nodes
                    .iter()
                    .filter(|n| n.pool.as_deref() == Some(&p.name))
                    .count(),
            )
            .unwrap_or(u32::MAX),
            price_per_hour: p.price_per_hour,
            offers: offers(&p.template),
        })
        .collect();
    let in_flight = d
        .in_flight
        .iter()
        .map(|f| InFlightStatus {
            pool: f.pool.clone(),
            stage: f.stage.map_or("requested", |s| s.as_str()).to_string(),
            count: f.count,
        })
        .collect();
    let pending = d
        .plans
        .iter()
        .map(|p| PendingStatus {
            pod: p.pod.clone(),
            plan: match p.plan {
                Plan::Existing { .. } => "existing",
                Plan::InFlight { .. } => "in-flight",
                Plan::NewNode { .. } => "new-node",
                Plan::Waiting { .. } => "waiting",
                Plan::Unschedulable { .. } => "unschedulable",
            }
            .to_string(),
            message: p.message.clone(),
        })
        .collect();
    let time = gpuops_kube::rfc3339(now / 1000);
    let mut decisions: Vec<String> = d
        .scale_ups
        .iter()
        .map(|s| s.message.clone())
        .chain(d.removals.iter().map(|r| r.message.clone()))
        .chain(d.timed_out.iter().map(|t| t.message.clone()))
        .map(|m| format!("{time} {m}"))
        .collect();
    if let Some(prev) = previous {
        decisions.extend(prev.decisions.iter().cloned());
    }
    decisions.truncate(HISTORY);
    Status {
        time,
        leader: leader.to_string(),
        pools,
        errors: errors.to_vec(),
        in_flight,
        pending,
        decisions,
        mig_changes: Vec::new(),
    }
}

/// Adds the MIG reconciler's pass: its pending pods, its changes in the history, and the
/// changes under way.
pub fn add_mig(s: &mut Status, pass: &crate::mig::MigPass) {
    let d = &pass.decision;
    let mut plans: Vec<(String, &str, String)> = Vec::new();
    for c in &d.changes {
        for p in &c.pods {
            plans.push((p.clone(), "mig-repartition", c.message.clone()));
        }
    }
    for su in &d.scale_ups {
        for p in &su.pods {
            plans.push((p.clone(), "new-node", su.message.clone()));
        }
    }
    for p in &d.served_by_free {
        plans.push((
            p.clone(),
            "existing",
            "a free MIG device exists; the scheduler binds it".into(),
        ));
    }
    for p in &d.waiting {
        plans.push((
            p.clone(),
            "waiting",
            "MIG demand batch still open, or a change under way".into(),
        ));
    }
    for (p, why) in &d.unserved {
        plans.push((p.clone(), "unschedulable", why.clone()));
    }
    s.pending
        .extend(plans.into_iter().map(|(pod, plan, message)| PendingStatus {
            pod,
            plan: plan.into(),
            message,
        }));
    let mut new: Vec<String> = d
        .changes
        .iter()
        .map(|c| c.message.clone())
        .chain(d.scale_ups.iter().map(|su| su.message.clone()))
        .map(|m| format!("{} {m}", s.time))
        .collect();
    new.append(&mut s.decisions);
    new.truncate(HISTORY);
    s.decisions = new;
    s.mig_changes = pass.status.clone();
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.iter().map(|h| (*h).to_string()).collect());
    for r in rows {
        out.push_str(&line(r.clone()));
    }
    out
}

/// The status as text tables: pools, nodes in flight, pending GPU pods, last decisions.
pub fn render_table(s: &Status) -> String {
    let mut out = format!("Autoscaler status at {} (leader {})\n\n", s.time, s.leader);
    let pools: Vec<Vec<String>> = s
        .pools
        .iter()
        .map(|p| {
            vec![
                p.name.clone(),
                format!("{}..{}", p.min, p.max),
                p.replicas.to_string(),
                p.ready.to_string(),
                format!("{:.2}", p.price_per_hour),
                p.offers.clone(),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "POOL",
            "MIN..MAX",
            "REPLICAS",
            "READY",
            "PRICE/H",
            "OFFERS PER NODE",
        ],
        &pools,
    ));
    for e in &s.errors {
        out.push_str(&format!("skipped: {e}\n"));
    }
    out.push('\n');
    if s.in_flight.is_empty() {
        out.push_str("No nodes in flight.\n");
    } else {
        let rows: Vec<Vec<String>> = s
            .in_flight
            .iter()
            .map(|f| vec![f.pool.clone(), f.stage.clone(), f.count.to_string()])
            .collect();
        out.push_str(&table(&["POOL", "STAGE", "NODES IN FLIGHT"], &rows));
    }
    out.push('\n');
    if s.pending.is_empty() {
        out.push_str("No pending GPU pods.\n");
    } else {
        let rows: Vec<Vec<String>> = s
            .pending
            .iter()
            .map(|p| vec![p.pod.clone(), p.plan.clone(), p.message.clone()])
            .collect();
        out.push_str(&table(&["POD", "PLAN", "WHY"], &rows));
    }
    out.push('\n');
    if !s.mig_changes.is_empty() {
        let rows: Vec<Vec<String>> = s
            .mig_changes
            .iter()
            .map(|c| {
                vec![
                    c.node.clone(),
                    c.from.clone(),
                    c.to.clone(),
                    c.state.clone(),
                    c.message.clone(),
                ]
            })
            .collect();
        out.push_str(&table(&["NODE", "MIG FROM", "TO", "STATE", "WHY"], &rows));
        out.push('\n');
    }
    if s.decisions.is_empty() {
        out.push_str("No decisions yet.\n");
    } else {
        out.push_str("LAST DECISIONS\n");
        for d in &s.decisions {
            out.push_str(d);
            out.push('\n');
        }
    }
    out
}
