//! `gpuops manifests`: the Helm chart's objects (deploy/helm/gpuops) without Helm.
//!
//! The chart's values.yaml, Chart.yaml and files/ are compiled in, so the defaults cannot drift
//! from the chart; the objects are built here the way the chart's templates build them
//! (crates/gpuops/tests/install.rs renders both and compares them).

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const CHART_YAML: &str = include_str!("../../../../deploy/helm/gpuops/Chart.yaml");
/// The chart's default values (also `gpuops manifests --show-values`).
pub const CHART_VALUES: &str = include_str!("../../../../deploy/helm/gpuops/values.yaml");
/// NVIDIA's default mig-parted configs, as the chart ships them.
pub const DEFAULT_MIG_CONFIG: &str =
    include_str!("../../../../deploy/helm/gpuops/files/default-mig-config.yaml");
/// kube-scheduler's configuration with the scheduler extender (schedulerExtender.enabled).
pub const SCHEDULER_CONFIG: &str =
    include_str!("../../../../deploy/helm/gpuops/files/kube-scheduler-config.yaml");
/// The alerting and recording rules of the PrometheusRule.
pub const RULES: &str = include_str!("../../../../deploy/helm/gpuops/files/gpuops-rules.yaml");

/// Value of app.kubernetes.io/managed-by on what this command renders (Helm writes `Helm`).
pub const MANAGED_BY: &str = "gpuops-manifests";

/// Print the Kubernetes objects of the gpuops node agent (what the Helm chart installs).
///
/// Renders the same objects as `helm template gpuops deploy/helm/gpuops --namespace gpuops`:
/// ServiceAccount, ClusterRole and ClusterRoleBinding (least privilege: nodes get/list/watch/
/// patch, nodes/status patch, events create/patch), the MIG config ConfigMap, the metrics
/// Service and the DaemonSet; optionally a ServiceMonitor and a PrometheusRule. Values are the
/// chart's values.yaml (`--show-values`), changed with --values/-f files, --set KEY=VALUE (any
/// documented value, as Helm's --set) and the flags below, in that order.
///
/// Examples:
///   gpuops manifests | kubectl apply -f -            needs the namespace: add --create-namespace
///   gpuops manifests --create-namespace --namespace gpu-system | kubectl apply -f -
///   gpuops manifests --image registry.example.com/gpuops:0.1.0 --taint-unhealthy
///   gpuops manifests --mig-default-config all-1g.10gb --service-monitor --prometheus-rule
///   gpuops manifests --set mig.enabled=false --set migStrategy=mixed
///   gpuops manifests --set 'nodeSelector.nvidia\.com/gpu\.present=null' \
///       --set-string 'nodeSelector.feature\.node\.kubernetes\.io/pci-10de\.present=true'
///   gpuops manifests -f my-values.yaml               the same file `helm install -f` takes
///   gpuops manifests --show-values                   the values and what each one does
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Namespace of the namespaced objects (Helm's --namespace).
    #[arg(long, short = 'n', default_value = "gpuops")]
    namespace: String,
    /// Release name: object names and the app.kubernetes.io/instance label (Helm's release).
    #[arg(long, default_value = "gpuops", value_name = "NAME")]
    release: String,
    /// Also print the Namespace object first (as `helm install --create-namespace` makes it).
    #[arg(long)]
    create_namespace: bool,
    /// YAML values files, merged over the defaults in order (Helm's -f).
    #[arg(long = "values", short = 'f', value_name = "FILE")]
    values: Vec<PathBuf>,
    /// KEY=VALUE[,KEY=VALUE...]: set a value; true/false/null/integers are typed, as with Helm.
    /// Escape dots in keys with a backslash.
    #[arg(long, value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// KEY=VALUE[,KEY=VALUE...]: set a value as a string.
    #[arg(long, value_name = "KEY=VALUE")]
    set_string: Vec<String>,
    /// The agent image, REPOSITORY[:TAG] (image.repository, image.tag).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// MIG config applied to nodes without the nvidia.com/mig.config label (mig.defaultConfig).
    #[arg(long, value_name = "NAME")]
    mig_default_config: Option<String>,
    /// Do not manage MIG: no MIG ConfigMap, and an unprivileged container (mig.enabled=false).
    #[arg(long)]
    no_mig: bool,
    /// Taint nodes with an unhealthy GPU (taintUnhealthy=true).
    #[arg(long)]
    taint_unhealthy: bool,
    /// Add a Prometheus Operator ServiceMonitor (metrics.serviceMonitor.enabled=true).
    #[arg(long)]
    service_monitor: bool,
    /// Add a Prometheus Operator PrometheusRule (metrics.prometheusRule.enabled=true).
    #[arg(long)]
    prometheus_rule: bool,
    /// Print the default values (the chart's commented values.yaml) and exit.
    #[arg(long)]
    show_values: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.show_values {
        print!("{CHART_VALUES}");
        return Ok(ExitCode::SUCCESS);
    }
    let values = values_of(&args)?;
    let objects = render(
        &values,
        &args.release,
        &args.namespace,
        args.create_namespace,
    )?;
    let text = to_yaml_stream(&objects)?;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing the manifests to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// The values as Helm computes them: the files (-f) and --set/--set-string build the user's
/// values in order, the flags go last, and then the chart's defaults fill in what they leave out
/// (a user's `null` removes a default).
fn values_of(args: &Args) -> Result<Value> {
    let defaults = default_values()?;
    let mut user = Value::Object(Map::new());
    for file in &args.values {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading values file {}", file.display()))?;
        let over: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_saphyr::from_str(&text)
                .with_context(|| format!("values file {} is not valid YAML", file.display()))?
        };
        match over {
            Value::Null => {}
            Value::Object(_) => merge(&mut user, over),
            _ => bail!("values file {} is not a YAML map", file.display()),
        }
    }
    let mut sets: Vec<(String, Value)> = Vec::new();
    for set in &args.set {
        for (key, value) in parse_set(set)? {
            let value = typed(&value);
            sets.push((key, value));
        }
    }
    for set in &args.set_string {
        for (key, value) in parse_set(set)? {
            sets.push((key, Value::String(value)));
        }
    }
    if let Some(image) = &args.image {
        let (repository, tag) = split_image(image);
        sets.push(("image.repository".into(), Value::String(repository)));
        if let Some(tag) = tag {
            sets.push(("image.tag".into(), Value::String(tag)));
        }
    }
    if let Some(name) = &args.mig_default_config {
        sets.push(("mig.defaultConfig".into(), Value::String(name.clone())));
    }
    for (flag, key, value) in [
        (args.no_mig, "mig.enabled", false),
        (args.taint_unhealthy, "taintUnhealthy", true),
        (args.service_monitor, "metrics.serviceMonitor.enabled", true),
        (args.prometheus_rule, "metrics.prometheusRule.enabled", true),
    ] {
        if flag {
            sets.push((key.into(), Value::Bool(value)));
        }
    }
    for (key, value) in sets {
        check_key(&defaults, &key)?;
        set_value(&mut user, &key, value)?;
    }
    Ok(coalesce(defaults, user))
}

/// Helm's coalescing of the user's values with the chart's defaults: the user's win, maps merge,
/// and a user's `null` removes the key.
fn coalesce(defaults: Value, user: Value) -> Value {
    match (defaults, user) {
        (Value::Object(mut d), Value::Object(u)) => {
            for (k, v) in u {
                if v.is_null() {
                    d.remove(&k);
                    continue;
                }
                let merged = match d.remove(&k) {
                    Some(dv @ Value::Object(_)) if v.is_object() => coalesce(dv, v),
                    _ => v,
                };
                d.insert(k, merged);
            }
            Value::Object(d)
        }
        (_, u) => u,
    }
}

/// The chart's values.yaml as JSON.
pub fn default_values() -> Result<Value> {
    serde_saphyr::from_str(CHART_VALUES).context("the chart's values.yaml (compiled in) is invalid")
}

/// REPOSITORY[:TAG]; a colon before the last slash is a registry port.
fn split_image(image: &str) -> (String, Option<String>) {
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (
            image[..slash + i].to_string(),
            Some(image[slash + i + 1..].to_string()),
        ),
        None => (image.to_string(), None),
    }
}

/// Helm's merge of a values file: maps merge key by key, anything else replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// Splits on `sep` not preceded by a backslash; `\sep` becomes `sep`.
fn split_escaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek() == Some(&sep) {
            current.push(sep);
            chars.next();
        } else if c == sep {
            parts.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    parts.push(current);
    parts
}

/// `a.b=1,c=x` -> [("a.b", "1"), ("c", "x")] (keys keep their escaped dots).
fn parse_set(text: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for item in split_escaped(text, ',') {
        let Some((key, value)) = item.split_once('=') else {
            bail!("--set {text:?}: expected KEY=VALUE, got {item:?}");
        };
        if key.is_empty() {
            bail!("--set {text:?}: empty key");
        }
        if key.contains('[') {
            bail!(
                "--set {key}: list indexes are not supported here; give the whole list in a \
                 values file (-f FILE)"
            );
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// Helm's --set typing: true/false, null, integers; anything else a string.
fn typed(value: &str) -> Value {
    match value {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        "null" => Value::Null,
        _ => match value.parse::<i64>() {
            // Helm keeps leading zeros as strings ("007").
            Ok(n) if !(value.len() > 1 && value.starts_with('0')) => Value::from(n),
            _ => Value::String(value.to_string()),
        },
    }
}

/// Maps in the defaults whose keys are the user's (labels, selectors, Kubernetes structs).
const FREE_FORM: &[&str] = &[
    "nodeSelector",
    "resources",
    "updateStrategy",
    "affinity",
    "podAnnotations",
    "devicePlugin.configs",
    "metrics.service.annotations",
    "metrics.serviceMonitor.labels",
    "metrics.prometheusRule.labels",
    "serviceAccount.annotations",
];

/// A key the chart does not have is an error (a typo would otherwise be silently ignored),
/// except inside free-form maps (labels, selectors, Kubernetes structs).
fn check_key(defaults: &Value, key: &str) -> Result<()> {
    let parts = split_escaped(key, '.');
    if parts.iter().any(String::is_empty) {
        bail!("--set {key}: empty key segment");
    }
    let mut node = defaults;
    for (i, part) in parts.iter().enumerate() {
        let path = parts[..=i].join(".");
        match node {
            Value::Object(map) if map.is_empty() => return Ok(()),
            Value::Object(map) => match map.get(part) {
                Some(next) => node = next,
                None => bail!(
                    "--set {key}: the chart has no value {path} (see gpuops manifests --show-values)"
                ),
            },
            _ => bail!(
                "--set {key}: {} is not a map in the chart's values",
                parts[..i].join(".")
            ),
        }
        if FREE_FORM.contains(&path.as_str()) {
            return Ok(());
        }
    }
    Ok(())
}

/// Sets `key` (dotted, `\.` for a literal dot) in the user's values, making maps on the way.
fn set_value(values: &mut Value, key: &str, value: Value) -> Result<()> {
    let parts = split_escaped(key, '.');
    let Some((last, path)) = parts.split_last() else {
        bail!("--set: empty key");
    };
    let mut node = values;
    for part in path {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        let Value::Object(map) = node else {
            bail!("--set {key}: not a map");
        };
        node = map
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !node.is_object() {
        *node = Value::Object(Map::new());
    }
    if let Value::Object(map) = node {
        map.insert(last.clone(), value);
    }
    Ok(())
}

// --- rendering ---------------------------------------------------------------------------------

/// Go template truthiness (`if`, `with`, `default`).
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// How a template prints a value (`{{ .Values.x }}`).
fn text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

/// An unquoted scalar in a template, as YAML reads it back.
fn plain(s: &str) -> Value {
    match s {
        "" | "null" | "~" => Value::Null,
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => s
            .parse::<i64>()
            .map(Value::from)
            .unwrap_or_else(|_| Value::String(s.to_string())),
    }
}

/// A `key: |` block with the text indented under it: the text with one final newline.
fn block(s: &str) -> String {
    let mut lines: Vec<&str> = s.lines().collect();
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    if lines.is_empty() {
        return String::new();
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// Helm's `trunc 63 | trimSuffix "-"`.
fn dns_name(s: &str) -> String {
    let t: String = s.chars().take(63).collect();
    t.strip_suffix('-').map(str::to_string).unwrap_or(t)
}

struct Ctx<'a> {
    v: &'a Value,
    release: &'a str,
    namespace: &'a str,
    chart_name: String,
    chart_version: String,
    app_version: String,
}

impl Ctx<'_> {
    fn get(&self, path: &str) -> &Value {
        let mut node = self.v;
        for part in path.split('.') {
            match node.get(part) {
                Some(next) => node = next,
                None => return &Value::Null,
            }
        }
        node
    }

    fn on(&self, path: &str) -> bool {
        truthy(self.get(path))
    }

    fn name(&self) -> String {
        let over = self.get("nameOverride");
        dns_name(&if truthy(over) {
            text(over)
        } else {
            self.chart_name.clone()
        })
    }

    fn fullname(&self) -> String {
        let over = self.get("fullnameOverride");
        if truthy(over) {
            return dns_name(&text(over));
        }
        let name = self.name_untruncated();
        if self.release.contains(&name) {
            dns_name(self.release)
        } else {
            dns_name(&format!("{}-{name}", self.release))
        }
    }

    fn name_untruncated(&self) -> String {
        let over = self.get("nameOverride");
        if truthy(over) {
            text(over)
        } else {
            self.chart_name.clone()
        }
    }

    fn service_account(&self) -> String {
        let name = self.get("serviceAccount.name");
        if self.on("serviceAccount.create") {
            if truthy(name) {
                text(name)
            } else {
                self.fullname()
            }
        } else if truthy(name) {
            text(name)
        } else {
            "default".into()
        }
    }

    fn selector_labels(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("app.kubernetes.io/name".into(), plain(&self.name()));
        m.insert("app.kubernetes.io/instance".into(), plain(self.release));
        m
    }

    fn labels(&self, component: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "helm.sh/chart".into(),
            plain(&dns_name(
                &format!("{}-{}", self.chart_name, self.chart_version).replace('+', "_"),
            )),
        );
        m.extend(self.selector_labels());
        m.insert(
            "app.kubernetes.io/version".into(),
            Value::String(self.app_version.clone()),
        );
        m.insert("app.kubernetes.io/managed-by".into(), json!(MANAGED_BY));
        m.insert("app.kubernetes.io/part-of".into(), json!("gpuops"));
        m.insert("app.kubernetes.io/component".into(), json!(component));
        m
    }

    fn metadata(&self, name: String, namespaced: bool, component: &str) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), plain(&name));
        if namespaced {
            m.insert("namespace".into(), plain(self.namespace));
        }
        m.insert("labels".into(), Value::Object(self.labels(component)));
        Value::Object(m)
    }
}

/// The objects, in the order Helm installs them.
pub fn render(
    values: &Value,
    release: &str,
    namespace: &str,
    create_namespace: bool,
) -> Result<Vec<Value>> {
    let chart: Value =
        serde_saphyr::from_str(CHART_YAML).context("the chart's Chart.yaml is invalid")?;
    let field = |k: &str| -> Result<String> {
        chart
            .get(k)
            .map(text)
            .filter(|s| !s.is_empty())
            .with_context(|| format!("the chart's Chart.yaml has no {k}"))
    };
    if !values.is_object() {
        bail!("the values are not a map");
    }
    let c = Ctx {
        v: values,
        release,
        namespace,
        chart_name: field("name")?,
        chart_version: field("version")?,
        app_version: field("appVersion")?,
    };
    let fullname = c.fullname();
    let mut out = Vec::new();
    if create_namespace {
        out.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}));
    }

    if c.on("serviceAccount.create") {
        let mut meta = c.metadata(c.service_account(), true, "node-agent");
        if c.on("serviceAccount.annotations") {
            meta["annotations"] = c.get("serviceAccount.annotations").clone();
        }
        out.push(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}));
    }

    let mig = c.on("mig.enabled");
    if mig {
        let config = c.get("mig.config");
        let config = if truthy(config) {
            text(config)
        } else {
            DEFAULT_MIG_CONFIG.to_string()
        };
        out.push(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": c.metadata(format!("{fullname}-mig-config"), true, "node-agent"),
            "data": {"config.yaml": block(&config)},
        }));
    }

    let dp_configs = c.on("devicePlugin.enabled") && c.on("devicePlugin.configs");
    if dp_configs {
        let Value::Object(configs) = c.get("devicePlugin.configs") else {
            bail!("devicePlugin.configs must be a map of config name to YAML text");
        };
        let mut data = Map::new();
        for (name, config) in configs {
            let Value::String(config) = config else {
                bail!("devicePlugin.configs.{name} must be YAML text (a string), not {config}");
            };
            data.insert(name.clone(), Value::String(block(config)));
        }
        out.push(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": c.metadata(format!("{fullname}-device-plugin-configs"), true, "node-agent"),
            "data": data,
        }));
    }

    if c.on("schedulerExtender.enabled") {
        out.push(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": c.metadata(format!("{fullname}-scheduler-config"), true, "scheduler-extender"),
            "data": {"kube-scheduler-config.yaml": block(SCHEDULER_CONFIG)},
        }));
    }

    if c.on("rbac.create") {
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": c.metadata(fullname.clone(), false, "node-agent"),
            "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
                {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
            ],
        }));
        out.push(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": c.metadata(fullname.clone(), false, "node-agent"),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": plain(&fullname)},
            "subjects": [{"kind": "ServiceAccount", "name": plain(&c.service_account()), "namespace": plain(namespace)}],
        }));
    }

    let metrics = c.on("metrics.enabled");
    let port = plain(&text(c.get("metrics.port")));
    if metrics && c.on("metrics.service.enabled") {
        let mut meta = c.metadata(format!("{fullname}-metrics"), true, "node-agent");
        if c.on("metrics.service.annotations") {
            meta["annotations"] = c.get("metrics.service.annotations").clone();
        }
        out.push(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": meta,
            "spec": {
                "type": plain(&text(c.get("metrics.service.type"))),
                "selector": c.selector_labels(),
                "ports": [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}],
            },
        }));
    }

    out.push(daemonset(&c, &fullname, mig, dp_configs, metrics, &port));

    if c.on("metrics.prometheusRule.enabled") {
        let mut meta = c.metadata(fullname.clone(), true, "alerting-rules");
        extend_labels(&mut meta, c.get("metrics.prometheusRule.labels"));
        let spec: Value =
            serde_saphyr::from_str(RULES).context("the chart's files/gpuops-rules.yaml")?;
        out.push(json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": meta, "spec": spec,
        }));
    }

    if metrics && c.on("metrics.service.enabled") && c.on("metrics.serviceMonitor.enabled") {
        let mut meta = c.metadata(fullname.clone(), true, "node-agent");
        extend_labels(&mut meta, c.get("metrics.serviceMonitor.labels"));
        // As templates/servicemonitor.yaml: whose pod labels the GPU series carry.
        let mut endpoint = match text(c.get("metrics.serviceMonitor.podLabels")).as_str() {
            "target" => json!({"port": "metrics", "path": "/metrics", "honorLabels": false}),
            "gpu" => json!({
                "port": "metrics", "path": "/metrics", "honorLabels": true,
                "relabelings": [{"action": "labeldrop", "regex": "pod|namespace|container"}],
            }),
            other => bail!("metrics.serviceMonitor.podLabels must be gpu or target, not {other:?}"),
        };
        let interval = c.get("metrics.serviceMonitor.interval");
        if truthy(interval) {
            endpoint["interval"] = plain(&text(interval));
        }
        out.push(json!({
            "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": meta,
            "spec": {
                "selector": {"matchLabels": c.selector_labels()},
                "namespaceSelector": {"matchNames": [plain(namespace)]},
                "endpoints": [endpoint],
            },
        }));
    }
    Ok(out)
}

fn extend_labels(meta: &mut Value, extra: &Value) {
    if let (Some(labels), Value::Object(extra)) = (meta["labels"].as_object_mut(), extra) {
        for (k, v) in extra {
            labels.insert(k.clone(), v.clone());
        }
    }
}

/// Appends the items of a list value (extraArgs, extraEnv, ...).
fn extend_list(list: &mut Vec<Value>, extra: &Value) {
    if let Value::Array(items) = extra {
        list.extend(items.iter().cloned());
    }
}

fn env(name: &str, value: String) -> Value {
    json!({"name": name, "value": value})
}

fn daemonset(
    c: &Ctx<'_>,
    fullname: &str,
    mig: bool,
    dp_configs: bool,
    metrics: bool,
    port: &Value,
) -> Value {
    let driver_root = match text(c.get("driverRoot")) {
        s if s.is_empty() => "/".to_string(),
        s => s,
    };
    let custom_root = driver_root != "/";
    let kubelet = text(c.get("kubeletRootDir"));
    let taint_key = text(c.get("taintKey"));

    let mut args: Vec<Value> = [
        "agent".to_string(),
        "--kubernetes".to_string(),
        format!("--interval={}", text(c.get("interval"))),
        format!("--health-quiet-period={}", text(c.get("healthQuietPeriod"))),
        format!("--hostname-label={}", text(c.get("hostnameLabel"))),
        format!("--nvidia-driver-root={driver_root}"),
        "--device-plugin-dir=/var/lib/kubelet/device-plugins".to_string(),
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock".to_string(),
        format!("--taint-key={taint_key}"),
    ]
    .into_iter()
    .map(Value::String)
    .collect();
    let mut arg = |s: String| args.push(Value::String(s));
    if c.on("taintUnhealthy") {
        arg("--taint-unhealthy".into());
    }
    if !c.on("featureLabels") {
        arg("--no-feature-labels".into());
    }
    if metrics {
        arg(format!("--metrics-address=0.0.0.0:{}", text(port)));
    } else {
        arg("--no-metrics".into());
    }
    if !c.on("devicePlugin.enabled") {
        arg("--no-device-plugin".into());
    }
    if dp_configs {
        arg("--config-dir=/etc/gpuops/device-plugin".into());
    }
    if mig {
        arg("--mig-config-file=/etc/gpuops/mig/config.yaml".into());
        if c.on("mig.defaultConfig") {
            arg(format!(
                "--mig-default-config={}",
                text(c.get("mig.defaultConfig"))
            ));
        }
        arg(format!(
            "--mig-drain-timeout={}",
            text(c.get("mig.drainTimeout"))
        ));
        arg(format!("--mig-retry={}", text(c.get("mig.retry"))));
    }
    extend_list(&mut args, c.get("extraArgs"));

    let mut envs = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        env("NVIDIA_VISIBLE_DEVICES", "all".into()),
        env("NVIDIA_DRIVER_CAPABILITIES", "utility".into()),
        env("NVIDIA_MIG_MONITOR_DEVICES", "all".into()),
    ];
    if custom_root {
        envs.push(env("CONTAINER_DRIVER_ROOT", "/driver-root".into()));
    }
    for (key, var) in [
        ("nvmlLib", "GPUOPS_NVML_LIB"),
        ("migStrategy", "MIG_STRATEGY"),
        ("deviceListStrategy", "DEVICE_LIST_STRATEGY"),
        ("deviceIdStrategy", "DEVICE_ID_STRATEGY"),
        ("passDeviceSpecs", "PASS_DEVICE_SPECS"),
        ("deviceSplitCount", "DEVICE_SPLIT_COUNT"),
    ] {
        let v = c.get(key);
        // passDeviceSpecs: false is a setting too.
        if truthy(v) || (key == "passDeviceSpecs" && v.is_boolean()) {
            envs.push(env(var, text(v)));
        }
    }
    extend_list(&mut envs, c.get("extraEnv"));

    let security = if mig {
        json!({"runAsUser": 0, "readOnlyRootFilesystem": true, "privileged": true})
    } else {
        json!({
            "runAsUser": 0, "readOnlyRootFilesystem": true, "privileged": false,
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
        })
    };

    let mut mounts = vec![
        json!({"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"}),
        json!({"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": true}),
        json!({"name": "dev", "mountPath": "/dev"}),
    ];
    let mut volumes = vec![
        json!({"name": "device-plugins", "hostPath": {"path": plain(&format!("{kubelet}/device-plugins"))}}),
        json!({"name": "pod-resources", "hostPath": {"path": plain(&format!("{kubelet}/pod-resources"))}}),
        json!({"name": "dev", "hostPath": {"path": "/dev"}}),
    ];
    if custom_root {
        mounts.push(json!({"name": "driver-root", "mountPath": "/driver-root", "readOnly": true}));
        volumes.push(json!({"name": "driver-root", "hostPath": {"path": plain(&driver_root)}}));
    }
    if mig {
        mounts
            .push(json!({"name": "mig-config", "mountPath": "/etc/gpuops/mig", "readOnly": true}));
        mounts.push(json!({"name": "mig-state", "mountPath": "/var/lib/gpuops"}));
        volumes.push(
            json!({"name": "mig-config", "configMap": {"name": format!("{fullname}-mig-config")}}),
        );
        volumes.push(json!({
            "name": "mig-state",
            "hostPath": {"path": plain(&text(c.get("mig.stateDir"))), "type": "DirectoryOrCreate"},
        }));
    }
    if dp_configs {
        mounts.push(json!({"name": "device-plugin-configs", "mountPath": "/etc/gpuops/device-plugin", "readOnly": true}));
        volumes.push(json!({
            "name": "device-plugin-configs",
            "configMap": {"name": format!("{fullname}-device-plugin-configs")},
        }));
    }
    mounts.push(json!({"name": "tmp", "mountPath": "/tmp"}));
    volumes.push(json!({"name": "tmp", "emptyDir": {}}));
    extend_list(&mut mounts, c.get("extraVolumeMounts"));
    extend_list(&mut volumes, c.get("extraVolumes"));

    let tag = c.get("image.tag");
    let tag = if truthy(tag) {
        text(tag)
    } else {
        c.app_version.clone()
    };
    let mut container = json!({
        "name": "agent",
        "image": format!("{}:{tag}", text(c.get("image.repository"))),
        "imagePullPolicy": plain(&text(c.get("image.pullPolicy"))),
        "command": ["gpuops"],
        "args": args,
        "env": envs,
        "securityContext": security,
        "volumeMounts": mounts,
    });
    if metrics {
        container["ports"] =
            json!([{"name": "metrics", "containerPort": port.clone(), "protocol": "TCP"}]);
    }
    if c.on("resources") {
        container["resources"] = c.get("resources").clone();
    }

    let mut tolerations = vec![
        json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        json!({"key": plain(&taint_key), "operator": "Exists", "effect": "NoSchedule"}),
    ];
    extend_list(&mut tolerations, c.get("tolerations"));

    let mut pod = json!({
        "serviceAccountName": plain(&c.service_account()),
        "priorityClassName": text(c.get("priorityClassName")),
        "tolerations": tolerations,
        "containers": [container],
        "volumes": volumes,
    });
    for (key, field) in [
        ("runtimeClassName", "runtimeClassName"),
        ("imagePullSecrets", "imagePullSecrets"),
        ("nodeSelector", "nodeSelector"),
        ("affinity", "affinity"),
    ] {
        let v = c.get(key);
        if truthy(v) {
            pod[field] = if key == "runtimeClassName" {
                plain(&text(v))
            } else {
                v.clone()
            };
        }
    }

    let mut template_meta = json!({"labels": c.selector_labels()});
    template_meta["labels"]["app.kubernetes.io/component"] = json!("node-agent");
    if c.on("podAnnotations") {
        template_meta["annotations"] = c.get("podAnnotations").clone();
    }
    let mut spec = json!({
        "selector": {"matchLabels": c.selector_labels()},
        "template": {"metadata": template_meta, "spec": pod},
    });
    if c.on("updateStrategy") {
        spec["updateStrategy"] = c.get("updateStrategy").clone();
    }
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": c.metadata(fullname.to_string(), true, "node-agent"),
        "spec": spec,
    })
}

/// A multi-document YAML stream.
fn to_yaml_stream(objects: &[Value]) -> Result<String> {
    let mut out = format!(
        "# gpuops {} node agent, rendered by `gpuops manifests` from the Helm chart deploy/helm/gpuops.\n",
        env!("CARGO_PKG_VERSION")
    );
    for object in objects {
        out.push_str("---\n");
        let doc = serde_saphyr::to_string(object).context("rendering YAML")?;
        out.push_str(&doc);
        if !doc.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn set_parses_like_helm() {
        let pairs = parse_set(r"a.b=1,nodeSelector.x\.y/z=true,c=a\,b").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("a.b".to_string(), "1".to_string()),
                (r"nodeSelector.x\.y/z".to_string(), "true".to_string()),
                ("c".to_string(), "a,b".to_string()),
            ]
        );
        assert_eq!(typed("1"), json!(1));
        assert_eq!(typed("007"), json!("007"));
        assert_eq!(typed("false"), json!(false));
        assert_eq!(typed("5m"), json!("5m"));
        assert!(parse_set("novalue").is_err());
        assert!(parse_set("tolerations[0].key=x").is_err());
    }

    #[test]
    fn keys_are_checked_and_values_coalesce_like_helm() {
        let d = default_values().unwrap();
        check_key(&d, "mig.defaultConfig").unwrap();
        check_key(
            &d,
            r"nodeSelector.feature\.node\.kubernetes\.io/pci-10de\.present",
        )
        .unwrap();
        check_key(&d, "resources.limits.cpu").unwrap();
        check_key(&d, "devicePlugin.configs.default").unwrap();
        let e = check_key(&d, "mig.defaultConfg").unwrap_err();
        assert!(e.to_string().contains("no value mig.defaultConfg"), "{e}");
        assert!(check_key(&d, "interval.x").is_err());

        let mut user = json!({});
        set_value(
            &mut user,
            r"nodeSelector.nvidia\.com/gpu\.present",
            Value::Null,
        )
        .unwrap();
        set_value(&mut user, r"nodeSelector.a\.b/c", json!("true")).unwrap();
        set_value(&mut user, "mig.enabled", json!(false)).unwrap();
        let v = coalesce(d, user);
        assert_eq!(v["nodeSelector"], json!({"a.b/c": "true"}));
        assert_eq!(v["mig"]["enabled"], false);
        assert_eq!(v["mig"]["retry"], "30s");
    }

    #[test]
    fn image_splits_at_the_tag_not_the_port() {
        assert_eq!(
            split_image("reg:5000/gpuops"),
            ("reg:5000/gpuops".into(), None)
        );
        assert_eq!(
            split_image("reg:5000/gpuops:1.2"),
            ("reg:5000/gpuops".into(), Some("1.2".into()))
        );
    }

    #[test]
    fn fullname_follows_helm() {
        let v = default_values().unwrap();
        let objs = render(&v, "gpuops", "ns", false).unwrap();
        assert!(objs.iter().all(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("gpuops")
        }));
        let objs = render(&v, "prod", "ns", false).unwrap();
        let ds = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
        assert_eq!(ds["metadata"]["name"], "prod-gpuops");
        assert_eq!(block("a\nb\n\n  \n"), "a\nb\n");
    }
}
