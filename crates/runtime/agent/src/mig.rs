//! The MIG label flow (what NVIDIA's MIG manager does): the node label `nvidia.com/mig.config`
//! names a config of a mig-parted file (a mounted ConfigMap); the agent applies it and reports
//! `nvidia.com/mig.config.state` = pending | success | failed, with the reason in a node event.
//!
//! A change empties the device plugin's resources first and waits for the pods holding this node's
//! GPUs, but never longer than the drain timeout: then the state is `failed`, the resources come
//! back unchanged and the apply is retried with backoff (the node is never left wedged in
//! `pending`). The apply itself runs as `gpuops mig apply` in a child process, with its checkpoint,
//! so an agent killed half-way converges when it starts again. Every child has a deadline: one that
//! overruns it is killed, the state is `failed` and the GPUs are advertised again.
//!
//! The flow does not write the Node itself: it publishes the state label and annotations it wants
//! ([`MigReport`]) and the node reconciler keeps them there, so a write that failed is made again.

use crate::state::NodeState;
use gpuops_inventory::Inventory;
use gpuops_kube::{NodeWriter, now_secs, rfc3339};
use gpuops_mig::config::NamedConfig;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
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
    /// The `gpuops` binary the `mig` children run.
    pub program: PathBuf,
    /// The GPU-source flags for `gpuops mig …` (`--sim-state DIR` or `--nvml-lib PATH`).
    pub gpu_flags: Vec<String>,
    /// How long one child (`gpuops mig apply`, `assert`, a dry run) may run before it is killed.
    pub child_timeout: Duration,
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

/// What one attempt should do next, given the outcome of the checks (pure, tested).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Next {
    /// The config cannot be applied here: report it, no draining.
    Invalid(String),
    /// The GPUs already have the layout.
    AlreadyApplied,
    /// Drain, then apply.
    Apply,
}

fn next_step(dry_run: &Command, assert: &Command) -> Next {
    if !dry_run.ok {
        return Next::Invalid(dry_run.output.clone());
    }
    if assert.ok {
        Next::AlreadyApplied
    } else {
        Next::Apply
    }
}

/// Backoff after `failures` failed attempts in a row: doubling from `min`, capped at `max`.
fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    min.saturating_mul(factor).min(max)
}

/// A finished child command.
#[derive(Debug, Clone)]
struct Command {
    ok: bool,
    /// stderr, or stdout when stderr is empty, trimmed.
    output: String,
}

/// Runs `program args` to its end, or kills it at `timeout`.
async fn gpuops(program: &std::path::Path, args: &[String], timeout: Duration) -> Command {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Killed when the deadline drops the future; an agent that stops leaves it running
        // (its checkpoint lets the next agent converge).
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(c) => c,
        Err(e) => {
            return Command {
                ok: false,
                output: format!("cannot run {} {}: {e}", program.display(), args.join(" ")),
            };
        }
    };
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(o)) => {
            let stderr = String::from_utf8_lossy(&o.stderr).trim().to_string();
            let output = if stderr.is_empty() {
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            } else {
                stderr.trim_start_matches("error: ").to_string()
            };
            Command {
                ok: o.status.success(),
                output,
            }
        }
        Ok(Err(e)) => Command {
            ok: false,
            output: format!("gpuops {}: {e}", args.first().map_or("", |a| a.as_str())),
        },
        Err(_) => Command {
            ok: false,
            output: format!(
                "gpuops {} did not finish within {timeout:?} and was killed",
                args.iter().take(2).cloned().collect::<Vec<_>>().join(" ")
            ),
        },
    }
}

/// The flow's loop. `busy` is true while the device plugin must advertise nothing.
pub(crate) async fn run(
    cfg: FlowConfig,
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
    let mut retry_at: Option<Instant> = None;
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
            if failed_text.as_ref().is_some_and(|t| *t != text) {
                retry_at = None;
            }
            let due = retry_at.is_none_or(|t| Instant::now() >= t);
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
                match flow.attempt(name, &text).await {
                    Ok(()) => {
                        done = Some((name.clone(), text));
                        failures = 0;
                        retry_at = None;
                        failed_text = None;
                    }
                    Err(()) => {
                        failures += 1;
                        let wait = backoff(failures, flow.cfg.backoff_min, flow.cfg.backoff_max);
                        tracing::warn!(config = %name, attempt = failures, retry_in = ?wait, "MIG config {name}: retrying in {wait:?} (attempt {failures} failed)");
                        retry_at = Some(Instant::now() + wait);
                        failed_text = Some(text);
                    }
                }
            }
        } else {
            done = None;
            retry_at = None;
            failures = 0;
        }
        flow.publish_layout(done.as_ref().map(|(n, _)| n.as_str()))
            .await;
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
                    retry_at = None;
                    failures = 0;
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Keeps `file` a copy of the config key of the ConfigMap followed in `cm` (written atomically,
/// only when it differs), so the flow and its `gpuops mig` children read a file either way.
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

    async fn child(&self, args: &[String]) -> Command {
        gpuops(&self.cfg.program, args, self.cfg.child_timeout).await
    }

    fn mig_args(&self, verb: &str, name: &str, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> = ["mig", verb, "-f"].iter().map(|s| s.to_string()).collect();
        args.push(self.cfg.config_file.display().to_string());
        args.extend(["-c".to_string(), name.to_string()]);
        args.extend(self.cfg.gpu_flags.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// One try at making the GPUs match config `name` of the config file `text`.
    async fn attempt(&mut self, name: &str, text: &str) -> Result<(), ()> {
        let dry_run = self
            .child(&self.mig_args("apply", name, &["--dry-run"]))
            .await;
        let assert = if dry_run.ok {
            self.child(&self.mig_args("assert", name, &[])).await
        } else {
            dry_run.clone()
        };
        match next_step(&dry_run, &assert) {
            Next::Invalid(reason) => {
                self.report(
                    State::Failed,
                    name,
                    &format!("config {name} cannot be applied: {reason}"),
                )
                .await;
                Err(())
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
                    Err(holders) => Err(format!(
                        "timed out after {:?} waiting for pods using this node's GPUs to finish ({holders}); nothing was changed and the GPUs are advertised again",
                        self.cfg.drain_timeout
                    )),
                    Ok(()) => {
                        let apply = self.child(&self.mig_args("apply", name, &[])).await;
                        if apply.ok { Ok(()) } else { Err(apply.output) }
                    }
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
                    Err(reason) => {
                        self.report(
                            State::Failed,
                            name,
                            &format!("applying MIG config {name} failed: {reason}"),
                        )
                        .await;
                        Err(())
                    }
                }
            }
        }
    }

    /// Which pods hold which of this node's devices: (device UUID, `namespace/pod`); `Err` when
    /// the kubelet does not answer. `None` without a PodResources socket.
    async fn holders(&self) -> Option<Result<Vec<(String, String)>, String>> {
        let socket = self.cfg.pod_socket.clone()?;
        let listed = tokio::time::timeout(
            Duration::from_secs(10),
            crate::podresources::list_pod_resources(&socket, None),
        )
        .await
        .unwrap_or_else(|_| Err("no answer within 10s".into()));
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
    async fn wait_for_gpu_pods(&self, touched: Option<&BTreeSet<String>>) -> Result<(), String> {
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
                return Err(holders.join(", "));
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

    fn cmd(ok: bool, output: &str) -> Command {
        Command {
            ok,
            output: output.into(),
        }
    }

    #[test]
    fn an_infeasible_config_fails_without_draining_and_an_applied_one_needs_nothing() {
        let infeasible = cmd(false, "2x 7g.80gb needs 14 of 7 compute slices");
        assert_eq!(
            next_step(&infeasible, &infeasible),
            Next::Invalid("2x 7g.80gb needs 14 of 7 compute slices".into())
        );
        assert_eq!(
            next_step(&cmd(true, ""), &cmd(true, "")),
            Next::AlreadyApplied
        );
        assert_eq!(
            next_step(&cmd(true, ""), &cmd(false, "GPU 0 differs")),
            Next::Apply
        );
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
mod child_tests {
    use super::*;

    #[tokio::test]
    async fn a_child_that_overruns_its_deadline_is_killed_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = dir.path().join("slow-gpuops");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho $$ > {}\nexec sleep 30\n",
                pid_file.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let args = ["mig".to_string(), "apply".to_string()];
        let done = gpuops(&script, &args, Duration::from_millis(500)).await;
        assert!(!done.ok);
        assert!(
            done.output
                .contains("did not finish within 500ms and was killed"),
            "{}",
            done.output
        );
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Gone, or a zombie waiting for tokio's reaper: either way no longer running.
        let running = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| !r.trim_start().starts_with('Z'))
            })
        };
        while running() {
            assert!(Instant::now() < deadline, "child {pid} still runs");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let quick = gpuops(
            std::path::Path::new("/bin/true"),
            &args,
            Duration::from_secs(10),
        )
        .await;
        assert!(quick.ok, "{}", quick.output);
    }
}
