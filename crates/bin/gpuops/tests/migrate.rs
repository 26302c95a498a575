//! `gpuops migrate` on files: the values, the warnings on stderr, the exit codes and `--check`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/migrate")
        .join(name)
        .display()
        .to_string()
}

fn gpuops(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuops"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_cluster_policy_with_its_config_maps_becomes_values_that_carry_everything() {
    let cp = fixture("clusterpolicy.yaml");
    let cms = fixture("configmaps.yaml");
    let out = gpuops(&["migrate", "-f", &cp, "-f", &cms], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    let values: Value = serde_saphyr::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(values["migStrategy"], "mixed");
    assert_eq!(values["devicePlugin"]["defaultConfig"], "any");
    assert!(
        values["devicePlugin"]["configs"]["any"]
            .as_str()
            .unwrap()
            .contains("replicas: 4")
    );
    assert!(
        values["mig"]["config"]
            .as_str()
            .unwrap()
            .contains("all-3g.40gb")
    );
    assert_eq!(
        values["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
    assert_eq!(values["passDeviceSpecs"], "true");
}

#[test]
fn what_cannot_be_carried_over_is_listed_and_exits_3() {
    let cp = std::fs::read_to_string(fixture("clusterpolicy.yaml"))
        .unwrap()
        .replace("value: \"false\"}]", "value: \"true\"}]")
        .replace(
            "nodeStatusExporter: {enabled: false}",
            "nodeStatusExporter: {enabled: true}",
        );
    let cms = fixture("configmaps.yaml");
    let out = gpuops(&["migrate", "-f", "-", "-f", &cms], Some(&cp));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("warning: ClusterPolicy/cluster-policy: spec.migManager.env[WITH_REBOOT]: gpuops never reboots"),
        "{err}"
    );
    assert!(err.contains("spec.nodeStatusExporter.enabled"), "{err}");
    // The values are still written, with the list in their header.
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("# 2 setting(s) could not be carried over"),
        "{stdout}"
    );
    assert!(serde_saphyr::from_str::<Value>(&stdout).unwrap()["migStrategy"] == "mixed");
}

#[test]
fn partial_or_wrong_input_exits_1_naming_object_and_field() {
    let cp = fixture("clusterpolicy.yaml");
    let out = gpuops(&["migrate", "-f", &cp], None);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("ClusterPolicy/cluster-policy: spec.devicePlugin.config.name names ConfigMap \"time-slicing-config\""),
        "{err}"
    );
    assert_eq!(text(&out.stdout), "", "no values on a failure");

    let old = std::fs::read_to_string(&cp)
        .unwrap()
        .replace("nvidia.com/v1", "nvidia.com/v1alpha1");
    let out = gpuops(&["migrate", "-f", "-"], Some(&old));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("apiVersion is \"nvidia.com/v1alpha1\""));

    let cms = std::fs::read_to_string(fixture("configmaps.yaml"))
        .unwrap()
        .replace("  any: |-", "  other: |-");
    let out = gpuops(&["migrate", "-f", &cp, "-f", "-"], Some(&cms));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("spec.devicePlugin.config.default names config \"any\""),
        "{}",
        text(&out.stderr)
    );

    let out = gpuops(&["migrate", "-f", "-"], Some("kind: [unclosed\n"));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("stdin: not YAML or JSON"));
}

#[test]
fn check_reports_no_change_on_a_node_gfd_labelled_and_exits_4_when_one_changes() {
    let cp = fixture("clusterpolicy.yaml");
    let cms = fixture("configmaps.yaml");
    let nodes = fixture("nodes.yaml");
    let out = gpuops(
        &["migrate", "-f", &cp, "-f", &cms, "-f", &nodes, "--check"],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "gpu-a (device plugin config any): no change (11 labels and resources kept as they are)\n"
    );

    let changed = std::fs::read_to_string(&nodes)
        .unwrap()
        .replace(
            "nvidia.com/gpu.replicas: \"4\"",
            "nvidia.com/gpu.replicas: \"2\"",
        )
        .replace(
            "nvidia.com/gpu.present: \"true\"",
            "nvidia.com/vgpu.present: \"false\"",
        );
    let out = gpuops(
        &["migrate", "-f", &cp, "-f", &cms, "-f", "-", "--check"],
        Some(&changed),
    );
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("gpu-a (device plugin config any): 3 change(s)"),
        "{s}"
    );
    assert!(s.contains("label nvidia.com/gpu.replicas: 2 -> 4"), "{s}");
    assert!(
        s.contains("label nvidia.com/vgpu.present: false -> false: not written by gpuops"),
        "{s}"
    );
    assert!(
        s.contains("label nvidia.com/gpu.present: (none) -> true"),
        "{s}"
    );
}

#[test]
fn help_has_examples_and_exit_codes() {
    let out = gpuops(&["migrate", "--help"], None);
    let s = text(&out.stdout);
    for want in [
        "Examples:",
        "gpuops migrate -f clusterpolicy.yaml -f cm.yaml",
        "--check",
        "Exit codes: 0",
    ] {
        assert!(s.contains(want), "{want} missing from:\n{s}");
    }
}
