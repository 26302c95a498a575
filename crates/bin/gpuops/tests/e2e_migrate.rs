//! `gpuops migrate` against the real control plane (ignored; scripts/test runs it): a
//! ClusterPolicy CRD of our own (NVIDIA's operator cannot be built here, its Go modules are
//! refused by the module proxy) with the objects NVIDIA's Helm charts create, read from the
//! cluster; the values rendered by the chart with Helm carry the same configs; and `--check` on
//! a node labelled by GFD reports no change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpuops_testbed::{Cluster, ClusterOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A minimal CRD for NVIDIA's ClusterPolicy: the group, version, kind and plural the GPU
/// Operator installs, with a schema that keeps every field (ours does not validate NVIDIA's).
const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: clusterpolicies.nvidia.com}
spec:
  group: nvidia.com
  scope: Cluster
  names: {kind: ClusterPolicy, listKind: ClusterPolicyList, plural: clusterpolicies, singular: clusterpolicy}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
      subresources: {status: {}}
"#;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/migrate")
            .join(name),
    )
    .unwrap()
}

fn gpuops(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuops"))
        .args(args)
        .output()
        .unwrap()
}

fn docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn helm_template(cluster: &Cluster, values: &Path) -> Vec<Value> {
    let chart = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/helm/gpuops");
    let out = cluster
        .helm(&[
            "template",
            "gpuops",
            chart.to_str().unwrap(),
            "--namespace",
            "gpuops",
            "-f",
            values.to_str().unwrap(),
        ])
        .unwrap();
    docs(&out)
}

fn find<'a>(objects: &'a [Value], kind: &str, suffix: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == kind
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(suffix))
        })
        .unwrap_or_else(|| panic!("no {kind} *{suffix} rendered"))
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario on one control plane (seconds to start), its steps in order.
fn migrate_reads_the_gpu_operator_from_the_cluster_and_the_chart_renders_its_configs() {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    let kubeconfig = cluster.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();

    // Without the CRD or any NVIDIA DaemonSet: nothing to migrate, said as such.
    let out = gpuops(&["migrate", "--kubeconfig", kubeconfig]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no ClusterPolicy"));

    cluster.apply(CRD).unwrap();
    cluster
        .kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/clusterpolicies.nvidia.com",
            "--timeout=60s",
        ])
        .unwrap();
    cluster
        .apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: gpu-operator}\n")
        .unwrap();
    cluster.apply(&fixture("configmaps.yaml")).unwrap();
    cluster.apply(&fixture("clusterpolicy.yaml")).unwrap();
    let uid = cluster
        .kubectl(&[
            "get",
            "clusterpolicy",
            "cluster-policy",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .unwrap();
    // The device plugin DaemonSet as the operator creates it (owned by the ClusterPolicy), so
    // the operator's namespace is found from it; its config lives in the ClusterPolicy.
    cluster
        .apply(&format!(
            r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: nvidia-device-plugin-daemonset
  namespace: gpu-operator
  ownerReferences:
    - {{apiVersion: nvidia.com/v1, kind: ClusterPolicy, name: cluster-policy, uid: "{uid}", controller: true}}
spec:
  selector: {{matchLabels: {{app: nvidia-device-plugin-daemonset}}}}
  template:
    metadata: {{labels: {{app: nvidia-device-plugin-daemonset}}}}
    spec:
      nodeSelector: {{nvidia.com/gpu.deploy.device-plugin: "true"}}
      containers:
        - name: nvidia-device-plugin
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          command: [nvidia-device-plugin]
          env: [{{name: MIG_STRATEGY, value: mixed}}]
"#
        ))
        .unwrap();
    // A node as GFD and NVIDIA's device plugin left it.
    let nodes = docs(&fixture("nodes.yaml"));
    let node = &nodes[0]["items"][0];
    let mut meta_only = node.clone();
    meta_only.as_object_mut().unwrap().remove("status");
    cluster
        .apply(&serde_json::to_string(&meta_only).unwrap())
        .unwrap();
    let status = serde_json::json!({"status": {"capacity": node["status"]["allocatable"], "allocatable": node["status"]["allocatable"]}});
    cluster
        .kubectl(&[
            "patch",
            "node",
            "gpu-a",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ])
        .unwrap();

    // Read from the cluster: every setting carried over.
    let values_path = cluster.dir().join("values.yaml");
    let out = gpuops(&[
        "migrate",
        "--kubeconfig",
        kubeconfig,
        "-o",
        values_path.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&values_path).unwrap()).unwrap();
    assert_eq!(values["migStrategy"], "mixed");

    // The chart renders them into a DaemonSet whose args and env carry the same config, and
    // ConfigMaps holding NVIDIA's config texts unchanged.
    let objects = helm_template(&cluster, &values_path);
    let ds = find(&objects, "DaemonSet", "gpuops");
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--config-dir=/etc/gpuops/device-plugin",
        "--default-config=any",
        "--mig-config-file=/etc/gpuops/mig/config.yaml",
        "--mig-default-config=all-disabled",
        "--nvidia-driver-root=/run/nvidia/driver",
    ] {
        assert!(args.contains(&want), "{want} not in {args:?}");
    }
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("MIG_STRATEGY"), Some(Value::from("mixed")));
    assert_eq!(env("PASS_DEVICE_SPECS"), Some(Value::from("true")));
    assert_eq!(env("FAIL_ON_INIT_ERROR"), Some(Value::from("true")));
    assert_eq!(ds["spec"]["template"]["spec"]["runtimeClassName"], "nvidia");
    let cms = docs(&fixture("configmaps.yaml"));
    let dp = find(&objects, "ConfigMap", "device-plugin-configs");
    // Compared without trailing line breaks, which the chart's block scalars normalise.
    let trimmed = |v: &Value| v.as_str().unwrap().trim_end().to_string();
    assert_eq!(trimmed(&dp["data"]["any"]), trimmed(&cms[0]["data"]["any"]));
    let mig = find(&objects, "ConfigMap", "mig-config");
    assert_eq!(
        trimmed(&mig["data"]["config.yaml"]),
        trimmed(&cms[1]["data"]["config.yaml"])
    );

    // --check on the GFD-labelled node: nothing changes.
    let out = gpuops(&["migrate", "--kubeconfig", kubeconfig, "--check"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert_eq!(
        stdout,
        "gpu-a (device plugin config any): no change (11 labels and resources kept as they are)\n"
    );

    // A config key the ClusterPolicy names that the ConfigMap lost: refused, naming both.
    cluster
        .apply(&fixture("configmaps.yaml").replace("  any: |-", "  other: |-"))
        .unwrap();
    let out = gpuops(&["migrate", "--kubeconfig", kubeconfig]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.devicePlugin.config.default names config \"any\", which ConfigMap gpu-operator/time-slicing-config does not have"),
        "{err}"
    );
}
