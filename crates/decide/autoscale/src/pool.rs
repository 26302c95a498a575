//! Node pools from Cluster API MachineDeployments: the annotations Cluster Autoscaler's
//! clusterapi provider reads (so a CA user's MachineDeployments work unchanged), plus gpuops
//! annotations for what those cannot say (price, GPU product, MIG layout, time-slicing replicas,
//! stage timeouts).

use crate::error::AutoscaleError;
use crate::model::{NodeTemplate, PODS, Pool, StageTimeouts};
use gpuops_kubemodel::fit::Taint;
use serde_json::Value;
use std::collections::BTreeMap;

/// CA: the pool's minimum size (opts the MachineDeployment in, with the maximum).
pub const MIN_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
/// CA: the pool's maximum size.
pub const MAX_SIZE: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";
/// CA: scale-from-zero capacity annotations.
pub const CAPACITY_PREFIX: &str = "capacity.cluster-autoscaler.kubernetes.io/";
pub const CPU: &str = "capacity.cluster-autoscaler.kubernetes.io/cpu";
pub const MEMORY: &str = "capacity.cluster-autoscaler.kubernetes.io/memory";
pub const EPHEMERAL_DISK: &str = "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk";
pub const GPU_TYPE: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-type";
pub const GPU_COUNT: &str = "capacity.cluster-autoscaler.kubernetes.io/gpu-count";
pub const MAX_PODS: &str = "capacity.cluster-autoscaler.kubernetes.io/maxPods";
pub const TAINTS: &str = "capacity.cluster-autoscaler.kubernetes.io/taints";
pub const LABELS: &str = "capacity.cluster-autoscaler.kubernetes.io/labels";
/// CA per-pool option read as the provisioning limit.
pub const CA_MAX_PROVISION_TIME: &str = "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime";
/// gpuops: price of one node-hour (compared between pools; default 1).
pub const PRICE: &str = "gpuops.io/price-per-hour";
/// gpuops: the `nvidia.com/gpu.product` label value new nodes get.
pub const GPU_PRODUCT: &str = "gpuops.io/gpu-product";
/// gpuops: the named MIG config (`nvidia.com/mig.config`) new nodes come up with.
pub const MIG_CONFIG: &str = "gpuops.io/mig-config";
/// gpuops: MIG devices per GPU for a config NVIDIA's defaults do not have (`1g.10gb=7,2g.20gb=1`).
pub const MIG_DEVICES: &str = "gpuops.io/mig-devices";
/// gpuops: time-slicing replicas per GPU (the device plugin's sharing config).
pub const GPU_REPLICAS: &str = "gpuops.io/gpu-replicas";
/// gpuops: per-stage limits for new machines.
pub const PROVISION_TIMEOUT: &str = "gpuops.io/provision-timeout";
pub const REGISTRATION_TIMEOUT: &str = "gpuops.io/registration-timeout";
pub const DEVICES_TIMEOUT: &str = "gpuops.io/devices-timeout";

/// Whole GPUs.
pub const GPU: &str = "nvidia.com/gpu";
/// Time-sliced GPUs renamed by the device plugin.
pub const GPU_SHARED: &str = "nvidia.com/gpu.shared";

/// `namespace/name` of a MachineDeployment object.
pub fn pool_name(md: &Value) -> String {
    let meta = &md["metadata"];
    format!(
        "{}/{}",
        meta["namespace"].as_str().unwrap_or("default"),
        meta["name"].as_str().unwrap_or("")
    )
}

/// Whether the MachineDeployment opts in to autoscaling (has a min or a max size annotation).
pub fn is_pool(md: &Value) -> bool {
    let a = &md["metadata"]["annotations"];
    a.get(MIN_SIZE).is_some() || a.get(MAX_SIZE).is_some()
}

/// The most nodes a pool may have (min size, max size, `spec.replicas`): twice the 5,000 nodes
/// Kubernetes supports per cluster. The MIG view makes one node entry per launched node, so
/// `spec.replicas` sizes the controller's memory (4,000,000,000 would be 4 billion entries).
pub const MAX_POOL_NODES: u32 = 10_000;
/// The most time-slicing replicas per GPU `gpuops.io/gpu-replicas` may say: the device
/// plugin config's own limit (gpuops-resources' `MAX_TIME_SLICING_REPLICAS`).
pub const MAX_GPU_REPLICAS: u32 = 1024;

struct Reader<'a> {
    pool: String,
    annotations: BTreeMap<&'a str, &'a str>,
}

impl Reader<'_> {
    fn bad(&self, annotation: &str, reason: impl Into<String>) -> AutoscaleError {
        AutoscaleError::Annotation {
            pool: self.pool.clone(),
            annotation: annotation.to_string(),
            value: self
                .annotations
                .get(annotation)
                .copied()
                .unwrap_or("")
                .to_string(),
            reason: reason.into(),
        }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(|v| v.trim())
    }

    fn count(&self, key: &str) -> Result<Option<u32>, AutoscaleError> {
        self.get(key)
            .map(|v| match v.parse::<u128>() {
                Ok(n) => u32::try_from(n).map_err(|_| {
                    self.bad(
                        key,
                        format!("must be at most {} (a whole number)", u32::MAX),
                    )
                }),
                Err(_) => Err(self.bad(key, "must be a whole number (0 or more)")),
            })
            .transpose()
    }

    /// [`Reader::count`] with a limit; `why` says where the limit comes from.
    fn count_at_most(&self, key: &str, max: u32, why: &str) -> Result<Option<u32>, AutoscaleError> {
        match self.get(key).map(|v| v.parse::<u128>()) {
            Some(Ok(n)) if n > u128::from(max) => Err(self.bad(
                key,
                format!("must be at most {max} ({why}); accepted: 0 to {max}"),
            )),
            _ => self.count(key),
        }
    }

    fn quantity(&self, key: &str) -> Result<Option<f64>, AutoscaleError> {
        self.get(key)
            .map(|v| {
                gpuops_kubemodel::quantity(v).ok_or_else(|| {
                    self.bad(key, "must be a Kubernetes quantity such as 8, 500m, 64Gi")
                })
            })
            .transpose()
    }

    fn duration(&self, key: &str) -> Result<Option<std::time::Duration>, AutoscaleError> {
        self.get(key)
            .map(|v| {
                let d = gpuops_duration::parse(v).map_err(|e| self.bad(key, e.to_string()))?;
                if d.is_zero() {
                    return Err(self.bad(key, "must be longer than zero"));
                }
                Ok(d)
            })
            .transpose()
    }
}

/// The non-empty, trimmed items of a comma-separated annotation (absent: none).
fn list_items<'r>(r: &'r Reader<'_>, key: &str) -> impl Iterator<Item = &'r str> {
    r.get(key)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

/// Label keys to values, as a pool's annotations give them.
type Labels = BTreeMap<String, String>;

/// `k=v,k2=v2` (CA's labels annotation).
fn parse_labels(r: &Reader<'_>, key: &str) -> Result<Labels, AutoscaleError> {
    let mut out = BTreeMap::new();
    for part in list_items(r, key) {
        let Some((k, v)) = part.split_once('=') else {
            return Err(r.bad(key, format!("{part:?} is not key=value")));
        };
        if k.trim().is_empty() {
            return Err(r.bad(key, format!("{part:?} has an empty key")));
        }
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// `key=value:Effect,key2:Effect` (CA's taints annotation).
fn parse_taints(r: &Reader<'_>, key: &str) -> Result<Vec<Taint>, AutoscaleError> {
    let mut out = Vec::new();
    for part in list_items(r, key) {
        let Some((kv, effect)) = part.rsplit_once(':') else {
            return Err(r.bad(key, format!("{part:?} is not key=value:Effect")));
        };
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
            return Err(r.bad(
                key,
                format!(
                    "{part:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
                ),
            ));
        }
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        if k.is_empty() {
            return Err(r.bad(key, format!("{part:?} has an empty key")));
        }
        out.push(Taint {
            key: k.to_string(),
            value: v.to_string(),
            effect: effect.to_string(),
        });
    }
    Ok(out)
}

/// MIG devices per GPU in `1g.10gb=7,2g.20gb=1`.
fn parse_mig_devices(r: &Reader<'_>, key: &str) -> Result<BTreeMap<String, u64>, AutoscaleError> {
    let mut out = BTreeMap::new();
    for part in list_items(r, key) {
        let Some((profile, n)) = part.split_once('=') else {
            return Err(r.bad(
                key,
                format!("{part:?} is not profile=count (e.g. 1g.10gb=7)"),
            ));
        };
        let n: u64 = n
            .trim()
            .parse()
            .map_err(|_| r.bad(key, format!("{part:?}: the count is not a whole number")))?;
        // The MIG view makes one device entry per count: bounded like a mig-parted config's.
        let max = gpuops_mig::config::MAX_MIG_COUNT;
        if n > u64::from(max) {
            return Err(r.bad(
                key,
                format!(
                    "{part:?}: the count must be at most {max} per GPU (no GPU has more than 7 MIG slices)"
                ),
            ));
        }
        out.insert(profile.trim().to_string(), n);
    }
    if out.is_empty() {
        return Err(r.bad(key, "lists no MIG device"));
    }
    Ok(out)
}

/// The catalog model a `nvidia.com/gpu.product` value (or a catalog key) names.
fn model_for_product(product: &str) -> Option<&'static gpuops_catalog::GpuModel> {
    gpuops_catalog::models()
        .iter()
        .find(|m| m.nvml_name.replace(' ', "-").eq_ignore_ascii_case(product))
        .or_else(|| gpuops_catalog::lookup(product).ok())
}

/// Per GPU of the pool's nodes: `None` for a whole GPU, else its MIG devices.
fn mig_layout(
    r: &Reader<'_>,
    config: &str,
    product: Option<&str>,
    gpus: u32,
) -> Result<Vec<Option<BTreeMap<String, u64>>>, AutoscaleError> {
    let Some(product) = product else {
        return Err(r.bad(
            MIG_CONFIG,
            format!("needs {GPU_PRODUCT} to know which GPU the config is for"),
        ));
    };
    let model = model_for_product(product).ok_or_else(|| {
        r.bad(
            GPU_PRODUCT,
            format!(
                "no GPU model in the catalog is called {product:?}; known: {}",
                gpuops_catalog::known_keys().join(", ")
            ),
        )
    })?;
    let configs = gpuops_mig::config::nvidia_default_configs();
    let named = configs.get(config).map_err(|e| {
        r.bad(
            MIG_CONFIG,
            format!("{e} (for another config give {MIG_DEVICES})"),
        )
    })?;
    let mut per_gpu: Vec<Option<BTreeMap<String, u64>>> = vec![None; gpus as usize];
    for (g, slot) in per_gpu.iter_mut().enumerate() {
        // Entries apply in order, so the last one selecting a GPU decides its state.
        for e in &named.entries {
            let selects_model = e.filters.is_empty()
                || e.filters
                    .iter()
                    .any(|f| model.pci_device_ids.contains(&((f.device >> 16) as u16)));
            let selects_index = match &e.devices {
                gpuops_mig::config::Devices::All => true,
                gpuops_mig::config::Devices::List(l) => l.contains(&(g as u32)),
            };
            if selects_model && selects_index {
                *slot = e.mig_enabled.then(|| {
                    e.mig_devices
                        .iter()
                        .map(|(k, v)| (k.clone(), u64::from(*v)))
                        .collect()
                });
            }
        }
    }
    if per_gpu.iter().all(Option::is_none) && config != "all-disabled" {
        return Err(r.bad(
            MIG_CONFIG,
            format!(
                "config {config:?} enables MIG on no GPU of model {}",
                model.key
            ),
        ));
    }
    Ok(per_gpu)
}

/// Reads one MachineDeployment (as JSON) as a pool.
///
/// # Errors
/// [`AutoscaleError`] naming the MachineDeployment and the annotation when a value cannot be
/// used, or the pool is inconsistent (min above max, no capacity for scale-from-zero).
// Long on purpose: one annotation after another, each a few lines of parsing with its own error; a table in code.
pub fn parse_pool(md: &Value) -> Result<Pool, AutoscaleError> {
    let name = pool_name(md);
    let annotations: BTreeMap<&str, &str> = md["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v)))
                .collect()
        })
        .unwrap_or_default();
    let r = Reader {
        pool: name.clone(),
        annotations,
    };
    let pool_err = |reason: String| AutoscaleError::Pool {
        pool: name.clone(),
        reason,
    };

    let nodes_why = "twice the 5,000 nodes Kubernetes supports per cluster";
    let min = r
        .count_at_most(MIN_SIZE, MAX_POOL_NODES, nodes_why)?
        .ok_or_else(|| {
            pool_err(format!(
                "annotation {MIN_SIZE} is missing (needed with {MAX_SIZE})"
            ))
        })?;
    let max = r
        .count_at_most(MAX_SIZE, MAX_POOL_NODES, nodes_why)?
        .ok_or_else(|| {
            pool_err(format!(
                "annotation {MAX_SIZE} is missing (needed with {MIN_SIZE})"
            ))
        })?;
    if min > max {
        return Err(r.bad(
            MIN_SIZE,
            format!("the minimum {min} is above the maximum {max}"),
        ));
    }
    let replicas = match &md["spec"]["replicas"] {
        Value::Null => 0,
        v => v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| pool_err(format!("spec.replicas {v} is not a whole number")))?,
    };
    if replicas > MAX_POOL_NODES {
        return Err(pool_err(format!(
            "spec.replicas {replicas} is more than {MAX_POOL_NODES}, the most nodes a pool may have ({nodes_why})"
        )));
    }
    let cpu = r.quantity(CPU)?.ok_or_else(|| {
        pool_err(format!("annotation {CPU} is missing: without it the controller cannot know what a new node offers (scale-from-zero capacity)"))
    })?;
    let memory = r.quantity(MEMORY)?.ok_or_else(|| {
        pool_err(format!("annotation {MEMORY} is missing: without it the controller cannot know what a new node offers (scale-from-zero capacity)"))
    })?;
    r.quantity(EPHEMERAL_DISK)?;
    if cpu <= 0.0 {
        return Err(r.bad(CPU, "must be more than zero"));
    }
    if memory <= 0.0 {
        return Err(r.bad(MEMORY, "must be more than zero"));
    }
    let gpus = r.count(GPU_COUNT)?.unwrap_or(0);
    if gpus > 64 {
        return Err(r.bad(GPU_COUNT, "more than 64 GPUs per node cannot be modelled"));
    }
    let gpu_type = r.get(GPU_TYPE).unwrap_or(GPU).to_string();
    if !gpu_type.contains('/') {
        return Err(r.bad(GPU_TYPE, "must be a resource name such as nvidia.com/gpu"));
    }
    let max_pods = r.count(MAX_PODS)?.unwrap_or(110);
    let price = match r.get(PRICE) {
        None => 1.0,
        Some(v) => v
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .ok_or_else(|| {
                r.bad(
                    PRICE,
                    "must be a number of 0 or more (price of one node-hour)",
                )
            })?,
    };
    let product = r.get(GPU_PRODUCT).filter(|p| !p.is_empty());
    let replicas_per_gpu = r
        .count_at_most(
            GPU_REPLICAS,
            MAX_GPU_REPLICAS,
            "the device plugin config's limit of time-slicing replicas per GPU",
        )?
        .unwrap_or(1);
    if replicas_per_gpu == 0 {
        return Err(r.bad(GPU_REPLICAS, "must be 1 or more"));
    }
    let mut labels = parse_labels(&r, LABELS)?;
    let taints = parse_taints(&r, TAINTS)?;

    let mut scalars = BTreeMap::new();
    scalars.insert(PODS.to_string(), u64::from(max_pods));
    let mut whole = gpus;
    let mig_config = r.get(MIG_CONFIG).filter(|c| !c.is_empty());
    let layout: Option<Vec<Option<BTreeMap<String, u64>>>> = if r.get(MIG_DEVICES).is_some() {
        let d = parse_mig_devices(&r, MIG_DEVICES)?;
        Some(vec![Some(d); gpus as usize])
    } else if let Some(c) = mig_config {
        Some(mig_layout(&r, c, product, gpus)?)
    } else {
        None
    };
    if let Some(layout) = &layout {
        if gpus == 0 {
            return Err(r.bad(GPU_COUNT, "a MIG pool needs GPUs (gpu-count 0 or missing)"));
        }
        whole = u32::try_from(layout.iter().filter(|g| g.is_none()).count()).unwrap_or(0);
        for devices in layout.iter().flatten() {
            for (profile, n) in devices {
                *scalars
                    .entry(format!("nvidia.com/mig-{profile}"))
                    .or_insert(0) += n;
            }
        }
    }
    if replicas_per_gpu > 1 && layout.is_some() {
        return Err(r.bad(
            GPU_REPLICAS,
            "time-slicing replicas together with a MIG layout are not modelled",
        ));
    }
    let gpu_resource = if whole == 0 {
        String::new()
    } else if replicas_per_gpu > 1 && gpu_type == GPU {
        // The device plugin's default renames time-sliced GPUs unless told otherwise; CA users
        // write the name their plugin advertises in gpu-type.
        GPU_SHARED.to_string()
    } else {
        gpu_type.clone()
    };
    if let Some(p) = product {
        labels
            .entry("nvidia.com/gpu.product".into())
            .or_insert_with(|| p.to_string());
    }
    if gpus > 0 {
        labels
            .entry("nvidia.com/gpu.count".into())
            .or_insert_with(|| gpus.to_string());
    }
    if replicas_per_gpu > 1 {
        labels
            .entry("nvidia.com/gpu.replicas".into())
            .or_insert_with(|| replicas_per_gpu.to_string());
    }
    if let Some(c) = mig_config {
        labels
            .entry("nvidia.com/mig.config".into())
            .or_insert_with(|| c.to_string());
    }

    let mut timeouts = StageTimeouts::default();
    if let Some(d) = r.duration(CA_MAX_PROVISION_TIME)? {
        timeouts.provision = d;
    }
    if let Some(d) = r.duration(PROVISION_TIMEOUT)? {
        timeouts.provision = d;
    }
    if let Some(d) = r.duration(REGISTRATION_TIMEOUT)? {
        timeouts.registration = d;
    }
    if let Some(d) = r.duration(DEVICES_TIMEOUT)? {
        timeouts.devices = d;
    }

    Ok(Pool {
        name,
        min,
        max,
        replicas,
        price_per_hour: price,
        template: NodeTemplate {
            cpu_milli: (cpu * 1000.0).round() as u64,
            memory_mib: (memory / 1_048_576.0).floor() as u64,
            gpus: whole,
            gpu_resource,
            gpu_replicas: replicas_per_gpu,
            gpu_product: product.unwrap_or("").to_string(),
            scalars,
            labels,
            taints,
        },
        timeouts,
    })
}

/// Pools from a list of MachineDeployments: the ones that opt in, each parsed on its own so a
/// bad one is reported and skipped while the others keep scaling.
pub fn parse_pools(mds: &[Value]) -> (Vec<Pool>, Vec<AutoscaleError>) {
    let mut pools = Vec::new();
    let mut errors = Vec::new();
    for md in mds.iter().filter(|m| is_pool(m)) {
        match parse_pool(md) {
            Ok(p) => pools.push(p),
            Err(e) => errors.push(e),
        }
    }
    (pools, errors)
}
