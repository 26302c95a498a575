//! The status the controller publishes in a ConfigMap (like Cluster Autoscaler's
//! `cluster-autoscaler-status`), and its table rendering for `gpuops autoscaler status`, pure:
//! the controller writes and reads the ConfigMap.

use crate::decision::{Decision, Plan, Target};
use crate::memory::Remembered;
use crate::mig_demand::MigDecision;
use crate::mig_owed::{MigChangeStatus, OwedStatus};
use crate::model::{Millis, Snapshot};
use crate::time::rfc3339;
use serde::{Deserialize, Serialize};

/// Name of the status ConfigMap (in the controller's namespace).
pub const CONFIGMAP: &str = "gpuops-autoscaler-status";
/// Key of the JSON document inside it.
pub const KEY: &str = "status.json";
/// How many past decisions the status keeps.
pub const HISTORY: usize = 20;
/// How many pending pods the status lists (the rest are counted): a ConfigMap holds at most
/// 1 MiB, and 10,000 pending pods with their plans would not fit, failing every status write.
pub const MAX_PENDING: usize = 500;

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
    /// All pending GPU pods, also those beyond the [`MAX_PENDING`] listed.
    #[serde(default)]
    pub pending_total: usize,
    /// Unneeded nodes kept this pass, with what keeps them (a PodDisruptionBudget, a
    /// do-not-disrupt pod, the pool's minimum).
    #[serde(default)]
    pub blocked: Vec<BlockedStatus>,
    /// The most recent actions, newest first.
    pub decisions: Vec<String>,
    /// MIG changes under way or failed (the MIG demand reconciler's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_changes: Vec<MigChangeStatus>,
    /// Generated MIG configs pools owe nodes being bought (one entry per node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_owed: Vec<OwedStatus>,
    /// What the decision remembers between passes, for the next leader (see
    /// [`crate::memory`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Remembered>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockedStatus {
    pub node: String,
    pub reason: String,
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

/// The pods whose explanation a pass recorded as an event, with that explanation: what a new
/// leader's memory starts from ([`crate::memory::Remembered::restore`]).
pub fn explained(pending: &[PendingStatus]) -> std::collections::BTreeMap<String, String> {
    pending
        .iter()
        .filter(|p| matches!(p.plan.as_str(), "new-node" | "in-flight" | "unschedulable"))
        .map(|p| (p.pod.clone(), p.message.clone()))
        .collect()
}

fn offers(t: &crate::model::NodeTemplate) -> String {
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
    let pending_total = d.plans.len();
    // The ones that need attention first: no pool can run them, then those buying nodes.
    let mut plans: Vec<&crate::decision::PodPlan> = d.plans.iter().collect();
    plans.sort_by_key(|p| match p.plan {
        Plan::Unschedulable { .. } => 0,
        Plan::NewNode { .. } => 1,
        Plan::InFlight { .. } => 2,
        Plan::Waiting { .. } => 3,
        Plan::Existing { .. } => 4,
    });
    let pending = plans
        .into_iter()
        .take(MAX_PENDING)
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
    let time = rfc3339(now / 1000);
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
    // The decision states every blocked removal on every pass (not only when it changes), so
    // this is the current list, not a history.
    let blocked = d
        .events
        .iter()
        .filter(|e| e.reason == "ScaleDownBlocked")
        .filter_map(|e| match &e.target {
            Target::Node(n) => Some(BlockedStatus {
                node: n.clone(),
                reason: e.message.clone(),
            }),
            _ => None,
        })
        .collect();
    Status {
        time,
        leader: leader.to_string(),
        pools,
        errors: errors.to_vec(),
        in_flight,
        pending,
        pending_total,
        blocked,
        decisions,
        mig_changes: Vec::new(),
        mig_owed: Vec::new(),
        memory: None,
    }
}

/// Adds a pass of the MIG reconciler: the pending pods of its decision `d`, its changes in the
/// history, the changes under way and what pools owe their booting nodes.
pub fn add_mig(s: &mut Status, d: &MigDecision, changes: &[MigChangeStatus], owed: &[OwedStatus]) {
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
    s.mig_changes = changes.to_vec();
    s.mig_owed = owed.to_vec();
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
        if s.pending_total > s.pending.len() {
            out.push_str(&format!(
                "... and {} more pending GPU pods\n",
                s.pending_total - s.pending.len()
            ));
        }
    }
    out.push('\n');
    if !s.blocked.is_empty() {
        let rows: Vec<Vec<String>> = s
            .blocked
            .iter()
            .map(|b| vec![b.node.clone(), b.reason.clone()])
            .collect();
        out.push_str(&table(&["KEPT NODE", "WHY NOT REMOVED"], &rows));
        out.push('\n');
    }
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
    if !s.mig_owed.is_empty() {
        let rows: Vec<Vec<String>> = s
            .mig_owed
            .iter()
            .map(|o| vec![o.pool.clone(), o.config.clone(), rfc3339(o.at / 1000)])
            .collect();
        out.push_str(&table(&["POOL", "OWED MIG CONFIG", "SINCE"], &rows));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::decision::{Event, PodPlan};

    fn plan(i: usize, plan: Plan) -> PodPlan {
        PodPlan {
            pod: format!("ml/p{i:05}"),
            plan,
            message: "a reason of about this length for every pod, as the decision writes them"
                .into(),
        }
    }

    #[test]
    fn many_pending_pods_fit_the_configmap_the_unschedulable_listed_first() {
        let mut d = Decision::default();
        for i in 0..10_000 {
            d.plans.push(plan(i, Plan::Waiting { pool: "p".into() }));
        }
        d.plans.push(plan(
            99_999,
            Plan::Unschedulable {
                reasons: vec!["no pool".into()],
            },
        ));
        let st = build(&Snapshot::default(), &[], &d, 0, "me", None);
        assert_eq!(st.pending_total, 10_001);
        assert_eq!(st.pending.len(), MAX_PENDING);
        assert_eq!(st.pending[0].pod, "ml/p99999");
        assert_eq!(st.pending[0].plan, "unschedulable");
        let text = serde_json::to_string_pretty(&st).unwrap();
        assert!(text.len() < 512 * 1024, "{} bytes", text.len());
        assert!(render_table(&st).contains("... and 9501 more pending GPU pods"));
    }

    #[test]
    fn blocked_removals_are_listed_with_their_reason() {
        let mut d = Decision::default();
        d.events.push(Event {
            target: Target::Node("gpu-1".into()),
            reason: "ScaleDownBlocked".into(),
            message:
                "node gpu-1 is unneeded (no GPU pod) but pool capi/h100 is at its minimum size 1"
                    .into(),
            warning: false,
        });
        d.events.push(Event {
            target: Target::Pod("ml/p".into()),
            reason: "NotTriggerScaleUp".into(),
            message: "no pool".into(),
            warning: true,
        });
        let st = build(&Snapshot::default(), &[], &d, 0, "me", None);
        assert_eq!(st.blocked.len(), 1);
        assert_eq!(st.blocked[0].node, "gpu-1");
        assert!(st.blocked[0].reason.contains("at its minimum size 1"));
        let table = render_table(&st);
        assert!(table.contains("KEPT NODE"), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("gpu-1 ") && l.ends_with("at its minimum size 1")),
            "{table}"
        );
        // A status written before these fields existed still reads.
        let old: Status = serde_json::from_str(
            r#"{"time":"t","leader":"l","pools":[],"errors":[],"in_flight":[],"pending":[],"decisions":[]}"#,
        )
        .unwrap();
        assert!(old.blocked.is_empty());
    }

    #[test]
    fn owed_mig_configs_are_listed_per_pool() {
        let mut st = build(
            &Snapshot::default(),
            &[],
            &Decision::default(),
            0,
            "me",
            None,
        );
        let owed = vec![OwedStatus {
            pool: "capi/a100".into(),
            config: "gpuops-ab14fbc4".into(),
            at: 1_796_119_200_000,
        }];
        add_mig(&mut st, &MigDecision::default(), &[], &owed);
        let table = render_table(&st);
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("POOL ") && l.contains("OWED MIG CONFIG")),
            "{table}"
        );
        assert!(
            table.lines().any(|l| l.starts_with("capi/a100 ")
                && l.contains("gpuops-ab14fbc4")
                && l.ends_with("2026-12-01T10:00:00Z")),
            "{table}"
        );
        let back: Status = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
        assert_eq!(back.mig_owed, st.mig_owed);
    }
}
