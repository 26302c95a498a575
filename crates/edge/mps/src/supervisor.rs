//! One control daemon kept running: started with `-d`, its settings applied, health-checked,
//! started again with backoff when it stops answering, told to `quit` on release or shutdown.

use crate::MpsError;
use crate::control::send;
use crate::layout::{ContainerEdits, DaemonSpec, Dirs, container_edits, daemon_env};
use gpuops_backoff::Policy;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::Command;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The health check's command: NVIDIA's device plugin checks its daemons with it too.
pub const HEALTH_COMMAND: &str = "get_default_active_thread_percentage";

/// How the supervisor runs every daemon.
#[derive(Debug, Clone)]
pub struct Config {
    /// `nvidia-cuda-mps-control` (the driver's, or the simulator's stand-in).
    pub binary: PathBuf,
    /// The root of every daemon's directories, e.g. `/run/nvidia/mps`.
    pub root: PathBuf,
    pub health_every: Duration,
    /// The longest one client command may take.
    pub command_timeout: Duration,
    /// The longest `-d` may take to return and the daemon to answer after it.
    pub start_timeout: Duration,
    /// Waits between attempts to start a daemon that died or would not start.
    pub restart: Policy,
}

impl Config {
    pub fn new(binary: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Config {
        Config {
            binary: binary.into(),
            root: root.into(),
            health_every: Duration::from_secs(10),
            command_timeout: Duration::from_secs(10),
            start_timeout: Duration::from_secs(30),
            // Many daemons on a node may die together (a driver reload): jitter spreads them.
            restart: Policy::new(Duration::from_secs(1), Duration::from_secs(60)).jitter(0.2),
        }
    }
}

/// Where a daemon stands, published on [`Daemon::status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Running,
    /// It stopped answering or would not start; `error` says why, and a new start is due.
    Failed(String),
    /// Quit on release or shutdown; the supervisor has ended.
    Stopped,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub state: State,
    /// Successful starts, the first included (an adopted daemon counts as started).
    pub starts: u32,
}

/// A supervised control daemon. Dropping it without [`Daemon::release`] quits the daemon too,
/// in the background, without waiting for it.
#[derive(Debug)]
pub struct Daemon {
    dirs: Dirs,
    release: watch::Sender<bool>,
    status: watch::Receiver<Status>,
    task: JoinHandle<()>,
}

/// What the supervising task works with.
struct Run {
    config: Config,
    spec: DaemonSpec,
    dirs: Dirs,
}

impl Daemon {
    /// Starts (or adopts, when one already answers on its pipe, e.g. after an agent restart) the
    /// daemon of `spec` and applies its settings; returns once it runs, so a failure here is
    /// the caller's (a claim's prepare fails with it). Then supervises it until
    /// [`Daemon::release`] or until `shutdown` turns true, and quits it either way.
    pub async fn start(
        config: Config,
        spec: DaemonSpec,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Daemon, MpsError> {
        let dirs = Dirs::new(&config.root, &spec.name)?;
        spec.validate()?;
        if !config.binary.is_file() {
            return Err(MpsError::BinaryMissing {
                path: config.binary.clone(),
            });
        }
        for dir in [&dirs.pipe, &dirs.log, &dirs.shm] {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|source| MpsError::Dir {
                    dir: dir.clone(),
                    source,
                })?;
        }
        let run = Run {
            config,
            spec,
            dirs: dirs.clone(),
        };
        let (release, mut released) = watch::channel(false);
        tokio::select! {
            started = run.launch() => started?,
            _ = stopped(&mut shutdown, &mut released) => {
                // The start may have got as far as a daemon: none is left behind.
                run.quit().await;
                return Err(MpsError::Stopped { name: run.spec.name.clone() });
            }
        }
        let (status_tx, status) = watch::channel(Status {
            state: State::Running,
            starts: 1,
        });
        let task = tokio::spawn(run.supervise(shutdown, released, status_tx));
        Ok(Daemon {
            dirs,
            release,
            status,
            task,
        })
    }

    pub fn dirs(&self) -> &Dirs {
        &self.dirs
    }

    /// Follows the daemon's state: wait on it (`wait_for`) rather than polling.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// What a container using this daemon gets.
    pub fn container_edits(&self) -> ContainerEdits {
        container_edits(&self.dirs)
    }

    /// Quits the daemon, waits for the supervisor to end and removes `<root>/<name>`.
    pub async fn release(self) {
        // An error means the supervisor already ended (shutdown): it quit the daemon then.
        let _ = self.release.send(true);
        let _ = self.task.await;
    }
}

/// Resolves when either signal is true (or its sender is gone, which means no one can stop
/// us any more, so stopping now is the safe reading).
async fn stopped(shutdown: &mut watch::Receiver<bool>, released: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => {}
        _ = released.wait_for(|r| *r) => {}
    }
}

impl Run {
    async fn send(&self, command: &str) -> Result<String, MpsError> {
        send(
            &self.config.binary,
            &self.dirs,
            &self.spec.uuids,
            command,
            self.config.command_timeout,
        )
        .await
    }

    async fn healthy(&self) -> Result<(), MpsError> {
        self.send(HEALTH_COMMAND).await.map(|_| ())
    }

    /// A running daemon with its settings applied, adopting one that already answers.
    async fn launch(&self) -> Result<(), MpsError> {
        if self.healthy().await.is_err() {
            self.start_daemon().await?;
        }
        for command in self.spec.commands() {
            self.send(&command).await?;
        }
        tracing::info!(daemon = %self.spec.name, pipe = %self.dirs.pipe.display(), "MPS control daemon running");
        Ok(())
    }

    /// `<binary> -d`, which returns once the daemon is in the background; then waits for it to
    /// answer, within the start timeout.
    async fn start_daemon(&self) -> Result<(), MpsError> {
        let name = &self.spec.name;
        let start_failed = |detail: String| MpsError::Start {
            name: name.clone(),
            detail,
        };
        let child = Command::new(&self.config.binary)
            .arg("-d")
            .envs(daemon_env(&self.dirs, &self.spec.uuids))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| MpsError::Spawn {
                path: self.config.binary.clone(),
                source,
            })?;
        let deadline = tokio::time::Instant::now() + self.config.start_timeout;
        let output = tokio::time::timeout_at(deadline, child.wait_with_output())
            .await
            .map_err(|_| {
                start_failed(format!(
                    "`{} -d` did not return within {:?}",
                    self.config.binary.display(),
                    self.config.start_timeout
                ))
            })?
            .map_err(|e| start_failed(format!("waiting for `-d`: {e}")))?;
        if !output.status.success() {
            let said = String::from_utf8_lossy(&output.stderr).trim().to_string();
            return Err(start_failed(format!(
                "`-d` exited with {} ({said})",
                output.status
            )));
        }
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            match self.healthy().await {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(start_failed(match last {
            Some(e) => format!(
                "it did not answer within {:?}: {e}",
                self.config.start_timeout
            ),
            None => format!("it did not answer within {:?}", self.config.start_timeout),
        }))
    }

    async fn supervise(
        self,
        mut shutdown: watch::Receiver<bool>,
        mut released: watch::Receiver<bool>,
        status: watch::Sender<Status>,
    ) {
        let mut backoff = self.config.restart.start();
        let mut healthy = true;
        loop {
            let wait = if healthy {
                self.config.health_every
            } else {
                backoff.failed()
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stopped(&mut shutdown, &mut released) => break,
            }
            let outcome = if healthy {
                self.healthy().await
            } else {
                // The daemon is gone (or hung): quit whatever is left before starting another,
                // so two never serve one pipe directory.
                let _ = self.send("quit").await;
                self.launch().await
            };
            match outcome {
                Ok(()) if healthy => {}
                Ok(()) => {
                    healthy = true;
                    backoff.reset();
                    status.send_modify(|s| {
                        s.state = State::Running;
                        s.starts += 1;
                    });
                }
                Err(e) => {
                    tracing::warn!(daemon = %self.spec.name, error = %e, "MPS control daemon failed; starting it again");
                    healthy = false;
                    status.send_modify(|s| s.state = State::Failed(e.to_string()));
                }
            }
        }
        self.quit().await;
        status.send_modify(|s| s.state = State::Stopped);
    }

    /// `quit`, then waits (bounded) until it no longer answers, and removes its directories.
    async fn quit(&self) {
        if let Err(e) = self.send("quit").await {
            tracing::warn!(daemon = %self.spec.name, error = %e, "quitting the MPS control daemon");
        }
        let deadline = tokio::time::Instant::now() + self.config.command_timeout;
        while tokio::time::Instant::now() < deadline && self.healthy().await.is_ok() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        remove_dir(&self.dirs.base).await;
        // A resource's daemon sits in `<root>/<domain>/<name>`: the domain's directory goes
        // with its last daemon (removing a directory that still has one fails, and is meant to).
        if let Some(parent) = self.dirs.base.parent()
            && Some(parent) != self.dirs.shm.parent()
        {
            let _ = tokio::fs::remove_dir(parent).await;
        }
    }
}

async fn remove_dir(dir: &Path) {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(dir = %dir.display(), error = %e, "removing the MPS directory"),
    }
}
