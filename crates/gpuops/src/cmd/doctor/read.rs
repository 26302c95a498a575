//! Reading the cluster for the doctor: one paged list per kind, then logs of a few GPU pods.

use anyhow::{Context, Result};
use futures::StreamExt;
use gpuops_doctor::LogExcerpt;
use gpuops_doctor::resources::pod_gpus;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

const PAGE: u32 = 500;

/// Every object of a kind, in pages of 500.
pub async fn list_all<K>(api: Api<K>, what: &str) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api
            .list(&lp)
            .await
            .with_context(|| format!("listing {what}"))?;
        out.extend(page.items);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// Nodes, pods and events of the whole cluster (pods and events of every namespace: GPUs free on a
/// node depend on every pod bound to it).
pub async fn cluster(client: &Client) -> Result<(Vec<Node>, Vec<Pod>, Vec<Event>)> {
    let (nodes, pods, events) = tokio::join!(
        list_all(Api::<Node>::all(client.clone()), "nodes"),
        list_all(Api::<Pod>::all(client.clone()), "pods"),
        list_all(Api::<Event>::all(client.clone()), "events"),
    );
    Ok((nodes?, pods?, events?))
}

/// Whether a GPU pod's containers crashed or restarted: worth reading its log.
fn troubled(p: &Pod) -> Vec<(String, bool)> {
    if pod_gpus(p).is_empty() {
        return Vec::new();
    }
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|cs| {
            let terminated = cs.state.as_ref().and_then(|s| s.terminated.as_ref());
            let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref());
            let failed_now = terminated.is_some_and(|t| t.exit_code != 0);
            let crashing = waiting.is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"));
            if cs.restart_count > 0 || crashing {
                Some((cs.name.clone(), true))
            } else if failed_now {
                Some((cs.name.clone(), false))
            } else {
                None
            }
        })
        .collect()
}

/// The last `lines` of the logs of at most `limit` troubled GPU containers, 8 at a time.
pub async fn logs(client: &Client, pods: &[Pod], limit: usize, lines: i64) -> Vec<LogExcerpt> {
    let wanted: Vec<(String, String, String, bool)> = pods
        .iter()
        .flat_map(|p| {
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            troubled(p)
                .into_iter()
                .map(move |(c, previous)| (ns.clone(), name.clone(), c, previous))
        })
        .take(limit)
        .collect();
    futures::stream::iter(wanted)
        .map(|(ns, pod, container, previous)| {
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            async move {
                let lp = LogParams {
                    container: Some(container.clone()),
                    previous,
                    tail_lines: Some(lines),
                    ..LogParams::default()
                };
                match api.logs(&pod, &lp).await {
                    Ok(text) => Some(LogExcerpt {
                        namespace: ns,
                        pod,
                        container,
                        previous,
                        text,
                    }),
                    Err(e) => {
                        tracing::debug!("logs of {ns}/{pod}/{container}: {e}");
                        None
                    }
                }
            }
        })
        .buffer_unordered(8)
        .filter_map(|x| async move { x })
        .collect()
        .await
}
