//! gpuops-serve: the one HTTP/1 server of gpuops (the agent's metrics, the scheduler extender).
//!
//! Binding is separate from serving so that a taken port fails the start with a clear message
//! before anything else runs. While serving: a client that does not finish its request headers
//! within [`Options::header_read_timeout`] is disconnected (a slow or stuck client cannot pin a
//! connection forever); `/healthz` and `/readyz` answer from [`Probes`] latches that the caller
//! sets; on shutdown the listener closes, readiness drops, requests being answered finish, idle
//! keep-alive connections and requests still arriving are closed (a client that never finishes
//! its headers cannot hold shutdown up), and after [`Options::drain_timeout`] whatever is left is
//! dropped, so shutdown is bounded.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::watch;

pub use bytes;
pub use http_body_util;
pub use hyper;

/// How long a connection with no request being answered may still flush at shutdown.
const FLUSH_GRACE: Duration = Duration::from_millis(50);

/// The body every handler answers with.
pub type Body = Full<Bytes>;

/// Failures of the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen for {what} on {address} ({hint}): {source}")]
    Bind {
        what: String,
        address: SocketAddr,
        hint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {what} socket: {source}")]
    Socket {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// How the server treats slow clients and shutdown.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// A connection whose request headers are not complete this long after it starts waiting for
    /// them is closed (also between keep-alive requests).
    pub header_read_timeout: Duration,
    /// How long shutdown waits for requests in flight before dropping their connections.
    pub drain_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        // Prometheus scrapes and kube-scheduler calls send their headers at once; 10 s is far
        // beyond any honest client and well below a pod's termination grace period.
        Options {
            header_read_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// Liveness and readiness latches, set by the caller and served at `/healthz` and `/readyz`.
///
/// A new `Probes` is live and not ready: the caller says when it can answer real requests (the
/// first collection published, the informers synced). Shutdown clears readiness.
#[derive(Debug)]
pub struct Probes {
    live: AtomicBool,
    ready: AtomicBool,
}

impl Probes {
    /// Live, not yet ready.
    pub fn new() -> Arc<Probes> {
        Arc::new(Probes {
            live: AtomicBool::new(true),
            ready: AtomicBool::new(false),
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Clearing liveness asks the kubelet to restart the container (a wedged loop, say).
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// The answer to a liveness probe.
    pub fn liveness(&self) -> Response<Body> {
        if self.is_live() {
            reply(StatusCode::OK, "text/plain", "ok\n")
        } else {
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not live\n")
        }
    }

    /// The answer to a readiness probe.
    pub fn readiness(&self) -> Response<Body> {
        if self.is_ready() {
            reply(StatusCode::OK, "text/plain", "ok\n")
        } else {
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", "not ready\n")
        }
    }
}

/// A bound socket, not yet serving.
#[derive(Debug)]
pub struct Listener {
    socket: std::net::TcpListener,
    what: String,
}

impl Listener {
    /// The address actually bound (port 0 picks a free one).
    pub fn local_addr(&self) -> Result<SocketAddr, ServeError> {
        self.socket
            .local_addr()
            .map_err(|source| ServeError::Socket {
                what: self.what.clone(),
                source,
            })
    }
}

/// Binds `address` for `what` (`metrics`, `the scheduler`); the error says `hint`, e.g. which flag
/// picks another port.
pub fn bind(address: SocketAddr, what: &str, hint: &str) -> Result<Listener, ServeError> {
    let socket = std::net::TcpListener::bind(address).map_err(|source| ServeError::Bind {
        what: what.to_string(),
        address,
        hint: hint.to_string(),
        source,
    })?;
    socket
        .set_nonblocking(true)
        .map_err(|source| ServeError::Socket {
            what: what.to_string(),
            source,
        })?;
    Ok(Listener {
        socket,
        what: what.to_string(),
    })
}

/// Serves every connection with `handle` (and the probes) until `shutdown` turns true or its
/// sender goes away, then drains as [`Options`] says.
pub async fn serve<F, Fut>(
    listener: Listener,
    probes: Arc<Probes>,
    options: Options,
    handle: F,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ServeError>
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let what = listener.what.clone();
    let socket = tokio::net::TcpListener::from_std(listener.socket)
        .map_err(|source| ServeError::Socket { what, source })?;
    let handle = Arc::new(handle);
    let mut connections = tokio::task::JoinSet::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    loop {
        tokio::select! {
            // Err (the sender is gone) means the same; the guard is dropped before the await ends.
            _ = async { shutdown.wait_for(|stop| *stop).await.map(|_| ()) } => break,
            // Reap finished connections so the set does not grow with every scrape.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = socket.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors and the like: back off instead of spinning.
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let answering = Arc::new(AtomicUsize::new(0));
                let service = {
                    let (handle, probes, answering) =
                        (Arc::clone(&handle), Arc::clone(&probes), Arc::clone(&answering));
                    hyper::service::service_fn(move |req: Request<Incoming>| {
                        let (probes, handle) = (Arc::clone(&probes), Arc::clone(&handle));
                        let answering = Arc::clone(&answering);
                        answering.fetch_add(1, Ordering::SeqCst);
                        async move {
                            let response = match probe(&req) {
                                Some(Probe::Live) => probes.liveness(),
                                Some(Probe::Ready) => probes.readiness(),
                                None => handle(req).await,
                            };
                            answering.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    })
                };
                let connection = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let mut stop = shutdown.clone();
                connections.spawn(async move {
                    tokio::pin!(connection);
                    tokio::select! {
                        // A client that hangs up or times out is its own business.
                        _ = connection.as_mut() => return,
                        _ = async { stop.wait_for(|stop| *stop).await.map(|_| ()) } => {}
                    }
                    // No more requests on this connection; an idle one closes at once.
                    connection.as_mut().graceful_shutdown();
                    if answering.load(Ordering::SeqCst) > 0 {
                        // A request is being answered: let it finish (the drain timeout bounds it).
                        let _ = connection.await;
                    } else {
                        // Idle, or a request still arriving (hyper would wait for its headers):
                        // only a response that was just answered may still need flushing.
                        let _ = tokio::time::timeout(FLUSH_GRACE, connection).await;
                    }
                });
            }
        }
    }
    probes.set_ready(false);
    drop(socket);
    let drained = tokio::time::timeout(options.drain_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            drain_timeout = ?options.drain_timeout,
            "requests still being answered after the drain timeout; closing their connections"
        );
    }
    connections.shutdown().await;
    Ok(())
}

enum Probe {
    Live,
    Ready,
}

fn probe<B>(req: &Request<B>) -> Option<Probe> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return None;
    }
    match req.uri().path() {
        "/healthz" | "/livez" => Some(Probe::Live),
        "/readyz" => Some(Probe::Ready),
        _ => None,
    }
}

/// A response with a status, a content type and a body.
pub fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Resolves on Ctrl-C or SIGTERM (what a pod's container gets on deletion).
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
