//! The plugin registration and DRA APIs: gRPC paths and service names the kubelet dials, servers
//! and clients over Unix sockets, and wire compatibility of field numbers (hand-built bytes from
//! k8s.io/kubelet v0.35.4's protos).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpuops_kubelet_api::dra::{v1, v1beta1};
use gpuops_kubelet_api::pluginregistration::v1 as reg;
use gpuops_kubelet_api::{DRA_PLUGIN_TYPE, DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, unix};
use prost::Message;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------------------
// Servers answering fixed values, recording what they were sent
// ---------------------------------------------------------------------------

#[derive(Default)]
struct FixedRegistration {
    statuses: Arc<Mutex<Vec<reg::RegistrationStatus>>>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for FixedRegistration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: DRA_PLUGIN_TYPE.into(),
            name: "gpu.nvidia.com".into(),
            endpoint: "/p/gpu.nvidia.com/dra.sock".into(),
            supported_versions: vec![DRA_V1_SERVICE.into(), DRA_V1BETA1_SERVICE.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        self.statuses.lock().unwrap().push(request.into_inner());
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Prepares every claim as one device named after its UID; a UID "bad" fails.
struct FixedDra;

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for FixedDra {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let answer = if c.uid == "bad" {
                    v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: format!("cannot prepare {}/{}", c.namespace, c.name),
                    }
                } else {
                    v1::NodePrepareResourceResponse {
                        devices: vec![v1::Device {
                            request_names: vec!["gpu".into()],
                            pool_name: "node-a".into(),
                            device_name: format!("dev-{}", c.uid),
                            cdi_device_ids: vec![format!("k8s.gpu.nvidia.com/claim={}", c.uid)],
                            share_id: Some("s1".into()),
                        }],
                        error: String::new(),
                    }
                };
                (c.uid, answer)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, v1::NodeUnprepareResourceResponse::default()))
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for FixedDra {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|c| {
                let device = v1beta1::Device {
                    request_names: vec![],
                    pool_name: "node-a".into(),
                    device_name: format!("dev-{}", c.uid),
                    cdi_device_ids: vec![],
                };
                (
                    c.uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices: vec![device],
                        error: String::new(),
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        _: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        Err(Status::unavailable(
            "v1beta1 unprepare refused by the fixture",
        ))
    }
}

type Recorded = Arc<Mutex<Vec<String>>>;

/// Serves registration and both DRA versions on `socket`, recording the HTTP/2 paths received.
fn serve(
    socket: &std::path::Path,
    registration: FixedRegistration,
) -> (
    Recorded,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
) {
    let listener = UnixListener::bind(socket).unwrap();
    let paths: Recorded = Arc::default();
    let seen = Arc::clone(&paths);
    let record = tower::util::MapRequestLayer::new(
        move |req: tonic::codegen::http::Request<tonic::body::Body>| {
            seen.lock().unwrap().push(req.uri().path().to_owned());
            req
        },
    );
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .layer(record)
            .add_service(reg::registration_server::RegistrationServer::new(
                registration,
            ))
            .add_service(v1::dra_plugin_server::DraPluginServer::new(FixedDra))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(FixedDra))
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                stop_rx.await.ok();
            }),
    );
    (paths, stop_tx, server)
}

fn claim(uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "ns".into(),
        uid: uid.into(),
        name: format!("claim-{uid}"),
    }
}

#[tokio::test]
async fn registration_and_dra_round_trip_over_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gpu.nvidia.com-reg.sock");
    let registration = FixedRegistration::default();
    let statuses = Arc::clone(&registration.statuses);
    let (paths, stop, server) = serve(&socket, registration);
    let channel = unix::connect(&socket).await.unwrap();

    let mut kubelet = reg::registration_client::RegistrationClient::new(channel.clone());
    let info = kubelet
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.nvidia.com");
    assert_eq!(info.endpoint, "/p/gpu.nvidia.com/dra.sock");
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    kubelet
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "no such version".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        statuses.lock().unwrap().as_slice(),
        [reg::RegistrationStatus {
            plugin_registered: false,
            error: "no such version".into(),
        }]
    );

    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let prepared = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim("u1"), claim("bad")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims.len(), 2);
    let good = &prepared.claims["u1"];
    assert_eq!(good.error, "");
    assert_eq!(good.devices[0].device_name, "dev-u1");
    assert_eq!(good.devices[0].share_id.as_deref(), Some("s1"));
    assert_eq!(
        good.devices[0].cdi_device_ids,
        ["k8s.gpu.nvidia.com/claim=u1"]
    );
    assert_eq!(prepared.claims["bad"].error, "cannot prepare ns/claim-bad");
    let unprepared = dra
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
            claims: vec![claim("u1")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unprepared.claims["u1"].error, "");

    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let prepared = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ns".into(),
                uid: "u2".into(),
                name: "c".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(prepared.claims["u2"].devices[0].device_name, "dev-u2");
    let refused = beta
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);

    assert_eq!(
        paths.lock().unwrap().as_slice(),
        [
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        ]
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn service_names_match_kubelet() {
    assert_eq!(
        <reg::registration_server::RegistrationServer<FixedRegistration> as NamedService>::NAME,
        "pluginregistration.Registration"
    );
    assert_eq!(
        <v1::dra_plugin_server::DraPluginServer<FixedDra> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    );
    assert_eq!(
        <v1beta1::dra_plugin_server::DraPluginServer<FixedDra> as NamedService>::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    // The strings the kubelet matches in PluginInfo (k8s.io/kubelet's DRAPluginService constants).
    assert_eq!(DRA_V1_SERVICE, "v1.DRAPlugin");
    assert_eq!(DRA_V1BETA1_SERVICE, "v1beta1.DRAPlugin");
    assert_eq!(DRA_PLUGIN_TYPE, "DRAPlugin");
}

// ---------------------------------------------------------------------------
// Wire compatibility: hand-built protobuf bytes (field numbers from upstream)
// ---------------------------------------------------------------------------

/// Length-delimited field (wire type 2).
fn ld(field: u8, payload: &[u8]) -> Vec<u8> {
    assert!(
        field < 16 && payload.len() < 128,
        "helper handles small cases only"
    );
    let mut out = vec![(field << 3) | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

/// Varint field (wire type 0) with a value below 128.
fn varint(field: u8, value: u8) -> Vec<u8> {
    assert!(field < 16 && value < 128, "helper handles small cases only");
    vec![field << 3, value]
}

/// `msg` encodes to exactly `bytes` and `bytes` decode to `msg`. prost drops unknown fields when
/// decoding, so the encode half is what catches a wrong field number.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(&M::decode(bytes).unwrap(), msg, "decoding into {msg:?}");
}

#[test]
fn plugin_registration_field_numbers() {
    assert_wire(
        &reg::PluginInfo {
            r#type: "t".into(),
            name: "n".into(),
            endpoint: "e".into(),
            supported_versions: vec!["a".into(), "b".into()],
        },
        &[
            ld(1, b"t"),
            ld(2, b"n"),
            ld(3, b"e"),
            ld(4, b"a"),
            ld(4, b"b"),
        ]
        .concat(),
    );
    assert_wire(
        &reg::RegistrationStatus {
            plugin_registered: true,
            error: "x".into(),
        },
        &[varint(1, 1), ld(2, b"x")].concat(),
    );
    assert_wire(&reg::InfoRequest {}, &[]);
    assert_wire(&reg::RegistrationStatusResponse {}, &[]);
}

#[test]
fn dra_v1_field_numbers() {
    let claim = [ld(1, b"ns"), ld(2, b"u"), ld(3, b"n")].concat();
    let claim_msg = v1::Claim {
        namespace: "ns".into(),
        uid: "u".into(),
        name: "n".into(),
    };
    assert_wire(
        &v1::NodePrepareResourcesRequest {
            claims: vec![claim_msg.clone()],
        },
        &ld(1, &claim),
    );
    assert_wire(
        &v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_msg],
        },
        &ld(1, &claim),
    );
    let device = [
        ld(1, b"r"),
        ld(2, b"p"),
        ld(3, b"d"),
        ld(4, b"c"),
        ld(5, b"s"),
    ]
    .concat();
    let device_msg = v1::Device {
        request_names: vec!["r".into()],
        pool_name: "p".into(),
        device_name: "d".into(),
        cdi_device_ids: vec!["c".into()],
        share_id: Some("s".into()),
    };
    // Map entries are messages { key = 1; value = 2 }; one entry keeps the order deterministic.
    let answer = [ld(1, &device), ld(2, b"e")].concat();
    assert_wire(
        &v1::NodePrepareResourcesResponse {
            claims: HashMap::from([(
                "u".to_string(),
                v1::NodePrepareResourceResponse {
                    devices: vec![device_msg],
                    error: "e".into(),
                },
            )]),
        },
        &ld(1, &[ld(1, b"u"), ld(2, &answer)].concat()),
    );
    // share_id is a proto3 `optional`: an empty one is still sent, an absent one is not.
    assert_wire(
        &v1::Device {
            share_id: Some(String::new()),
            ..Default::default()
        },
        &ld(5, b""),
    );
    assert_wire(&v1::Device::default(), &[]);
    assert_wire(
        &v1::NodeUnprepareResourcesResponse {
            claims: HashMap::from([(
                "u".to_string(),
                v1::NodeUnprepareResourceResponse { error: "e".into() },
            )]),
        },
        &ld(1, &[ld(1, b"u"), ld(2, &ld(1, b"e"))].concat()),
    );
}

#[test]
fn dra_v1beta1_field_numbers() {
    let claim = [ld(1, b"ns"), ld(2, b"u"), ld(3, b"n")].concat();
    assert_wire(
        &v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ns".into(),
                uid: "u".into(),
                name: "n".into(),
            }],
        },
        &ld(1, &claim),
    );
    let device = [ld(1, b"r"), ld(2, b"p"), ld(3, b"d"), ld(4, b"c")].concat();
    let answer = [ld(1, &device), ld(2, b"e")].concat();
    assert_wire(
        &v1beta1::NodePrepareResourcesResponse {
            claims: HashMap::from([(
                "u".to_string(),
                v1beta1::NodePrepareResourceResponse {
                    devices: vec![v1beta1::Device {
                        request_names: vec!["r".into()],
                        pool_name: "p".into(),
                        device_name: "d".into(),
                        cdi_device_ids: vec!["c".into()],
                    }],
                    error: "e".into(),
                },
            )]),
        },
        &ld(1, &[ld(1, b"u"), ld(2, &answer)].concat()),
    );
    assert_wire(
        &v1beta1::NodeUnprepareResourcesResponse {
            claims: HashMap::from([(
                "u".to_string(),
                v1beta1::NodeUnprepareResourceResponse { error: "e".into() },
            )]),
        },
        &ld(1, &[ld(1, b"u"), ld(2, &ld(1, b"e"))].concat()),
    );
    // A v1 answer with a share ID reads as v1beta1 without it: the versions differ only there.
    let v1_device = [device, ld(5, b"s")].concat();
    assert_eq!(
        v1beta1::Device::decode(v1_device.as_slice()).unwrap(),
        v1beta1::Device {
            request_names: vec!["r".into()],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: vec!["c".into()],
        }
    );
}
