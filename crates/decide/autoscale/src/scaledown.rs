//! The scale-down half of the decision: nodes unneeded for the idle period, never below a
//! pool's minimum, never evicting a do-not-disrupt pod or more than a PDB allows.

use crate::decide::{human, ms};
use crate::decision::{Decision, Event, Removal, Target};
use crate::model::{Config, Millis, Node, Snapshot, State};
use std::collections::{BTreeMap, HashMap};

fn unneeded(n: &Node, cfg: &Config) -> Option<String> {
    let gpu_pods = n.pods.iter().filter(|p| p.gpu).count();
    if gpu_pods == 0 {
        return Some("no GPU pod".into());
    }
    match n.gpu_util {
        Some(u) if u <= cfg.idle_util_pct => Some(format!(
            "its {gpu_pods} GPU pod(s) left the allocated GPUs idle (utilization {u:.0}%)"
        )),
        _ => None,
    }
}

/// Scale-down: fills `out.removals`; `needed` marks nodes the scale-up planned pods onto.
pub(crate) fn scale_down(
    snap: &Snapshot,
    state: &mut State,
    now: Millis,
    cfg: &Config,
    needed: &[bool],
    out: &mut Decision,
) {
    let pools: HashMap<&str, &crate::model::Pool> =
        snap.pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut size: BTreeMap<&str, u32> = snap
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.replicas))
        .collect();
    let mut budget: Vec<u32> = snap.pdbs.iter().map(|p| p.disruptions_allowed).collect();
    let idle = ms(cfg.scale_down_idle);

    // Removals already under way continue (the controller is idempotent) and count against
    // the minimum: their replica is not gone yet.
    for n in snap.nodes.iter().filter(|n| n.removing) {
        let Some(pool) = n.pool.as_deref().filter(|p| pools.contains_key(p)) else {
            continue;
        };
        if let Some(s) = size.get_mut(pool) {
            *s = s.saturating_sub(1);
        }
        out.removals.push(Removal {
            pool: pool.to_string(),
            node: n.name.clone(),
            machine: n.machine.clone(),
            evict: n.pods.iter().map(|p| p.key.clone()).collect(),
            message: format!("continuing removal of node {} of pool {pool}", n.name),
        });
    }

    let mut candidates: Vec<(Millis, usize, String)> = Vec::new();
    for (i, n) in snap.nodes.iter().enumerate() {
        if n.removing || n.pool.as_deref().is_none_or(|p| !pools.contains_key(p)) {
            state.unneeded_since.remove(&n.name);
            continue;
        }
        match unneeded(n, cfg).filter(|_| !needed.get(i).copied().unwrap_or(false)) {
            None => {
                state.unneeded_since.remove(&n.name);
            }
            Some(why) => {
                let since = *state.unneeded_since.entry(n.name.clone()).or_insert(now);
                if now.saturating_sub(since) >= idle {
                    candidates.push((since, i, why));
                }
            }
        }
    }
    let names: std::collections::HashSet<&str> =
        snap.nodes.iter().map(|n| n.name.as_str()).collect();
    state
        .unneeded_since
        .retain(|name, _| names.contains(name.as_str()));
    candidates.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(snap.nodes[a.1].name.cmp(&snap.nodes[b.1].name))
    });

    let mut removed = 0;
    for (since, i, why) in candidates {
        if removed >= cfg.max_scale_down_per_decision {
            break;
        }
        let n = &snap.nodes[i];
        let Some(pool_name) = n.pool.as_deref() else {
            continue;
        };
        let Some(pool) = pools.get(pool_name) else {
            continue;
        };
        let blocked = |message: String| Event {
            target: Target::Node(n.name.clone()),
            reason: "ScaleDownBlocked".into(),
            message,
            warning: false,
        };
        let current = size.get(pool_name).copied().unwrap_or(0);
        if current <= pool.min {
            out.events.push(blocked(format!(
                "node {} is unneeded ({why}) but pool {pool_name} is at its minimum size {}",
                n.name, pool.min
            )));
            continue;
        }
        if let Some(p) = n.pods.iter().find(|p| p.do_not_disrupt) {
            out.events.push(blocked(format!(
                "node {} is unneeded ({why}) but pod {} is annotated do-not-disrupt",
                n.name, p.key
            )));
            continue;
        }
        let mut need = vec![0u32; snap.pdbs.len()];
        for p in &n.pods {
            for (k, pdb) in snap.pdbs.iter().enumerate() {
                if pdb.covers(p) {
                    need[k] += 1;
                }
            }
        }
        if let Some(k) = (0..need.len()).find(|&k| need[k] > budget[k]) {
            out.events.push(blocked(format!(
                "node {} is unneeded ({why}) but evicting its pods would violate PodDisruptionBudget {} ({} disruption(s) allowed, {} needed)",
                n.name, snap.pdbs[k].key, budget[k], need[k]
            )));
            continue;
        }
        for k in 0..need.len() {
            budget[k] -= need[k];
        }
        if let Some(s) = size.get_mut(pool_name) {
            *s -= 1;
        }
        removed += 1;
        let message = format!(
            "removing node {} of pool {pool_name} ({current} -> {}): {why} for {}",
            n.name,
            current - 1,
            human(now.saturating_sub(since))
        );
        out.events.push(Event {
            target: Target::Pool(pool_name.to_string()),
            reason: "ScaleDown".into(),
            message: message.clone(),
            warning: false,
        });
        out.removals.push(Removal {
            pool: pool_name.to_string(),
            node: n.name.clone(),
            machine: n.machine.clone(),
            evict: n.pods.iter().map(|p| p.key.clone()).collect(),
            message,
        });
    }
}
