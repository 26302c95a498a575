//! The agent as DRA driver `gpu.nvidia.com`: the node's ResourceSlices kept equal to its devices
//! (gpuops-dra's model of every new node state, published by gpuops-kube's `SlicePublisher`), and
//! the claim preparer the kubelet plugin (gpuops-draplugin) calls: read the allocated claim,
//! write a CDI spec per claim from the agent's own CDI builder, checkpoint, answer the CDI ids.
//!
//! The pure half (which devices a claim holds here, the claim's spec and ids) is separate from
//! the I/O so it is tested alone.

use crate::error::AgentError;
use crate::state::NodeState;
use gpuops_dra::checkpoint::{self, Checkpoint, ClaimState, PreparedClaim};
use gpuops_draplugin::{
    CheckpointStore, Claim, ClaimPreparer, PrepareAnswers, PreparedDevice, UnprepareAnswers,
};
use gpuops_inventory::Inventory;
use gpuops_resources::HostDevices;
use gpuops_resources::cdi::{self, CdiDevice, CdiSpec, DriverFiles, SpecOptions};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The CDI kind of the claim specs, as NVIDIA's DRA driver names them.
pub const CLAIM_CDI_KIND: &str = "k8s.gpu.nvidia.com/claim";

/// How the agent serves DRA.
#[derive(Debug, Clone)]
pub struct DraConfig {
    /// Sockets and the checkpoint's directory.
    pub plugin: gpuops_draplugin::PluginConfig,
    /// Where the per-claim CDI specs go (a directory the runtime reads).
    pub cdi_dir: PathBuf,
    /// Where the driver root is visible to the agent, to find the driver's files.
    pub probe_root: PathBuf,
    /// Host roots and hook of the claim specs (the kind is [`CLAIM_CDI_KIND`]).
    pub spec_options: SpecOptions,
    /// What is published (dynamic MIG, device taints), from the cluster's feature gates.
    pub options: gpuops_dra::Options,
    /// How often the slices are re-checked even when the node did not change.
    pub resync: Duration,
}

/// The flags' combinations DRA refuses: the device plugin on the same GPUs, and no API server
/// to read claims from and write slices to.
pub fn check_flags(dra: bool, device_plugin: bool, kubernetes: bool) -> Result<(), AgentError> {
    match (dra, device_plugin, kubernetes) {
        (true, true, _) => Err(AgentError::DraWithDevicePlugin),
        (true, false, false) => Err(AgentError::DraNeedsKubernetes),
        _ => Ok(()),
    }
}

/// A device of the claim on this node, as allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    pub request: String,
    pub device: String,
    pub share_id: Option<String>,
}

/// The file of a claim's CDI spec in `dir` (`<vendor>-<class>_<uid>.json`, unique per claim).
pub fn claim_spec_path(dir: &Path, uid: &str) -> PathBuf {
    dir.join(format!("k8s.gpu.nvidia.com-claim_{uid}.json"))
}

/// The CDI device id of `device` for claim `uid`.
pub fn claim_cdi_id(uid: &str, device: &str) -> String {
    format!("{CLAIM_CDI_KIND}={uid}-{device}")
}

fn claim_error(claim: &Claim, message: impl Into<String>) -> AgentError {
    AgentError::DraClaim {
        claim: claim.to_string(),
        message: message.into(),
    }
}

/// The devices of `driver` in pool `node` allocated to `rc`, after checking it is the claim the
/// kubelet named (a claim deleted and made again under the same name has another uid).
pub fn allocated_here(
    rc: &ResourceClaim,
    claim: &Claim,
    driver: &str,
    node: &str,
) -> Result<Vec<Allocated>, AgentError> {
    let uid = rc.metadata.uid.as_deref().unwrap_or_default();
    if uid != claim.uid {
        return Err(claim_error(
            claim,
            format!(
                "the API server has uid {uid:?} for this claim, not the one the kubelet asked to prepare"
            ),
        ));
    }
    let results = rc
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .ok_or_else(|| claim_error(claim, "it is not allocated (no status.allocation.devices)"))?;
    let here: Vec<Allocated> = results
        .iter()
        .filter(|r| r.driver == driver && r.pool == node)
        .map(|r| Allocated {
            request: r.request.clone(),
            device: r.device.clone(),
            share_id: r.share_id.clone(),
        })
        .collect();
    if here.is_empty() {
        return Err(claim_error(
            claim,
            format!("no device of driver {driver} in pool {node} is allocated to it"),
        ));
    }
    Ok(here)
}

/// Every opaque config of `driver` in the claim's allocation, parsed: a bad one fails the claim
/// with the field it names. (Sharing settings are checked here; applying them is future work.)
pub fn opaque_configs(
    rc: &ResourceClaim,
    claim: &Claim,
    driver: &str,
) -> Result<Vec<gpuops_dra::config::OpaqueConfig>, AgentError> {
    let configs = rc
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    configs
        .into_iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref())
        .filter(|o| o.driver == driver)
        .map(|o| {
            gpuops_dra::config::parse_opaque_value(&o.parameters.0)
                .map_err(|e| claim_error(claim, e.to_string()))
        })
        .collect()
}

/// The claim's spec: the node spec's devices for `devices` (published name, the UUID the node
/// spec names it by), renamed `<uid>-<name>`, with the node spec's shared edits (control nodes,
/// driver files). A device the node spec lacks is an error naming it.
pub fn claim_spec(
    node_spec: &CdiSpec,
    uid: &str,
    devices: &[(String, String)],
) -> Result<CdiSpec, AgentError> {
    let mut out = node_spec.clone();
    out.kind = CLAIM_CDI_KIND.to_string();
    out.devices = devices
        .iter()
        .map(|(name, uuid)| {
            node_spec
                .devices
                .iter()
                .find(|d| &d.name == uuid)
                .map(|d| CdiDevice {
                    name: format!("{uid}-{name}"),
                    container_edits: d.container_edits.clone(),
                })
                .ok_or_else(|| AgentError::DraDeviceGone {
                    name: name.clone(),
                    uuid: uuid.clone(),
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(out)
}

/// The published device names of the claim mapped to the UUIDs the CDI spec names them by.
fn device_uuids(
    inv: &Inventory,
    opts: &gpuops_dra::Options,
    claim: &Claim,
    allocated: &[Allocated],
) -> Result<Vec<(String, String)>, AgentError> {
    let model = gpuops_dra::build(inv, &gpuops_dra::NodeFacts::default(), opts);
    allocated
        .iter()
        .map(|a| {
            let d = model.device(&a.device).ok_or_else(|| {
                claim_error(
                    claim,
                    format!("device {} is not on this node now", a.device),
                )
            })?;
            let uuid = match &d.mig {
                Some(m) => m.uuid.clone().ok_or_else(|| {
                    claim_error(
                        claim,
                        format!(
                            "device {} is a MIG placement that does not exist yet (dynamic MIG is not implemented)",
                            a.device
                        ),
                    )
                })?,
                None => d.gpu_uuid.clone(),
            };
            Ok((a.device.clone(), uuid))
        })
        .collect()
}

/// What the preparer works from.
pub struct Preparer {
    client: gpuops_kube::kube::Client,
    node: String,
    cfg: DraConfig,
    state: watch::Receiver<Arc<NodeState>>,
    host: Arc<HostDevices>,
    driver_files: DriverFiles,
    store: CheckpointStore<Checkpoint, gpuops_dra::DraError>,
    /// One checkpoint read-modify-write at a time (claims are prepared side by side).
    lock: tokio::sync::Mutex<()>,
    timeout: Duration,
}

impl Preparer {
    /// Probes the driver's files once; a checkpoint that cannot be read fails the start, naming
    /// the file (never a crash loop: the error says what to do with it).
    pub fn new(
        client: gpuops_kube::kube::Client,
        node: &str,
        cfg: DraConfig,
        state: watch::Receiver<Arc<NodeState>>,
        host: Arc<HostDevices>,
        timeout: Duration,
    ) -> Result<Preparer, AgentError> {
        let version = state.borrow().inventory.driver_version.clone();
        let driver_files = crate::cdi::probe_driver(&cfg.probe_root, &version)?;
        let store = CheckpointStore::new(
            &cfg.plugin.checkpoint_path(),
            checkpoint::parse,
            checkpoint::to_json,
        );
        match store.load() {
            Ok(_) => {}
            // A file written by a newer format that this agent must not misread: refuse, so
            // the newer agent finds it again after a rollback of the rollback.
            Err(gpuops_draplugin::DraPluginError::CheckpointCorrupt { source, .. })
                if matches!(
                    source.downcast_ref::<gpuops_dra::DraError>(),
                    Some(gpuops_dra::DraError::CheckpointTooNew { .. })
                ) =>
            {
                return Err(AgentError::DraPlugin(
                    gpuops_draplugin::DraPluginError::CheckpointCorrupt {
                        path: store.path().to_path_buf(),
                        source,
                    },
                ));
            }
            // Unreadable: kept beside for a human, and the agent starts without it rather than
            // crash-looping (NVIDIA's issue 1080). Claims it held are prepared again on request.
            Err(gpuops_draplugin::DraPluginError::CheckpointCorrupt { source, .. }) => {
                let kept = store
                    .set_aside(&crate::now_ms().to_string())
                    .map_err(AgentError::DraPlugin)?;
                tracing::error!(
                    kept = %kept.display(),
                    "DRA: the claim checkpoint {} cannot be read ({source}); kept as {} and starting with none",
                    store.path().display(),
                    kept.display()
                );
            }
            Err(e) => return Err(AgentError::DraPlugin(e)),
        }
        Ok(Preparer {
            client,
            node: node.to_string(),
            cfg,
            state,
            host,
            driver_files,
            store,
            lock: tokio::sync::Mutex::new(()),
            timeout,
        })
    }

    async fn update(&self, f: impl FnOnce(&mut Checkpoint)) -> Result<(), AgentError> {
        let _guard = self.lock.lock().await;
        let mut cp = self
            .store
            .load()
            .map_err(AgentError::DraPlugin)?
            .unwrap_or_default();
        f(&mut cp);
        self.store.save(&cp).map_err(AgentError::DraPlugin)
    }

    async fn prepare_one(&self, claim: &Claim) -> Result<Vec<PreparedDevice>, AgentError> {
        let driver = self.cfg.plugin.driver.clone();
        // Prepared before (an agent restart): the same answer, nothing written again.
        if let Some(done) = self
            .store
            .load()
            .map_err(AgentError::DraPlugin)?
            .and_then(|cp| cp.claims.get(&claim.uid).cloned())
            .filter(|c| c.state == ClaimState::Prepared)
        {
            return Ok(done
                .devices
                .into_iter()
                .map(|d| PreparedDevice {
                    request_names: d.request_names,
                    pool_name: d.pool,
                    device_name: d.device,
                    cdi_device_ids: d.cdi_device_ids,
                    share_id: d.share_id,
                })
                .collect());
        }
        let api: gpuops_kube::kube::Api<ResourceClaim> =
            gpuops_kube::kube::Api::namespaced(self.client.clone(), &claim.namespace);
        let rc = match tokio::time::timeout(self.timeout, api.get(&claim.name)).await {
            Ok(Ok(rc)) => rc,
            Ok(Err(e)) => return Err(claim_error(claim, format!("reading the claim: {e}"))),
            Err(_) => {
                return Err(claim_error(
                    claim,
                    format!("reading the claim: no answer within {:?}", self.timeout),
                ));
            }
        };
        let allocated = allocated_here(&rc, claim, &driver, &self.node)?;
        opaque_configs(&rc, claim, &driver)?;
        let state = self.state.borrow().clone();
        let devices = device_uuids(&state.inventory, &self.cfg.options, claim, &allocated)?;
        let mut options = self.cfg.spec_options.clone();
        options.kind = CLAIM_CDI_KIND.to_string();
        let node_spec = cdi::spec(&state.inventory, &self.host, &self.driver_files, &options)
            .map_err(|e| claim_error(claim, format!("building the CDI spec: {e}")))?;
        let spec = claim_spec(&node_spec, &claim.uid, &devices)
            .map_err(|e| claim_error(claim, e.to_string()))?;
        let prepared: Vec<PreparedDevice> = allocated
            .iter()
            .map(|a| PreparedDevice {
                request_names: vec![a.request.clone()],
                pool_name: self.node.clone(),
                device_name: a.device.clone(),
                cdi_device_ids: vec![claim_cdi_id(&claim.uid, &a.device)],
                share_id: a.share_id.clone(),
            })
            .collect();
        let entry = |state: ClaimState| PreparedClaim {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state,
            devices: prepared
                .iter()
                .map(|d| checkpoint::PreparedDevice {
                    request_names: d.request_names.clone(),
                    pool: d.pool_name.clone(),
                    device: d.device_name.clone(),
                    cdi_device_ids: d.cdi_device_ids.clone(),
                    share_id: d.share_id.clone(),
                    ..checkpoint::PreparedDevice::default()
                })
                .collect(),
            ..PreparedClaim::default()
        };
        // Preparing first: a crash after the spec is written leaves a record of what to remove.
        let uid = claim.uid.clone();
        let preparing = entry(ClaimState::Preparing);
        self.update(|cp| {
            cp.claims.insert(uid.clone(), preparing);
        })
        .await?;
        let text = serde_json::to_string_pretty(&spec).map_err(AgentError::CdiSerialize)?;
        gpuops_atomicfile::write(&claim_spec_path(&self.cfg.cdi_dir, &claim.uid), text + "\n")
            .map_err(AgentError::CdiWrite)?;
        let done = entry(ClaimState::Prepared);
        self.update(|cp| {
            cp.claims.insert(uid, done);
        })
        .await?;
        tracing::info!(claim = %claim, devices = prepared.len(), "prepared claim {claim}");
        Ok(prepared)
    }

    async fn unprepare_one(&self, claim: &Claim) -> Result<(), AgentError> {
        let path = claim_spec_path(&self.cfg.cdi_dir, &claim.uid);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            // Never prepared, or removed before a crash: what unprepare wants.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(claim_error(
                    claim,
                    format!("removing {}: {e}", path.display()),
                ));
            }
        }
        let uid = claim.uid.clone();
        self.update(|cp| {
            cp.claims.remove(&uid);
        })
        .await?;
        tracing::info!(claim = %claim, "unprepared claim {claim}");
        Ok(())
    }
}

impl ClaimPreparer for Preparer {
    type Error = AgentError;

    async fn prepare(&self, claims: Vec<Claim>) -> PrepareAnswers<AgentError> {
        let mut out = PrepareAnswers::new();
        for c in claims {
            let answer = self.prepare_one(&c).await;
            if let Err(e) = &answer {
                tracing::warn!(claim = %c, error = %e, "prepare failed: {e}");
            }
            out.insert(c.uid.clone(), answer);
        }
        out
    }

    async fn unprepare(&self, claims: Vec<Claim>) -> UnprepareAnswers<AgentError> {
        let mut out = UnprepareAnswers::new();
        for c in claims {
            out.insert(c.uid.clone(), self.unprepare_one(&c).await);
        }
        out
    }
}

/// Health facts for the model: a GPU with a counted XID, or lost, takes its devices out (or
/// taints them, with the device-taints gate).
fn facts(state: &NodeState) -> gpuops_dra::NodeFacts {
    let mut facts = gpuops_dra::NodeFacts::default();
    for (gpu, _, _, xid) in state.health.hits() {
        if let Some(g) = state.inventory.gpus.iter().find(|g| g.index == gpu) {
            facts
                .unhealthy
                .insert(g.uuid.clone(), gpuops_dra::Unhealthy::Xid { xid });
        }
    }
    facts
}

/// The slices this state publishes; none while NVML is not loaded or there are no GPUs.
pub fn desired_slices(
    node: &str,
    state: &NodeState,
    opts: &gpuops_dra::Options,
) -> Vec<k8s_openapi::api::resource::v1::ResourceSliceSpec> {
    if !state.nvml_loaded || state.inventory.gpus.is_empty() {
        return Vec::new();
    }
    gpuops_dra::publish(node, 0, &state.inventory, &facts(state), opts).0
}

/// Keeps the node's slices equal to its devices: after every new node state (a MIG change, a
/// health change), every `resync`, and with backoff after a failed pass, until `stop`.
pub async fn publish_slices(
    publisher: gpuops_kube::SlicePublisher,
    node: String,
    opts: gpuops_dra::Options,
    resync: Duration,
    mut state_rx: watch::Receiver<Arc<NodeState>>,
    mut stop: watch::Receiver<bool>,
) {
    let policy = gpuops_backoff::Policy::new(Duration::from_secs(1), Duration::from_secs(30));
    let mut backoff = policy.start();
    let mut said_no_nvml = false;
    loop {
        let state = state_rx.borrow_and_update().clone();
        let desired = desired_slices(&node, &state, &opts);
        if desired.is_empty() && !said_no_nvml {
            tracing::warn!(
                nvml_loaded = state.nvml_loaded,
                "DRA: no GPU can be read on this node (NVML {}), so it publishes no ResourceSlice",
                if state.nvml_loaded {
                    "loaded, no GPUs"
                } else {
                    "not loaded"
                }
            );
        }
        said_no_nvml = desired.is_empty();
        let wait = match publisher.publish(&desired, None).await {
            Ok(_) => {
                backoff.reset();
                resync
            }
            Err(e) => {
                let wait = backoff.failed();
                tracing::warn!(error = %e, retry_in = ?wait, "DRA: publishing the ResourceSlices failed: {e}");
                wait
            }
        };
        tokio::select! {
            _ = stop.changed() => return,
            changed = state_rx.changed() => if changed.is_err() { return },
            () = tokio::time::sleep(wait) => {}
        }
        if *stop.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use gpuops_resources::cdi::ContainerEdits;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
        DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

    fn claim() -> Claim {
        Claim {
            namespace: "ns".into(),
            uid: "uid-1".into(),
            name: "c".into(),
        }
    }

    fn result(driver: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
        DeviceRequestAllocationResult {
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            request: "gpu".into(),
            ..DeviceRequestAllocationResult::default()
        }
    }

    fn allocated_claim(
        uid: &str,
        results: Vec<DeviceRequestAllocationResult>,
        config: Option<serde_json::Value>,
    ) -> ResourceClaim {
        let mut rc = ResourceClaim::default();
        rc.metadata.uid = Some(uid.into());
        rc.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: config.map(|p| {
                        vec![DeviceAllocationConfiguration {
                            source: "FromClaim".into(),
                            requests: None,
                            opaque: Some(OpaqueDeviceConfiguration {
                                driver: "gpu.nvidia.com".into(),
                                parameters: RawExtension(p),
                            }),
                        }]
                    }),
                }),
                ..AllocationResult::default()
            }),
            ..ResourceClaimStatus::default()
        });
        rc
    }

    #[test]
    fn only_this_drivers_devices_in_this_nodes_pool_are_prepared() {
        let rc = allocated_claim(
            "uid-1",
            vec![
                result("gpu.nvidia.com", "n1", "gpu-0"),
                result("gpu.nvidia.com", "n2", "gpu-1"),
                result("other.example.com", "n1", "nic-0"),
            ],
            None,
        );
        let here = allocated_here(&rc, &claim(), "gpu.nvidia.com", "n1").unwrap();
        assert_eq!(
            here,
            [Allocated {
                request: "gpu".into(),
                device: "gpu-0".into(),
                share_id: None
            }]
        );
    }

    #[test]
    fn a_claim_of_another_uid_or_not_allocated_here_is_an_error_that_says_so() {
        let rc = allocated_claim("uid-2", vec![result("gpu.nvidia.com", "n1", "gpu-0")], None);
        let e = allocated_here(&rc, &claim(), "gpu.nvidia.com", "n1").unwrap_err();
        assert!(
            e.to_string().contains("not the one the kubelet asked"),
            "{e}"
        );
        let rc = allocated_claim("uid-1", vec![result("gpu.nvidia.com", "n2", "gpu-0")], None);
        let e = allocated_here(&rc, &claim(), "gpu.nvidia.com", "n1").unwrap_err();
        assert!(
            e.to_string()
                .contains("no device of driver gpu.nvidia.com in pool n1"),
            "{e}"
        );
        let mut rc = ResourceClaim::default();
        rc.metadata.uid = Some("uid-1".into());
        let e = allocated_here(&rc, &claim(), "gpu.nvidia.com", "n1").unwrap_err();
        assert!(e.to_string().contains("not allocated"), "{e}");
        assert!(e.to_string().starts_with("claim ns/c (uid-1)"), "{e}");
    }

    #[test]
    fn a_bad_opaque_config_fails_the_claim_naming_the_field() {
        let good = serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
        });
        let rc = allocated_claim("uid-1", vec![], Some(good));
        assert_eq!(
            opaque_configs(&rc, &claim(), "gpu.nvidia.com")
                .unwrap()
                .len(),
            1
        );
        let bad = serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}},
        });
        let rc = allocated_claim("uid-1", vec![], Some(bad));
        let e = opaque_configs(&rc, &claim(), "gpu.nvidia.com").unwrap_err();
        assert!(e.to_string().contains("interval"), "{e}");
    }

    fn device(name: &str, node: &str) -> CdiDevice {
        CdiDevice {
            name: name.into(),
            container_edits: ContainerEdits {
                device_nodes: vec![cdi::DeviceNode {
                    path: node.into(),
                    host_path: None,
                    permissions: None,
                }],
                ..ContainerEdits::default()
            },
        }
    }

    #[test]
    fn the_claim_spec_has_only_the_claims_devices_under_nvidias_kind_and_ids() {
        let node_spec = CdiSpec {
            cdi_version: "0.6.0".into(),
            kind: "k8s.device-plugin.nvidia.com/gpu".into(),
            devices: vec![
                device("GPU-a", "/dev/nvidia0"),
                device("0", "/dev/nvidia0"),
                device("GPU-b", "/dev/nvidia1"),
                device("all", "/dev/nvidia0"),
            ],
            container_edits: ContainerEdits {
                env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
                ..ContainerEdits::default()
            },
        };
        let spec = claim_spec(&node_spec, "uid-1", &[("gpu-1".into(), "GPU-b".into())]).unwrap();
        assert_eq!(spec.kind, CLAIM_CDI_KIND);
        assert_eq!(spec.devices.len(), 1);
        assert_eq!(spec.devices[0].name, "uid-1-gpu-1");
        assert_eq!(
            spec.devices[0].container_edits.device_nodes[0].path,
            "/dev/nvidia1"
        );
        assert_eq!(spec.container_edits, node_spec.container_edits);
        assert_eq!(
            claim_cdi_id("uid-1", "gpu-1"),
            "k8s.gpu.nvidia.com/claim=uid-1-gpu-1"
        );
        assert_eq!(
            claim_spec_path(Path::new("/var/run/cdi"), "uid-1"),
            Path::new("/var/run/cdi/k8s.gpu.nvidia.com-claim_uid-1.json")
        );
        let e = claim_spec(&node_spec, "uid-1", &[("gpu-7".into(), "GPU-z".into())]).unwrap_err();
        assert!(e.to_string().contains("gpu-7"), "{e}");
    }

    #[test]
    fn dra_is_refused_beside_the_device_plugin_and_without_kubernetes() {
        let e = check_flags(true, true, true).unwrap_err();
        assert!(e.to_string().contains("add --no-device-plugin"), "{e}");
        let e = check_flags(true, false, false).unwrap_err();
        assert!(e.to_string().contains("--kubernetes"), "{e}");
        assert!(check_flags(true, false, true).is_ok());
        assert!(check_flags(false, true, false).is_ok());
    }

    fn empty_state() -> watch::Receiver<Arc<NodeState>> {
        let (_tx, rx) = watch::channel(Arc::new(NodeState {
            inventory: Arc::new(Inventory::default()),
            health: Default::default(),
            xids: Default::default(),
            collection: None,
            nvml_errors: 0,
            nvml_loaded: false,
        }));
        rx
    }

    fn preparer_in(dir: &Path) -> Result<Preparer, AgentError> {
        let client = gpuops_kube::kube::Client::try_from(gpuops_kube::kube::Config::new(
            "http://127.0.0.1:9".parse().unwrap(),
        ))
        .unwrap();
        let cfg = DraConfig {
            plugin: gpuops_draplugin::PluginConfig::new(
                "gpu.nvidia.com",
                &dir.join("registry"),
                &dir.join("plugins"),
            ),
            cdi_dir: dir.join("cdi"),
            probe_root: dir.to_path_buf(),
            spec_options: SpecOptions::default(),
            options: gpuops_dra::Options::default(),
            resync: Duration::from_secs(60),
        };
        Preparer::new(
            client,
            "n1",
            cfg,
            empty_state(),
            Arc::new(HostDevices::default()),
            Duration::from_secs(1),
        )
    }

    #[tokio::test]
    async fn a_corrupt_checkpoint_is_kept_aside_and_a_too_new_one_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let plugin_dir = dir.path().join("plugins/gpu.nvidia.com");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        let file = plugin_dir.join("checkpoint.json");
        std::fs::write(&file, "{not json").unwrap();
        preparer_in(dir.path()).expect("a corrupt checkpoint does not stop the start");
        assert!(!file.exists(), "set aside");
        let kept: Vec<String> = std::fs::read_dir(&plugin_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            kept.iter()
                .any(|n| n.starts_with("checkpoint.json.corrupt-")),
            "{kept:?}"
        );
        std::fs::write(
            &file,
            r#"{"version": 9, "minReaderVersion": 9, "claims": {}}"#,
        )
        .unwrap();
        let e = preparer_in(dir.path())
            .err()
            .expect("a too-new checkpoint is refused");
        assert!(e.to_string().contains("checkpoint.json"), "{e}");
        assert!(file.exists(), "left for the newer agent");
    }

    #[test]
    fn no_nvml_means_no_slices() {
        let state = NodeState {
            inventory: Arc::new(Inventory::default()),
            health: Default::default(),
            xids: Default::default(),
            collection: None,
            nvml_errors: 0,
            nvml_loaded: false,
        };
        assert!(desired_slices("n1", &state, &gpuops_dra::Options::default()).is_empty());
    }
}
