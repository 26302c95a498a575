//! The chart's DRA objects, proven on the real apiserver: with dra.enabled the agent's own
//! ServiceAccount token (bound to a pod on a node, as the kubelet makes it) may read claims and
//! write ResourceSlices, but the ValidatingAdmissionPolicy denies it any slice of another node;
//! the render refuses the device plugin and DRA on the same nodes, and with dra.nodeSelector the
//! two DaemonSets never share a node.
//!
//! Needs the test bed's binaries (GPUOPS_K8S_BIN from tests/k8s/build.sh: kube-apiserver, etcd,
//! kubectl, helm); ignored by a plain `cargo test`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::rbac::{self, Access};
use gpuops_testbed::{BIN_ENV, Cluster, ClusterOptions, wait_until};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn helm_template(values: &[&str]) -> Output {
    let bin = std::env::var(BIN_ENV)
        .unwrap_or_else(|_| panic!("{BIN_ENV} is not set: run tests/k8s/build.sh"));
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/helm/gpuops");
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(Path::new(&bin).join("helm"));
    cmd.arg("template")
        .arg("gpuops")
        .arg(&chart)
        .args(["-n", "gpuops"])
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"));
    for v in values {
        cmd.args(["--set", v]);
    }
    cmd.output().unwrap()
}

fn render(values: &[&str]) -> String {
    let out = helm_template(values);
    assert!(
        out.status.success(),
        "helm template {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn args(ds: &Value) -> Vec<String> {
    ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn host_paths(ds: &Value) -> Vec<String> {
    ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_string))
        .collect()
}

#[test]
#[ignore = "needs helm from the test bed (GPUOPS_K8S_BIN): run scripts/test"]
fn the_render_never_puts_the_device_plugin_and_dra_on_one_node() {
    // Both on every node: refused, naming what to turn off.
    let out = helm_template(&["dra.enabled=true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("devicePlugin.enabled=false") && err.contains("dra.nodeSelector"),
        "{err}"
    );

    // Every node through DRA: one DaemonSet, --dra and --no-device-plugin, the kubelet's plugin
    // directories and the CDI spec directory mounted.
    let docs =
        rbac::documents(&render(&["dra.enabled=true", "devicePlugin.enabled=false"])).unwrap();
    let sets = of_kind(&docs, "DaemonSet");
    assert_eq!(sets.len(), 1);
    let a = args(sets[0]);
    assert!(a.contains(&"--dra".to_string()), "{a:?}");
    assert!(a.contains(&"--no-device-plugin".to_string()), "{a:?}");
    assert!(
        a.contains(&"--cdi-spec-dir=/var/run/cdi".to_string()),
        "{a:?}"
    );
    let paths = host_paths(sets[0]);
    for p in [
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
    ] {
        assert!(paths.contains(&p.to_string()), "{p} in {paths:?}");
    }
    let classes: Vec<&str> = of_kind(&docs, "DeviceClass")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["gpu.nvidia.com", "mig.nvidia.com"]);

    // Per pool: the DRA DaemonSet only on the labelled nodes, the device plugin's never there.
    let docs = rbac::documents(&render(&[
        "dra.enabled=true",
        "dra.nodeSelector.pool=dra",
        "dra.extendedResourceName=nvidia.com/gpu",
    ]))
    .unwrap();
    let sets = of_kind(&docs, "DaemonSet");
    assert_eq!(sets.len(), 2);
    let (plugin, dra) = (sets[0], sets[1]);
    assert_eq!(dra["metadata"]["name"], "gpuops-dra");
    assert!(args(dra).contains(&"--dra".to_string()));
    assert!(args(dra).contains(&"--no-device-plugin".to_string()));
    assert!(!args(plugin).contains(&"--dra".to_string()));
    assert!(!args(plugin).contains(&"--no-device-plugin".to_string()));
    assert_eq!(
        dra["spec"]["template"]["spec"]["nodeSelector"]["pool"],
        "dra"
    );
    let term = &plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(term["key"], "pool");
    assert_eq!(term["operator"], "NotIn");
    assert_eq!(term["values"][0], "dra");
    // Their selectors differ, so neither DaemonSet counts the other's pods as its own.
    assert_ne!(
        plugin["spec"]["selector"], dra["spec"]["selector"],
        "distinct selectors"
    );
    let gpu = of_kind(&docs, "DeviceClass")
        .into_iter()
        .find(|c| c["metadata"]["name"] == "gpu.nvidia.com")
        .unwrap();
    assert_eq!(gpu["spec"]["extendedResourceName"], "nvidia.com/gpu");

    // Off (the default): nothing of DRA at all.
    let docs = rbac::documents(&render(&[])).unwrap();
    assert!(of_kind(&docs, "DeviceClass").is_empty());
    assert!(of_kind(&docs, "ValidatingAdmissionPolicy").is_empty());
    assert_eq!(of_kind(&docs, "DaemonSet").len(), 1);
}

/// A kubeconfig for a token of ServiceAccount gpuops/gpuops bound to `pod` (as the kubelet
/// requests it for the agent's pod: the apiserver adds the pod's node to the user's extra).
fn agent_bound_to(cluster: &Cluster, pod: &str) -> String {
    let uid = cluster
        .kubectl(&[
            "get",
            "pod",
            pod,
            "-n",
            "gpuops",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .unwrap();
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            "gpuops",
            "-n",
            "gpuops",
            "--duration=1h",
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={pod}"),
            &format!("--bound-object-uid={uid}"),
        ])
        .unwrap();
    let user = format!("agent-{pod}");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: {user}\n  user:\n    token: {}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: {user}\ncurrent-context: bed\n",
        cluster.server(),
        token.trim()
    );
    std::fs::write(cluster.kubeconfig_for(&user), text).unwrap();
    user
}

fn slice(name: &str, node: &str, generation: u32) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: {name}\nspec:\n  driver: gpu.nvidia.com\n  nodeName: {node}\n  pool:\n    name: {node}\n    generation: {generation}\n    resourceSliceCount: 1\n  devices:\n  - name: gpu-0\n    attributes:\n      type:\n        string: gpu\n"
    )
}

/// `kubectl apply -f -` as `user`; the apiserver's error text on failure.
fn apply_as(cluster: &Cluster, user: &str, yaml: &str) -> Result<(), String> {
    let path = cluster.dir().join(format!("{user}-apply.yaml"));
    std::fs::write(&path, yaml).unwrap();
    cluster
        .kubectl_as(
            user,
            &[
                "apply",
                "--server-side",
                "--field-manager=gpuops-agent",
                // As the agent's publisher does: it owns its slices whoever wrote them last.
                "--force-conflicts",
                "-f",
                path.to_str().unwrap(),
            ],
        )
        .map(drop)
        .map_err(|e| e.to_string())
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario on one apiserver (its start costs seconds): grants, then each write the policy must allow or deny, in order.
fn the_agent_writes_only_its_own_nodes_slices_with_its_own_token() {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    let manifest = render(&["dra.enabled=true", "devicePlugin.enabled=false"]);
    cluster
        .apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: gpuops\n")
        .unwrap();
    assert!(rbac::apply_rbac(&cluster, &manifest).unwrap() >= 5);
    // The DeviceClasses and the policy with its binding (no workload is started).
    let docs: Vec<Value> = rbac::documents(&manifest)
        .unwrap()
        .into_iter()
        .filter(|d| {
            let kind = d["kind"].as_str().unwrap_or_default();
            kind == "DeviceClass" || kind.starts_with("ValidatingAdmissionPolicy")
        })
        .collect();
    assert_eq!(docs.len(), 4, "two DeviceClasses, the policy, its binding");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": docs});
    cluster.apply(&list.to_string()).unwrap();

    // Two nodes and an agent pod on the first (no kubelet runs it: the token only needs the
    // pod object and its node).
    for node in ["node-a", "node-b"] {
        cluster
            .apply(&format!(
                "apiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n"
            ))
            .unwrap();
    }
    cluster
        .apply("apiVersion: v1\nkind: Pod\nmetadata:\n  name: agent-a\n  namespace: gpuops\nspec:\n  serviceAccountName: gpuops\n  nodeName: node-a\n  containers:\n  - name: agent\n    image: gpuops\n")
        .unwrap();
    let agent = agent_bound_to(&cluster, "agent-a");

    // RBAC: exactly the DRA grants on top of the agent's role, asked with its own token.
    let ask = |group: &str, resource: &str, verb: &str| Access {
        group: group.into(),
        resource: resource.into(),
        verb: verb.into(),
        namespace: String::new(),
    };
    let questions = [
        ask("resource.k8s.io", "resourceclaims", "get"),
        ask("resource.k8s.io", "resourceslices", "create"),
        ask("resource.k8s.io", "resourceslices", "patch"),
        ask("resource.k8s.io", "resourceslices", "delete"),
        ask("resource.k8s.io", "resourceslices", "list"),
        ask("resource.k8s.io", "resourceslices", "deletecollection"),
        ask("resource.k8s.io", "resourceclaims", "list"),
        ask("resource.k8s.io", "resourceclaims", "update"),
        ask("resource.k8s.io", "deviceclasses", "create"),
    ];
    let mut answers = Vec::new();
    wait_until("the DRA grants", Duration::from_secs(30), || {
        answers = rbac::can(&cluster, &agent, &questions).unwrap();
        answers[0]
    })
    .unwrap();
    assert_eq!(
        answers,
        [true, true, true, true, true, false, false, false, false],
        "{questions:?}"
    );

    // Its own node's slice: allowed (the policy may take a moment to be loaded, so the first
    // denial of another node's slice is what the test waits for).
    let mut denial = String::new();
    wait_until(
        "the policy denies node-b's slice",
        Duration::from_secs(30),
        || {
            match apply_as(&cluster, &agent, &slice("node-b-gpu", "node-b", 1)) {
                Ok(()) => {
                    // Written before the policy was loaded: remove it and ask again.
                    let _ = cluster.kubectl(&["delete", "resourceslice", "node-b-gpu"]);
                    false
                }
                Err(e) => {
                    denial = e;
                    true
                }
            }
        },
    )
    .unwrap();
    assert!(
        denial.contains("may only write ResourceSlices with spec.nodeName node-a, not node-b"),
        "{denial}"
    );
    apply_as(&cluster, &agent, &slice("node-a-gpu", "node-a", 1)).unwrap();
    // A change of its own slice: allowed; moving it to another node: denied (by the API's
    // own validation, nodeName being immutable, before the policy is asked).
    apply_as(&cluster, &agent, &slice("node-a-gpu", "node-a", 2)).unwrap();
    let moved = apply_as(&cluster, &agent, &slice("node-a-gpu", "node-b", 3));
    assert!(moved.is_err(), "moved to node-b");
    assert_eq!(
        cluster
            .kubectl(&[
                "get",
                "resourceslice",
                "node-a-gpu",
                "-o",
                "jsonpath={.spec.pool.generation}"
            ])
            .unwrap(),
        "2"
    );

    // Another node's slice, written by someone else: the agent can neither change nor delete it.
    cluster.apply(&slice("node-b-gpu", "node-b", 1)).unwrap();
    let changed = apply_as(&cluster, &agent, &slice("node-b-gpu", "node-b", 2)).unwrap_err();
    assert!(changed.contains("not node-b"), "{changed}");
    let deleted = cluster
        .kubectl_as(&agent, &["delete", "resourceslice", "node-b-gpu"])
        .unwrap_err()
        .to_string();
    assert!(
        deleted
            .contains("may only change or delete its own ResourceSlices, not one of node node-b"),
        "{deleted}"
    );
    cluster
        .kubectl(&["get", "resourceslice", "node-b-gpu"])
        .unwrap();
    // Its own it may delete.
    cluster
        .kubectl_as(&agent, &["delete", "resourceslice", "node-a-gpu"])
        .unwrap();

    // The same ServiceAccount with a token that names no node: refused, saying why.
    let unbound = rbac::service_account_user(&cluster, "gpuops", "gpuops").unwrap();
    let err = apply_as(&cluster, &unbound, &slice("node-a-gpu", "node-a", 1)).unwrap_err();
    assert!(err.contains("carries no node name"), "{err}");
    // Anyone else (the admin here) is not limited by the policy.
    cluster.apply(&slice("node-a-gpu", "node-a", 1)).unwrap();
}
