//! The rules, one small module per area; each returns findings for the indexed cluster.

mod accounting;
mod broken;
mod claims;
mod cost;
mod health;
mod kubelet;
mod memory;
mod mig;
mod migstrategy;
mod moves;
mod nodes;
mod pending;
mod preempt;
mod refused;
mod unexplained;
mod workload;

/// The taint the agent puts on a node with an unhealthy GPU.
pub(crate) const HEALTH_TAINT: &str = gpuops_labels::DEFAULT_TAINT_KEY;

use crate::Options;
use crate::cluster::{Cluster, NodeView, PRODUCT};
use crate::finding::Finding;
use gpuops_catalog::GpuModel;
use gpuops_mig::config::{DeviceFilter, MigPartedConfig};
use std::collections::BTreeMap;
use std::sync::OnceLock;

pub(crate) fn run_all(c: &Cluster<'_>, o: &Options) -> Vec<Finding> {
    let mut out = pending::check(c, o);
    out.extend(workload::check(c, o));
    out.extend(nodes::check(c, o));
    out.extend(mig::check(c, o));
    out.extend(migstrategy::check(c, o));
    out.extend(health::check(c, o));
    out.extend(memory::check(c, o));
    out.extend(cost::check(c, o));
    out.extend(kubelet::check(c, o));
    out.extend(refused::check(c, o));
    out.extend(claims::check(c, o));
    // Last: it reads what every other rule found.
    let unexplained = unexplained::check(c, o, &out);
    out.extend(unexplained);
    out
}

/// GFD's sanitising of an NVML name (`NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`).
fn sanitise(name: &str) -> String {
    let kept: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    kept.split_whitespace().collect::<Vec<_>>().join("-")
}

/// The catalog model of a `nvidia.com/gpu.product` value (MIG and `-SHARED` suffixes ignored).
pub(crate) fn model_for_product(product: &str) -> Option<&'static GpuModel> {
    static PRODUCTS: OnceLock<Vec<(String, &'static GpuModel)>> = OnceLock::new();
    let table = PRODUCTS.get_or_init(|| {
        gpuops_catalog::models()
            .iter()
            .map(|m| (sanitise(m.nvml_name), m))
            .collect()
    });
    let base = product.strip_suffix("-SHARED").unwrap_or(product);
    let base = base.split("-MIG-").next().unwrap_or(base);
    table
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(base))
        .map(|(_, m)| *m)
}

/// The node's GPU model from its product labels (`nvidia.com/gpu.product` or a MIG resource's).
pub(crate) fn node_model(n: &NodeView<'_>) -> Option<&'static GpuModel> {
    *n.model.get_or_init(|| {
        n.label(PRODUCT).and_then(model_for_product).or_else(|| {
            n.labels
                .iter()
                .filter(|(k, _)| k.starts_with("nvidia.com/mig-") && k.ends_with(".product"))
                .find_map(|(_, v)| model_for_product(v))
        })
    })
}

fn entry_fits_model(filters: &[DeviceFilter], model: &GpuModel) -> bool {
    filters.is_empty()
        || filters.iter().any(|f| {
            model
                .pci_device_ids
                .iter()
                .any(|&id| DeviceFilter::nvidia(id).device == f.device)
        })
}

/// MIG instances per GPU that config `name` gives a GPU of `model`; `None` when the config is not
/// known or has no entry for the model. An empty map means MIG disabled or enabled with none.
pub(crate) fn per_gpu_layout(
    configs: &MigPartedConfig,
    name: &str,
    model: &GpuModel,
) -> Option<BTreeMap<String, u32>> {
    let config = configs.configs.iter().find(|c| c.name == name)?;
    config
        .entries
        .iter()
        .find(|e| entry_fits_model(&e.filters, model))
        .map(|e| {
            if e.mig_enabled {
                e.mig_devices.clone()
            } else {
                BTreeMap::new()
            }
        })
}

/// Names of NVIDIA's default configs that give `model` at least one `profile`, the
/// single-profile one first, then `all-balanced`.
pub(crate) fn configs_offering(
    configs: &MigPartedConfig,
    profile: &str,
    model: &GpuModel,
) -> Vec<String> {
    let mut names: Vec<String> = configs
        .configs
        .iter()
        .filter(|c| {
            c.entries.iter().any(|e| {
                e.mig_enabled
                    && entry_fits_model(&e.filters, model)
                    && e.mig_devices.get(profile).is_some_and(|n| *n > 0)
            })
        })
        .map(|c| c.name.clone())
        .collect();
    let first = format!("all-{}", profile.replace('+', "."));
    names.sort_by_key(|n| (*n != first, n != "all-balanced", n.clone()));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_map_to_catalog_models() {
        for (product, key) in [
            ("NVIDIA-H100-80GB-HBM3", Some("H100-SXM5-80GB")),
            ("NVIDIA-H100-80GB-HBM3-SHARED", Some("H100-SXM5-80GB")),
            ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", Some("A100-SXM4-40GB")),
            ("NVIDIA-H200", Some("H200")),
            ("Tesla-T4", None),
        ] {
            assert_eq!(model_for_product(product).map(|m| m.key), key, "{product}");
        }
    }

    #[test]
    fn default_configs_that_offer_a_profile() {
        let configs = gpuops_mig::config::nvidia_default_configs();
        let h100 = model_for_product("NVIDIA-H100-80GB-HBM3").unwrap();
        let names = configs_offering(&configs, "3g.40gb", h100);
        assert_eq!(names[0], "all-3g.40gb");
        assert_eq!(names[1], "all-balanced");
        assert!(configs_offering(&configs, "1g.5gb", h100).is_empty());
        let layout = per_gpu_layout(&configs, "all-1g.10gb", h100).unwrap();
        assert_eq!(layout.get("1g.10gb"), Some(&7));
        assert!(
            per_gpu_layout(&configs, "all-disabled", h100)
                .unwrap()
                .is_empty()
        );
        assert!(per_gpu_layout(&configs, "custom", h100).is_none());
    }
}
