//! The agent on a Kubernetes node (the real apiserver and scheduler, the kubelet's real device
//! manager in the harness): GFD-compatible feature labels, the GPUHealthy condition and taint, and
//! the MIG label flow that replaces NVIDIA's MIG manager.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_testbed::{ChildGuard, Cluster, ClusterOptions, HarnessNode, User, wait_until};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// The agent with the Kubernetes side on; stopped on drop.
struct Agent(ChildGuard);

impl Agent {
    fn start(
        cluster: &Cluster,
        node: &HarnessNode,
        log: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Agent {
        let mut cmd = common::gpuops();
        cmd.arg("agent")
            .args(args)
            .args([
                "--interval",
                "1s",
                "--node-name",
                &node.name,
                "--kubernetes",
            ])
            .arg("--device-plugin-dir")
            .arg(node.plugin_dir())
            .arg("--pod-resources-socket")
            .arg(node.pod_resources_socket())
            .env("KUBECONFIG", cluster.kubeconfig());
        for (k, v) in env {
            cmd.env(k, v);
        }
        // Its own process group: killing the group also kills a `gpuops mig apply` it started.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Agent(ChildGuard::spawn("agent", cmd, log).unwrap())
    }

    fn log(&self) -> String {
        self.0.output()
    }

    /// Kills the agent and everything it started at once, as a node crash would.
    fn crash(&mut self) {
        self.0.kill_group();
    }
}

fn node_json(cluster: &Cluster, node: &str) -> serde_json::Value {
    cluster.get_json(&["node", node]).unwrap()
}

fn labels(cluster: &Cluster, node: &str) -> BTreeMap<String, String> {
    node_json(cluster, node)["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn allocatable(cluster: &Cluster, node: &str, resource: &str) -> i64 {
    node_json(cluster, node)["status"]["allocatable"][resource]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn condition(cluster: &Cluster, node: &str) -> Option<serde_json::Value> {
    node_json(cluster, node)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "GPUHealthy")
        .cloned()
}

fn taints(cluster: &Cluster, node: &str) -> Vec<String> {
    node_json(cluster, node)["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    format!(
                        "{}={}:{}",
                        t["key"].as_str().unwrap_or(""),
                        t["value"].as_str().unwrap_or(""),
                        t["effect"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn node_events(cluster: &Cluster, node: &str) -> Vec<String> {
    let v = cluster
        .get_json(&[
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("involvedObject.name={node}"),
        ])
        .unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e["reason"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn feature_labels_follow_gfd_and_a_fatal_xid_sets_the_condition_and_taint_until_recovery() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node").unwrap();
    cluster
        .kubectl(&["label", "node", "gpu-node", "team=vision"])
        .unwrap();
    let state = cluster.dir().join("sim");
    let state_s = state.to_str().unwrap().to_string();
    let o = common::run(&["sim", "init", "--fleet", "l4x4", "--state", &state_s]);
    assert!(o.status.success(), "{}", common::text(&o));

    // First with MIG_STRATEGY=single: GFD then writes nvidia.com/mig.strategy. Labels alongside
    // NVIDIA's device plugin (--no-device-plugin) take the strategy from the same config.
    let log1 = cluster.dir().join("agent-1.log");
    let mut agent = Agent::start(
        &cluster,
        &node,
        &log1,
        &["--sim-state", &state_s, "--no-device-plugin"],
        &[("MIG_STRATEGY", "single")],
    );
    wait_until("feature labels", Duration::from_secs(60), || {
        labels(&cluster, "gpu-node")
            .get("nvidia.com/mig.strategy")
            .map(String::as_str)
            == Some("single")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    drop(agent);

    let log2 = cluster.dir().join("agent-2.log");
    agent = Agent::start(
        &cluster,
        &node,
        &log2,
        &[
            "--sim-state",
            &state_s,
            "--taint-unhealthy",
            "--health-quiet-period",
            "4s",
        ],
        &[],
    );
    wait_until(
        "the single-strategy label removed",
        Duration::from_secs(60),
        || !labels(&cluster, "gpu-node").contains_key("nvidia.com/mig.strategy"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // The labels are exactly what GFD computes for this node (the crate's tests compare that
    // to NVIDIA's label sets), plus gpu.present and the timestamp; the user's label is kept.
    let node_labels = labels(&cluster, "gpu-node");
    let o = common::run(&["inventory", "--sim-state", &state_s, "-o", "json"]);
    let inv: gpuops_inventory::Inventory = serde_json::from_slice(&o.stdout).unwrap();
    let config = gpuops_resources::config::Config::effective(
        None,
        &gpuops_resources::config::Overrides::default(),
        &gpuops_resources::config::Overrides::default(),
    )
    .unwrap();
    let mut expected =
        gpuops_labels::gfd_labels(&inv, &config, &gpuops_labels::LabelContext::default()).unwrap();
    expected.insert("nvidia.com/gpu.present".into(), "true".into());
    let ours: BTreeMap<String, String> = node_labels
        .iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/") && k.as_str() != "nvidia.com/gfd.timestamp")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(ours, expected);
    assert_eq!(node_labels["nvidia.com/gpu.product"], "NVIDIA-L4");
    assert_eq!(node_labels["nvidia.com/gpu.count"], "4");
    assert_eq!(
        node_labels["nvidia.com/cuda.driver-version.full"],
        "580.105.08"
    );
    assert!(node_labels.contains_key("nvidia.com/gfd.timestamp"));
    assert_eq!(node_labels["team"], "vision", "labels of others stay");
    let healthy = condition(&cluster, "gpu-node").unwrap();
    assert_eq!(healthy["status"], "True", "{healthy}");

    // XID 79 on GPU 2: condition False with the XID and the action, taint on; recovery clears both.
    let o = common::run(&[
        "sim", "xid", "--state", &state_s, "--gpu", "2", "--xid", "79",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    wait_until(
        "GPUHealthy=False and the taint",
        Duration::from_secs(30),
        || {
            condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "False")
                && taints(&cluster, "gpu-node")
                    .iter()
                    .any(|t| t.starts_with("gpuops.io/gpu-unhealthy="))
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let c = condition(&cluster, "gpu-node").unwrap();
    assert_eq!(c["reason"], "XidError", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("79") && message.contains("GPU 2"),
        "{message}"
    );
    assert!(
        taints(&cluster, "gpu-node")
            .contains(&"gpuops.io/gpu-unhealthy=XidError:NoSchedule".to_string())
    );
    wait_until(
        "recovery after the quiet period",
        Duration::from_secs(30),
        || {
            condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "True")
                && taints(&cluster, "gpu-node").is_empty()
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // A non-fatal XID (13, an application fault) is not a node problem.
    let o = common::run(&[
        "sim", "xid", "--state", &state_s, "--gpu", "1", "--xid", "13",
    ]);
    assert!(o.status.success());
    // A GPU off the bus: GPULost until it is back.
    let o = common::run(&["sim", "lost", "--state", &state_s, "--gpu", "3"]);
    assert!(o.status.success());
    wait_until("GPULost", Duration::from_secs(30), || {
        condition(&cluster, "gpu-node")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "GPULost")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let o = common::run(&["sim", "reset", "--state", &state_s, "--gpu", "3"]);
    assert!(o.status.success());
    wait_until("back after the reset", Duration::from_secs(30), || {
        condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "True")
            && taints(&cluster, "gpu-node").is_empty()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn what_others_remove_comes_back_the_transition_time_survives_restarts_and_health_is_data() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node").unwrap();
    let state = cluster.dir().join("sim");
    let state_s = state.to_str().unwrap().to_string();
    let o = common::run(&["sim", "init", "--fleet", "l4x4", "--state", &state_s]);
    assert!(o.status.success(), "{}", common::text(&o));
    let args = [
        "--sim-state",
        &state_s,
        "--taint-unhealthy",
        "--node-resync",
        "3s",
    ];
    let mut agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-1.log"),
        &args,
        &[],
    );
    wait_until("labels and the condition", Duration::from_secs(60), || {
        labels(&cluster, "gpu-node").contains_key("nvidia.com/gpu.product")
            && condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "True")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let first = condition(&cluster, "gpu-node").unwrap();
    let since = first["lastTransitionTime"].clone();

    // The heartbeat moves on every resync; the transition time stays.
    wait_until("a newer heartbeat", Duration::from_secs(20), || {
        condition(&cluster, "gpu-node")
            .is_some_and(|c| c["lastHeartbeatTime"] != first["lastHeartbeatTime"])
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert_eq!(
        condition(&cluster, "gpu-node").unwrap()["lastTransitionTime"],
        since
    );

    // A restarted agent with the same status keeps it too.
    drop(agent);
    let beat = condition(&cluster, "gpu-node").unwrap()["lastHeartbeatTime"].clone();
    agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-2.log"),
        &args,
        &[],
    );
    wait_until("the new agent's heartbeat", Duration::from_secs(30), || {
        condition(&cluster, "gpu-node").is_some_and(|c| c["lastHeartbeatTime"] != beat)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert_eq!(
        condition(&cluster, "gpu-node").unwrap()["lastTransitionTime"],
        since,
        "the status did not change: neither should its transition time"
    );

    // Someone removes a label and rewrites the condition: both come back within a resync.
    cluster
        .kubectl(&["label", "node", "gpu-node", "nvidia.com/gpu.product-"])
        .unwrap();
    cluster
        .kubectl(&[
            "patch",
            "node",
            "gpu-node",
            "--subresource=status",
            "-p",
            r#"{"status":{"conditions":[{"type":"GPUHealthy","status":"Unknown","reason":"Tampered","message":"x"}]}}"#,
        ])
        .unwrap();
    wait_until(
        "the label and condition restored",
        Duration::from_secs(20),
        || {
            labels(&cluster, "gpu-node")
                .get("nvidia.com/gpu.product")
                .map(String::as_str)
                == Some("NVIDIA-L4")
                && condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "True")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // A fatal XID: taint, condition and the structured annotation say the same.
    let o = common::run(&[
        "sim", "xid", "--state", &state_s, "--gpu", "2", "--xid", "79",
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let report = || {
        node_json(&cluster, "gpu-node")["metadata"]["annotations"]
            [gpuops_labels::GPU_HEALTH_ANNOTATION]
            .as_str()
            .map(|a| gpuops_labels::HealthReport::from_annotation(a).unwrap())
    };
    wait_until(
        "the taint and the annotation",
        Duration::from_secs(30),
        || {
            taints(&cluster, "gpu-node")
                .contains(&"gpuops.io/gpu-unhealthy=XidError:NoSchedule".to_string())
                && report().is_some_and(|r| !r.problems.is_empty())
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let problem = report().unwrap().problems[0].clone();
    assert_eq!(problem.gpu_index, Some(2), "{problem:?}");
    assert_eq!(problem.kind, gpuops_labels::ProblemKind::Xid { xid: 79 });

    // The taint removed by hand comes back while the GPU is still unhealthy.
    cluster
        .kubectl(&["taint", "nodes", "gpu-node", "gpuops.io/gpu-unhealthy-"])
        .unwrap();
    wait_until("the taint restored", Duration::from_secs(20), || {
        taints(&cluster, "gpu-node")
            .contains(&"gpuops.io/gpu-unhealthy=XidError:NoSchedule".to_string())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    drop(agent);
}

fn agent_role(verbs: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: gpuops-agent-test\nrules:\n- apiGroups: [\"\"]\n  resources: [nodes, nodes/status]\n  verbs: [{verbs}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: gpuops-agent-test\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: gpuops-agent-test\nsubjects:\n- apiGroup: rbac.authorization.k8s.io\n  kind: User\n  name: gpuops-agent\n"
    )
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn a_refused_write_is_logged_once_and_retried_with_backoff_until_it_is_allowed() {
    let cluster = Cluster::start(ClusterOptions {
        users: vec![User::plain("gpuops-agent")],
        ..ClusterOptions::default()
    })
    .unwrap();
    let node = HarnessNode::start(&cluster, "gpu-node").unwrap();
    // The agent may read and watch its node but not write it yet.
    cluster.apply(&agent_role("get, list, watch")).unwrap();
    let state = cluster.dir().join("sim");
    let state_s = state.to_str().unwrap().to_string();
    let o = common::run(&["sim", "init", "--fleet", "l4x4", "--state", &state_s]);
    assert!(o.status.success(), "{}", common::text(&o));
    let kubeconfig = cluster.kubeconfig_for("gpuops-agent");
    let agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent.log"),
        &["--sim-state", &state_s],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    wait_until(
        "the refused write reported",
        Duration::from_secs(60),
        || agent.log().contains("retrying with backoff"),
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert!(!labels(&cluster, "gpu-node").contains_key("nvidia.com/gpu.product"));
    cluster
        .apply(&agent_role("get, list, watch, patch"))
        .unwrap();
    wait_until(
        "labels and condition once allowed",
        Duration::from_secs(90),
        || {
            labels(&cluster, "gpu-node").contains_key("nvidia.com/gpu.product")
                && condition(&cluster, "gpu-node").is_some_and(|c| c["status"] == "True")
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let log = agent.log();
    assert_eq!(
        log.matches("retrying with backoff").count(),
        1,
        "a lasting failure is logged once:\n{log}"
    );
    assert!(log.contains("written again"), "{log}");
}

/// GPU 0's GPU instances in the simulator's state (None while it is being replaced).
fn gpu_instances(state: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(state.join("state.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(v["gpus"][0]["gpu_instances"].clone())
}

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
  too-big:
  - devices: all
    mig-enabled: true
    mig-devices:
      3g.40gb: 2
      2g.20gb: 1
";

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn the_mig_label_flow_applies_configs_survives_bad_ones_busy_gpus_and_a_crash() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "mig-node").unwrap();
    let fleet = cluster.dir().join("a100.yaml");
    std::fs::write(&fleet, "gpus:\n- model: A100-SXM4-80GB\n  count: 1\n").unwrap();
    let state = cluster.dir().join("sim");
    let state_s = state.to_str().unwrap().to_string();
    let o = common::run(&[
        "sim",
        "init",
        "--fleet",
        fleet.to_str().unwrap(),
        "--state",
        &state_s,
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    let configs = cluster.dir().join("mig-configs.yaml");
    std::fs::write(&configs, MIG_CONFIGS).unwrap();
    let configs_s = configs.to_str().unwrap().to_string();
    let args = [
        "--sim-state",
        &state_s,
        "--mig-config-file",
        &configs_s,
        "--mig-drain-timeout",
        "4s",
        "--mig-retry",
        "2s",
        "--node-resync",
        "3s",
    ];
    let env = [("MIG_STRATEGY", "mixed")];
    let mut agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-1.log"),
        &args,
        &env,
    );
    wait_until("one whole GPU", Duration::from_secs(60), || {
        allocatable(&cluster, "mig-node", "nvidia.com/gpu") == 1
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let state_label = || {
        labels(&cluster, "mig-node")
            .get("nvidia.com/mig.config.state")
            .cloned()
    };

    // The seed's flow: label the node, the state goes pending -> success, allocatable follows.
    cluster
        .kubectl(&[
            "label",
            "node",
            "mig-node",
            "nvidia.com/mig.config=all-1g.10gb",
        ])
        .unwrap();
    wait_until("7x mig-1g.10gb", Duration::from_secs(60), || {
        state_label().as_deref() == Some("success")
            && allocatable(&cluster, "mig-node", "nvidia.com/mig-1g.10gb") == 7
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert_eq!(allocatable(&cluster, "mig-node", "nvidia.com/gpu"), 0);
    // A state label overwritten by someone else (or a write that failed) is put right from what
    // the flow knows, not left as it is.
    cluster
        .kubectl(&[
            "label",
            "node",
            "mig-node",
            "--overwrite",
            "nvidia.com/mig.config.state=pending",
        ])
        .unwrap();
    wait_until("the state label repaired", Duration::from_secs(20), || {
        state_label().as_deref() == Some("success")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let events = node_events(&cluster, "mig-node");
    assert!(
        events.iter().any(|e| e.starts_with("MIGConfigPending:")),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e.starts_with("MIGConfigApplied:")),
        "{events:?}"
    );

    let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: mig-pod\n  namespace: default\nspec:\n  containers:\n  - name: c\n    image: example.invalid/app:1\n    resources:\n      limits:\n        nvidia.com/mig-1g.10gb: \"1\"\n";
    cluster.apply(pod).unwrap();
    wait_until("the MIG pod running", Duration::from_secs(60), || {
        cluster
            .kubectl(&["get", "pod", "mig-pod", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|s| s == "Running")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // An infeasible config: failed with the slice explanation, nothing withdrawn.
    cluster
        .kubectl(&[
            "label",
            "node",
            "mig-node",
            "--overwrite",
            "nvidia.com/mig.config=too-big",
        ])
        .unwrap();
    wait_until("state failed", Duration::from_secs(60), || {
        state_label().as_deref() == Some("failed")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let reason =
        node_json(&cluster, "mig-node")["metadata"]["annotations"]["gpuops.io/mig.config.reason"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    assert!(
        reason.contains("too-big") && reason.contains("slices"),
        "{reason}"
    );
    assert_eq!(
        allocatable(&cluster, "mig-node", "nvidia.com/mig-1g.10gb"),
        7,
        "the node stays usable"
    );
    assert!(
        node_events(&cluster, "mig-node")
            .iter()
            .any(|e| e.starts_with("MIGConfigFailed:") && e.contains("slices"))
    );

    // The ConfigMap is fixed (too-big becomes feasible): picked up without a label change, but the
    // running pod holds a GPU instance: the drain times out, failed, resources come back.
    std::fs::write(&configs, MIG_CONFIGS.replace("      2g.20gb: 1\n", "")).unwrap();
    wait_until("the drain timing out", Duration::from_secs(60), || {
        state_label().as_deref() == Some("failed")
            && node_json(&cluster, "mig-node")["metadata"]["annotations"]["gpuops.io/mig.config.reason"]
                .as_str()
                .is_some_and(|r| r.contains("timed out") && r.contains("default/mig-pod"))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    wait_until(
        "resources back after the timeout",
        Duration::from_secs(30),
        || allocatable(&cluster, "mig-node", "nvidia.com/mig-1g.10gb") == 7,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // The pod goes: the retry (same label) succeeds.
    cluster
        .kubectl(&["delete", "pod", "mig-pod", "--wait=false"])
        .unwrap();
    wait_until(
        "2x mig-3g.40gb after the retry",
        Duration::from_secs(90),
        || {
            state_label().as_deref() == Some("success")
                && allocatable(&cluster, "mig-node", "nvidia.com/mig-3g.40gb") == 2
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));

    // A crash in the middle of a change: slow steps, kill everything, start again: it converges.
    // The slow steps are a test-only knob, absent from the shipped binary.
    if !cfg!(feature = "test-hooks") {
        eprintln!(
            "the crash half needs the test-only GPUOPS_MIG_STEP_DELAY: --features test-hooks"
        );
        return;
    }
    agent.crash();
    let before_change = gpu_instances(&state).expect("the simulator's state");
    let slow_env = [("MIG_STRATEGY", "mixed"), ("GPUOPS_MIG_STEP_DELAY", "2s")];
    agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-2.log"),
        &args,
        &slow_env,
    );
    cluster
        .kubectl(&[
            "label",
            "node",
            "mig-node",
            "--overwrite",
            "nvidia.com/mig.config=all-1g.10gb",
        ])
        .unwrap();
    wait_until("the change under way", Duration::from_secs(60), || {
        state_label().as_deref() == Some("pending")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    // Crash it in the middle: once the first of its slow driver changes reached the GPU.
    wait_until("the first driver change", Duration::from_secs(60), || {
        gpu_instances(&state).is_some_and(|g| g != before_change)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    agent.crash();
    let _agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-3.log"),
        &args,
        &env,
    );
    wait_until(
        "converged after the restart",
        Duration::from_secs(90),
        || {
            state_label().as_deref() == Some("success")
                && allocatable(&cluster, "mig-node", "nvidia.com/mig-1g.10gb") == 7
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", _agent.log()));
    let o = common::run(&[
        "mig",
        "assert",
        "-f",
        &configs_s,
        "-c",
        "all-1g.10gb",
        "--sim-state",
        &state_s,
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn a_default_mig_layout_is_in_place_before_the_gpus_are_advertised() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "fresh-node").unwrap();
    let fleet = cluster.dir().join("a100.yaml");
    std::fs::write(&fleet, "gpus:\n- model: A100-SXM4-80GB\n  count: 2\n").unwrap();
    let state = cluster.dir().join("sim");
    let state_s = state.to_str().unwrap().to_string();
    assert!(
        common::run(&[
            "sim",
            "init",
            "--fleet",
            fleet.to_str().unwrap(),
            "--state",
            &state_s
        ])
        .status
        .success()
    );
    let configs = cluster.dir().join("mig-configs.yaml");
    std::fs::write(&configs, MIG_CONFIGS).unwrap();
    let agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent.log"),
        &[
            "--sim-state",
            &state_s,
            "--mig-config-file",
            configs.to_str().unwrap(),
            "--mig-default-config",
            "all-1g.10gb",
        ],
        &[("MIG_STRATEGY", "mixed")],
    );
    let mut seen_whole = false;
    wait_until(
        "14x mig-1g.10gb from the default",
        Duration::from_secs(60),
        || {
            seen_whole |= allocatable(&cluster, "fresh-node", "nvidia.com/gpu") > 0;
            allocatable(&cluster, "fresh-node", "nvidia.com/mig-1g.10gb") == 14
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert!(
        !seen_whole,
        "whole GPUs were advertised before the default layout:\n{}",
        agent.log()
    );
    assert_eq!(
        labels(&cluster, "fresh-node")
            .get("nvidia.com/mig.config.state")
            .map(String::as_str),
        Some("success")
    );
}

/// The node condition of `type_`, if the node has one.
fn condition_of(cluster: &Cluster, node: &str, type_: &str) -> Option<serde_json::Value> {
    node_json(cluster, node)["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// MIG strategy single on a layout of mixed profiles: NVIDIA's GFD keeps running and labels the
/// node `<product>-MIG-INVALID` with zero counts; the agent used to exit (a crash loop in its
/// DaemonSet). It keeps running, labels as GFD does, advertises nothing, sets the
/// GPUMIGStrategyValid condition False with a Warning event, and recovers once the layout fits.
#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn single_strategy_on_mixed_profiles_keeps_running_labels_mig_invalid_and_recovers() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let node = HarnessNode::start(&cluster, "invalid-node").unwrap();
    let state_s = sim_init(
        &cluster,
        "sim",
        "gpus:\n- model: A100-SXM4-80GB\n  count: 2\n",
    );
    let configs = cluster.dir().join("mig-configs.yaml");
    std::fs::write(
        &configs,
        format!("{MIG_CONFIGS}  balanced:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n      3g.40gb: 1\n      2g.20gb: 1\n      1g.10gb: 2\n"),
    )
    .unwrap();
    let mut agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent.log"),
        &[
            "--sim-state",
            &state_s,
            "--mig-config-file",
            configs.to_str().unwrap(),
            "--mig-default-config",
            "balanced",
        ],
        &[("MIG_STRATEGY", "single"), ("FAIL_ON_INIT_ERROR", "true")],
    );
    let want_invalid = [
        ("nvidia.com/mig.strategy", "single"),
        (
            "nvidia.com/gpu.product",
            "NVIDIA-A100-SXM4-80GB-MIG-INVALID",
        ),
        ("nvidia.com/gpu.count", "0"),
        ("nvidia.com/gpu.replicas", "0"),
        ("nvidia.com/gpu.memory", "0"),
        ("nvidia.com/gpu.sharing-strategy", ""),
    ];
    wait_until("the -MIG-INVALID labels", Duration::from_secs(90), || {
        let l = labels(&cluster, "invalid-node");
        want_invalid
            .iter()
            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    wait_until("the condition False", Duration::from_secs(30), || {
        condition_of(&cluster, "invalid-node", "GPUMIGStrategyValid")
            .is_some_and(|c| c["status"] == "False" && c["reason"] == "MIGLayoutInvalidForStrategy")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    let c = condition_of(&cluster, "invalid-node", "GPUMIGStrategyValid").unwrap();
    let message = c["message"].as_str().unwrap_or_default();
    assert!(message.contains("needs one MIG profile"), "{message}");
    wait_until("the Warning event", Duration::from_secs(30), || {
        node_events(&cluster, "invalid-node")
            .iter()
            .any(|e| e.starts_with("MIGLayoutInvalidForStrategy: "))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    // Nothing is advertised, and the agent is still running some passes later.
    assert_eq!(allocatable(&cluster, "invalid-node", "nvidia.com/gpu"), 0);
    let node_now = node_json(&cluster, "invalid-node");
    let mig_resources: Vec<&String> = node_now["status"]["allocatable"]
        .as_object()
        .map(|m| m.keys().filter(|k| k.starts_with("nvidia.com/")).collect())
        .unwrap_or_default();
    assert!(
        mig_resources
            .iter()
            .all(|k| allocatable(&cluster, "invalid-node", k) == 0),
        "{mig_resources:?}"
    );
    agent
        .0
        .check_alive()
        .unwrap_or_else(|e| panic!("the agent exited: {e}\n{}", agent.log()));

    // A layout single can serve: the node recovers without a restart.
    cluster
        .kubectl(&[
            "label",
            "node",
            "invalid-node",
            "nvidia.com/mig.config=all-1g.10gb",
            "--overwrite",
        ])
        .unwrap();
    wait_until(
        "14 MIG devices as nvidia.com/gpu",
        Duration::from_secs(90),
        || allocatable(&cluster, "invalid-node", "nvidia.com/gpu") == 14,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    wait_until("the condition True", Duration::from_secs(30), || {
        condition_of(&cluster, "invalid-node", "GPUMIGStrategyValid")
            .is_some_and(|c| c["status"] == "True")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    wait_until("the product label", Duration::from_secs(30), || {
        labels(&cluster, "invalid-node")
            .get("nvidia.com/gpu.product")
            .map(String::as_str)
            == Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    wait_until("the Normal event", Duration::from_secs(30), || {
        node_events(&cluster, "invalid-node")
            .iter()
            .any(|e| e.starts_with("MIGLayoutFitsStrategy: "))
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
}

/// Whether the node carries the default startup taint.
fn has_startup_taint(node: &serde_json::Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|ts| ts.iter().any(|t| t["key"] == "gpuops.io/gpu-not-ready"))
}

fn allocatable_of(node: &serde_json::Value, resource: &str) -> i64 {
    node["status"]["allocatable"][resource]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn sim_init(cluster: &Cluster, name: &str, fleet: &str) -> String {
    let file = cluster.dir().join(format!("{name}.yaml"));
    std::fs::write(&file, fleet).unwrap();
    let state = cluster.dir().join(name).to_str().unwrap().to_string();
    let o = common::run(&[
        "sim",
        "init",
        "--fleet",
        file.to_str().unwrap(),
        "--state",
        &state,
    ]);
    assert!(o.status.success(), "{}", common::text(&o));
    state
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_startup_taint_goes_once_the_configured_devices_are_allocatable_and_never_comes_back() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    // A node registered with the taint (the kubelet's --register-with-taints) and whole GPUs.
    let node = HarnessNode::start(&cluster, "new-node").unwrap();
    let taint = "gpuops.io/gpu-not-ready:NoSchedule";
    cluster
        .kubectl(&["taint", "node", "new-node", taint])
        .unwrap();
    let state = sim_init(&cluster, "l4", "gpus:\n- model: L4\n  count: 4\n");
    let agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-1.log"),
        &["--sim-state", &state],
        &[],
    );
    let mut too_early = Vec::new();
    wait_until("the startup taint removed", Duration::from_secs(60), || {
        let n = node_json(&cluster, "new-node");
        let gone = !has_startup_taint(&n);
        if gone && allocatable_of(&n, "nvidia.com/gpu") < 4 {
            too_early.push(allocatable_of(&n, "nvidia.com/gpu"));
        }
        gone
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert!(
        too_early.is_empty(),
        "taint removed with only {too_early:?} of 4 GPUs allocatable\n{}",
        agent.log()
    );
    assert!(
        agent
            .log()
            .contains("startup taint gpuops.io/gpu-not-ready removed: 4 nvidia.com/gpu"),
        "{}",
        agent.log()
    );
    drop(agent);

    // A node asking for a MIG layout: the taint stays until the apply finished and the MIG
    // devices are allocatable (slow driver steps, with the test-only knob, widen the window).
    let node = HarnessNode::start(&cluster, "mig-new-node").unwrap();
    cluster
        .kubectl(&[
            "label",
            "node",
            "mig-new-node",
            "nvidia.com/mig.config=all-1g.10gb",
        ])
        .unwrap();
    cluster
        .kubectl(&["taint", "node", "mig-new-node", taint])
        .unwrap();
    let state = sim_init(
        &cluster,
        "a100",
        "gpus:\n- model: A100-SXM4-80GB\n  count: 2\n",
    );
    let configs = cluster.dir().join("mig-configs.yaml");
    std::fs::write(&configs, MIG_CONFIGS).unwrap();
    let agent = Agent::start(
        &cluster,
        &node,
        &cluster.dir().join("agent-2.log"),
        &[
            "--sim-state",
            &state,
            "--mig-config-file",
            configs.to_str().unwrap(),
            "--node-resync",
            "3s",
        ],
        &[
            ("MIG_STRATEGY", "mixed"),
            ("GPUOPS_MIG_STEP_DELAY", "300ms"),
        ],
    );
    let mut held_while_pending = false;
    let mut at_removal = None;
    wait_until(
        "the startup taint removed after the MIG apply",
        Duration::from_secs(90),
        || {
            let n = node_json(&cluster, "mig-new-node");
            let state = n["metadata"]["labels"]["nvidia.com/mig.config.state"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if has_startup_taint(&n) {
                held_while_pending |= state == "pending";
                return false;
            }
            at_removal = Some((state, allocatable_of(&n, "nvidia.com/mig-1g.10gb")));
            true
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert_eq!(
        at_removal,
        Some(("success".to_string(), 14)),
        "{}",
        agent.log()
    );
    if cfg!(feature = "test-hooks") {
        assert!(
            held_while_pending,
            "never saw the taint held while pending\n{}",
            agent.log()
        );
    }

    // Startup taints are only for startup: a later MIG change does not put it back.
    cluster
        .kubectl(&[
            "label",
            "--overwrite",
            "node",
            "mig-new-node",
            "nvidia.com/mig.config=all-disabled",
        ])
        .unwrap();
    let mut saw_pending = false;
    let mut retainted = false;
    wait_until(
        "whole GPUs back after all-disabled",
        Duration::from_secs(90),
        || {
            let n = node_json(&cluster, "mig-new-node");
            let state = n["metadata"]["labels"]["nvidia.com/mig.config.state"]
                .as_str()
                .unwrap_or("");
            saw_pending |= state == "pending";
            retainted |= has_startup_taint(&n);
            saw_pending && state == "success" && allocatable_of(&n, "nvidia.com/gpu") == 2
        },
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    assert!(
        !retainted,
        "the startup taint came back during a MIG change\n{}",
        agent.log()
    );
}
