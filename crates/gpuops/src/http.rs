//! The small HTTP/1 server behind the agent's metrics and the scheduler extender: bind early
//! (so a taken port fails the start clearly), serve until shutdown; plus the shutdown signal.

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Binds `address` for `what`; the error says which flag picks another.
pub fn bind(address: SocketAddr, what: &str, hint: &str) -> Result<std::net::TcpListener> {
    let listener = std::net::TcpListener::bind(address)
        .with_context(|| format!("cannot listen for {what} on {address} ({hint})"))?;
    listener
        .set_nonblocking(true)
        .with_context(|| format!("setting the {what} socket non-blocking"))?;
    Ok(listener)
}

/// Serves every connection with `handle` until `shutdown` changes.
pub async fn serve<F, Fut>(
    listener: std::net::TcpListener,
    handle: F,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()>
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let listener = tokio::net::TcpListener::from_std(listener).context("serving the socket")?;
    let handle = Arc::new(handle);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    // Out of file descriptors and the like: back off instead of spinning.
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let handle = Arc::clone(&handle);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let reply = handle(req);
                        async move { Ok::<_, std::convert::Infallible>(reply.await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// A response with a status, a content type and a body.
pub fn reply(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Resolves on Ctrl-C or SIGTERM (what a DaemonSet's pod gets on deletion).
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
