//! Node and Pod builders for tests of this crate and of its users (feature `testkit`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::{ANNOTATION_MILLI, GPU, GPU_SHARED};
use k8s_openapi::api::core::v1::{Node, Pod};

pub fn node(name: &str, gpus: u32, replicas: u32, shared_name: bool) -> Node {
    let mut labels = serde_json::json!({
        "nvidia.com/gpu.count": gpus.to_string(),
        "nvidia.com/gpu.product": "Tesla-T4",
    });
    if replicas > 1 {
        labels["nvidia.com/gpu.replicas"] = replicas.to_string().into();
    }
    let resource = if shared_name { GPU_SHARED } else { GPU };
    serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": labels},
            "status": {
                "capacity": {"cpu": "32", "memory": "64Gi", resource: (gpus * replicas).to_string()},
                "allocatable": {"cpu": "31500m", "memory": "63Gi", resource: (gpus * replicas).to_string()},
            }
        }))
        .unwrap()
}

pub fn pod(name: &str, node: Option<&str>, resource: &str, count: u32, milli: Option<u32>) -> Pod {
    let mut annotations = serde_json::json!({});
    if let Some(m) = milli {
        annotations[ANNOTATION_MILLI] = m.to_string().into();
    }
    let mut requests = serde_json::json!({"cpu": "1", "memory": "2Gi"});
    if count > 0 {
        requests[resource] = count.to_string().into();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "annotations": annotations,
                     "creationTimestamp": format!("2025-01-01T00:00:{:02}Z", name.len())},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"requests": requests}}]
        }
    }))
    .unwrap()
}
