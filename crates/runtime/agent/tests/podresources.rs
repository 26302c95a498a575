//! The PodResources client against a kubelet-side server whose answer is larger than gRPC's
//! default 4 MiB message limit (a node with many pods and devices).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use gpuops_kubelet_api::podresources::v1::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpuops_kubelet_api::podresources::v1::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};

struct Crowded {
    pods: usize,
}

#[tonic::async_trait]
impl PodResourcesLister for Crowded {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        let pod_resources = (0..self.pods)
            .map(|i| PodResources {
                name: format!("pod-{i:06}-{}", "x".repeat(40)),
                namespace: "batch".into(),
                containers: vec![ContainerResources {
                    name: "worker".into(),
                    devices: vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: vec![format!("GPU-{i:08x}-0000-0000-0000-000000000000::3")],
                        topology: None,
                    }],
                    ..ContainerResources::default()
                }],
            })
            .collect();
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn get(
        &self,
        _: tonic::Request<GetPodResourcesRequest>,
    ) -> Result<tonic::Response<GetPodResourcesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_above_four_mebibytes_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let pods = 40_000;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Crowded { pods }))
            .serve_with_incoming(gpuops_kubelet_api::unix::incoming(listener)),
    );
    let (assignments, _) = gpuops_agent::list_pod_resources(&socket, None)
        .await
        .unwrap();
    assert_eq!(assignments.len(), pods);
    let bytes: usize = assignments
        .iter()
        .map(|a| {
            a.pod.len()
                + a.namespace.len()
                + a.container.len()
                + a.resource.len()
                + a.device_ids[0].len()
        })
        .sum();
    assert!(
        bytes > 4 * 1024 * 1024,
        "only {bytes} bytes: not above the old limit"
    );
    server.abort();
}
