//! A child process with its log in a file, stopped (SIGTERM, then SIGKILL) when dropped.

use crate::BedError;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running process of the test bed.
#[derive(Debug)]
pub struct Managed {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
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
        Ok(Managed {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
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
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        self.stop();
    }
}
