//! The MIG label flow (what NVIDIA's MIG manager does): the node label `nvidia.com/mig.config`
//! names a config of a mig-parted file (a mounted ConfigMap); the agent applies it and reports
//! `nvidia.com/mig.config.state` = pending | success | failed, with the reason in a node event.
//!
//! A change empties the device plugin's resources first and waits for the pods holding this node's
//! GPUs, but never longer than the drain timeout: then the state is `failed`, the resources come
//! back unchanged and the apply is retried with backoff (the node is never left wedged in
//! `pending`).
//!
//! The check and the apply run in this process, through gpuops-migexec (what `gpuops mig apply`
//! and `assert` run), on the snapshot loop's NVML handle (one NVML per process; NVML is
//! thread-safe), each on a blocking thread with a deadline. Not a child process: the agent calls
//! NVML in-process anyway (snapshots, XIDs), so a child isolates no crash the agent is not already
//! exposed to, and in-process the failures stay typed instead of being read back from a child's
//! exit status and stderr. An apply past its deadline is cancelled: it stops before its next
//! driver call (a call in progress cannot be interrupted, in a child or here), the state is
//! `failed` and the GPUs are advertised again; while a call has not returned no other check or
//! apply starts. The checkpoint (written before the first change) lets an agent killed half-way
//! converge when it starts again.
//!
//! What happens after a failure follows its [`Category`]: a retryable one (busy devices, pods
//! that did not leave, a deadline) is retried with backoff; a config the node cannot take waits
//! for a new config (the label or the file changes); a hardware one (lost GPU, driver refusing,
//! reset pending, driver not returning) is reported and retried only at the longest backoff.
//!
//! The flow does not write the Node itself: it publishes the state label and annotations it wants
//! ([`MigReport`]) and the node reconciler keeps them there, so a write that failed is made again.

use crate::error::{APPLY, AgentError, CHECK, chain};
use crate::state::NodeState;
use gpuops_inventory::Inventory;
use gpuops_kube::{NodeWriter, now_secs, rfc3339};
use gpuops_mig::config::NamedConfig;
use gpuops_migexec::Category;
use gpuops_nvml::Gpus;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The MIG state the flow wants on the Node (owned by the MIG field manager).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigReport {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The label naming the wanted config.
pub const CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// The label reporting progress.
pub const STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// When the state was entered (RFC 3339).
pub const SINCE_ANNOTATION: &str = "gpuops.io/mig.config.state-since";
/// Why the last apply failed.
pub const REASON_ANNOTATION: &str = "gpuops.io/mig.config.reason";
/// The GPUs' MIG layout and which instances pods hold, as JSON
/// (`{"applied","model","gpus":[{"mig_enabled","busy","instances":[{"profile","start","busy"}]}]}`):
/// what `gpuops controller` re-partitions from. Neither the labels nor allocatable say which
/// GPU an instance is on, where it starts or whether a pod holds it.
pub const LAYOUT_ANNOTATION: &str = "gpuops.io/mig.layout";
/// How long a config the node label names may be missing from the config file before the
/// change is reported failed: the label and the ConfigMap are written one after the other, and
/// a mounted ConfigMap reaches the node only with the kubelet's next sync (a minute or more).
const CONFIG_WAIT: Duration = Duration::from_secs(180);

/// How the flow is set up.
#[derive(Debug, Clone)]
pub struct FlowConfig {
    /// The mig-parted config file (re-read on every check, so a ConfigMap edit is picked up).
    pub config_file: PathBuf,
    /// Applied when the node has no `nvidia.com/mig.config` label.
    pub default_config: Option<String>,
    pub drain_timeout: Duration,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// The MIG checkpoint file (`gpuops mig apply`'s: in the simulator state, else
    /// /var/lib/gpuops/mig-checkpoint.json, unless GPUOPS_MIG_CHECKPOINT names one).
    pub checkpoint: PathBuf,
    /// A mig-parted hooks file run around each apply (MIG_PARTED_HOOKS_FILE).
    pub hooks_file: Option<PathBuf>,
    /// How long one check or apply may run before it is cancelled (`--mig-child-timeout`).
    pub deadline: Duration,
    /// Pause between driver calls (the test-only GPUOPS_MIG_STEP_DELAY, to widen the window in
    /// which a test kills the agent half-way).
    pub step_delay: Option<Duration>,
    /// Where to ask which pods hold GPUs; `None` skips the wait.
    pub pod_socket: Option<PathBuf>,
    /// Read the config file's text from this ConfigMap (`namespace`, `name`) through the API
    /// and keep `config_file` a copy of it, instead of waiting for the kubelet's volume sync.
    pub configmap: Option<(String, String)>,
}

/// The key of the mig-parted config in a ConfigMap (as the GPU Operator's `mig-parted-config`).
pub const CONFIGMAP_KEY: &str = "config.yaml";

/// State values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Success,
    Failed,
}

impl State {
    fn label(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failed => "failed",
        }
    }
}

/// What one attempt should do next, given the outcome of the check (pure, tested).
#[derive(Debug)]
enum Next {
    /// The config cannot be applied here: report it, no draining.
    Invalid(AgentError),
    /// The GPUs already have the layout.
    AlreadyApplied,
    /// Drain, then apply.
    Apply,
}

/// `checked`: whether the GPUs already have the config, or why it cannot be planned here.
fn next_step(checked: Result<bool, AgentError>) -> Next {
    match checked {
        Err(e) => Next::Invalid(e),
        Ok(true) => Next::AlreadyApplied,
        Ok(false) => Next::Apply,
    }
}

/// When a failed config is tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    Now,
    At(Instant),
    /// Only once the node label or the config file changes.
    OnNewConfig,
}

impl Retry {
    /// After the `failures`-th failure in a row, of `category`.
    fn after(category: Category, failures: u32, cfg: &FlowConfig, now: Instant) -> Retry {
        match category {
            Category::Retryable => {
                Retry::At(now + backoff(failures, cfg.backoff_min, cfg.backoff_max))
            }
            Category::Config => Retry::OnNewConfig,
            Category::Hardware => Retry::At(now + cfg.backoff_max),
        }
    }

    fn due(self, now: Instant) -> bool {
        match self {
            Retry::Now => true,
            Retry::At(t) => now >= t,
            Retry::OnNewConfig => false,
        }
    }
}

/// Backoff after `failures` failed attempts in a row: doubling from `min`, capped at `max`
/// (gpuops-backoff's policy, without jitter: one agent per node, nothing retries in lock-step).
fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    gpuops_backoff::Policy::new(min, max).base(failures)
}

/// The flow's loop. `busy` is true while the device plugin must advertise nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    cfg: FlowConfig,
    gpus: watch::Receiver<Option<Arc<Gpus>>>,
    node: NodeWriter,
    mut observed: watch::Receiver<Option<Arc<Node>>>,
    state: watch::Receiver<Arc<NodeState>>,
    busy: watch::Sender<bool>,
    report: watch::Sender<Option<MigReport>>,
    mut stop: watch::Receiver<bool>,
) {
    let labels_of = |n: &Option<Arc<Node>>| {
        n.as_ref()
            .map(|n| n.metadata.labels.clone().unwrap_or_default())
    };
    let mut flow = Flow {
        cfg,
        gpus,
        running: Arc::new(AtomicBool::new(false)),
        node,
        state,
        busy,
        report,
        reported: None,
        state_meta: None,
        layout: None,
    };
    // What was last applied successfully: (config name, config file text).
    let mut done: Option<(String, String)> = None;
    let mut failures = 0u32;
    let mut retry = Retry::Now;
    // The last attempt failed because NVML was not loaded yet: tried again once it is.
    let mut without_nvml = false;
    // The config file text of the last failed attempt: a new text is tried at once.
    let mut failed_text: Option<String> = None;
    // Since when the wanted config is missing from the file (name, since).
    let mut missing: Option<(String, Instant)> = None;
    let mut first = true;
    let started = Instant::now();
    loop {
        let node_labels = labels_of(&observed.borrow_and_update());
        let wanted = match &node_labels {
            Some(l) => l
                .get(CONFIG_LABEL)
                .cloned()
                .or_else(|| flow.cfg.default_config.clone()),
            // The node has not been read yet.
            None => None,
        };
        let text = std::fs::read_to_string(&flow.cfg.config_file).unwrap_or_default();
        if let Some(name) = &wanted {
            let changed = done.as_ref() != Some(&(name.clone(), text.clone()));
            if failed_text.as_ref().is_some_and(|t| *t != text)
                || (without_nvml && flow.gpus.borrow().is_some())
            {
                retry = Retry::Now;
                without_nvml = false;
            }
            let due = retry.due(Instant::now());
            let absent = config_absent(&text, name, &flow.cfg.config_file);
            let waiting = match (&missing, absent) {
                (_, false) => {
                    missing = None;
                    false
                }
                (Some((n, since)), true) if n == name => since.elapsed() < CONFIG_WAIT,
                (_, true) => {
                    tracing::info!(config = %name, "MIG config {name} is not in {} yet; waiting up to {CONFIG_WAIT:?} for it", flow.cfg.config_file.display());
                    missing = Some((name.clone(), Instant::now()));
                    true
                }
            };
            if changed && due && !waiting {
                // An attempt waits on pods to leave (up to the drain timeout), the driver (up to
                // the deadline) and the kubelet; shutdown does not wait for it. A check or apply
                // dropped here is cancelled before its next driver call, and the checkpoint lets
                // the next agent converge.
                let Some(attempted) =
                    gpuops_kube::runtime::until_stopped(flow.attempt(name, &text), &stop).await
                else {
                    return;
                };
                match attempted {
                    Ok(()) => {
                        done = Some((name.clone(), text));
                        failures = 0;
                        retry = Retry::Now;
                        failed_text = None;
                    }
                    Err(e) => {
                        failures += 1;
                        let now = Instant::now();
                        let category = e.category();
                        retry = Retry::after(category, failures, &flow.cfg, now);
                        without_nvml = matches!(e, AgentError::MigNoNvml);
                        match retry {
                            Retry::At(at) => {
                                let wait = at - now;
                                if category == Category::Hardware {
                                    tracing::error!(config = %name, attempt = failures, error = %chain(&e), "MIG config {name}: the GPUs or their driver refused the change; someone has to look at the node");
                                }
                                tracing::warn!(config = %name, attempt = failures, retry_in = ?wait, "MIG config {name}: retrying in {wait:?} (attempt {failures} failed)");
                            }
                            Retry::OnNewConfig | Retry::Now => {
                                tracing::warn!(config = %name, attempt = failures, "MIG config {name}: not retried until the node label or the config file changes (attempt {failures} failed)");
                            }
                        }
                        failed_text = Some(text);
                    }
                }
            }
        } else {
            done = None;
            retry = Retry::Now;
            failures = 0;
        }
        // Asks the kubelet which pods hold devices (up to its timeout).
        let published = gpuops_kube::runtime::until_stopped(
            flow.publish_layout(done.as_ref().map(|(n, _)| n.as_str())),
            &stop,
        )
        .await;
        if published.is_none() {
            return;
        }
        // Without the node's labels (API unreachable) the resources come back after a while:
        // waiting for the apiserver must not keep the GPUs from pods.
        if first && (node_labels.is_some() || started.elapsed() > Duration::from_secs(30)) {
            // The device plugin waited for the first decision (a default layout applies before
            // any pod can land).
            first = false;
            flow.busy.send_replace(false);
        }
        tokio::select! {
            _ = stop.changed() => return,
            changed = observed.changed() => {
                if changed.is_err() {
                    return;
                }
                // A new wanted config is tried at once, whatever the backoff.
                let now = labels_of(&observed.borrow()).and_then(|l| l.get(CONFIG_LABEL).cloned());
                if now != wanted {
                    retry = Retry::Now;
                    failures = 0;
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Keeps `file` a copy of the config key of the ConfigMap followed in `cm` (written atomically,
/// only when it differs), so the flow reads a file either way.
pub(crate) async fn mirror_configmap(
    file: PathBuf,
    mut cm: watch::Receiver<Option<Arc<ConfigMap>>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut missing_logged = false;
    loop {
        let text = cm
            .borrow_and_update()
            .as_ref()
            .map(|c| c.data.as_ref().and_then(|d| d.get(CONFIGMAP_KEY)).cloned());
        match text {
            Some(Some(text)) => {
                missing_logged = false;
                if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
                    match gpuops_atomicfile::write(&file, &text) {
                        Ok(()) => {
                            tracing::info!(file = %file.display(), "MIG config file {} updated from its ConfigMap", file.display())
                        }
                        Err(e) => {
                            tracing::warn!(file = %file.display(), error = %e, "writing MIG config file {}: {e}", file.display())
                        }
                    }
                }
            }
            Some(None) if !missing_logged => {
                missing_logged = true;
                tracing::warn!("the MIG ConfigMap has no key {CONFIGMAP_KEY}");
            }
            _ => {}
        }
        tokio::select! {
            _ = stop.changed() => return,
            changed = cm.changed() => if changed.is_err() { return },
        }
    }
}

/// Whether `text` is a valid config file that lacks config `name` (then it may still be on
/// its way; a file that does not parse is reported by the attempt as it is).
fn config_absent(text: &str, name: &str, file: &std::path::Path) -> bool {
    gpuops_mig::config::parse(text, &file.display().to_string())
        .is_ok_and(|all| all.configs.iter().all(|c| c.name != name))
}

/// The devices an apply of `named` would destroy, or take away with a MIG mode change: the
/// UUIDs of MIG devices leaving and of every GPU whose mode flips (with its MIG devices).
/// `None` when the plan cannot be made here (then every device counts).
fn touched_devices(inv: &Inventory, named: &NamedConfig) -> Option<BTreeSet<String>> {
    let targets = gpuops_mig::apply::targets_of(named, inv).ok()?;
    let plans = gpuops_mig::apply::plan_node(inv, &targets).ok()?;
    let mut out = BTreeSet::new();
    for p in &plans {
        let gpu = inv.gpus.iter().find(|g| g.index == p.gpu)?;
        if p.mode_changes() {
            out.insert(gpu.uuid.clone());
            out.extend(gpu.mig_devices.iter().map(|m| m.uuid.clone()));
            continue;
        }
        for d in &p.plan.destroy {
            out.extend(
                gpu.mig_devices
                    .iter()
                    .filter(|m| m.ci_profile == d.profile && m.placement_start == d.start)
                    .map(|m| m.uuid.clone()),
            );
        }
    }
    Some(out)
}

/// The [`LAYOUT_ANNOTATION`] value: per GPU its MIG mode and instances, and which of them
/// (or which whole GPU) a pod holds.
fn layout_annotation(inv: &Inventory, held: &BTreeSet<String>, applied: Option<&str>) -> String {
    let gpus: Vec<serde_json::Value> = inv
        .gpus
        .iter()
        .map(|g| {
            let mut instances: Vec<&gpuops_inventory::MigDevice> = g.mig_devices.iter().collect();
            instances.sort_by_key(|m| m.placement_start);
            serde_json::json!({
                "mig_enabled": g.mig.current_enabled,
                "busy": held.contains(&g.uuid),
                "instances": instances.iter().map(|m| serde_json::json!({
                    "profile": m.ci_profile,
                    "start": m.placement_start,
                    "busy": held.contains(&m.uuid),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let model = inv
        .gpus
        .iter()
        .find_map(|g| g.model.clone())
        .unwrap_or_default();
    serde_json::json!({"applied": applied, "model": model, "gpus": gpus}).to_string()
}

struct Flow {
    cfg: FlowConfig,
    /// The snapshot loop's NVML handle; `None` until NVML is loaded.
    gpus: watch::Receiver<Option<Arc<Gpus>>>,
    /// A check or apply is on a blocking thread (past its deadline: inside a driver call that
    /// has not returned).
    running: Arc<AtomicBool>,
    node: NodeWriter,
    state: watch::Receiver<Arc<NodeState>>,
    busy: watch::Sender<bool>,
    report: watch::Sender<Option<MigReport>>,
    /// The state and reason last written.
    reported: Option<(State, String)>,
    /// The state label and annotations last reported.
    state_meta: Option<(BTreeMap<String, String>, BTreeMap<String, String>)>,
    /// The layout annotation last published.
    layout: Option<String>,
}

/// How long the end of a change waits for the first GPU snapshot taken after it; past that
/// (a driver that stopped answering) the resources come back from the last one.
const FRESH_SNAPSHOT_WAIT: Duration = Duration::from_secs(60);

impl Flow {
    /// Waits until the agent loop published a snapshot whose collection began at `after` or
    /// later.
    async fn wait_for_snapshot_after(&mut self, after: Instant) {
        let fresh = self
            .state
            .wait_for(|s| s.collection.is_some_and(|c| c >= after));
        // Ok(Err): the agent loop is gone, the agent is stopping; nothing to wait for.
        if tokio::time::timeout(FRESH_SNAPSHOT_WAIT, fresh)
            .await
            .is_err()
        {
            tracing::warn!(
                "no GPU snapshot within {FRESH_SNAPSHOT_WAIT:?} after the MIG change; advertising from the last one"
            );
        }
    }

    async fn check(&self, name: &str) -> Result<bool, AgentError> {
        check_config(&self.cfg, self.gpus()?, &self.running, name).await
    }

    async fn apply(&self, name: &str) -> Result<(), AgentError> {
        apply_config(&self.cfg, self.gpus()?, &self.running, name).await
    }

    fn gpus(&self) -> Result<Arc<Gpus>, AgentError> {
        self.gpus.borrow().clone().ok_or(AgentError::MigNoNvml)
    }

    /// One try at making the GPUs match config `name` of the config file `text`.
    async fn attempt(&mut self, name: &str, text: &str) -> Result<(), AgentError> {
        let checked = self.check(name).await;
        match next_step(checked) {
            Next::Invalid(e) => {
                self.report(
                    State::Failed,
                    name,
                    &format!("config {name} cannot be applied: {}", chain(&e)),
                )
                .await;
                Err(e)
            }
            Next::AlreadyApplied => {
                self.report(
                    State::Success,
                    name,
                    &format!("the GPUs have MIG config {name}"),
                )
                .await;
                Ok(())
            }
            Next::Apply => {
                self.report(
                    State::Pending,
                    name,
                    &format!(
                        "applying MIG config {name}: GPU resources withdrawn until it is done"
                    ),
                )
                .await;
                // Only the pods on devices the change takes away are waited for: instances
                // that stay keep running (and their pods) through the change.
                let touched =
                    gpuops_mig::config::parse(text, &self.cfg.config_file.display().to_string())
                        .ok()
                        .and_then(|all| all.get(name).ok().cloned())
                        .and_then(|named| touched_devices(&self.state.borrow().inventory, &named));
                self.busy.send_replace(true);
                let result = match self.wait_for_gpu_pods(touched.as_ref()).await {
                    Err(e) => Err(e),
                    Ok(()) => self.apply(name).await,
                };
                // Back to advertising, whatever happened, from what the driver now has: the
                // snapshot in hand may predate the change (MIG still off), and republishing from
                // it would offer whole GPUs that are gone for up to an interval.
                self.wait_for_snapshot_after(Instant::now()).await;
                self.busy.send_replace(false);
                match result {
                    Ok(()) => {
                        self.report(State::Success, name, &format!("MIG config {name} applied"))
                            .await;
                        Ok(())
                    }
                    Err(e) => {
                        self.report(
                            State::Failed,
                            name,
                            &format!("applying MIG config {name} failed: {}", chain(&e)),
                        )
                        .await;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Which pods hold which of this node's devices: (device UUID, `namespace/pod`); `Err` when
    /// the kubelet does not answer. `None` without a PodResources socket.
    async fn holders(&self) -> Option<Result<Vec<(String, String)>, AgentError>> {
        let socket = self.cfg.pod_socket.clone()?;
        let wait = Duration::from_secs(10);
        let listed = match tokio::time::timeout(
            wait,
            crate::podresources::list_pod_resources(&socket, None),
        )
        .await
        {
            Ok(listed) => listed,
            Err(_) => Err(AgentError::PodResourcesTimeout(wait)),
        };
        Some(listed.map(|(assignments, _)| {
            let inv = Arc::clone(&self.state.borrow().inventory);
            let map = gpuops_metrics::PodMap::build(assignments.iter().cloned(), &inv);
            let mut out = Vec::new();
            for a in &assignments {
                for id in &a.device_ids {
                    let uuid = gpuops_metrics::pods::strip_replica(id);
                    if !map.holders(uuid).is_empty() {
                        out.push((uuid.to_string(), format!("{}/{}", a.namespace, a.pod)));
                    }
                }
            }
            out
        }))
    }

    /// Publishes the layout annotation when it changed (pods came or went, the layout moved).
    async fn publish_layout(&mut self, applied: Option<&str>) {
        let held: BTreeSet<String> = match self.holders().await {
            Some(Ok(h)) => h.into_iter().map(|(uuid, _)| uuid).collect(),
            // Unknown holders: publish nothing new rather than call everything free.
            Some(Err(_)) => return,
            // No PodResources socket: nothing is known to hold a device (the flow does not
            // wait for pods either).
            None => BTreeSet::new(),
        };
        let text = layout_annotation(&self.state.borrow().inventory, &held, applied);
        if self.layout.as_deref() != Some(text.as_str()) {
            self.layout = Some(text);
            self.send();
        }
    }

    fn send(&self) {
        let (labels, mut annotations) = self.state_meta.clone().unwrap_or_default();
        if let Some(l) = &self.layout {
            annotations.insert(LAYOUT_ANNOTATION.to_string(), l.clone());
        }
        self.report.send_replace(Some(MigReport {
            labels,
            annotations,
        }));
    }

    /// Waits until no pod holds one of `touched` (every device of the node when `None`);
    /// `Err` names the holders at the timeout.
    async fn wait_for_gpu_pods(
        &self,
        touched: Option<&BTreeSet<String>>,
    ) -> Result<(), AgentError> {
        let deadline = Instant::now() + self.cfg.drain_timeout;
        loop {
            let holders = match self.holders().await {
                None => return Ok(()),
                Some(Ok(h)) => {
                    let mut names: Vec<String> = h
                        .into_iter()
                        .filter(|(uuid, _)| touched.is_none_or(|t| t.contains(uuid)))
                        .map(|(_, pod)| pod)
                        .collect();
                    names.sort();
                    names.dedup();
                    names
                }
                // The kubelet not answering is no proof that GPUs are free.
                Some(Err(e)) => vec![format!("kubelet PodResources: {e}")],
            };
            if holders.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(AgentError::MigDrain {
                    after: self.cfg.drain_timeout,
                    holders,
                });
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// Publishes the state label (and the reason) for the node reconciler and records an event
    /// when it changes.
    async fn report(&mut self, state: State, name: &str, message: &str) {
        if self.reported.as_ref() == Some(&(state, message.to_string())) {
            return;
        }
        let mut labels = BTreeMap::new();
        labels.insert(STATE_LABEL.to_string(), state.label().to_string());
        let mut annotations = BTreeMap::new();
        annotations.insert(SINCE_ANNOTATION.to_string(), rfc3339(now_secs()));
        if state == State::Failed {
            annotations.insert(REASON_ANNOTATION.to_string(), truncate(message, 1000));
        }
        tracing::info!(config = %name, state = state.label(), "MIG config {name}: {} ({message})", state.label());
        self.state_meta = Some((labels, annotations));
        self.send();
        let reason = match state {
            State::Pending => "MIGConfigPending",
            State::Success => "MIGConfigApplied",
            State::Failed => "MIGConfigFailed",
        };
        // Events are best effort and must not hold the flow up when the API server is slow.
        let (node, warning, note) = (
            self.node.clone(),
            state == State::Failed,
            truncate(message, 1000),
        );
        tokio::spawn(async move {
            if let Err(e) = node.event(warning, reason, "ApplyMIGConfig", &note).await {
                tracing::warn!(error = %e, "recording event {reason}: {e}");
            }
        });
        self.reported = Some((state, message.to_string()));
    }
}

/// Whether the GPUs already have config `name` of the config file (`gpuops mig assert`), or
/// why it cannot be planned here (`gpuops mig apply --dry-run` failing).
async fn check_config(
    cfg: &FlowConfig,
    gpus: Arc<Gpus>,
    running: &Arc<AtomicBool>,
    name: &str,
) -> Result<bool, AgentError> {
    let (file, name, hooks) = (
        cfg.config_file.display().to_string(),
        name.to_string(),
        cfg.hooks_file.clone(),
    );
    blocking(running, CHECK, cfg.deadline, move |_cancel| {
        let planned = gpuops_migexec::plan_named(&gpus, &file, &name, hooks.as_deref())?;
        Ok(planned.applied())
    })
    .await
}

/// Applies config `name` as `gpuops mig apply` does (checkpoint, apply, converged check); a
/// MIG mode change left waiting for a GPU reset is a failure, as the command's exit status 2.
async fn apply_config(
    cfg: &FlowConfig,
    gpus: Arc<Gpus>,
    running: &Arc<AtomicBool>,
    name: &str,
) -> Result<(), AgentError> {
    let opts = gpuops_migexec::Options {
        config_name: name.to_string(),
        config_file: cfg.config_file.display().to_string(),
        step_delay: cfg.step_delay,
        ..gpuops_migexec::Options::default()
    };
    let (hooks, checkpoint) = (cfg.hooks_file.clone(), cfg.checkpoint.clone());
    blocking(running, APPLY, cfg.deadline, move |cancel| {
        let planned = gpuops_migexec::plan_named(
            &gpus,
            &opts.config_file,
            &opts.config_name,
            hooks.as_deref(),
        )?;
        let config = opts.config_name.clone();
        let opts = gpuops_migexec::Options {
            cancel: Some(cancel),
            ..opts
        };
        let outcome = planned.apply(
            &gpus,
            opts,
            &checkpoint,
            |p| tracing::info!(config = %config, "MIG config {config}: {p}"),
        )?;
        let pending = outcome.pending_messages();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(AgentError::MigPendingReset(pending))
        }
    })
    .await
}

/// Sets the flag when dropped.
struct SetOnDrop(Arc<AtomicBool>, bool);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::SeqCst);
    }
}

/// Runs `job` on a blocking thread for at most `deadline`. Past it (or when the caller's future
/// is dropped, the agent stopping) the job's cancel flag is set, and it is the job's to stop at
/// its next driver call; the caller gets [`AgentError::MigDeadline`] at once. `running` is held
/// until the job returns: a job still inside the driver refuses the next one.
async fn blocking<T: Send + 'static>(
    running: &Arc<AtomicBool>,
    what: &'static str,
    deadline: Duration,
    job: impl FnOnce(Arc<AtomicBool>) -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    if running.swap(true, Ordering::SeqCst) {
        return Err(AgentError::MigStillRunning(what));
    }
    let cancel = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = SetOnDrop(Arc::clone(&cancel), true);
    let (done, job_cancel) = (SetOnDrop(Arc::clone(running), false), Arc::clone(&cancel));
    let task = tokio::task::spawn_blocking(move || {
        let _done = done;
        job(job_cancel)
    });
    match tokio::time::timeout(deadline, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(AgentError::MigTask(e)),
        Err(_) => Err(AgentError::MigDeadline {
            what,
            after: deadline,
        }),
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infeasible_config_fails_without_draining_and_an_applied_one_needs_nothing() {
        let infeasible = AgentError::MigExec(gpuops_migexec::ExecError::Profile(
            "2x 7g.80gb needs 14 of 7 compute slices".into(),
        ));
        match next_step(Err(infeasible)) {
            Next::Invalid(e) => {
                assert_eq!(chain(&e), "2x 7g.80gb needs 14 of 7 compute slices");
                assert_eq!(e.category(), Category::Config);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(next_step(Ok(true)), Next::AlreadyApplied));
        assert!(matches!(next_step(Ok(false)), Next::Apply));
    }

    fn flow_config() -> FlowConfig {
        FlowConfig {
            config_file: "/etc/mig.yaml".into(),
            default_config: None,
            drain_timeout: Duration::from_secs(300),
            backoff_min: Duration::from_secs(10),
            backoff_max: Duration::from_secs(600),
            checkpoint: "/var/lib/gpuops/mig-checkpoint.json".into(),
            hooks_file: None,
            deadline: Duration::from_secs(600),
            step_delay: None,
            pod_socket: None,
            configmap: None,
        }
    }

    #[tokio::test]
    #[allow(clippy::unwrap_used, clippy::expect_used)]
    async fn a_kubelet_that_never_answers_does_not_hold_shutdown_up() {
        let kubelet = crate::hung::Hung::unix();
        let (_api, client) = crate::hung::Hung::api_server().await;
        let writer = NodeWriter::new(client, "node-1", "gpuops-agent", Duration::from_secs(300));
        let cfg = FlowConfig {
            pod_socket: Some(kubelet.socket()),
            ..flow_config()
        };
        let state = NodeState {
            inventory: Arc::new(Inventory::default()),
            health: gpuops_resources::health::HealthTracker::default(),
            xids: gpuops_metrics::XidCounters::default(),
            collection: Some(Instant::now()),
            nvml_errors: 0,
            nvml_loaded: true,
        };
        let (_gpus_tx, gpus_rx) = watch::channel(None);
        let (_node_tx, node_rx) = watch::channel(None);
        let (_state_tx, state_rx) = watch::channel(Arc::new(state));
        let (busy_tx, _busy_rx) = watch::channel(true);
        let (report_tx, _report_rx) = watch::channel(None);
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(
            cfg, gpus_rx, writer, node_rx, state_rx, busy_tx, report_tx, stop_rx,
        ));
        // The first round publishes the layout, which asks PodResources who holds the GPUs.
        kubelet.accepted().await;
        stop_tx.send(true).unwrap();
        // Without the stop signal the flow would wait for the kubelet's 10 s timeout.
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the MIG flow stops in the middle of a hung PodResources call")
            .unwrap();
    }

    #[test]
    fn a_retryable_failure_backs_off_a_config_waits_for_a_new_one_and_hardware_waits_longest() {
        let (cfg, now) = (flow_config(), Instant::now());
        let s = Duration::from_secs;
        assert_eq!(
            Retry::after(Category::Retryable, 1, &cfg, now),
            Retry::At(now + s(10))
        );
        assert_eq!(
            Retry::after(Category::Retryable, 3, &cfg, now),
            Retry::At(now + s(40))
        );
        let config = Retry::after(Category::Config, 1, &cfg, now);
        assert_eq!(config, Retry::OnNewConfig);
        assert!(!config.due(now + s(86_400)), "a bad config is not retried");
        assert_eq!(
            Retry::after(Category::Hardware, 1, &cfg, now),
            Retry::At(now + s(600))
        );
        assert!(Retry::At(now).due(now) && Retry::Now.due(now));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let (min, max) = (Duration::from_secs(10), Duration::from_secs(300));
        let waits: Vec<u64> = (1..=7).map(|f| backoff(f, min, max).as_secs()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(backoff(u32::MAX, min, max), max);
    }

    fn a100(index: u32, mig: bool, devices: &[(&str, &str, u32)]) -> gpuops_inventory::Gpu {
        gpuops_inventory::Gpu {
            index,
            uuid: format!("GPU-{index}"),
            model: Some("A100-SXM4-80GB".into()),
            mig: gpuops_inventory::MigState {
                capable: true,
                current_enabled: mig,
                pending_enabled: mig,
            },
            mig_devices: devices
                .iter()
                .enumerate()
                .map(|(j, (uuid, profile, start))| gpuops_inventory::MigDevice {
                    uuid: (*uuid).into(),
                    index: j as u32,
                    profile: (*profile).into(),
                    ci_profile: (*profile).into(),
                    placement_start: *start,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn seven_1g() -> Vec<(String, &'static str, u32)> {
        (0..7).map(|i| (format!("MIG-{i}"), "1g.10gb", i)).collect()
    }

    fn inventory() -> Inventory {
        let devices = seven_1g();
        let d: Vec<(&str, &str, u32)> = devices
            .iter()
            .map(|(u, p, s)| (u.as_str(), *p, *s))
            .collect();
        Inventory {
            gpus: vec![a100(0, true, &d), a100(1, false, &[])],
            ..Default::default()
        }
    }

    #[test]
    fn the_layout_annotation_says_per_gpu_where_each_instance_is_and_which_a_pod_holds() {
        let inv = Inventory {
            gpus: vec![
                a100(0, true, &[("MIG-b", "3g.40gb", 4), ("MIG-a", "1g.10gb", 0)]),
                a100(1, false, &[]),
            ],
            ..Default::default()
        };
        let held = BTreeSet::from(["MIG-b".to_string(), "GPU-1".to_string()]);
        let v: serde_json::Value =
            serde_json::from_str(&layout_annotation(&inv, &held, Some("mixed"))).unwrap();
        assert_eq!(v["applied"], "mixed");
        assert_eq!(v["model"], "A100-SXM4-80GB");
        let g0 = &v["gpus"][0];
        assert_eq!(g0["mig_enabled"], true);
        assert_eq!(g0["instances"][0]["profile"], "1g.10gb");
        assert_eq!(g0["instances"][0]["start"], 0);
        assert_eq!(g0["instances"][0]["busy"], false);
        assert_eq!(g0["instances"][1]["profile"], "3g.40gb");
        assert_eq!(g0["instances"][1]["busy"], true);
        assert_eq!(v["gpus"][1]["mig_enabled"], false);
        assert_eq!(v["gpus"][1]["busy"], true);
        let none: serde_json::Value =
            serde_json::from_str(&layout_annotation(&inv, &BTreeSet::new(), None)).unwrap();
        assert!(none["applied"].is_null());
    }

    fn named(yaml: &str) -> NamedConfig {
        gpuops_mig::config::parse(yaml, "test")
            .unwrap()
            .get("c")
            .unwrap()
            .clone()
    }

    #[test]
    fn only_the_devices_a_change_takes_away_are_touched() {
        let inv = inventory();
        // GPU 0: four 1g.10gb stay, the three at 4..6 make room for a 3g.40gb; GPU 1 stays off.
        let c = named(
            "version: v1\nmig-configs:\n  c:\n  - devices: [0]\n    mig-enabled: true\n    mig-devices:\n      1g.10gb: 4\n      3g.40gb: 1\n  - devices: [1]\n    mig-enabled: false\n",
        );
        let t = touched_devices(&inv, &c).unwrap();
        assert_eq!(
            t,
            BTreeSet::from(["MIG-4".to_string(), "MIG-5".into(), "MIG-6".into()])
        );
        // Turning MIG on takes the whole GPU away.
        let c = named(
            "version: v1\nmig-configs:\n  c:\n  - devices: [0]\n    mig-enabled: true\n    mig-devices:\n      1g.10gb: 7\n  - devices: [1]\n    mig-enabled: true\n    mig-devices:\n      7g.80gb: 1\n",
        );
        assert_eq!(
            touched_devices(&inv, &c).unwrap(),
            BTreeSet::from(["GPU-1".to_string()])
        );
        // A config this node cannot take: no plan, so every device counts.
        let c = named(
            "version: v1\nmig-configs:\n  c:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n      7g.80gb: 2\n",
        );
        assert!(touched_devices(&inv, &c).is_none());
    }

    #[test]
    fn a_config_is_absent_only_from_a_file_that_parses() {
        let file = std::path::Path::new("/tmp/x.yaml");
        let text = "version: v1\nmig-configs:\n  all-disabled:\n  - devices: all\n    mig-enabled: false\n";
        assert!(config_absent(text, "gpuops-1", file));
        assert!(!config_absent(text, "all-disabled", file));
        // Not parseable: the attempt reports why, nothing is waited for.
        assert!(!config_absent("mig-configs: [", "gpuops-1", file));
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        assert_eq!(truncate("ééé", 3), "é…");
        assert_eq!(truncate("short", 10), "short");
    }
}

#[cfg(test)]
mod deadline_tests {
    use super::*;
    use std::sync::mpsc;

    /// Waits (bounded) until `running` is clear: the blocking job returned.
    async fn returned(running: &AtomicBool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while running.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the job never returned");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_job_that_overruns_its_deadline_is_cancelled_and_reported() {
        let running = Arc::new(AtomicBool::new(false));
        let (saw_cancel_tx, saw_cancel) = mpsc::channel();
        let done = blocking(&running, APPLY, Duration::from_millis(500), move |cancel| {
            // A slow apply: a driver step at a time, checking for the cancel in between.
            while !cancel.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = saw_cancel_tx.send(());
            Ok(())
        })
        .await;
        let e = done.unwrap_err();
        assert!(e.to_string().contains("did not finish within 500ms"), "{e}");
        assert_eq!(e.category(), Category::Retryable);
        // The job saw the cancel and stopped.
        returned(&running).await;
        saw_cancel
            .recv_timeout(Duration::from_secs(1))
            .expect("the job saw its cancel");
        let quick = blocking(&running, CHECK, Duration::from_secs(10), |_| Ok(7)).await;
        assert_eq!(quick.unwrap(), 7);
    }

    #[tokio::test]
    async fn while_a_driver_call_has_not_returned_no_other_job_starts() {
        let running = Arc::new(AtomicBool::new(false));
        let (release, hung) = mpsc::channel::<()>();
        // A driver call that ignores the cancel until released.
        let first = blocking(&running, APPLY, Duration::from_millis(100), move |_| {
            let _ = hung.recv();
            Ok(())
        })
        .await;
        assert!(matches!(first, Err(AgentError::MigDeadline { .. })));
        let started = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&started);
        let second = blocking(&running, CHECK, Duration::from_secs(10), move |_| {
            s.store(true, Ordering::SeqCst);
            Ok(())
        })
        .await;
        let e = second.unwrap_err();
        assert!(matches!(e, AgentError::MigStillRunning(CHECK)), "{e}");
        assert_eq!(e.category(), Category::Hardware);
        assert!(!started.load(Ordering::SeqCst));
        release.send(()).unwrap();
        returned(&running).await;
        assert!(
            blocking(&running, CHECK, Duration::from_secs(10), |_| Ok(()))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_panicking_job_is_a_failure_and_frees_the_next() {
        let running = Arc::new(AtomicBool::new(false));
        let e = blocking::<()>(&running, APPLY, Duration::from_secs(10), |_| {
            panic!("driver wrapper bug")
        })
        .await
        .unwrap_err();
        assert!(matches!(e, AgentError::MigTask(_)), "{e}");
        assert!(!running.load(Ordering::SeqCst));
    }
}

#[cfg(test)]
mod sim_tests {
    use super::*;

    const CONFIGS: &str = "version: v1
mig-configs:
  all-disabled:
  - devices: all
    mig-enabled: false
  all-1g.10gb:
  - devices: all
    mig-enabled: true
    mig-devices:
      1g.10gb: 7
  too-big:
  - devices: all
    mig-enabled: true
    mig-devices:
      3g.40gb: 2
      2g.20gb: 1
";

    /// The simulator cdylib cargo built beside this test binary (nvml-sim is a dev-dependency).
    fn sim_library() -> PathBuf {
        let name = format!(
            "{}nvml_sim{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        let exe = std::env::current_exe().unwrap();
        exe.ancestors()
            .skip(1)
            .take(2)
            .flat_map(|d| [d.join(&name), d.join("deps").join(&name)])
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} not built beside {}", exe.display()))
    }

    async fn returned(running: &AtomicBool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while running.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the apply never returned");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The only test in this binary that loads NVML (the simulator reads its state directory
    /// from the environment at nvmlInit).
    #[tokio::test]
    async fn the_flow_checks_and_applies_in_process_and_a_cancelled_apply_converges_next_time() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("sim");
        let fleet =
            gpuops_sim::Fleet::parse("gpus:\n- model: A100-SXM4-80GB\n  count: 1\n", "test fleet")
                .unwrap();
        let state = gpuops_sim::SimState::from_fleet(&fleet, 0).unwrap();
        gpuops_sim::Store::create(&state_dir, &state).unwrap();
        gpuops_nvml::use_simulator_state(&state_dir);
        let gpus = Arc::new(Gpus::open(gpuops_nvml::Library::Path(sim_library())).unwrap());
        let config_file = dir.path().join("mig.yaml");
        std::fs::write(&config_file, CONFIGS).unwrap();
        let checkpoint = state_dir.join("mig-checkpoint.json");
        let cfg = FlowConfig {
            config_file,
            default_config: None,
            drain_timeout: Duration::from_secs(1),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(10),
            checkpoint: checkpoint.clone(),
            hooks_file: None,
            deadline: Duration::from_secs(60),
            step_delay: None,
            pod_socket: None,
            configmap: None,
        };
        let running = Arc::new(AtomicBool::new(false));
        let check = |name: &'static str| check_config(&cfg, Arc::clone(&gpus), &running, name);

        // Configs this node cannot take: config errors, with the planner's reason.
        let e = check("too-big").await.unwrap_err();
        assert_eq!(e.category(), Category::Config, "{e}");
        assert!(chain(&e).contains("slices"), "{}", chain(&e));
        let e = check("no-such-config").await.unwrap_err();
        assert_eq!(e.category(), Category::Config, "{e}");
        assert!(chain(&e).contains("all-1g.10gb"), "{}", chain(&e));

        assert!(!check("all-1g.10gb").await.unwrap());
        apply_config(&cfg, Arc::clone(&gpus), &running, "all-1g.10gb")
            .await
            .unwrap();
        assert!(check("all-1g.10gb").await.unwrap());
        let saved = gpuops_migexec::read_checkpoint(&checkpoint)
            .unwrap()
            .unwrap();
        assert!(!saved.interrupted());
        let inv = gpus.snapshot_with(gpuops_nvml::Scope::Mig).unwrap();
        assert_eq!(inv.gpus[0].mig_devices.len(), 7);

        // Slow driver steps and a short deadline: cancelled half-way, reported as a deadline.
        let slow = FlowConfig {
            step_delay: Some(Duration::from_millis(200)),
            deadline: Duration::from_millis(500),
            ..cfg.clone()
        };
        let e = apply_config(&slow, Arc::clone(&gpus), &running, "all-disabled")
            .await
            .unwrap_err();
        assert!(matches!(e, AgentError::MigDeadline { .. }), "{e}");
        assert_eq!(e.category(), Category::Retryable);
        returned(&running).await;
        let saved = gpuops_migexec::read_checkpoint(&checkpoint)
            .unwrap()
            .unwrap();
        assert_eq!(saved.applying.as_deref(), Some("all-disabled"));
        let inv = gpus.snapshot_with(gpuops_nvml::Scope::Mig).unwrap();
        let left = inv.gpus[0].mig_devices.len();
        assert!(
            0 < left && left < 7,
            "{left} MIG devices left: not half-way"
        );
        assert!(!check("all-disabled").await.unwrap());

        // The next apply converges from the checkpoint.
        apply_config(&cfg, Arc::clone(&gpus), &running, "all-disabled")
            .await
            .unwrap();
        assert!(check("all-disabled").await.unwrap());
        assert!(
            !gpuops_migexec::read_checkpoint(&checkpoint)
                .unwrap()
                .unwrap()
                .interrupted()
        );
    }
}
