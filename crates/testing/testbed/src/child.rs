//! A process a test starts (`gpuops agent`, the extender, Prometheus, ...) with its stdout and
//! stderr in one log file: the test waits for lines or other conditions on that output, and the
//! process is stopped when the guard is dropped (also when the test panics): SIGTERM, then up to
//! [`GRACE`] for it to exit, then SIGKILL.
//!
//! Like the test bed's own processes it is recorded in the run directory
//! ([`crate::RUN_DIR_ENV`]) until it has exited, so scripts/test can stop what a killed test run
//! left behind.

use crate::BedError;
use crate::process::{record, send, terminate};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process has to exit after SIGTERM before it gets SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How often waits look at the log and the process again.
const POLL: Duration = Duration::from_millis(50);

/// Lines of the log quoted in errors.
const TAIL_LINES: usize = 40;

/// A running child process, stopped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    /// Its exit status once reaped.
    status: Option<ExitStatus>,
    log: PathBuf,
    /// The directory holding the log when the caller gave none.
    _dir: Option<tempfile::TempDir>,
    /// Complete lines [`ChildGuard::next_line`] has gone past.
    consumed: usize,
    record: Option<PathBuf>,
}

impl ChildGuard {
    /// Starts `command` with stdin closed and stdout and stderr going to `log` (created anew).
    pub fn spawn(name: &str, command: Command, log: &Path) -> Result<ChildGuard, BedError> {
        ChildGuard::spawn_in(name, command, log.to_path_buf(), None)
    }

    /// Like [`ChildGuard::spawn`], with the log in a temporary directory of its own.
    pub fn spawn_temp(name: &str, command: Command) -> Result<ChildGuard, BedError> {
        let dir = tempfile::tempdir().map_err(|e| BedError::io("creating a log directory", e))?;
        let log = dir.path().join("output.log");
        ChildGuard::spawn_in(name, command, log, Some(dir))
    }

    fn spawn_in(
        name: &str,
        mut command: Command,
        log: PathBuf,
        dir: Option<tempfile::TempDir>,
    ) -> Result<ChildGuard, BedError> {
        let out = std::fs::File::create(&log)
            .map_err(|e| BedError::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| BedError::io(format!("opening {}", log.display()), e))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| BedError::Spawn {
                what: name.to_string(),
                source,
            })?;
        let record = record(child.id(), name);
        Ok(ChildGuard {
            name: name.to_string(),
            child,
            status: None,
            log,
            _dir: dir,
            consumed: 0,
            record,
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything it wrote so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its output, for failure messages.
    pub fn tail(&self) -> String {
        let text = self.output();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(TAIL_LINES)..].join("\n")
    }

    /// Its exit status if it has exited (reaping it), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited(status);
        }
        self.status
    }

    fn exited(&mut self, status: ExitStatus) {
        self.status = Some(status);
        if let Some(file) = self.record.take() {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Polls `check` on its output until it gives a value; an error when the process exits first
    /// (with one last look at what it wrote) or when `timeout` passes.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, BedError> {
        let deadline = Instant::now() + timeout;
        loop {
            let exited = self.try_wait();
            if let Some(found) = check(&self.output()) {
                return Ok(found);
            }
            if let Some(status) = exited {
                return Err(BedError::Exited {
                    what: format!("{} (waiting for {what})", self.name),
                    status: status.to_string(),
                    log: self.log.clone(),
                    tail: self.tail(),
                });
            }
            if Instant::now() >= deadline {
                return Err(BedError::Timeout {
                    what: format!(
                        "{what} from {}; its log ({}) ends with:\n{}",
                        self.name,
                        self.log.display(),
                        self.tail()
                    ),
                    seconds: timeout.as_secs(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// The first complete line of its output that contains `needle`.
    pub fn wait_for_line(&mut self, needle: &str, timeout: Duration) -> Result<String, BedError> {
        self.wait_for(&format!("a line with {needle:?}"), timeout, |out| {
            complete_lines(out)
                .find(|l| l.contains(needle))
                .map(str::to_string)
        })
    }

    /// The next complete line containing `needle` after the last line this returned: for a
    /// message that repeats (each recovery prints "watching 8 GPUs" again).
    pub fn next_line(&mut self, needle: &str, timeout: Duration) -> Result<String, BedError> {
        let from = self.consumed;
        let (at, line) = self.wait_for(&format!("a new line with {needle:?}"), timeout, |out| {
            complete_lines(out)
                .enumerate()
                .skip(from)
                .find(|(_, l)| l.contains(needle))
                .map(|(i, l)| (i, l.to_string()))
        })?;
        self.consumed = at + 1;
        Ok(line)
    }

    /// Sends `signal` (a name `kill -s` takes: TERM, KILL, ...) to the process.
    pub fn signal(&self, signal: &str) {
        send(signal, &self.child.id().to_string());
    }

    /// Waits up to `timeout` for the process to exit by itself; its status, or None if it has not.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
        }
    }

    /// Stops it: SIGTERM, up to `grace` for it to exit, then SIGKILL. Its exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            let status = terminate(&mut self.child, grace);
            if let Some(status) = status {
                self.exited(status);
            }
        }
        self.status
    }

    /// Kills it at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exited(status);
            }
        }
        self.status
    }

    /// Kills its whole process group at once (SIGKILL), as a node crash would: also what it
    /// started. The command must have made it a group leader (`CommandExt::process_group(0)`).
    pub fn kill_group(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            send("KILL", &format!("-{}", self.child.id()));
        }
        self.kill()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.terminate(GRACE);
    }
}

/// The lines of `out` that end with a newline: a line still being written is not matched yet.
fn complete_lines(out: &str) -> impl Iterator<Item = &str> {
    let whole = out.rfind('\n').map_or("", |end| &out[..end]);
    whole.lines()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn lines_are_matched_once_complete_and_next_line_moves_on() {
        assert_eq!(
            complete_lines("a\nb\npart").collect::<Vec<_>>(),
            vec!["a", "b"]
        );
        assert_eq!(complete_lines("no newline yet").count(), 0);
        let mut c = ChildGuard::spawn_temp(
            "printer",
            sh("echo 'ready 1'; echo other >&2; echo 'ready 2'; exec sleep 30"),
        )
        .unwrap();
        let t = Duration::from_secs(10);
        assert_eq!(c.next_line("ready", t).unwrap(), "ready 1");
        assert_eq!(c.next_line("ready", t).unwrap(), "ready 2");
        assert_eq!(c.wait_for_line("ready", t).unwrap(), "ready 1");
        assert_eq!(c.wait_for_line("other", t).unwrap(), "other");
        // Nothing more comes: the wait ends at its deadline, naming what it waited for.
        let e = c
            .next_line("ready", Duration::from_millis(200))
            .unwrap_err();
        assert!(e.to_string().contains("\"ready\""), "{e}");
    }

    #[test]
    fn a_process_that_exits_first_fails_the_wait_with_its_output() {
        let mut c = ChildGuard::spawn_temp("quitter", sh("echo bye; exit 3")).unwrap();
        let e = c
            .wait_for_line("never", Duration::from_secs(30))
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("exited early") && text.contains("bye"),
            "{text}"
        );
        assert_eq!(c.try_wait().and_then(|s| s.code()), Some(3));
    }

    #[test]
    fn terminate_waits_for_the_exit_after_sigterm() {
        // Exits by itself on TERM: no SIGKILL, and no waiting out the grace period.
        let mut c = ChildGuard::spawn_temp(
            "polite",
            sh("trap 'echo bye; exit 7' TERM; echo up; while :; do sleep 0.05; done"),
        )
        .unwrap();
        c.wait_for_line("up", Duration::from_secs(10)).unwrap();
        let started = Instant::now();
        let status = c.terminate(Duration::from_secs(20)).unwrap();
        assert_eq!(status.code(), Some(7));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(c.output().contains("bye"));
    }

    #[test]
    fn terminate_kills_what_ignores_sigterm_after_the_grace() {
        let mut c =
            ChildGuard::spawn_temp("stubborn", sh("trap '' TERM; echo up; exec sleep 60")).unwrap();
        c.wait_for_line("up", Duration::from_secs(10)).unwrap();
        let status = c.terminate(Duration::from_millis(300)).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "{status}");
        assert!(c.wait_exit(Duration::ZERO).is_some());
    }
}
