//! The real Karpenter (KWOK provider) in the test bed, on scenario (a) of issue 16: one pending
//! pod asking 4 GPUs, nodes whose GPUs appear after the device-plugin delay. Only what is certain
//! is asserted (the pod gets bound to a node Karpenter launched); the counts are printed.
//!
//! Needs GPUOPS_K8S_BIN and `eval $(tests/k8s/build.sh karpenter)` (GPUOPS_KARPENTER_BIN);
//! scripts/test sets both and runs this with `--ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::scenario::{self, Scenario};
use gpuops_testbed::{Cluster, ClusterOptions, KarpenterOptions};
use std::time::Duration;

#[test]
#[ignore = "needs the control plane and Karpenter (GPUOPS_K8S_BIN, GPUOPS_KARPENTER_BIN): run scripts/test"]
fn karpenter_binds_a_four_gpu_pod_from_zero_on_nodes_whose_gpus_come_late() {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        controller_manager: true,
        apiserver_args: KarpenterOptions::apiserver_args(),
        ..ClusterOptions::default()
    })
    .unwrap();
    let karpenter = cluster
        .start_karpenter(KarpenterOptions::default())
        .unwrap();
    let outcome = scenario::run(
        &cluster,
        &karpenter,
        &Scenario::scale_from_zero(),
        "default",
        Duration::from_secs(240),
        Duration::from_secs(10),
    )
    .unwrap();
    eprintln!("{}\n{}", scenario::Outcome::header(), outcome.row());
    eprintln!("node claims: {:?}", karpenter.node_claims().unwrap());
    if !outcome.all_running {
        let log =
            std::fs::read_to_string(karpenter.dir().join("karpenter.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let pods = cluster.kubectl(&["describe", "pods"]).unwrap_or_default();
        panic!(
            "the pod did not run: {outcome:?}\n{pods}\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    assert!(outcome.launched >= 1, "{outcome:?}");
    let node = cluster
        .kubectl(&["get", "pod", "gpu-pod-0", "-o", "jsonpath={.spec.nodeName}"])
        .unwrap();
    let claims = karpenter.node_claims().unwrap();
    assert!(
        claims
            .iter()
            .any(|c| c.node.as_deref() == Some(node.as_str())),
        "bound to {node}, a node of one of Karpenter's NodeClaims: {claims:?}"
    );
}
