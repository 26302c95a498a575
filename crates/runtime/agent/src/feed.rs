//! The device plugin config and what the plugins advertise, derived from every new state.
//!
//! The config is resolved here whether or not the agent serves the device plugin: the node's
//! labels (`nvidia.com/mig.strategy`, the MIG devices) need the same MIG strategy either way.

use crate::error::AgentError;
use crate::named::{LABEL, NamedConfigs};
use crate::state::NodeState;
use gpuops_deviceplugin::Published;
use gpuops_inventory::Inventory;
use gpuops_resources::HostDevices;
use gpuops_resources::config::{Config, Overrides};
use gpuops_resources::health::HealthTracker;
use k8s_openapi::api::core::v1::Node;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where the device plugin config comes from: a file or named configs picked by a node label,
/// NVIDIA's env vars over it, flags over those.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    pub file: Option<PathBuf>,
    pub named: Option<NamedConfigs>,
    /// The named config for a node without the label (NVIDIA's chart: `config.default`); `None`:
    /// the one named `default`, else the only one.
    pub default_name: Option<String>,
    pub flags: Overrides,
    /// NVIDIA's env vars (MIG_STRATEGY, ...), read once by the binary.
    pub env: Overrides,
}

impl ConfigSource {
    /// The effective config for the named config `label` (when configs are named).
    pub fn resolve(&self, label: Option<&str>) -> Result<Config, AgentError> {
        let parsed = match (&self.file, &self.named) {
            (_, Some(configs)) => Some(
                gpuops_resources::select_named(configs, label, self.default_name.as_deref())?
                    .config,
            ),
            (Some(path), None) => {
                let file =
                    std::fs::File::open(path).map_err(|error| AgentError::ReadConfigFile {
                        path: path.clone(),
                        error,
                    })?;
                let origin = path.display().to_string();
                let parsed = Config::read(file, &origin)?;
                Some(crate::config_warnings::note(&origin, parsed))
            }
            (None, None) => None,
        };
        Ok(Config::effective(parsed, &self.env, &self.flags)?)
    }
}

/// What the device plugins advertise for an inventory; a model error advertises nothing (unless
/// FAIL_ON_INIT_ERROR, then it is returned), so the agent keeps running.
///
/// A MIG layout the strategy cannot serve (single with mixed profiles) is a state of the GPUs,
/// not a failure to start: it advertises nothing whatever FAIL_ON_INIT_ERROR says, so the agent
/// keeps running (as GFD does, labelling `-MIG-INVALID`) and recovers when the layout changes,
/// instead of crash-looping in its DaemonSet. The node condition says why.
pub fn publish(
    inv: &Inventory,
    config: &Config,
    health: &HealthTracker,
    host: &Arc<HostDevices>,
) -> Result<Published, gpuops_resources::ResourcesError> {
    let resources = match gpuops_resources::resources(inv, config) {
        Ok(mut r) => {
            health.apply(&mut r);
            r
        }
        Err(e) if gpuops_resources::is_invalid_mig_layout(&e) => {
            tracing::error!(error = %e, "device plugin: {e}; advertising nothing until the MIG layout or the strategy changes");
            Vec::new()
        }
        Err(e) if config.fail_on_init_error() => return Err(e),
        Err(e) => {
            tracing::error!(error = %e, "device plugin: {e}; advertising nothing until this is fixed");
            Vec::new()
        }
    };
    Ok(Published {
        resources,
        config: config.clone(),
        inventory: Arc::new(inv.clone()),
        host: Arc::clone(host),
    })
}

fn describe_resources(p: &Published) -> String {
    let parts: Vec<String> = p
        .resources
        .iter()
        .map(|r| format!("{} {}/{}", r.name, r.healthy_count(), r.devices.len()))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

struct Feed {
    source: ConfigSource,
    config: Config,
    /// The modification time of the config file in use.
    file_seen: Option<SystemTime>,
    /// The named config in use (the node label's value).
    label_in_use: Option<String>,
    published: watch::Sender<Arc<Published>>,
    configs: watch::Sender<Arc<Config>>,
    host: Arc<HostDevices>,
}

/// Starts the feed; fails when the config cannot be resolved at start.
#[allow(clippy::type_complexity)]
pub(crate) fn spawn(
    source: ConfigSource,
    host: HostDevices,
    mut state: watch::Receiver<Arc<NodeState>>,
    mut busy: watch::Receiver<bool>,
    mut node: watch::Receiver<Option<Arc<Node>>>,
    mut stop: watch::Receiver<bool>,
) -> Result<
    (
        watch::Receiver<Arc<Config>>,
        watch::Receiver<Arc<Published>>,
        JoinHandle<()>,
    ),
    AgentError,
> {
    let config = source.resolve(None)?;
    let first = state.borrow_and_update().clone();
    let host = Arc::new(host);
    let initial = publish(&first.inventory, &config, &first.health, &host)?;
    let (published, published_rx) = watch::channel(Arc::new(initial));
    let (configs, configs_rx) = watch::channel(Arc::new(config.clone()));
    let file_seen = source.file.as_ref().and_then(|f| modified(f));
    let mut feed = Feed {
        source,
        config,
        file_seen,
        label_in_use: None,
        published,
        configs,
        host,
    };
    let task = tokio::spawn(async move {
        feed.republish(&first, *busy.borrow_and_update());
        loop {
            tokio::select! {
                changed = state.changed() => if changed.is_err() { return },
                changed = busy.changed() => if changed.is_err() { return },
                changed = node.changed(), if feed.source.named.is_some() => {
                    if changed.is_err() { return }
                }
                _ = stop.changed() => return,
            }
            let labels = node
                .borrow_and_update()
                .as_ref()
                .map(|n| n.metadata.labels.clone().unwrap_or_default());
            feed.reload(labels.as_ref().map(|l| l.get(LABEL).cloned()));
            let now = state.borrow_and_update().clone();
            feed.republish(&now, *busy.borrow_and_update());
        }
    });
    Ok((configs_rx, published_rx, task))
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Feed {
    /// Follows the node label (named configs) and the config file; a bad config is reported and
    /// the last good one stays in use. `label` is `None` until the node was read.
    fn reload(&mut self, label: Option<Option<String>>) {
        if self.source.named.is_some()
            && let Some(value) = label
            && value != self.label_in_use
        {
            self.label_in_use = value.clone();
            let shown = value.as_deref().unwrap_or("(none)");
            match self.source.resolve(value.as_deref()) {
                Ok(config) => {
                    tracing::info!(
                        label = LABEL,
                        value = shown,
                        "node label {LABEL}={shown}: device plugin config switched"
                    );
                    self.set(config);
                }
                Err(e) => {
                    tracing::error!(error = %e, "{e}; keeping the last good device plugin config")
                }
            }
        }
        let Some(path) = self.source.file.clone() else {
            return;
        };
        let now = modified(&path);
        if now == self.file_seen {
            return;
        }
        self.file_seen = now;
        match self.source.resolve(None) {
            Ok(config) => {
                tracing::info!(file = %path.display(), "device plugin config {} reloaded", path.display());
                self.set(config);
            }
            Err(e) => {
                tracing::error!(error = %e, "{e}; keeping the last good device plugin config")
            }
        }
    }

    fn set(&mut self, config: Config) {
        self.config = config.clone();
        self.configs.send_replace(Arc::new(config));
    }

    fn republish(&self, state: &NodeState, busy: bool) {
        match publish(&state.inventory, &self.config, &state.health, &self.host) {
            Ok(mut p) => {
                if busy {
                    // During a MIG change every resource stays registered with no devices, so
                    // the kubelet's allocatable drops to zero at once.
                    for r in &mut p.resources {
                        r.devices.clear();
                    }
                }
                if p.resources != self.published.borrow().resources {
                    tracing::info!("device plugin resources: {}", describe_resources(&p));
                    self.published.send_replace(Arc::new(p));
                }
            }
            Err(e) => tracing::error!(error = %e, "device plugin: {e}; keeping the last resources"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, MigDevice};

    fn mig_gpu(index: u32, profiles: &[&str]) -> Gpu {
        let mut g = Gpu {
            index,
            uuid: format!("GPU-{index}"),
            ..Gpu::default()
        };
        g.mig.capable = true;
        g.mig.current_enabled = true;
        g.mig_devices = profiles
            .iter()
            .enumerate()
            .map(|(i, p)| MigDevice {
                index: i as u32,
                uuid: format!("MIG-{index}-{i}"),
                profile: (*p).into(),
                ..MigDevice::default()
            })
            .collect();
        g
    }

    fn config(yaml: &str) -> Config {
        Config::effective(
            Some(Config::parse(yaml, "test").unwrap()),
            &Overrides::default(),
            &Overrides::default(),
        )
        .unwrap()
    }

    /// Single with mixed profiles: GFD keeps running and labels `-MIG-INVALID`; the agent keeps
    /// running too (FAIL_ON_INIT_ERROR or not) and advertises nothing, rather than exiting.
    #[test]
    fn an_invalid_single_layout_advertises_nothing_and_is_never_fatal() {
        let inv = Inventory {
            gpus: vec![
                mig_gpu(0, &["3g.40gb", "2g.20gb"]),
                mig_gpu(1, &["1g.10gb"]),
            ],
            ..Inventory::default()
        };
        let host = Arc::new(HostDevices::default());
        let health = HealthTracker::default();
        for flags in ["failOnInitError: true", "failOnInitError: false"] {
            let cfg = config(&format!("flags: {{migStrategy: single, {flags}}}"));
            let p = publish(&inv, &cfg, &health, &host).unwrap();
            assert!(p.resources.is_empty(), "{flags}: {:?}", p.resources);
        }
        // The same layout under mixed advertises both profiles.
        let p = publish(&inv, &config("flags: {migStrategy: mixed}"), &health, &host).unwrap();
        assert_eq!(p.resources.len(), 3, "{}", describe_resources(&p));
        // A fatal error that is not about the layout still stops a FAIL_ON_INIT_ERROR agent.
        let bad = config(
            "flags: {failOnInitError: true}\nsharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}, {name: nvidia.com/gpu, replicas: 3}]\n",
        );
        let whole = Inventory {
            gpus: vec![Gpu {
                index: 0,
                uuid: "GPU-0".into(),
                ..Gpu::default()
            }],
            ..Inventory::default()
        };
        assert!(publish(&whole, &bad, &health, &host).is_err());
    }
}
