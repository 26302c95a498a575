//! What the controller's e2e tests share: the controller run in the test process on a test bed
//! with the Cluster API core controllers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
#![allow(dead_code)] // each test file uses a different part

use gpuops_testbed::{CapiOptions, Cluster, ClusterApi, ClusterOptions};
use std::time::Duration;

/// The controller's idle period in these tests.
pub const SCALE_DOWN_IDLE: Duration = Duration::from_secs(5);

/// The controller in this process, stopped when dropped.
pub struct Controller {
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Controller {
    pub fn start(cluster: &Cluster, identity: &str, lease: bool) -> Controller {
        Controller::start_as(cluster.kubeconfig(), identity, lease)
    }

    pub fn start_as(kubeconfig: std::path::PathBuf, identity: &str, lease: bool) -> Controller {
        Controller::start_with(kubeconfig, identity, lease, |_| {})
    }

    /// [`Controller::start_as`] with the config changed by `edit` first.
    pub fn start_with(
        kubeconfig: std::path::PathBuf,
        identity: &str,
        lease: bool,
        edit: impl FnOnce(&mut gpuops_controller::ControllerConfig),
    ) -> Controller {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut config = gpuops_controller::ControllerConfig {
            client: gpuops_kube::ClientOptions {
                kubeconfig: Some(kubeconfig),
                ..gpuops_kube::ClientOptions::default()
            },
            namespace: "default".into(),
            identity: identity.into(),
            lease: lease.then(|| gpuops_kube::LeaseOptions {
                namespace: "default".into(),
                name: "gpuops-controller".into(),
                identity: identity.into(),
                duration: Duration::from_secs(6),
                grace: Duration::from_secs(2),
            }),
            resync: Duration::from_secs(2),
            decision: gpuops_autoscale::Config {
                batch_idle: Duration::from_millis(500),
                batch_max: Duration::from_secs(3),
                scale_down_idle: SCALE_DOWN_IDLE,
                ..gpuops_autoscale::Config::default()
            },
            metrics_address: "127.0.0.1:0".parse().unwrap(),
            dry_run: false,
            prometheus_url: None,
            mig: None,
        };
        edit(&mut config);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            if let Err(e) = rt.block_on(gpuops_controller::run(config, stopped)) {
                eprintln!("controller stopped: {e}");
            }
        });
        Controller {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn bed() -> (Cluster, ClusterApi) {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        controller_manager: true,
        ..ClusterOptions::default()
    })
    .unwrap();
    let capi = cluster.start_cluster_api(CapiOptions::default()).unwrap();
    (cluster, capi)
}
