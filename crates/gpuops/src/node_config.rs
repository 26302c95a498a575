//! Per-node device plugin config: NVIDIA's `nvidia.com/device-plugin.config` node label picks one of
//! several named configs, watched by the agent itself (no sidecar, no restart).

use anyhow::{Context, Result};
use futures::StreamExt;
use gpuops_resources::config::Config;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::path::Path;
use tokio::sync::watch;

/// The node label that selects a named config.
pub const LABEL: &str = "nvidia.com/device-plugin.config";

/// Named configs from a directory (a mounted ConfigMap): each file `NAME`, `NAME.yaml`, `NAME.yml` or
/// `NAME.json` is the config `NAME`. Hidden files (a ConfigMap mount's `..data` links) are skipped.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, Config>> {
    let mut configs = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading config directory {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading config directory {}", dir.display()))?
            .path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        if file.starts_with('.') || !path.is_file() {
            continue;
        }
        let name = ["yaml", "yml", "json"]
            .iter()
            .find_map(|ext| file.strip_suffix(&format!(".{ext}")))
            .unwrap_or(file)
            .to_string();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let origin = path.display().to_string();
        let parsed = Config::parse(&text, &origin)?;
        configs.insert(name, crate::config_warnings::note(&origin, parsed));
    }
    Ok(configs)
}

/// Follows the labels of `node` (KUBECONFIG or in-cluster) into `tx`: `None` until the node was
/// read once. Watch errors are retried with backoff; stops when every receiver is gone.
pub async fn watch_labels(
    node: String,
    tx: watch::Sender<Option<BTreeMap<String, String>>>,
) -> Result<()> {
    let client = kube::Client::try_default().await.context(
        "connecting to Kubernetes (KUBECONFIG or in-cluster) to watch the node's labels",
    )?;
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut nodes = watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(event) = nodes.next().await {
        match event {
            Ok(n) => {
                let labels = n.labels().clone();
                tx.send_if_modified(|current| {
                    let changed = current.as_ref() != Some(&labels);
                    *current = Some(labels.clone());
                    changed
                });
            }
            Err(e) => tracing::warn!("watching node {node}: {e}"),
        }
        if tx.is_closed() {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_directory_maps_files_to_names_and_reports_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("default.yaml"), "version: v1\n").unwrap();
        std::fs::write(
            dir.path().join("shared"),
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 4\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("..data"), "ignored").unwrap();
        let configs = load_dir(dir.path()).unwrap();
        assert_eq!(
            configs.keys().collect::<Vec<_>>(),
            vec!["default", "shared"]
        );
        std::fs::write(dir.path().join("bad.yaml"), "version: v9\n").unwrap();
        let err = format!("{:#}", load_dir(dir.path()).unwrap_err());
        assert!(err.contains("bad.yaml"), "{err}");
    }
}
