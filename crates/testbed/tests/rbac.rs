//! Least privilege, proven for the node agent (deploy/gpuops.yaml) and the scheduler extender
//! (deploy/scheduler/rbac.yaml): with each one's own ServiceAccount token, every resource the
//! apiserver serves x every verb is asked (SelfSubjectAccessReview) and must be allowed exactly
//! as listed here; a handful of real requests must be Forbidden. The manifest checks (no wildcard
//! rules, pod security settings, every hostPath documented in SECURITY.md) need no cluster.
//!
//! The controller's ClusterRole (branch wip/ctl) gets the same test once merged: add its grants
//! as a `const` like `AGENT` and a test like `the_agent_may_do_exactly_what_it_needs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::rbac::{self, Grant};
use gpuops_testbed::{Cluster, ClusterOptions};
use std::path::Path;

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The agent: its own Node (labels, taint, the GPUHealthy condition) and Events about it. It
/// reads pods through the kubelet's PodResources socket, so nothing about pods, secrets or
/// configmaps.
const AGENT: &[Grant<'static>] = &[
    ("", "nodes", &["get", "list", "watch", "patch"], None),
    ("", "nodes/status", &["patch"], None),
    ("", "events", &["create", "patch"], None),
    ("events.k8s.io", "events", &["create", "patch"], None),
];

/// The extender only reads nodes and pods (kube-scheduler binds).
const EXTENDER: &[Grant<'static>] = &[
    ("", "nodes", &["get", "list", "watch"], None),
    ("", "pods", &["get", "list", "watch"], None),
];

/// Every hostPath the chart mounts; SECURITY.md says why each is needed.
const HOST_PATHS: &[&str] = &[
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/pod-resources",
    "/dev",
    "/var/lib/gpuops",
];

#[test]
fn no_role_in_the_manifests_has_a_wildcard() {
    for file in ["deploy/gpuops.yaml", "deploy/scheduler/rbac.yaml"] {
        let found = rbac::wildcard_rules(&repo_file(file)).unwrap();
        assert!(found.is_empty(), "{file}: {found:#?}");
    }
}

#[test]
fn the_wildcard_check_finds_wildcards() {
    let role = "kind: ClusterRole\nmetadata: {name: r}\nrules:\n- apiGroups: ['']\n  resources: [nodes]\n  verbs: [get]\n- apiGroups: [apps]\n  resources: ['*']\n  verbs: [get]\n";
    assert_eq!(
        rbac::wildcard_rules(role).unwrap(),
        ["ClusterRole/r rule 1: resources has a wildcard"]
    );
}

/// As rendered on main now; the lead re-renders deploy/gpuops.yaml after the chart's security
/// changes merge (drop ALL, privileged only with MIG), and this test then checks those too.
#[test]
fn the_agent_pod_has_a_read_only_root_and_only_the_documented_host_paths() {
    let problems =
        rbac::pod_security_problems(&repo_file("deploy/gpuops.yaml"), HOST_PATHS).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_pod_security_check_finds_each_problem() {
    let ds = "kind: DaemonSet\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      hostPID: true\n      volumes:\n      - {name: root, hostPath: {path: /}}\n      containers:\n      - name: a\n        args: [agent]\n        securityContext: {privileged: true}\n      - name: b\n        securityContext: {readOnlyRootFilesystem: true}\n";
    let found = rbac::pod_security_problems(ds, HOST_PATHS).unwrap();
    assert_eq!(
        found,
        [
            "DaemonSet/d: hostPath / is not in the allowed list",
            "DaemonSet/d: shares a host namespace (network, PID or IPC)",
            "DaemonSet/d container a: root filesystem is writable",
            "DaemonSet/d container a: privileged without MIG management (--mig-config-file)",
            "DaemonSet/d container b: does not drop ALL capabilities",
            "DaemonSet/d container b: allowPrivilegeEscalation is not false",
        ]
    );
}

#[test]
fn security_md_explains_every_host_path_and_the_agent_mounts_no_other() {
    let security = repo_file("SECURITY.md");
    for p in HOST_PATHS {
        assert!(
            security.contains(&format!("`{p}`")),
            "SECURITY.md does not explain {p}"
        );
    }
    let manifest = repo_file("deploy/gpuops.yaml");
    let mounted: Vec<String> = rbac::documents(&manifest)
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_string))
        .collect();
    let mut sorted = mounted.clone();
    sorted.sort();
    let mut listed: Vec<String> = HOST_PATHS.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        sorted, listed,
        "the chart's hostPaths changed: update HOST_PATHS and SECURITY.md"
    );
}

fn started_with(manifest: &str, namespace: &str, account: &str) -> (Cluster, String) {
    let cluster = Cluster::start(ClusterOptions {
        scheduler: false,
        ..ClusterOptions::default()
    })
    .unwrap();
    cluster
        .apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"
        ))
        .unwrap();
    assert!(rbac::apply_rbac(&cluster, manifest).unwrap() >= 3);
    // A Node to aim the must-be-Forbidden writes at (a missing one would answer NotFound).
    cluster
        .apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: any-node\n")
        .unwrap();
    let user = rbac::service_account_user(&cluster, namespace, account).unwrap();
    // RBAC objects take effect when the apiserver's informers see them: wait for the first grant.
    gpuops_testbed::wait_until(
        "the ServiceAccount's RBAC",
        std::time::Duration::from_secs(30),
        || cluster.kubectl_as(&user, &["get", "nodes"]).is_ok(),
    )
    .unwrap();
    (cluster, user)
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_agent_may_do_exactly_what_it_needs() {
    let (cluster, user) = started_with(&repo_file("deploy/gpuops.yaml"), "gpuops", "gpuops");
    let report = rbac::assert_exact_access(&cluster, &user, AGENT);
    assert!(
        report.resources > 50,
        "discovery listed {}",
        report.resources
    );
    assert!(report.checked > 500, "only {} questions", report.checked);
    eprintln!(
        "agent: {} questions over {} resources, exactly as expected",
        report.checked, report.resources
    );
    for args in [
        &["get", "secrets", "-n", "kube-system"][..],
        &["get", "configmaps", "-n", "gpuops"],
        &["get", "pods", "-A"],
        &["delete", "node", "any-node"],
        &["create", "namespace", "evil"],
        &["auth", "can-i", "--list", "--as=system:admin"],
    ] {
        assert!(
            rbac::forbidden(&cluster, &user, args).unwrap(),
            "agent: kubectl {args:?} was not Forbidden"
        );
    }
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_extender_may_do_exactly_what_it_needs() {
    let (cluster, user) = started_with(
        &repo_file("deploy/scheduler/rbac.yaml"),
        "gpuops",
        "gpuops-scheduler-extender",
    );
    let report = rbac::assert_exact_access(&cluster, &user, EXTENDER);
    eprintln!(
        "extender: {} questions over {} resources, exactly as expected",
        report.checked, report.resources
    );
    for args in [
        &["get", "secrets", "-A"][..],
        &["label", "node", "any-node", "x=y"],
        &["create", "configmap", "x", "-n", "gpuops"],
        &["delete", "pod", "any-pod", "-n", "default"],
    ] {
        assert!(
            rbac::forbidden(&cluster, &user, args).unwrap(),
            "extender: kubectl {args:?} was not Forbidden"
        );
    }
}

/// The helper must be able to fail: an identity with one grant too many is caught.
#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn an_extra_grant_is_reported() {
    let (cluster, user) = started_with(
        &repo_file("deploy/scheduler/rbac.yaml"),
        "gpuops",
        "gpuops-scheduler-extender",
    );
    let report = rbac::exact_access(&cluster, &user, &EXTENDER[..1]).unwrap();
    assert!(!report.is_exact());
    assert!(report.missing.is_empty(), "{:?}", report.missing);
    let extra: Vec<String> = report.unexpected.iter().map(|a| a.to_string()).collect();
    assert!(
        extra.contains(&"list core/pods (all namespaces/cluster)".to_string()),
        "{extra:#?}"
    );
    assert!(
        extra.contains(&"watch core/pods (namespace kube-system)".to_string()),
        "{extra:#?}"
    );
    assert_eq!(extra.len(), 6, "{extra:#?}");
    let missing = rbac::exact_access(
        &cluster,
        &user,
        &[
            EXTENDER[0],
            EXTENDER[1],
            ("", "secrets", &["get"], Some("gpuops")),
        ],
    )
    .unwrap();
    assert_eq!(missing.missing.len(), 1, "{:?}", missing.missing);
}
