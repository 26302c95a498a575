//! The plugin servers as the kubelet sees them: a kubelet that refuses every registration (the
//! supervisor backs off instead of retrying every tick) and Allocate's device specs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_kubelet_api::deviceplugin::v1beta1::registration_server::{
    Registration, RegistrationServer,
};
use gpuops_kubelet_api::deviceplugin::v1beta1::{Empty, RegisterRequest};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Records when each Register call came and refuses it, as a kubelet does for a bad name.
struct Refusing {
    calls: Arc<Mutex<Vec<Instant>>>,
}

#[tonic::async_trait]
impl Registration for Refusing {
    async fn register(
        &self,
        _: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        self.calls.lock().unwrap().push(Instant::now());
        Err(tonic::Status::invalid_argument(
            "cannot register with kubelet: resource name is not valid",
        ))
    }
}

/// Accepts every Register call, as a kubelet does for a valid plugin.
struct Accepting;

#[tonic::async_trait]
impl Registration for Accepting {
    async fn register(
        &self,
        _: tonic::Request<RegisterRequest>,
    ) -> Result<tonic::Response<Empty>, tonic::Status> {
        Ok(tonic::Response::new(Empty {}))
    }
}

/// A kubelet registration server on `dir`/kubelet.sock (a fresh socket file, as after a restart).
fn kubelet<R: Registration>(dir: &std::path::Path, service: R) -> tokio::task::JoinHandle<()> {
    let socket = dir.join("kubelet.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming(gpuops_kubelet_api::unix::incoming(listener))
            .await;
    })
}

async fn wait_for(what: &str, flag: &std::sync::atomic::AtomicBool, want: bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while flag.load(std::sync::atomic::Ordering::Relaxed) != want {
        assert!(Instant::now() < deadline, "{what}: still {}", !want);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_is_true_only_while_the_current_kubelet_knows_every_resource() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let published = one_gpu();
    let plugin_socket = dir.path().join(&published.resources[0].socket_name);
    let (_feed_tx, feed) = watch::channel(Arc::new(published));
    let (stop_tx, stop) = watch::channel(false);
    let registered = Arc::new(AtomicBool::new(true));
    let plugin = tokio::spawn(gpuops_deviceplugin::serve_reporting(
        dir.path().to_path_buf(),
        feed,
        stop,
        Arc::clone(&registered),
    ));
    // No kubelet yet: serving, not registered.
    wait_for("no kubelet", &registered, false).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !plugin_socket.exists() {
        assert!(Instant::now() < deadline, "no plugin socket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!registered.load(Ordering::Relaxed));

    let first = kubelet(dir.path(), Accepting);
    wait_for("registered with the kubelet", &registered, true).await;

    // The kubelet restarts (it deletes every plugin socket and makes a new kubelet.sock) and
    // refuses us: no longer registered.
    first.abort();
    std::fs::remove_file(&plugin_socket).unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let second = kubelet(
        dir.path(),
        Refusing {
            calls: Arc::clone(&calls),
        },
    );
    // Not registered from the moment our socket is gone (the supervisor may see that before
    // the new kubelet.sock), and the new kubelet's refusal keeps it so.
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls.lock().unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the restarted kubelet was never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_for("a restarted kubelet that refused", &registered, false).await;

    stop_tx.send(true).unwrap();
    plugin.await.unwrap().unwrap();
    second.abort();
}

fn one_gpu() -> gpuops_deviceplugin::Published {
    let inventory = gpuops_inventory::Inventory {
        gpus: vec![gpuops_inventory::Gpu {
            index: 0,
            uuid: "GPU-0".into(),
            minor_number: Some(0),
            ..gpuops_inventory::Gpu::default()
        }],
        ..gpuops_inventory::Inventory::default()
    };
    let config = gpuops_resources::config::Config::default();
    gpuops_deviceplugin::Published {
        resources: gpuops_resources::resources(&inventory, &config).unwrap(),
        config,
        inventory: Arc::new(inventory),
        host: Arc::default(),
    }
}

/// A kubelet that accepts connections on `kubelet.sock` and never answers (hung, or stopped in
/// a debugger); the receiver gets one message per accepted connection.
fn hung_kubelet(
    dir: &std::path::Path,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let listener = tokio::net::UnixListener::bind(dir.join("kubelet.sock")).unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
            let _ = tx.send(());
        }
    });
    (task, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_registration_the_kubelet_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (kubelet, mut accepted) = hung_kubelet(dir.path());
    let (_feed_tx, feed) = watch::channel(Arc::new(one_gpu()));
    let (stop_tx, stop) = watch::channel(false);
    let plugin = tokio::spawn(gpuops_deviceplugin::serve(
        dir.path().to_path_buf(),
        feed,
        stop,
    ));
    // The supervisor is now inside Register, which gives up only after 5 + 10 s.
    accepted.recv().await.unwrap();
    stop_tx.send(true).unwrap();
    // Stopping the resource's own server is bounded by 2 s; the registration must add nothing.
    tokio::time::timeout(Duration::from_secs(3), plugin)
        .await
        .expect("shutdown waited for the unanswered registration")
        .unwrap()
        .unwrap();
    kubelet.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_retried_with_growing_waits() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::UnixListener::bind(dir.path().join("kubelet.sock")).unwrap();
    let kubelet = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Refusing {
                calls: Arc::clone(&calls),
            }))
            .serve_with_incoming(gpuops_kubelet_api::unix::incoming(listener)),
    );
    let (_feed_tx, feed) = watch::channel(Arc::new(one_gpu()));
    let (stop_tx, stop) = watch::channel(false);
    let plugin = tokio::spawn(gpuops_deviceplugin::serve(
        dir.path().to_path_buf(),
        feed,
        stop,
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while calls.lock().unwrap().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "only {} registrations",
            calls.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at = calls.lock().unwrap().clone();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // Every tick (500 ms) before; now 500 ms, 1 s, 2 s...
    assert!(
        gaps[2] > gaps[0] + Duration::from_millis(700),
        "waits do not grow: {gaps:?}"
    );
    stop_tx.send(true).unwrap();
    plugin.await.unwrap().unwrap();
    kubelet.abort();
}

/// Serves the plugin without a kubelet and calls Allocate on its socket.
async fn allocate_on(published: gpuops_deviceplugin::Published) -> Vec<String> {
    use gpuops_kubelet_api::deviceplugin::v1beta1::{
        AllocateRequest, ContainerAllocateRequest, device_plugin_client::DevicePluginClient,
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(&published.resources[0].socket_name);
    let ids = vec![published.resources[0].devices[0].id.clone()];
    let (_feed_tx, feed) = watch::channel(Arc::new(published));
    let (stop_tx, stop) = watch::channel(false);
    let plugin = tokio::spawn(gpuops_deviceplugin::serve(
        dir.path().to_path_buf(),
        feed,
        stop,
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    let channel = loop {
        match gpuops_kubelet_api::unix::connect(&socket).await {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no plugin socket: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let response = DevicePluginClient::new(channel)
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
        })
        .await
        .unwrap()
        .into_inner();
    stop_tx.send(true).unwrap();
    plugin.await.unwrap().unwrap();
    response.container_responses[0]
        .devices
        .iter()
        .map(|d| d.host_path.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_passes_only_the_device_nodes_the_host_has() {
    let mut flags = gpuops_resources::config::Overrides::default();
    flags.set("PASS_DEVICE_SPECS", "true").unwrap();
    let config = gpuops_resources::config::Config::effective(
        None,
        &gpuops_resources::config::Overrides::default(),
        &flags,
    )
    .unwrap();
    let mut published = one_gpu();
    published.resources = gpuops_resources::resources(&published.inventory, &config).unwrap();
    published.config = config;
    // A host without the UVM and modeset nodes (no nvidia-uvm module loaded).
    published.host = Arc::new(gpuops_resources::HostDevices {
        nvidiactl: true,
        nvidia_uvm: false,
        nvidia_uvm_tools: false,
        nvidia_modeset: false,
        mig_minors: None,
    });
    let paths = allocate_on(published).await;
    assert!(paths.iter().any(|p| p == "/dev/nvidiactl"), "{paths:?}");
    assert!(paths.iter().any(|p| p == "/dev/nvidia0"), "{paths:?}");
    assert!(
        paths
            .iter()
            .all(|p| !p.contains("uvm") && !p.contains("modeset")),
        "passed device nodes the host does not have: {paths:?}"
    );
}
