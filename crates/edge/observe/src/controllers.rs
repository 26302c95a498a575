//! The controllers Warning events name (a ReplicaSet that cannot create pods, a Job, a
//! StatefulSet, a DaemonSet) and a ReplicaSet's Deployment, read one by one: the fixes for refused
//! pods are computed from their replicas and templates, and listing every ReplicaSet of a cluster
//! (old ones included) would cost far more than the few an event names.

use futures::StreamExt;
use gpuops_doctor::Controller;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Event;
use kube::{Api, Client};
use std::collections::BTreeSet;

/// At most this many objects are read: a cluster full of failing controllers gets the first ones
/// diagnosed and the rest quoted from their events.
const MOST: usize = 64;

/// Kinds read, as events name them.
const KINDS: &[&str] = &[
    "ReplicaSet",
    "Job",
    "StatefulSet",
    "DaemonSet",
    "Deployment",
];

/// The controllers named by Warning events, then the Deployments owning those ReplicaSets; and
/// one line per object that could not be read.
pub async fn read(client: &Client, events: &[Event]) -> (Vec<Controller>, Vec<String>) {
    let wanted = named(events);
    let (mut out, mut unread) = get_all(client, wanted.clone()).await;
    let owners: BTreeSet<(String, String, String)> = out
        .iter()
        .filter_map(|c| {
            let (kind, name) = c.owner.clone()?;
            Some((kind, c.namespace.clone(), name))
        })
        .filter(|k| KINDS.contains(&k.0.as_str()) && !wanted.contains(k))
        .collect();
    let (more, failed) = get_all(client, owners).await;
    out.extend(more);
    unread.extend(failed);
    (out, unread)
}

/// (kind, namespace, name) of every controller a Warning event is about.
fn named(events: &[Event]) -> BTreeSet<(String, String, String)> {
    events
        .iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| {
            let o = &e.involved_object;
            let kind = o.kind.clone()?;
            if !KINDS.contains(&kind.as_str()) {
                return None;
            }
            Some((kind, o.namespace.clone()?, o.name.clone()?))
        })
        .take(MOST)
        .collect()
}

async fn get_all(
    client: &Client,
    wanted: BTreeSet<(String, String, String)>,
) -> (Vec<Controller>, Vec<String>) {
    let results: Vec<Result<Option<Controller>, String>> = futures::stream::iter(wanted)
        .map(|(kind, ns, name)| {
            let client = client.clone();
            async move { get(client, &kind, &ns, &name).await }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut out = Vec::new();
    let mut unread = Vec::new();
    for r in results {
        match r {
            Ok(Some(c)) => out.push(c),
            // Gone since its event: nothing to compute a fix from, and nothing to fix.
            Ok(None) => {}
            Err(e) => unread.push(e),
        }
    }
    out.sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    (out, unread)
}

async fn get(
    client: Client,
    kind: &str,
    ns: &str,
    name: &str,
) -> Result<Option<Controller>, String> {
    let failed = |e: kube::Error| format!("{kind} {ns}/{name}: {e}");
    let base = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| Controller {
        kind: kind.to_string(),
        namespace: ns.to_string(),
        name: name.to_string(),
        owner: meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| (o.kind.clone(), o.name.clone())),
        ..Controller::default()
    };
    Ok(match kind {
        "ReplicaSet" => Api::<ReplicaSet>::namespaced(client, ns)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|o| Controller {
                replicas: o.spec.as_ref().and_then(|s| s.replicas).map(i64::from),
                current: o.status.as_ref().map(|s| i64::from(s.replicas)),
                template: o.spec.and_then(|s| s.template),
                ..base(&o.metadata)
            }),
        "Deployment" => Api::<Deployment>::namespaced(client, ns)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|o| Controller {
                replicas: o.spec.as_ref().and_then(|s| s.replicas).map(i64::from),
                current: o.status.as_ref().and_then(|s| s.replicas).map(i64::from),
                template: o.spec.map(|s| s.template),
                ..base(&o.metadata)
            }),
        "StatefulSet" => Api::<StatefulSet>::namespaced(client, ns)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|o| Controller {
                replicas: o.spec.as_ref().and_then(|s| s.replicas).map(i64::from),
                current: o.status.as_ref().map(|s| i64::from(s.replicas)),
                template: o.spec.map(|s| s.template),
                ..base(&o.metadata)
            }),
        "DaemonSet" => Api::<DaemonSet>::namespaced(client, ns)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|o| Controller {
                replicas: o
                    .status
                    .as_ref()
                    .map(|s| i64::from(s.desired_number_scheduled)),
                current: o
                    .status
                    .as_ref()
                    .map(|s| i64::from(s.current_number_scheduled)),
                template: o.spec.map(|s| s.template),
                ..base(&o.metadata)
            }),
        "Job" => Api::<Job>::namespaced(client, ns)
            .get_opt(name)
            .await
            .map_err(failed)?
            .map(|o| Controller {
                replicas: o
                    .spec
                    .as_ref()
                    .map(|s| i64::from(s.parallelism.unwrap_or(1))),
                current: o.status.as_ref().and_then(|s| s.active).map(i64::from),
                template: o.spec.map(|s| s.template),
                ..base(&o.metadata)
            }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;

    fn event(type_: &str, kind: &str, name: &str) -> Event {
        Event {
            type_: Some(type_.into()),
            involved_object: ObjectReference {
                kind: Some(kind.into()),
                namespace: Some("ml".into()),
                name: Some(name.into()),
                ..ObjectReference::default()
            },
            ..Event::default()
        }
    }

    #[test]
    fn only_controllers_that_warning_events_name_are_read() {
        let events = vec![
            event("Warning", "ReplicaSet", "train-7d9"),
            event("Warning", "ReplicaSet", "train-7d9"),
            event("Warning", "Job", "bench"),
            event("Normal", "StatefulSet", "db"),
            event("Warning", "Pod", "train-7d9-x"),
            event("Warning", "CronJob", "nightly"),
        ];
        let got: Vec<(String, String, String)> = named(&events).into_iter().collect();
        assert_eq!(
            got,
            vec![
                ("Job".into(), "ml".into(), "bench".into()),
                ("ReplicaSet".into(), "ml".into(), "train-7d9".into()),
            ]
        );
        // Bounded: a cluster full of failing controllers reads at most MOST of them.
        let many: Vec<Event> = (0..200)
            .map(|i| event("Warning", "ReplicaSet", &format!("rs-{i}")))
            .collect();
        assert!(named(&many).len() <= MOST);
    }
}
