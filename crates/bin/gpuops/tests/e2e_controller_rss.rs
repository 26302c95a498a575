//! The memory of the real `gpuops controller` process with a large cluster in its watch caches:
//! 1,000 GPU Nodes, 2 pods bound on each and 10,000 pending GPU pods (`GPUOPS_RSS_NODES`,
//! `GPUOPS_RSS_PENDING` change the sizes), created in the test bed's apiserver. It waits until
//! the controller has decided over all of them and published its status, then prints VmHWM
//! and VmRSS from /proc (the figure in docs/autoscaling.md).
//!
//! Needs GPUOPS_K8S_BIN (scripts/test sets it) and the Cluster API CRDs (GPUOPS_CAPI_BIN).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Creates `items` in lists of 500 (one kubectl call each).
fn create(cluster: &Cluster, items: Vec<Value>) {
    for chunk in items.chunks(500) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": chunk}).to_string();
        let file = cluster.dir().join("objects.json");
        std::fs::write(&file, list).unwrap();
        cluster
            .kubectl(&["create", "-f", &file.display().to_string(), "-o", "name"])
            .unwrap();
    }
}

fn pod(name: &str, node: Option<&str>, gpus: u32) -> Value {
    let mut spec = json!({"containers": [{"name": "cuda", "image": "example.invalid/cuda:12",
        "resources": {"requests": {"cpu": "1", "memory": "4Gi"},
            "limits": {"nvidia.com/gpu": gpus.to_string()}}}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "train"}},
        "spec": spec})
}

/// `(VmHWM, VmRSS)` in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn metric(port: u16, name: &str) -> Option<f64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN); creates 13,000 objects, a few minutes: run scripts/test"]
fn controller_rss_with_1000_nodes_and_10000_pending_pods_in_its_caches() {
    let (nodes, pending) = (
        size("GPUOPS_RSS_NODES", 1000),
        size("GPUOPS_RSS_PENDING", 10_000),
    );
    // No scheduler: the pending pods stay pending. No kubelets: the bound pods stay as they are.
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    let crds =
        std::path::PathBuf::from(std::env::var(gpuops_testbed::CAPI_BIN_ENV).unwrap()).join("crds");
    cluster
        .kubectl(&["create", "-f", &crds.display().to_string(), "-o", "name"])
        .unwrap();

    let started = Instant::now();
    let node_items: Vec<Value> = (0..nodes)
        .map(|i| {
            let resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110",
                "nvidia.com/gpu": "8"});
            json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": format!("gpu-{i:04}"), "labels": {
                    "kubernetes.io/hostname": format!("gpu-{i:04}"),
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                    "nvidia.com/gpu.count": "8"}},
                "status": {"capacity": resources, "allocatable": resources,
                    "conditions": [{"type": "Ready", "status": "True",
                        "reason": "KubeletReady", "message": "bench"}]}})
        })
        .collect();
    create(&cluster, node_items);
    let mut pods: Vec<Value> = Vec::new();
    for i in 0..nodes {
        let node = format!("gpu-{i:04}");
        pods.push(pod(&format!("bound-{i:04}-a"), Some(&node), 4));
        pods.push(pod(&format!("bound-{i:04}-b"), Some(&node), 4));
    }
    for i in 0..pending {
        pods.push(pod(&format!("pending-{i:05}"), None, 1 + (i % 4) as u32));
    }
    create(&cluster, pods);
    eprintln!(
        "created {nodes} nodes, {} bound and {pending} pending pods in {:.0?}",
        2 * nodes,
        started.elapsed()
    );

    let port = gpuops_testbed::free_port().unwrap();
    let log = cluster.dir().join("controller.log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuops"));
    cmd.args(["controller", "--kubeconfig"])
        .arg(cluster.kubeconfig())
        .args([
            "--namespace",
            "default",
            "--no-leader-election",
            "--metrics-address",
            &format!("127.0.0.1:{port}"),
        ]);
    // Stopped when the test ends, also on a panic.
    let controller = ChildGuard::spawn("gpuops controller", cmd, &log).unwrap();
    let pid = controller.id();
    let launched = Instant::now();
    let tail = || std::fs::read_to_string(&log).unwrap_or_default();

    // Synced: the first decision counted every pending pod (it runs once all caches listed).
    gpuops_testbed::wait_until(
        "the controller's first decision over every pending pod",
        Duration::from_secs(300),
        || {
            metric(port, "gpuops_autoscaler_pending_gpu_pods")
                .is_some_and(|n| n as usize == pending)
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", tail()));
    let synced = launched.elapsed();
    let at_sync = memory(pid);
    // Then the status, written after the events of that pass (one per pending pod).
    gpuops_testbed::wait_until(
        "the status ConfigMap listing the pending pods",
        Duration::from_secs(600),
        || {
            cluster
                .kubectl(&[
                    "get",
                    "configmap",
                    "gpuops-autoscaler-status",
                    "-o",
                    "jsonpath={.data.status\\.json}",
                ])
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|s| s["pending_total"] == json!(pending))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", tail()));
    let published = launched.elapsed();
    let decisions_before = metric(port, "gpuops_autoscaler_decisions_total").unwrap_or(0.0);
    // A few more passes over the same picture (resync 10 s): the steady state.
    gpuops_testbed::wait_until("two more decisions", Duration::from_secs(120), || {
        metric(port, "gpuops_autoscaler_decisions_total")
            .is_some_and(|d| d >= decisions_before + 2.0)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", tail()));
    let (hwm, rss) = memory(pid);
    let last = metric(port, "gpuops_autoscaler_decision_seconds").unwrap_or(-1.0);
    eprintln!(
        "controller ({} build) with {nodes} nodes, {} bound + {pending} pending pods cached: \
         synced in {:.1}s (VmRSS {} MiB), status published at {:.1}s; steady VmRSS {} MiB, \
         VmHWM {} MiB; last decision {:.0} ms",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        2 * nodes,
        synced.as_secs_f64(),
        at_sync.1 / 1024,
        published.as_secs_f64(),
        rss / 1024,
        hwm / 1024,
        last * 1000.0
    );
    // Generous: a regression that copies the caches per pass, or keeps every pass's
    // snapshot, shows as gigabytes.
    assert!(hwm < 1024 * 1024, "VmHWM {hwm} KiB");
}
