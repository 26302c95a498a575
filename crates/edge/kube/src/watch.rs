//! Watches and lists: one node or ConfigMap followed into a `watch` channel, paged lists of anything.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

use crate::error::{KubeError, bounded};

/// Drops `metadata.managedFields`: nothing in gpuops reads them and they are most of a Node's size.
pub fn strip_managed_fields<K: Resource>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object
}

/// Follows node `name` into `tx` (`None` until it was read once), re-watching with kube's
/// backoff after errors. Returns when every receiver is gone.
pub async fn watch_node(client: kube::Client, name: String, tx: watch::Sender<Option<Arc<Node>>>) {
    watch_named(Api::all(client), "node", name, tx).await;
}

/// Follows ConfigMap `namespace/name` into `tx`, as [`watch_node`] does a node. Its watch asks
/// for the one name, so `get`/`list`/`watch` limited to it by `resourceNames` are enough.
pub async fn watch_configmap(
    client: kube::Client,
    namespace: &str,
    name: String,
    tx: watch::Sender<Option<Arc<ConfigMap>>>,
) {
    watch_named(Api::namespaced(client, namespace), "ConfigMap", name, tx).await;
}

async fn watch_named<K>(
    api: Api<K>,
    kind: &'static str,
    name: String,
    tx: watch::Sender<Option<Arc<K>>>,
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut objects = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    let mut failing = false;
    loop {
        let next = tokio::select! {
            next = objects.next() => next,
            () = tx.closed() => return,
        };
        match next {
            Some(Ok(object)) => {
                if std::mem::take(&mut failing) {
                    tracing::info!(name = %name, "watching the {kind} again");
                }
                tx.send_replace(Some(Arc::new(strip_managed_fields(object))));
            }
            Some(Err(e)) => {
                // Logged once per outage; the watcher keeps retrying with backoff.
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(name = %name, error = %e, "watching the {kind} failed; retrying with backoff");
                }
            }
            None => return,
        }
    }
}

/// Every object of a list, fetched `page` at a time (large clusters stay within request limits);
/// each page has `timeout`.
pub async fn list_all<K>(
    api: &Api<K>,
    params: &ListParams,
    page: u32,
    timeout: Duration,
) -> Result<Vec<K>, KubeError>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut out = Vec::new();
    let mut params = params.clone().limit(page);
    loop {
        let list = bounded(timeout, || "listing objects".to_string(), api.list(&params)).await?;
        out.extend(list.items.into_iter().map(strip_managed_fields));
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    #[test]
    fn managed_fields_are_dropped_and_the_rest_kept() {
        let node = Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        let node = strip_managed_fields(node);
        assert!(node.metadata.managed_fields.is_none());
        assert_eq!(node.metadata.name.as_deref(), Some("n1"));
    }
}
