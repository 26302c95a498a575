//! ResourceClaims as demand on the real scheduler with the DRA gates: a claim selecting the
//! product of a pool at zero scales that pool from zero (the cheaper pool's GPU does not match),
//! and a claim matching no pool is reported and buys nothing.
//!
//! The KWOK nodes run no agent: when the bought node appears the test publishes the
//! ResourceSlices that gpuops-dra models for a new node of that pool, as the agent would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{CapiOptions, Cluster, ClusterApi, ClusterOptions, NodeShape, PoolSpec};
use std::time::Duration;

mod common;
use common::Controller;

fn pool(name: &str, product: &str, price: &str) -> PoolSpec {
    let mut shape = NodeShape::gpu(product, "nvidia.com/gpu", 8);
    shape.boot_delay = Duration::from_secs(2);
    shape.devices_delay = Duration::from_secs(3);
    let mut p = PoolSpec::new(name, shape);
    p.annotations
        .insert("gpuops.io/price-per-hour".into(), price.into());
    p.annotations
        .insert("gpuops.io/gpu-product".into(), product.into());
    p
}

fn claim_and_pod(name: &str, selector: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: default}}
spec:
  devices:
    requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
            - cel: {{expression: "{selector}"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers:
    - name: c
      image: registry.k8s.io/pause:3.10
      resources: {{claims: [{{name: gpu}}]}}
"#
    )
}

/// The slices a new node of the H100 pool publishes (the controller's own model of it, which is
/// gpuops-dra's, the agent's), as a List for kubectl apply.
fn slices_for(node: &str) -> String {
    let model = gpuops_claims::node::devices(&gpuops_claims::node::NewNode {
        model: gpuops_claims::demand::model_for_product("NVIDIA-H100-80GB-HBM3").unwrap(),
        gpus: 8,
        dynamic_mig: false,
    });
    let items: Vec<serde_json::Value> = gpuops_dra::resource_slices(node, 1, &model)
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            serde_json::json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": format!("{node}-gpu-{i}")},
                "spec": spec,
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

fn machines_of(capi: &ClusterApi, pool: &str) -> usize {
    capi.machines(pool).unwrap().len()
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_claim_for_a_pools_product_scales_it_from_zero_and_a_claim_matching_no_pool_buys_nothing() {
    let cluster = Cluster::start(
        ClusterOptions {
            kwok: true,
            controller_manager: true,
            ..ClusterOptions::default()
        }
        .with_dra(),
    )
    .unwrap();
    let capi = cluster.start_cluster_api(CapiOptions::default()).unwrap();
    // The cheaper pool's GPU does not match the claim: buying it would ignore the selector.
    capi.add_pool(&pool("a100", "NVIDIA-A100-SXM4-40GB", "10"))
        .unwrap();
    capi.add_pool(&pool("h100", "NVIDIA-H100-80GB-HBM3", "40"))
        .unwrap();
    let classes: Vec<serde_json::Value> = gpuops_dra::classes::device_classes(false)
        .into_iter()
        .map(|c| {
            let mut v = serde_json::to_value(&c).unwrap();
            v["apiVersion"] = "resource.k8s.io/v1".into();
            v["kind"] = "DeviceClass".into();
            v
        })
        .collect();
    cluster
        .apply(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": classes}).to_string(),
        )
        .unwrap();
    cluster
        .apply(&claim_and_pod(
            "wants-h100",
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3' \
             && device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0",
        ))
        .unwrap();
    cluster
        .apply(&claim_and_pod(
            "wants-b300",
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B300'",
        ))
        .unwrap();
    let controller = Controller::start(&cluster, "solo", false);

    gpuops_testbed::wait_until("an H100 Machine", Duration::from_secs(120), || {
        machines_of(&capi, "h100") >= 1
    })
    .unwrap();
    // Stand in for the agent: when the node registers, publish its slices.
    let mut node = None;
    gpuops_testbed::wait_until("the H100 node", Duration::from_secs(120), || {
        node = capi
            .machines("h100")
            .ok()
            .and_then(|ms| ms.into_iter().find_map(|m| m.node));
        node.is_some()
    })
    .unwrap();
    cluster.apply(&slices_for(&node.unwrap())).unwrap();
    let describe = || cluster.kubectl(&["describe", "pods"]).unwrap_or_default();
    gpuops_testbed::wait_until(
        "the H100 claim's pod running",
        Duration::from_secs(120),
        || {
            cluster
                .kubectl(&["get", "pod", "wants-h100", "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|p| p == "Running")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", describe()));
    // Three more passes with the pod running: still one node for one need, none of the
    // cheaper pool.
    let passes = || {
        controller
            .metric("gpuops_autoscaler_decisions_total")
            .unwrap_or(0.0)
    };
    let now = passes();
    gpuops_testbed::wait_until("three more decisions", Duration::from_secs(60), || {
        passes() >= now + 3.0
    })
    .unwrap();
    assert_eq!(machines_of(&capi, "h100"), 1);
    assert_eq!(machines_of(&capi, "a100"), 0);
    let events = cluster
        .kubectl(&[
            "get",
            "events",
            "-A",
            "-o",
            "custom-columns=R:.reason,N:.involvedObject.name,M:.message",
        ])
        .unwrap_or_default();
    assert!(
        events
            .lines()
            .any(|l| l.contains("NotTriggerScaleUp") && l.contains("wants-b300")),
        "{events}"
    );
    assert!(
        events
            .lines()
            .any(|l| l.contains("TriggeredScaleUp") && l.contains("wants-h100")),
        "{events}"
    );
}
