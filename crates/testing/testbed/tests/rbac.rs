//! Least privilege, proven for the node agent (deploy/gpuops.yaml), the scheduler extender
//! (deploy/scheduler/rbac.yaml) and the controller (the chart's templates/controller.yaml,
//! rendered by Helm with `controller.enabled=true`): with each one's own ServiceAccount token,
//! every resource the apiserver serves x every verb is asked (SelfSubjectAccessReview) and must be
//! allowed exactly as listed here; a handful of real requests must be Forbidden. The manifest
//! checks (no wildcard rules, pod security settings, every hostPath documented in SECURITY.md)
//! need no cluster; the controller's need Helm only.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_testbed::rbac::{self, Grant};
use gpuops_testbed::{Cluster, ClusterOptions};
use std::path::Path;

fn repo_file(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../..")
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

/// The controller, from what its code calls: reflectors (list, watch) on nodes, pods, PDBs,
/// MachineDeployments, Machines, ResourceClaims, ResourceClaimTemplates and DeviceClasses;
/// cordon (patch nodes); evictions; a Machine read and annotated
/// before its pool's scale subresource is lowered; events.k8s.io Events (kube's Recorder creates,
/// then patches a repeat); in its own namespace the leader Lease (kube-lease-manager: get, create,
/// patch) and the status ConfigMap (server-side apply: patch, create the first time; get by
/// name, [`CONTROLLER_NAMED`]: a new leader reads back the last one's memory). The MIG
/// reconciler also reads the agents' MIG ConfigMap by name ([`CONTROLLER_NAMED`]) and merges
/// its configs in with the patch it already has, and labels nodes (patch).
/// crates/runtime/controller/tests/e2e_controller.rs runs the controller on this chart's role.
const CONTROLLER: &[Grant<'static>] = &[
    ("", "nodes", &["list", "watch", "patch"], None),
    ("", "pods", &["list", "watch"], None),
    ("", "pods/eviction", &["create"], None),
    ("policy", "poddisruptionbudgets", &["list", "watch"], None),
    (
        "cluster.x-k8s.io",
        "machinedeployments",
        &["list", "watch"],
        None,
    ),
    (
        "cluster.x-k8s.io",
        "machinedeployments/scale",
        &["patch"],
        None,
    ),
    (
        "cluster.x-k8s.io",
        "machines",
        &["get", "list", "watch", "patch"],
        None,
    ),
    // Reflectors on the DRA objects: pending pods' ResourceClaims are demand.
    (
        "resource.k8s.io",
        "resourceclaims",
        &["get", "list", "watch"],
        None,
    ),
    (
        "resource.k8s.io",
        "resourceclaimtemplates",
        &["get", "list", "watch"],
        None,
    ),
    (
        "resource.k8s.io",
        "deviceclasses",
        &["get", "list", "watch"],
        None,
    ),
    ("events.k8s.io", "events", &["create", "patch"], None),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "patch"],
        Some("gpuops"),
    ),
    ("", "configmaps", &["create", "patch"], Some("gpuops")),
];

/// What may be done to one object granted by `resourceNames`, which the unnamed questions of
/// `assert_exact_access` cannot see: (resource, namespace, name, verbs). `get` is the named
/// grant; create and patch come from the namespace-wide ConfigMap grant.
const CONTROLLER_NAMED: &[(&str, &str, &str, &[&str])] = &[
    (
        "configmaps",
        "gpuops",
        "gpuops-mig-config",
        &["get", "create", "patch"],
    ),
    (
        "configmaps",
        "gpuops",
        "gpuops-autoscaler-status",
        &["get", "create", "patch"],
    ),
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

/// The chart's controller objects (release gpuops in namespace gpuops, as deploy/gpuops.yaml is
/// rendered), by the Helm the test bed builds: deploy/gpuops.yaml leaves the controller off.
fn controller_manifest() -> String {
    let bin = std::env::var(gpuops_testbed::BIN_ENV).unwrap_or_else(|_| {
        panic!(
            "{} is not set: run tests/k8s/build.sh",
            gpuops_testbed::BIN_ENV
        )
    });
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../deploy/helm/gpuops");
    let out = std::process::Command::new(Path::new(&bin).join("helm"))
        .arg("template")
        .arg("gpuops")
        .arg(&chart)
        .args([
            "-n",
            "gpuops",
            "--set",
            "controller.enabled=true",
            "--set",
            "controller.mig.enabled=true",
            "--show-only",
            "templates/controller.yaml",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Just enough of Cluster API's CRDs that discovery lists the kinds the controller touches (and
/// their scale subresource), so every verb on them is asked, not only the granted ones.
const CAPI_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: machinedeployments.cluster.x-k8s.io}
spec:
  group: cluster.x-k8s.io
  scope: Namespaced
  names: {plural: machinedeployments, singular: machinedeployment, kind: MachineDeployment}
  versions:
  - name: v1beta2
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: machines.cluster.x-k8s.io}
spec:
  group: cluster.x-k8s.io
  scope: Namespaced
  names: {plural: machines, singular: machine, kind: Machine}
  versions:
  - name: v1beta2
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
    subresources: {status: {}}
"#;

#[test]
#[ignore = "needs Helm (GPUOPS_K8S_BIN): run scripts/test"]
fn the_controllers_role_has_no_wildcard_and_its_pod_is_locked_down() {
    let manifest = controller_manifest();
    let found = rbac::wildcard_rules(&manifest).unwrap();
    assert!(found.is_empty(), "{found:#?}");
    let kinds: Vec<String> = rbac::documents(&manifest)
        .unwrap()
        .iter()
        .filter_map(|d| d["kind"].as_str().map(str::to_string))
        .collect();
    assert!(kinds.contains(&"Deployment".to_string()), "{kinds:?}");
    // No hostPath at all: the controller only talks to the apiserver.
    let problems = rbac::pod_security_problems(&manifest, &[]).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
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

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
fn the_controller_may_do_exactly_what_it_needs() {
    let manifest = controller_manifest();
    let (cluster, user) = started_with(&manifest, "gpuops", "gpuops-controller");
    cluster.apply(CAPI_CRDS).unwrap();
    gpuops_testbed::wait_until(
        "discovery to serve the Cluster API kinds",
        std::time::Duration::from_secs(30),
        || {
            rbac::discover(&cluster).is_ok_and(|r| {
                r.iter().any(|a| {
                    a.group == "cluster.x-k8s.io" && a.resource == "machinedeployments/scale"
                }) && r
                    .iter()
                    .any(|a| a.group == "cluster.x-k8s.io" && a.resource == "machines")
            })
        },
    )
    .unwrap();
    let report = rbac::assert_exact_access(&cluster, &user, CONTROLLER);
    assert!(
        report.resources > 50,
        "discovery listed {}",
        report.resources
    );
    eprintln!(
        "controller: {} questions over {} resources, exactly as expected",
        report.checked, report.resources
    );
    for args in [
        &["get", "secrets", "-n", "gpuops"][..],
        &["get", "configmaps", "-n", "kube-system"],
        &["delete", "node", "any-node"],
        &["delete", "pod", "any-pod", "-n", "default"],
        &["create", "namespace", "evil"],
        &[
            "delete",
            "machinedeployment.cluster.x-k8s.io",
            "any-md",
            "-n",
            "default",
        ],
        &["get", "leases", "-n", "kube-system"],
        &["get", "configmap", "other", "-n", "gpuops"],
    ] {
        assert!(
            rbac::forbidden(&cluster, &user, args).unwrap(),
            "controller: kubectl {args:?} was not Forbidden"
        );
    }
    for (resource, ns, name, verbs) in CONTROLLER_NAMED {
        for verb in rbac::VERBS {
            let allowed = cluster
                .kubectl_as(
                    &user,
                    &[
                        "auth",
                        "can-i",
                        verb,
                        &format!("{resource}/{name}"),
                        "-n",
                        ns,
                    ],
                )
                .is_ok_and(|a| a.trim() == "yes");
            assert_eq!(
                allowed,
                verbs.contains(verb),
                "controller: {verb} {resource}/{name} in {ns}"
            );
        }
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

/// The macros whose output reaches a log or a user: tracing's, printing, `#[error]` messages and
/// anyhow's. `format!` alone is not here: building a header or a kubeconfig file is its job.
const LOGGING: &[&str] = &[
    "trace!(",
    "debug!(",
    "info!(",
    "warn!(",
    "error!(",
    "println!(",
    "eprintln!(",
    "print!(",
    "eprint!(",
    "#[error(",
    "anyhow!(",
    "bail!(",
    ".context(",
    "with_context(",
];

/// Identifiers inside one macro call: its code outside string literals, and `{name}` captures.
fn identifiers(call: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_str = false;
    let mut chars = call.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                '{' => {
                    let mut cap = String::new();
                    while let Some(&n) = chars.peek() {
                        if n.is_alphanumeric() || n == '_' || n == '.' {
                            cap.push(n);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    if !cap.is_empty() {
                        out.push(cap);
                    }
                }
                _ => {}
            }
            continue;
        }
        if c.is_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if c == '"' {
            in_str = true;
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn credential_like(ident: &str) -> bool {
    let i = ident.to_ascii_lowercase();
    // A list's continue token is a paging cursor, not a credential.
    (i.contains("token") && !i.contains("continue"))
        || i.contains("password")
        || i.contains("secret")
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every logging call in `source` that formats a credential-like value, as `line: text`.
fn credential_logging(source: &str) -> Vec<String> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("//") || !LOGGING.iter().any(|m| line.contains(m)) {
            continue;
        }
        // The call runs until its statement or attribute ends (a few lines at most).
        let end = (i..lines.len().min(i + 12))
            .find(|j| {
                let t = lines[*j].trim_end();
                t.ends_with(';') || t.ends_with(")]") || t.ends_with('?')
            })
            .unwrap_or(i);
        let call = lines[i..=end].join("\n");
        if identifiers(&call).iter().any(|id| credential_like(id)) {
            found.push(format!("{}: {}", i + 1, line.trim()));
        }
    }
    found
}

#[test]
fn the_credential_scan_finds_a_logged_token() {
    assert_eq!(
        credential_logging("fn f() {\n    tracing::info!(\"using {token}\");\n}\n").len(),
        1
    );
    assert_eq!(
        credential_logging(
            "    warn!(\"auth failed\",\n        bearer_token = %t.bearer_token,\n    );\n"
        )
        .len(),
        1
    );
    assert!(
        credential_logging("    info!(\"read --prometheus-token-file {}\", path.display());\n")
            .is_empty()
    );
    assert!(
        credential_logging("    debug!(\"page\", next = ?params.continue_token);\n").is_empty()
    );
}

#[test]
fn no_log_or_error_message_prints_a_credential() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for layer in std::fs::read_dir(&crates).unwrap() {
        let layer = layer.unwrap().path();
        // Test support writes tokens into the test bed's kubeconfigs; modcheck's tokens are Rust's.
        let name = layer.file_name().unwrap().to_string_lossy().to_string();
        if ["testing", "tools"].contains(&name.as_str()) || !layer.is_dir() {
            continue;
        }
        for c in std::fs::read_dir(&layer).unwrap() {
            let c = c.unwrap().path();
            if c.join("src").is_dir() {
                rust_files(&c.join("src"), &mut files);
            }
        }
    }
    assert!(files.len() > 50, "only {} source files found", files.len());
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Unit tests may print their own fake tokens.
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        for hit in credential_logging(code) {
            found.push(format!("{}:{hit}", f.display()));
        }
    }
    assert!(
        found.is_empty(),
        "logging that formats a credential:\n{}",
        found.join("\n")
    );
}
