//! The labels NVIDIA's GPU Feature Discovery writes for a node (resource labels in submodules).

mod resource;
mod strategy;
#[cfg(test)]
mod tests;

use crate::error::LabelError;
use crate::keys;
use crate::product::{MAX_LABEL_VALUE_LEN, product_label};
use gpuops_inventory::{Gpu, Inventory};
use gpuops_resources::{Config, SharingStrategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// PCI class code (`/sys/bus/pci/devices/<addr>/class`, [`Gpu::pci_class`]) of a GPU in graphics
/// mode (VGA controller).
pub const PCI_CLASS_VGA_CONTROLLER: u32 = 0x03_00_00;
/// PCI class code of a GPU in compute mode (3D controller).
pub const PCI_CLASS_3D_CONTROLLER: u32 = 0x03_02_00;

/// What the labels need that the inventory does not carry.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LabelContext {
    /// DMI product name (`/sys/class/dmi/id/product_name`); `None` when it could not be read, which
    /// GFD labels `unknown`.
    pub machine_type: Option<String>,
    /// Unix seconds for `nvidia.com/gfd.timestamp`; `None` leaves the label out (GFD's
    /// `noTimestamp`).
    pub timestamp: Option<i64>,
    /// `X.Y` for the `cuda.runtime*` labels instead of `inventory.cuda_driver_version`. GFD itself
    /// labels the CUDA version the driver supports, so leave this `None` to match it.
    pub cuda_runtime_version: Option<String>,
}

type Labels = BTreeMap<String, String>;

fn put(out: &mut Labels, key: &str, value: impl ToString) {
    out.insert(key.to_string(), value.to_string());
}

/// The labels GFD would write for this node under the effective device plugin config `cfg`
/// (`cfg.flags.migStrategy`, `cfg.sharing`).
///
/// GPUs lost before they were ever read (no UUID) are left out, as the device plugin leaves them
/// out. A node with no GPUs gets only `nvidia.com/gfd.timestamp` (when `ctx.timestamp` is set),
/// as GFD writes. Errors where GFD fails to label at all: a driver version not `X.Y[.Z]`, a CUDA
/// version not `X.Y`, MPS sharing while a GPU has MIG enabled.
pub fn gfd_labels(inv: &Inventory, cfg: &Config, ctx: &LabelContext) -> Result<Labels, LabelError> {
    let mut out = Labels::new();
    if let Some(ts) = ctx.timestamp {
        put(&mut out, keys::TIMESTAMP, ts);
    }
    let mut gpus: Vec<&Gpu> = inv.gpus.iter().filter(|g| !g.uuid.is_empty()).collect();
    gpus.sort_by_key(|g| g.index);
    let Some(first) = gpus.first() else {
        return Ok(out);
    };

    put(
        &mut out,
        keys::MACHINE,
        machine_label(ctx.machine_type.as_deref()),
    );
    let cuda = ctx
        .cuda_runtime_version
        .as_deref()
        .unwrap_or(&inv.cuda_driver_version);
    version_labels(&mut out, &inv.driver_version, cuda)?;
    put(
        &mut out,
        keys::MIG_CAPABLE,
        gpus.iter().any(|g| g.mig.capable),
    );
    put(&mut out, keys::MPS_CAPABLE, mps_capable(&gpus, cfg)?);
    out.extend(strategy::resource_labels(&gpus, cfg)?);
    put(&mut out, keys::GPU_MODE, gpu_mode(first.pci_class));
    Ok(out)
}

fn is_label_value(s: &str) -> bool {
    s.len() <= MAX_LABEL_VALUE_LEN
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && (s.is_empty()
            || (s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())))
}

/// GFD trims the DMI product name and turns spaces into `-`. Where that is still not a valid label
/// value (GFD would write it and have the node update fail) it is sanitised like a product name.
fn machine_label(dmi: Option<&str>) -> String {
    let Some(dmi) = dmi else {
        return "unknown".to_string();
    };
    let gfd = dmi.trim().replace(' ', "-");
    if is_label_value(&gfd) {
        return gfd;
    }
    let clean = product_label(&[dmi], false);
    let clean = clean.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if clean.is_empty() {
        "unknown".to_string()
    } else {
        clean.to_string()
    }
}

fn version_labels(out: &mut Labels, driver: &str, cuda: &str) -> Result<(), LabelError> {
    let parts: Vec<&str> = driver.split('.').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(LabelError::InvalidDriverVersion(driver.to_string()));
    }
    let (major, minor) = (parts[0], parts[1]);
    let rev = parts.get(2).copied().unwrap_or("");
    for (key, value) in [
        (keys::DRIVER_MAJOR, major),
        (keys::DRIVER_MINOR, minor),
        (keys::DRIVER_REVISION, rev),
        (keys::DRIVER_FULL, driver),
        (keys::OLD_DRIVER_MAJOR, major),
        (keys::OLD_DRIVER_MINOR, minor),
        (keys::OLD_DRIVER_REV, rev),
    ] {
        put(out, key, value);
    }

    let bad = || LabelError::InvalidCudaVersion(cuda.to_string());
    let mut nums = cuda.trim().split('.').map(str::parse::<u32>);
    let (Some(Ok(cmajor)), Some(Ok(cminor))) = (nums.next(), nums.next()) else {
        return Err(bad());
    };
    if nums.any(|n| n.is_err()) {
        return Err(bad());
    }
    put(out, keys::RUNTIME_MAJOR, cmajor);
    put(out, keys::RUNTIME_MINOR, cminor);
    put(out, keys::RUNTIME_FULL, format!("{cmajor}.{cminor}"));
    put(out, keys::OLD_RUNTIME_MAJOR, cmajor);
    put(out, keys::OLD_RUNTIME_MINOR, cminor);
    Ok(())
}

/// `false` unless the config shares GPUs with MPS; then `true`, or an error when any GPU has MIG
/// enabled (GFD refuses MPS on MIG).
fn mps_capable(gpus: &[&Gpu], cfg: &Config) -> Result<bool, LabelError> {
    if cfg.sharing.active().0 != SharingStrategy::Mps {
        return Ok(false);
    }
    let mig: Vec<u32> = gpus
        .iter()
        .filter(|g| g.mig.current_enabled)
        .map(|g| g.index)
        .collect();
    if mig.is_empty() {
        Ok(true)
    } else {
        Err(LabelError::MpsWithMig { gpus: mig })
    }
}

/// GFD takes the PCI class of the first GPU: VGA controller -> `graphics`, 3D controller ->
/// `compute`, anything else (or unknown) -> `unknown`.
fn gpu_mode(class: Option<u32>) -> &'static str {
    match class {
        Some(PCI_CLASS_VGA_CONTROLLER) => "graphics",
        Some(PCI_CLASS_3D_CONTROLLER) => "compute",
        _ => "unknown",
    }
}
