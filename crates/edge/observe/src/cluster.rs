//! Reading the cluster for the doctor and top: one paged list per kind (narrowed by `--node` and
//! `--namespace` where the rules allow), then logs of a few GPU pods.

use crate::error::{ObserveError, chain};
use futures::StreamExt;
use gpuops_doctor::LogExcerpt;
use gpuops_doctor::resources::pod_gpus;
use gpuops_kube::ClientOptions;
use k8s_openapi::api::core::v1::{Event, Node, Pod, ResourceQuota};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use std::collections::HashSet;
use std::fmt::Debug;
use std::time::Duration;

const PAGE: u32 = 500;

type Result<T, E = ObserveError> = std::result::Result<T, E>;

/// The Kubernetes client for `doctor` and `top`: the shared builder's configuration, with a read
/// timeout (these are lists, never watches) and a shorter connect timeout.
pub async fn client(options: &ClientOptions) -> Result<Client> {
    let mut config = options.config().await?;
    config.connect_timeout = Some(Duration::from_secs(10));
    config.read_timeout = Some(Duration::from_secs(60));
    Client::try_from(config).map_err(|source| ObserveError::Kube {
        what: "connecting to Kubernetes".into(),
        source,
    })
}

/// Every object of a kind, in pages of 500.
pub async fn list_all<K>(api: Api<K>, what: &str, lp: ListParams) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut page_lp = lp.clone().limit(PAGE);
        if let Some(t) = &token {
            page_lp = page_lp.continue_token(t);
        }
        let page = api
            .list(&page_lp)
            .await
            .map_err(|source| ObserveError::Kube {
                what: format!("listing {what}"),
                source,
            })?;
        // managedFields are most of a real object's size and no rule reads them.
        out.extend(page.items.into_iter().map(|mut item| {
            item.meta_mut().managed_fields = None;
            item
        }));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// What was read, and what could not be.
pub struct Read {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
    pub events: Vec<Event>,
    pub quotas: Vec<ResourceQuota>,
    /// Every pod of the cluster was read (not so with `--node`).
    pub all_pods: bool,
    pub unread: Vec<String>,
}

/// The cluster as the rules need it.
///
/// - whole cluster: nodes, pods and events of every namespace (GPUs free on a node depend on every
///   pod bound to it);
/// - `--node N`: that node and its pool peers, the pods bound to it, and the events about them;
/// - `--namespace NS`: every node, the namespace's pods plus the other namespaces' pods that still
///   hold resources (finished ones are skipped), and only the namespace's and the nodes' events.
pub async fn cluster(client: &Client, namespace: Option<&str>, node: Option<&str>) -> Result<Read> {
    if let Some(node) = node {
        return one_node(client, node).await;
    }
    let quota_api: Api<ResourceQuota> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (nodes, pods, events, quotas) = match namespace {
        None => {
            let (n, p, e, q) = tokio::join!(
                list_all(
                    Api::<Node>::all(client.clone()),
                    "nodes",
                    ListParams::default()
                ),
                list_all(
                    Api::<Pod>::all(client.clone()),
                    "pods",
                    ListParams::default()
                ),
                list_all(
                    Api::<Event>::all(client.clone()),
                    "events",
                    ListParams::default()
                ),
                list_all(quota_api, "resourcequotas", ListParams::default()),
            );
            (n?, p?, e?, q)
        }
        Some(ns) => {
            let (n, mine, others, e, node_events, q) = tokio::join!(
                list_all(
                    Api::<Node>::all(client.clone()),
                    "nodes",
                    ListParams::default()
                ),
                list_all(
                    Api::<Pod>::namespaced(client.clone(), ns),
                    "pods",
                    ListParams::default()
                ),
                list_all(
                    Api::<Pod>::all(client.clone()),
                    "pods",
                    ListParams::default()
                        .fields("status.phase!=Succeeded,status.phase!=Failed,spec.nodeName!=")
                ),
                list_all(
                    Api::<Event>::namespaced(client.clone(), ns),
                    "events",
                    ListParams::default()
                ),
                list_all(
                    Api::<Event>::all(client.clone()),
                    "events",
                    ListParams::default().fields("involvedObject.kind=Node")
                ),
                list_all(quota_api, "resourcequotas", ListParams::default()),
            );
            let mut pods = mine?;
            let seen: HashSet<String> =
                pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
            pods.extend(
                others?
                    .into_iter()
                    .filter(|p| p.metadata.uid.as_ref().is_none_or(|u| !seen.contains(u))),
            );
            let mut events = e?;
            events.extend(node_events?);
            (n?, pods, events, q)
        }
    };
    let mut unread = Vec::new();
    let quotas = quotas.unwrap_or_else(|e| {
        unread.push(format!("resourcequotas: {}", chain(&e)));
        Vec::new()
    });
    Ok(Read {
        nodes,
        pods,
        events,
        quotas,
        all_pods: true,
        unread,
    })
}

async fn one_node(client: &Client, name: &str) -> Result<Read> {
    let nodes_api = Api::<Node>::all(client.clone());
    let node = nodes_api
        .get(name)
        .await
        .map_err(|source| ObserveError::Kube {
            what: format!("--node {name}"),
            source,
        })?;
    let pool = node.metadata.labels.as_ref().and_then(peer_selector);
    let nodes = match pool {
        Some(sel) => list_all(nodes_api, "nodes", ListParams::default().labels(&sel)).await?,
        None => vec![node],
    };
    let pods = list_all(
        Api::<Pod>::all(client.clone()),
        "pods",
        ListParams::default().fields(&format!("spec.nodeName={name}")),
    )
    .await?;
    // Events about the node, then about each pod on it (8 requests at a time).
    let mut wanted: Vec<(Option<String>, String, &'static str)> =
        vec![(None, name.to_string(), "Node")];
    for p in &pods {
        if let (Some(ns), Some(n)) = (&p.metadata.namespace, &p.metadata.name) {
            wanted.push((Some(ns.clone()), n.clone(), "Pod"));
        }
    }
    let lists: Vec<Result<Vec<Event>>> = futures::stream::iter(wanted)
        .map(|(ns, obj, kind)| {
            let api: Api<Event> = match &ns {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            };
            let lp = ListParams::default().fields(&format!(
                "involvedObject.kind={kind},involvedObject.name={obj}"
            ));
            async move { list_all(api, "events", lp).await }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut events = Vec::new();
    for l in lists {
        events.extend(l?);
    }
    Ok(Read {
        nodes,
        pods,
        events,
        quotas: Vec::new(),
        all_pods: false,
        unread: Vec::new(),
    })
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

/// The last `lines` of the logs of at most `limit` troubled GPU containers, 8 at a time; and the
/// containers whose log could not be read, with why.
pub async fn logs(
    client: &Client,
    pods: &[Pod],
    limit: usize,
    lines: i64,
) -> (Vec<LogExcerpt>, Vec<String>) {
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
    let results: Vec<Result<LogExcerpt, ObserveError>> = futures::stream::iter(wanted)
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
                    Ok(text) => Ok(LogExcerpt {
                        namespace: ns,
                        pod,
                        container,
                        previous,
                        text,
                    }),
                    Err(source) => Err(ObserveError::Kube {
                        what: format!(
                            "{ns}/{pod} container {container}{}: {}",
                            if previous { " (previous)" } else { "" },
                            short_kube_error(&source)
                        ),
                        source,
                    }),
                }
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for r in results {
        match r {
            Ok(l) => ok.push(l),
            Err(e) => failed.push(e.to_string()),
        }
    }
    failed.sort();
    (ok, failed)
}

/// The API server's message for an API error, else the error.
fn short_kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// The label selector of a node's pool peers (the doctor compares drivers within a pool), by
/// the doctor's own list of pool labels.
fn peer_selector(labels: &std::collections::BTreeMap<String, String>) -> Option<String> {
    gpuops_doctor::POOL_LABELS
        .iter()
        .find_map(|k| labels.get(*k).map(|v| format!("{k}={v}")))
}

#[cfg(test)]
mod tests {
    use super::peer_selector;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn peers_are_read_by_the_most_specific_pool_label_down_to_the_instance_type() {
        let node = labels(&[
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
            ("karpenter.sh/nodepool", "gpu"),
        ]);
        assert_eq!(
            peer_selector(&node).as_deref(),
            Some("karpenter.sh/nodepool=gpu")
        );
        // The doctor groups unlabelled nodes by instance type; the peers it compares must be read
        // the same way (the two lists had drifted apart on exactly this label).
        let node = labels(&[("node.kubernetes.io/instance-type", "p5.48xlarge")]);
        assert_eq!(
            peer_selector(&node).as_deref(),
            Some("node.kubernetes.io/instance-type=p5.48xlarge")
        );
        assert_eq!(peer_selector(&labels(&[("zone", "a")])), None);
    }
}
