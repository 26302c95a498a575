//! The server over real loopback sockets: probes, slow clients, drain on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpuops_serve::hyper::StatusCode;
use gpuops_serve::{Options, Probes, bind, reply, serve};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, mpsc, oneshot, watch};

/// Well past anything the tests wait for; only reached when the behaviour is broken.
const DEADLINE: Duration = Duration::from_secs(10);

struct Running {
    address: SocketAddr,
    probes: Arc<Probes>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), gpuops_serve::ServeError>>,
}

/// A server whose handler answers `/slow` only when the test releases it (announcing on
/// `entered` that the request arrived) and everything else at once.
fn start(options: Options) -> (Running, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let listener = bind("127.0.0.1:0".parse().unwrap(), "test", "pick another").unwrap();
    let address = listener.local_addr().unwrap();
    let probes = Probes::new();
    let (stop, stopped) = watch::channel(false);
    let (entered_tx, entered) = mpsc::channel(4);
    let (release, release_rx) = mpsc::channel::<()>(4);
    let release_rx = Arc::new(Mutex::new(release_rx));
    let task = tokio::spawn(serve(
        listener,
        Arc::clone(&probes),
        options,
        move |req| {
            let entered = entered_tx.clone();
            let release = Arc::clone(&release_rx);
            async move {
                if req.uri().path() == "/slow" {
                    let _ = entered.send(()).await;
                    let _ = release.lock().await.recv().await;
                    return reply(StatusCode::OK, "text/plain", "slow answer\n");
                }
                reply(
                    StatusCode::OK,
                    "text/plain",
                    format!("{}\n", req.uri().path()),
                )
            }
        },
        stopped,
    ));
    (
        Running {
            address,
            probes,
            stop,
            task,
        },
        entered,
        release,
    )
}

/// Sends one request on a fresh connection and reads until the server closes it.
async fn get(address: SocketAddr, path: &str) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    read_to_close(&mut stream).await
}

async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .unwrap_or(0);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn readiness_follows_the_latch_and_liveness_can_be_cleared() {
    let (server, _, _) = start(Options::default());
    let ready = get(server.address, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 503"), "not ready yet: {ready}");
    assert!(ready.ends_with("not ready\n"), "{ready}");
    let live = get(server.address, "/healthz").await;
    assert!(
        live.starts_with("HTTP/1.1 200") && live.ends_with("ok\n"),
        "{live}"
    );

    server.probes.set_ready(true);
    let ready = get(server.address, "/readyz").await;
    assert!(
        ready.starts_with("HTTP/1.1 200") && ready.ends_with("ok\n"),
        "{ready}"
    );

    server.probes.set_live(false);
    let live = get(server.address, "/healthz").await;
    assert!(live.starts_with("HTTP/1.1 503"), "{live}");

    // Anything else reaches the handler.
    let other = get(server.address, "/metrics").await;
    assert!(other.ends_with("/metrics\n"), "{other}");
    server.stop.send(true).unwrap();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let options = Options {
        header_read_timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let (server, _, _) = start(options);
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: te")
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let answer = read_to_close(&mut stream).await;
    assert!(
        !answer.contains("/metrics\n"),
        "the handler never saw the request: {answer}"
    );
    assert!(
        started.elapsed() < DEADLINE,
        "closed by the header-read timeout, not by the test's deadline"
    );
    // The server still serves others.
    let other = get(server.address, "/other").await;
    assert!(other.ends_with("/other\n"), "{other}");
    server.stop.send(true).unwrap();
    server.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_answers_the_request_in_flight_and_refuses_new_connections() {
    let (server, mut entered, release) = start(Options::default());
    server.probes.set_ready(true);
    let address = server.address;
    let (done_tx, done) = oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(get(address, "/slow").await);
    });
    tokio::time::timeout(DEADLINE, entered.recv())
        .await
        .expect("the slow request reaches the handler");

    server.stop.send(true).unwrap();
    // The listener closes: new connections are refused while the slow one drains.
    let refused = tokio::time::timeout(DEADLINE, async {
        loop {
            if TcpStream::connect(address).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(refused.is_ok(), "the listener closes on shutdown");
    assert!(!server.probes.is_ready(), "shutdown clears readiness");
    assert!(
        !server.task.is_finished(),
        "serve waits for the request in flight"
    );

    release.send(()).await.unwrap();
    let answer = tokio::time::timeout(DEADLINE, done).await.unwrap().unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow answer\n"),
        "{answer}"
    );
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("serve returns once drained")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_request_that_never_finishes_is_dropped_after_the_drain_timeout() {
    let options = Options {
        drain_timeout: Duration::from_millis(200),
        ..Options::default()
    };
    let (server, mut entered, _release) = start(options);
    let mut stream = TcpStream::connect(server.address).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    tokio::time::timeout(DEADLINE, entered.recv())
        .await
        .expect("the slow request reaches the handler");
    server.stop.send(true).unwrap();
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("serve gives up on the stuck request")
        .unwrap()
        .unwrap();
    let answer = read_to_close(&mut stream).await;
    assert!(!answer.contains("slow answer"), "{answer}");
}

#[tokio::test]
async fn a_dropped_shutdown_sender_stops_the_server() {
    let (server, _, _) = start(Options::default());
    drop(server.stop);
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("serve returns")
        .unwrap()
        .unwrap();
}

#[test]
fn a_taken_port_names_what_wanted_it_and_how_to_pick_another() {
    let first = bind("127.0.0.1:0".parse().unwrap(), "metrics", "x").unwrap();
    let address = first.local_addr().unwrap();
    let err = bind(address, "metrics", "choose another with --metrics-address").unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("cannot listen for metrics on {address}"))
            && text.contains("choose another with --metrics-address"),
        "{text}"
    );
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_client_still_sending_its_headers() {
    // Timeouts far beyond the deadline: only the drain closing the connection ends this.
    let options = Options {
        header_read_timeout: Duration::from_secs(600),
        drain_timeout: Duration::from_secs(600),
    };
    let (server, _, _) = start(options);
    let mut idle = TcpStream::connect(server.address).await.unwrap();
    let mut partial = TcpStream::connect(server.address).await.unwrap();
    partial
        .write_all(b"GET /metrics HTTP/1.1\r\nHo")
        .await
        .unwrap();
    // The server has both connections before shutdown starts.
    let other = get(server.address, "/other").await;
    assert!(other.ends_with("/other\n"), "{other}");
    server.stop.send(true).unwrap();
    tokio::time::timeout(DEADLINE, server.task)
        .await
        .expect("serve returns without waiting for idle or half-sent requests")
        .unwrap()
        .unwrap();
    assert!(!read_to_close(&mut idle).await.contains("200"));
    assert!(!read_to_close(&mut partial).await.contains("/metrics"));
}
