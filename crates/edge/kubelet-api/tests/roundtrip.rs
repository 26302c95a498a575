//! End-to-end checks of the generated kubelet APIs: servers and clients over
//! Unix sockets, gRPC paths, and wire compatibility of field numbers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use std::collections::HashMap;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use gpuops_kubelet_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateRequest,
    ContainerAllocateResponse, ContainerPreferredAllocationRequest,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest, TopologyInfo,
    device_plugin_client::DevicePluginClient,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
    registration_server::{Registration, RegistrationServer},
};
use gpuops_kubelet_api::podresources::v1 as pr;
use gpuops_kubelet_api::{HEALTHY, KUBELET_SOCKET, UNHEALTHY, VERSION, unix};
use prost::Message;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::Stream;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------------------
// Device plugin server/client round trip
// ---------------------------------------------------------------------------

fn fixed_devices() -> Vec<Device> {
    vec![
        Device {
            id: "GPU-0".into(),
            health: HEALTHY.into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 0 }],
            }),
        },
        Device {
            id: "GPU-1".into(),
            health: UNHEALTHY.into(),
            topology: None,
        },
    ]
}

struct FixedPlugin;

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for FixedPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let first = ListAndWatchResponse {
            devices: fixed_devices(),
        };
        Ok(Response::new(Box::pin(tokio_stream::iter([Ok(first)]))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|req| {
                let size = usize::try_from(req.allocation_size).unwrap_or(0);
                let mut ids = req.must_include_device_i_ds;
                for id in req.available_device_i_ds {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|req| ContainerAllocateResponse {
                envs: HashMap::from([
                    ("NVIDIA_VISIBLE_DEVICES".into(), req.devices_ids.join(",")),
                    ("GPUOPS".into(), "1".into()),
                ]),
                mounts: vec![Mount {
                    container_path: "/usr/bin/nvidia-smi".into(),
                    host_path: "/usr/bin/nvidia-smi".into(),
                    read_only: true,
                }],
                devices: vec![DeviceSpec {
                    container_path: "/dev/nvidia0".into(),
                    host_path: "/dev/nvidia0".into(),
                    permissions: "rw".into(),
                }],
                annotations: HashMap::from([("a".into(), "b".into())]),
                cdi_devices: req
                    .devices_ids
                    .iter()
                    .map(|id| CdiDevice {
                        name: format!("nvidia.com/gpu={id}"),
                    })
                    .collect(),
            })
            .collect();
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

#[tokio::test]
async fn device_plugin_round_trip_over_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gpuops-gpu.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(DevicePluginServer::new(FixedPlugin))
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                stop_rx.await.ok();
            }),
    );

    let channel = unix::connect(&socket).await.unwrap();
    let mut client = DevicePluginClient::new(channel);

    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available);
    assert!(!options.pre_start_required);

    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices, fixed_devices());
    assert!(stream.message().await.unwrap().is_none());

    let preferred = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["GPU-0".into(), "GPU-1".into(), "GPU-2".into()],
                must_include_device_i_ds: vec!["GPU-2".into()],
                allocation_size: 2,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        preferred.container_responses,
        vec![ContainerPreferredAllocationResponse {
            device_i_ds: vec!["GPU-2".into(), "GPU-0".into()],
        }]
    );

    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["GPU-0".into(), "GPU-1".into()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocated.container_responses.len(), 1);
    let resp = &allocated.container_responses[0];
    assert_eq!(resp.envs.len(), 2);
    assert_eq!(resp.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-0,GPU-1");
    assert_eq!(resp.envs["GPUOPS"], "1");
    assert_eq!(resp.annotations["a"], "b");
    assert!(resp.mounts[0].read_only);
    assert_eq!(resp.devices[0].permissions, "rw");
    assert_eq!(
        resp.cdi_devices
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        ["nvidia.com/gpu=GPU-0", "nvidia.com/gpu=GPU-1"]
    );

    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: vec!["GPU-0".into()],
        })
        .await
        .unwrap();

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------
// Registration: a fake kubelet receives a plugin's RegisterRequest
// ---------------------------------------------------------------------------

struct FakeKubelet {
    received: mpsc::UnboundedSender<RegisterRequest>,
}

#[tonic::async_trait]
impl Registration for FakeKubelet {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = request.into_inner();
        if req.version != VERSION {
            return Err(Status::invalid_argument("unsupported version"));
        }
        self.received
            .send(req)
            .map_err(|_| Status::internal("test receiver gone"))?;
        Ok(Response::new(Empty {}))
    }
}

#[tokio::test]
async fn registration_round_trip_and_grpc_path() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(KUBELET_SOCKET);
    let listener = UnixListener::bind(&socket).unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();

    // Record the HTTP/2 paths the server actually receives.
    let paths = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = Arc::clone(&paths);
    let record = tower::util::MapRequestLayer::new(
        move |req: tonic::codegen::http::Request<tonic::body::Body>| {
            seen.lock().unwrap().push(req.uri().path().to_owned());
            req
        },
    );

    let server = tokio::spawn(
        Server::builder()
            .layer(record)
            .add_service(RegistrationServer::new(FakeKubelet { received: tx }))
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                stop_rx.await.ok();
            }),
    );

    let mut client = RegistrationClient::new(unix::connect(&socket).await.unwrap());
    client
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: "gpuops-nvidia.com-gpu.sock".into(),
            resource_name: "nvidia.com/gpu".into(),
            options: Some(DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .unwrap();

    let got = rx.recv().await.unwrap();
    assert_eq!(got.version, "v1beta1");
    assert_eq!(got.endpoint, "gpuops-nvidia.com-gpu.sock");
    assert_eq!(got.resource_name, "nvidia.com/gpu");
    assert_eq!(
        got.options,
        Some(DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        })
    );

    // A wrong version is rejected by our fake, proving the status travels back.
    let err = client
        .register(RegisterRequest {
            version: "v1alpha".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    assert_eq!(
        paths.lock().unwrap().first().map(String::as_str),
        Some("/v1beta1.Registration/Register")
    );

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[test]
fn service_names_match_kubelet() {
    assert_eq!(
        <RegistrationServer<FakeKubelet> as NamedService>::NAME,
        "v1beta1.Registration"
    );
    assert_eq!(
        <DevicePluginServer<FixedPlugin> as NamedService>::NAME,
        "v1beta1.DevicePlugin"
    );
    assert_eq!(
        <pr::pod_resources_lister_server::PodResourcesListerServer<FakePodResources> as NamedService>::NAME,
        "v1.PodResourcesLister"
    );
}

// ---------------------------------------------------------------------------
// PodResources server/client round trip
// ---------------------------------------------------------------------------

struct FakePodResources;

fn gpu_pod() -> pr::PodResources {
    pr::PodResources {
        name: "train-0".into(),
        namespace: "ml".into(),
        containers: vec![pr::ContainerResources {
            name: "main".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: vec!["GPU-0".into()],
                topology: Some(pr::TopologyInfo {
                    nodes: vec![pr::NumaNode { id: 1 }],
                }),
            }],
            cpu_ids: vec![2, 3],
            memory: vec![pr::ContainerMemory {
                memory_type: "memory".into(),
                size: 1 << 30,
                topology: None,
            }],
            dynamic_resources: vec![pr::DynamicResource {
                claim_name: "gpu-claim".into(),
                claim_namespace: "ml".into(),
                claim_resources: vec![pr::ClaimResource {
                    cdi_devices: vec![pr::CdiDevice {
                        name: "nvidia.com/gpu=0".into(),
                    }],
                    driver_name: "gpu.nvidia.com".into(),
                    pool_name: "node-a".into(),
                    device_name: "gpu-0".into(),
                }],
            }],
        }],
    }
}

#[tonic::async_trait]
impl pr::pod_resources_lister_server::PodResourcesLister for FakePodResources {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: vec![gpu_pod()],
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse {
            devices: gpu_pod().containers[0].devices.clone(),
            cpu_ids: vec![0, 1, 2, 3],
            memory: vec![],
        }))
    }

    async fn get(
        &self,
        request: Request<pr::GetPodResourcesRequest>,
    ) -> Result<Response<pr::GetPodResourcesResponse>, Status> {
        let req = request.into_inner();
        let pod = gpu_pod();
        if req.pod_name != pod.name || req.pod_namespace != pod.namespace {
            return Err(Status::not_found("no such pod"));
        }
        Ok(Response::new(pr::GetPodResourcesResponse {
            pod_resources: Some(pod),
        }))
    }
}

#[tokio::test]
async fn pod_resources_round_trip_over_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(
        Path::new(gpuops_kubelet_api::POD_RESOURCES_SOCKET)
            .file_name()
            .unwrap(),
    );
    let listener = UnixListener::bind(&socket).unwrap();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(
                pr::pod_resources_lister_server::PodResourcesListerServer::new(FakePodResources),
            )
            .serve_with_incoming_shutdown(unix::incoming(listener), async {
                stop_rx.await.ok();
            }),
    );

    let mut client = pr::pod_resources_lister_client::PodResourcesListerClient::new(
        unix::connect(&socket).await.unwrap(),
    );
    let listed = client
        .list(pr::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.pod_resources, vec![gpu_pod()]);

    let alloc = client
        .get_allocatable_resources(pr::AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alloc.cpu_ids, [0, 1, 2, 3]);
    assert_eq!(alloc.devices[0].device_ids, ["GPU-0"]);

    let got = client
        .get(pr::GetPodResourcesRequest {
            pod_name: "train-0".into(),
            pod_namespace: "ml".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources, Some(gpu_pod()));

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn connect_to_missing_socket_fails() {
    let dir = tempfile::tempdir().unwrap();
    assert!(unix::connect(&dir.path().join("nope.sock")).await.is_err());
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

/// Asserts that `msg` encodes to exactly `bytes` and that `bytes` decode to `msg`.
/// prost drops unknown fields when decoding, so the encode half is what catches
/// a wrong field number.
fn assert_wire<M: Message + Default + PartialEq + std::fmt::Debug>(msg: &M, bytes: &[u8]) {
    assert_eq!(msg.encode_to_vec(), bytes, "encoding of {msg:?}");
    assert_eq!(&M::decode(bytes).unwrap(), msg, "decoding into {msg:?}");
}

#[test]
fn device_field_numbers() {
    // Device { ID = 1, health = 2, topology = 3 { nodes = 1 { ID = 1 } } }
    let numa = varint(1, 1);
    let topology = ld(1, &numa);
    let bytes = [ld(1, b"a"), ld(2, b"Healthy"), ld(3, &topology)].concat();
    assert_eq!(
        bytes,
        [
            0x0a, 1, b'a', 0x12, 7, b'H', b'e', b'a', b'l', b't', b'h', b'y', 0x1a, 4, 0x0a, 2,
            0x08, 1
        ]
    );
    assert_wire(
        &Device {
            id: "a".into(),
            health: "Healthy".into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        },
        &bytes,
    );
    assert_wire(
        &ListAndWatchResponse {
            devices: vec![Device {
                id: "a".into(),
                ..Default::default()
            }],
        },
        &ld(1, &ld(1, b"a")),
    );
}

#[test]
fn device_plugin_field_numbers() {
    let options = [varint(1, 1), varint(2, 1)].concat();
    assert_wire(
        &DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        },
        &options,
    );
    assert_wire(
        &RegisterRequest {
            version: "v".into(),
            endpoint: "e".into(),
            resource_name: "r".into(),
            options: Some(DevicePluginOptions {
                pre_start_required: true,
                get_preferred_allocation_available: true,
            }),
        },
        &[ld(1, b"v"), ld(2, b"e"), ld(3, b"r"), ld(4, &options)].concat(),
    );
    assert_wire(
        &PreStartContainerRequest {
            devices_ids: vec!["x".into()],
        },
        &ld(1, b"x"),
    );
    assert_wire(
        &PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["a".into()],
                must_include_device_i_ds: vec!["m".into()],
                allocation_size: 3,
            }],
        },
        &ld(1, &[ld(1, b"a"), ld(2, b"m"), varint(3, 3)].concat()),
    );
    assert_wire(
        &PreferredAllocationResponse {
            container_responses: vec![ContainerPreferredAllocationResponse {
                device_i_ds: vec!["d".into()],
            }],
        },
        &ld(1, &ld(1, b"d")),
    );
    assert_wire(
        &AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec!["d".into()],
            }],
        },
        &ld(1, &ld(1, b"d")),
    );
    // Map entries are messages { key = 1; value = 2 }. One entry per map keeps
    // the encoding order deterministic.
    let entry = [ld(1, b"k"), ld(2, b"v")].concat();
    let mount = [ld(1, b"c"), ld(2, b"h"), varint(3, 1)].concat();
    let spec = [ld(1, b"c"), ld(2, b"h"), ld(3, b"rw")].concat();
    let cdi = ld(1, b"v.com/c=n");
    assert_wire(
        &AllocateResponse {
            container_responses: vec![ContainerAllocateResponse {
                envs: HashMap::from([("k".into(), "v".into())]),
                mounts: vec![Mount {
                    container_path: "c".into(),
                    host_path: "h".into(),
                    read_only: true,
                }],
                devices: vec![DeviceSpec {
                    container_path: "c".into(),
                    host_path: "h".into(),
                    permissions: "rw".into(),
                }],
                annotations: HashMap::from([("k".into(), "v".into())]),
                cdi_devices: vec![CdiDevice {
                    name: "v.com/c=n".into(),
                }],
            }],
        },
        &ld(
            1,
            &[
                ld(1, &entry),
                ld(2, &mount),
                ld(3, &spec),
                ld(4, &entry),
                ld(5, &cdi),
            ]
            .concat(),
        ),
    );
}

#[test]
fn pod_resources_field_numbers() {
    let topology = ld(1, &varint(1, 1));
    let devices = [ld(1, b"r"), ld(2, b"d"), ld(3, &topology)].concat();
    let memory = [ld(1, b"m"), varint(2, 5), ld(3, &topology)].concat();
    let claim = [
        ld(1, &ld(1, b"c")),
        ld(2, b"drv"),
        ld(3, b"pool"),
        ld(4, b"dev"),
    ]
    .concat();
    // DynamicResource field 1 is reserved upstream.
    let dynamic = [ld(2, b"cn"), ld(3, b"ns"), ld(4, &claim)].concat();
    // Packed repeated int64 cpu_ids = 3: [7].
    let container = [
        ld(1, b"c"),
        ld(2, &devices),
        ld(3, &[7]),
        ld(4, &memory),
        ld(5, &dynamic),
    ]
    .concat();
    let pod = [ld(1, b"p"), ld(2, b"ns"), ld(3, &container)].concat();

    let topo = || {
        Some(pr::TopologyInfo {
            nodes: vec![pr::NumaNode { id: 1 }],
        })
    };
    let cdevs = pr::ContainerDevices {
        resource_name: "r".into(),
        device_ids: vec!["d".into()],
        topology: topo(),
    };
    let cmem = pr::ContainerMemory {
        memory_type: "m".into(),
        size: 5,
        topology: topo(),
    };
    let pod_msg = pr::PodResources {
        name: "p".into(),
        namespace: "ns".into(),
        containers: vec![pr::ContainerResources {
            name: "c".into(),
            devices: vec![cdevs.clone()],
            cpu_ids: vec![7],
            memory: vec![cmem.clone()],
            dynamic_resources: vec![pr::DynamicResource {
                claim_name: "cn".into(),
                claim_namespace: "ns".into(),
                claim_resources: vec![pr::ClaimResource {
                    cdi_devices: vec![pr::CdiDevice { name: "c".into() }],
                    driver_name: "drv".into(),
                    pool_name: "pool".into(),
                    device_name: "dev".into(),
                }],
            }],
        }],
    };
    assert_wire(
        &pr::ListPodResourcesResponse {
            pod_resources: vec![pod_msg.clone()],
        },
        &ld(1, &pod),
    );
    assert_wire(
        &pr::GetPodResourcesResponse {
            pod_resources: Some(pod_msg),
        },
        &ld(1, &pod),
    );
    assert_wire(
        &pr::GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
        },
        &[ld(1, b"p"), ld(2, b"ns")].concat(),
    );
    assert_wire(
        &pr::AllocatableResourcesResponse {
            devices: vec![cdevs],
            cpu_ids: vec![7],
            memory: vec![cmem],
        },
        &[ld(1, &devices), ld(2, &[7]), ld(3, &memory)].concat(),
    );
}
