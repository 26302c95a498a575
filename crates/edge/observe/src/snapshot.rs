//! Everything the doctor reads, in one call: the cluster, the logs of troubled GPU containers and
//! the metrics.

use crate::error::ObserveError;
use crate::sources::MetricSources;
use gpuops_doctor::Snapshot;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use std::time::Duration;

/// What to read.
#[derive(Debug, Clone, Default)]
pub struct SnapshotOptions {
    /// Only this namespace's pods (plus the others' that hold resources).
    pub namespace: Option<String>,
    /// Only this node, its pool and its pods.
    pub node: Option<String>,
    /// Read the logs of at most this many crashed/restarted GPU containers (0: none).
    pub logs: usize,
    /// Lines of each log to read.
    pub log_lines: i64,
    /// Where the metrics are.
    pub metrics: MetricSources,
    /// Also ask Prometheus for the mean utilization over this window.
    pub averaged: Option<Duration>,
}

/// The snapshot the doctor's rules take, with where it came from and what could not be read.
pub async fn snapshot(
    client: &Client,
    options: &SnapshotOptions,
) -> Result<(Snapshot, Vec<String>, Vec<String>), ObserveError> {
    let cluster = crate::cluster(
        client,
        options.namespace.as_deref(),
        options.node.as_deref(),
    )
    .await?;
    let mut from = Vec::new();
    let mut unread = cluster.unread;
    let (controllers, failed) = crate::controllers::read(client, &cluster.events).await;
    if !failed.is_empty() {
        unread.push(format!(
            "controllers named by events: {}",
            failed.join("; ")
        ));
    }
    let logs = if options.logs > 0 {
        let (l, failed) = crate::logs(client, &cluster.pods, options.logs, options.log_lines).await;
        if !l.is_empty() {
            from.push(format!("{} container logs", l.len()));
        }
        if !failed.is_empty() {
            // Once, with the reasons: a finding that needs a log may be missing because of it.
            unread.push(format!(
                "the logs of {} container{}: {}",
                failed.len(),
                if failed.len() == 1 { "" } else { "s" },
                failed.join("; ")
            ));
        }
        l
    } else {
        Vec::new()
    };
    let dra = crate::dra::read(client, &cluster.pods).await;
    if let Some(why) = &dra.unread {
        unread.push(format!("DRA objects: {why}"));
    }
    let metrics = crate::collect(&options.metrics, Some(client), options.averaged).await?;
    from.extend(metrics.from);
    unread.extend(metrics.unread);
    Ok((
        Snapshot {
            nodes: cluster.nodes,
            pods: cluster.pods,
            events: cluster.events,
            metrics: metrics.samples,
            utilization_window: metrics.utilization_window,
            logs,
            quotas: cluster.quotas,
            controllers,
            dra,
            all_pods: cluster.all_pods,
            now: Timestamp::now(),
        },
        from,
        unread,
    ))
}
