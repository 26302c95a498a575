//! Cluster API in the test bed: its CRDs, the real core controller manager (built from
//! `sigs.k8s.io/cluster-api/core` by `tests/k8s/build.sh capi`), and gpuops's test provider, with
//! the test bed's apiserver as both the management and the workload cluster.
//!
//! ```no_run
//! # use gpuops_testbed::*;
//! let cluster = Cluster::start(ClusterOptions {
//!     kwok: true,
//!     controller_manager: true,
//!     ..ClusterOptions::default()
//! })?;
//! let capi = cluster.start_cluster_api(CapiOptions::default())?;
//! capi.add_pool(&PoolSpec::new("h100", NodeShape::gpu("NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", 8)))?;
//! capi.scale("h100", 2)?;
//! let machines = capi.wait_machines("h100", 2, std::time::Duration::from_secs(120))?;
//! # Ok::<(), BedError>(())
//! ```

use crate::child::ChildGuard;
use crate::infra::{NodeShape, PROVIDER_CRDS, Provider};
use crate::kubectl::{Kubectl, Loop};
use crate::scenario::{Autoscaler, GPU, Instance, Offer};
use crate::{BedError, Cluster, free_port, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// The environment variable naming the directory `tests/k8s/build.sh capi` built.
pub const CAPI_BIN_ENV: &str = "GPUOPS_CAPI_BIN";
/// The Machine annotation that makes a MachineSet delete that Machine first on scale-down.
pub const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";

const READY: Duration = Duration::from_secs(120);

/// Where the Cluster lives.
#[derive(Debug, Clone)]
pub struct CapiOptions {
    pub namespace: String,
    pub cluster_name: String,
    /// How often the test provider reconciles (its nodes' delays are only this precise).
    pub provider_interval: Duration,
}

impl Default for CapiOptions {
    fn default() -> Self {
        CapiOptions {
            namespace: "default".into(),
            cluster_name: "bed".into(),
            provider_interval: Duration::from_millis(250),
        }
    }
}

/// One node pool: a MachineDeployment of the provider's machines.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    pub name: String,
    /// Cluster Autoscaler's clusterapi min/max annotations (which gpuops's controller reads too).
    pub min: u32,
    pub max: u32,
    pub replicas: u32,
    pub node: NodeShape,
    /// Extra MachineDeployment annotations (price, MIG config, ...), verbatim.
    pub annotations: BTreeMap<String, String>,
}

impl PoolSpec {
    /// A pool of `node`s, 0 replicas, between 0 and 10 nodes.
    pub fn new(name: &str, node: NodeShape) -> PoolSpec {
        PoolSpec {
            name: name.to_string(),
            min: 0,
            max: 10,
            replicas: 0,
            node,
            annotations: BTreeMap::new(),
        }
    }

    /// The offer as a pool: nodes that boot in `boot` and advertise its devices `devices` after
    /// registering, and the annotations a user would write for it (Cluster Autoscaler's
    /// capacity counts physical GPUs; gpuops's say the price, product, MIG config or replicas
    /// from which the controller works out what a node advertises).
    pub fn from_offer(offer: &Offer, boot: Duration, devices: Duration) -> PoolSpec {
        let mut node = NodeShape::gpu(&offer.product, &offer.resource, offer.devices);
        node.boot_delay = boot;
        node.devices_delay = devices;
        node.labels
            .insert("nvidia.com/gpu.count".into(), offer.gpus.to_string());
        let mut pool = PoolSpec::new(&offer.name, node);
        let mut annotate = |k: &str, v: String| pool.annotations.insert(k.to_string(), v);
        annotate(
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            GPU.to_string(),
        );
        annotate(
            "capacity.cluster-autoscaler.kubernetes.io/gpu-count",
            offer.gpus.to_string(),
        );
        annotate("gpuops.io/price-per-hour", offer.price.to_string());
        annotate("gpuops.io/gpu-product", offer.product.clone());
        if let Some(c) = &offer.mig_config {
            annotate("gpuops.io/mig-config", c.clone());
            pool.node
                .labels
                .insert("nvidia.com/mig.config".into(), c.clone());
        }
        if let Some(r) = offer.replicas {
            annotate("gpuops.io/gpu-replicas", r.to_string());
            pool.node
                .labels
                .insert("nvidia.com/gpu.replicas".into(), r.to_string());
        }
        pool
    }
}

/// A Machine as the tests look at it.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineInfo {
    pub name: String,
    pub phase: String,
    pub provider_id: Option<String>,
    pub node: Option<String>,
}

/// Cluster API running against a [`Cluster`]. Dropping it stops the controller manager and the
/// provider (the objects stay until the Cluster goes).
#[derive(Debug)]
pub struct ClusterApi {
    // Field order: the provider loop stops before the manager.
    _provider: Loop,
    manager: ChildGuard,
    kube: Kubectl,
    namespace: String,
    cluster_name: String,
    dir: PathBuf,
    /// The node shape of each pool added, for [`Autoscaler::instances`] and the waits.
    pools: Mutex<BTreeMap<String, NodeShape>>,
}

impl Cluster {
    /// Installs the Cluster API CRDs and the test provider's, starts the core controller manager
    /// and the provider, creates the Cluster and waits until it is provisioned and initialized.
    /// Needs KWOK ([`crate::ClusterOptions::kwok`]), which runs the nodes, and the controller
    /// manager ([`crate::ClusterOptions::controller_manager`]), which lifts the not-ready taint
    /// the apiserver puts on every new node.
    pub fn start_cluster_api(&self, options: CapiOptions) -> Result<ClusterApi, BedError> {
        let bin = capi_bin()?;
        let dir = self.dir().join("capi");
        std::fs::create_dir_all(&dir)
            .map_err(|e| BedError::io(format!("creating {}", dir.display()), e))?;
        let kube = Kubectl::new(self.bin(), &self.kubeconfig());

        // The CRDs as the module ships them: no conversion webhook (only kustomize patches add
        // one), so the apiserver serves them alone. `create`: some are too big for the
        // last-applied annotation of a client-side apply.
        kube.run(
            &["create", "-f", &bin.join("crds").display().to_string()],
            None,
        )?;
        kube.apply(PROVIDER_CRDS)?;
        kube.run(
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ],
            None,
        )?;

        // The manager's defaulting and validating webhooks, served with a throwaway self-signed
        // certificate and registered below by URL: objects written by tests get the defaults a
        // real installation gives them (a MachineDeployment without a rollout strategy, for
        // one, is not reconciled at all).
        let certs = dir.join("certs");
        self_signed_cert(&certs)?;
        let health = free_port()?;
        let webhook_port = free_port()?;
        let mut cmd = Command::new(bin.join("capi-manager"));
        cmd.args([
            format!("--kubeconfig={}", self.kubeconfig().display()),
            "--leader-elect=false".into(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", certs.display()),
            format!("--health-addr=127.0.0.1:{health}"),
            format!("--diagnostics-address=127.0.0.1:{}", free_port()?),
            "--insecure-diagnostics".into(),
            // Fresh CRDs hold nothing to migrate; skipping saves startup time.
            "--skip-crd-migration-phases=StorageVersionMigration,CleanupManagedFields".into(),
            // A test bed has one cluster and few machines; the default 10 min resync hides
            // missed events instead of showing them.
            "--sync-period=1m".into(),
        ]);
        let mut manager = ChildGuard::spawn("capi-manager", cmd, &dir.join("capi-manager.log"))?;
        let ready = wait_until("the Cluster API controller manager", READY, || {
            manager.check_alive().is_ok() && http_ok(health, "/readyz")
        });
        if ready.is_err() {
            manager.check_alive()?;
            return Err(BedError::NotReady {
                what: "capi-manager".into(),
                seconds: READY.as_secs(),
                log: manager.log_path().to_path_buf(),
                tail: manager.last_lines(20),
            });
        }

        // readyz covers the webhook server, but only a connection proves this port is its (the
        // port was free when picked; another test bed on the machine could have taken it since).
        wait_until("the Cluster API webhook server", READY, || {
            std::net::TcpStream::connect(("127.0.0.1", webhook_port)).is_ok()
        })
        .map_err(|_| BedError::NotReady {
            what: format!("capi-manager's webhook server on port {webhook_port}"),
            seconds: READY.as_secs(),
            log: manager.log_path().to_path_buf(),
            tail: manager.last_lines(20),
        })?;
        register_webhooks(&kube, &bin.join("webhooks.yaml"), &certs, webhook_port)?;

        let provider_kube = kube.clone();
        let mut provider = Provider::default();
        let provider_loop = Loop::spawn(
            "gpuops-test-provider",
            options.provider_interval,
            &dir.join("provider.log"),
            move || provider.tick(&provider_kube),
        )?;

        let capi = ClusterApi {
            _provider: provider_loop,
            manager,
            kube,
            namespace: options.namespace.clone(),
            cluster_name: options.cluster_name.clone(),
            dir,
            pools: Mutex::new(BTreeMap::new()),
        };
        capi.create_cluster(self)?;
        Ok(capi)
    }
}

impl ClusterApi {
    fn create_cluster(&self, cluster: &Cluster) -> Result<(), BedError> {
        let (ns, name) = (&self.namespace, &self.cluster_name);
        let port: u16 = cluster
            .server()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(443);
        let kubeconfig = std::fs::read_to_string(cluster.kubeconfig())
            .map_err(|e| BedError::io("reading the admin kubeconfig", e))?;
        // Management cluster == workload cluster: CAPI reaches "the workload cluster" through
        // this Secret, which points at the test bed's own apiserver.
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{name}-kubeconfig"), "namespace": ns,
                    "labels": {"cluster.x-k8s.io/cluster-name": name}},
                "type": "cluster.x-k8s.io/secret",
                "stringData": {"value": kubeconfig}}),
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "GpuopsTestCluster",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": port}}}),
            json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1alpha1", "kind": "GpuopsTestControlPlane",
                "metadata": {"name": name, "namespace": ns},
                "spec": {}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "controlPlaneEndpoint": {"host": "127.0.0.1", "port": port},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "GpuopsTestCluster", "name": name},
                "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io",
                    "kind": "GpuopsTestControlPlane", "name": name},
            }}),
        ];
        self.apply_all(&objects)?;
        // Machines get their nodeRef only once the Cluster is initialized (CAPI watches the
        // workload cluster's nodes from then on).
        let what = format!("Cluster {ns}/{name} to be provisioned and initialized");
        let result = wait_until(&what, READY, || {
            self.kube
                .get_json(&["clusters.cluster.x-k8s.io", name, "-n", ns])
                .is_ok_and(|c| {
                    let init = &c["status"]["initialization"];
                    init["infrastructureProvisioned"] == json!(true)
                        && init["controlPlaneInitialized"] == json!(true)
                        && c["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c["type"] == "ControlPlaneInitialized" && c["status"] == "True"
                            })
                        })
                })
        });
        result.map_err(|e| self.with_log(e))
    }

    /// Applies `objects`; a webhook call that fails to connect (the manager's server still
    /// coming up) is retried for up to 30 s, any other error returned at once.
    fn apply_all(&self, objects: &[Value]) -> Result<(), BedError> {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.kube.apply(&list) {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.to_string().contains("failed calling webhook")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn with_log(&self, e: BedError) -> BedError {
        match e {
            BedError::Timeout { what, seconds } => BedError::NotReady {
                what,
                seconds,
                log: self.manager.log_path().to_path_buf(),
                tail: self.manager.last_lines(20),
            },
            other => other,
        }
    }

    /// The namespace of the Cluster and its pools.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Cluster's name.
    pub fn cluster_name(&self) -> &str {
        &self.cluster_name
    }

    /// The controller manager's and provider's logs are here.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// An error if the controller manager died.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        self.manager.check_alive()
    }

    /// Creates the pool's GpuopsTestMachineTemplate and MachineDeployment, annotated as Cluster
    /// Autoscaler's clusterapi provider expects (min/max size, scale-from-zero capacity).
    pub fn add_pool(&self, pool: &PoolSpec) -> Result<(), BedError> {
        let (ns, cluster) = (&self.namespace, &self.cluster_name);
        let mut annotations = pool_annotations(pool);
        annotations.extend(pool.annotations.clone());
        let labels = json!({
            "cluster.x-k8s.io/cluster-name": cluster,
            "cluster.x-k8s.io/deployment-name": pool.name,
        });
        let objects = vec![
            json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "GpuopsTestMachineTemplate",
                "metadata": {"name": pool.name, "namespace": ns},
                "spec": {"template": {"spec": pool.node.to_spec()}}}),
            json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": pool.name, "namespace": ns, "annotations": annotations,
                "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {
                "clusterName": cluster,
                "replicas": pool.replicas,
                "selector": {"matchLabels": labels},
                "rollout": {"strategy": {"type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "clusterName": cluster,
                        // No bootstrap provider: the data secret is named directly.
                        "bootstrap": {"dataSecretName": format!("{cluster}-bootstrap")},
                        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "GpuopsTestMachineTemplate", "name": pool.name},
                    }
                }
            }}),
        ];
        self.apply_all(&objects)?;
        if let Ok(mut map) = self.pools.lock() {
            map.insert(pool.name.clone(), pool.node.clone());
        }
        Ok(())
    }

    /// Sets a pool's replicas through the MachineDeployment's scale subresource, as an autoscaler
    /// does.
    pub fn scale(&self, pool: &str, replicas: u32) -> Result<(), BedError> {
        let patch = json!({"spec": {"replicas": replicas}}).to_string();
        self.kube
            .run(
                &[
                    "patch",
                    "machinedeployments.cluster.x-k8s.io",
                    pool,
                    "-n",
                    &self.namespace,
                    "--subresource=scale",
                    "--type=merge",
                    "-p",
                    &patch,
                ],
                None,
            )
            .map(|_| ())
    }

    /// The pool's MachineDeployment as JSON.
    pub fn machine_deployment(&self, pool: &str) -> Result<Value, BedError> {
        self.kube.get_json(&[
            "machinedeployments.cluster.x-k8s.io",
            pool,
            "-n",
            &self.namespace,
        ])
    }

    /// The pool's Machines, by name.
    pub fn machines(&self, pool: &str) -> Result<Vec<MachineInfo>, BedError> {
        let list = self.kube.get_json(&[
            "machines.cluster.x-k8s.io",
            "-n",
            &self.namespace,
            "-l",
            &format!("cluster.x-k8s.io/deployment-name={pool}"),
        ])?;
        let mut out: Vec<MachineInfo> = list["items"]
            .as_array()
            .map(|items| items.iter().filter_map(machine_info).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Waits until the pool has exactly `count` Machines, each with a nodeRef, and returns them.
    pub fn wait_machines(
        &self,
        pool: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<MachineInfo>, BedError> {
        let mut last = Vec::new();
        let what = format!("pool {pool} to have {count} Machines with a Node");
        wait_until(&what, timeout, || {
            if let Ok(m) = self.machines(pool) {
                last = m;
            }
            last.len() == count && last.iter().all(|m| m.node.is_some())
        })
        .map_err(|e| match e {
            BedError::Timeout { what, seconds } => BedError::Timeout {
                what: format!("{what} (last seen: {last:?})"),
                seconds,
            },
            other => other,
        })?;
        Ok(last)
    }

    /// Waits until `count` of the pool's Machines have a Node offering every device of the
    /// pool's shape, without the startup taint (usable capacity), and returns those nodes.
    pub fn wait_usable_nodes(
        &self,
        pool: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<String>, BedError> {
        let devices = self
            .pools
            .lock()
            .ok()
            .and_then(|m| m.get(pool).map(|s| s.devices.clone()))
            .ok_or_else(|| BedError::Kubectl {
                args: format!("wait_usable_nodes {pool}"),
                message: format!("no pool {pool} was added through add_pool"),
            })?;
        let mut usable = Vec::new();
        wait_until(
            &format!("{count} usable nodes in pool {pool}"),
            timeout,
            || {
                usable.clear();
                for m in self.machines(pool).unwrap_or_default() {
                    let Some(name) = m.node else { continue };
                    let Ok(node) = self.kube.get_json(&["node", &name]) else {
                        continue;
                    };
                    let offered = devices
                        .iter()
                        .all(|(k, v)| node["status"]["allocatable"][k].as_str() == Some(v));
                    let tainted = node["spec"]["taints"].as_array().is_some_and(|ts| {
                        ts.iter().any(|t| t["key"] == crate::infra::STARTUP_TAINT)
                    });
                    if offered && !tainted {
                        usable.push(name);
                    }
                }
                usable.len() >= count
            },
        )?;
        Ok(usable)
    }

    /// Annotates a Machine with `cluster.x-k8s.io/delete-machine`, so the next scale-down of
    /// its MachineSet removes it first.
    pub fn mark_for_deletion(&self, machine: &str) -> Result<(), BedError> {
        self.kube
            .run(
                &[
                    "annotate",
                    "machines.cluster.x-k8s.io",
                    machine,
                    "-n",
                    &self.namespace,
                    &format!("{DELETE_MACHINE}=true"),
                    "--overwrite",
                ],
                None,
            )
            .map(|_| ())
    }
}

/// The pools' Machines are the instances (gpuops's controller scales them; the lead wires it into
/// scripts/bench-autoscale).
impl Autoscaler for ClusterApi {
    fn name(&self) -> String {
        "gpuops (Cluster API)".into()
    }

    fn instances(&self) -> Result<Vec<Instance>, BedError> {
        let list = self.kube.get_json(&[
            "machines.cluster.x-k8s.io",
            "-n",
            &self.namespace,
            "-l",
            &format!("cluster.x-k8s.io/cluster-name={}", self.cluster_name),
        ])?;
        let pools = self.pools.lock().map(|m| m.clone()).unwrap_or_default();
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let pool = m["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"].as_str()?;
                Some(Instance {
                    name: m["metadata"]["name"].as_str()?.to_string(),
                    // Physical GPUs: a MIG or time-sliced node advertises more devices.
                    gpus: pools
                        .get(pool)
                        .and_then(|s| {
                            s.labels
                                .get("nvidia.com/gpu.count")
                                .or_else(|| s.devices.get(GPU))
                        })
                        .and_then(|g| g.parse().ok())
                        .unwrap_or(0),
                    created: m["metadata"]["creationTimestamp"]
                        .as_str()
                        .map(str::to_string),
                    node: m["status"]["nodeRef"]["name"].as_str().map(str::to_string),
                })
            })
            .collect())
    }
}

fn machine_info(m: &Value) -> Option<MachineInfo> {
    Some(MachineInfo {
        name: m["metadata"]["name"].as_str()?.to_string(),
        phase: m["status"]["phase"].as_str().unwrap_or("").to_string(),
        provider_id: m["spec"]["providerID"].as_str().map(str::to_string),
        node: m["status"]["nodeRef"]["name"].as_str().map(str::to_string),
    })
}

/// Cluster Autoscaler's clusterapi annotations for a pool: size bounds and the capacity of a
/// node for scale-from-zero (one GPU resource per group, as CA's provider allows).
fn pool_annotations(pool: &PoolSpec) -> BTreeMap<String, String> {
    const CAPACITY: &str = "capacity.cluster-autoscaler.kubernetes.io";
    let mut a = BTreeMap::new();
    a.insert(
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size".to_string(),
        pool.min.to_string(),
    );
    a.insert(
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size".to_string(),
        pool.max.to_string(),
    );
    for (resource, key) in [("cpu", "cpu"), ("memory", "memory"), ("pods", "maxPods")] {
        if let Some(v) = pool.node.resources.get(resource) {
            a.insert(format!("{CAPACITY}/{key}"), v.clone());
        }
    }
    if let Some((resource, count)) = pool.node.devices.iter().next() {
        a.insert(format!("{CAPACITY}/gpu-type"), resource.clone());
        a.insert(format!("{CAPACITY}/gpu-count"), count.clone());
    }
    if !pool.node.labels.is_empty() {
        let labels: Vec<String> = pool
            .node
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        a.insert(format!("{CAPACITY}/labels"), labels.join(","));
    }
    // No taints annotation for the startup taint: it is gone once the node is usable, so a
    // simulation that applied it would think no pod fits.
    a
}

fn capi_bin() -> Result<PathBuf, BedError> {
    let dir = std::env::var_os(CAPI_BIN_ENV)
        .map(PathBuf::from)
        .ok_or(BedError::NoAddon {
            var: CAPI_BIN_ENV,
            part: "capi",
        })?;
    for name in ["capi-manager", "crds", "webhooks.yaml"] {
        if !dir.join(name).exists() {
            return Err(BedError::MissingBinary {
                name: name.to_string(),
                dir,
            });
        }
    }
    Ok(dir)
}

/// Installs the manager's webhook configurations (from the module's config/webhook) with each
/// service reference replaced by the manager's loopback URL and our certificate as CA.
fn register_webhooks(
    kube: &Kubectl,
    manifests: &Path,
    certs: &Path,
    port: u16,
) -> Result<(), BedError> {
    let text = kube.run(
        &[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            &manifests.display().to_string(),
        ],
        None,
    )?;
    // One JSON document per configuration, concatenated.
    let items: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .map_err(|e| BedError::Kubectl {
            args: format!("create --dry-run=client -f {}", manifests.display()),
            message: format!("not JSON: {e}"),
        })?;
    let ca = base64(
        &std::fs::read(certs.join("tls.crt"))
            .map_err(|e| BedError::io("reading the webhook certificate", e))?,
    );
    let mut out = Vec::new();
    for mut config in items {
        if let Some(Value::Array(hooks)) = config.get_mut("webhooks") {
            for hook in hooks {
                let path = hook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_string();
                hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{port}{path}"),
                    "caBundle": ca});
            }
        }
        out.push(config);
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "items": out});
    kube.apply(&list.to_string()).map(|_| ())
}

/// Standard base64 with padding (for a caBundle).
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(A[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A self-signed serving certificate for 127.0.0.1 (`tls.crt`, `tls.key`), made by openssl.
pub(crate) fn self_signed_cert(dir: &Path) -> Result<(), BedError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| BedError::io(format!("creating {}", dir.display()), e))?;
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()
        .map_err(|source| BedError::Spawn {
            what: "openssl (needed for the webhook certificate; apt-get install openssl)".into(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BedError::io(
            "generating a self-signed certificate",
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).into_owned()),
        ))
    }
}

/// GET http://127.0.0.1:PORT/PATH answered 200.
pub(crate) fn http_ok(port: u16, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 32];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pool_annotations_are_what_cluster_autoscalers_clusterapi_provider_reads() {
        let mut pool = PoolSpec::new("h100", NodeShape::gpu("H100", "nvidia.com/gpu", 8));
        pool.max = 4;
        let a = pool_annotations(&pool);
        assert_eq!(
            a["cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"],
            "0"
        );
        assert_eq!(
            a["cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"],
            "4"
        );
        assert_eq!(
            a["capacity.cluster-autoscaler.kubernetes.io/gpu-type"],
            "nvidia.com/gpu"
        );
        assert_eq!(
            a["capacity.cluster-autoscaler.kubernetes.io/gpu-count"],
            "8"
        );
        assert_eq!(a["capacity.cluster-autoscaler.kubernetes.io/cpu"], "64");
        assert_eq!(
            a["capacity.cluster-autoscaler.kubernetes.io/maxPods"],
            "110"
        );
        assert_eq!(
            a["capacity.cluster-autoscaler.kubernetes.io/labels"],
            "nvidia.com/gpu.count=8,nvidia.com/gpu.product=H100"
        );
        assert!(!a.contains_key("capacity.cluster-autoscaler.kubernetes.io/taints"));
    }

    #[test]
    fn base64_matches_the_rfc_4648_vectors() {
        for (raw, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), want);
        }
    }

    #[test]
    fn a_missing_build_says_how_to_build_it() {
        // SAFETY of the test: only this test touches the variable.
        if std::env::var_os(CAPI_BIN_ENV).is_none() {
            let err = capi_bin().unwrap_err().to_string();
            assert!(err.contains("tests/k8s/build.sh capi"), "{err}");
        }
    }
}
