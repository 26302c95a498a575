//! What a pass of the MIG demand reconciler does with its decision, pure: the scale-ups it
//! hands the runtime, what a scale-up with a generated config owes its pool, and the events
//! that explain each action. The controller performs the writes in between.

use crate::decision::{Event, ScaleUp, Target};
use crate::mig_demand::{MigChange, MigScaleUp};
use crate::mig_owed::{CONFIG_LABEL, Owed};
use crate::model::{Millis, Pool};
use crate::time::rfc3339;

/// How a MIG scale-up is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buy {
    /// With the pool's own config: scaled as it is.
    PoolConfig,
    /// With a generated config: owed to the new nodes (written with the config before the
    /// scale), which are labelled with it when they register.
    Generated,
}

/// Whether `su` is bought with `pool`'s own config or a generated one.
pub fn buy(su: &MigScaleUp, pool: &Pool) -> Buy {
    if pool.template.labels.get(CONFIG_LABEL) == Some(&su.config_name) {
        Buy::PoolConfig
    } else {
        Buy::Generated
    }
}

/// The entries a scale-up with a generated config owes its pool, one per node, at `now`.
pub fn owed_entries(su: &MigScaleUp, now: Millis) -> Vec<Owed> {
    (0..su.nodes)
        .map(|_| Owed {
            config: su.config_name.clone(),
            at: now,
            layout: su.layout.clone(),
        })
        .collect()
}

/// The scale-up the runtime performs for `su` on a pool at `replicas`, and its pods' events.
pub fn scale_up(su: &MigScaleUp, replicas: u32, how: Buy) -> (ScaleUp, Vec<Event>) {
    let message = match how {
        Buy::Generated => format!(
            "{}; its new node(s) are labelled {} when they register",
            su.message, su.config_name
        ),
        Buy::PoolConfig => su.message.clone(),
    };
    let events = su
        .pods
        .iter()
        .map(|pod| Event {
            target: Target::Pod(pod.clone()),
            reason: "TriggeredScaleUp".into(),
            message: message.clone(),
            warning: false,
        })
        .collect();
    (
        ScaleUp {
            pool: su.pool.clone(),
            from: replicas,
            to: replicas + su.nodes,
            pods: su.pods.clone(),
            triggered_by: su.pods.clone(),
            message: su.message.clone(),
        },
        events,
    )
}

/// The pods' events for a scale-up with a generated config not bought: what the pool would
/// owe cannot be recorded (`why`).
pub fn not_bought(su: &MigScaleUp, why: &str) -> Vec<Event> {
    su.pods
        .iter()
        .map(|pod| Event {
            target: Target::Pod(pod.clone()),
            reason: "NotTriggerScaleUp".into(),
            message: format!("{}; not bought: {why}", su.message),
            warning: true,
        })
        .collect()
}

/// The events for re-partitions whose configs and labels were written: one on the node, one
/// on each pod that triggered it.
pub fn change_events(changes: &[MigChange]) -> Vec<Event> {
    let mut out = Vec::new();
    for c in changes {
        out.push(Event {
            target: Target::Node(c.node.clone()),
            reason: "MIGRepartition".into(),
            message: c.message.clone(),
            warning: false,
        });
        for p in &c.pods {
            out.push(Event {
                target: Target::Pod(p.clone()),
                reason: "TriggeredMIGRepartition".into(),
                message: c.message.clone(),
                warning: false,
            });
        }
    }
    out
}

/// The event for an owed entry given up (`why`).
pub fn not_owed(pool: &str, o: &Owed, why: &str) -> Event {
    Event {
        target: Target::Pool(pool.to_string()),
        reason: "MIGLayoutNotOwed".into(),
        message: format!(
            "MIG config {} owed since {} no longer owed: {why}",
            o.config,
            rfc3339(o.at / 1000)
        ),
        warning: true,
    }
}

/// The event for a new node labelled at boot with the config its pool owed it.
pub fn layout_at_boot(pool: &str, node: &str, o: &Owed) -> Event {
    Event {
        target: Target::Node(node.to_string()),
        reason: "MIGLayoutAtBoot".into(),
        message: format!(
            "new node {node} of pool {pool} labelled {CONFIG_LABEL}={} (bought for that layout)",
            o.config
        ),
        warning: false,
    }
}
