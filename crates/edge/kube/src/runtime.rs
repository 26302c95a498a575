//! The one shape every gpuops loop runs in, after kube-rs's controller-rs: a `reconcile(obj, ctx)`
//! that returns an [`Action`], an `error_policy(obj, &err, ctx)` that turns a failure into one
//! (backing off by the failures in a row, through `gpuops-backoff`), watch caches started by one
//! function ([`reflect`]), and [`until_stopped`] so a long await gives way to shutdown.

use futures::StreamExt;
use gpuops_backoff::Policy;
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What a loop does after one reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Run again after this long, whatever else happens.
    Requeue(Duration),
    /// Run again only when something watched changes.
    AwaitChange,
}

impl Action {
    #[must_use]
    pub const fn requeue(after: Duration) -> Action {
        Action::Requeue(after)
    }

    #[must_use]
    pub const fn await_change() -> Action {
        Action::AwaitChange
    }

    /// The wait this action asks for, `None` for waiting on a change.
    #[must_use]
    pub const fn requeue_after(&self) -> Option<Duration> {
        match self {
            Action::Requeue(d) => Some(*d),
            Action::AwaitChange => None,
        }
    }
}

/// The error policy every loop shares: after `failures` failures in a row (counting this one),
/// retry after `policy`'s jittered wait for that many. Callers log and count around it.
#[must_use]
pub fn backoff_action(policy: &Policy, failures: u32) -> Action {
    Action::Requeue(policy.delay(failures.max(1)))
}

/// One step of a loop in the controller-rs shape: `reconcile`, and on failure `error_policy`,
/// both given the object and the shared context.
pub async fn reconcile_step<O, C, E, R, Fut, P>(
    obj: Arc<O>,
    ctx: Arc<C>,
    reconcile: R,
    error_policy: P,
) -> Action
where
    R: FnOnce(Arc<O>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, E>>,
    P: FnOnce(Arc<O>, &E, Arc<C>) -> Action,
{
    match reconcile(Arc::clone(&obj), Arc::clone(&ctx)).await {
        Ok(action) => action,
        Err(e) => error_policy(obj, &e, ctx),
    }
}

/// `fut`'s output, or `None` as soon as `stop` turns true (or its sender is gone, which means
/// nothing will ever ask to stop again and the process is going down), so a long network await
/// does not hold shutdown up.
pub async fn until_stopped<F: Future>(fut: F, stop: &watch::Receiver<bool>) -> Option<F::Output> {
    let mut stop = stop.clone();
    tokio::select! {
        // Biased: a stop already asked for wins over a future that is also ready.
        biased;
        _ = stop.wait_for(|s| *s) => None,
        out = fut => Some(out),
    }
}

/// Drops what no gpuops loop reads before an object enters a cache: managedFields and
/// kubectl's last-applied copy are often half of an object's size.
pub fn slim<K: kube::Resource>(o: &mut K) {
    let meta = o.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Starts a watch cache of `api` with the usual setup (kube's default watcher backoff, objects
/// [`slim`]med) on its own task, calling `on_change` after every event, and returns the store.
/// A failed watch is logged under `what` and retried for ever. `dyntype` is `()` for typed
/// objects and the `ApiResource` for `DynamicObject`s.
pub fn reflect<K, F>(
    api: Api<K>,
    dyntype: K::DynamicType,
    config: watcher::Config,
    what: &'static str,
    on_change: F,
) -> Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync,
    K: 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
    F: Fn() + Send + Sync + 'static,
{
    let writer = reflector::store::Writer::new(dyntype);
    let store = writer.as_reader();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff().modify(slim))
        .touched_objects();
    tokio::spawn(async move {
        stream
            .for_each(|event| {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "watching {what} failed; retrying with backoff");
                }
                on_change();
                futures::future::ready(())
            })
            .await;
    });
    store
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_error_policy_backs_off_by_failures_in_a_row() {
        let p = Policy::new(Duration::from_secs(1), Duration::from_secs(30)).jitter(0.2);
        for (failures, base) in [(1, 1), (2, 2), (4, 8), (5, 16), (6, 30), (40, 30)] {
            let base = Duration::from_secs(base);
            let wait = backoff_action(&p, failures).requeue_after().unwrap();
            assert!(
                wait >= base && wait <= base.mul_f64(1.2),
                "{failures}: {wait:?}"
            );
        }
        // A policy asked before any failure still waits: the call is for a failure.
        assert_eq!(
            backoff_action(&Policy::new(ms(100), ms(400)), 0),
            Action::Requeue(ms(100))
        );
    }

    #[tokio::test]
    async fn a_step_runs_the_error_policy_only_on_failure() {
        struct Ctx {
            policy: Policy,
        }
        let ctx = Arc::new(Ctx {
            policy: Policy::new(ms(100), ms(400)),
        });
        let ok = reconcile_step(
            Arc::new(3u32),
            Arc::clone(&ctx),
            |_, _| async { Ok::<_, String>(Action::AwaitChange) },
            |_, _, _| Action::Requeue(Duration::ZERO),
        )
        .await;
        assert_eq!(ok, Action::AwaitChange);
        let failed = reconcile_step(
            Arc::new(3u32),
            Arc::clone(&ctx),
            |_, _| async { Err::<Action, _>("down".to_string()) },
            |failures: Arc<u32>, e: &String, ctx: Arc<Ctx>| {
                assert_eq!(e, "down");
                backoff_action(&ctx.policy, *failures)
            },
        )
        .await;
        assert_eq!(failed, Action::Requeue(ms(400)));
    }

    #[tokio::test]
    async fn until_stopped_returns_the_output_when_not_stopped() {
        let (_tx, rx) = watch::channel(false);
        assert_eq!(until_stopped(async { 7 }, &rx).await, Some(7));
    }

    #[tokio::test]
    async fn until_stopped_gives_up_a_pending_await_when_stop_fires() {
        let (tx, rx) = watch::channel(false);
        let waiting =
            tokio::spawn(async move { until_stopped(std::future::pending::<()>(), &rx).await });
        tx.send(true).unwrap();
        assert_eq!(waiting.await.unwrap(), None);
    }

    #[tokio::test]
    async fn until_stopped_does_not_start_after_a_stop() {
        let (tx, rx) = watch::channel(false);
        tx.send(true).unwrap();
        assert_eq!(until_stopped(async { 7 }, &rx).await, None);
    }

    #[tokio::test]
    async fn until_stopped_gives_up_when_the_stop_sender_is_gone() {
        let (tx, rx) = watch::channel(false);
        drop(tx);
        assert_eq!(until_stopped(std::future::pending::<()>(), &rx).await, None);
    }

    #[test]
    fn slim_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut pod: k8s_openapi::api::core::v1::Pod =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "a": "b"},
                "managedFields": [{"manager": "kubectl"}]}}))
            .unwrap();
        slim(&mut pod);
        assert!(pod.metadata.managed_fields.is_none());
        let annotations = pod.metadata.annotations.unwrap();
        assert_eq!(annotations.len(), 1);
        assert_eq!(annotations["a"], "b");
    }
}
