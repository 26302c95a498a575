//! The one guard of every process the test bed or a test starts (etcd, the apiserver, the
//! kubelet, `gpuops agent`, the extender, Prometheus, ...), with its stdout and stderr in one log
//! file: the test waits for lines or other conditions on that output, and the process is stopped
//! when the guard is dropped (also when the test panics): SIGTERM, then up to [`GRACE`] for it
//! to exit, then SIGKILL.
//!
//! Every process is also recorded in the run directory ([`RUN_DIR_ENV`], set by scripts/test)
//! until it has exited, so that the script can name and stop exactly what a crashed test left
//! running (instead of matching command lines, which also hits clusters others run from the
//! same cache).

use crate::BedError;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a stopped process has to exit after SIGTERM before it gets SIGKILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How often waits look at the log and the process again.
const POLL: Duration = Duration::from_millis(50);

/// Lines of the log quoted in errors.
const TAIL_LINES: usize = 40;

/// The environment variable naming the directory where test-bed processes are recorded.
pub const RUN_DIR_ENV: &str = "GPUOPS_TESTBED_RUN_DIR";

/// A running child process, stopped on drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Child,
    /// Its exit status once reaped.
    status: Option<ExitStatus>,
    /// Stopped or killed through the guard (not an unexpected exit).
    stopped: bool,
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
            stopped: false,
            log,
            _dir: dir,
            consumed: 0,
            record,
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its pid while it has not been reaped (stopped, killed or seen exited).
    pub fn pid(&self) -> Option<u32> {
        self.status.is_none().then(|| self.child.id())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// An error naming its exit status and the end of its log if it exited by itself.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        match self.try_wait() {
            Some(status) if !self.stopped => Err(BedError::Exited {
                what: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: self.tail(),
            }),
            _ => Ok(()),
        }
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
        self.last_lines(TAIL_LINES)
    }

    /// The last `n` lines of its output.
    pub fn last_lines(&self, n: usize) -> String {
        let text = self.output();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(n)..].join("\n")
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

    /// Stops it: SIGTERM, up to [`GRACE`] for it to exit, then SIGKILL.
    pub fn stop(&mut self) {
        self.terminate(GRACE);
    }

    /// Stops it: SIGTERM, up to `grace` for it to exit, then SIGKILL. Its exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.stopped = true;
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
        self.stopped = true;
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

/// The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid
/// it names one process even after the pid is reused.
pub fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Records `pid` in the run directory (when there is one): a file named after the pid holding
/// `<start time> <what>`. Returns the file, to remove once the process is gone.
pub fn record(pid: u32, what: &str) -> Option<PathBuf> {
    record_in(&PathBuf::from(std::env::var_os(RUN_DIR_ENV)?), pid, what)
}

fn record_in(dir: &Path, pid: u32, what: &str) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).ok()?;
    let file = dir.join(format!("pid-{pid}"));
    let line = format!(
        "{} {}\n",
        start_time(pid).unwrap_or(0),
        what.replace('\n', " ")
    );
    std::fs::write(&file, line).ok()?;
    Some(file)
}

/// How often a process being stopped is looked at.
const TERMINATE_POLL: Duration = Duration::from_millis(50);

pub(crate) fn send(signal: &str, target: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", target])
        .stderr(Stdio::null())
        .status();
}

/// SIGTERM, up to `grace` for `child` to exit, then SIGKILL; reaps it. Its exit status (None
/// only if it could not be reaped).
pub(crate) fn terminate(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    send("TERM", &child.id().to_string());
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(TERMINATE_POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    let _ = child.kill();
    child.wait().ok()
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
    fn the_start_time_is_field_22_even_when_the_command_name_has_spaces_and_parens() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("4242 (truncated"), None);
        assert_eq!(parse_start_time("4242 (x) S 1 2"), None);
    }

    #[test]
    fn a_record_names_the_process_by_pid_and_start_time() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        let file = record_in(dir.path(), pid, "kube-apiserver\nsecond line").unwrap();
        assert_eq!(file, dir.path().join(format!("pid-{pid}")));
        let text = std::fs::read_to_string(&file).unwrap();
        let own = start_time(pid).unwrap();
        assert!(own > 0);
        assert_eq!(text, format!("{own} kube-apiserver second line\n"));
    }

    #[test]
    fn an_unexpected_exit_is_an_error_and_a_stop_through_the_guard_is_not() {
        let mut quitter = ChildGuard::spawn_temp("quitter", sh("echo bye; exit 3")).unwrap();
        quitter.wait_exit(Duration::from_secs(30)).unwrap();
        let e = quitter.check_alive().unwrap_err().to_string();
        assert!(e.contains("quitter") && e.contains("bye"), "{e}");
        assert_eq!(quitter.pid(), None);
        let mut sleeper = ChildGuard::spawn_temp("sleeper", sh("exec sleep 60")).unwrap();
        assert!(sleeper.check_alive().is_ok());
        assert_eq!(sleeper.pid(), Some(sleeper.id()));
        sleeper.stop();
        assert!(sleeper.check_alive().is_ok(), "stopped on purpose");
        assert_eq!(sleeper.pid(), None);
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
