//! The apiserver goes away in the middle of a scale-up: the controller keeps serving its probes
//! and metrics, keeps what it knew, retries with backoff and, once the apiserver is back,
//! converges without buying the same node twice.
//!
//! The outage lasts `GPUOPS_OUTAGE_SECS` seconds (default 30; the issue's scenario is 60).
//! Needs GPUOPS_K8S_BIN and GPUOPS_CAPI_BIN, like the other e2e files; scripts/test runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{NodeShape, PoolSpec};
use std::time::{Duration, Instant};

mod common;
use common::{Controller, bed};

fn outage() -> Duration {
    Duration::from_secs(
        std::env::var("GPUOPS_OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(30),
    )
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn an_apiserver_outage_mid_scale_up_neither_stops_the_probes_nor_buys_twice() {
    let (mut cluster, capi) = bed();
    let mut shape = NodeShape::gpu("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 8);
    shape.boot_delay = Duration::from_secs(3);
    shape.devices_delay = Duration::from_secs(6);
    let mut p = PoolSpec::new("h100", shape);
    p.max = 5;
    p.annotations
        .insert("gpuops.io/price-per-hour".into(), "40".into());
    capi.add_pool(&p).unwrap();
    let controller = Controller::start(&cluster, "solo", false);

    cluster
        .apply(
            r#"{"apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "trainer", "namespace": "default"},
  "spec": {"containers": [{"name": "cuda", "image": "example.invalid/cuda:12",
    "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "4"}}}]}}"#,
        )
        .unwrap();
    let replicas = |capi: &gpuops_testbed::ClusterApi| {
        capi.machine_deployment("h100")
            .ok()
            .and_then(|md| md["spec"]["replicas"].as_u64())
    };
    gpuops_testbed::wait_until(
        "the scale-up (MachineDeployment replicas 1)",
        Duration::from_secs(60),
        || replicas(&capi) == Some(1),
    )
    .unwrap();
    let errors_before = controller
        .metric("gpuops_autoscaler_action_errors_total")
        .unwrap();

    // The node is in flight (it boots in 3 s, gets GPUs 6 s later): the apiserver goes now.
    cluster.stop_apiserver();
    let down = Instant::now();
    let length = outage();
    let mut probes = 0;
    while down.elapsed() < length {
        let (code, body) = controller.get("/healthz").unwrap();
        assert_eq!(code, 200, "/healthz during the outage: {body}");
        let (code, body) = controller.get("/metrics").unwrap();
        assert_eq!(code, 200, "/metrics during the outage");
        assert!(body.contains("gpuops_autoscaler_decisions_total"), "{body}");
        probes += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    let (code, _) = controller.get("/readyz").unwrap();
    // Its caches still hold the last picture: it stays ready, it does not forget the node in
    // flight (which would buy it again once the apiserver answers).
    assert_eq!(code, 200, "ready on its caches during the outage");
    // Each failed pass (its status write) counts, and the backoff keeps them few.
    let errors_during = controller
        .metric("gpuops_autoscaler_action_errors_total")
        .unwrap();
    let failed = errors_during - errors_before;
    assert!(
        failed >= 1.0,
        "the outage was noticed: {failed} failed passes"
    );
    // Backoff doubles from 1 s up to 60 s: far fewer tries than one per resync (2 s) or per
    // watch wake-up.
    let ceiling = (length.as_secs_f64() / 2.0).max(4.0);
    assert!(
        failed <= ceiling,
        "{failed} failed passes in {length:?}: not backing off"
    );
    eprintln!("outage of {length:?}: {probes} probe rounds answered, {failed} failed passes");

    cluster.restart_apiserver().unwrap();
    let back = Instant::now();
    gpuops_testbed::wait_until("the pod Running", Duration::from_secs(180), || {
        cluster
            .kubectl(&["get", "pod", "trainer", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|s| s == "Running")
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}",
            cluster
                .kubectl(&["get", "machines.cluster.x-k8s.io,nodes,pods", "-A"])
                .unwrap_or_default()
        )
    });
    eprintln!(
        "converged {:?} after the apiserver came back",
        back.elapsed()
    );
    // Long enough for a second, wrong scale-up to show (a few resyncs and relists).
    let settle = Instant::now() + Duration::from_secs(12);
    while Instant::now() < settle {
        assert_eq!(replicas(&capi), Some(1), "scaled twice for one need");
        assert!(capi.machines("h100").unwrap().len() <= 1);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(capi.machines("h100").unwrap().len(), 1);
    let scale_ups = controller
        .metric("gpuops_autoscaler_nodes_bought_total")
        .unwrap();
    assert_eq!(scale_ups, 1.0, "one node bought in all");
    // The status it publishes once the apiserver is back still has the decision from before.
    let status = common::status_json(&cluster).unwrap();
    assert!(
        status.contains("triggered scale-up of pool default/h100 by 1 node"),
        "{status}"
    );
}
