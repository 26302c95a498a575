#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Installing gpuops: the Helm chart deploy/helm/gpuops, and deploy/gpuops.yaml (the chart
//! rendered by Helm with its defaults, which `gpuops manifests` prints).
//!
//! Without a cluster: deploy/gpuops.yaml was rendered from the chart as it is now (its
//! chart-digest line matches the chart's files) and `gpuops manifests` prints exactly it; it
//! parses and has the DaemonSet with its tolerations, host mounts, resources, priority class,
//! security context and MIG strategy, and the least-privilege ClusterRole; the chart's MIG config
//! is NVIDIA's default configs as gpuops-mig renders them, its alert rules are
//! deploy/prometheus/gpuops-rules.yaml, its appVersion is the crate's version.
//!
//! Against the real control plane (ignored; scripts/test runs them): `helm template` (Helm built
//! from its Go module by tests/k8s/build.sh) renders the objects of deploy/gpuops.yaml for the
//! defaults, and what every non-default value asks for; `helm install` and `kubectl apply -f
//! deploy/gpuops.yaml` install into the real apiserver; and the agent's ServiceAccount, with a
//! token from the TokenRequest API, can do exactly what the agent needs and nothing else. The
//! DaemonSet's pods never run there (no kubelet runs them), so the agent itself is not started
//! here.
//!
//! `GPUOPS_BLESS=1` rewrites deploy/helm/gpuops/files/default-mig-config.yaml from gpuops-mig;
//! `scripts/render-manifests` rewrites deploy/gpuops.yaml.

mod common;

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/gpuops")
}

/// A multi-document YAML stream as JSON values (empty documents dropped).
fn docs(text: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).expect("valid YAML stream");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn static_manifest_path() -> PathBuf {
    repo().join("deploy/gpuops.yaml")
}

/// deploy/gpuops.yaml as objects.
fn static_manifest() -> Vec<Value> {
    docs(&std::fs::read_to_string(static_manifest_path()).unwrap())
}

/// What Helm renders from (every chart file but its README), hashed as scripts/render-manifests
/// does: path, NUL, content, NUL per file, paths in byte order.
fn chart_digest() -> String {
    use sha2::{Digest, Sha256};
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, PathBuf)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else {
                let rel = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string();
                out.push((rel, path));
            }
        }
    }
    let mut files = Vec::new();
    walk(&chart(), &chart(), &mut files);
    files.retain(|(rel, _)| rel != "README.md");
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut hash = Sha256::new();
    for (rel, path) in files {
        hash.update(rel.as_bytes());
        hash.update([0]);
        hash.update(std::fs::read(path).unwrap());
        hash.update([0]);
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:#?}", kinds(objects)))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

fn container(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]["containers"][0]
}

fn args_of(ds: &Value) -> Vec<String> {
    container(ds)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn env_of(ds: &Value, name: &str) -> Option<Value> {
    container(ds)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
}

/// mountPath -> host path of every hostPath mount.
fn host_mounts(ds: &Value) -> Vec<(String, String, bool)> {
    let spec = &ds["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_array().unwrap();
    container(ds)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let v = volumes.iter().find(|v| v["name"] == m["name"])?;
            let host = v["hostPath"]["path"].as_str()?;
            Some((
                m["mountPath"].as_str().unwrap().to_string(),
                host.to_string(),
                m["readOnly"] == true,
            ))
        })
        .collect()
}

#[test]
fn the_static_manifest_is_rendered_from_the_current_chart() {
    let text = std::fs::read_to_string(static_manifest_path()).unwrap();
    let recorded = text
        .lines()
        .find_map(|l| l.strip_prefix("# chart-digest: "))
        .expect("deploy/gpuops.yaml has a chart-digest line");
    assert!(
        recorded == chart_digest(),
        "deploy/helm/gpuops changed after deploy/gpuops.yaml was rendered (digest {recorded}, \
         chart now {}): run scripts/render-manifests",
        chart_digest()
    );
}

#[test]
fn gpuops_manifests_prints_the_static_manifest_and_refuses_values() {
    let out = common::run(&["manifests"]);
    assert!(out.status.success(), "{}", common::text(&out));
    assert!(
        out.stdout == std::fs::read(static_manifest_path()).unwrap(),
        "gpuops manifests is deploy/gpuops.yaml"
    );
    let out = common::run(&["manifests", "--set", "migStrategy=single"]);
    assert!(!out.status.success());
    let text = common::text(&out);
    assert!(
        text.contains(
            "helm template gpuops deploy/helm/gpuops --namespace gpuops --set migStrategy=single"
        ),
        "{text}"
    );
}

#[test]
fn with_mig_managed_the_default_mig_strategy_is_mixed() {
    // The seed labels a node nvidia.com/mig.config=all-1g.10gb and its pods ask for
    // nvidia.com/mig-1g.10gb: only the mixed strategy advertises that resource.
    let objects = static_manifest();
    let ds = find(&objects, "DaemonSet", "gpuops");
    assert_eq!(
        env_of(ds, "MIG_STRATEGY").map(|e| e["value"].clone()),
        Some(json!("mixed"))
    );
}

#[test]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn the_static_manifest_has_the_agent_daemonset() {
    let objects = static_manifest();
    assert_eq!(
        kinds(&objects),
        [
            "Namespace/gpuops",
            "ServiceAccount/gpuops",
            "ConfigMap/gpuops-mig-config",
            "ClusterRole/gpuops",
            "ClusterRoleBinding/gpuops",
            "Service/gpuops-metrics",
            "DaemonSet/gpuops",
        ]
    );
    for o in objects.iter().skip(1) {
        let labels = &o["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/name"], "gpuops", "{o}");
        assert_eq!(labels["app.kubernetes.io/instance"], "gpuops", "{o}");
        assert_eq!(
            labels["app.kubernetes.io/version"],
            env!("CARGO_PKG_VERSION")
        );
        if !o["kind"].as_str().unwrap().starts_with("ClusterRole") {
            assert_eq!(o["metadata"]["namespace"], "gpuops", "{o}");
        }
    }

    // The agent mounts host paths and runs privileged: PodSecurity must allow it there.
    assert_eq!(
        objects[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );

    let ds = find(&objects, "DaemonSet", "gpuops");
    let pod = &ds["spec"]["template"]["spec"];
    let tolerations = pod["tolerations"].as_array().unwrap();
    for key in ["nvidia.com/gpu", "gpuops.io/gpu-unhealthy"] {
        assert!(
            tolerations
                .contains(&json!({"key": key, "operator": "Exists", "effect": "NoSchedule"})),
            "toleration of {key}: {tolerations:?}"
        );
    }
    // The agent must run on a node that still carries its startup taint, to remove it.
    assert!(
        tolerations.contains(&json!({"key": "gpuops.io/gpu-not-ready", "operator": "Exists"})),
        "toleration of the startup taint: {tolerations:?}"
    );
    assert!(
        args_of(ds).contains(&"--startup-taint=gpuops.io/gpu-not-ready:NoSchedule".to_string()),
        "{:?}",
        args_of(ds)
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["nodeSelector"],
        json!({"nvidia.com/gpu.present": "true"})
    );
    assert_eq!(pod["serviceAccountName"], "gpuops");
    let c = container(ds);
    assert_eq!(
        c["image"],
        format!("ghcr.io/gpuops/gpuops:{}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(c["command"], json!(["gpuops"]));
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}})
    );
    assert_eq!(
        c["ports"],
        json!([{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}])
    );
    let args = args_of(ds);
    for a in [
        "agent",
        "--kubernetes",
        "--interval=10s",
        "--health-quiet-period=5m",
        "--hostname-label=hostname",
        "--metrics-address=0.0.0.0:9400",
        "--nvidia-driver-root=/",
        "--mig-config-file=/etc/gpuops/mig/config.yaml",
        "--taint-key=gpuops.io/gpu-unhealthy",
    ] {
        assert!(args.contains(&a.to_string()), "{a} in {args:?}");
    }
    for a in ["--taint-unhealthy", "--no-metrics", "--no-device-plugin"] {
        assert!(!args.iter().any(|x| x == a), "{a} not in {args:?}");
    }
    assert!(!args.iter().any(|a| a.starts_with("--mig-default-config")));
    assert_eq!(
        env_of(ds, "NODE_NAME").unwrap()["valueFrom"],
        json!({"fieldRef": {"fieldPath": "spec.nodeName"}})
    );

    let mounts = host_mounts(ds);
    for (path, host, ro) in [
        (
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/device-plugins",
            false,
        ),
        (
            "/var/lib/kubelet/pod-resources",
            "/var/lib/kubelet/pod-resources",
            true,
        ),
        ("/dev", "/dev", false),
        ("/var/lib/gpuops", "/var/lib/gpuops", false),
    ] {
        assert!(
            mounts.contains(&(path.into(), host.into(), ro)),
            "{path} from {host} (read-only {ro}) in {mounts:?}"
        );
    }
    assert!(
        !mounts.iter().any(|m| m.0 == "/driver-root"),
        "driver root / is not mounted"
    );
    let cm_mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "mig-config")
        .unwrap();
    assert_eq!(cm_mount["mountPath"], "/etc/gpuops/mig");
    // MIG management on (the default): privileged, as NVML's MIG calls need.
    assert_eq!(
        c["securityContext"],
        json!({"runAsUser": 0, "readOnlyRootFilesystem": true, "privileged": true})
    );
    // Probes on the agent's own endpoints; startup slack for a slow first NVML load.
    let probe = |path: &str, period: u32, failures: u32| {
        json!({"httpGet": {"path": path, "port": "metrics"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 5})
    };
    assert_eq!(c["startupProbe"], probe("/healthz", 5, 60));
    assert_eq!(c["livenessProbe"], probe("/healthz", 10, 3));
    assert_eq!(c["readinessProbe"], probe("/readyz", 10, 3));
    // Writable: only emptyDir and hostPath volumes (the root filesystem is read-only).
    for v in pod["volumes"].as_array().unwrap() {
        assert!(
            v.get("emptyDir").is_some()
                || v.get("hostPath").is_some()
                || v.get("configMap").is_some(),
            "{v}"
        );
    }
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        if v.get("configMap").is_some() {
            assert_eq!(m["readOnly"], true, "{m}");
        }
    }

    let cm = find(&objects, "ConfigMap", "gpuops-mig-config");
    let mig = cm["data"]["config.yaml"].as_str().unwrap();
    let parsed = gpuops_mig::config::parse(mig, "the ConfigMap").unwrap();
    assert!(
        parsed.names().contains(&"all-1g.10gb"),
        "{:?}",
        parsed.names()
    );

    let role = find(&objects, "ClusterRole", "gpuops");
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ])
    );
    let binding = find(&objects, "ClusterRoleBinding", "gpuops");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "gpuops", "namespace": "gpuops"}])
    );
    let svc = find(&objects, "Service", "gpuops-metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9400);
}

/// `devicePlugin.defaultConfig` becomes `--default-config`: the agent picks that named config for
/// an unlabelled node, and refuses to start on a name its configs do not have.
#[test]
fn the_agent_takes_the_default_config_the_chart_passes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), "version: v1\n").unwrap();
    std::fs::write(
        dir.path().join("b.yaml"),
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let agent = |default: &str| {
        common::gpuops()
            .args(["agent", "--simulate", "l4x4", "--once", "--config-dir"])
            .arg(dir.path())
            .arg(format!("--default-config={default}"))
            .output()
            .unwrap()
    };
    for (name, devices) in [("a", 4), ("b", 16)] {
        let out = agent(name);
        let text = common::text(&out);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains(&format!("for nvidia.com/gpu ({devices} devices)")),
            "--default-config={name}: {devices} devices in\n{text}"
        );
    }
    let out = agent("nope");
    let text = common::text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("default config names config \"nope\", which does not exist (have: a, b)"),
        "{text}"
    );
}

#[test]
fn manifests_help_has_examples() {
    let out = common::run(&["manifests", "--help"]);
    let help = common::text(&out);
    assert!(out.status.success(), "{help}");
    for s in [
        "Examples:",
        "gpuops manifests | kubectl apply -f -",
        "kubectl apply -f deploy/gpuops.yaml",
        "helm template",
    ] {
        assert!(help.contains(s), "{s} in {help}");
    }
}

#[test]
fn chart_mig_config_is_nvidias_default_configs() {
    let want = gpuops_mig::config::nvidia_default_configs().to_yaml();
    let path = chart().join("files/default-mig-config.yaml");
    if std::env::var_os("GPUOPS_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap();
    assert!(
        have == want,
        "{} differs from gpuops_mig::config::nvidia_default_configs().to_yaml(); rerun with \
         GPUOPS_BLESS=1 to rewrite it",
        path.display()
    );
}

fn rules_groups(path: &Path) -> Value {
    let v: Value = serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["groups"].clone()
}

#[test]
fn chart_rules_are_the_deploy_rules() {
    let chart_groups = rules_groups(&chart().join("files/gpuops-rules.yaml"));
    assert!(chart_groups.as_array().is_some_and(|g| !g.is_empty()));
    assert_eq!(
        chart_groups,
        rules_groups(&repo().join("deploy/prometheus/gpuops-rules.yaml")),
        "copy deploy/prometheus/gpuops-rules.yaml to deploy/helm/gpuops/files/"
    );
}

#[test]
fn chart_scheduler_config_is_the_deploy_one() {
    let deploy = repo().join("deploy/scheduler/kube-scheduler-config.yaml");
    let copy = chart().join("files/kube-scheduler-config.yaml");
    assert!(
        std::fs::read_to_string(&deploy).unwrap() == std::fs::read_to_string(&copy).unwrap(),
        "copy {} to {}",
        deploy.display(),
        copy.display()
    );
    assert!(
        !kinds(&static_manifest())
            .iter()
            .any(|k| k.contains("scheduler"))
    );
}

#[test]
fn chart_app_version_is_the_crate_version() {
    let chart_yaml: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart_yaml["name"], "gpuops");
}

// --- against the real control plane ------------------------------------------------------------

use gpuops_testbed::{Cluster, ClusterOptions};

/// Runs a binary; (success, stdout, stderr).
fn exec(
    bin: &Path,
    args: &[&str],
    env: &[(&str, &Path)],
    input: Option<&str>,
) -> (bool, String, String) {
    use std::io::Write;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let mut stdin = child.stdin.take().unwrap();
    if let Some(text) = input {
        stdin.write_all(text.as_bytes()).unwrap();
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

struct Helm {
    bin: PathBuf,
    home: PathBuf,
}

impl Helm {
    fn new(cluster: &Cluster) -> Helm {
        let bin = cluster.bin().join("helm");
        assert!(
            bin.is_file(),
            "{} is missing: rebuild the test bed with tests/k8s/build.sh (it builds Helm from \
             helm.sh/helm/v3)",
            bin.display()
        );
        let home = cluster.dir().join("helm-home");
        std::fs::create_dir_all(&home).unwrap();
        Helm { bin, home }
    }

    /// `helm ARGS`, with Helm's own files under the test bed; stdout.
    fn run(&self, args: &[&str]) -> String {
        let cache = self.home.join("cache");
        let config = self.home.join("config");
        let data = self.home.join("data");
        let (ok, out, err) = exec(
            &self.bin,
            args,
            &[
                ("HELM_CACHE_HOME", &cache),
                ("HELM_CONFIG_HOME", &config),
                ("HELM_DATA_HOME", &data),
            ],
            None,
        );
        assert!(ok, "helm {args:?} failed:\n{out}\n{err}");
        out
    }
}

/// Objects keyed and sorted by kind/namespace/name, without the one label that says who rendered
/// them (Helm: `Helm`, gpuops manifests: `gpuops-manifests`).
fn normalised(objects: Vec<Value>) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = objects
        .into_iter()
        .map(|mut o| {
            if let Some(labels) = o["metadata"]["labels"].as_object_mut() {
                labels.remove("app.kubernetes.io/managed-by");
            }
            let key = format!(
                "{}/{}/{}",
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, o)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn assert_same_objects(helm: Vec<Value>, ours: Vec<Value>, what: &str) {
    let helm = normalised(helm);
    let ours = normalised(ours);
    let keys = |v: &[(String, Value)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(&helm), keys(&ours), "{what}: the same objects");
    for ((key, h), (_, o)) in helm.iter().zip(&ours) {
        assert!(
            h == o,
            "{what}: {key} differs\nhelm template:\n{}\ngpuops manifests:\n{}",
            serde_json::to_string_pretty(h).unwrap(),
            serde_json::to_string_pretty(o).unwrap()
        );
    }
}

#[test]
#[ignore = "needs the control plane (GPUOPS_K8S_BIN): run scripts/test"]
// Long on purpose: one scenario, its steps in order on one shared setup (a control plane, a node or a fleet costs seconds to start), so the cases read as the story they test.
fn helm_chart_installs_and_its_rbac_is_least_privilege() {
    let cluster = Cluster::start(ClusterOptions::default()).unwrap();
    let helm = Helm::new(&cluster);
    let chart = chart();
    let chart = chart.to_str().unwrap();
    let kubeconfig = cluster.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();

    helm.run(&["lint", chart]);

    let template = |release: &str, namespace: &str, extra: &[&str]| {
        let mut args = vec!["template", release, chart, "--namespace", namespace];
        args.extend_from_slice(extra);
        docs(&helm.run(&args))
    };
    // deploy/gpuops.yaml is what Helm renders from the chart as it is now (after its Namespace).
    let mut ours = static_manifest();
    assert_eq!(ours.remove(0)["kind"], "Namespace");
    assert_same_objects(template("gpuops", "gpuops", &[]), ours, "default values");
    values_change_the_objects(&template, &cluster.dir().join("values.yaml"));

    // values.schema.json: a misspelt or mistyped value fails instead of being ignored.
    for (set, want) in [
        (
            "mig.defaultConfg=x",
            "additional properties 'defaultConfg' not allowed",
        ),
        ("migStrategy=mixd", "'/migStrategy': value must be one of"),
        ("metrics.port=http", "'/metrics/port'"),
        (
            "devicePlugin.configMapNam=x",
            "additional properties 'configMapNam' not allowed",
        ),
        ("mig.configMapName=Not_A_Name", "'/mig/configMapName'"),
        ("hostNetwork=yes", "'/hostNetwork'"),
        (
            "podLable.team=gpu",
            "additional properties 'podLable' not allowed",
        ),
        (
            "probes.liveness.periodSeconds=0",
            "'/probes/liveness/periodSeconds'",
        ),
        (
            "probes.readyness.enabled=false",
            "additional properties 'readyness' not allowed",
        ),
        (
            "extender.polcy=fgd",
            "additional properties 'polcy' not allowed",
        ),
        (
            "extender.policy=fastest",
            "'/extender/policy': value must be one of",
        ),
        (
            "extender.scheduler.leaderElection.resourceNam=x",
            "additional properties 'resourceNam' not allowed",
        ),
        (
            "extender.scheduler.schedulerName=Gpu_Scheduler",
            "'/extender/scheduler/schedulerName'",
        ),
        // Values that contradict each other.
        (
            "devicePlugin.configMapName=x,devicePlugin.configs.a=b",
            "devicePlugin.configs and devicePlugin.configMapName are both set",
        ),
        (
            "mig.configMapName=x,mig.config=y",
            "mig.config and mig.configMapName are both set",
        ),
        (
            "devicePlugin.defaultConfig=l4",
            "devicePlugin.defaultConfig needs devicePlugin.configs or devicePlugin.configMapName",
        ),
    ] {
        let home = cluster.dir().join("helm-home");
        let (ok, out, err) = exec(
            &helm.bin,
            &["template", "gpuops", chart, "--set", set],
            &[
                ("HELM_CACHE_HOME", &home),
                ("HELM_CONFIG_HOME", &home),
                ("HELM_DATA_HOME", &home),
            ],
            None,
        );
        assert!(
            !ok && err.contains(want),
            "--set {set}: {want} in\n{out}{err}"
        );
    }

    // helm install into the real apiserver.
    helm.run(&[
        "install",
        "gpuops",
        chart,
        "--namespace",
        "gpuops",
        "--create-namespace",
        "--kubeconfig",
        kubeconfig,
    ]);
    let listed = helm.run(&[
        "list",
        "--namespace",
        "gpuops",
        "--kubeconfig",
        kubeconfig,
        "-o",
        "json",
    ]);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["name"], "gpuops", "{listed}");
    assert_eq!(listed[0]["status"], "deployed", "{listed}");
    let names = cluster
        .kubectl(&[
            "get",
            "-n",
            "gpuops",
            "daemonset,configmap,serviceaccount,service,clusterrole,clusterrolebinding",
            "-l",
            "app.kubernetes.io/instance=gpuops",
            "-o",
            "name",
        ])
        .unwrap();
    for want in [
        "daemonset.apps/gpuops",
        "configmap/gpuops-mig-config",
        "serviceaccount/gpuops",
        "service/gpuops-metrics",
        "clusterrole.rbac.authorization.k8s.io/gpuops",
        "clusterrolebinding.rbac.authorization.k8s.io/gpuops",
    ] {
        assert!(names.lines().any(|l| l == want), "{want} in\n{names}");
    }
    // What the apiserver stored is what the chart says (it validated and defaulted it).
    let ds = cluster
        .get_json(&["daemonset", "gpuops", "-n", "gpuops"])
        .unwrap();
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(pod["serviceAccountName"], "gpuops");
    assert!(
        pod["tolerations"].as_array().unwrap().contains(
            &json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        )
    );
    assert_eq!(
        pod["containers"][0]["resources"],
        json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}})
    );
    // No kubelet runs pods here: the DaemonSet has no node to place them on.
    assert_eq!(ds["status"]["numberReady"].as_i64().unwrap_or(0), 0);

    // The agent's own identity: a token of the chart's ServiceAccount from the TokenRequest API.
    let token = cluster
        .kubectl(&[
            "create",
            "token",
            "gpuops",
            "-n",
            "gpuops",
            "--duration=10m",
        ])
        .unwrap();
    let agent_kubeconfig = cluster.dir().join("kubeconfig-gpuops-sa");
    std::fs::write(
        &agent_kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bed\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: agent\n  user:\n    token: {}\ncontexts:\n- name: bed\n  context:\n    cluster: bed\n    user: agent\ncurrent-context: bed\n",
            cluster.server(),
            token.trim()
        ),
    )
    .unwrap();
    let kubectl = cluster.bin().join("kubectl");
    let kc = format!("--kubeconfig={}", agent_kubeconfig.display());
    let agent = |args: &[&str], input: Option<&str>| {
        let mut full = vec![kc.as_str()];
        full.extend_from_slice(args);
        exec(&kubectl, &full, &[], input)
    };
    let who = agent(
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    );
    assert_eq!(who.1, "system:serviceaccount:gpuops:gpuops", "{who:?}");

    cluster
        .apply("apiVersion: v1\nkind: Node\nmetadata:\n  name: gpu-node-1\n  labels:\n    nvidia.com/gpu.present: \"true\"\n")
        .unwrap();

    // Allowed: the agent's calls, made as the agent makes them (kube-rs, node_sync.rs).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(agent_calls_are_allowed(&agent_kubeconfig));
    let (ok, out, err) = agent(
        &["create", "-f", "-"],
        Some(
            "apiVersion: events.k8s.io/v1\nkind: Event\nmetadata:\n  name: gpu-node-1.mig\n  namespace: default\nregarding:\n  kind: Node\n  name: gpu-node-1\nreason: MigConfigApplied\nnote: all-1g.10gb applied\ntype: Normal\naction: Apply\nreportingController: gpuops.io/agent\nreportingInstance: gpu-node-1\neventTime: \"2026-01-01T00:00:00.000000Z\"\n",
        ),
    );
    assert!(
        ok,
        "the agent may create an events.k8s.io event\n{out}{err}"
    );
    let node = cluster.get_json(&["node", "gpu-node-1"]).unwrap();
    assert_eq!(
        node["metadata"]["labels"]["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(node["spec"]["taints"][0]["key"], "gpuops.io/gpu-unhealthy");
    assert!(
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "GPUHealthy" && c["status"] == "True"),
        "{node}"
    );
    rt.block_on(deployment_patch_is_forbidden(&agent_kubeconfig));

    let denied: Vec<(&str, Vec<&str>, Option<&str>)> = vec![
        ("list pods", vec!["get", "pods", "--all-namespaces"], None),
        (
            "get a secret",
            vec!["get", "secret", "anything", "-n", "default"],
            None,
        ),
        ("list secrets", vec!["get", "secrets", "-n", "gpuops"], None),
        (
            "delete a node",
            vec!["delete", "node", "gpu-node-1", "--wait=false"],
            None,
        ),
        (
            "create a pod",
            vec![
                "run",
                "intruder",
                "--image=busybox",
                "-n",
                "default",
                "--restart=Never",
            ],
            None,
        ),
        (
            "patch a deployment",
            vec![
                "patch",
                "deployment",
                "anything",
                "-n",
                "default",
                "--type=merge",
                "-p",
                r#"{"spec":{"replicas":0}}"#,
            ],
            None,
        ),
        (
            "get configmaps in kube-system",
            vec!["get", "configmaps", "-n", "kube-system"],
            None,
        ),
        (
            "read its own MIG ConfigMap through the API",
            vec!["get", "configmap", "gpuops-mig-config", "-n", "gpuops"],
            None,
        ),
        (
            "change RBAC",
            vec!["delete", "clusterrolebinding", "gpuops"],
            None,
        ),
        (
            "create a node",
            vec!["create", "-f", "-"],
            Some("apiVersion: v1\nkind: Node\nmetadata:\n  name: rogue\n"),
        ),
    ];
    for (what, args, input) in &denied {
        let (ok, out, err) = agent(args, *input);
        assert!(
            !ok && err.contains("Forbidden"),
            "the agent must not {what}: kubectl {args:?}\n{out}{err}"
        );
    }

    // helm uninstall removes what it installed.
    helm.run(&[
        "uninstall",
        "gpuops",
        "--namespace",
        "gpuops",
        "--kubeconfig",
        kubeconfig,
    ]);
    let left = cluster
        .kubectl(&[
            "get",
            "daemonset,clusterrole,clusterrolebinding",
            "-A",
            "-l",
            "app.kubernetes.io/instance=gpuops",
            "-o",
            "name",
        ])
        .unwrap();
    assert!(left.trim().is_empty(), "left after uninstall: {left}");

    // deploy/gpuops.yaml installs too, without Helm.
    let applied = cluster
        .apply(&std::fs::read_to_string(static_manifest_path()).unwrap())
        .unwrap();
    for want in [
        "daemonset.apps/gpuops created",
        "clusterrole.rbac.authorization.k8s.io/gpuops created",
        "serviceaccount/gpuops created",
    ] {
        assert!(applied.contains(want), "{want} in {applied}");
    }
}

type Template<'a> = dyn Fn(&str, &str, &[&str]) -> Vec<Value> + 'a;

/// What each non-default value does to the rendered objects.
fn values_change_the_objects(template: &Template, values_file: &Path) {
    // Without MIG management: no MIG ConfigMap, no MIG flags or checkpoint mount, unprivileged,
    // and no MIG strategy of ours (NVIDIA's default none applies).
    let objects = template("gpuops", "gpu-system", &["--set", "mig.enabled=false"]);
    assert!(!kinds(&objects).iter().any(|k| k.contains("mig-config")));
    let ds = find(&objects, "DaemonSet", "gpuops");
    assert_eq!(ds["metadata"]["namespace"], "gpu-system");
    assert_eq!(
        container(ds)["securityContext"],
        json!({
            "runAsUser": 0, "readOnlyRootFilesystem": true, "privileged": false,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    assert!(!args_of(ds).iter().any(|a| a.starts_with("--mig-")));
    assert!(!host_mounts(ds).iter().any(|m| m.0 == "/var/lib/gpuops"));
    assert!(env_of(ds, "MIG_STRATEGY").is_none());

    // The MIG strategy: single stays available; a device plugin config file keeps its own.
    let strategy = |extra: &[&str]| {
        let objects = template("gpuops", "gpuops", extra);
        env_of(find(&objects, "DaemonSet", "gpuops"), "MIG_STRATEGY").map(|e| e["value"].clone())
    };
    assert_eq!(strategy(&[]), Some(json!("mixed")));
    assert_eq!(
        strategy(&["--set", "migStrategy=single"]),
        Some(json!("single"))
    );
    assert_eq!(
        strategy(&["--set", "migStrategy=none"]),
        Some(json!("none"))
    );
    assert_eq!(
        strategy(&["--set-string", "devicePlugin.configs.default=version: v1\n"]),
        None
    );

    std::fs::write(
        values_file,
        "tolerations:\n- key: CriticalAddonsOnly\n  operator: Exists\nextraArgs: [--nfd-features-file=/etc/kubernetes/node-feature-discovery/features.d/gpuops]\npodAnnotations: {team: gpu}\n",
    )
    .unwrap();
    let objects = template(
        "prod",
        "gpu-system",
        &[
            "--set",
            "image.repository=registry.local:5000/gpuops,image.tag=dev",
            "--set",
            "taintUnhealthy=true,mig.defaultConfig=all-balanced",
            "--set",
            "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true",
            "--set",
            "schedulerExtender.enabled=true",
            "--set",
            "driverRoot=/run/nvidia/driver,migStrategy=mixed,metrics.port=9500",
            "--set",
            "passDeviceSpecs=false,deviceSplitCount=4",
            "--set",
            r"nodeSelector.nvidia\.com/gpu\.present=null",
            "--set-string",
            r"nodeSelector.feature\.node\.kubernetes\.io/pci-10de\.present=true",
            "--set-string",
            "devicePlugin.configs.default=version: v1\nflags:\n  migStrategy: mixed\n",
            "-f",
            values_file.to_str().unwrap(),
        ],
    );
    // Release "prod": objects are named prod-gpuops.
    let ds = find(&objects, "DaemonSet", "prod-gpuops");
    assert_eq!(container(ds)["image"], "registry.local:5000/gpuops:dev");
    let args = args_of(ds);
    for a in [
        "--taint-unhealthy",
        "--mig-default-config=all-balanced",
        "--nvidia-driver-root=/run/nvidia/driver",
        "--metrics-address=0.0.0.0:9500",
        "--config-dir=/etc/gpuops/device-plugin",
        "--nfd-features-file=/etc/kubernetes/node-feature-discovery/features.d/gpuops",
    ] {
        assert!(args.contains(&a.to_string()), "{a} in {args:?}");
    }
    assert_eq!(env_of(ds, "MIG_STRATEGY").unwrap()["value"], "mixed");
    assert_eq!(env_of(ds, "PASS_DEVICE_SPECS").unwrap()["value"], "false");
    assert_eq!(env_of(ds, "DEVICE_SPLIT_COUNT").unwrap()["value"], "4");
    assert_eq!(
        env_of(ds, "CONTAINER_DRIVER_ROOT").unwrap()["value"],
        "/driver-root"
    );
    assert!(host_mounts(ds).contains(&("/driver-root".into(), "/run/nvidia/driver".into(), true)));
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({"feature.node.kubernetes.io/pci-10de.present": "true"})
    );
    assert!(
        pod["tolerations"]
            .as_array()
            .unwrap()
            .contains(&json!({"key": "CriticalAddonsOnly", "operator": "Exists"}))
    );
    assert_eq!(
        ds["spec"]["template"]["metadata"]["annotations"]["team"],
        "gpu"
    );
    let cm = find(&objects, "ConfigMap", "prod-gpuops-device-plugin-configs");
    assert_eq!(
        cm["data"]["default"],
        "version: v1\nflags:\n  migStrategy: mixed\n"
    );
    let sm = find(&objects, "ServiceMonitor", "prod-gpuops");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    let rule = find(&objects, "PrometheusRule", "prod-gpuops");
    assert_eq!(
        rule["spec"]["groups"],
        rules_groups(&repo().join("deploy/prometheus/gpuops-rules.yaml"))
    );
    let cm = find(&objects, "ConfigMap", "prod-gpuops-scheduler-config");
    let config: Value =
        serde_saphyr::from_str(cm["data"]["kube-scheduler-config.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");

    existing_configmaps_by_name(template);
    pod_settings(template);
    probes_follow_the_values(template);
    the_extender_and_its_scheduler(template);
}

/// `devicePlugin.configMapName` / `mig.configMapName`: the user's ConfigMaps are mounted and the
/// chart renders none of its own.
fn existing_configmaps_by_name(template: &Template) {
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set",
            "devicePlugin.configMapName=time-slicing-config,devicePlugin.defaultConfig=l4",
            "--set",
            "mig.configMapName=mig-parted-config",
        ],
    );
    assert!(
        !kinds(&objects).iter().any(|k| k.starts_with("ConfigMap/")),
        "{:?}",
        kinds(&objects)
    );
    let ds = find(&objects, "DaemonSet", "gpuops");
    let args = args_of(ds);
    for a in [
        "--config-dir=/etc/gpuops/device-plugin",
        "--default-config=l4",
        "--mig-config-file=/etc/gpuops/mig/config.yaml",
    ] {
        assert!(args.contains(&a.to_string()), "{a} in {args:?}");
    }
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let configmap = |volume: &str| {
        volumes
            .iter()
            .find(|v| v["name"] == volume)
            .map(|v| v["configMap"]["name"].clone())
    };
    assert_eq!(
        configmap("device-plugin-configs"),
        Some(json!("time-slicing-config"))
    );
    assert_eq!(configmap("mig-config"), Some(json!("mig-parted-config")));
    // A config file of the user's keeps its own migStrategy.
    assert!(env_of(ds, "MIG_STRATEGY").is_none());

    // Without a name, defaultConfig picks one of the chart's own configs.
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set-string",
            "devicePlugin.configs.a=version: v1\n,devicePlugin.configs.b=version: v1\n",
            "--set",
            "devicePlugin.defaultConfig=b",
        ],
    );
    let ds = find(&objects, "DaemonSet", "gpuops");
    assert!(args_of(ds).contains(&"--default-config=b".to_string()));
    assert_eq!(
        configmap_of(ds, "device-plugin-configs"),
        Some(json!("gpuops-device-plugin-configs"))
    );
}

fn configmap_of(ds: &Value, volume: &str) -> Option<Value> {
    ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == volume)
        .map(|v| v["configMap"]["name"].clone())
}

/// hostNetwork, pod labels, the pod and container security contexts.
fn pod_settings(template: &Template) {
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set",
            "hostNetwork=true,podLabels.team=gpu,podSecurityContext.fsGroup=0",
            "--set",
            "mig.enabled=false,devicePlugin.enabled=false",
            "--set",
            "securityContext.runAsUser=65532,securityContext.runAsNonRoot=true",
        ],
    );
    let ds = find(&objects, "DaemonSet", "gpuops");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(pod["securityContext"], json!({"fsGroup": 0}));
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(labels["team"], "gpu");
    assert_eq!(labels["app.kubernetes.io/name"], "gpuops");
    // The user's fields win, the hardening stays.
    assert_eq!(
        container(ds)["securityContext"],
        json!({
            "runAsUser": 65532, "runAsNonRoot": true, "readOnlyRootFilesystem": true,
            "privileged": false, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
    // The selector never carries the user's labels (it cannot change after the first install).
    assert!(ds["spec"]["selector"]["matchLabels"].get("team").is_none());
}

fn probes_follow_the_values(template: &Template) {
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set",
            "probes.startup.failureThreshold=120,probes.liveness.periodSeconds=30",
            "--set",
            "probes.readiness.enabled=false",
        ],
    );
    let c = container(find(&objects, "DaemonSet", "gpuops"));
    assert_eq!(c["startupProbe"]["failureThreshold"], 120);
    assert_eq!(c["livenessProbe"]["periodSeconds"], 30);
    assert!(c.get("readinessProbe").is_none());
    // No metrics port, no endpoints to probe.
    let objects = template("gpuops", "gpuops", &["--set", "metrics.enabled=false"]);
    let c = container(find(&objects, "DaemonSet", "gpuops"));
    for p in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert!(c.get(p).is_none(), "{p} without metrics: {c}");
    }
}

/// The extender's Deployment, Service and least-privilege RBAC, and the second kube-scheduler
/// with its own profile and lease.
fn the_extender_and_its_scheduler(template: &Template) {
    assert!(
        !kinds(&template("gpuops", "gpuops", &[]))
            .iter()
            .any(|k| k.contains("extender") || k.ends_with("/gpuops-scheduler")),
        "off by default"
    );
    let objects = template(
        "gpuops",
        "gpu-system",
        &[
            "--set",
            "extender.enabled=true,extender.policy=fgd,extender.podLabels.team=gpu",
            "--set",
            "extender.scheduler.schedulerName=packed,extender.scheduler.leaderElection.resourceName=packed-lease",
            "--kube-version",
            "v1.35.4",
        ],
    );
    let ext = find(&objects, "Deployment", "gpuops-scheduler-extender");
    let pod = &ext["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "gpuops-scheduler-extender");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(ext["spec"]["template"]["metadata"]["labels"]["team"], "gpu");
    let c = &pod["containers"][0];
    assert_eq!(
        c["args"],
        json!([
            "scheduler-extender",
            "--address=0.0.0.0:8888",
            "--policy=fgd"
        ])
    );
    assert_eq!(
        c["securityContext"],
        json!({"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}})
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let svc = find(&objects, "Service", "gpuops-scheduler-extender");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8888);
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/component"],
        "scheduler-extender"
    );
    assert_eq!(
        find(&objects, "ClusterRole", "gpuops-scheduler-extender")["rules"],
        json!([{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}])
    );

    let sched = find(&objects, "Deployment", "gpuops-scheduler");
    let pod = &sched["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "gpuops-scheduler");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["containers"][0]["image"], "registry.k8s.io/kube-scheduler:v1.35.4",
        "the cluster's version"
    );
    let config = scheduler_config(&objects, "gpuops-scheduler");
    assert_eq!(config["profiles"], json!([{"schedulerName": "packed"}]));
    assert_eq!(
        config["leaderElection"],
        json!({"leaderElect": true, "resourceName": "packed-lease", "resourceNamespace": "gpu-system"})
    );
    assert_eq!(
        config["extenders"][0]["urlPrefix"],
        "http://gpuops-scheduler-extender.gpu-system.svc:8888"
    );
    let lease = find(&objects, "Role", "gpuops-scheduler-lease");
    assert_eq!(lease["metadata"]["namespace"], "gpu-system");
    assert_eq!(
        lease["rules"],
        json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
            "resourceNames": ["packed-lease"], "verbs": ["get", "update"]}])
    );
    for (binding, role) in [
        ("gpuops-scheduler-kube-scheduler", "system:kube-scheduler"),
        (
            "gpuops-scheduler-volume-scheduler",
            "system:volume-scheduler",
        ),
    ] {
        let b = find(&objects, "ClusterRoleBinding", binding);
        assert_eq!(b["roleRef"]["name"], role);
        assert_eq!(
            b["subjects"],
            json!([{"kind": "ServiceAccount", "name": "gpuops-scheduler", "namespace": "gpu-system"}])
        );
    }
    // An image tag of the user's wins; the scheduler can be left out.
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set",
            "extender.enabled=true,extender.scheduler.image.tag=v1.34.2",
        ],
    );
    assert_eq!(
        find(&objects, "Deployment", "gpuops-scheduler")["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        "registry.k8s.io/kube-scheduler:v1.34.2"
    );
    let objects = template(
        "gpuops",
        "gpuops",
        &[
            "--set",
            "extender.enabled=true,extender.scheduler.enabled=false",
        ],
    );
    assert!(
        !kinds(&objects).contains(&"Deployment/gpuops-scheduler".to_string()),
        "{:?}",
        kinds(&objects)
    );
}

/// The KubeSchedulerConfiguration in ConfigMap `name`.
fn scheduler_config(objects: &[Value], name: &str) -> Value {
    let cm = find(objects, "ConfigMap", name);
    serde_saphyr::from_str(cm["data"]["kube-scheduler-config.yaml"].as_str().unwrap()).unwrap()
}

async fn agent_client(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// What the agent does on its node: get, list and watch it; server-side apply its labels and
/// the GPUHealthy condition (nodes/status, without reading it first); merge-patch its taint;
/// create and patch events.
async fn agent_calls_are_allowed(kubeconfig: &Path) {
    use futures::TryStreamExt;
    use k8s_openapi::api::core::v1::{Event, Node};
    use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
    let client = agent_client(kubeconfig).await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get("gpu-node-1").await.expect("get its node");
    let list = nodes
        .list(&ListParams::default())
        .await
        .expect("list nodes");
    assert!(!list.items.is_empty());
    let watch = WatchParams::default()
        .fields("metadata.name=gpu-node-1")
        .timeout(1);
    let stream = nodes.watch(&watch, "0").await.expect("watch nodes");
    let events: Vec<WatchEvent<Node>> = stream.try_collect().await.expect("watch nodes");
    assert!(
        !events.iter().any(|e| matches!(e, WatchEvent::Error(_))),
        "watch: {events:?}"
    );

    let labels = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1",
        "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}}});
    nodes
        .patch(
            "gpu-node-1",
            &PatchParams::apply("gpuops-feature-labels").force(),
            &Patch::Apply(&labels),
        )
        .await
        .expect("server-side apply of its labels");
    let condition = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"},
        "status": {"conditions": [{"type": "GPUHealthy", "status": "True", "reason": "AllGPUsHealthy",
            "message": "8/8 GPUs healthy", "lastTransitionTime": "2026-01-01T00:00:00Z",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}});
    nodes
        .patch_status(
            "gpu-node-1",
            &PatchParams::apply("gpuops-health").force(),
            &Patch::Apply(&condition),
        )
        .await
        .expect("server-side apply of nodes/status");
    // As the agent does: read the node, then patch its taints at that resourceVersion.
    let node = nodes.get("gpu-node-1").await.expect("get its node");
    let taint = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": [{"key": "gpuops.io/gpu-unhealthy", "value": "xid-48", "effect": "NoSchedule"}]}});
    nodes
        .patch("gpu-node-1", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("merge-patch its taints");

    let events: Api<Event> = Api::namespaced(client, "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"generateName": "gpu-node-1.", "namespace": "default"},
        "involvedObject": {"kind": "Node", "name": "gpu-node-1", "apiVersion": "v1"},
        "reason": "GPUXid", "message": "XID 48 on GPU 3", "type": "Warning",
        "source": {"component": "gpuops-agent", "host": "gpu-node-1"}, "count": 1,
    }))
    .unwrap();
    let created = events
        .create(&PostParams::default(), &event)
        .await
        .expect("create an event");
    let name = created.metadata.name.unwrap();
    events
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"count": 2})),
        )
        .await
        .expect("patch an event");
}

/// A PATCH straight to a Deployment (kubectl patch would read it first) is refused.
async fn deployment_patch_is_forbidden(kubeconfig: &Path) {
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::api::{Api, Patch, PatchParams};
    let client = agent_client(kubeconfig).await;
    let deployments: Api<Deployment> = Api::namespaced(client, "default");
    match deployments
        .patch(
            "anything",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => panic!("patching a deployment must be Forbidden, got {other:?}"),
    }
}
