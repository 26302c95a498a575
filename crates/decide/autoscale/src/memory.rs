//! What the controller remembers between passes, carried across a restart or a failover, pure.
//!
//! Everything the decision needs that the cluster's objects do not already say is written with
//! the status, in the status ConfigMap, on every pass ([`Remembered::of`]); the replica that
//! takes the Lease reads it back before its first pass ([`Remembered::restore`]). What the
//! objects already say is read from them each pass and not kept here: scale-ups in flight
//! (replicas, Machines, Nodes), the owed MIG layouts (the agents' ConfigMap's annotation) and a
//! MIG change's time (the node's `gpuops.io/mig.config.changed-at`, whole seconds; kept here
//! too, to the millisecond). A pod's explanation is recovered from the status' pending list.
//! The table of what survives and what a loss costs is in docs/autoscaling.md.
//!
//! Times are milliseconds of the writer's clock; replicas of one cluster share NTP time, and a
//! skew between them moves each remembered instant by that much, no more.

use crate::mig_demand::MigMemory;
use crate::model::{Backoff, Millis, PendingPod, State};
use crate::time::latest_creation;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Most first sightings kept: a ConfigMap holds 1 MiB, and 50,000 pending pods' names would
/// not fit. The newest are kept (they decide when the batch window closes) and the oldest
/// (it decides the window's maximum); the others only order pods of one size among themselves.
pub const MAX_SEEN: usize = 2_000;

/// The decision's memory as the status ConfigMap carries it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remembered {
    /// Node -> since when it has been unneeded ([`State::unneeded_since`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unneeded_since: BTreeMap<String, Millis>,
    /// Pool -> back-off after timed-out machines ([`State::backoff`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backoff: BTreeMap<String, Backoff>,
    /// Machines already counted as timed out ([`State::timed_out`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub timed_out: BTreeMap<String, Millis>,
    /// Pending pod -> when this controller first saw it (its batch-window time, see
    /// [`first_seen`]), at most [`MAX_SEEN`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub first_seen: BTreeMap<String, Millis>,
    /// Node -> when the MIG reconciler last changed its layout ([`MigMemory::last_change`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_last_change: BTreeMap<String, Millis>,
    /// Node -> when its MIG change was first seen failed ([`MigMemory::failed_at`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_failed_at: BTreeMap<String, Millis>,
}

/// What a new leader starts its passes with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Restored {
    pub state: State,
    pub seen: HashMap<String, Millis>,
    pub mig: MigMemory,
}

impl Remembered {
    /// The memory to publish after a pass. `explained` is left out: the status' pending list
    /// carries the same messages.
    pub fn of(state: &State, seen: &HashMap<String, Millis>, mig: Option<&MigMemory>) -> Self {
        let mut by_time: Vec<(&Millis, &String)> = seen.iter().map(|(k, t)| (t, k)).collect();
        by_time.sort_unstable();
        let first_seen = if by_time.len() > MAX_SEEN {
            let newest = by_time.len() - (MAX_SEEN - 1);
            by_time[..1]
                .iter()
                .chain(&by_time[newest..])
                .map(|(t, k)| ((*k).clone(), **t))
                .collect()
        } else {
            by_time.iter().map(|(t, k)| ((*k).clone(), **t)).collect()
        };
        Self {
            unneeded_since: state.unneeded_since.clone(),
            backoff: state.backoff.clone(),
            timed_out: state.timed_out.clone(),
            first_seen,
            mig_last_change: mig.map(|m| m.last_change.clone()).unwrap_or_default(),
            mig_failed_at: mig.map(|m| m.failed_at.clone()).unwrap_or_default(),
        }
    }

    /// The memory a new leader starts with: this, and each pod's last explanation (from the
    /// status' `pending` list, [`crate::status::explained`]: so the events already recorded are
    /// not recorded again).
    pub fn restore(self, explained: BTreeMap<String, String>) -> Restored {
        Restored {
            state: State {
                unneeded_since: self.unneeded_since,
                backoff: self.backoff,
                explained,
                timed_out: self.timed_out,
            },
            seen: self.first_seen.into_iter().collect(),
            mig: MigMemory {
                last_change: self.mig_last_change,
                failed_at: self.mig_failed_at,
            },
        }
    }
}

/// Gives each pending pod its batch-window time: its creationTimestamp moved to its first
/// sighting here, within that timestamp's second ([`latest_creation`]). `seen` remembers the
/// sightings (pods no longer pending are forgotten); a pod first seen now is seen at `now`.
pub fn first_seen(pending: &mut [PendingPod], seen: &mut HashMap<String, Millis>, now: Millis) {
    let keys: std::collections::HashSet<&str> = pending.iter().map(|p| p.key.as_str()).collect();
    seen.retain(|k, _| keys.contains(k.as_str()));
    drop(keys);
    for p in pending {
        let first = *seen.entry(p.key.clone()).or_insert(now);
        p.created = latest_creation(p.created, first);
    }
}
