//! Keeps the DRA socket and the registration socket served until shutdown, recreating either
//! when it vanishes.

use crate::PluginConfig;
use crate::error::DraPluginError;
use crate::preparer::ClaimPreparer;
use crate::registration::{RegistrationService, RegistrationState};
use crate::service::{DraService, DraV1, DraV1beta1};
use gpuops_kubelet_api::dra::{v1, v1beta1};
use gpuops_kubelet_api::pluginregistration::v1::registration_server::RegistrationServer;
use gpuops_kubelet_api::unix;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// How often the sockets are checked where inotify does not wake the loop first.
const TICK: Duration = Duration::from_millis(500);

/// A failed bind (the directory unwritable, or gone with its mount) is retried from 500 ms,
/// doubling to 30 s, with jitter: every node's agent may hit the same cause at once.
const BIND_RETRY: gpuops_backoff::Policy =
    gpuops_backoff::Policy::new(Duration::from_millis(500), Duration::from_secs(30)).jitter(0.2);

/// After the drain, cancelled calls and their connections get this long to end.
const AFTER_CANCEL: Duration = Duration::from_secs(2);

/// One socket's server.
struct Running {
    socket: PathBuf,
    /// (device, inode) of the socket we bound: another file at the path is not ours.
    identity: Option<(u64, u64)>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    /// Whether the server must be started again: it ended, or its socket was removed or
    /// replaced.
    fn lost(&self) -> bool {
        self.task.is_finished() || socket_identity(&self.socket) != self.identity
    }
}

/// Serves the DRA plugin of `config` over `preparer` until `shutdown` turns true.
pub async fn serve<P: ClaimPreparer>(
    config: PluginConfig,
    preparer: Arc<P>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), DraPluginError> {
    let (state, _) = watch::channel(RegistrationState::Waiting);
    serve_reporting(config, preparer, shutdown, state).await
}

/// [`serve`], publishing on `state` what the kubelet said about the registration (reset to
/// `Waiting` whenever the registration socket is recreated). The agent's readiness reads it.
pub async fn serve_reporting<P: ClaimPreparer>(
    config: PluginConfig,
    preparer: Arc<P>,
    mut shutdown: watch::Receiver<bool>,
    state: watch::Sender<RegistrationState>,
) -> Result<(), DraPluginError> {
    for dir in [&config.registry_dir, &config.plugin_dir] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|source| DraPluginError::PluginDir {
                dir: dir.clone(),
                source,
            })?;
    }
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let service = Arc::new(DraService::new(preparer, cancel_rx));
    let mut dra: Option<Running> = None;
    let mut reg: Option<Running> = None;
    let mut retry = BIND_RETRY.start();
    let mut retry_at: Option<Instant> = None;
    let mut logged: Option<String> = None;
    let mut events = watch_dirs(&[&config.registry_dir, &config.plugin_dir]);
    loop {
        if retry_at.is_none_or(|t| Instant::now() >= t) {
            match ensure(&config, &service, &mut dra, &mut reg, &state).await {
                Ok(()) => {
                    retry.reset();
                    retry_at = None;
                    logged = None;
                }
                Err(e) => {
                    let wait = retry.failed();
                    retry_at = Some(Instant::now() + wait);
                    let message = e.to_string();
                    // A lasting failure is logged once, not at every retry.
                    if logged.as_deref() != Some(&message) {
                        tracing::error!(retry_in = ?wait, "{message}");
                        logged = Some(message);
                    }
                }
            }
        }
        let wait = retry_at.map_or(TICK, |t| {
            t.saturating_duration_since(Instant::now()).min(TICK)
        });
        tokio::select! {
            _ = shutdown.changed() => {}
            () = tokio::time::sleep(wait) => {}
            () = dir_changed(&mut events) => {}
        }
        if *shutdown.borrow() {
            break;
        }
    }
    // The registration goes first so the kubelet stops sending calls, then the DRA server
    // drains what is in flight.
    let servers: Vec<Running> = [reg.take(), dra.take()].into_iter().flatten().collect();
    stop_all(servers, config.drain, &cancel_tx).await;
    state.send_replace(RegistrationState::Waiting);
    Ok(())
}

/// Starts whichever server is missing or lost. A restarted DRA server restarts the
/// registration too, so the kubelet registers the driver again and dials the new socket.
async fn ensure<P: ClaimPreparer>(
    config: &PluginConfig,
    service: &Arc<DraService<P>>,
    dra: &mut Option<Running>,
    reg: &mut Option<Running>,
    state: &watch::Sender<RegistrationState>,
) -> Result<(), DraPluginError> {
    if dra.as_ref().is_none_or(Running::lost) {
        if let Some(old) = dra.take() {
            tracing::warn!(socket = %old.socket.display(), "DRA socket lost: serving it again");
            stop(old, Duration::ZERO).await;
        }
        *dra = Some(start_dra(&config.dra_socket(), service)?);
        if let Some(old) = reg.take() {
            stop(old, Duration::ZERO).await;
        }
    }
    if reg.as_ref().is_none_or(Running::lost) {
        if let Some(old) = reg.take() {
            tracing::warn!(socket = %old.socket.display(), "registration socket lost (kubelet restart?): registering again");
            stop(old, Duration::ZERO).await;
        }
        state.send_replace(RegistrationState::Waiting);
        let socket = config.registration_socket();
        let registration =
            RegistrationService::new(&config.driver, &config.dra_socket(), state.clone());
        *reg = Some(start(
            "the DRA plugin registration",
            &socket,
            tonic::transport::Server::builder().add_service(RegistrationServer::new(registration)),
        )?);
        tracing::info!(socket = %socket.display(), driver = %config.driver, "waiting for the kubelet to register the DRA driver");
    }
    Ok(())
}

fn start_dra<P: ClaimPreparer>(
    socket: &Path,
    service: &Arc<DraService<P>>,
) -> Result<Running, DraPluginError> {
    let router = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(DraV1(
            Arc::clone(service),
        )))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1beta1(Arc::clone(service)),
        ));
    start("the DRA service", socket, router)
}

fn start(
    what: &'static str,
    socket: &Path,
    router: tonic::transport::server::Router,
) -> Result<Running, DraPluginError> {
    // The directory may have gone with the socket (a cleanup of the whole registry).
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|source| DraPluginError::PluginDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    // A socket file left by a crashed agent would make bind fail.
    let _ = std::fs::remove_file(socket);
    let listener =
        tokio::net::UnixListener::bind(socket).map_err(|source| DraPluginError::Listen {
            what,
            socket: socket.to_path_buf(),
            source,
        })?;
    let identity = socket_identity(socket);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let name = socket.to_path_buf();
    let task = tokio::spawn(async move {
        let result = router
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                let _ = stop_rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(socket = %name.display(), "{what} stopped: {e}");
        }
    });
    Ok(Running {
        socket: socket.to_path_buf(),
        identity,
        stop: Some(stop_tx),
        task,
    })
}

/// Stops one server, giving in-flight calls `drain`; its socket is removed if it is still ours.
async fn stop(mut r: Running, drain: Duration) {
    if let Some(tx) = r.stop.take() {
        let _ = tx.send(());
    }
    let _ = tokio::time::timeout(drain, &mut r.task).await;
    r.task.abort();
    remove_if_ours(&r);
}

/// Stops every server at shutdown: in-flight calls get `drain` to finish, then they are
/// cancelled (a hung preparer must not hold the agent's exit), then the servers are aborted.
async fn stop_all(servers: Vec<Running>, drain: Duration, cancel: &watch::Sender<bool>) {
    let mut servers = servers;
    for r in &mut servers {
        if let Some(tx) = r.stop.take() {
            let _ = tx.send(());
        }
    }
    let finished = |servers: &[Running]| servers.iter().all(|r| r.task.is_finished());
    join_until(&mut servers, tokio::time::Instant::now() + drain).await;
    if !finished(&servers) {
        tracing::warn!(drain = ?drain, "DRA calls still running at shutdown: cancelling them");
        cancel.send_replace(true);
        join_until(&mut servers, tokio::time::Instant::now() + AFTER_CANCEL).await;
    }
    for r in servers {
        r.task.abort();
        remove_if_ours(&r);
    }
}

/// Waits for every server task to end, until `deadline`.
async fn join_until(servers: &mut [Running], deadline: tokio::time::Instant) {
    for r in servers {
        // A JoinHandle must not be polled again once it has returned.
        if !r.task.is_finished() {
            let _ = tokio::time::timeout_at(deadline, &mut r.task).await;
        }
    }
}

/// Removes the socket file unless another process replaced it since we bound it.
fn remove_if_ours(r: &Running) {
    if r.identity.is_some() && socket_identity(&r.socket) == r.identity {
        let _ = std::fs::remove_file(&r.socket);
    }
}

/// (device, inode) of a file: a recreated socket has a new identity.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Wakes the loop when an entry of either directory is created or removed, so a vanished
/// socket is served again at once. `None` (inotify unavailable): the tick alone.
fn watch_dirs(dirs: &[&PathBuf]) -> Option<inotify::EventStream<Vec<u8>>> {
    let watched = inotify::Inotify::init().and_then(|ino| {
        for dir in dirs {
            ino.watches().add(
                dir,
                inotify::WatchMask::CREATE
                    | inotify::WatchMask::DELETE
                    | inotify::WatchMask::MOVED_FROM
                    | inotify::WatchMask::MOVED_TO,
            )?;
        }
        ino.into_event_stream(vec![0u8; 4096])
    });
    match watched {
        Ok(stream) => Some(stream),
        Err(e) => {
            tracing::warn!(
                "cannot watch the DRA plugin directories ({e}); checking the sockets every {TICK:?}"
            );
            None
        }
    }
}

/// The next change in a watched directory; never, without a watch.
async fn dir_changed(events: &mut Option<inotify::EventStream<Vec<u8>>>) {
    use tokio_stream::StreamExt;
    let ended = match events.as_mut() {
        Some(stream) => stream.next().await.is_none(),
        None => return std::future::pending().await,
    };
    if ended {
        *events = None;
    }
}
