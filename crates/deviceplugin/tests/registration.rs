//! The supervisor against a kubelet that refuses every registration: it backs off instead of
//! retrying every tick.

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

fn one_gpu() -> gpuops_deviceplugin::Published {
    let inventory = gpuops_inventory::Inventory {
        gpus: vec![gpuops_inventory::Gpu {
            index: 0,
            uuid: "GPU-0".into(),
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
