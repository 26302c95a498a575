//! Keeps one server per advertised resource running and registered, across kubelet restarts and
//! resource changes.

use crate::error::PluginError;
use crate::published::Published;
use crate::register::RegistrationBackoff;
use crate::service::PluginService;
use gpuops_kubelet_api::deviceplugin::v1beta1::{
    DevicePluginOptions, RegisterRequest, device_plugin_server::DevicePluginServer,
    registration_client::RegistrationClient,
};
use gpuops_kubelet_api::{KUBELET_SOCKET, VERSION, unix};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// One resource's server.
struct Running {
    socket: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// The kubelet socket (device, inode) we registered with; `None` until registered.
    registered_with: Option<(u64, u64)>,
    /// Rejected or failed registrations: when to try again and what was last logged.
    backoff: RegistrationBackoff,
}

/// How often the supervisor looks for kubelet restarts and resource changes.
const TICK: Duration = Duration::from_millis(500);

/// Serves every resource of `feed` from `plugin_dir` until `shutdown` fires, re-registering after
/// kubelet restarts and following resource changes without a restart.
pub async fn serve(
    plugin_dir: PathBuf,
    feed: watch::Receiver<Arc<Published>>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    serve_reporting(plugin_dir, feed, shutdown, Arc::new(AtomicBool::new(false))).await
}

/// [`serve`], keeping `registered` true exactly while the kubelet's socket is there and every
/// advertised resource is registered with that kubelet (the one whose socket is there now: a
/// restarted kubelet has forgotten us until we register again). The agent's readiness reads it.
pub async fn serve_reporting(
    plugin_dir: PathBuf,
    feed: watch::Receiver<Arc<Published>>,
    mut shutdown: watch::Receiver<bool>,
    registered: Arc<AtomicBool>,
) -> Result<(), PluginError> {
    tokio::fs::create_dir_all(&plugin_dir)
        .await
        .map_err(|source| PluginError::PluginDir {
            dir: plugin_dir.clone(),
            source,
        })?;
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut waiting_logged = false;
    let mut dir_events = watch_dir(&plugin_dir);
    'serve: loop {
        let current = feed.borrow().clone();
        let kubelet = socket_identity(&plugin_dir.join(KUBELET_SOCKET));
        if kubelet.is_none() && !waiting_logged {
            tracing::warn!(dir = %plugin_dir.display(), "waiting for the kubelet: no {KUBELET_SOCKET} yet");
        }
        waiting_logged = kubelet.is_none();
        // Resources that went away (MIG layout or config change).
        let wanted: Vec<&str> = current.resources.iter().map(|r| r.name.as_str()).collect();
        let gone: Vec<String> = running
            .keys()
            .filter(|k| !wanted.contains(&k.as_str()))
            .cloned()
            .collect();
        for name in gone {
            if let Some(r) = running.remove(&name) {
                tracing::info!(resource = %name, "no longer advertised: stopping its server");
                stop(r).await;
            }
        }
        for resource in &current.resources {
            let socket = plugin_dir.join(&resource.socket_name);
            let needs_restart = match running.get(&resource.name) {
                None => true,
                // The kubelet deletes every socket in the directory when it restarts.
                Some(r) => r.task.is_finished() || !socket.exists(),
            };
            if needs_restart {
                if let Some(old) = running.remove(&resource.name) {
                    tracing::info!(resource = %resource.name, "kubelet restarted or socket lost: serving again");
                    stop(old).await;
                }
                match start(&resource.name, &socket, feed.clone()) {
                    Ok(r) => {
                        running.insert(resource.name.clone(), r);
                    }
                    Err(e) => {
                        tracing::error!("{e}");
                        continue;
                    }
                }
            }
            if let (Some(r), Some(k)) = (running.get_mut(&resource.name), kubelet)
                && r.registered_with != Some(k)
                && r.backoff.due(k, std::time::Instant::now())
            {
                // A kubelet that accepts and does not answer holds a registration for up to its
                // timeouts (15 s); shutdown does not wait for it.
                let registration = tokio::select! {
                    biased;
                    _ = shutdown.wait_for(|s| *s) => break 'serve,
                    r = register(&plugin_dir, &resource.name, &resource.socket_name) => r,
                };
                match registration {
                    Ok(()) => {
                        tracing::info!(resource = %resource.name, socket = %socket.display(), "registered with the kubelet");
                        r.registered_with = Some(k);
                        r.backoff.succeeded();
                    }
                    Err(e) => {
                        let message = e.to_string();
                        let (wait, first) = r.backoff.failed(&message, std::time::Instant::now());
                        // Once per kind of failure, not once per attempt.
                        if first {
                            tracing::warn!(resource = %resource.name, error = %message, retry_in = ?wait, "{message}; retrying with backoff");
                        } else {
                            tracing::debug!(resource = %resource.name, error = %message, retry_in = ?wait, "registration failed again");
                        }
                    }
                }
            }
        }
        registered.store(
            all_registered(kubelet, &current, &running),
            Ordering::Relaxed,
        );
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(TICK) => {}
            _ = dir_changed(&mut dir_events) => {}
        }
        if *shutdown.borrow() {
            break;
        }
    }
    registered.store(false, Ordering::Relaxed);
    for (_, r) in std::mem::take(&mut running) {
        stop(r).await;
    }
    Ok(())
}

/// Whether the kubelet whose socket is `kubelet` knows every resource of `current`.
fn all_registered(
    kubelet: Option<(u64, u64)>,
    current: &Published,
    running: &BTreeMap<String, Running>,
) -> bool {
    kubelet.is_some_and(|k| {
        current.resources.iter().all(|resource| {
            running
                .get(&resource.name)
                .is_some_and(|r| r.registered_with == Some(k))
        })
    })
}

/// Wakes the loop as soon as an entry of the plugin directory is created or removed. A
/// restarted kubelet rejects for good every pod needing our devices that it syncs before we
/// registered with it again (UnexpectedAdmissionError), so its new `kubelet.sock` is acted on
/// at once rather than at the next tick. `None` (inotify unavailable, e.g. out of watches):
/// the tick alone, as before.
fn watch_dir(dir: &Path) -> Option<inotify::EventStream<Vec<u8>>> {
    let watched = inotify::Inotify::init().and_then(|ino| {
        ino.watches().add(
            dir,
            inotify::WatchMask::CREATE | inotify::WatchMask::DELETE | inotify::WatchMask::MOVED_TO,
        )?;
        ino.into_event_stream(vec![0u8; 4096])
    });
    match watched {
        Ok(stream) => Some(stream),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot watch the plugin directory ({e}); looking for kubelet restarts every {TICK:?}");
            None
        }
    }
}

/// The next change in the plugin directory; never, without a watch.
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

/// (device, inode) of a socket file: a new file after a kubelet restart has a new identity.
fn socket_identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn start(
    resource: &str,
    socket: &Path,
    feed: watch::Receiver<Arc<Published>>,
) -> Result<Running, PluginError> {
    let _ = std::fs::remove_file(socket);
    let listener =
        tokio::net::UnixListener::bind(socket).map_err(|source| PluginError::Listen {
            resource: resource.to_string(),
            socket: socket.to_path_buf(),
            source,
        })?;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let service = PluginService::new(resource.to_string(), feed);
    let name = resource.to_string();
    let task = tokio::spawn(async move {
        let result = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                let _ = stop_rx.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(resource = %name, "device plugin server stopped: {e}");
        }
    });
    Ok(Running {
        socket: socket.to_path_buf(),
        stop: Some(stop_tx),
        task,
        registered_with: None,
        backoff: RegistrationBackoff::default(),
    })
}

async fn stop(mut r: Running) {
    if let Some(tx) = r.stop.take() {
        let _ = tx.send(());
    }
    // ListAndWatch streams end with the server; do not wait forever for a stuck client.
    let _ = tokio::time::timeout(Duration::from_secs(2), &mut r.task).await;
    r.task.abort();
    let _ = std::fs::remove_file(&r.socket);
}

async fn register(plugin_dir: &Path, resource: &str, socket_name: &str) -> Result<(), PluginError> {
    let kubelet = plugin_dir.join(KUBELET_SOCKET);
    let err = |message: String| PluginError::Register {
        resource: resource.to_string(),
        kubelet: kubelet.clone(),
        message,
    };
    let channel = tokio::time::timeout(Duration::from_secs(5), unix::connect(&kubelet))
        .await
        .map_err(|_| err("timed out connecting".into()))?
        .map_err(|e| err(e.to_string()))?;
    let mut client = RegistrationClient::new(channel);
    let request = RegisterRequest {
        version: VERSION.to_string(),
        endpoint: socket_name.to_string(),
        resource_name: resource.to_string(),
        options: Some(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }),
    };
    tokio::time::timeout(Duration::from_secs(10), client.register(request))
        .await
        .map_err(|_| err("timed out".into()))?
        .map_err(|status| err(status.message().to_string()))?;
    Ok(())
}
