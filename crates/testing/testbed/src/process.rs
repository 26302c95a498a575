//! A child process with its log in a file, stopped (SIGTERM, then SIGKILL) when dropped.
//!
//! Every process is also recorded in the run directory ([`RUN_DIR_ENV`], set by scripts/test) until
//! it has exited, so that the script can name and stop exactly what a crashed test left running
//! (instead of matching command lines, which also hits clusters others run from the same cache).

use crate::BedError;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming the directory where test-bed processes are recorded.
pub const RUN_DIR_ENV: &str = "GPUOPS_TESTBED_RUN_DIR";

/// A running process of the test bed.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
    record: Option<PathBuf>,
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

impl Managed {
    /// Starts `command` with stdout and stderr going to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Managed, BedError> {
        let out = File::create(log)
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
        Ok(Managed {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            record,
        })
    }

    /// The last lines of the log, for error messages.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// An error if the process already exited.
    pub fn check_alive(&mut self) -> Result<(), BedError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        match child.try_wait() {
            Ok(Some(status)) => Err(BedError::Exited {
                what: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: self.tail(20),
            }),
            _ => Ok(()),
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the process: SIGTERM, up to 5 s to exit, then SIGKILL.
    pub fn stop(&mut self) {
        self.stop_within(Duration::from_secs(5));
        self.forget();
    }

    /// The run-directory record goes once the process has been reaped.
    fn forget(&mut self) {
        if self.child.is_none()
            && let Some(file) = self.record.take()
        {
            let _ = std::fs::remove_file(file);
        }
    }

    fn stop_within(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            terminate(&mut child, grace);
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.forget();
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop();
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
}
