//! The DRA plugin against an in-process fake kubelet: a tonic client over the plugin's real Unix
//! sockets, as the kubelet's plugin watcher and DRA manager call them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_draplugin::{
    Claim, ClaimPreparer, PluginConfig, PrepareAnswers, PreparedDevice, RegistrationState,
    UnprepareAnswers, serve_reporting,
};
use gpuops_kubelet_api::dra::{v1, v1beta1};
use gpuops_kubelet_api::pluginregistration::v1 as reg;
use gpuops_kubelet_api::unix;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Prepares a claim as `gpu-<n>` from its UID; fails the UIDs in `failing`; with `hang`, never
/// answers. Unpreparing a claim it does not hold succeeds, as the contract asks.
#[derive(Default)]
struct FakePreparer {
    failing: BTreeSet<String>,
    hang: bool,
    entered: Notify,
    prepared: Mutex<BTreeMap<String, Vec<PreparedDevice>>>,
    prepare_calls: Mutex<Vec<Vec<String>>>,
    unprepare_calls: Mutex<Vec<Vec<String>>>,
}

#[derive(Debug)]
struct FakeError(String);

impl std::fmt::Display for FakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn device(uid: &str) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["gpu".into()],
        pool_name: "node-a".into(),
        device_name: format!("gpu-{uid}"),
        cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={uid}-gpu")],
        share_id: Some(format!("share-{uid}")),
    }
}

impl ClaimPreparer for FakePreparer {
    type Error = FakeError;

    async fn prepare(&self, claims: Vec<Claim>) -> PrepareAnswers<FakeError> {
        self.prepare_calls
            .lock()
            .unwrap()
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        self.entered.notify_one();
        if self.hang {
            std::future::pending::<()>().await;
        }
        // Another task gets to run here, so concurrent calls would interleave if the plugin let
        // them.
        tokio::task::yield_now().await;
        let mut answers = BTreeMap::new();
        for c in claims {
            if c.uid == "unanswered" {
                continue;
            }
            let answer = if self.failing.contains(&c.uid) {
                Err(FakeError(format!(
                    "spec.devices.config[0].opaque: unknown field \"sharing.strategi\" in claim {}",
                    c.name
                )))
            } else {
                let devices = vec![device(&c.uid)];
                self.prepared
                    .lock()
                    .unwrap()
                    .insert(c.uid.clone(), devices.clone());
                Ok(devices)
            };
            answers.insert(c.uid, answer);
        }
        answers
    }

    async fn unprepare(&self, claims: Vec<Claim>) -> UnprepareAnswers<FakeError> {
        self.unprepare_calls
            .lock()
            .unwrap()
            .push(claims.iter().map(|c| c.uid.clone()).collect());
        let mut prepared = self.prepared.lock().unwrap();
        claims
            .into_iter()
            .map(|c| {
                prepared.remove(&c.uid);
                (c.uid, Ok(()))
            })
            .collect()
    }
}

struct Plugin {
    _dir: tempfile::TempDir,
    config: PluginConfig,
    preparer: Arc<FakePreparer>,
    shutdown: watch::Sender<bool>,
    state: watch::Receiver<RegistrationState>,
    task: JoinHandle<Result<(), gpuops_draplugin::DraPluginError>>,
}

async fn start(preparer: FakePreparer, drain: Duration) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let mut config = PluginConfig::new(
        "gpu.nvidia.com",
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    config.drain = drain;
    let preparer = Arc::new(preparer);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (state_tx, state) = watch::channel(RegistrationState::Waiting);
    let task = tokio::spawn(serve_reporting(
        config.clone(),
        Arc::clone(&preparer),
        shutdown_rx,
        state_tx,
    ));
    wait_for("both sockets", || {
        config.registration_socket().exists() && config.dra_socket().exists()
    })
    .await;
    Plugin {
        _dir: dir,
        config,
        preparer,
        shutdown,
        state,
        task,
    }
}

/// Polls `condition` until it holds, failing the test after 10 s.
async fn wait_for(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn claim(uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "team-a".into(),
        uid: uid.into(),
        name: format!("claim-{uid}"),
    }
}

async fn dra_v1(
    socket: &Path,
) -> v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
    v1::dra_plugin_client::DraPluginClient::new(unix::connect(socket).await.unwrap())
}

async fn registration(
    socket: &Path,
) -> reg::registration_client::RegistrationClient<tonic::transport::Channel> {
    reg::registration_client::RegistrationClient::new(unix::connect(socket).await.unwrap())
}

async fn prepare(
    socket: &Path,
    uids: &[&str],
) -> BTreeMap<String, v1::NodePrepareResourceResponse> {
    let claims = uids.iter().map(|u| claim(u)).collect();
    dra_v1(socket)
        .await
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
        .into_iter()
        .collect()
}

async fn stop(plugin: Plugin) {
    plugin.shutdown.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), plugin.task)
        .await
        .expect("the plugin stops")
        .unwrap()
        .unwrap();
    assert!(!plugin.config.registration_socket().exists());
    assert!(!plugin.config.dra_socket().exists());
}

#[tokio::test]
async fn kubelet_registers_then_prepares_and_unprepares_on_v1_and_v1beta1() {
    let plugin = start(FakePreparer::default(), Duration::from_secs(5)).await;
    let mut kubelet = registration(&plugin.config.registration_socket()).await;
    let info = kubelet
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(
        Path::new(&info.endpoint),
        plugin.config.dra_socket(),
        "the endpoint the kubelet dials"
    );
    assert!(info.endpoint.ends_with("/plugins/gpu.nvidia.com/dra.sock"));
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(*plugin.state.borrow(), RegistrationState::Waiting);
    kubelet
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(*plugin.state.borrow(), RegistrationState::Registered);

    // v1, at the endpoint the kubelet was given.
    let answers = prepare(Path::new(&info.endpoint), &["uid-1"]).await;
    let answer = &answers["uid-1"];
    assert_eq!(answer.error, "");
    assert_eq!(
        answer.devices,
        [v1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-uid-1".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu".into()],
            share_id: Some("share-uid-1".into()),
        }]
    );
    let unprepared = dra_v1(&plugin.config.dra_socket())
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim("uid-1")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims.len(), 1);
    assert_eq!(unprepared.claims["uid-1"].error, "");
    assert!(plugin.preparer.prepared.lock().unwrap().is_empty());

    // v1beta1, on the same socket, for a 1.34 kubelet: no share ID on that version.
    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(
        unix::connect(&plugin.config.dra_socket()).await.unwrap(),
    );
    let beta_claim = v1beta1::Claim {
        namespace: "team-a".into(),
        uid: "uid-2".into(),
        name: "claim-uid-2".into(),
    };
    let prepared = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![beta_claim.clone()],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        prepared.claims["uid-2"].devices,
        [v1beta1::Device {
            request_names: vec!["gpu".into()],
            pool_name: "node-a".into(),
            device_name: "gpu-uid-2".into(),
            cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-2-gpu".into()],
        }]
    );
    let unprepared = beta
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
            claims: vec![beta_claim],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims["uid-2"].error, "");
    assert_eq!(
        *plugin.preparer.prepare_calls.lock().unwrap(),
        [vec!["uid-1".to_string()], vec!["uid-2".to_string()]]
    );

    // A refusal is reported as the kubelet's reason.
    kubelet
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "version v1.DRAPlugin not supported".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        *plugin.state.borrow(),
        RegistrationState::Refused("version v1.DRAPlugin not supported".into())
    );
    stop(plugin).await;
}

#[tokio::test]
async fn a_double_prepare_returns_the_same_devices_without_preparing_again() {
    let plugin = start(FakePreparer::default(), Duration::from_secs(5)).await;
    let socket = plugin.config.dra_socket();
    let first = prepare(&socket, &["uid-1"]).await;
    let second = prepare(&socket, &["uid-1"]).await;
    assert_eq!(first, second);
    assert_eq!(first["uid-1"].devices[0].device_name, "gpu-uid-1");
    // Two kubelet calls for the same claim at once: one preparation.
    let (a, b) = tokio::join!(
        prepare(&socket, &["uid-2"]),
        prepare(&socket, &["uid-2", "uid-1"])
    );
    assert_eq!(a["uid-2"], b["uid-2"]);
    assert_eq!(b["uid-1"], first["uid-1"]);
    // The same claim twice in one request is prepared once too.
    let twice = prepare(&socket, &["uid-3", "uid-3"]).await;
    assert_eq!(twice.len(), 1);
    let calls = plugin.preparer.prepare_calls.lock().unwrap().clone();
    let per_claim = |uid: &str| calls.iter().flatten().filter(|u| *u == uid).count();
    assert_eq!(
        (per_claim("uid-1"), per_claim("uid-2"), per_claim("uid-3")),
        (1, 1, 1),
        "{calls:?}"
    );
    // Once unprepared, a claim is prepared afresh.
    dra_v1(&socket)
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim("uid-1")],
        })
        .await
        .unwrap();
    prepare(&socket, &["uid-1"]).await;
    let calls = plugin.preparer.prepare_calls.lock().unwrap().clone();
    assert_eq!(calls.iter().flatten().filter(|u| *u == "uid-1").count(), 2);
    stop(plugin).await;
}

#[tokio::test]
async fn unpreparing_a_claim_never_prepared_succeeds() {
    let plugin = start(FakePreparer::default(), Duration::from_secs(5)).await;
    let answers = dra_v1(&plugin.config.dra_socket())
        .await
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim("never-1"), claim("never-2")],
        })
        .await
        .unwrap()
        .into_inner();
    // Every claim has an entry, as the kubelet requires, and none is an error.
    let errors: BTreeMap<String, String> = answers
        .claims
        .into_iter()
        .map(|(uid, a)| (uid, a.error))
        .collect();
    assert_eq!(
        errors,
        BTreeMap::from([
            ("never-1".to_string(), String::new()),
            ("never-2".to_string(), String::new())
        ])
    );
    // The preparer was asked: after a restart only its checkpoint knows what a claim holds.
    assert_eq!(
        *plugin.preparer.unprepare_calls.lock().unwrap(),
        [vec!["never-1".to_string(), "never-2".to_string()]]
    );
    stop(plugin).await;
}

#[tokio::test]
async fn one_failing_claim_does_not_fail_the_other() {
    let preparer = FakePreparer {
        failing: BTreeSet::from(["bad".to_string()]),
        ..FakePreparer::default()
    };
    let plugin = start(preparer, Duration::from_secs(5)).await;
    let socket = plugin.config.dra_socket();
    let answers = prepare(&socket, &["good", "bad", "unanswered"]).await;
    assert_eq!(answers["good"].error, "");
    assert_eq!(answers["good"].devices.len(), 1);
    assert!(answers["bad"].devices.is_empty());
    assert_eq!(
        answers["bad"].error,
        "spec.devices.config[0].opaque: unknown field \"sharing.strategi\" in claim claim-bad"
    );
    assert_eq!(
        answers["unanswered"].error,
        "the driver gave no answer for claim team-a/claim-unanswered (unanswered)"
    );
    // A failed claim is not remembered as prepared: the kubelet's retry reaches the preparer.
    prepare(&socket, &["bad"]).await;
    let calls = plugin.preparer.prepare_calls.lock().unwrap().clone();
    assert_eq!(calls.last().unwrap(), &["bad".to_string()]);
    // A claim without a UID is answered as an error, under the empty key.
    let no_uid = prepare(&socket, &[""]).await;
    assert_eq!(no_uid[""].error, "claim team-a/claim- has no UID");
    stop(plugin).await;
}

#[tokio::test]
async fn a_removed_registration_socket_is_recreated_and_registers_again() {
    let mut plugin = start(FakePreparer::default(), Duration::from_secs(5)).await;
    let reg_socket = plugin.config.registration_socket();
    registration(&reg_socket)
        .await
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        *plugin.state.borrow_and_update(),
        RegistrationState::Registered
    );
    // The plugin resets its state to Waiting exactly when it recreates the socket.
    std::fs::remove_file(&reg_socket).unwrap();
    plugin
        .state
        .wait_for(|s| *s == RegistrationState::Waiting)
        .await
        .unwrap();
    wait_for("the registration socket back", || reg_socket.exists()).await;
    let mut kubelet = registration(&reg_socket).await;
    let info = kubelet
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "gpu.nvidia.com");
    kubelet
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(
        *plugin.state.borrow_and_update(),
        RegistrationState::Registered
    );

    // The DRA socket removed: served again, and the registration socket recreated with it so
    // the kubelet registers the driver again and dials the new socket.
    std::fs::remove_file(plugin.config.dra_socket()).unwrap();
    plugin
        .state
        .wait_for(|s| *s == RegistrationState::Waiting)
        .await
        .unwrap();
    wait_for("both sockets back", || {
        reg_socket.exists() && plugin.config.dra_socket().exists()
    })
    .await;
    let answers = prepare(&plugin.config.dra_socket(), &["uid-1"]).await;
    assert_eq!(answers["uid-1"].error, "");

    // The whole registry directory removed (its watch goes with it): back within the tick.
    std::fs::remove_dir_all(&plugin.config.registry_dir).unwrap();
    wait_for("the registration socket in a new directory", || {
        reg_socket.exists()
    })
    .await;
    let info = registration(&reg_socket)
        .await
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "gpu.nvidia.com");
    stop(plugin).await;
}

#[tokio::test]
async fn shutdown_is_prompt_with_a_hung_preparer() {
    let preparer = FakePreparer {
        hang: true,
        ..FakePreparer::default()
    };
    let plugin = start(preparer, Duration::from_millis(200)).await;
    let socket = plugin.config.dra_socket();
    let call = tokio::spawn(async move {
        dra_v1(&socket)
            .await
            .node_prepare_resources(v1::NodePrepareResourcesRequest {
                claims: vec![claim("uid-1")],
            })
            .await
    });
    plugin.preparer.entered.notified().await;
    let started = Instant::now();
    plugin.shutdown.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), plugin.task)
        .await
        .expect("shutdown waits for the drain, not for the hung preparer")
        .unwrap()
        .unwrap();
    let took = started.elapsed();
    // The kubelet's call ends (it retries with the next agent) instead of hanging.
    let status = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the in-flight call ends")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        took >= Duration::from_millis(200),
        "drained first: {took:?}"
    );
    assert!(!plugin.config.dra_socket().exists());
    assert!(!plugin.config.registration_socket().exists());
    assert_eq!(*plugin.state.borrow(), RegistrationState::Waiting);
}

#[tokio::test]
async fn a_stale_socket_from_a_crashed_agent_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let config = PluginConfig::new(
        "gpu.nvidia.com",
        &dir.path().join("plugins_registry"),
        &dir.path().join("plugins"),
    );
    // A crashed agent's sockets: files nobody listens on.
    for socket in [config.registration_socket(), config.dra_socket()] {
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(socket.exists());
    }
    let (shutdown, shutdown_rx) = watch::channel(false);
    let task = tokio::spawn(gpuops_draplugin::serve(
        config.clone(),
        Arc::new(FakePreparer::default()),
        shutdown_rx,
    ));
    let socket = config.dra_socket();
    let deadline = Instant::now() + Duration::from_secs(10);
    let answers = loop {
        // Until the plugin has bound, the stale file refuses connections.
        if let Ok(channel) = unix::connect(&socket).await {
            let mut client = v1::dra_plugin_client::DraPluginClient::new(channel);
            if let Ok(r) = client
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![claim("uid-1")],
                })
                .await
            {
                break r.into_inner();
            }
        }
        assert!(Instant::now() < deadline, "the plugin never served");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(answers.claims["uid-1"].error, "");
    shutdown.send(true).unwrap();
    task.await.unwrap().unwrap();
}
