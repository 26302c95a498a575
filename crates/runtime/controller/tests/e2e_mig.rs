//! The MIG demand reconciler on the test bed: `gpuops controller --mig` in this process, a
//! harness node running the real agent (`gpuops agent` on nvml-sim, MIG flow reading its
//! config from the ConfigMap through the API) and the real scheduler.
//!
//! Needs GPUOPS_K8S_BIN and GPUOPS_CAPI_BIN and the `gpuops` binary built next to this test
//! (scripts/test builds both in one `cargo test`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::{ChildGuard, Cluster, HarnessNode, wait_until};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;

const CONFIGMAP: &str = "gpuops-mig-config";
const NODE: &str = "mig-node";

const MIG_CONFIGS: &str = "version: v1
mig-configs:
  all-disabled:
  - devices: all
    mig-enabled: false
  all-1g.10gb:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.10gb: 7
";

/// The `gpuops` binary of this build (`target/<profile>/gpuops`, next to `deps/`).
fn gpuops_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("gpuops"))
        .unwrap();
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build -p gpuops --features test-hooks)",
        bin.display()
    );
    bin
}

fn gpuops(args: &[&str]) -> String {
    let o = Command::new(gpuops_binary()).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "gpuops {args:?}: {text}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `gpuops agent` on `node`, stopped (SIGTERM, then SIGKILL) when dropped.
fn start_agent(
    cluster: &Cluster,
    node: &HarnessNode,
    sim: &Path,
    env: &[(&str, &str)],
) -> ChildGuard {
    let mut cmd = Command::new(gpuops_binary());
    cmd.arg("agent")
        .args([
            "--interval",
            "1s",
            "--node-name",
            &node.name,
            "--kubernetes",
        ])
        .arg("--sim-state")
        .arg(sim)
        .arg("--mig-config-file")
        .arg(cluster.dir().join("mig-config.yaml"))
        .args([
            "--mig-config-configmap",
            &format!("default/{CONFIGMAP}"),
            "--mig-drain-timeout",
            "10s",
            "--mig-retry",
            "2s",
            "--node-resync",
            "3s",
        ])
        .arg("--device-plugin-dir")
        .arg(node.plugin_dir())
        .arg("--pod-resources-socket")
        .arg(node.pod_resources_socket())
        .env("KUBECONFIG", cluster.kubeconfig())
        .env("MIG_STRATEGY", "mixed")
        .env("GPUOPS_METRICS_ADDRESS", "127.0.0.1:0")
        .env_remove("MIG_PARTED_HOOKS_FILE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    ChildGuard::spawn("gpuops agent", cmd, &cluster.dir().join("agent.log")).unwrap()
}

fn controller(cluster: &Cluster, mig: gpuops_autoscale::MigConfig) -> common::Controller {
    common::Controller::start_with(cluster.kubeconfig(), "solo", false, |c| {
        c.mig = Some(gpuops_controller::mig::MigOptions {
            configmap: CONFIGMAP.into(),
            decision: mig,
        });
    })
}

fn windows(min_interval: Duration, failed_backoff: Duration) -> gpuops_autoscale::MigConfig {
    gpuops_autoscale::MigConfig {
        // Creation times have whole seconds: an idle window of 1 s could split one burst into
        // two batches.
        batch_idle: Duration::from_secs(2),
        batch_max: Duration::from_secs(6),
        min_interval,
        failed_backoff,
    }
}

/// Waits until the controller published a status at least `after` past now: every pass it
/// makes until then is one that could have acted.
fn passes_for(cluster: &Cluster, after: Duration) {
    let until = gpuops_kube::rfc3339(gpuops_kube::now_secs() + after.as_secs());
    wait_until(
        "the controller deciding past the window",
        after + Duration::from_secs(60),
        || {
            serde_json::from_str::<serde_json::Value>(&status(cluster))
                .ok()
                .and_then(|s| s["time"].as_str().map(|t| t >= until.as_str()))
                .unwrap_or(false)
        },
    )
    .unwrap();
}

fn count(events: &str, reason: &str) -> usize {
    events
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(reason))
        .count()
}

/// Re-partitions in the controller's decision history (a repeated event would be folded into
/// one Event series; the history has a line per change).
fn repartitions(cluster: &Cluster) -> usize {
    serde_json::from_str::<serde_json::Value>(&status(cluster))
        .ok()
        .and_then(|s| {
            s["decisions"].as_array().map(|d| {
                d.iter()
                    .filter(|l| {
                        l.as_str()
                            .is_some_and(|l| l.contains("re-partitioning node"))
                    })
                    .count()
            })
        })
        .unwrap_or(0)
}

fn node_json(cluster: &Cluster) -> serde_json::Value {
    cluster.get_json(&["node", NODE]).unwrap()
}

fn allocatable(cluster: &Cluster, resource: &str) -> i64 {
    node_json(cluster)["status"]["allocatable"][resource]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn label(cluster: &Cluster, key: &str) -> Option<String> {
    node_json(cluster)["metadata"]["labels"][key]
        .as_str()
        .map(str::to_string)
}

fn phase(cluster: &Cluster, pod: &str) -> String {
    cluster
        .kubectl(&["get", "pod", pod, "-o", "jsonpath={.status.phase}"])
        .unwrap_or_default()
}

fn pod(name: &str, resource: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: example.invalid/app:1\n    resources:\n      limits:\n        {resource}: \"1\"\n"
    )
}

/// MIG device UUIDs on the simulated GPUs.
fn mig_uuids(sim: &Path) -> Vec<String> {
    let inv: serde_json::Value = serde_json::from_str(&gpuops(&[
        "inventory",
        "--sim-state",
        sim.to_str().unwrap(),
        "-o",
        "json",
    ]))
    .unwrap();
    inv["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["mig_devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|m| m["uuid"].as_str().map(str::to_string))
        .collect()
}

fn status(cluster: &Cluster) -> String {
    common::status_json(cluster).unwrap_or_default()
}

fn events(cluster: &Cluster) -> String {
    cluster
        .kubectl(&[
            "get",
            "events",
            "-A",
            "-o",
            "custom-columns=R:.reason,O:.regarding.name,M:.note",
        ])
        .unwrap_or_default()
}

/// A test bed with one harness MIG node: 2x A100 80GB, both GPUs at 7x 1g.10gb, its agent
/// following the ConfigMap.
fn mig_bed(
    env: &[(&str, &str)],
) -> (
    Cluster,
    gpuops_testbed::ClusterApi,
    HarnessNode,
    PathBuf,
    ChildGuard,
) {
    let (cluster, capi) = common::bed();
    let node = HarnessNode::start(&cluster, NODE).unwrap();
    let fleet = cluster.dir().join("a100.yaml");
    std::fs::write(&fleet, "gpus:\n- model: A100-SXM4-80GB\n  count: 2\n").unwrap();
    let sim = cluster.dir().join("sim");
    gpuops(&[
        "sim",
        "init",
        "--fleet",
        fleet.to_str().unwrap(),
        "--state",
        sim.to_str().unwrap(),
    ]);
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": "default"},
        "data": {"config.yaml": MIG_CONFIGS},
    });
    cluster.apply(&cm.to_string()).unwrap();
    cluster
        .kubectl(&["label", "node", NODE, "nvidia.com/mig.config=all-1g.10gb"])
        .unwrap();
    let agent = start_agent(&cluster, &node, &sim, env);
    wait_until("14x mig-1g.10gb", Duration::from_secs(90), || {
        allocatable(&cluster, "nvidia.com/mig-1g.10gb") == 14
            && label(&cluster, "nvidia.com/mig.config.state").as_deref() == Some("success")
            && node_json(&cluster)["metadata"]["annotations"]["gpuops.io/mig.layout"]
                .as_str()
                .is_some_and(|l| l.contains("all-1g.10gb"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.output()));
    (cluster, capi, node, sim, agent)
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn pending_3g_pods_re_partition_free_capacity_keep_busy_instances_and_buy_nothing() {
    let (cluster, _capi, node, sim, agent) = mig_bed(&[]);
    // One 1g.10gb instance busy before the change.
    cluster
        .apply(&pod("small", "nvidia.com/mig-1g.10gb"))
        .unwrap();
    wait_until("the 1g.10gb pod running", Duration::from_secs(60), || {
        phase(&cluster, "small") == "Running"
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.output()));
    let before = mig_uuids(&sim);
    assert_eq!(before.len(), 14, "{before:?}");
    // The agent publishes that a pod holds it.
    wait_until(
        "the busy instance published",
        Duration::from_secs(30),
        || {
            node_json(&cluster)["metadata"]["annotations"]["gpuops.io/mig.layout"]
                .as_str()
                .is_some_and(|l| l.contains("\"busy\":true"))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.output()));

    let _controller = controller(
        &cluster,
        windows(Duration::from_secs(600), Duration::from_secs(600)),
    );
    // One apply: the two pods are one demand, inside one batch.
    cluster
        .apply(&format!(
            "{}---\n{}",
            pod("big-0", "nvidia.com/mig-3g.40gb"),
            pod("big-1", "nvidia.com/mig-3g.40gb")
        ))
        .unwrap();
    wait_until(
        "both 3g.40gb pods running",
        Duration::from_secs(120),
        || phase(&cluster, "big-0") == "Running" && phase(&cluster, "big-1") == "Running",
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\n{}\n{}\n{}",
            status(&cluster),
            events(&cluster),
            cluster
                .kubectl(&["get", "node", NODE, "-o", "yaml"])
                .unwrap_or_default(),
            agent.output()
        )
    });
    assert_eq!(phase(&cluster, "small"), "Running");
    let config = label(&cluster, "nvidia.com/mig.config").unwrap();
    assert!(config.starts_with("gpuops-"), "{config}");
    assert_eq!(allocatable(&cluster, "nvidia.com/mig-3g.40gb"), 2);
    // The busy instance kept its UUID: every instance the pod could hold is still there.
    let after = mig_uuids(&sim);
    let held = node_devices(&node, "small");
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(after.contains(&held[0]), "{held:?} not in {after:?}");
    assert!(before.contains(&held[0]));
    // The generated config is in the ConfigMap, next to the user's.
    let text = cluster
        .kubectl(&[
            "get",
            "configmap",
            CONFIGMAP,
            "-o",
            "jsonpath={.data.config\\.yaml}",
        ])
        .unwrap();
    assert!(
        text.contains(&config) && text.contains("all-1g.10gb"),
        "{text}"
    );
    // No node bought, and the decision is explained on the node and the pods.
    let machines = cluster
        .kubectl(&["get", "machines.cluster.x-k8s.io", "-A", "-o", "name"])
        .unwrap_or_default();
    assert!(machines.trim().is_empty(), "{machines}");
    let ev = events(&cluster);
    assert!(ev.contains("MIGRepartition"), "{ev}");
    assert!(ev.contains("TriggeredMIGRepartition"), "{ev}");
}

fn node_devices(node: &HarnessNode, pod: &str) -> Vec<String> {
    node.allocation("default", pod)
        .map(|a| a.devices("nvidia.com/mig-1g.10gb"))
        .unwrap_or_default()
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn demand_that_flaps_inside_the_batch_window_changes_nothing() {
    let (cluster, _capi, _node, _sim, agent) = mig_bed(&[]);
    let mut mig = windows(Duration::from_secs(5), Duration::from_secs(600));
    mig.batch_idle = Duration::from_secs(15);
    mig.batch_max = Duration::from_secs(30);
    let _controller = controller(&cluster, mig);
    for round in 0..2 {
        let name = format!("flap-{round}");
        cluster
            .apply(&pod(&name, "nvidia.com/mig-3g.40gb"))
            .unwrap();
        // Seen pending (the scheduler found no node) before it goes away again.
        wait_until("the pod unschedulable", Duration::from_secs(30), || {
            cluster
                .kubectl(&[
                    "get",
                    "pod",
                    &name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
                ])
                .is_ok_and(|r| r == "Unschedulable")
        })
        .unwrap();
        cluster
            .kubectl(&["delete", "pod", &name, "--wait=true"])
            .unwrap();
    }
    passes_for(&cluster, Duration::from_secs(20));
    let ev = events(&cluster);
    assert_eq!(count(&ev, "MIGRepartition"), 0, "{ev}\n{}", agent.output());
    assert_eq!(repartitions(&cluster), 0, "{}", status(&cluster));
    assert_eq!(
        label(&cluster, "nvidia.com/mig.config").as_deref(),
        Some("all-1g.10gb")
    );
    assert_eq!(allocatable(&cluster, "nvidia.com/mig-1g.10gb"), 14);
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn a_failed_change_goes_back_and_is_not_retried_on_that_node_within_the_backoff() {
    // A pre-apply-config hook that fails while the flag file exists: a real failed apply.
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail");
    let hooks = dir.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        format!(
            "version: v1\nhooks:\n  pre-apply-config:\n  - command: /bin/sh\n    args: [\"-c\", \"test ! -e {}\"]\n",
            flag.display()
        ),
    )
    .unwrap();
    let (cluster, _capi, _node, _sim, agent) =
        mig_bed(&[("MIG_PARTED_HOOKS_FILE", hooks.to_str().unwrap())]);
    std::fs::write(&flag, "").unwrap();
    // The minimum interval is short: only the failure's back-off can keep the node unchosen.
    let _controller = controller(
        &cluster,
        windows(Duration::from_secs(3), Duration::from_secs(600)),
    );
    cluster
        .apply(&pod("big", "nvidia.com/mig-3g.40gb"))
        .unwrap();
    wait_until(
        "the failed change put back",
        Duration::from_secs(90),
        || {
            count(&events(&cluster), "MIGRepartitionFailed") >= 1
                && label(&cluster, "nvidia.com/mig.config").as_deref() == Some("all-1g.10gb")
                && label(&cluster, "nvidia.com/mig.config.state").as_deref() == Some("success")
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n{}\n{}\n{}",
            status(&cluster),
            events(&cluster),
            agent.output()
        )
    });
    // The state label comes before the kubelet's next look at the device plugin.
    wait_until(
        "14x 1g.10gb advertised again",
        Duration::from_secs(30),
        || allocatable(&cluster, "nvidia.com/mig-1g.10gb") == 14,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.output()));
    // Well past the minimum interval and the batch window, the pod still pending: the node
    // was not chosen again.
    passes_for(&cluster, Duration::from_secs(15));
    assert_eq!(repartitions(&cluster), 1, "{}", status(&cluster));
    assert_eq!(phase(&cluster, "big"), "Pending");
    assert_eq!(
        label(&cluster, "nvidia.com/mig.config").as_deref(),
        Some("all-1g.10gb")
    );
    let st = status(&cluster);
    assert!(st.contains("default/big"), "{st}");
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
fn with_no_mig_capacity_one_node_is_bought_with_the_layout_the_pods_need() {
    let (cluster, capi) = common::bed();
    let mut shape =
        gpuops_testbed::NodeShape::gpu("NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-3g.40gb", 2);
    shape
        .labels
        .insert("nvidia.com/gpu.count".into(), "1".into());
    // The pool's MIG config: the node comes up with it (the agent would apply it at boot).
    shape
        .labels
        .insert("nvidia.com/mig.config".into(), "all-3g.40gb".into());
    let mut pool = gpuops_testbed::PoolSpec::new("a100", shape);
    for (k, v) in [
        ("gpuops.io/price-per-hour", "10"),
        ("gpuops.io/gpu-product", "NVIDIA-A100-SXM4-80GB"),
        ("gpuops.io/mig-config", "all-3g.40gb"),
        // One GPU per node (the shape's first device would say 2).
        (
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            "nvidia.com/gpu",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "1"),
    ] {
        pool.annotations.insert(k.into(), v.into());
    }
    capi.add_pool(&pool).unwrap();
    let _controller = controller(
        &cluster,
        windows(Duration::from_secs(600), Duration::from_secs(600)),
    );
    cluster
        .apply(&format!(
            "{}---\n{}",
            pod("big-0", "nvidia.com/mig-3g.40gb"),
            pod("big-1", "nvidia.com/mig-3g.40gb")
        ))
        .unwrap();
    wait_until(
        "both 3g.40gb pods running",
        Duration::from_secs(120),
        || phase(&cluster, "big-0") == "Running" && phase(&cluster, "big-1") == "Running",
    )
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", status(&cluster), events(&cluster)));
    // One node for one need, with the pool's layout, even though the decision ran again while
    // it booted.
    assert_eq!(capi.machines("a100").unwrap().len(), 1);
    let nodes = cluster
        .kubectl(&[
            "get",
            "nodes",
            "-l",
            "nvidia.com/mig.config=all-3g.40gb",
            "-o",
            "name",
        ])
        .unwrap();
    assert_eq!(nodes.lines().count(), 1, "{nodes}");
    let ev = events(&cluster);
    assert!(ev.contains("TriggeredScaleUp"), "{ev}");
    let st = status(&cluster);
    assert!(
        st.contains("buying 1 node(s) of pool default/a100 with MIG config all-3g.40gb"),
        "{st}"
    );
}

#[test]
#[ignore = "needs the control plane and Cluster API (GPUOPS_K8S_BIN, GPUOPS_CAPI_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn with_no_mig_capacity_a_node_is_bought_with_a_generated_layout_and_labelled_at_boot() {
    let (cluster, capi) = common::bed();
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP, "namespace": "default"},
        "data": {"config.yaml": MIG_CONFIGS},
    });
    cluster.apply(&cm.to_string()).unwrap();
    // The pool comes up with 7x 1g.10gb; a 3g.40gb pod needs a layout none of its nodes has.
    let mut shape =
        gpuops_testbed::NodeShape::gpu("NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-1g.10gb", 7);
    shape.devices.clear();
    shape
        .labels
        .insert("nvidia.com/gpu.count".into(), "1".into());
    shape
        .labels
        .insert("nvidia.com/mig.config".into(), "all-1g.10gb".into());
    // The test provider standing in for the agent: MIG devices follow the node's label.
    shape.mig_config_map = Some(format!("default/{CONFIGMAP}"));
    shape.devices_delay = Duration::from_secs(4);
    // The machine does not boot until the test lets it (below), so the controller's restart
    // falls between the scale-up and the node registering however loaded the machine is.
    shape.boot_delay = Duration::from_secs(3600);
    let mut pool = gpuops_testbed::PoolSpec::new("a100g", shape);
    for (k, v) in [
        ("gpuops.io/price-per-hour", "10"),
        ("gpuops.io/gpu-product", "NVIDIA-A100-SXM4-80GB"),
        ("gpuops.io/mig-config", "all-1g.10gb"),
        (
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            "nvidia.com/gpu",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "1"),
    ] {
        pool.annotations.insert(k.into(), v.into());
    }
    capi.add_pool(&pool).unwrap();
    // What the decision buys for one 3g.40gb and two 1g.10gb pods on an empty A100.
    let one_gpu = std::collections::BTreeMap::from([("1g.10gb".to_string(), 7u32)]);
    let expected = gpuops_autoscale::decide_mig(
        &[],
        &[
            ("big", "3g.40gb"),
            ("small-0", "1g.10gb"),
            ("small-1", "1g.10gb"),
        ]
        .map(|(n, p)| gpuops_autoscale::mig_demand::MigPod {
            key: format!("default/{n}"),
            created: 0,
            profile: p.into(),
            count: 1,
            cpu_milli: 0,
            memory_mib: 0,
        }),
        &[gpuops_autoscale::mig_demand::MigPool {
            name: "default/a100g".into(),
            model: "NVIDIA-A100-SXM4-80GB".into(),
            gpus: 1,
            price_per_hour: 10.0,
            room: 10,
            default_config: Some(("all-1g.10gb".into(), vec![one_gpu])),
            cpu_milli: u64::MAX,
            memory_mib: u64::MAX,
        }],
        &mut gpuops_autoscale::MigMemory::default(),
        60_000,
        &gpuops_autoscale::MigConfig {
            batch_idle: Duration::ZERO,
            ..gpuops_autoscale::MigConfig::default()
        },
    );
    assert_eq!(expected.scale_ups.len(), 1, "{expected:?}");
    let su = &expected.scale_ups[0];
    let config = su.config_name.clone();
    assert!(config.starts_with("gpuops-"), "{su:?}");
    assert_eq!(su.layout[0].get("3g.40gb"), Some(&1), "{su:?}");
    let first = controller(
        &cluster,
        windows(Duration::from_secs(600), Duration::from_secs(600)),
    );
    let owed = || {
        cluster
            .get_json(&["configmap", CONFIGMAP])
            .ok()
            .and_then(|cm| {
                cm["metadata"]["annotations"]["gpuops.io/mig.owed-configs"]
                    .as_str()
                    .map(str::to_string)
            })
    };
    cluster
        .apply(&format!(
            "{}---\n{}---\n{}",
            pod("big", "nvidia.com/mig-3g.40gb"),
            pod("small-0", "nvidia.com/mig-1g.10gb"),
            pod("small-1", "nvidia.com/mig-1g.10gb"),
        ))
        .unwrap();
    // Bought and owed; then the controller is gone before the node registers: a new one, with
    // nothing in memory, labels the node from the ConfigMap and buys nothing more.
    let buying = format!("buying 1 node(s) of pool default/a100g with MIG config {config}");
    wait_until("the pool owing the config", Duration::from_secs(60), || {
        owed().is_some_and(|o| o.contains(&config)) && status(&cluster).contains(&buying)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", status(&cluster), events(&cluster)));
    drop(first);
    assert!(
        capi.machines("a100g")
            .unwrap()
            .iter()
            .all(|m| m.node.is_none()),
        "the node registered before the restart: the test no longer covers it"
    );
    let _controller = controller(
        &cluster,
        windows(Duration::from_secs(600), Duration::from_secs(600)),
    );
    // Now the node may boot (Cluster API makes the infra machine a moment after the scale).
    let mut infra = String::new();
    wait_until("the pool's infra machine", Duration::from_secs(60), || {
        infra = cluster
            .kubectl(&[
                "get",
                "gpuopstestmachines.infrastructure.cluster.x-k8s.io",
                "-n",
                "default",
                "-o",
                "name",
            ])
            .unwrap_or_default();
        infra.lines().count() >= 1
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", status(&cluster)));
    assert_eq!(infra.lines().count(), 1, "{infra}");
    for m in infra.lines() {
        cluster
            .kubectl(&[
                "patch",
                m,
                "-n",
                "default",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"bootDelayMs":0}}"#,
            ])
            .unwrap();
    }
    wait_until("all three pods running", Duration::from_secs(120), || {
        ["big", "small-0", "small-1"]
            .iter()
            .all(|p| phase(&cluster, p) == "Running")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", status(&cluster), events(&cluster)));
    // Later passes buy nothing more: one need, one node.
    passes_for(&cluster, Duration::from_secs(5));
    let machines = capi.machines("a100g").unwrap();
    assert_eq!(machines.len(), 1, "{machines:?}");
    let node = machines[0].node.clone().unwrap();
    let n = cluster.get_json(&["node", &node]).unwrap();
    assert_eq!(
        n["metadata"]["labels"]["nvidia.com/mig.config"].as_str(),
        Some(config.as_str()),
        "{n}"
    );
    assert!(
        n["metadata"]["annotations"]["gpuops.io/mig.config.changed-at"].is_string(),
        "{n}"
    );
    assert_eq!(
        n["status"]["allocatable"]["nvidia.com/mig-3g.40gb"].as_str(),
        Some("1"),
        "{n}"
    );
    let text = cluster
        .kubectl(&[
            "get",
            "configmap",
            CONFIGMAP,
            "-o",
            "jsonpath={.data.config\\.yaml}",
        ])
        .unwrap();
    assert!(
        text.contains(&config) && text.contains("all-1g.10gb"),
        "{text}"
    );
    // The owed entry (on the ConfigMap) was popped when the node was labelled.
    let cm = cluster.get_json(&["configmap", CONFIGMAP]).unwrap();
    assert!(
        cm["metadata"]["annotations"]["gpuops.io/mig.owed-configs"].is_null(),
        "{cm}"
    );
    let ev = events(&cluster);
    assert_eq!(count(&ev, "MIGLayoutAtBoot"), 1, "{ev}");
    assert!(ev.contains("TriggeredScaleUp"), "{ev}");
    // The restarted controller bought nothing: the history, carried over from the first one,
    // has its one scale-up and no other.
    let st: serde_json::Value = serde_json::from_str(&status(&cluster)).unwrap();
    let buys: Vec<&str> = st["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d.as_str())
        .filter(|d| d.contains("buying"))
        .collect();
    assert_eq!(buys.len(), 1, "{st}");
    assert!(buys[0].contains(&buying), "{st}");
}
