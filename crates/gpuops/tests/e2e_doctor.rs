//! `gpuops doctor` against the real control plane: KWOK GPU nodes, pods the real kube-scheduler
//! fails to place with its own FailedScheduling text, and look-alikes that must not be flagged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

mod common;

use gpuops_testbed::{Cluster, ClusterOptions, wait_until};
use serde_json::Value;
use std::time::Duration;

/// A KWOK node offering `resources` (name, count) with extra labels and taints (YAML list items).
fn node(
    name: &str,
    pool: &str,
    resources: &[(&str, u32)],
    labels: &[(&str, &str)],
    taints: &str,
) -> String {
    let res: String = resources
        .iter()
        .map(|(r, n)| format!("    {r}: \"{n}\"\n"))
        .collect();
    let lab: String = labels
        .iter()
        .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
        .collect();
    format!(
        "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations:\n    kwok.x-k8s.io/node: fake\n  labels:\n    type: kwok\n    pool: {pool}\n    nvidia.com/gpu.present: \"true\"\n    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\n    nvidia.com/cuda.driver-version.full: 550.107.02\n    nvidia.com/cuda.driver-version.major: \"550\"\n{lab}spec:\n{taints}status:\n  capacity:\n    cpu: \"64\"\n    memory: 512Gi\n    pods: \"110\"\n{res}  allocatable:\n    cpu: \"64\"\n    memory: 512Gi\n    pods: \"110\"\n{res}",
        taints = if taints.is_empty() {
            "  {}\n".to_string()
        } else {
            taints.to_string()
        },
        res = res,
    )
}

/// A pod asking for `gpus` of `resource`, pinned to `pool` when given.
fn pod(name: &str, resource: &str, gpus: u32, pool: Option<&str>, extra_spec: &str) -> String {
    let selector = pool.map_or(String::new(), |p| {
        format!("  nodeSelector:\n    pool: {p}\n")
    });
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{selector}{extra_spec}  tolerations:\n  - key: kwok.x-k8s.io/node\n    operator: Exists\n  containers:\n  - name: cuda\n    image: example.invalid/cuda:12\n    resources:\n      limits:\n        {resource}: \"{gpus}\"\n"
    )
}

fn phase(cluster: &Cluster, pod: &str) -> String {
    cluster
        .kubectl(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.phase}/{.spec.nodeName}",
        ])
        .unwrap_or_default()
}

fn unschedulable(cluster: &Cluster, pod: &str) -> bool {
    cluster
        .kubectl(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].reason}",
        ])
        .is_ok_and(|r| r == "Unschedulable")
}

struct Doctor {
    code: Option<i32>,
    json: Value,
    text: String,
}

fn doctor(cluster: &Cluster, extra: &[&str]) -> Doctor {
    let out = common::gpuops()
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["doctor", "-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    let text = common::text(&out);
    let json: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor output is not JSON ({e}):\n{text}"));
    Doctor {
        code: out.status.code(),
        json,
        text,
    }
}

impl Doctor {
    fn findings(&self) -> &Vec<Value> {
        self.json["findings"].as_array().unwrap()
    }

    /// The findings naming `object` (a pod or node name).
    fn about(&self, object: &str) -> Vec<&Value> {
        self.findings()
            .iter()
            .filter(|f| {
                f["objects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["name"] == object)
            })
            .collect()
    }

    /// The one finding with `code` about `object`.
    fn one(&self, code: &str, object: &str) -> &Value {
        let found: Vec<&Value> = self
            .about(object)
            .into_iter()
            .filter(|f| f["code"] == code)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "want one {code} about {object}; all findings:\n{}",
            serde_json::to_string_pretty(&self.json).unwrap()
        );
        found[0]
    }

    fn codes_about(&self, object: &str) -> Vec<String> {
        self.about(object)
            .iter()
            .map(|f| f["code"].as_str().unwrap().to_string())
            .collect()
    }
}

fn evidence(f: &Value) -> String {
    f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_doctor_names_the_real_cause_of_each_pending_gpu_pod_and_leaves_look_alikes_alone() {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        ..ClusterOptions::default()
    })
    .unwrap();

    let gpu = "nvidia.com/gpu";
    let mut nodes = String::new();
    for i in 1..=3 {
        nodes.push_str(&node(&format!("frag-{i}"), "frag", &[(gpu, 4)], &[], ""));
    }
    nodes.push_str(&node(
        "tainted-1",
        "tainted",
        &[(gpu, 8)],
        &[],
        "  taints:\n  - key: nvidia.com/gpu\n    value: present\n    effect: NoSchedule\n",
    ));
    nodes.push_str(&node(
        "mig-1",
        "mig",
        &[("nvidia.com/mig-1g.10gb", 14)],
        &[
            ("nvidia.com/gpu.count", "2"),
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/mig.config", "all-1g.10gb"),
            ("nvidia.com/mig.config.state", "success"),
        ],
        "",
    ));
    nodes.push_str(&node("full-1", "full", &[(gpu, 2)], &[], ""));
    nodes.push_str(&node(
        "ts-1",
        "ts",
        &[(gpu, 16)],
        &[
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ],
        "",
    ));
    // A GPU node whose device plugin never registered: labelled, no nvidia.com/gpu.
    nodes.push_str(&node("broken-1", "broken", &[], &[], ""));
    // Node-level look-ups on labels alone.
    nodes.push_str(&node(
        "migfail-1",
        "migfail",
        &[(gpu, 8)],
        &[
            ("nvidia.com/mig.config", "all-3g.40gb"),
            ("nvidia.com/mig.config.state", "failed"),
        ],
        "",
    ));
    cluster.apply(&nodes).unwrap();
    // The NodeTaint admission plugin taints new nodes not-ready; with no node lifecycle controller
    // here to lift it when KWOK reports them Ready, lift it as that controller would.
    cluster
        .kubectl(&[
            "taint",
            "nodes",
            "-l",
            "type=kwok",
            "node.kubernetes.io/not-ready:NoSchedule-",
        ])
        .unwrap();

    // Fill: one 3-GPU pod per frag node (1 free on each), the whole full-1 node, and look-alikes
    // that schedule: a pod tolerating the GPU taint, two replicas on the time-sliced node.
    let mut fill = String::new();
    for i in 1..=3 {
        fill.push_str(&pod(&format!("filler-{i}"), gpu, 3, Some("frag"), ""));
    }
    fill.push_str(&pod("fills-full", gpu, 2, Some("full"), ""));
    fill.push_str(
        &pod(
            "tolerating",
            gpu,
            1,
            Some("tainted"),
            "  tolerations:\n  - key: nvidia.com/gpu\n    operator: Exists\n",
        )
        .replace("  tolerations:\n  - key: kwok", "  - key: kwok"),
    );
    fill.push_str(&pod("two-replicas", gpu, 2, Some("ts"), ""));
    cluster.apply(&fill).unwrap();
    for p in [
        "filler-1",
        "filler-2",
        "filler-3",
        "fills-full",
        "tolerating",
        "two-replicas",
    ] {
        wait_until(&format!("{p} bound"), Duration::from_secs(60), || {
            phase(&cluster, p).contains("/") && !phase(&cluster, p).ends_with('/')
        })
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {}",
                cluster.kubectl(&["describe", "pod", p]).unwrap_or_default()
            )
        });
    }

    // The pending pods, each with one cause.
    let mut pending = String::new();
    pending.push_str(&pod("fragmented", gpu, 2, Some("frag"), "")); // 3 free, 1 per node
    pending.push_str(&pod("not-enough", gpu, 4, Some("frag"), "")); // 3 free in all
    pending.push_str(&pod("untolerated", gpu, 1, Some("tainted"), ""));
    pending.push_str(&pod(
        "wrong-product",
        gpu,
        1,
        None,
        "  nodeSelector:\n    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB\n",
    ));
    pending.push_str(&pod("whole-on-mig", gpu, 1, Some("mig"), ""));
    pending.push_str(&pod("mig-3g", "nvidia.com/mig-3g.40gb", 1, None, ""));
    pending.push_str(&pod("too-big", gpu, 16, Some("frag"), ""));
    cluster.apply(&pending).unwrap();
    let names = [
        "fragmented",
        "not-enough",
        "untolerated",
        "wrong-product",
        "whole-on-mig",
        "mig-3g",
        "too-big",
    ];
    wait_until(
        "the scheduler to give up on each pending pod",
        Duration::from_secs(60),
        || names.iter().all(|p| unschedulable(&cluster, p)),
    )
    .unwrap();

    let d = doctor(&cluster, &[]);
    assert_eq!(d.code, Some(2), "critical findings exit 2:\n{}", d.text);

    let f = d.one("fragmentation", "fragmented");
    let e = evidence(f);
    assert!(
        e.contains("Insufficient nvidia.com/gpu"),
        "the scheduler's words:\n{e}"
    );
    assert!(
        e.contains("3 free across 3 eligible nodes, at most 1 on one node, 2 needed"),
        "{e}"
    );
    assert!(
        f["fix"].as_str().unwrap().contains("make room on frag-"),
        "{f}"
    );

    let f = d.one("insufficient-gpus", "not-enough");
    assert!(
        evidence(f).contains("4 needed, 3 free of 12 allocatable"),
        "{f}"
    );

    let f = d.one("untolerated-taint", "untolerated");
    assert!(
        evidence(f).contains("untolerated taint"),
        "the scheduler's words: {f}"
    );
    assert!(
        f["fix"].as_str().unwrap().contains("key: nvidia.com/gpu"),
        "{f}"
    );

    let f = d.one("selector-matches-no-gpu-node", "wrong-product");
    assert!(
        evidence(f).contains("didn't match Pod's node affinity/selector"),
        "{f}"
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3"),
        "{f}"
    );

    let f = d.one("resource-mismatch", "whole-on-mig");
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/mig-1g.10gb: 1"),
        "{f}"
    );

    let f = d.one("mig-profile-not-offered", "mig-3g");
    assert!(
        evidence(f).contains("Insufficient nvidia.com/mig-3g.40gb"),
        "{f}"
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/mig.config=all-3g.40gb --overwrite"),
        "{f}"
    );

    d.one("request-exceeds-node", "too-big");
    d.one("zero-allocatable", "broken-1");
    d.one("mig-config-failed", "migfail-1");
    assert_eq!(
        d.one("shared-request-over-one", "two-replicas")["severity"],
        "warning"
    );

    // Look-alikes: scheduled pods and a full node are not problems.
    for quiet in ["tolerating", "filler-1", "fills-full"] {
        assert!(
            d.codes_about(quiet).is_empty(),
            "{quiet}: {:?}",
            d.codes_about(quiet)
        );
    }
    assert!(
        !d.codes_about("full-1")
            .iter()
            .any(|c| c == "zero-allocatable"),
        "a node with every GPU allocated still has allocatable GPUs"
    );
    for n in ["frag-1", "tainted-1", "mig-1"] {
        let codes = d.codes_about(n);
        assert!(
            !codes.iter().any(|c| [
                "zero-allocatable",
                "mig-layout-mismatch",
                "mig-config-failed"
            ]
            .contains(&c.as_str())),
            "{n}: {codes:?}"
        );
    }

    // --namespace / --node filters, and the readable report.
    let only = doctor(&cluster, &["--node", "broken-1"]);
    assert!(only.findings().iter().all(|f| !evidence(f).is_empty()));
    assert_eq!(
        only.codes_about("broken-1"),
        vec!["zero-allocatable"],
        "{}",
        only.text
    );
    assert!(only.findings().iter().all(|f| {
        f["objects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o["name"] == "broken-1")
    }));
    let out = common::gpuops()
        .env("KUBECONFIG", cluster.kubeconfig())
        .args(["doctor", "--color", "never"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("CRITICAL (") && report.contains("[scheduling]") && report.contains("fix:"),
        "{report}"
    );
    assert!(!report.contains('\x1b'));

    // A pod that is merely new is not flagged; one nobody schedules for too long is.
    cluster
        .apply(
            &pod(
                "brand-new",
                gpu,
                1,
                Some("tainted"),
                "  schedulerName: no-such-scheduler\n",
            )
            .replace(
                "  - key: kwok.x-k8s.io/node\n",
                "  - key: nvidia.com/gpu\n    operator: Exists\n  - key: kwok.x-k8s.io/node\n",
            ),
        )
        .unwrap();
    let d = doctor(&cluster, &[]);
    assert!(
        d.codes_about("brand-new").is_empty(),
        "{:?}",
        d.codes_about("brand-new")
    );
    std::thread::sleep(Duration::from_secs(2));
    let d = doctor(&cluster, &["--pending-grace", "1s"]);
    assert_eq!(d.codes_about("brand-new"), vec!["not-scheduled"]);
}
