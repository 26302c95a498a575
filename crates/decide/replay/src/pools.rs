//! The pools file of a replay: node pools (GPU model, size, price, limits, MIG config) and the
//! node-lifecycle delays, as YAML; every error names the file and the line.
//!
//! ```yaml
//! boot: 5m              # machine created -> node Ready (default 5m)
//! device-plugin: 1m     # node Ready -> GPUs advertised (default 1m)
//! mig-change: 1m        # a re-partition keeps the node's free MIG devices away this long
//! scale-down-idle: 10m  # gpuops: a node without GPU pods is removed after this (default 10m)
//! fractional: mig       # pods asking part of a GPU ask a MIG slice (mig) or a shared GPU (shared)
//! pools:
//!   - name: t4-x2
//!     model: T4          # the trace's model name (gpu_spec) or a catalog key
//!     gpus: 2
//!     cpu: 104           # cores
//!     memory: 512Gi
//!     price-per-hour: 2.5
//!     min: 0             # default 0
//!     max: 1000          # default 1000
//!   - name: a100-3g
//!     model: A100-SXM4-80GB
//!     gpus: 8
//!     cpu: 96
//!     memory: 1152Gi
//!     price-per-hour: 40.96
//!     mig-config: all-3g.40gb   # NVIDIA's named config the nodes come up with
//! ```

use crate::error::ReplayError;
use gpuops_catalog::GpuModel;
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::collections::BTreeMap;
use std::time::Duration;

/// How pods asking part of a GPU (`gpu_milli` < 1000) ask for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fractional {
    /// The smallest MIG profile of the MIG pools' model with at least that share of the SMs.
    Mig,
    /// A share of one GPU (`gpuops.io/gpu-milli`) on whole-GPU pools.
    Shared,
}

/// The MIG layout a pool's nodes come up with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigLayout {
    /// NVIDIA's config name (`all-3g.40gb`), the nodes' `nvidia.com/mig.config`.
    pub config: String,
    /// MIG devices per GPU.
    pub per_gpu: Vec<BTreeMap<String, u32>>,
}

/// One node pool.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReplayPool {
    pub name: String,
    /// `nvidia.com/gpu.product` of its nodes; matched against the trace's `gpu_spec`.
    pub model: String,
    pub gpus: u32,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub price_per_hour: f64,
    pub min: u32,
    pub max: u32,
    pub boot: Duration,
    pub device_plugin: Duration,
    pub mig: Option<MigLayout>,
    /// Line of the pool in the file (for messages).
    pub line: u64,
}

impl ReplayPool {
    /// The catalog model of a MIG pool.
    pub fn catalog(&self) -> Option<&'static GpuModel> {
        gpuops_autoscale::mig_demand::model_of(&self.model)
    }
}

/// A parsed, validated pools file.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PoolsFile {
    pub pools: Vec<ReplayPool>,
    pub mig_change: Duration,
    pub scale_down_idle: Duration,
    pub fractional: Fractional,
}

impl PoolsFile {
    /// The MIG pools' catalog model (validated to be one), if there are MIG pools.
    pub fn mig_model(&self) -> Option<&'static GpuModel> {
        self.pools
            .iter()
            .find(|p| p.mig.is_some())
            .and_then(ReplayPool::catalog)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFile {
    #[serde(default)]
    boot: Option<Spanned<String>>,
    #[serde(default)]
    device_plugin: Option<Spanned<String>>,
    #[serde(default)]
    mig_change: Option<Spanned<String>>,
    #[serde(default)]
    scale_down_idle: Option<Spanned<String>>,
    #[serde(default)]
    fractional: Option<Spanned<String>>,
    pools: Spanned<Vec<Spanned<RawPool>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPool {
    name: Spanned<String>,
    model: Spanned<String>,
    gpus: Spanned<u32>,
    cpu: Spanned<f64>,
    memory: Spanned<String>,
    price_per_hour: Spanned<f64>,
    #[serde(default)]
    min: Option<Spanned<u32>>,
    #[serde(default)]
    max: Option<Spanned<u32>>,
    #[serde(default)]
    boot: Option<Spanned<String>>,
    #[serde(default)]
    device_plugin: Option<Spanned<String>>,
    #[serde(default)]
    mig_config: Option<Spanned<String>>,
}

/// Per GPU of a model: the MIG devices a named NVIDIA config gives it (`None`: MIG off).
fn resolve_config(
    model: &GpuModel,
    config: &str,
    gpus: u32,
) -> Result<Vec<Option<BTreeMap<String, u32>>>, gpuops_mig::MigError> {
    let configs = gpuops_mig::config::nvidia_default_configs();
    let named = configs.get(config)?;
    let mut per_gpu = vec![None; gpus as usize];
    for (g, slot) in per_gpu.iter_mut().enumerate() {
        // Entries apply in order: the last one selecting a GPU decides its state.
        for e in &named.entries {
            let model_ok = e.filters.is_empty()
                || e.filters
                    .iter()
                    .any(|f| model.pci_device_ids.contains(&((f.device >> 16) as u16)));
            let index_ok = match &e.devices {
                gpuops_mig::config::Devices::All => true,
                gpuops_mig::config::Devices::List(l) => {
                    l.contains(&u32::try_from(g).unwrap_or(u32::MAX))
                }
            };
            if model_ok && index_ok {
                *slot = e.mig_enabled.then(|| e.mig_devices.clone());
            }
        }
    }
    Ok(per_gpu)
}

/// The MIG layout of a pool with `mig-config`: every GPU of its model must get MIG devices.
fn mig_layout(
    file: &str,
    name: &str,
    p: &RawPool,
    model: &str,
) -> Result<Option<MigLayout>, ReplayError> {
    let at = |s: &dyn Fn() -> u64, m: String| ReplayError::Pools {
        file: file.to_string(),
        line: s(),
        column: None,
        message: format!("pool {name:?}: {m}"),
    };
    Ok(match &p.mig_config {
        None => None,
        Some(c) => {
            let cl = c.referenced.line();
            let cat = gpuops_autoscale::mig_demand::model_of(model)
                .filter(|m| m.mig_capable())
                .ok_or_else(|| {
                    at(
                        &|| p.model.referenced.line(),
                        format!(
                            "model {model:?} is not a MIG-capable GPU of the catalog, so mig-config cannot apply (MIG-capable: {})",
                            gpuops_catalog::models()
                                .iter()
                                .filter(|m| m.mig_capable())
                                .map(|m| m.key)
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })?;
            let per = resolve_config(cat, &c.value, p.gpus.value)
                .map_err(|e| at(&|| cl, format!("mig-config: {e}")))?;
            if per.iter().any(Option::is_none) {
                return Err(at(
                    &|| cl,
                    format!(
                        "mig-config: {:?} leaves some GPU of {} without MIG; a MIG pool's config must enable MIG on every GPU",
                        c.value, cat.key
                    ),
                ));
            }
            Some(MigLayout {
                config: c.value.clone(),
                per_gpu: per.into_iter().flatten().collect(),
            })
        }
    })
}

/// Parses and validates a pools file. `file` names it in errors.
///
/// # Errors
/// [`ReplayError::Pools`] naming the file, the line and the problem.
// Long on purpose: one key after another of the pools file, each a few lines of parsing with its own error; a table in code.
pub fn parse_pools(file: &str, text: &str) -> Result<PoolsFile, ReplayError> {
    let err = |line: u64, message: String| ReplayError::Pools {
        file: file.to_string(),
        line,
        column: None,
        message,
    };
    let raw: RawFile = serde_saphyr::from_str(text).map_err(|e| {
        let tree: Option<gpuops_yamlpos::SNode> = serde_saphyr::from_str(text).ok();
        let p = gpuops_yamlpos::explain(&e, tree.as_ref(), text);
        ReplayError::Pools {
            file: file.to_string(),
            line: p.line.unwrap_or(0),
            column: p.column,
            message: p.message,
        }
    })?;
    let duration = |v: &Option<Spanned<String>>,
                    key: &str,
                    default: Duration|
     -> Result<Duration, ReplayError> {
        match v {
            None => Ok(default),
            Some(s) => gpuops_duration::parse(&s.value)
                .map_err(|e| err(s.referenced.line(), format!("{key}: {e}"))),
        }
    };
    let boot = duration(&raw.boot, "boot", Duration::from_secs(300))?;
    let device_plugin = duration(&raw.device_plugin, "device-plugin", Duration::from_secs(60))?;
    let mig_change = duration(&raw.mig_change, "mig-change", Duration::from_secs(60))?;
    let scale_down_idle = duration(
        &raw.scale_down_idle,
        "scale-down-idle",
        Duration::from_secs(600),
    )?;
    if raw.pools.value.is_empty() {
        return Err(err(
            raw.pools.referenced.line(),
            "pools: the list is empty; give at least one pool".into(),
        ));
    }
    let mut pools: Vec<ReplayPool> = Vec::new();
    for sp in &raw.pools.value {
        let line = sp.referenced.line();
        let p = &sp.value;
        let name = p.name.value.trim().to_string();
        let at = |s: &dyn Fn() -> u64, m: String| err(s(), format!("pool {name:?}: {m}"));
        if name.is_empty() {
            return Err(err(p.name.referenced.line(), "pool name is empty".into()));
        }
        if pools.iter().any(|q| q.name == name) {
            return Err(err(
                p.name.referenced.line(),
                format!("pool name {name:?} is used twice"),
            ));
        }
        if p.gpus.value == 0 || p.gpus.value > 64 {
            return Err(at(
                &|| p.gpus.referenced.line(),
                format!("gpus: {} is not in 1..=64", p.gpus.value),
            ));
        }
        if !(p.cpu.value.is_finite() && p.cpu.value > 0.0) {
            return Err(at(
                &|| p.cpu.referenced.line(),
                format!("cpu: {} must be more than 0 (cores)", p.cpu.value),
            ));
        }
        let memory = gpuops_kubemodel::quantity(&p.memory.value)
            .filter(|m| *m > 0.0)
            .ok_or_else(|| {
                at(
                    &|| p.memory.referenced.line(),
                    format!(
                        "memory: {:?} is not a quantity above zero such as 512Gi",
                        p.memory.value
                    ),
                )
            })?;
        if !(p.price_per_hour.value.is_finite() && p.price_per_hour.value >= 0.0) {
            return Err(at(
                &|| p.price_per_hour.referenced.line(),
                format!(
                    "price-per-hour: {} must be a number of 0 or more",
                    p.price_per_hour.value
                ),
            ));
        }
        let min = p.min.as_ref().map_or(0, |m| m.value);
        let max = p.max.as_ref().map_or(1000, |m| m.value);
        // The replay makes every node it buys, up to max: bounded like a cluster's pools.
        let limit = gpuops_autoscale::pool::MAX_POOL_NODES;
        if let Some(over) = [&p.min, &p.max]
            .into_iter()
            .flatten()
            .find(|m| m.value > limit)
        {
            return Err(at(
                &|| over.referenced.line(),
                format!(
                    "min/max {}: more than {limit}, the most nodes a pool may have (twice the 5,000 nodes Kubernetes supports per cluster); accepted: 0 to {limit}",
                    over.value
                ),
            ));
        }
        if max == 0 || min > max {
            return Err(at(
                &|| p.max.as_ref().map_or(line, |m| m.referenced.line()),
                format!("min {min} and max {max}: need 0 <= min <= max and max >= 1"),
            ));
        }
        let model = p.model.value.trim().to_string();
        if model.is_empty() {
            return Err(at(&|| p.model.referenced.line(), "model is empty".into()));
        }
        let mig = mig_layout(file, &name, p, &model)?;
        pools.push(ReplayPool {
            name,
            model,
            gpus: p.gpus.value,
            cpu_milli: (p.cpu.value * 1000.0).round() as u64,
            memory_mib: (memory / 1_048_576.0).floor() as u64,
            price_per_hour: p.price_per_hour.value,
            min,
            max,
            boot: duration(&p.boot, "boot", boot)?,
            device_plugin: duration(&p.device_plugin, "device-plugin", device_plugin)?,
            mig,
            line,
        });
    }
    // Fractional pods are mapped to one model's profile names, so MIG pools share a model.
    let mig_pools: Vec<&ReplayPool> = pools.iter().filter(|p| p.mig.is_some()).collect();
    if let Some(first) = mig_pools.first()
        && let Some(other) = mig_pools
            .iter()
            .find(|p| p.catalog().map(|m| m.key) != first.catalog().map(|m| m.key))
    {
        return Err(err(
            other.line,
            format!(
                "pool {:?}: MIG pools must share one GPU model (pool {:?} has {}, this one {}): fractional pods are mapped to that model's MIG profiles",
                other.name, first.name, first.model, other.model
            ),
        ));
    }
    let fractional = match &raw.fractional {
        None if mig_pools.is_empty() => Fractional::Shared,
        None => Fractional::Mig,
        Some(f) => match f.value.as_str() {
            "mig" if mig_pools.is_empty() => {
                return Err(err(
                    f.referenced.line(),
                    "fractional: mig needs at least one pool with mig-config".into(),
                ));
            }
            "mig" => Fractional::Mig,
            "shared" => Fractional::Shared,
            other => {
                return Err(err(
                    f.referenced.line(),
                    format!("fractional: {other:?} is not mig or shared"),
                ));
            }
        },
    };
    Ok(PoolsFile {
        pools,
        mig_change,
        scale_down_idle,
        fractional,
    })
}
