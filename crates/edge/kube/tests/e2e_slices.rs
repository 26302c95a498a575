//! The ResourceSlice publisher against a real kube-apiserver (crates/testing/testbed): a pass
//! makes the node's slices equal to the desired set, an unchanged pass writes nothing (the
//! apiserver's defaulting does not count as a change), a change bumps the generation of every
//! slice, fewer slices delete the extras, nothing to offer removes them all, and another node's
//! slices are never touched.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_kube::{ClientOptions, SlicePublisher};
use gpuops_testbed::{Cluster, ClusterOptions};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::ListParams;
use std::collections::BTreeMap;
use std::time::Duration;

fn gpu(name: &str, product: &str) -> Device {
    Device {
        name: name.into(),
        attributes: Some(BTreeMap::from([
            (
                "type".to_string(),
                DeviceAttribute {
                    string: Some("gpu".into()),
                    ..DeviceAttribute::default()
                },
            ),
            (
                "productName".to_string(),
                DeviceAttribute {
                    string: Some(product.into()),
                    ..DeviceAttribute::default()
                },
            ),
        ])),
        ..Device::default()
    }
}

fn slice_of(devices: Vec<Device>) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: "gpu.nvidia.com".into(),
        pool: ResourcePool {
            name: "n1".into(),
            generation: 0,
            resource_slice_count: 0,
        },
        node_name: Some("n1".into()),
        devices: Some(devices),
        ..ResourceSliceSpec::default()
    }
}

/// name -> (generation, device names), of `node`'s slices.
async fn slices_of(api: &Api<ResourceSlice>, node: &str) -> BTreeMap<String, (i64, Vec<String>)> {
    let list = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .unwrap();
    list.items
        .into_iter()
        .map(|s| {
            let devices = s
                .spec
                .devices
                .unwrap_or_default()
                .into_iter()
                .map(|d| d.name)
                .collect();
            (
                s.metadata.name.unwrap_or_default(),
                (s.spec.pool.generation, devices),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its passes in order on one apiserver (its start costs seconds).
async fn the_publisher_keeps_the_nodes_slices_equal_to_the_desired_set() {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    for node in ["n1", "n2"] {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n"
            ))
            .unwrap();
    }
    // Another node's slice of the same driver: never touched.
    cluster
        .apply("apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: n2-gpu\nspec:\n  driver: gpu.nvidia.com\n  nodeName: n2\n  pool:\n    name: n2\n    generation: 7\n    resourceSliceCount: 1\n  devices:\n  - name: gpu-0\n")
        .unwrap();
    let options = ClientOptions {
        kubeconfig: Some(cluster.kubeconfig()),
        request_timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    };
    let client = options.client().await.unwrap();
    let api: Api<ResourceSlice> = Api::all(client.clone());
    let node: Node = Api::<Node>::all(client.clone()).get("n1").await.unwrap();
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: "n1".into(),
        uid: node.metadata.uid.clone().unwrap(),
        ..OwnerReference::default()
    };
    let publisher = SlicePublisher::new(client, "n1", "gpu.nvidia.com", options.request_timeout);

    let two = vec![
        slice_of(vec![gpu("gpu-0", "NVIDIA H100 80GB HBM3")]),
        slice_of(vec![gpu("gpu-1", "NVIDIA H100 80GB HBM3")]),
    ];
    let first = publisher.publish(&two, Some(owner.clone())).await.unwrap();
    assert_eq!((first.generation, first.applied, first.deleted), (1, 2, 0));
    let now = slices_of(&api, "n1").await;
    assert_eq!(
        now,
        BTreeMap::from([
            (
                "n1-gpu.nvidia.com-0".to_string(),
                (1, vec!["gpu-0".to_string()])
            ),
            (
                "n1-gpu.nvidia.com-1".to_string(),
                (1, vec!["gpu-1".to_string()])
            ),
        ])
    );
    let stored = api.get("n1-gpu.nvidia.com-0").await.unwrap();
    assert_eq!(stored.spec.pool.resource_slice_count, 2);
    assert_eq!(
        stored.metadata.owner_references.unwrap()[0].name,
        "n1",
        "owned by the Node, so the garbage collector removes them with it"
    );

    // The same set again: nothing written, the generation stays (the apiserver's defaults in the
    // stored spec are not a change).
    let again = publisher.publish(&two, Some(owner.clone())).await.unwrap();
    assert_eq!((again.generation, again.applied, again.deleted), (1, 0, 0));

    // gpu-1 into MIG mode: its whole-GPU device leaves, a MIG device comes; every slice of the pool
    // moves to generation 2.
    let changed = vec![
        slice_of(vec![gpu("gpu-0", "NVIDIA H100 80GB HBM3")]),
        slice_of(vec![gpu("gpu-1-mig-1g10gb-19-0", "NVIDIA H100 80GB HBM3")]),
    ];
    let second = publisher
        .publish(&changed, Some(owner.clone()))
        .await
        .unwrap();
    assert_eq!(
        (second.generation, second.applied, second.deleted),
        (2, 2, 0)
    );
    let now = slices_of(&api, "n1").await;
    assert!(now.values().all(|(g, _)| *g == 2), "{now:?}");
    assert_eq!(now["n1-gpu.nvidia.com-1"].1, ["gpu-1-mig-1g10gb-19-0"]);

    // One slice fewer: the extra is deleted, the pool recounted.
    let third = publisher
        .publish(&changed[..1], Some(owner.clone()))
        .await
        .unwrap();
    assert_eq!((third.generation, third.applied, third.deleted), (3, 1, 1));
    let now = slices_of(&api, "n1").await;
    assert_eq!(now.keys().collect::<Vec<_>>(), ["n1-gpu.nvidia.com-0"]);
    let stored = api.get("n1-gpu.nvidia.com-0").await.unwrap();
    assert_eq!(stored.spec.pool.resource_slice_count, 1);

    // A slice someone deleted by hand comes back at the next pass (level-triggered).
    api.delete("n1-gpu.nvidia.com-0", &Default::default())
        .await
        .unwrap();
    let repaired = publisher
        .publish(&changed[..1], Some(owner.clone()))
        .await
        .unwrap();
    assert_eq!(repaired.applied, 1);
    assert_eq!(slices_of(&api, "n1").await.len(), 1);

    // NVML missing: nothing to offer, so no slice at all (never an empty one), and a slice with
    // no devices is not written either.
    let gone = publisher
        .publish(&[slice_of(Vec::new())], Some(owner))
        .await
        .unwrap();
    assert_eq!((gone.generation, gone.applied, gone.deleted), (0, 0, 1));
    assert!(slices_of(&api, "n1").await.is_empty());

    // Node n2's slice is as it was.
    assert_eq!(
        slices_of(&api, "n2").await,
        BTreeMap::from([("n2-gpu".to_string(), (7, vec!["gpu-0".to_string()]))])
    );
}
