//! gpuops-kube against a real kube-apiserver on loopback (crates/testing/testbed): the node writer's
//! field managers, the resourceVersion-guarded taint patch under a concurrent change, events,
//! the node watch and paged lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_kube::{ClientOptions, NodeWriter, TaintWanted, list_all, watch_node};
use gpuops_testbed::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Api;
use kube::api::ListParams;
use std::collections::BTreeMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
async fn the_writer_keeps_its_keys_the_taint_survives_a_race_and_lists_are_paged() {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        controller_manager: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    cluster
        .apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n  labels:\n    team: vision\n")
        .unwrap();
    let options = ClientOptions {
        kubeconfig: Some(cluster.kubeconfig()),
        request_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let client = options.client().await.unwrap();
    let writer = NodeWriter::new(client.clone(), "n1", "gpuops-test", options.request_timeout);

    // One field manager's set: a key it stops writing goes, other owners' keys stay.
    let set = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    writer
        .apply_metadata(
            "gpuops-test-labels",
            &set(&[("a", "1"), ("b", "2")]),
            &BTreeMap::new(),
        )
        .await
        .unwrap();
    let node = writer
        .apply_metadata("gpuops-test-labels", &set(&[("a", "1")]), &BTreeMap::new())
        .await
        .unwrap();
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels.get("a").map(String::as_str), Some("1"));
    assert!(!labels.contains_key("b"), "{labels:?}");
    assert_eq!(labels.get("team").map(String::as_str), Some("vision"));
    assert!(
        node.metadata.managed_fields.is_none(),
        "managedFields are stripped"
    );

    // The taint patch from a stale read: the apiserver refuses it (409), the writer reads again,
    // and both the other owner's taint and ours end up on the node.
    let stale = writer.get().await.unwrap();
    cluster
        .kubectl(&["taint", "nodes", "n1", "dedicated=ml:NoSchedule"])
        .unwrap();
    let ours = TaintWanted {
        key: "gpuops.io/gpu-unhealthy".into(),
        value: "XidError".into(),
        effect: "NoSchedule".into(),
    };
    let node = writer
        .set_taint(&ours.key, Some(&ours), Some(stale))
        .await
        .unwrap();
    let keys: Vec<String> = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(
        keys.contains(&"dedicated".to_string()) && keys.contains(&ours.key),
        "{keys:?}"
    );
    let node = writer.set_taint(&ours.key, None, None).await.unwrap();
    let keys: Vec<String> = node
        .spec
        .unwrap()
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    // (The apiserver's admission adds node.kubernetes.io/not-ready to a Node without a kubelet.)
    assert!(
        keys.contains(&"dedicated".to_string()) && !keys.contains(&ours.key),
        "{keys:?}"
    );

    // An event on the node, where `kubectl describe node` looks.
    writer
        .event(true, "GPUTest", "Testing", "an event from gpuops-kube")
        .await
        .unwrap();
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            "involvedObject.name=n1",
            "-o",
            "jsonpath={.items[*].reason}",
        ])
        .unwrap();
    assert!(events.contains("GPUTest"), "{events}");

    // The watch delivers the node, then someone else's change.
    let (tx, mut rx) = tokio::sync::watch::channel(None::<std::sync::Arc<Node>>);
    let watching = tokio::spawn(watch_node(client.clone(), "n1".into(), tx));
    tokio::time::timeout(Duration::from_secs(20), rx.wait_for(|n| n.is_some()))
        .await
        .unwrap()
        .unwrap();
    cluster
        .kubectl(&["label", "node", "n1", "changed=yes"])
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        rx.wait_for(|n| {
            n.as_ref().is_some_and(|n| {
                n.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("changed"))
                    && n.metadata.managed_fields.is_none()
            })
        }),
    )
    .await
    .unwrap()
    .unwrap();
    drop(rx);
    tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .unwrap()
        .unwrap();

    // A paged list returns what one list does.
    let namespaces: Api<Namespace> = Api::all(client);
    let one = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    let paged = list_all(
        &namespaces,
        &ListParams::default(),
        1,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(one >= 3, "{one}");
    assert_eq!(paged.len(), one);
}
