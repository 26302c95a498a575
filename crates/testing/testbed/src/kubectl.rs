//! A `kubectl` handle (binary + kubeconfig) that background threads can own, and the polling loop
//! the test providers' reconcilers run in.

use crate::BedError;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `kubectl` as one identity; cheap to clone into a thread.
#[derive(Debug, Clone)]
pub(crate) struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Kubectl {
    pub(crate) fn new(bin: &Path, kubeconfig: &Path) -> Kubectl {
        Kubectl {
            bin: bin.join("kubectl"),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// `kubectl ARGS` with `input` on stdin; stdout on success, stderr in the error.
    pub(crate) fn run(&self, args: &[&str], input: Option<&str>) -> Result<String, BedError> {
        let mut child = Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| BedError::Spawn {
                what: "kubectl".into(),
                source,
            })?;
        if let Some(mut stdin) = child.stdin.take()
            && let Some(text) = input
        {
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| BedError::io("writing to kubectl", e))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| BedError::io("running kubectl", e))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(BedError::Kubectl {
                args: args.join(" "),
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// A JSON merge patch of an object's status subresource; `namespace` None: cluster-scoped.
    pub(crate) fn patch_status(
        &self,
        resource: &str,
        name: &str,
        namespace: Option<&str>,
        patch: &str,
    ) -> Result<String, BedError> {
        let mut args = vec!["patch", resource, name];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        args.extend(["--subresource=status", "--type=merge", "-p", patch]);
        self.run(&args, None)
    }

    /// `kubectl get ARGS -o json` as JSON.
    pub(crate) fn get_json(&self, args: &[&str]) -> Result<serde_json::Value, BedError> {
        let mut full = vec!["get"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["-o", "json"]);
        let text = self.run(&full, None)?;
        serde_json::from_str(&text).map_err(|e| BedError::Kubectl {
            args: full.join(" "),
            message: format!("not JSON: {e}"),
        })
    }

    /// `kubectl apply -f -` (server-side, so big objects need no last-applied annotation).
    pub(crate) fn apply(&self, yaml: &str) -> Result<String, BedError> {
        self.run(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=gpuops-testbed",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    }
}

/// A background reconcile loop: `tick` runs every `interval` until the loop is dropped. A failing
/// tick is logged and retried with a growing delay (capped at 2 s, with jitter), so an apiserver
/// that went away is not hammered and a recovered one is picked up quickly.
#[derive(Debug)]
pub(crate) struct Loop {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Loop {
    pub(crate) fn spawn(
        name: &str,
        interval: Duration,
        log: &Path,
        mut tick: impl FnMut() -> Result<(), BedError> + Send + 'static,
    ) -> Result<Loop, BedError> {
        let mut log = std::fs::File::create(log)
            .map_err(|e| BedError::io(format!("creating {}", log.display()), e))?;
        let (stop, stopped) = mpsc::channel::<()>();
        let start = Instant::now();
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut failures: u32 = 0;
                loop {
                    let delay = match tick() {
                        Ok(()) => {
                            failures = 0;
                            interval
                        }
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            let _ = writeln!(
                                log,
                                "{:>9.3}s error: {error}",
                                start.elapsed().as_secs_f64()
                            );
                            backoff(interval, failures)
                        }
                    };
                    match stopped.recv_timeout(delay) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })
            .map_err(|e| BedError::io(format!("starting the {name} thread"), e))?;
        Ok(Loop {
            stop: Some(stop),
            handle: Some(handle),
        })
    }
}

/// Twice `interval` after the first failure, doubling to 2 s, plus up to 5 % jitter: enough to
/// keep two loops from retrying in lockstep.
fn backoff(interval: Duration, failures: u32) -> Duration {
    gpuops_backoff::Policy::new(interval.saturating_mul(2), Duration::from_secs(2))
        .jitter(0.05)
        .delay(failures)
}

impl Drop for Loop {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let i = Duration::from_millis(250);
        assert!(backoff(i, 1) >= Duration::from_millis(500));
        assert!(backoff(i, 1) < Duration::from_millis(600));
        assert!(backoff(i, 30) <= Duration::from_millis(2100));
        assert!(backoff(i, 30) >= Duration::from_secs(2));
    }
}
