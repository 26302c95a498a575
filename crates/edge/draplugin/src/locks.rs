//! One lock per claim UID, so two calls for the same claim never run side by side while calls
//! for different claims do.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::OwnedMutexGuard;

#[derive(Default)]
pub(crate) struct ClaimLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl ClaimLocks {
    /// Locks every UID of `uids`, in their sorted order so two calls over overlapping sets cannot
    /// deadlock.
    pub(crate) async fn lock(&self, uids: &BTreeSet<String>) -> Vec<OwnedMutexGuard<()>> {
        let mutexes: Vec<Arc<tokio::sync::Mutex<()>>> = {
            let mut map = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            // Entries nobody holds or waits for are dropped so the map does not grow with every
            // claim the node has ever seen.
            map.retain(|_, m| Arc::strong_count(m) > 1);
            uids.iter()
                .map(|uid| Arc::clone(map.entry(uid.clone()).or_default()))
                .collect()
        };
        let mut guards = Vec::with_capacity(mutexes.len());
        for m in mutexes {
            guards.push(m.lock_owned().await);
        }
        guards
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn set(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|u| (*u).to_string()).collect()
    }

    #[tokio::test]
    async fn same_claim_waits_other_claims_do_not() {
        let locks = Arc::new(ClaimLocks::default());
        let held = locks.lock(&set(&["a", "b"])).await;
        // A different claim is not blocked.
        let other = tokio::time::timeout(Duration::from_secs(5), locks.lock(&set(&["c"]))).await;
        assert!(other.is_ok());
        drop(other);
        let waiter = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move { locks.lock(&set(&["b"])).await.len() })
        };
        // Still waiting while "b" is held: give it every chance to run first.
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap(), 1);
        // Unused entries are pruned at the next lock.
        drop(locks.lock(&set(&[])).await);
        assert_eq!(locks.len(), 0);
    }
}
