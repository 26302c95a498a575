//! Per-node device plugin config: NVIDIA's `nvidia.com/device-plugin.config` node label picks one of
//! several named configs, watched by the agent itself (no sidecar, no restart).

use crate::error::AgentError;
use gpuops_resources::config::Config;
use std::collections::BTreeMap;
use std::path::Path;

/// Named device plugin configs, by name.
pub type NamedConfigs = BTreeMap<String, Config>;

/// The node label that selects a named config.
pub const LABEL: &str = "nvidia.com/device-plugin.config";

/// Named configs from a directory (a mounted ConfigMap): each file `NAME`, `NAME.yaml`, `NAME.yml` or
/// `NAME.json` is the config `NAME`. Hidden files (a ConfigMap mount's `..data` links) are skipped.
pub fn load_dir(dir: &Path) -> Result<NamedConfigs, AgentError> {
    let mut configs = BTreeMap::new();
    let unreadable = |error: std::io::Error| {
        AgentError::Config(Box::new(AgentError::ReadConfigDir {
            dir: dir.to_path_buf(),
            error,
        }))
    };
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
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
        let file = std::fs::File::open(&path).map_err(|error| {
            AgentError::Config(Box::new(AgentError::ReadNamedConfig {
                path: path.clone(),
                error,
            }))
        })?;
        let origin = path.display().to_string();
        let config = Config::read(file, &origin)
            .map_err(|e| AgentError::Config(Box::new(AgentError::Resources(e))))?;
        configs.insert(name, crate::config_warnings::note(&origin, config));
    }
    Ok(configs)
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
        let err = load_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("bad.yaml"), "{err}");
    }
}
