//! Reading what `gpuops migrate` translates: the GPU Operator's ClusterPolicy, NVIDIA's
//! DaemonSets and the ConfigMaps of their namespaces, and (for `--check`) the nodes. Every object
//! comes back as JSON with its apiVersion and kind, as `kubectl get -o json` prints it, so the
//! translation reads files and the cluster alike.

use crate::cluster::list_all;
use crate::error::ObserveError;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use serde_json::Value;
use std::collections::BTreeSet;

type Result<T, E = ObserveError> = std::result::Result<T, E>;

/// Whether a DaemonSet runs one of NVIDIA's node components (by image, as the translation
/// classifies containers), so its namespace's ConfigMaps are read.
fn is_nvidia(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .is_some_and(|p| {
            p.containers.iter().any(|c| {
                c.image.as_deref().is_some_and(|i| {
                    [
                        "k8s-device-plugin",
                        "gpu-feature-discovery",
                        "mig-manager",
                        "dcgm-exporter",
                    ]
                    .iter()
                    .any(|n| i.contains(n))
                })
            })
        })
}

fn json<T: serde::Serialize>(what: &str, o: &T) -> Result<Value> {
    serde_json::to_value(o).map_err(|e| ObserveError::Json {
        what: what.to_string(),
        source: e,
    })
}

/// The ClusterPolicies (none when the CRD is not installed), NVIDIA's DaemonSets, the
/// ConfigMaps of their namespaces and of `namespace`, and with `nodes` every Node.
pub async fn nvidia_objects(
    client: &Client,
    namespace: Option<&str>,
    nodes: bool,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    let gvk = GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "clusterpolicies");
    let policies: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    match list_all(policies, "ClusterPolicies", ListParams::default()).await {
        Ok(list) => {
            for p in list {
                let mut v = json("a ClusterPolicy", &p)?;
                v["apiVersion"] = Value::String("nvidia.com/v1".into());
                v["kind"] = Value::String("ClusterPolicy".into());
                out.push(v);
            }
        }
        // No CRD (or not that version): a cluster without the GPU Operator.
        Err(ObserveError::Kube {
            source: kube::Error::Api(e),
            ..
        }) if e.code == 404 => {}
        Err(e) => return Err(e),
    }
    let daemonsets = match namespace {
        Some(ns) => Api::<DaemonSet>::namespaced(client.clone(), ns),
        None => Api::<DaemonSet>::all(client.clone()),
    };
    let mut namespaces: BTreeSet<String> = namespace.map(str::to_string).into_iter().collect();
    for ds in list_all(daemonsets, "DaemonSets", ListParams::default()).await? {
        if is_nvidia(&ds) {
            if let Some(ns) = &ds.metadata.namespace {
                namespaces.insert(ns.clone());
            }
            out.push(json("a DaemonSet", &ds)?);
        }
    }
    for ns in &namespaces {
        let cms = Api::<ConfigMap>::namespaced(client.clone(), ns);
        for cm in list_all(cms, &format!("ConfigMaps in {ns}"), ListParams::default()).await? {
            out.push(json("a ConfigMap", &cm)?);
        }
    }
    if nodes {
        for n in list_all(
            Api::<Node>::all(client.clone()),
            "nodes",
            ListParams::default(),
        )
        .await?
        {
            out.push(json("a Node", &n)?);
        }
    }
    Ok(out)
}
