//! From NVIDIA's objects to gpuops Helm values.

use crate::MigrateError;
use crate::csv;
use crate::objects::{Obj, at, flatten, text};
use gpuops_resources::config::{Config, Overrides};
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Something NVIDIA's objects ask for that the values cannot carry over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// `ClusterPolicy/cluster-policy`, `DaemonSet gpu-operator/nvidia-device-plugin`.
    pub object: String,
    /// `spec.migManager.env[WITH_REBOOT]`, `data[dcgm-metrics.csv] line 12`.
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}: {}", self.object, self.field, self.message)
    }
}

/// What the values make the agent do, for the per-node check.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The device plugin's named configs.
    pub configs: BTreeMap<String, Config>,
    /// The config for nodes without `nvidia.com/device-plugin.config`.
    pub default_config: Option<String>,
    /// The device plugin's env vars (win over a config file's flags).
    pub env: BTreeMap<String, String>,
    /// Whether gpuops writes GFD's labels.
    pub feature_labels: bool,
}

/// The translation's result.
#[derive(Debug, Clone)]
pub struct Migration {
    /// The Helm values (only what differs from the chart's defaults or must be said explicitly).
    pub values: Value,
    /// What could not be carried over.
    pub warnings: Vec<Warning>,
    /// What was carried over and how, for the header of the values file.
    pub notes: Vec<String>,
    pub plan: Plan,
}

impl Migration {
    /// The values as YAML with the notes as a comment header.
    pub fn values_yaml(&self) -> Result<String, MigrateError> {
        let body =
            serde_saphyr::to_string(&self.values).map_err(|e| MigrateError::Yaml(e.to_string()))?;
        let mut out = String::from("# gpuops Helm values written by `gpuops migrate`.\n");
        for n in &self.notes {
            out.push_str(&format!("# - {n}\n"));
        }
        if !self.warnings.is_empty() {
            out.push_str(&format!(
                "# {} setting(s) could not be carried over (listed on stderr):\n",
                self.warnings.len()
            ));
            for w in &self.warnings {
                out.push_str(&format!("#   {w}\n"));
            }
        }
        out.push_str(&body);
        Ok(out)
    }
}

/// Options of the translation.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where the GPU Operator's ConfigMaps live, when several namespaces hold one of the name.
    pub namespace: Option<String>,
}

/// One env var with where it was read.
#[derive(Debug, Clone)]
struct Env {
    name: String,
    value: String,
    object: String,
    field: String,
}

/// Builds the values.
struct Out<'a> {
    objects: &'a [Obj<'a>],
    options: &'a Options,
    values: Map<String, Value>,
    warnings: Vec<Warning>,
    notes: Vec<String>,
    plan: Plan,
    extra_env: BTreeMap<String, String>,
}

impl<'a> Out<'a> {
    fn set(&mut self, path: &str, v: Value) {
        let mut m = &mut self.values;
        let keys: Vec<&str> = path.split('.').collect();
        for k in &keys[..keys.len() - 1] {
            let e = m
                .entry(k.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if !e.is_object() {
                *e = Value::Object(Map::new());
            }
            let Value::Object(next) = e else { return };
            m = next;
        }
        m.insert(keys[keys.len() - 1].to_string(), v);
    }

    fn warn(&mut self, object: &str, field: &str, message: impl Into<String>) {
        self.warnings.push(Warning {
            object: object.to_string(),
            field: field.to_string(),
            message: message.into(),
        });
    }

    /// The ConfigMap a field names: in `options.namespace`, else in `near` (the namespace of the
    /// object naming it), else the only one of that name.
    fn config_map(
        &self,
        object: &str,
        field: &str,
        name: &str,
        near: Option<&str>,
    ) -> Result<Obj<'a>, MigrateError> {
        let all: Vec<Obj<'a>> = self
            .objects
            .iter()
            .filter(|o| o.kind == "ConfigMap" && o.name == name)
            .copied()
            .collect();
        let wanted = self.options.namespace.as_deref().or(near);
        if let Some(ns) = wanted
            && let Some(o) = all.iter().find(|o| o.namespace == Some(ns))
        {
            return Ok(*o);
        }
        match all.as_slice() {
            [one] if wanted.is_none() || one.namespace.is_none() => Ok(*one),
            [a, b, ..] if wanted.is_none() => Err(MigrateError::Ambiguous {
                first: a.id(),
                second: b.id(),
                what: "match the ConfigMap name; pass --namespace",
            }),
            _ => Err(MigrateError::MissingConfigMap {
                object: object.to_string(),
                field: field.to_string(),
                name: name.to_string(),
                namespace: wanted.map(str::to_string),
            }),
        }
    }
}

/// Translates NVIDIA's objects (a ClusterPolicy with its ConfigMaps, or the standalone
/// DaemonSets with theirs; `List`s are expanded) into gpuops Helm values.
pub fn migrate(objects: &[Value], options: &Options) -> Result<Migration, MigrateError> {
    let objs = flatten(objects)?;
    let mut out = Out {
        objects: &objs,
        options,
        values: Map::new(),
        warnings: Vec::new(),
        notes: Vec::new(),
        plan: Plan {
            feature_labels: true,
            ..Plan::default()
        },
        extra_env: BTreeMap::new(),
    };
    let policies: Vec<&Obj> = objs.iter().filter(|o| o.kind == "ClusterPolicy").collect();
    match policies.as_slice() {
        [] => standalone(&mut out, objs.len())?,
        [p] => cluster_policy(&mut out, p)?,
        [a, b, ..] => {
            return Err(MigrateError::Ambiguous {
                first: a.id(),
                second: b.id(),
                what: "are ClusterPolicies (the GPU Operator follows one)",
            });
        }
    }
    if !out.extra_env.is_empty() {
        let env: Vec<Value> = out
            .extra_env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        out.set("extraEnv", Value::Array(env));
    }
    Ok(Migration {
        values: Value::Object(out.values),
        warnings: out.warnings,
        notes: out.notes,
        plan: out.plan,
    })
}

fn enabled(v: &Value, path: &str, default: bool) -> bool {
    match at(v, path) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => default,
    }
}

/// The ClusterPolicy spec fields of GPU Operator v24 to v26 (api/nvidia/v1).
const SPEC_FIELDS: &[&str] = &[
    "operator",
    "daemonsets",
    "driver",
    "toolkit",
    "devicePlugin",
    "dcgmExporter",
    "dcgm",
    "nodeStatusExporter",
    "gfd",
    "mig",
    "migManager",
    "psp",
    "psa",
    "validator",
    "gds",
    "gdrcopy",
    "sandboxWorkloads",
    "vfioManager",
    "sandboxDevicePlugin",
    "vgpuManager",
    "vgpuDeviceManager",
    "cdi",
    "kataManager",
    "ccManager",
    "hostPaths",
];

/// Components without a gpuops counterpart: (spec field, enabled by default, what to do).
const NO_COUNTERPART: &[(&str, bool, &str)] = &[
    (
        "nodeStatusExporter",
        false,
        "the node status exporter has no gpuops counterpart; gpuops's /metrics carries gpuops_* agent figures instead",
    ),
    (
        "dcgm",
        false,
        "gpuops reads NVML directly and runs no DCGM host engine; keep the GPU Operator's DCGM if other tools use it",
    ),
    (
        "gds",
        false,
        "GPUDirect Storage drivers are not installed by gpuops; keep the GPU Operator's GDS DaemonSet",
    ),
    (
        "gdrcopy",
        false,
        "GDRCopy is not installed by gpuops; keep the GPU Operator's GDRCopy DaemonSet",
    ),
    (
        "sandboxWorkloads",
        false,
        "VM passthrough and vGPU workloads are not served by gpuops",
    ),
    (
        "vfioManager",
        true,
        "VFIO binding is not done by gpuops (only with sandboxWorkloads)",
    ),
    (
        "sandboxDevicePlugin",
        true,
        "the KubeVirt device plugin has no gpuops counterpart (only with sandboxWorkloads)",
    ),
    (
        "vgpuManager",
        false,
        "vGPU host drivers are not managed by gpuops",
    ),
    (
        "vgpuDeviceManager",
        true,
        "vGPU devices are not managed by gpuops (only with sandboxWorkloads)",
    ),
    (
        "kataManager",
        false,
        "Kata Containers are not configured by gpuops",
    ),
    (
        "ccManager",
        false,
        "confidential computing modes are not set by gpuops",
    ),
];

// Long on purpose: one ClusterPolicy section after another, each a few lines mapping NVIDIA's
// fields to our values; split up, the reader would lose the one place that lists them all.
fn cluster_policy(out: &mut Out, p: &Obj) -> Result<(), MigrateError> {
    let id = p.id();
    if p.api_version != "nvidia.com/v1" {
        return Err(MigrateError::WrongVersion {
            object: id,
            found: p.api_version.to_string(),
        });
    }
    let Some(spec) = p.at("spec").and_then(Value::as_object) else {
        return Err(MigrateError::BadValue {
            object: id,
            field: "spec".into(),
            problem: "missing or not a map".into(),
        });
    };
    out.notes.push(format!("from {id}"));
    for k in spec.keys() {
        if !SPEC_FIELDS.contains(&k.as_str()) {
            out.warn(
                &id,
                &format!("spec.{k}"),
                "not a ClusterPolicy field of GPU Operator v24 to v26 that gpuops migrate knows; not carried over",
            );
        }
    }
    for (field, default, why) in NO_COUNTERPART {
        let sandbox_only = *default && !enabled(p.v, "spec.sandboxWorkloads.enabled", false);
        if spec.contains_key(*field)
            && enabled(p.v, &format!("spec.{field}.enabled"), *default)
            && !sandbox_only
        {
            out.warn(&id, &format!("spec.{field}.enabled"), *why);
        }
    }
    let ns = operator_namespace(out);

    // Node placement of every DaemonSet.
    if let Some(t) = p.at("spec.daemonsets.tolerations") {
        out.set("tolerations", t.clone());
    }
    if let Some(pc) = text(p.v, "spec.daemonsets.priorityClassName") {
        out.set("priorityClassName", Value::String(pc));
    }
    if let Some(l) = p.at("spec.daemonsets.labels") {
        out.set("podLabels", l.clone());
    }
    if let Some(a) = p.at("spec.daemonsets.annotations") {
        out.set("podAnnotations", a.clone());
    }
    if text(p.v, "spec.daemonsets.updateStrategy").as_deref() == Some("OnDelete") {
        out.set("updateStrategy", json!({"type": "OnDelete"}));
    } else if let Some(m) = p.at("spec.daemonsets.rollingUpdate.maxUnavailable") {
        // An IntOrString: "1" written as a string is a count, which Kubernetes only takes as
        // a number ("25%" stays a string).
        let m = match m.as_str().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) => json!(n),
            None => m.clone(),
        };
        out.set(
            "updateStrategy",
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": m}}),
        );
    }

    // Driver and toolkit stay; the agent only needs to find the driver.
    let driver_root = text(p.v, "spec.hostPaths.driverInstallDir").or_else(|| {
        enabled(p.v, "spec.driver.enabled", true).then(|| "/run/nvidia/driver".to_string())
    });
    if let Some(root) = driver_root {
        out.notes.push(format!(
            "driverRoot {root}: keep the GPU Operator's driver (gpuops does not install drivers)"
        ));
        out.set("driverRoot", Value::String(root));
    }
    if enabled(p.v, "spec.toolkit.enabled", true) {
        let rc = text(p.v, "spec.operator.runtimeClass").unwrap_or_else(|| "nvidia".into());
        out.notes.push(format!(
            "runtimeClassName {rc}: keep the GPU Operator's container toolkit, which makes that RuntimeClass"
        ));
        out.set("runtimeClassName", Value::String(rc));
    }
    if enabled(p.v, "spec.cdi.enabled", false) {
        out.set("cdi.enabled", Value::Bool(true));
    }

    // MIG strategy: the operator passes spec.mig.strategy (default single) to the plugin and GFD.
    let strategy = match text(p.v, "spec.mig.strategy") {
        Some(s) => s,
        None => {
            out.notes.push(
                "migStrategy single: spec.mig.strategy is not set, and single is the GPU Operator's default"
                    .into(),
            );
            "single".into()
        }
    };
    if !matches!(strategy.as_str(), "none" | "single" | "mixed") {
        return Err(MigrateError::BadValue {
            object: id,
            field: "spec.mig.strategy".into(),
            problem: format!("{strategy:?} is not one of none, single, mixed"),
        });
    }

    // Device plugin.
    let dp_on = enabled(p.v, "spec.devicePlugin.enabled", true);
    if !dp_on {
        out.set("devicePlugin.enabled", Value::Bool(false));
    }
    let mut env = env_list(p, "spec.devicePlugin.env");
    if let Some(root) = text(p.v, "spec.devicePlugin.mps.root") {
        env.push(Env {
            name: "MPS_ROOT".into(),
            value: root,
            object: id.clone(),
            field: "spec.devicePlugin.mps.root".into(),
        });
    }
    if let Some(e) = env.iter().find(|e| e.name == "MIG_STRATEGY")
        && e.value != strategy
    {
        out.warn(
            &e.object,
            &e.field,
            format!(
                "MIG_STRATEGY={} differs from spec.mig.strategy {strategy}; the values keep spec.mig.strategy, which GFD labels with",
                e.value
            ),
        );
    }
    env.retain(|e| e.name != "MIG_STRATEGY");
    env.push(Env {
        name: "MIG_STRATEGY".into(),
        value: strategy.clone(),
        object: id.clone(),
        field: "spec.mig.strategy".into(),
    });
    device_plugin_env(out, &env)?;
    for a in strings(p.v, "spec.devicePlugin.args") {
        out.warn(
            &id,
            "spec.devicePlugin.args",
            format!("argument {a:?} is not carried over; set the matching value or extraArgs"),
        );
    }
    if let Some(name) = text(p.v, "spec.devicePlugin.config.name") {
        let cm = out.config_map(&id, "spec.devicePlugin.config.name", &name, ns.as_deref())?;
        let default = text(p.v, "spec.devicePlugin.config.default");
        device_plugin_configs(
            out,
            &cm,
            default.map(|d| {
                (
                    d,
                    id.clone(),
                    "spec.devicePlugin.config.default".to_string(),
                )
            }),
        )?;
    } else if let Some(d) = text(p.v, "spec.devicePlugin.config.default") {
        out.warn(
            &id,
            "spec.devicePlugin.config.default",
            format!("names config {d:?} but spec.devicePlugin.config.name names no ConfigMap; ignored, as the GPU Operator ignores it"),
        );
    }

    // GPU Feature Discovery.
    let gfd_on = enabled(p.v, "spec.gfd.enabled", true);
    out.plan.feature_labels = gfd_on;
    if !gfd_on {
        out.set("featureLabels", Value::Bool(false));
    }
    gfd_env(out, &env_list(p, "spec.gfd.env"), &strategy);

    // MIG manager.
    let mig_on = enabled(p.v, "spec.migManager.enabled", true);
    if !mig_on {
        out.set("mig.enabled", Value::Bool(false));
    }
    let mig_cm = text(p.v, "spec.migManager.config.name");
    let mig_text = match mig_cm.as_deref() {
        Some(name) => {
            match out.config_map(&id, "spec.migManager.config.name", name, ns.as_deref()) {
                Ok(cm) => Some(mig_config(out, &cm, "config.yaml")?),
                // The operator creates this one itself from NVIDIA's defaults, which are gpuops's.
                Err(MigrateError::MissingConfigMap { .. })
                    if name == "default-mig-parted-config" =>
                {
                    out.notes.push("mig.config empty: spec.migManager.config.name is the GPU Operator's own default-mig-parted-config, not among the objects read; gpuops's defaults are NVIDIA's same configs".into());
                    None
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    if let Some(d) = text(p.v, "spec.migManager.config.default") {
        check_mig_default(
            out,
            mig_text.as_deref(),
            &d,
            &id,
            "spec.migManager.config.default",
        )?;
    }
    mig_env(out, &env_list(p, "spec.migManager.env"));
    if let Some(n) = text(p.v, "spec.migManager.gpuClientsConfig.name") {
        out.warn(
            &id,
            "spec.migManager.gpuClientsConfig.name",
            format!("ConfigMap {n:?} lists host services to stop around a MIG change; gpuops stops none (it waits for the GPU's pods to end instead)"),
        );
    }

    // dcgm-exporter.
    let dcgm_on = enabled(p.v, "spec.dcgmExporter.enabled", true);
    if !dcgm_on {
        out.set("metrics.enabled", Value::Bool(false));
    }
    let dcgm = env_list(p, "spec.dcgmExporter.env");
    dcgm_env(out, &dcgm)?;
    let config_name = text(p.v, "spec.dcgmExporter.config.name");
    if let Some(e) = dcgm.iter().find(|e| e.name == "DCGM_EXPORTER_COLLECTORS")
        && config_name.is_none()
    {
        out.warn(
            &e.object,
            &e.field,
            format!(
                "{} is a file of dcgm-exporter's image, which gpuops cannot read; gpuops serves its fixed field set (docs/metrics.md), compare it with that file",
                e.value
            ),
        );
    }
    if let Some(name) = config_name {
        let cm = out.config_map(&id, "spec.dcgmExporter.config.name", &name, ns.as_deref())?;
        metrics_csv(out, &cm, "dcgm-metrics.csv")?;
    } else if dcgm_on {
        out.notes.push(
            "metrics: dcgm-exporter's default counters, which gpuops serves under the same names"
                .into(),
        );
    }
    if enabled(p.v, "spec.dcgmExporter.serviceMonitor.enabled", false) {
        out.set("metrics.serviceMonitor.enabled", Value::Bool(true));
        if let Some(i) = text(p.v, "spec.dcgmExporter.serviceMonitor.interval") {
            out.set("metrics.serviceMonitor.interval", Value::String(i));
        }
        if let Some(l) = p.at("spec.dcgmExporter.serviceMonitor.additionalLabels") {
            out.set("metrics.serviceMonitor.labels", l.clone());
        }
        out.set("metrics.serviceMonitor.podLabels", json!("target"));
    }
    Ok(())
}

/// The namespace of the GPU Operator's operands, from its DaemonSets when they were read.
fn operator_namespace(out: &Out) -> Option<String> {
    out.objects
        .iter()
        .find(|o| {
            o.kind == "DaemonSet"
                && o.at("metadata.ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|r| {
                        r.iter()
                            .any(|r| r.get("kind").and_then(Value::as_str) == Some("ClusterPolicy"))
                    })
        })
        .and_then(|o| o.namespace.map(str::to_string))
}

fn strings(v: &Value, path: &str) -> Vec<String> {
    at(v, path)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `[{name, value}]` at `path`.
fn env_list(o: &Obj, path: &str) -> Vec<Env> {
    at(o.v, path)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|e| {
                    let name = e.get("name")?.as_str()?.to_string();
                    Some(Env {
                        value: text(e, "value").unwrap_or_default(),
                        field: format!("{path}[{name}]"),
                        name,
                        object: o.id(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Device plugin variables with a value of their own.
const DP_VALUES: &[(&str, &str)] = &[
    ("MIG_STRATEGY", "migStrategy"),
    ("DEVICE_LIST_STRATEGY", "deviceListStrategy"),
    ("DEVICE_ID_STRATEGY", "deviceIdStrategy"),
    ("PASS_DEVICE_SPECS", "passDeviceSpecs"),
    ("DEVICE_SPLIT_COUNT", "deviceSplitCount"),
    ("NVIDIA_DRIVER_ROOT", "driverRoot"),
];
/// Device plugin variables the agent reads as NVIDIA's plugin does: carried in extraEnv.
const DP_EXTRA_ENV: &[&str] = &[
    "FAIL_ON_INIT_ERROR",
    "CDI_ANNOTATION_PREFIX",
    "NVIDIA_CTK_PATH",
    "MPS_ROOT",
    "SHARED_DEVICES_ALLOCATION_POLICY",
    "GDS_ENABLED",
    "MOFED_ENABLED",
    "GDRCOPY_ENABLED",
    "DEVICE_DISCOVERY_STRATEGY",
    "DP_DISABLE_HEALTHCHECKS",
    "DP_ENABLE_HEALTHCHECKS",
    "NVIDIA_DEV_ROOT",
];
/// Plumbing of NVIDIA's own pods, which the chart sets for the agent itself.
const PLUMBING: &[&str] = &[
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NODE_NAME",
    "CONFIG_FILE",
    "CONTAINER_DRIVER_ROOT",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "KUBELET_SOCKET",
];

fn device_plugin_env(out: &mut Out, env: &[Env]) -> Result<(), MigrateError> {
    for e in env {
        // NVIDIA's parser and the agent's are the same code: a value it refuses fails here.
        Overrides::default()
            .set(&e.name, &e.value)
            .map_err(|err| MigrateError::BadValue {
                object: e.object.clone(),
                field: e.field.clone(),
                problem: err.to_string(),
            })?;
        if let Some((_, key)) = DP_VALUES.iter().find(|(n, _)| *n == e.name) {
            out.set(key, Value::String(e.value.clone()));
            out.plan.env.insert(e.name.clone(), e.value.clone());
        } else if DP_EXTRA_ENV.contains(&e.name.as_str()) {
            out.extra_env.insert(e.name.clone(), e.value.clone());
            out.plan.env.insert(e.name.clone(), e.value.clone());
        } else if !PLUMBING.contains(&e.name.as_str()) {
            out.warn(
                &e.object,
                &e.field,
                format!(
                    "{} is not a variable of NVIDIA's device plugin that gpuops reads; not carried over",
                    e.name
                ),
            );
        }
    }
    Ok(())
}

/// Every key of the ConfigMap is a named device plugin config, as the GPU Operator mounts it.
fn device_plugin_configs(
    out: &mut Out,
    cm: &Obj,
    default: Option<(String, String, String)>,
) -> Result<(), MigrateError> {
    let id = cm.id();
    let data = cm.data();
    if data.is_empty() {
        return Err(MigrateError::BadValue {
            object: id,
            field: "data".into(),
            problem: "no device plugin config in it".into(),
        });
    }
    let mut configs = Map::new();
    for (key, body) in &data {
        let origin = format!("{id} data[{key}]");
        let cfg = Config::parse(body, &origin)
            .and_then(|c| c.validate(&origin).map(|()| c))
            .map_err(|e| MigrateError::BadValue {
                object: id.clone(),
                field: format!("data[{key}]"),
                problem: e.to_string(),
            })?;
        for u in &cfg.unknown_keys {
            out.warn(
                &id,
                &format!("data[{key}] {}", u.path),
                "a key NVIDIA's device plugin ignores; gpuops ignores it too",
            );
        }
        rename_warnings(out, &id, key, &cfg);
        out.plan.configs.insert(key.to_string(), cfg);
        configs.insert(key.to_string(), Value::String(body.to_string()));
    }
    out.set("devicePlugin.configs", Value::Object(configs));
    if let Some((d, object, field)) = default {
        if !data.contains_key(d.as_str()) {
            return Err(MigrateError::MissingKey {
                object,
                field,
                what: "config",
                key: d,
                where_and_have: format!(
                    "{} does not have (have: {})",
                    id,
                    data.keys().copied().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        out.set("devicePlugin.defaultConfig", Value::String(d.clone()));
        out.plan.default_config = Some(d);
    }
    out.notes.push(format!(
        "devicePlugin.configs: every config of {id} ({}), parsed with the agent's parser",
        data.keys().copied().collect::<Vec<_>>().join(", ")
    ));
    Ok(())
}

/// NVIDIA's plugin ignores a custom `rename` and a `devices` other than `all` (with a warning of
/// its own); gpuops honours both, so a node's resources would change.
fn rename_warnings(out: &mut Out, id: &str, key: &str, cfg: &Config) {
    let (_, section) = cfg.sharing.active();
    let Some(section) = section else { return };
    for (i, r) in section.resources.iter().enumerate() {
        if let Some(rename) = &r.rename {
            out.warn(
                id,
                &format!("data[{key}] sharing resources[{i}].rename"),
                format!(
                    "NVIDIA's plugin ignores rename {:?} and advertises {}; gpuops honours it, so {} becomes {}: pods asking for the old name stay pending (see --check)",
                    rename.value,
                    if section.rename_by_default { format!("{}.shared", r.name.value) } else { r.name.value.clone() },
                    r.name.value,
                    rename.value
                ),
            );
        }
        if !matches!(
            r.devices.value,
            gpuops_resources::config::ReplicatedDevices::All
        ) {
            out.warn(
                id,
                &format!("data[{key}] sharing resources[{i}].devices"),
                "NVIDIA's plugin ignores a devices selection and shares every GPU; gpuops shares only the devices listed",
            );
        }
    }
}

fn mig_config(out: &mut Out, cm: &Obj, key: &str) -> Result<String, MigrateError> {
    let id = cm.id();
    let data = cm.data();
    let Some(body) = data.get(key) else {
        return Err(MigrateError::MissingKey {
            object: id.clone(),
            field: format!("data[{key}]"),
            what: "key",
            key: key.to_string(),
            where_and_have: format!(
                "{} does not have (have: {})",
                id,
                data.keys().copied().collect::<Vec<_>>().join(", ")
            ),
        });
    };
    let origin = format!("{id} data[{key}]");
    let parsed = gpuops_mig::config::parse(body, &origin).map_err(|e| MigrateError::BadValue {
        object: id.clone(),
        field: format!("data[{key}]"),
        problem: e.to_string(),
    })?;
    out.set("mig.config", Value::String(body.to_string()));
    out.notes.push(format!(
        "mig.config: {id} data[{key}] ({} configs), parsed with the agent's mig-parted parser",
        parsed.configs.len()
    ));
    Ok(body.to_string())
}

fn check_mig_default(
    out: &mut Out,
    mig_text: Option<&str>,
    name: &str,
    object: &str,
    field: &str,
) -> Result<(), MigrateError> {
    let parsed = match mig_text {
        Some(t) => gpuops_mig::config::parse(t, "mig config").ok(),
        None => Some(gpuops_mig::config::nvidia_default_configs()),
    };
    if let Some(p) = parsed
        && p.get(name).is_err()
    {
        return Err(MigrateError::MissingKey {
            object: object.to_string(),
            field: field.to_string(),
            what: "MIG config",
            key: name.to_string(),
            where_and_have: format!(
                "{} does not have (have: {})",
                if mig_text.is_some() {
                    "the mig-parted config"
                } else {
                    "NVIDIA's default mig-parted config"
                },
                p.names().join(", ")
            ),
        });
    }
    out.set("mig.defaultConfig", Value::String(name.to_string()));
    Ok(())
}

fn gfd_env(out: &mut Out, env: &[Env], strategy: &str) {
    for e in env {
        match e.name.as_str() {
            "MIG_STRATEGY" | "GFD_MIG_STRATEGY" if e.value != strategy => out.warn(
                &e.object,
                &e.field,
                format!(
                    "GFD labels with strategy {} but the device plugin serves {strategy}; gpuops uses one strategy for both",
                    e.value
                ),
            ),
            "MIG_STRATEGY" | "GFD_MIG_STRATEGY" => {}
            "GFD_SLEEP_INTERVAL" => out.warn(
                &e.object,
                &e.field,
                "gpuops relabels after every read of the GPUs (interval) and at once on MIG changes; not carried over",
            ),
            "GFD_NO_TIMESTAMP" if e.value == "true" => out.warn(
                &e.object,
                &e.field,
                "gpuops always writes nvidia.com/gfd.timestamp; not carried over",
            ),
            "GFD_USE_NODE_FEATURE_API" | "USE_NODE_FEATURE_API" => out.warn(
                &e.object,
                &e.field,
                "gpuops writes the labels on the Node itself; for NFD use extraArgs --nfd-features-file",
            ),
            n if PLUMBING.contains(&n) || n == "GFD_NO_TIMESTAMP" || n == "GFD_ONESHOT" => {}
            n => out.warn(
                &e.object,
                &e.field,
                format!("{n} is not a GFD variable gpuops reads; not carried over"),
            ),
        }
    }
}

fn mig_env(out: &mut Out, env: &[Env]) {
    for e in env {
        match e.name.as_str() {
            "WITH_REBOOT" if e.value == "true" => out.warn(
                &e.object,
                &e.field,
                "gpuops never reboots a node; a MIG mode change the GPU cannot make without a reset is reported failed in nvidia.com/mig.config.state instead",
            ),
            "WITH_SHUTDOWN_HOST_GPU_CLIENTS" if e.value == "true" => out.warn(
                &e.object,
                &e.field,
                "gpuops stops no host services around a MIG change; it waits for the GPU's pods to end (mig.drainTimeout)",
            ),
            "WITH_REBOOT" | "WITH_SHUTDOWN_HOST_GPU_CLIENTS" => {}
            n if PLUMBING.contains(&n) || n == "DEFAULT_GPU_CLIENTS_NAMESPACE" => {}
            n => out.warn(
                &e.object,
                &e.field,
                format!("{n} is not a MIG manager variable gpuops reads; not carried over"),
            ),
        }
    }
}

fn dcgm_env(out: &mut Out, env: &[Env]) -> Result<(), MigrateError> {
    let vars: Vec<(String, String)> = env
        .iter()
        .filter(|e| e.name != "DCGM_EXPORTER_COLLECTORS")
        .map(|e| (e.name.clone(), e.value.clone()))
        .collect();
    let field_of = |name: &str| {
        env.iter()
            .find(|e| e.name == name)
            .map(|e| (e.object.clone(), e.field.clone()))
            .unwrap_or_default()
    };
    let parsed = gpuops_metrics::DcgmExporterEnv::from_vars(vars).map_err(|err| {
        let gpuops_metrics::EnvError::BadValue { var, .. } = &err;
        let (object, field) = field_of(var);
        MigrateError::BadValue {
            object,
            field,
            problem: err.to_string(),
        }
    })?;
    if let Some(l) = parsed.listen {
        out.set("metrics.port", json!(l.port()));
    }
    if let Some(i) = parsed.interval {
        let ms = i.as_millis();
        let v = if ms % 1000 == 0 {
            format!("{}s", ms / 1000)
        } else {
            format!("{ms}ms")
        };
        out.set("interval", Value::String(v));
    }
    for line in &parsed.ignored {
        let var = line.split_whitespace().next().unwrap_or_default();
        let (object, field) = field_of(var);
        out.warn(&object, &field, line.clone());
    }
    for e in env {
        let known = e.name.starts_with("DCGM_EXPORTER_")
            || e.name.starts_with("DCGM_")
            || PLUMBING.contains(&e.name.as_str());
        if !known {
            out.warn(
                &e.object,
                &e.field,
                format!(
                    "{} is not a dcgm-exporter variable gpuops reads; not carried over",
                    e.name
                ),
            );
        }
    }
    Ok(())
}

fn metrics_csv(out: &mut Out, cm: &Obj, key: &str) -> Result<(), MigrateError> {
    let id = cm.id();
    let data = cm.data();
    let Some(body) = data.get(key) else {
        return Err(MigrateError::MissingKey {
            object: id.clone(),
            field: format!("data[{key}]"),
            what: "key",
            key: key.to_string(),
            where_and_have: format!(
                "{} does not have (have: {})",
                id,
                data.keys().copied().collect::<Vec<_>>().join(", ")
            ),
        });
    };
    let field = format!("data[{key}]");
    let fields = csv::parse(body, &id, &field)?;
    let mut kept = 0;
    for f in &fields {
        if csv::served(&f.name) {
            kept += 1;
        } else {
            out.warn(
                &id,
                &format!("{field} line {}", f.line),
                format!(
                    "{} is not served by gpuops (its fixed field set: docs/metrics.md); dashboards and alerts on it lose their data",
                    f.name
                ),
            );
        }
    }
    out.notes.push(format!(
        "metrics: {kept} of the {} fields of {id} {field} are served by gpuops under the same names",
        fields.len()
    ));
    Ok(())
}

/// Which of NVIDIA's standalone components a container is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    DevicePlugin,
    Gfd,
    MigManager,
    Dcgm,
    ConfigManager,
}

fn classify(container: &Value) -> Option<Part> {
    let image = container.get("image").and_then(Value::as_str).unwrap_or("");
    let mut words: Vec<String> = strings(container, "command");
    words.extend(strings(container, "args"));
    let says = |w: &str| words.iter().any(|s| s.contains(w));
    if says("config-manager") {
        Some(Part::ConfigManager)
    } else if says("gpu-feature-discovery") || image.contains("gpu-feature-discovery") {
        Some(Part::Gfd)
    } else if image.contains("k8s-device-plugin") || says("nvidia-device-plugin") {
        Some(Part::DevicePlugin)
    } else if image.contains("mig-manager") {
        Some(Part::MigManager)
    } else if image.contains("dcgm-exporter") {
        Some(Part::Dcgm)
    } else {
        None
    }
}

/// Env vars and `--flag[=value]` arguments of one container, as NVIDIA's tools read them (every
/// flag has an env var of the same name in capitals).
fn container_env(ds: &Obj, c: &Value, ci: usize) -> Vec<Env> {
    let cname = c
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    let mut out = Vec::new();
    if let Some(env) = c.get("env").and_then(Value::as_array) {
        for e in env {
            let Some(name) = e.get("name").and_then(Value::as_str) else {
                continue;
            };
            out.push(Env {
                name: name.to_string(),
                value: text(e, "value").unwrap_or_default(),
                object: ds.id(),
                field: if e.get("valueFrom").is_some() {
                    format!("spec.template.spec.containers[{cname}].env[{name}].valueFrom")
                } else {
                    format!("spec.template.spec.containers[{cname}].env[{name}]")
                },
            });
        }
    }
    let args = strings(c, "args");
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some(flag) = a.strip_prefix("--") {
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None if args.get(i + 1).is_some_and(|n| !n.starts_with('-')) => {
                    i += 1;
                    (flag.to_string(), args[i].clone())
                }
                None => (flag.to_string(), "true".to_string()),
            };
            out.push(Env {
                name: name.replace('-', "_").to_uppercase(),
                value,
                object: ds.id(),
                field: format!("spec.template.spec.containers[{ci}].args[--{name}]"),
            });
        }
        i += 1;
    }
    out
}

/// The ConfigMap and key a file path in a container comes from, through its volume mounts.
fn file_source(ds: &Obj, c: &Value, path: &str) -> Option<(String, Option<String>)> {
    let mounts = c.get("volumeMounts").and_then(Value::as_array)?;
    let volumes = at(ds.v, "spec.template.spec.volumes").and_then(Value::as_array)?;
    for m in mounts {
        let mount = m.get("mountPath").and_then(Value::as_str)?;
        let rest = if path == mount {
            ""
        } else if let Some(r) = path.strip_prefix(&format!("{}/", mount.trim_end_matches('/'))) {
            r
        } else {
            continue;
        };
        let vname = m.get("name").and_then(Value::as_str)?;
        let vol = volumes
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(vname))?;
        let cm = text(vol, "configMap.name")?;
        let sub = m.get("subPath").and_then(Value::as_str);
        let file = sub.unwrap_or(rest);
        // An items list maps keys to other file names.
        let key = at(vol, "configMap.items")
            .and_then(Value::as_array)
            .and_then(|items| {
                items
                    .iter()
                    .find(|i| i.get("path").and_then(Value::as_str) == Some(file))
                    .and_then(|i| text(i, "key"))
            })
            .unwrap_or_else(|| file.to_string());
        return Some((cm, (!key.is_empty()).then_some(key)));
    }
    None
}

/// A ConfigMap read left until every DaemonSet has been classified (the env vars go first).
type Job<'a> = Box<dyn FnOnce(&mut Out) -> Result<(), MigrateError> + 'a>;

// Long on purpose: classifies every standalone DaemonSet first and reads ConfigMaps after, in
// one pass whose order matters (env vars decide which ConfigMap keys count).
fn standalone(out: &mut Out, count: usize) -> Result<(), MigrateError> {
    let objects = out.objects;
    let mut found: BTreeMap<&'static str, String> = BTreeMap::new();
    let mut dp_env: Vec<Env> = Vec::new();
    let mut gfd: Vec<Env> = Vec::new();
    let mut mig: Vec<Env> = Vec::new();
    let mut dcgm: Vec<Env> = Vec::new();
    let mut jobs: Vec<Job> = Vec::new();
    for ds in objects.iter().filter(|o| o.kind == "DaemonSet") {
        let containers = at(ds.v, "spec.template.spec.containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for (ci, c) in containers.iter().enumerate() {
            let Some(part) = classify(c) else { continue };
            let env = container_env(ds, c, ci);
            for e in env.iter().filter(|e| e.field.ends_with(".valueFrom")) {
                out.warn(
                    &e.object,
                    &e.field,
                    format!(
                        "{} comes from another object (valueFrom); set its value by hand",
                        e.name
                    ),
                );
            }
            let key = match part {
                Part::DevicePlugin => "device plugin",
                Part::Gfd => "GPU Feature Discovery",
                Part::MigManager => "MIG manager",
                Part::Dcgm => "dcgm-exporter",
                Part::ConfigManager => "config manager",
            };
            if let Some(prev) = found.get(key)
                && *prev != ds.id()
                && part != Part::ConfigManager
            {
                return Err(MigrateError::Ambiguous {
                    first: prev.clone(),
                    second: ds.id(),
                    what: "run NVIDIA's same component; gpuops migrate translates one of each",
                });
            }
            found.insert(key, ds.id());
            let file = env
                .iter()
                .find(|e| {
                    e.name == "CONFIG_FILE"
                        || e.name == "COLLECTORS"
                        || e.name == "DCGM_EXPORTER_COLLECTORS"
                })
                .map(|e| (e.value.clone(), e.field.clone()));
            let src_dir = env
                .iter()
                .find(|e| e.name == "CONFIG_FILE_SRCDIR")
                .map(|e| e.value.clone());
            let default = env
                .iter()
                .find(|e| e.name == "DEFAULT_CONFIG")
                .map(|e| (e.value.clone(), e.object.clone(), e.field.clone()));
            let env: Vec<Env> = env
                .into_iter()
                .filter(|e| !e.field.ends_with(".valueFrom"))
                .collect();
            let ds = *ds;
            let c = c.clone();
            match part {
                Part::DevicePlugin => {
                    dp_env.extend(env);
                    if let Some((path, field)) = file
                        && let Some((cm, key)) = file_source(&ds, &c, &path)
                    {
                        jobs.push(Box::new(move |out: &mut Out| {
                            let cm = out.config_map(&ds.id(), &field, &cm, ds.namespace)?;
                            let data = cm.data();
                            match key {
                                Some(k) if data.contains_key(k.as_str()) => {
                                    single_config(out, &cm, &k)
                                }
                                Some(k) => Err(MigrateError::MissingKey {
                                    object: ds.id(),
                                    field,
                                    what: "file",
                                    key: k,
                                    where_and_have: format!(
                                        "{} does not have (have: {})",
                                        cm.id(),
                                        data.keys().copied().collect::<Vec<_>>().join(", ")
                                    ),
                                }),
                                None => device_plugin_configs(out, &cm, None),
                            }
                        }));
                    }
                }
                Part::ConfigManager => {
                    if let Some(dir) = src_dir {
                        let field =
                            format!("spec.template.spec.containers[{ci}].env[CONFIG_FILE_SRCDIR]");
                        let Some((cm, _)) = file_source(&ds, &c, &dir) else {
                            out.warn(&ds.id(), &field, format!("{dir} is not a ConfigMap volume; the named configs are not carried over"));
                            continue;
                        };
                        jobs.push(Box::new(move |out: &mut Out| {
                            let cm = out.config_map(&ds.id(), &field, &cm, ds.namespace)?;
                            device_plugin_configs(out, &cm, default)
                        }));
                    }
                }
                Part::Gfd => gfd.extend(env),
                Part::MigManager => {
                    mig.extend(env);
                    if let Some((path, field)) = file {
                        let Some((cm, key)) = file_source(&ds, &c, &path) else {
                            out.warn(&ds.id(), &field, format!("{path} is not in a ConfigMap volume; the MIG configs are not carried over"));
                            continue;
                        };
                        jobs.push(Box::new(move |out: &mut Out| {
                            let cm = out.config_map(&ds.id(), &field, &cm, ds.namespace)?;
                            mig_config(out, &cm, key.as_deref().unwrap_or("config.yaml"))
                                .map(|_| ())
                        }));
                    }
                }
                Part::Dcgm => {
                    dcgm.extend(env);
                    if let Some((path, field)) = file {
                        match file_source(&ds, &c, &path) {
                            Some((cm, key)) => jobs.push(Box::new(move |out: &mut Out| {
                                let cm = out.config_map(&ds.id(), &field, &cm, ds.namespace)?;
                                metrics_csv(out, &cm, key.as_deref().unwrap_or("dcgm-metrics.csv"))
                            })),
                            None => out.notes.push(format!(
                                "metrics: {path} is a file of the dcgm-exporter image (not a ConfigMap); gpuops serves dcgm-exporter's default counters"
                            )),
                        }
                    }
                }
            }
        }
    }
    if found.is_empty() {
        return Err(MigrateError::NothingToMigrate { count });
    }
    for (what, id) in &found {
        out.notes.push(format!("{what} from {id}"));
    }
    let strategy = dp_env
        .iter()
        .find(|e| e.name == "MIG_STRATEGY")
        .map(|e| e.value.clone())
        .unwrap_or_else(|| "none".into());
    if found.contains_key("device plugin") {
        device_plugin_env(out, &dp_env)?;
        if !dp_env.iter().any(|e| e.name == "MIG_STRATEGY") {
            // Said explicitly: the chart's empty default means mixed while mig.enabled is true.
            out.set("migStrategy", json!("none"));
            out.plan.env.insert("MIG_STRATEGY".into(), "none".into());
            out.notes.push(
                "migStrategy none: NVIDIA's device plugin default (MIG_STRATEGY not set)".into(),
            );
        }
    } else {
        out.set("devicePlugin.enabled", Value::Bool(false));
        out.notes
            .push("devicePlugin.enabled false: no NVIDIA device plugin DaemonSet was read".into());
    }
    if found.contains_key("GPU Feature Discovery") {
        gfd_env(out, &gfd, &strategy);
    } else {
        out.set("featureLabels", Value::Bool(false));
        out.plan.feature_labels = false;
        out.notes
            .push("featureLabels false: no GPU Feature Discovery DaemonSet was read".into());
    }
    if found.contains_key("MIG manager") {
        mig_env(out, &mig);
    } else {
        out.set("mig.enabled", Value::Bool(false));
        out.notes
            .push("mig.enabled false: no MIG manager DaemonSet was read".into());
    }
    if found.contains_key("dcgm-exporter") {
        dcgm_env(out, &dcgm)?;
    } else {
        out.set("metrics.enabled", Value::Bool(false));
        out.notes
            .push("metrics.enabled false: no dcgm-exporter DaemonSet was read".into());
    }
    for job in jobs {
        job(out)?;
    }
    Ok(())
}

/// A device plugin reading one file (CONFIG_FILE) of a ConfigMap: one config, the only one.
fn single_config(out: &mut Out, cm: &Obj, key: &str) -> Result<(), MigrateError> {
    let id = cm.id();
    let data = cm.data();
    let body = data.get(key).copied().unwrap_or_default();
    let origin = format!("{id} data[{key}]");
    let cfg = Config::parse(body, &origin)
        .and_then(|c| c.validate(&origin).map(|()| c))
        .map_err(|e| MigrateError::BadValue {
            object: id.clone(),
            field: format!("data[{key}]"),
            problem: e.to_string(),
        })?;
    rename_warnings(out, &id, key, &cfg);
    out.plan.configs.insert(key.to_string(), cfg);
    out.set("devicePlugin.configs", json!({ key: body }));
    out.notes.push(format!(
        "devicePlugin.configs: {id} data[{key}] (the device plugin's CONFIG_FILE), parsed with the agent's parser"
    ));
    Ok(())
}
