//! What the controller's e2e tests share: the controller run in the test process on a test bed
//! with the Cluster API core controllers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code
// Each test file uses a different part of it.
#![allow(dead_code)]

use gpuops_testbed::{CapiOptions, Cluster, ClusterApi, ClusterOptions};
use std::time::Duration;

/// The controller's idle period in these tests.
pub const SCALE_DOWN_IDLE: Duration = Duration::from_secs(5);

/// The controller in this process, stopped when dropped.
pub struct Controller {
    /// Where it serves `/metrics`, `/healthz` and `/readyz`.
    pub metrics: std::net::SocketAddr,
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

    /// With `edit` changing the tests' configuration first.
    pub fn start_with(
        kubeconfig: std::path::PathBuf,
        identity: &str,
        lease: bool,
        edit: impl FnOnce(&mut gpuops_controller::ControllerConfig),
    ) -> Controller {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let metrics: std::net::SocketAddr =
            format!("127.0.0.1:{}", gpuops_testbed::free_port().unwrap())
                .parse()
                .unwrap();
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
            metrics_address: metrics,
            dry_run: false,
            prometheus: None,
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
            metrics,
            stop,
            thread: Some(thread),
        }
    }
}

impl Controller {
    /// `GET path` on its HTTP server: the status code and body, or the connection error.
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&self.metrics, Duration::from_secs(2))
            .map_err(|e| format!("connecting to {}: {e}", self.metrics))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut text = String::new();
        s.read_to_string(&mut text)
            .map_err(|e| format!("reading {path}: {e}"))?;
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no status line in {text:?}"))?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    }

    /// The value of an unlabelled metric on `/metrics`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").ok()?;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
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
    bed_with(None)
}

/// With a KubeSchedulerConfiguration for the scheduler (e.g. `Scenario::bin_packing_profile`).
pub fn bed_with(scheduler_config: Option<String>) -> (Cluster, ClusterApi) {
    let cluster = Cluster::start(ClusterOptions {
        kwok: true,
        controller_manager: true,
        scheduler_config,
        ..ClusterOptions::default()
    })
    .unwrap();
    let capi = cluster.start_cluster_api(CapiOptions::default()).unwrap();
    (cluster, capi)
}

/// The controller's status document (what `gpuops autoscaler status -o json` reads).
pub fn status_json(cluster: &Cluster) -> Result<String, gpuops_testbed::BedError> {
    cluster.kubectl(&[
        "get",
        "configmap",
        "gpuops-autoscaler-status",
        "-o",
        "jsonpath={.data.status\\.json}",
    ])
}
