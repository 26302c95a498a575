//! gRPC over Unix domain sockets, the transport of every kubelet API.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Error};

/// Connects a gRPC channel to the Unix socket at `path`.
///
/// The connection is established before this returns. The channel reconnects
/// to the same path if the connection drops.
pub async fn connect(path: &Path) -> Result<Channel, Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is a placeholder required by tonic; the connector ignores it.
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Turns a bound Unix listener into an incoming-connection stream for
/// `tonic::transport::Server::serve_with_incoming(_shutdown)`.
pub fn incoming(listener: UnixListener) -> UnixListenerStream {
    UnixListenerStream::new(listener)
}
