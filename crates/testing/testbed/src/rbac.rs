//! Least privilege, proven: with a component's own ServiceAccount token, ask the apiserver
//! (SelfSubjectAccessReview) about every resource it serves and every verb, and compare the answers
//! with exactly what the component should be allowed; plus checks of the manifests' RBAC rules and
//! pod security settings.

use crate::{BedError, Cluster};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::PathBuf;

/// What a component may do: (API group, resource or `resource/subresource`, verbs, namespace).
/// `None` grants it in every namespace (a ClusterRole); `Some(ns)` only there (a Role).
pub type Grant<'a> = (&'a str, &'a str, &'a [&'a str], Option<&'a str>);

/// The verbs checked on every resource the apiserver serves.
pub const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// What Kubernetes' default ClusterRoles (system:basic-user and friends) let every authenticated
/// identity do: ask what it may do, and who it is.
pub const BASELINE: &[Grant<'static>] = &[
    (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        &["create"],
        None,
    ),
    (
        "authorization.k8s.io",
        "selfsubjectrulesreviews",
        &["create"],
        None,
    ),
    (
        "authentication.k8s.io",
        "selfsubjectreviews",
        &["create"],
        None,
    ),
];

/// The escalation verbs, on the resources where they mean something.
const SPECIAL: &[(&str, &str, &str)] = &[
    ("", "users", "impersonate"),
    ("", "groups", "impersonate"),
    ("", "serviceaccounts", "impersonate"),
    ("authentication.k8s.io", "uids", "impersonate"),
    ("authentication.k8s.io", "userextras", "impersonate"),
    ("rbac.authorization.k8s.io", "clusterroles", "bind"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
    ("rbac.authorization.k8s.io", "roles", "bind"),
    ("rbac.authorization.k8s.io", "roles", "escalate"),
    (
        "certificates.k8s.io",
        "certificatesigningrequests/approval",
        "approve",
    ),
    ("certificates.k8s.io", "signers", "approve"),
    ("certificates.k8s.io", "signers", "sign"),
];

/// One resource the apiserver serves (from discovery), subresources included (`pods/log`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiResource {
    pub group: String,
    pub resource: String,
    pub namespaced: bool,
}

/// One access question: may the identity `verb` `resource` of `group` in `namespace` (`""`: in
/// every namespace, or cluster-scoped)?
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub namespace: String,
}

impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        let ns = if self.namespace.is_empty() {
            "all namespaces/cluster".to_string()
        } else {
            format!("namespace {}", self.namespace)
        };
        write!(f, "{} {}/{} ({ns})", self.verb, group, self.resource)
    }
}

/// The outcome of [`exact_access`].
#[derive(Debug, Clone, Default)]
pub struct AccessReport {
    /// Questions asked.
    pub checked: usize,
    /// Resources discovery listed.
    pub resources: usize,
    /// Allowed though not expected: the excess privilege.
    pub unexpected: Vec<Access>,
    /// Expected but Forbidden: the component would fail.
    pub missing: Vec<Access>,
}

impl AccessReport {
    pub fn is_exact(&self) -> bool {
        self.unexpected.is_empty() && self.missing.is_empty()
    }
}

fn manifest_err(what: impl Into<String>, message: impl std::fmt::Display) -> BedError {
    BedError::Manifest {
        what: what.into(),
        message: message.to_string(),
    }
}

/// The YAML documents of a manifest file, as JSON (empty documents dropped).
pub fn documents(manifest: &str) -> Result<Vec<Value>, BedError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(manifest)
        .map_err(|e| manifest_err("parsing the manifest", e))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

const RBAC_KINDS: &[&str] = &[
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// Applies the manifest's Namespaces, ServiceAccounts and RBAC objects (nothing that would start
/// a workload), as the admin.
pub fn apply_rbac(cluster: &Cluster, manifest: &str) -> Result<usize, BedError> {
    let docs: Vec<Value> = documents(manifest)?
        .into_iter()
        .filter(|d| RBAC_KINDS.contains(&d["kind"].as_str().unwrap_or_default()))
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
    cluster.apply(&list.to_string())?;
    Ok(docs.len())
}

/// Every rule of the manifest's Roles and ClusterRoles with a `*` in its groups, resources or
/// verbs, as `Kind/name: field`.
pub fn wildcard_rules(manifest: &str) -> Result<Vec<String>, BedError> {
    let mut out = Vec::new();
    for d in documents(manifest)? {
        let kind = d["kind"].as_str().unwrap_or_default();
        if kind != "ClusterRole" && kind != "Role" {
            continue;
        }
        let name = d["metadata"]["name"].as_str().unwrap_or("?");
        for (i, rule) in d["rules"].as_array().into_iter().flatten().enumerate() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                let wild = rule[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|v| v.as_str().is_some_and(|s| s.contains('*')));
                if wild {
                    out.push(format!("{kind}/{name} rule {i}: {field} has a wildcard"));
                }
            }
        }
        if !d["aggregationRule"].is_null() {
            out.push(format!(
                "{kind}/{name}: aggregationRule (grants what others add)"
            ));
        }
    }
    Ok(out)
}

/// Makes a token for ServiceAccount `namespace/name` (TokenRequest, as the kubelet does for a
/// pod) and writes a kubeconfig with it; returns the user name to pass to
/// [`Cluster::kubectl_as`] and [`exact_access`].
pub fn service_account_user(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> Result<String, BedError> {
    let token = cluster.kubectl(&["create", "token", name, "-n", namespace, "--duration=1h"])?;
    let user = format!("sa-{namespace}-{name}");
    let path: PathBuf = cluster.kubeconfig_for(&user);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: {user}\n  user:\n    token: {}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: {user}\ncurrent-context: bed\n",
        cluster.server(),
        token.trim()
    );
    std::fs::write(&path, text)
        .map_err(|e| BedError::io(format!("writing {}", path.display()), e))?;
    Ok(user)
}

/// Every resource and subresource the apiserver serves, in each group's preferred version.
pub fn discover(cluster: &Cluster) -> Result<Vec<ApiResource>, BedError> {
    let raw = |path: &str| -> Result<Value, BedError> {
        let text = cluster.kubectl(&["get", "--raw", path])?;
        serde_json::from_str(&text).map_err(|e| manifest_err(format!("discovery {path}"), e))
    };
    let mut lists = vec![(String::new(), raw("/api/v1")?)];
    for g in raw("/apis")?["groups"].as_array().into_iter().flatten() {
        let (Some(name), Some(gv)) = (
            g["name"].as_str(),
            g["preferredVersion"]["groupVersion"].as_str(),
        ) else {
            continue;
        };
        lists.push((name.to_string(), raw(&format!("/apis/{gv}"))?));
    }
    let mut out = BTreeSet::new();
    for (group, list) in lists {
        for r in list["resources"].as_array().into_iter().flatten() {
            if let Some(name) = r["name"].as_str() {
                out.insert(ApiResource {
                    group: group.clone(),
                    resource: name.to_string(),
                    namespaced: r["namespaced"].as_bool().unwrap_or(false),
                });
            }
        }
    }
    if out.is_empty() {
        return Err(manifest_err(
            "discovery",
            "the apiserver listed no resources",
        ));
    }
    Ok(out.into_iter().collect())
}

/// Asks the apiserver, as `user`, each question (one SelfSubjectAccessReview each, in one kubectl
/// call); the answers in order.
pub fn can(cluster: &Cluster, user: &str, questions: &[Access]) -> Result<Vec<bool>, BedError> {
    let mut answers = Vec::with_capacity(questions.len());
    // A few hundred reviews per kubectl call keeps each call's input and output small.
    for chunk in questions.chunks(400) {
        let items: Vec<Value> = chunk
            .iter()
            .map(|q| {
                let (resource, sub) = q.resource.split_once('/').unwrap_or((&q.resource, ""));
                json!({
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": {
                        "group": q.group, "resource": resource, "subresource": sub,
                        "verb": q.verb, "namespace": q.namespace,
                    }},
                })
            })
            .collect();
        let path = cluster
            .dir()
            .join(format!("ssar-{user}-{}.json", answers.len()));
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        std::fs::write(&path, list.to_string())
            .map_err(|e| BedError::io(format!("writing {}", path.display()), e))?;
        let path_arg = path.display().to_string();
        let out = cluster.kubectl_as(user, &["create", "-f", &path_arg, "-o", "json"])?;
        // kubectl prints one JSON object per created item, one after the other.
        let values: Vec<Value> = serde_json::Deserializer::from_str(&out)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .map_err(|e| manifest_err("SelfSubjectAccessReview answers", e))?;
        let results: Vec<&Value> = values
            .iter()
            .flat_map(|v| {
                if v["kind"] == "List" {
                    v["items"].as_array().into_iter().flatten().collect()
                } else {
                    vec![v]
                }
            })
            .collect();
        if results.len() != chunk.len() {
            return Err(manifest_err(
                "SelfSubjectAccessReview answers",
                format!("{} answers to {} questions", results.len(), chunk.len()),
            ));
        }
        for (q, r) in chunk.iter().zip(results) {
            let attrs = &r["spec"]["resourceAttributes"];
            let (resource, _) = q.resource.split_once('/').unwrap_or((&q.resource, ""));
            if attrs["verb"] != q.verb.as_str() || attrs["resource"] != resource {
                return Err(manifest_err(
                    "SelfSubjectAccessReview answers",
                    format!("answer {attrs} is not about {q}"),
                ));
            }
            answers.push(r["status"]["allowed"].as_bool().unwrap_or(false));
        }
    }
    Ok(answers)
}

fn granted(expected: &[Grant<'_>], q: &Access) -> bool {
    expected.iter().chain(BASELINE).any(|(g, r, verbs, ns)| {
        *g == q.group
            && *r == q.resource
            && verbs.contains(&q.verb.as_str())
            && ns.is_none_or(|n| n == q.namespace)
    })
}

/// Every question [`exact_access`] asks: each discovered resource x [`VERBS`] (namespaced ones
/// across all namespaces, in `namespaces` and in kube-system), plus the escalation verbs.
pub fn questions(resources: &[ApiResource], namespaces: &[&str]) -> Vec<Access> {
    let mut ns_list: Vec<&str> = vec!["", "kube-system"];
    ns_list.extend(
        namespaces
            .iter()
            .copied()
            .filter(|n| !n.is_empty() && *n != "kube-system"),
    );
    let mut out = BTreeSet::new();
    for r in resources {
        let spaces: &[&str] = if r.namespaced { &ns_list } else { &[""] };
        for ns in spaces {
            for verb in VERBS {
                out.insert(Access {
                    group: r.group.clone(),
                    resource: r.resource.clone(),
                    verb: (*verb).to_string(),
                    namespace: (*ns).to_string(),
                });
            }
        }
    }
    for (group, resource, verb) in SPECIAL {
        out.insert(Access {
            group: (*group).to_string(),
            resource: (*resource).to_string(),
            verb: (*verb).to_string(),
            namespace: String::new(),
        });
    }
    out.into_iter().collect()
}

/// Compares what `user` may do with `expected` (plus [`BASELINE`]) over every resource the
/// apiserver serves, every verb, all namespaces and the namespaces the grants name.
pub fn exact_access(
    cluster: &Cluster,
    user: &str,
    expected: &[Grant<'_>],
) -> Result<AccessReport, BedError> {
    let resources = discover(cluster)?;
    let named: Vec<&str> = expected.iter().filter_map(|g| g.3).collect();
    let mut questions = questions(&resources, &named);
    // A grant on something discovery does not list (a typo, a removed API) must still be asked.
    for (g, r, verbs, ns) in expected {
        for v in *verbs {
            let q = Access {
                group: (*g).to_string(),
                resource: (*r).to_string(),
                verb: (*v).to_string(),
                namespace: ns.unwrap_or_default().to_string(),
            };
            if !questions.contains(&q) {
                questions.push(q);
            }
        }
    }
    let answers = can(cluster, user, &questions)?;
    let mut report = AccessReport {
        checked: questions.len(),
        resources: resources.len(),
        ..AccessReport::default()
    };
    for (q, allowed) in questions.into_iter().zip(answers) {
        match (allowed, granted(expected, &q)) {
            (true, false) => report.unexpected.push(q),
            (false, true) => report.missing.push(q),
            _ => {}
        }
    }
    Ok(report)
}

/// [`exact_access`], panicking with every difference: for tests.
#[allow(clippy::panic)] // an assertion helper: the panic is the test failure
pub fn assert_exact_access(cluster: &Cluster, user: &str, expected: &[Grant<'_>]) -> AccessReport {
    let report = match exact_access(cluster, user, expected) {
        Ok(r) => r,
        Err(e) => panic!("checking the access of {user}: {e}"),
    };
    if !report.is_exact() {
        let list = |v: &[Access]| {
            v.iter()
                .map(|a| format!("  {a}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "{user}: access differs from what it needs ({} questions over {} resources)\nallowed but not expected:\n{}\nexpected but Forbidden:\n{}",
            report.checked,
            report.resources,
            list(&report.unexpected),
            list(&report.missing)
        );
    }
    report
}

/// Runs `kubectl ARGS` as `user`: Ok(true) when the apiserver answered Forbidden, Ok(false) when
/// it did it; other failures are errors.
pub fn forbidden(cluster: &Cluster, user: &str, args: &[&str]) -> Result<bool, BedError> {
    match cluster.kubectl_as(user, args) {
        Ok(_) => Ok(false),
        // `Error from server (Forbidden)`, or kubectl's own wording for some verbs
        // (`failed to create configmap: configmaps is forbidden`).
        Err(BedError::Kubectl { message, .. })
            if message.contains("Forbidden") || message.contains("is forbidden: User") =>
        {
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

/// Security settings of every container of the manifest's workloads that break the rules:
/// a writable root filesystem, privileged without MIG management (`--mig-config-file`),
/// privilege escalation allowed or capabilities not dropped when not privileged, and hostPath
/// volumes outside `allowed_host_paths`.
pub fn pod_security_problems(
    manifest: &str,
    allowed_host_paths: &[&str],
) -> Result<Vec<String>, BedError> {
    let mut out = Vec::new();
    for d in documents(manifest)? {
        let kind = d["kind"].as_str().unwrap_or_default();
        let spec = match kind {
            "DaemonSet" | "Deployment" | "StatefulSet" | "Job" => &d["spec"]["template"]["spec"],
            "Pod" => &d["spec"],
            _ => continue,
        };
        let name = format!("{kind}/{}", d["metadata"]["name"].as_str().unwrap_or("?"));
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(path) = v["hostPath"]["path"].as_str()
                && !allowed_host_paths.contains(&path)
            {
                out.push(format!(
                    "{name}: hostPath {path} is not in the allowed list"
                ));
            }
        }
        if spec["hostNetwork"] == true || spec["hostPID"] == true || spec["hostIPC"] == true {
            out.push(format!(
                "{name}: shares a host namespace (network, PID or IPC)"
            ));
        }
        let containers = ["initContainers", "containers"]
            .iter()
            .flat_map(|k| spec[*k].as_array().into_iter().flatten());
        for c in containers {
            let cname = format!("{name} container {}", c["name"].as_str().unwrap_or("?"));
            let sc = &c["securityContext"];
            if sc["readOnlyRootFilesystem"] != true {
                out.push(format!("{cname}: root filesystem is writable"));
            }
            let args: Vec<&str> = ["command", "args"]
                .iter()
                .flat_map(|k| c[*k].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
                .collect();
            let mig = args.iter().any(|a| a.starts_with("--mig-config-file"));
            if sc["privileged"] == true {
                if !mig {
                    out.push(format!(
                        "{cname}: privileged without MIG management (--mig-config-file)"
                    ));
                }
            } else {
                let drops_all = sc["capabilities"]["drop"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|c| c == "ALL"));
                if !drops_all {
                    out.push(format!("{cname}: does not drop ALL capabilities"));
                }
                if sc["allowPrivilegeEscalation"] != false {
                    out.push(format!("{cname}: allowPrivilegeEscalation is not false"));
                }
            }
        }
    }
    Ok(out)
}
