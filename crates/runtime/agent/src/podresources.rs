//! The kubelet's PodResources API: which pods hold which devices (pod labels on metrics, the MIG
//! flow's wait for GPU pods).

use crate::error::AgentError;
use gpuops_kubelet_api::podresources::v1::ListPodResourcesRequest;
use gpuops_kubelet_api::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use gpuops_metrics::Assignment;
use std::path::Path;

/// The largest `List()` answer accepted. gRPC's default of 4 MiB is exceeded on nodes with many
/// pods and devices (dcgm-exporter's known failure); the kubelet itself sends up to 16 MiB.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

pub(crate) type PodClient = PodResourcesListerClient<tonic::transport::Channel>;

/// PodResources `List()` as assignments, on `client` or a new connection; returns the client for
/// the next call.
pub async fn list_pod_resources(
    socket: &Path,
    client: Option<PodClient>,
) -> Result<(Vec<Assignment>, PodClient), AgentError> {
    let mut client = match client {
        Some(c) => c,
        None => PodResourcesListerClient::new(
            gpuops_kubelet_api::unix::connect(socket)
                .await
                .map_err(AgentError::PodResourcesConnect)?,
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES),
    };
    let response = client
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| AgentError::PodResourcesList(Box::new(s)))?
        .into_inner();
    let mut out = Vec::new();
    for pod in response.pod_resources {
        for container in pod.containers {
            for devices in container.devices {
                out.push(Assignment {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                    resource: devices.resource_name,
                    device_ids: devices.device_ids,
                });
            }
        }
    }
    Ok((out, client))
}
