//! The labels of one resource prefix: a whole-GPU group, a MIG profile, or the invalid-single set.

use super::{Labels, put};
use crate::error::LabelError;
use crate::keys::resource_key;
use crate::product::{family_label, product_label};
use gpuops_inventory::{Gpu, MigDevice};
use gpuops_resources::config::qualify_resource_name;
use gpuops_resources::model::mig_profile_name;
use gpuops_resources::{Config, SharingStrategy};

pub(super) const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// How a resource is shared, as GFD labels it.
struct Replication {
    /// `0` when sharing does not apply (MIG-enabled GPUs seen whole), else the configured replicas
    /// (`1` when the resource is not in the sharing config).
    replicas: u32,
    /// The active strategy when `replicas > 1`, else none.
    strategy: SharingStrategy,
    /// Shared and not renamed: the product gets `-SHARED`.
    shared_suffix: bool,
}

/// `cfg` is `None` where GFD labels without sharing (whole MIG-enabled GPUs). GFD matches the
/// first sharing entry whose `name` is this resource; its replicas apply whatever its `devices`,
/// and the labels stay under the original name even when the entry renames the resource.
fn replication(resource: &str, cfg: Option<&Config>) -> Result<Replication, LabelError> {
    let none = Replication {
        replicas: 1,
        strategy: SharingStrategy::None,
        shared_suffix: false,
    };
    let Some(cfg) = cfg else {
        return Ok(Replication {
            replicas: 0,
            ..none
        });
    };
    let (strategy, Some(section)) = cfg.sharing.active() else {
        return Ok(none);
    };
    for entry in &section.resources {
        let name =
            qualify_resource_name(&entry.name.value).map_err(LabelError::InvalidResourceName)?;
        if name != resource {
            continue;
        }
        let replicas = entry
            .replicas
            .value
            .and_then(|n| u32::try_from(n).ok())
            .filter(|&n| n > 0)
            .unwrap_or(1);
        let renamed = entry.rename.is_some() || section.rename_by_default;
        return Ok(Replication {
            replicas,
            strategy: if replicas > 1 {
                strategy
            } else {
                SharingStrategy::None
            },
            shared_suffix: replicas > 1 && !renamed,
        });
    }
    Ok(none)
}

fn base_labels(out: &mut Labels, resource: &str, product: &[&str], count: usize, r: &Replication) {
    let key = |s: &str| resource_key(resource, s);
    put(
        out,
        &key("product"),
        product_label(product, r.shared_suffix),
    );
    put(out, &key("count"), count);
    put(out, &key("replicas"), r.replicas);
    put(out, &key("sharing-strategy"), r.strategy.as_str());
}

/// `nvidia.com/gpu.*` for `count` whole GPUs named like `gpu`; `cfg` `None` for MIG-enabled GPUs.
pub(super) fn whole_gpu(
    out: &mut Labels,
    gpu: &Gpu,
    count: usize,
    cfg: Option<&Config>,
) -> Result<(), LabelError> {
    let r = replication(GPU_RESOURCE, cfg)?;
    base_labels(out, GPU_RESOURCE, &[&gpu.name], count, &r);
    let key = |s: &str| resource_key(GPU_RESOURCE, s);
    if gpu.memory.total_mib != 0 {
        put(out, &key("memory"), gpu.memory.total_mib);
    }
    if let Some((major, minor)) = gpu.compute_capability
        && major != 0
    {
        put(out, &key("family"), family_label(major, minor));
        put(out, &key("compute.major"), major);
        put(out, &key("compute.minor"), minor);
    }
    Ok(())
}

/// `<resource>.*` for `count` MIG devices of `mig`'s profile, described by `mig` and its parent.
pub(super) fn mig_profile(
    out: &mut Labels,
    resource: &str,
    parent: &Gpu,
    mig: &MigDevice,
    count: usize,
    cfg: &Config,
) -> Result<(), LabelError> {
    let r = replication(resource, Some(cfg))?;
    let profile = mig_profile_name(mig).replace('+', ".");
    base_labels(out, resource, &[&parent.name, "MIG", &profile], count, &r);
    let key = |s: &str| resource_key(resource, s);
    put(out, &key("memory"), mig.memory_mib);
    put(out, &key("multiprocessors"), mig.sm_count);
    put(out, &key("slices.gi"), mig.gi_slices);
    put(out, &key("slices.ci"), mig.ci_slices);
    // Engine counts are the GPU instance's; the inventory does not carry them, the catalog does.
    let model = parent
        .model
        .as_deref()
        .and_then(|m| gpuops_catalog::lookup(m).ok())
        .or_else(|| gpuops_catalog::lookup(&parent.name).ok());
    if let Some(p) = model.and_then(|m| m.gi_profile(&mig.profile)) {
        put(out, &key("engines.copy"), p.copy_engines);
        put(out, &key("engines.decoder"), p.decoders);
        put(out, &key("engines.encoder"), p.encoders);
        put(out, &key("engines.jpeg"), p.jpegs);
        put(out, &key("engines.ofa"), p.ofas);
    }
    Ok(())
}

/// MIG strategy single with an invalid layout: `nvidia.com/gpu.product` = `<model>-MIG-INVALID`,
/// count, replicas and memory 0 and an empty sharing-strategy, over whatever the whole-GPU
/// labels set (GFD's `newInvalidMigStrategyLabeler`, k8s-device-plugin v0.20.0
/// internal/lm/mig-strategy.go, writes exactly these five).
pub(super) fn invalid_single(out: &mut Labels, first_mig_gpu: &Gpu) {
    let key = |s: &str| resource_key(GPU_RESOURCE, s);
    put(
        out,
        &key("product"),
        product_label(&[&first_mig_gpu.name, "MIG", "INVALID"], false),
    );
    put(out, &key("count"), 0);
    put(out, &key("replicas"), 0);
    put(out, &key("sharing-strategy"), "");
    put(out, &key("memory"), 0);
}
