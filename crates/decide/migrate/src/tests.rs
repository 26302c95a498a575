use super::*;
use serde_json::{Value, json};

fn docs(yaml: &str) -> Vec<Value> {
    parse_documents(yaml, "test").unwrap()
}

fn run(yaml: &str) -> Migration {
    migrate(&docs(yaml), &Options::default()).unwrap()
}

fn err(yaml: &str) -> String {
    migrate(&docs(yaml), &Options::default())
        .unwrap_err()
        .to_string()
}

fn v<'a>(m: &'a Migration, path: &str) -> &'a Value {
    path.split('.')
        .try_fold(&m.values, |v, k| v.get(k))
        .unwrap_or(&Value::Null)
}

fn warned(m: &Migration, field: &str) -> bool {
    m.warnings.iter().any(|w| w.field.contains(field))
}

const TIME_SLICING_CM: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: time-slicing-config, namespace: gpu-operator}
data:
  a100: |
    version: v1
    sharing:
      timeSlicing:
        renameByDefault: true
        failRequestsGreaterThanOne: true
        resources:
          - name: nvidia.com/gpu
            replicas: 4
  t4: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            replicas: 2
"#;

/// GPU Operator v24.9's shape: no hostPaths, dcgmExporter.config, devicePlugin.config.
const CP_V24: &str = r#"
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  operator: {defaultRuntime: containerd}
  daemonsets:
    priorityClassName: system-node-critical
    tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  driver: {enabled: true}
  toolkit: {enabled: true}
  devicePlugin:
    enabled: true
    config: {name: time-slicing-config, default: a100}
    env:
      - {name: PASS_DEVICE_SPECS, value: "true"}
      - {name: FAIL_ON_INIT_ERROR, value: "false"}
      - {name: DEVICE_LIST_STRATEGY, value: volume-mounts}
  gfd: {enabled: true}
  mig: {strategy: mixed}
  migManager:
    enabled: true
    config: {name: custom-mig-parted-config, default: all-disabled}
    env: [{name: WITH_REBOOT, value: "true"}]
  dcgmExporter:
    enabled: true
    config: {name: metrics-config}
  nodeStatusExporter: {enabled: true}
  validator: {plugin: {env: [{name: WITH_WORKLOAD, value: "false"}]}}
"#;

const MIG_CM: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: custom-mig-parted-config, namespace: gpu-operator}
data:
  config.yaml: |
    version: v1
    mig-configs:
      all-disabled:
        - devices: all
          mig-enabled: false
      all-1g.10gb:
        - devices: all
          mig-enabled: true
          mig-devices:
            "1g.10gb": 7
"#;

const METRICS_CM: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: metrics-config, namespace: gpu-operator}
data:
  dcgm-metrics.csv: |
    # Format
    # DCGM FIELD, Prometheus metric type, help message
    DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
    DCGM_FI_DEV_GPU_UTIL,  gauge, GPU utilization (in %).
    DCGM_FI_DEV_FB_USED,   gauge, Framebuffer memory used (in MiB).
    DCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, made-up field gpuops does not serve.
"#;

fn v24() -> String {
    format!("{CP_V24}---{TIME_SLICING_CM}---{MIG_CM}---{METRICS_CM}")
}

#[test]
fn v24_cluster_policy_keeps_configs_strategy_env_and_names_what_it_drops() {
    let m = run(&v24());
    assert_eq!(v(&m, "migStrategy"), "mixed");
    assert_eq!(v(&m, "passDeviceSpecs"), "true");
    assert_eq!(v(&m, "deviceListStrategy"), "volume-mounts");
    assert_eq!(v(&m, "devicePlugin.defaultConfig"), "a100");
    assert!(
        v(&m, "devicePlugin.configs.a100")
            .as_str()
            .unwrap()
            .contains("replicas: 4")
    );
    assert!(v(&m, "devicePlugin.configs.t4").is_string());
    assert!(v(&m, "mig.config").as_str().unwrap().contains("1g.10gb"));
    assert_eq!(v(&m, "mig.defaultConfig"), "all-disabled");
    assert_eq!(v(&m, "driverRoot"), "/run/nvidia/driver");
    assert_eq!(v(&m, "runtimeClassName"), "nvidia");
    assert_eq!(v(&m, "priorityClassName"), "system-node-critical");
    assert_eq!(v(&m, "tolerations")[0]["key"], "nvidia.com/gpu");
    assert_eq!(
        v(&m, "extraEnv"),
        &json!([{"name": "FAIL_ON_INIT_ERROR", "value": "false"}])
    );
    // Dropped, each named with its object and field.
    assert!(warned(&m, "spec.migManager.env[WITH_REBOOT]"));
    assert!(warned(&m, "spec.nodeStatusExporter.enabled"));
    let csv: Vec<&Warning> = m
        .warnings
        .iter()
        .filter(|w| w.object == "ConfigMap gpu-operator/metrics-config")
        .collect();
    assert_eq!(csv.len(), 1, "{csv:?}");
    assert!(csv[0].message.contains("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"));
    assert_eq!(csv[0].field, "data[dcgm-metrics.csv] line 6");
    assert!(m.notes.iter().any(|n| n.contains("3 of the 4 fields")));
    let yaml = m.values_yaml().unwrap();
    assert!(yaml.starts_with("# gpuops Helm values"));
    // The YAML reads back to the same values.
    let back: Value = serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(back, m.values);
}

/// GPU Operator v25's shape: hostPaths, cdi, MPS root, mig.strategy unset, dcgm env, service
/// monitor, an unknown spec field from a newer operator.
#[test]
fn v25_cluster_policy_with_mps_cdi_host_paths_and_defaults() {
    let m = run(r#"
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cluster-policy}
spec:
  hostPaths: {rootFS: /, driverInstallDir: /opt/nvidia/driver}
  driver: {enabled: false}
  cdi: {enabled: true, default: false}
  devicePlugin:
    config: {name: mps-config}
    mps: {root: /run/nvidia/mps}
  dcgmExporter:
    env:
      - {name: DCGM_EXPORTER_LISTEN, value: ":9500"}
      - {name: DCGM_EXPORTER_INTERVAL, value: "15000"}
      - {name: DCGM_EXPORTER_COLLECTORS, value: /etc/dcgm-exporter/dcp-metrics-included.csv}
    serviceMonitor: {enabled: true, interval: 30s, additionalLabels: {release: prom}}
  gfd: {enabled: false}
  migManager: {enabled: false}
  fabricManager: {enabled: true}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: mps-config, namespace: gpu-operator}
data:
  default: |
    version: v1
    sharing:
      mps:
        resources:
          - name: nvidia.com/gpu
            replicas: 10
"#);
    assert_eq!(v(&m, "migStrategy"), "single");
    assert!(m.notes.iter().any(|n| n.contains("GPU Operator's default")));
    assert_eq!(v(&m, "driverRoot"), "/opt/nvidia/driver");
    assert_eq!(v(&m, "cdi.enabled"), true);
    assert_eq!(v(&m, "featureLabels"), false);
    assert_eq!(v(&m, "mig.enabled"), false);
    assert_eq!(v(&m, "metrics.port"), 9500);
    assert_eq!(v(&m, "interval"), "15s");
    assert_eq!(v(&m, "metrics.serviceMonitor.labels.release"), "prom");
    assert_eq!(
        v(&m, "extraEnv"),
        &json!([{"name": "MPS_ROOT", "value": "/run/nvidia/mps"}])
    );
    assert!(
        v(&m, "devicePlugin.configs.default")
            .as_str()
            .unwrap()
            .contains("mps:")
    );
    assert!(warned(&m, "spec.fabricManager"));
    assert!(warned(&m, "DCGM_EXPORTER_COLLECTORS"));
    assert!(!m.plan.feature_labels);
}

#[test]
fn mig_single_and_the_operators_own_default_mig_config() {
    let m = run(r#"
apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata: {name: cp}
spec:
  mig: {strategy: single}
  migManager: {config: {name: default-mig-parted-config, default: all-1g.10gb}}
"#);
    assert_eq!(v(&m, "migStrategy"), "single");
    assert!(v(&m, "mig.config").is_null());
    assert_eq!(v(&m, "mig.defaultConfig"), "all-1g.10gb");
    assert!(
        m.notes
            .iter()
            .any(|n| n.contains("default-mig-parted-config"))
    );
}

#[test]
fn bad_and_partial_input_names_object_and_field() {
    let e = err(
        "apiVersion: nvidia.com/v1alpha1\nkind: ClusterPolicy\nmetadata: {name: cp}\nspec: {}\n",
    );
    assert!(
        e.contains("ClusterPolicy/cp: apiVersion is \"nvidia.com/v1alpha1\""),
        "{e}"
    );

    let e = err(CP_V24);
    assert!(
        e.contains("spec.devicePlugin.config.name names ConfigMap \"time-slicing-config\""),
        "{e}"
    );

    let e = err(&v24().replace("default: a100", "default: h100"));
    assert!(
        e.contains("spec.devicePlugin.config.default names config \"h100\""),
        "{e}"
    );
    assert!(e.contains("have: a100, t4"), "{e}");

    let e = err(&v24().replace("default: all-disabled", "default: all-3g"));
    assert!(
        e.contains("spec.migManager.config.default names MIG config \"all-3g\""),
        "{e}"
    );

    let e = err(&v24().replace("replicas: 4", "replicas: 1"));
    assert!(
        e.contains("ConfigMap gpu-operator/time-slicing-config: data[a100]"),
        "{e}"
    );

    let e = err(&v24().replace("strategy: mixed", "strategy: mixd"));
    assert!(e.contains("spec.mig.strategy: \"mixd\""), "{e}");

    let e = err(&v24().replace("value: volume-mounts", "value: volumes"));
    assert!(
        e.contains("spec.devicePlugin.env[DEVICE_LIST_STRATEGY]"),
        "{e}"
    );

    let e = err(&v24().replace("dcgm-metrics.csv: |", "metrics.csv: |"));
    assert!(e.contains("names key \"dcgm-metrics.csv\""), "{e}");

    let e = err(&v24().replace("mig-enabled: true", "mig-enabled: maybe"));
    assert!(
        e.contains("custom-mig-parted-config: data[config.yaml]"),
        "{e}"
    );

    let e = err("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n");
    assert!(e.contains("no ClusterPolicy"), "{e}");

    let e = err(&format!(
        "{CP_V24}---{}",
        CP_V24.replace("cluster-policy", "second")
    ));
    assert!(e.contains("both are ClusterPolicies"), "{e}");
}

const STANDALONE: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvdp-nvidia-device-plugin, namespace: nvidia-device-plugin}
spec:
  template:
    spec:
      containers:
        - name: nvidia-device-plugin-sidecar
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          command: [config-manager]
          env:
            - {name: CONFIG_FILE_SRCDIR, value: /available-configs}
            - {name: CONFIG_FILE_DST, value: /config/config.yaml}
            - {name: DEFAULT_CONFIG, value: default}
          volumeMounts: [{name: available-configs, mountPath: /available-configs}]
        - name: nvidia-device-plugin-ctr
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          command: [nvidia-device-plugin]
          args: [--mig-strategy=mixed, --fail-on-init-error=false]
          env:
            - {name: CONFIG_FILE, value: /config/config.yaml}
            - {name: DEVICE_ID_STRATEGY, value: index}
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
          volumeMounts: [{name: config, mountPath: /config}]
      volumes:
        - {name: available-configs, configMap: {name: nvdp-configs}}
        - {name: config, emptyDir: {}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvdp-gpu-feature-discovery, namespace: nvidia-device-plugin}
spec:
  template:
    spec:
      containers:
        - name: gpu-feature-discovery-ctr
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          command: [gpu-feature-discovery]
          env:
            - {name: MIG_STRATEGY, value: single}
            - {name: GFD_SLEEP_INTERVAL, value: 60s}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: nvdp-configs, namespace: nvidia-device-plugin}
data:
  default: |
    version: v1
  shared: |
    version: v1
    sharing:
      timeSlicing:
        resources:
          - name: nvidia.com/gpu
            rename: gpu-small
            replicas: 3
"#;

#[test]
fn standalone_device_plugin_and_gfd_with_the_config_manager() {
    let m = run(STANDALONE);
    assert_eq!(v(&m, "migStrategy"), "mixed");
    assert_eq!(v(&m, "deviceIdStrategy"), "index");
    assert_eq!(v(&m, "devicePlugin.defaultConfig"), "default");
    assert!(v(&m, "devicePlugin.configs.shared").is_string());
    assert_eq!(v(&m, "mig.enabled"), false);
    assert_eq!(v(&m, "metrics.enabled"), false);
    assert_eq!(
        v(&m, "extraEnv"),
        &json!([{"name": "FAIL_ON_INIT_ERROR", "value": "false"}])
    );
    // GFD's strategy differs from the plugin's; its interval is not carried; the rename is
    // honoured by gpuops but ignored by NVIDIA; NODE_NAME's valueFrom is plumbing.
    assert!(warned(&m, "env[MIG_STRATEGY]"));
    assert!(warned(&m, "env[GFD_SLEEP_INTERVAL]"));
    assert!(warned(&m, "resources[0].rename"));
    assert!(warned(&m, "env[NODE_NAME].valueFrom"));
}

#[test]
fn standalone_mig_manager_and_dcgm_exporter_files_from_config_maps() {
    let m = run(&format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: nvidia-mig-manager, namespace: gpu}}
spec:
  template:
    spec:
      containers:
        - name: mig-manager
          image: nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.10.0
          env:
            - {{name: CONFIG_FILE, value: /mig-parted-config/config.yaml}}
            - {{name: WITH_SHUTDOWN_HOST_GPU_CLIENTS, value: "true"}}
          volumeMounts: [{{name: cfg, mountPath: /mig-parted-config}}]
      volumes: [{{name: cfg, configMap: {{name: custom-mig-parted-config}}}}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: dcgm-exporter, namespace: gpu}}
spec:
  template:
    spec:
      containers:
        - name: exporter
          image: nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04
          args: [-f, /etc/dcgm-exporter/dcgm-metrics.csv]
          env: [{{name: DCGM_EXPORTER_COLLECTORS, value: /etc/dcgm-exporter/custom/dcgm-metrics.csv}}]
          volumeMounts: [{{name: m, mountPath: /etc/dcgm-exporter/custom}}]
      volumes: [{{name: m, configMap: {{name: metrics-config}}}}]
---{}---{}"#,
        MIG_CM.replace("gpu-operator", "gpu"),
        METRICS_CM.replace("gpu-operator", "gpu")
    ));
    assert!(
        v(&m, "mig.config")
            .as_str()
            .unwrap()
            .contains("all-1g.10gb")
    );
    assert_eq!(v(&m, "devicePlugin.enabled"), false);
    assert_eq!(v(&m, "featureLabels"), false);
    assert!(warned(&m, "WITH_SHUTDOWN_HOST_GPU_CLIENTS"));
    assert!(warned(&m, "line 6"));
}

fn node(name: &str, labels: Value, alloc: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
           "status": {"allocatable": alloc}})
}

#[test]
fn check_reports_no_change_for_gfd_labels_gpuops_writes_alike() {
    let m = run(&v24());
    let gfd = json!({
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/cuda.driver-version.major": "550",
        "nvidia.com/mig.config": "all-disabled",
        "kubernetes.io/hostname": "a"
    });
    let nodes = vec![
        node(
            "a",
            gfd.clone(),
            json!({"cpu": "8", "nvidia.com/gpu.shared": "32"}),
        ),
        node(
            "cpu-only",
            json!({"kubernetes.io/hostname": "c"}),
            json!({"cpu": "8"}),
        ),
    ];
    let checks = check_nodes(&nodes, &m.plan).unwrap();
    assert_eq!(checks.len(), 1);
    assert_eq!(checks[0].node, "a");
    assert_eq!(checks[0].config.as_deref(), Some("a100"));
    assert_eq!(checks[0].changes, vec![]);
    assert_eq!(checks[0].same, 9);

    // The node picks t4 (2 replicas, not renamed) by its label: the stale replicas label, and
    // vgpu.present and a missing gpu.present show up.
    let mut l = gfd.as_object().unwrap().clone();
    l.insert("nvidia.com/device-plugin.config".into(), json!("t4"));
    l.insert("nvidia.com/vgpu.present".into(), json!("false"));
    l.remove("nvidia.com/gpu.present");
    let checks = check_nodes(
        &[node("b", Value::Object(l), json!({"nvidia.com/gpu": "16"}))],
        &m.plan,
    )
    .unwrap();
    let keys: Vec<(&str, Option<&str>)> = checks[0]
        .changes
        .iter()
        .map(|c| (c.key.as_str(), c.after.as_deref()))
        .collect();
    assert_eq!(
        keys,
        vec![
            ("nvidia.com/gpu.replicas", Some("2")),
            ("nvidia.com/vgpu.present", Some("false")),
            ("nvidia.com/gpu.present", Some("true")),
        ]
    );
}

#[test]
fn check_names_a_renamed_resource_and_a_missing_config() {
    let m = run(STANDALONE);
    let checks = check_nodes(
        &[
            node(
                "s",
                json!({"nvidia.com/device-plugin.config": "shared", "nvidia.com/gpu.present": "true"}),
                json!({"nvidia.com/gpu": "24"}),
            ),
            node("x", json!({"nvidia.com/device-plugin.config": "nope"}), json!({})),
        ],
        &m.plan,
    )
    .unwrap();
    assert_eq!(checks[0].changes.len(), 1, "{:?}", checks[0].changes);
    assert!(checks[0].changes[0].why.contains("nvidia.com/gpu-small"));
    assert!(
        checks[1].changes[0]
            .why
            .contains("\"nope\", which does not exist")
    );
}

#[test]
fn csv_lines_that_are_not_fields_are_refused_with_their_line() {
    let e = err(&v24().replace("DCGM_FI_DEV_FB_USED,   gauge", "DCGM_FI_DEV_FB_USED gauge"));
    assert!(e.contains("data[dcgm-metrics.csv] line 5"), "{e}");
    assert!(served("DCGM_FI_DEV_GPU_UTIL") && served("DCGM_FI_DEV_XID_ERRORS"));
    assert!(!served("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"));
}

#[test]
fn standalone_plugin_reading_one_config_file_from_a_config_map_volume() {
    let ds = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: nvidia-device-plugin, namespace: kube-system}
spec:
  template:
    spec:
      containers:
        - name: plugin
          image: nvcr.io/nvidia/k8s-device-plugin:v0.17.0
          args: ["--config-file", "/etc/nvdp/plugin.yaml", --pass-device-specs]
          volumeMounts: [{name: cfg, mountPath: /etc/nvdp}]
      volumes:
        - {name: cfg, configMap: {name: nvdp, items: [{key: config, path: plugin.yaml}]}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: nvdp, namespace: kube-system}
data:
  config: |
    version: v1
    sharing:
      mps:
        resources: [{name: nvidia.com/gpu, replicas: 2}]
"#;
    let m = run(ds);
    // No MIG_STRATEGY: NVIDIA's default none, written out (the chart's default would be mixed).
    assert_eq!(v(&m, "migStrategy"), "none");
    assert_eq!(v(&m, "passDeviceSpecs"), "true");
    assert!(
        v(&m, "devicePlugin.configs.config")
            .as_str()
            .unwrap()
            .contains("mps:")
    );
    assert_eq!(m.plan.configs.len(), 1);

    // The file names a key the ConfigMap lacks: refused, naming the DaemonSet's argument.
    let e = err(&ds.replace("key: config,", "key: cfg,"));
    assert!(
        e.contains("DaemonSet kube-system/nvidia-device-plugin: spec.template.spec.containers[0].args[--config-file] names file \"cfg\""),
        "{e}"
    );
}
