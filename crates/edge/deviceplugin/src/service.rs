//! One resource's DevicePlugin gRPC service: ListAndWatch from the published state, Allocate and
//! GetPreferredAllocation through the pure resource model.

use crate::published::Published;
use gpuops_kubelet_api::deviceplugin::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo,
    device_plugin_server::DevicePlugin,
};
use gpuops_kubelet_api::{HEALTHY, UNHEALTHY};
use gpuops_resources::allocate::allocate;
use gpuops_resources::model::Resource;
use gpuops_resources::preferred::preferred_allocation;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The service for one resource name.
pub struct PluginService {
    resource: String,
    feed: watch::Receiver<Arc<Published>>,
}

impl PluginService {
    pub fn new(resource: String, feed: watch::Receiver<Arc<Published>>) -> PluginService {
        PluginService { resource, feed }
    }

    fn current(&self) -> (Arc<Published>, Option<Resource>) {
        let published = self.feed.borrow().clone();
        let resource = published
            .resources
            .iter()
            .find(|r| r.name == self.resource)
            .cloned();
        (published, resource)
    }
}

/// The kubelet's view of a resource's devices.
fn devices(resource: Option<&Resource>) -> Vec<Device> {
    resource
        .map(|r| {
            r.devices
                .iter()
                .map(|d| Device {
                    id: d.id.clone(),
                    health: if d.health_ok { HEALTHY } else { UNHEALTHY }.to_string(),
                    topology: d.numa_node.map(|n| TopologyInfo {
                        nodes: vec![NumaNode { id: i64::from(n) }],
                    }),
                })
                .collect()
        })
        .unwrap_or_default()
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    type ListAndWatchStream = DeviceStream;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let mut feed = self.feed.clone();
        let name = self.resource.clone();
        tokio::spawn(async move {
            let mut last: Option<Vec<Device>> = None;
            loop {
                let now = {
                    let published = feed.borrow_and_update().clone();
                    devices(published.resources.iter().find(|r| r.name == name))
                };
                // Every message is the full list; send only when it changed.
                if last.as_ref() != Some(&now) {
                    if tx
                        .send(Ok(ListAndWatchResponse {
                            devices: now.clone(),
                        }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    changed = feed.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let (published, resource) = self.current();
        let resource = resource
            .ok_or_else(|| Status::not_found(format!("{} is not advertised", self.resource)))?;
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size)
                .map_err(|_| Status::invalid_argument("negative allocation size"))?;
            let chosen = preferred_allocation(
                &resource,
                &c.available_device_i_ds,
                &c.must_include_device_i_ds,
                size,
                &published.config,
                &published.inventory,
            )
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
            container_responses.push(ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let (published, resource) = self.current();
        let resource = resource
            .ok_or_else(|| Status::not_found(format!("{} is not advertised", self.resource)))?;
        let host = Arc::clone(&published.host);
        let mut container_responses = Vec::new();
        for c in request.into_inner().container_requests {
            let a = allocate(&resource, &c.devices_ids, &published.config, &host).map_err(|e| {
                tracing::warn!(resource = %self.resource, "Allocate refused: {e}");
                Status::invalid_argument(e.to_string())
            })?;
            tracing::info!(resource = %self.resource, devices = ?c.devices_ids, "allocated");
            container_responses.push(ContainerAllocateResponse {
                envs: a.envs.into_iter().collect(),
                mounts: a
                    .mounts
                    .into_iter()
                    .map(|m| Mount {
                        container_path: m.container_path,
                        host_path: m.host_path,
                        read_only: m.read_only,
                    })
                    .collect(),
                devices: a
                    .device_specs
                    .into_iter()
                    .map(|d| DeviceSpec {
                        container_path: d.container_path,
                        host_path: d.host_path,
                        permissions: d.permissions,
                    })
                    .collect(),
                annotations: a.annotations.into_iter().collect(),
                cdi_devices: a
                    .cdi_devices
                    .into_iter()
                    .map(|name| CdiDevice { name })
                    .collect(),
            });
        }
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
