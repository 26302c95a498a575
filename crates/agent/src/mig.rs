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
use gpuops_kube::{NodeWriter, now_secs, rfc3339};
use k8s_openapi::api::core::v1::Node;
use std::collections::BTreeMap;
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
}

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
    };
    // What was last applied successfully: (config name, config file text).
    let mut done: Option<(String, String)> = None;
    let mut failures = 0u32;
    let mut retry_at: Option<Instant> = None;
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
            let due = retry_at.is_none_or(|t| Instant::now() >= t);
            if changed && due {
                match flow.attempt(name).await {
                    Ok(()) => {
                        done = Some((name.clone(), text));
                        failures = 0;
                        retry_at = None;
                    }
                    Err(()) => {
                        failures += 1;
                        let wait = backoff(failures, flow.cfg.backoff_min, flow.cfg.backoff_max);
                        tracing::warn!(config = %name, attempt = failures, retry_in = ?wait, "MIG config {name}: retrying in {wait:?} (attempt {failures} failed)");
                        retry_at = Some(Instant::now() + wait);
                    }
                }
            }
        } else {
            done = None;
            retry_at = None;
            failures = 0;
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
                    retry_at = None;
                    failures = 0;
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

struct Flow {
    cfg: FlowConfig,
    node: NodeWriter,
    state: watch::Receiver<Arc<NodeState>>,
    busy: watch::Sender<bool>,
    report: watch::Sender<Option<MigReport>>,
    /// The state and reason last written.
    reported: Option<(State, String)>,
}

impl Flow {
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

    /// One try at making the GPUs match config `name`.
    async fn attempt(&mut self, name: &str) -> Result<(), ()> {
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
                self.busy.send_replace(true);
                let result = match self.wait_for_gpu_pods().await {
                    Err(holders) => Err(format!(
                        "timed out after {:?} waiting for pods using this node's GPUs to finish ({holders}); nothing was changed and the GPUs are advertised again",
                        self.cfg.drain_timeout
                    )),
                    Ok(()) => {
                        let apply = self.child(&self.mig_args("apply", name, &[])).await;
                        if apply.ok { Ok(()) } else { Err(apply.output) }
                    }
                };
                // Back to advertising, whatever happened: the agent loop republishes what the
                // driver now has.
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

    /// Waits until no pod holds one of this node's GPUs or MIG devices; `Err` names the holders
    /// at the timeout.
    async fn wait_for_gpu_pods(&self) -> Result<(), String> {
        let Some(socket) = self.cfg.pod_socket.clone() else {
            return Ok(());
        };
        let deadline = Instant::now() + self.cfg.drain_timeout;
        loop {
            let listed = tokio::time::timeout(
                Duration::from_secs(10),
                crate::podresources::list_pod_resources(&socket, None),
            )
            .await
            .unwrap_or_else(|_| Err("no answer within 10s".into()));
            let holders = match listed {
                Ok((assignments, _)) => {
                    let inv = Arc::clone(&self.state.borrow().inventory);
                    let map = gpuops_metrics::PodMap::build(assignments.iter().cloned(), &inv);
                    let mut names: Vec<String> = assignments
                        .iter()
                        .filter(|a| {
                            a.device_ids.iter().any(|id| {
                                !map.holders(gpuops_metrics::pods::strip_replica(id))
                                    .is_empty()
                            })
                        })
                        .map(|a| format!("{}/{}", a.namespace, a.pod))
                        .collect();
                    names.sort();
                    names.dedup();
                    names
                }
                // The kubelet not answering is no proof that GPUs are free.
                Err(e) => vec![format!("kubelet PodResources: {e}")],
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
        self.report.send_replace(Some(MigReport {
            labels,
            annotations,
        }));
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
