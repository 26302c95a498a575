//! Every daemon of a node by name, for the agent: prepare and unprepare call these, and either
//! may come twice or after an agent restart.

use crate::MpsError;
use crate::control::send;
use crate::layout::{ContainerEdits, DaemonSpec, Dirs};
use crate::supervisor::{Config, Daemon, State};
use std::collections::BTreeMap;
use tokio::sync::{Mutex, watch};

/// The node's supervised daemons. One lock over all: a start takes at most the start timeout,
/// and the kubelet prepares a node's claims a few at a time.
#[derive(Debug)]
pub struct Daemons {
    config: Config,
    shutdown: watch::Receiver<bool>,
    running: Mutex<BTreeMap<String, (DaemonSpec, Daemon)>>,
}

impl Daemons {
    /// Daemons run with `config` until released or until `shutdown` turns true.
    pub fn new(config: Config, shutdown: watch::Receiver<bool>) -> Daemons {
        Daemons {
            config,
            shutdown,
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// The daemon of `spec` runs, and this is what its containers get. Idempotent: the same spec
    /// again returns the running daemon's edits; a changed spec under the same name replaces
    /// the daemon (MPS takes new defaults only for servers it starts later).
    pub async fn ensure(&self, spec: DaemonSpec) -> Result<ContainerEdits, MpsError> {
        let mut running = self.running.lock().await;
        if let Some((had, daemon)) = running.get(&spec.name)
            && *had == spec
            && daemon.status().borrow().state != State::Stopped
        {
            return Ok(daemon.container_edits());
        }
        if let Some((_, old)) = running.remove(&spec.name) {
            old.release().await;
        }
        let daemon =
            Daemon::start(self.config.clone(), spec.clone(), self.shutdown.clone()).await?;
        let edits = daemon.container_edits();
        running.insert(spec.name.clone(), (spec, daemon));
        Ok(edits)
    }

    /// Quits daemon `name` and removes its directory. A name this process never started (an
    /// unprepare after an agent restart) still gets `quit` on its pipe, so nothing is left
    /// running; one with nothing there is no error.
    pub async fn release(&self, name: &str) -> Result<(), MpsError> {
        let dirs = Dirs::new(&self.config.root, name)?;
        let had = self.running.lock().await.remove(name);
        match had {
            Some((_, daemon)) => daemon.release().await,
            None => {
                if dirs.pipe.exists() {
                    let quit = send(
                        &self.config.binary,
                        &dirs,
                        &[],
                        "quit",
                        self.config.command_timeout,
                    )
                    .await;
                    if let Err(e) = quit {
                        tracing::debug!(daemon = name, error = %e, "no MPS control daemon to quit");
                    }
                }
                match tokio::fs::remove_dir_all(&dirs.base).await {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(MpsError::Dir {
                            dir: dirs.base,
                            source: e,
                        });
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The names of the daemons this process supervises.
    pub async fn names(&self) -> Vec<String> {
        self.running.lock().await.keys().cloned().collect()
    }
}
