//! Applying a decision: scale subresource patches, the Machine delete annotation, cordon and
//! eviction. Every step is idempotent against what the cluster shows, so a step interrupted by a
//! crash or a failover is repeated, never doubled.

use crate::error::ControllerError;
use gpuops_autoscale::{Removal, ScaleUp, TimedOut};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, EvictParams, GroupVersionKind, Patch, PatchParams,
};
use serde_json::{Value, json};

/// Cluster API group and the version served by v1.14.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
pub const CAPI_VERSION: &str = "v1beta2";
/// Cluster API's Machine annotation that makes its MachineSet delete it first on scale-down.
pub const DELETE_MACHINE: &str = "cluster.x-k8s.io/delete-machine";
/// Our Machine annotation: the MachineDeployment replicas when we decided to remove it. The
/// decrement is applied only while replicas still equal it, so a repeat after a crash is a no-op.
pub const REMOVE_AT_REPLICAS: &str = "gpuops.io/remove-at-replicas";
/// Field manager of the controller's writes.
pub const MANAGER: &str = "gpuops-controller";

/// The `ApiResource` of a Cluster API kind.
pub fn capi(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, kind))
}

fn split(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("default", key))
}

fn api_err(what: String) -> impl FnOnce(kube::Error) -> ControllerError {
    move |source| ControllerError::Api { what, source }
}

/// Raises a pool's replicas from `from` to `to`, only if they are still `from` (the
/// resourceVersion precondition of the MachineDeployment makes a concurrent change a 409).
pub async fn scale_up(
    client: &kube::Client,
    su: &ScaleUp,
    md: &Value,
) -> Result<(), ControllerError> {
    let (ns, name) = split(&su.pool);
    let current = md["spec"]["replicas"].as_u64().unwrap_or(0);
    if current != u64::from(su.from) {
        return Ok(()); // someone already changed it; the next decision sees the new value
    }
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &capi("MachineDeployment"));
    let rv = md["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let patch = json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": su.to}});
    api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err(format!(
            "scaling MachineDeployment {} to {}",
            su.pool, su.to
        )))?;
    Ok(())
}

/// Marks a Machine for deletion and lowers its pool's replicas by one, once.
pub async fn remove_machine(
    client: &kube::Client,
    machine_key: &str,
    pool: &str,
    md: &Value,
) -> Result<(), ControllerError> {
    let (ns, name) = split(machine_key);
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &capi("Machine"));
    let m = machines
        .get(name)
        .await
        .map_err(api_err(format!("reading Machine {machine_key}")))?;
    let replicas = md["spec"]["replicas"].as_u64().unwrap_or(0);
    let recorded = m
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REMOVE_AT_REPLICAS))
        .and_then(|v| v.parse::<u64>().ok());
    let at = match recorded {
        Some(at) => at,
        None => {
            let patch = json!({"metadata": {"annotations": {
                DELETE_MACHINE: "true",
                REMOVE_AT_REPLICAS: replicas.to_string(),
            }}});
            machines
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_err(format!(
                    "marking Machine {machine_key} for deletion"
                )))?;
            replicas
        }
    };
    if replicas != at || replicas == 0 {
        return Ok(()); // already lowered
    }
    let (pns, pname) = split(pool);
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), pns, &capi("MachineDeployment"));
    let rv = md["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let patch = json!({"metadata": {"resourceVersion": rv}, "spec": {"replicas": replicas - 1}});
    api.patch_scale(pname, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err(format!(
            "scaling MachineDeployment {pool} to {}",
            replicas - 1
        )))?;
    Ok(())
}

/// A machine that timed out: remove it (its replica goes with it).
pub async fn time_out(
    client: &kube::Client,
    t: &TimedOut,
    md: &Value,
) -> Result<(), ControllerError> {
    remove_machine(client, &t.machine, &t.pool, md).await
}

/// What a removal step achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// Pods are still being evicted (or a PDB answered 429): try again next pass.
    InProgress,
    /// The node is empty and its Machine was handed to Cluster API.
    Removed,
}

/// Cordons the node (with our annotation, so the removal survives a restart), evicts its pods
/// through the Eviction API (PDBs apply: 429 means wait), and once none is left removes its
/// Machine.
pub async fn remove_node(
    client: &kube::Client,
    r: &Removal,
    remaining: &[String],
    md: &Value,
) -> Result<Drain, ControllerError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({
        "metadata": {"annotations": {gpuops_autoscale::snapshot::NODE_REMOVING: "true"}},
        "spec": {"unschedulable": true}
    });
    nodes
        .patch(&r.node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err(format!("cordoning node {}", r.node)))?;
    let mut left = false;
    for pod in remaining {
        let (ns, name) = split(pod);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        match pods.evict(name, &EvictParams::default()).await {
            Ok(_) => left = true,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            // A PDB does not allow it now: wait for the next pass.
            Err(kube::Error::Api(s)) if s.code == 429 => left = true,
            Err(e) => {
                return Err(api_err(format!("evicting pod {pod} from node {}", r.node))(
                    e,
                ));
            }
        }
    }
    if left {
        return Ok(Drain::InProgress);
    }
    match &r.machine {
        Some(m) => remove_machine(client, m, &r.pool, md)
            .await
            .map(|()| Drain::Removed),
        None => Ok(Drain::InProgress),
    }
}
