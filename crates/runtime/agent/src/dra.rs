//! The agent as DRA driver `gpu.nvidia.com`: the node's ResourceSlices kept equal to its devices
//! (gpuops-dra's model of every new node state, published by gpuops-kube's `SlicePublisher`), and
//! the claim preparer the kubelet plugin (gpuops-draplugin) calls: read the allocated claim,
//! write a CDI spec per claim from the agent's own CDI builder, checkpoint, answer the CDI ids.
//!
//! The pure half (which devices a claim holds here, the claim's spec and ids) is separate from
//! the I/O so it is tested alone.

use crate::error::AgentError;
use crate::state::NodeState;
use gpuops_dra::checkpoint::{self, Checkpoint, ClaimState, CreatedMig, PreparedClaim};
use gpuops_draplugin::{
    CheckpointStore, Claim, ClaimPreparer, PrepareAnswers, PreparedDevice, UnprepareAnswers,
};
use gpuops_inventory::Inventory;
use gpuops_nvml::Gpus;
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
    /// `nvidia-cuda-mps-control` and the root of the daemons' directories, for claims that
    /// share with MPS; none: such claims fail, saying so.
    pub mps: Option<gpuops_mps::Config>,
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

/// One opaque config of the claim's allocation and the requests it applies to (none: all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    pub requests: Vec<String>,
    pub config: gpuops_dra::config::OpaqueConfig,
}

/// Every opaque config of `driver` in the claim's allocation, parsed, in the allocation's order
/// (the class's first, then the claim's: a later one wins): a bad one fails the claim with the
/// field it names.
pub fn opaque_configs(
    rc: &ResourceClaim,
    claim: &Claim,
    driver: &str,
) -> Result<Vec<Configured>, AgentError> {
    let configs = rc
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_ref());
    configs
        .into_iter()
        .flatten()
        .filter_map(|c| c.opaque.as_ref().map(|o| (c.requests.clone(), o)))
        .filter(|(_, o)| o.driver == driver)
        .map(|(requests, o)| {
            gpuops_dra::config::parse_opaque_value(&o.parameters.0)
                .map(|config| Configured {
                    requests: requests.unwrap_or_default(),
                    config,
                })
                .map_err(|e| claim_error(claim, e.to_string()))
        })
        .collect()
}

/// The MPS control daemon a claim asks for: the last config with MPS sharing that applies to
/// its devices (NVIDIA's order: a claim's config over its class's), over the UUIDs of the
/// devices it applies to. None without MPS sharing.
pub fn mps_spec(
    claim: &Claim,
    configs: &[Configured],
    devices: &[(Allocated, String)],
) -> Result<Option<gpuops_mps::DaemonSpec>, AgentError> {
    use gpuops_dra::config::{GpuSharing, OpaqueConfig};
    let Some((requests, mps)) = configs.iter().rev().find_map(|c| {
        let mps = match &c.config {
            OpaqueConfig::Gpu(g) => match &g.sharing {
                Some(GpuSharing::Mps(m)) => Some(m),
                _ => None,
            },
            OpaqueConfig::MigDevice(m) => m.sharing.as_ref(),
        }?;
        Some((&c.requests, mps))
    }) else {
        return Ok(None);
    };
    let uuids: Vec<String> = devices
        .iter()
        .filter(|(a, _)| requests.is_empty() || requests.contains(&a.request))
        .map(|(_, uuid)| uuid.clone())
        .collect();
    if uuids.is_empty() {
        return Ok(None);
    }
    let pinned_limits = mps
        .pinned_limits(&uuids)
        .map_err(|e| claim_error(claim, format!("opaque config: {e}")))?;
    let spec = gpuops_mps::DaemonSpec {
        name: claim.uid.clone(),
        uuids,
        active_thread_percentage: mps.default_active_thread_percentage,
        pinned_limits,
    };
    spec.validate()
        .map_err(|e| claim_error(claim, e.to_string()))?;
    Ok(Some(spec))
}

/// Adds what a container needs to reach its MPS daemon to every device of the claim's spec
/// (CDI applies a device's edits to the containers that ask for it).
fn with_mps(spec: &mut CdiSpec, edits: &gpuops_mps::ContainerEdits) {
    for d in &mut spec.devices {
        let e = &mut d.container_edits;
        e.env
            .extend(edits.env.iter().map(|(k, v)| format!("{k}={v}")));
        e.mounts.extend(edits.mounts.iter().map(|m| cdi::CdiMount {
            host_path: m.host_path.display().to_string(),
            container_path: m.container_path.display().to_string(),
            options: m.options.clone(),
            mount_type: None,
        }));
    }
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

/// What prepare does for one allocated device before its CDI spec can be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// It exists (a whole GPU, a static MIG device): the node spec names it by this UUID.
    Ready { uuid: String },
    /// Dynamic MIG: create the MIG device at the allocated placement (or adopt the one a prepare
    /// cut short made) on the GPU `parent_uuid`.
    Create {
        parent_uuid: String,
        wanted: gpuops_migexec::dynamic::Wanted,
    },
    /// Dynamic MIG's whole GPU: out of MIG mode first, where it is in it.
    Whole { gpu: u32, uuid: String },
}

/// The step each allocated device needs, from the devices the node publishes now. A device in a
/// counter set is dynamic MIG's: its MIG device is the claim's own, made at prepare.
pub fn steps(
    model: &gpuops_dra::DeviceModel,
    claim: &Claim,
    allocated: &[Allocated],
) -> Result<Vec<Step>, AgentError> {
    allocated
        .iter()
        .map(|a| {
            let d = model.device(&a.device).ok_or_else(|| {
                claim_error(
                    claim,
                    format!("device {} is not on this node now", a.device),
                )
            })?;
            let dynamic = d.consumes.is_some();
            Ok(match (&d.mig, dynamic) {
                (Some(m), true) => Step::Create {
                    parent_uuid: d.gpu_uuid.clone(),
                    wanted: gpuops_migexec::dynamic::Wanted {
                        gpu: d.gpu_index,
                        gi_profile_id: m.gi_profile_id,
                        start: m.placement_start,
                        size: m.placement_size,
                    },
                },
                (Some(m), false) => Step::Ready {
                    uuid: m.uuid.clone().ok_or_else(|| {
                        claim_error(
                            claim,
                            format!("device {} has no MIG device behind it", a.device),
                        )
                    })?,
                },
                (None, true) => Step::Whole {
                    gpu: d.gpu_index,
                    uuid: d.gpu_uuid.clone(),
                },
                (None, false) => Step::Ready {
                    uuid: d.gpu_uuid.clone(),
                },
            })
        })
        .collect()
}

/// The checkpoint's record of a MIG device made for a claim, before (ids 0, no UUID: matched by
/// placement) and after it was made.
fn created_mig(step: &Step, made: Option<&gpuops_migexec::dynamic::Created>) -> Option<CreatedMig> {
    let Step::Create {
        parent_uuid,
        wanted,
    } = step
    else {
        return None;
    };
    Some(CreatedMig {
        parent_uuid: parent_uuid.clone(),
        gi_profile_id: wanted.gi_profile_id,
        placement_start: wanted.start,
        gi_id: made.map_or(0, |m| m.gi_id),
        ci_id: made.map_or(0, |m| m.ci_id),
        uuid: made.map(|m| m.uuid.clone()).unwrap_or_default(),
        ..CreatedMig::default()
    })
}

/// How long one claim's driver calls (MIG creates and destroys) may take before prepare gives up
/// on them; the kubelet retries, and the checkpoint lets the retry adopt what was made.
const MIG_DEADLINE: Duration = Duration::from_secs(60);

/// What the preparer works from.
pub struct Preparer {
    client: gpuops_kube::kube::Client,
    node: String,
    cfg: DraConfig,
    state: watch::Receiver<Arc<NodeState>>,
    /// The opened driver, for dynamic MIG's creates and destroys.
    gpus: watch::Receiver<Option<Arc<Gpus>>>,
    /// MPS control daemons of claims that share with MPS.
    mps: Option<Arc<gpuops_mps::Daemons>>,
    host: Arc<HostDevices>,
    driver_files: DriverFiles,
    store: CheckpointStore<Checkpoint, gpuops_dra::DraError>,
    /// One checkpoint read-modify-write at a time (claims are prepared side by side).
    lock: tokio::sync::Mutex<()>,
    /// One MIG change at a time on the node: a create takes any GPU instance without a compute
    /// instance for a crash's leftover, which a create running beside it would also leave.
    mig_lock: tokio::sync::Mutex<()>,
    timeout: Duration,
}

impl Preparer {
    /// Probes the driver's files once; a checkpoint that cannot be read fails the start, naming
    /// the file (never a crash loop: the error says what to do with it).
    // Each argument is a separate feed the agent owns (client, node, config, two watches, MPS,
    // host devices, a timeout); a struct around them would only be built here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: gpuops_kube::kube::Client,
        node: &str,
        cfg: DraConfig,
        state: watch::Receiver<Arc<NodeState>>,
        gpus: watch::Receiver<Option<Arc<Gpus>>>,
        mps: Option<Arc<gpuops_mps::Daemons>>,
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
            gpus,
            mps,
            host,
            driver_files,
            store,
            lock: tokio::sync::Mutex::new(()),
            mig_lock: tokio::sync::Mutex::new(()),
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
        self.prepare_allocated(claim, &rc).await
    }

    /// The node's half of prepare, for the claim as read from the API server: the devices made
    /// where dynamic MIG needs them, the claim's CDI spec written, the checkpoint kept at every
    /// step. (Public for the prepare benchmark, which has no API server.)
    pub async fn prepare_allocated(
        &self,
        claim: &Claim,
        rc: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, AgentError> {
        let driver = self.cfg.plugin.driver.clone();
        let allocated = allocated_here(rc, claim, &driver, &self.node)?;
        let configs = opaque_configs(rc, claim, &driver)?;
        let state = self.state.borrow().clone();
        let model = gpuops_dra::build(
            &state.inventory,
            &gpuops_dra::NodeFacts::default(),
            &self.cfg.options,
        );
        let steps = steps(&model, claim, &allocated)?;
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
        let entry =
            |state: ClaimState, made: &[Option<gpuops_migexec::dynamic::Created>]| PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                state,
                devices: prepared
                    .iter()
                    .zip(&steps)
                    .enumerate()
                    .map(|(i, (d, step))| checkpoint::PreparedDevice {
                        request_names: d.request_names.clone(),
                        pool: d.pool_name.clone(),
                        device: d.device_name.clone(),
                        cdi_device_ids: d.cdi_device_ids.clone(),
                        share_id: d.share_id.clone(),
                        mig: created_mig(step, made.get(i).and_then(Option::as_ref)),
                        ..checkpoint::PreparedDevice::default()
                    })
                    .collect(),
                ..PreparedClaim::default()
            };
        // Preparing first: a crash after a MIG device or the spec is made leaves a record of
        // what to remove (and of the placement it holds, before its UUID is known).
        let uid = claim.uid.clone();
        let preparing = entry(ClaimState::Preparing, &[]);
        self.update(|cp| {
            cp.claims.insert(uid.clone(), preparing);
        })
        .await?;
        let (made, inventory) = if steps.iter().all(|s| matches!(s, Step::Ready { .. })) {
            (Vec::new(), Arc::clone(&state.inventory))
        } else {
            let (made, inventory) = self.change_mig(claim, &steps).await?;
            let recorded = entry(ClaimState::Preparing, &made);
            self.update(|cp| {
                cp.claims.insert(uid.clone(), recorded);
            })
            .await?;
            (made, Arc::new(inventory))
        };
        let devices: Vec<(String, String)> = allocated
            .iter()
            .zip(&steps)
            .enumerate()
            .map(|(i, (a, step))| {
                let uuid = match (step, made.get(i).and_then(Option::as_ref)) {
                    (Step::Create { .. }, Some(m)) => m.uuid.clone(),
                    (Step::Ready { uuid } | Step::Whole { uuid, .. }, _) => uuid.clone(),
                    // Never the parent GPU in its place: the container would get all of it.
                    (Step::Create { .. }, None) => {
                        return Err(claim_error(
                            claim,
                            format!("no MIG device was made for {}", a.device),
                        ));
                    }
                };
                Ok((a.device.clone(), uuid))
            })
            .collect::<Result<_, AgentError>>()?;
        let mut options = self.cfg.spec_options.clone();
        options.kind = CLAIM_CDI_KIND.to_string();
        let node_spec = cdi::spec(&inventory, &self.host, &self.driver_files, &options)
            .map_err(|e| claim_error(claim, format!("building the CDI spec: {e}")))?;
        let mut spec = claim_spec(&node_spec, &claim.uid, &devices)
            .map_err(|e| claim_error(claim, e.to_string()))?;
        let by_device: Vec<(Allocated, String)> = allocated
            .iter()
            .cloned()
            .zip(devices.iter().map(|(_, uuid)| uuid.clone()))
            .collect();
        if let Some(daemon) = mps_spec(claim, &configs, &by_device)? {
            let Some(mps) = &self.mps else {
                return Err(claim_error(
                    claim,
                    "its config asks for MPS sharing, and this agent runs no MPS control daemon (--mps-control-binary)",
                ));
            };
            let edits = mps
                .ensure(daemon)
                .await
                .map_err(|e| claim_error(claim, format!("starting its MPS control daemon: {e}")))?;
            with_mps(&mut spec, &edits);
        }
        let text = serde_json::to_string_pretty(&spec).map_err(AgentError::CdiSerialize)?;
        gpuops_atomicfile::write(&claim_spec_path(&self.cfg.cdi_dir, &claim.uid), text + "\n")
            .map_err(AgentError::CdiWrite)?;
        let done = entry(ClaimState::Prepared, &made);
        self.update(|cp| {
            cp.claims.insert(uid, done);
        })
        .await?;
        tracing::info!(claim = %claim, devices = prepared.len(), "prepared claim {claim}");
        Ok(prepared)
    }

    fn gpus(&self, claim: &Claim) -> Result<Arc<Gpus>, AgentError> {
        self.gpus.borrow().clone().ok_or_else(|| {
            claim_error(
                claim,
                "NVML is not loaded on this node, so its MIG devices cannot be changed",
            )
        })
    }

    /// Runs `work` on the driver off the async threads, one MIG change at a time on the node,
    /// bounded by [`MIG_DEADLINE`].
    async fn on_driver<T: Send + 'static>(
        &self,
        claim: &Claim,
        work: impl FnOnce(&Gpus) -> Result<T, AgentError> + Send + 'static,
    ) -> Result<T, AgentError> {
        let gpus = self.gpus(claim)?;
        let _one_at_a_time = self.mig_lock.lock().await;
        let task = tokio::task::spawn_blocking(move || work(&gpus));
        match tokio::time::timeout(MIG_DEADLINE, task).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(claim_error(claim, format!("the MIG change stopped: {e}"))),
            Err(_) => Err(claim_error(
                claim,
                format!(
                    "the driver did not finish the MIG change within {MIG_DEADLINE:?}; the next prepare takes up what it made"
                ),
            )),
        }
    }

    /// Dynamic MIG's driver work for a claim: each placement's MIG device made (or adopted),
    /// each whole GPU out of MIG mode; then the node as the driver has it now, for the CDI spec.
    async fn change_mig(
        &self,
        claim: &Claim,
        steps: &[Step],
    ) -> Result<(Vec<Option<gpuops_migexec::dynamic::Created>>, Inventory), AgentError> {
        let steps = steps.to_vec();
        let who = claim.clone();
        self.on_driver(claim, move |gpus| {
            let mut made = Vec::with_capacity(steps.len());
            for step in &steps {
                made.push(match step {
                    Step::Create { wanted, .. } => Some(
                        gpuops_migexec::dynamic::create(gpus, wanted)
                            .map_err(|e| claim_error(&who, e.to_string()))?,
                    ),
                    Step::Whole { gpu, .. } => {
                        gpuops_migexec::dynamic::make_whole(gpus, *gpu)
                            .map_err(|e| claim_error(&who, e.to_string()))?;
                        None
                    }
                    Step::Ready { .. } => None,
                });
            }
            let inventory = gpus.snapshot_with(gpuops_nvml::Scope::Mig).map_err(|e| {
                claim_error(&who, format!("reading the node after the MIG change: {e}"))
            })?;
            Ok((made, inventory))
        })
        .await
    }

    /// Undoes a prepare: the claim's MIG devices, MPS daemon, CDI spec and checkpoint entry; what
    /// is already gone is not an error.
    pub async fn unprepare_one(&self, claim: &Claim) -> Result<(), AgentError> {
        // The claim's own MIG devices only, as the checkpoint records them: never one another
        // claim holds, after a restart too.
        let held: Vec<CreatedMig> = self
            .store
            .load()
            .map_err(AgentError::DraPlugin)?
            .and_then(|cp| cp.claims.get(&claim.uid).cloned())
            .map(|c| c.devices.into_iter().filter_map(|d| d.mig).collect())
            .unwrap_or_default();
        if !held.is_empty() {
            let index_of = self.gpu_indices();
            let who = claim.clone();
            self.on_driver(claim, move |gpus| {
                for m in &held {
                    // A GPU no longer on the node took its MIG devices with it.
                    let Some(&gpu) = index_of.get(&m.parent_uuid) else {
                        continue;
                    };
                    let wanted = gpuops_migexec::dynamic::Wanted {
                        gpu,
                        gi_profile_id: m.gi_profile_id,
                        start: m.placement_start,
                        size: 0,
                    };
                    gpuops_migexec::dynamic::destroy(gpus, &wanted, &m.uuid)
                        .map_err(|e| claim_error(&who, e.to_string()))?;
                }
                Ok(())
            })
            .await?;
        }
        if let Some(mps) = &self.mps {
            // Quits a daemon the claim had, also one an agent restart left running; none is fine.
            mps.release(&claim.uid)
                .await
                .map_err(|e| claim_error(claim, format!("stopping its MPS control daemon: {e}")))?;
        }
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

impl Preparer {
    /// NVML index per GPU UUID, as the agent last read the node.
    fn gpu_indices(&self) -> std::collections::BTreeMap<String, u32> {
        self.state
            .borrow()
            .inventory
            .gpus
            .iter()
            .map(|g| (g.uuid.clone(), g.index))
            .collect()
    }

    /// With dynamic MIG, the node's GPUs are the claims': a MIG device that no claim in the
    /// checkpoint holds (a claim unprepared while the agent was down, a device made by hand) is
    /// destroyed, so its slices go back to the scheduler's counters. Run once, before serving.
    pub async fn destroy_unheld(&self) -> Result<usize, AgentError> {
        if !self.cfg.options.dynamic_mig || self.gpus.borrow().is_none() {
            return Ok(0);
        }
        let cp = self
            .store
            .load()
            .map_err(AgentError::DraPlugin)?
            .unwrap_or_default();
        let who = Claim {
            namespace: String::new(),
            name: "(none: cleaning up at start)".into(),
            uid: String::new(),
        };
        let inside = who.clone();
        let destroyed = self
            .on_driver(&who, move |gpus| {
                let who = inside;
                let inv = gpus
                    .snapshot_with(gpuops_nvml::Scope::Mig)
                    .map_err(|e| claim_error(&who, format!("reading the node: {e}")))?;
                let managed: Vec<String> = inv
                    .gpus
                    .iter()
                    .filter(|g| g.mig.capable)
                    .map(|g| g.uuid.clone())
                    .collect();
                let mut destroyed = Vec::new();
                for (gpu, m) in checkpoint::unheld_instances(&inv, &cp, &managed) {
                    let wanted = gpuops_migexec::dynamic::Wanted {
                        gpu: gpu.index,
                        gi_profile_id: m.gi_profile_id,
                        start: m.placement_start,
                        size: m.placement_size,
                    };
                    gpuops_migexec::dynamic::destroy(gpus, &wanted, &m.uuid)
                        .map_err(|e| claim_error(&who, e.to_string()))?;
                    destroyed.push(m.uuid.clone());
                }
                Ok(destroyed)
            })
            .await?;
        for uuid in &destroyed {
            tracing::info!(%uuid, "DRA: destroyed MIG device {uuid}, which no prepared claim holds");
        }
        Ok(destroyed.len())
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
        let mps = serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {
                "defaultActiveThreadPercentage": 50,
                "defaultPinnedDeviceMemoryLimit": "10Gi",
                "defaultPerDevicePinnedMemoryLimit": {"1": "2Gi"}}},
        });
        let rc = allocated_claim("uid-1", vec![], Some(mps));
        let configs = opaque_configs(&rc, &claim(), "gpu.nvidia.com").unwrap();
        let devices = [
            (alloc("gpu-0"), "GPU-a".to_string()),
            (alloc("gpu-1"), "GPU-b".to_string()),
        ];
        let spec = mps_spec(&claim(), &configs, &devices).unwrap().unwrap();
        assert_eq!(spec.name, "uid-1");
        assert_eq!(spec.uuids, ["GPU-a", "GPU-b"]);
        assert_eq!(spec.active_thread_percentage, Some(50));
        assert_eq!(
            spec.pinned_limits,
            std::collections::BTreeMap::from([
                ("GPU-a".to_string(), "10240M".to_string()),
                ("GPU-b".to_string(), "2048M".to_string())
            ])
        );
        // A per-device key that names no device of the claim fails it, naming the field.
        let mut configs = configs;
        if let gpuops_dra::config::OpaqueConfig::Gpu(g) = &mut configs[0].config
            && let Some(gpuops_dra::config::GpuSharing::Mps(m)) = &mut g.sharing
        {
            m.default_per_device_pinned_memory_limit
                .insert("7".into(), 1 << 30);
        }
        let e = mps_spec(&claim(), &configs, &devices).unwrap_err();
        assert!(
            e.to_string().contains("defaultPerDevicePinnedMemoryLimit"),
            "{e}"
        );
        // Time-slicing starts no daemon.
        let rc = allocated_claim(
            "uid-1",
            vec![],
            Some(serde_json::json!({
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing"},
            })),
        );
        let configs = opaque_configs(&rc, &claim(), "gpu.nvidia.com").unwrap();
        assert_eq!(mps_spec(&claim(), &configs, &devices).unwrap(), None);
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
            mps: None,
        };
        Preparer::new(
            client,
            "n1",
            cfg,
            empty_state(),
            watch::channel(None).1,
            None,
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

    fn one_gpu(model: &str, mig_on: bool) -> Inventory {
        let m = gpuops_catalog::lookup(model).unwrap();
        Inventory {
            driver_version: "580.105.08".into(),
            cuda_driver_version: "13.0".into(),
            gpus: vec![gpuops_inventory::Gpu {
                index: 0,
                uuid: "GPU-0".into(),
                name: m.nvml_name.into(),
                model: Some(m.key.into()),
                pci_bus_id: "00000000:18:00.0".into(),
                minor_number: Some(0),
                compute_capability: Some(m.compute_capability),
                mig: gpuops_inventory::MigState {
                    capable: true,
                    current_enabled: mig_on,
                    pending_enabled: mig_on,
                },
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn alloc(device: &str) -> Allocated {
        Allocated {
            request: "gpu".into(),
            device: device.into(),
            share_id: None,
        }
    }

    #[test]
    fn dynamic_mig_devices_are_made_at_prepare_and_static_ones_are_used_as_they_are() {
        let dynamic = gpuops_dra::Options {
            dynamic_mig: true,
            ..Default::default()
        };
        // An H100 (MIG mode changes without a reset) offers the whole GPU and every placement
        // from one counter set.
        let inv = one_gpu("H100-SXM5-80GB", false);
        let model = gpuops_dra::build(&inv, &gpuops_dra::NodeFacts::default(), &dynamic);
        let placement = model
            .devices
            .iter()
            .find(|d| d.mig.as_ref().is_some_and(|m| m.profile == "3g.40gb"))
            .unwrap();
        let got = steps(&model, &claim(), &[alloc("gpu-0"), alloc(&placement.name)]).unwrap();
        let m = placement.mig.as_ref().unwrap();
        assert_eq!(
            got,
            [
                Step::Whole {
                    gpu: 0,
                    uuid: "GPU-0".into()
                },
                Step::Create {
                    parent_uuid: "GPU-0".into(),
                    wanted: gpuops_migexec::dynamic::Wanted {
                        gpu: 0,
                        gi_profile_id: m.gi_profile_id,
                        start: m.placement_start,
                        size: m.placement_size,
                    }
                }
            ]
        );
        // Recorded by placement before it is made, by UUID after.
        let before = created_mig(&got[1], None).unwrap();
        assert_eq!((before.uuid.as_str(), before.gi_id), ("", 0));
        assert_eq!(before.placement_start, m.placement_start);
        let made = gpuops_migexec::dynamic::Created {
            gi_id: 2,
            ci_id: 0,
            uuid: "MIG-x".into(),
            adopted: false,
        };
        assert_eq!(created_mig(&got[1], Some(&made)).unwrap().uuid, "MIG-x");
        assert!(created_mig(&got[0], None).is_none());

        // Static MIG: the MIG device that exists, by its UUID; nothing is made.
        let mut inv = one_gpu("H100-SXM5-80GB", true);
        inv.gpus[0].mig_devices.push(gpuops_inventory::MigDevice {
            uuid: "MIG-1".into(),
            profile: "3g.40gb".into(),
            ci_profile: "3g.40gb".into(),
            gi_profile_id: m.gi_profile_id,
            placement_start: m.placement_start,
            placement_size: m.placement_size,
            ..Default::default()
        });
        let model = gpuops_dra::build(&inv, &gpuops_dra::NodeFacts::default(), &Default::default());
        let name = &model.devices[0].name;
        assert_eq!(
            steps(&model, &claim(), &[alloc(name)]).unwrap(),
            [Step::Ready {
                uuid: "MIG-1".into()
            }]
        );
        let e = steps(&model, &claim(), &[alloc("gpu-0")]).unwrap_err();
        assert!(e.to_string().contains("gpu-0 is not on this node"), "{e}");
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
