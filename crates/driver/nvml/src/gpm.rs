//! GPM (GPU Performance Monitoring, Hopper and newer): a sample per GPU and per GPU instance at
//! every live snapshot, and the metrics between it and the previous snapshot's sample.
//!
//! GPM metrics need two samples an interval apart. Keeping the previous sample here, between
//! snapshots, makes the interval the collection interval and keeps the exporter a pure renderer
//! (no sleeping between two samples inside a collection).

use crate::NvmlError;
use crate::error::call;
use gpuops_inventory::Activity;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlGpmSample_t;
use std::collections::{HashMap, HashSet};

const MIB: f64 = 1024.0 * 1024.0;

/// The metrics requested, in the order [`activity`] reads them.
const METRICS: [GpmMetricId; 9] = [
    GpmMetricId::GraphicsUtil,
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::PcieTxPerSec,
    GpmMetricId::PcieRxPerSec,
    GpmMetricId::NvlinkTotalTxPerSec,
    GpmMetricId::NvlinkTotalRxPerSec,
];

/// What a kept sample belongs to: a GPU (by UUID, so a replaced GPU starts afresh), or one GPU
/// instance of it (id, profile and placement, so an instance re-created under a reused id does too).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    uuid: String,
    gi: Option<(u32, u32, u32)>,
}

/// A sample handle owned by [`GpmState`], freed when replaced or when the state is dropped.
struct Kept(nvmlGpmSample_t);

// SAFETY: the handle is an opaque token of the NVML library, only ever passed back to it under the
// `GpmState` mutex; NVML samples may be used from any thread, one at a time.
unsafe impl Send for Kept {}

/// The previous snapshot's samples, and which GPUs have GPM.
#[derive(Default)]
pub(crate) struct GpmState {
    kept: HashMap<Key, Kept>,
    /// Per GPU UUID: whether `nvmlGpmQueryDeviceSupport` said yes.
    supported: HashMap<String, bool>,
}

impl GpmState {
    /// Frees every kept sample (before NVML shuts down).
    pub(crate) fn free_all(&mut self, nvml: &Nvml) {
        for (_, Kept(handle)) in self.kept.drain() {
            // SAFETY: the handle came from nvmlGpmSampleAlloc of this library and is owned here
            // alone (removed from the map), so it is freed exactly once.
            drop(unsafe { GpmSample::from_handle(nvml, handle) });
        }
    }
}

/// One GPU's activity and its GPU instances', by GI id.
pub(crate) struct GpuActivity {
    pub gpu: Option<Activity>,
    pub instances: HashMap<u32, Activity>,
}

/// Samples a GPU (and, in MIG mode, each of its GPU instances `gis` = (id, profile, start)) and
/// returns the activity since the previous call. GPUs without GPM answer `None` and cost one
/// call, once. A lost GPU is an error; anything else becomes a warning and no figures.
pub(crate) fn sample_gpu(
    nvml: &Nvml,
    state: &std::sync::Mutex<GpmState>,
    d: &Device<'_>,
    index: u32,
    uuid: &str,
    gis: &[(u32, u32, u32)],
    warnings: &mut Vec<String>,
) -> Result<GpuActivity, NvmlError> {
    let mut out = GpuActivity {
        gpu: None,
        instances: HashMap::new(),
    };
    let gpu = Some(index);
    let Ok(mut st) = state.lock() else {
        return Ok(out);
    };
    let supported = match st.supported.get(uuid) {
        Some(s) => *s,
        None => match d.gpm_support() {
            Ok(s) => {
                st.supported.insert(uuid.to_string(), s);
                s
            }
            Err(e) => match call("nvmlGpmQueryDeviceSupport", gpu, e) {
                lost @ NvmlError::GpuLost { .. } => return Err(lost),
                NvmlError::NotSupported { .. } => {
                    st.supported.insert(uuid.to_string(), false);
                    false
                }
                other => {
                    warnings.push(other.to_string());
                    false
                }
            },
        },
    };
    if !supported {
        return Ok(out);
    }
    let mut seen = HashSet::new();
    let mut targets: Vec<Option<(u32, u32, u32)>> = vec![None];
    targets.extend(gis.iter().copied().map(Some));
    for gi in targets {
        let key = Key {
            uuid: uuid.to_string(),
            gi,
        };
        seen.insert(key.clone());
        let taken = match gi {
            None => d.gpm_sample(),
            Some((id, _, _)) => d.gpm_mig_sample(id),
        };
        let sample = match taken {
            Ok(s) => s,
            Err(e) => {
                let what = if gi.is_some() {
                    "nvmlGpmMigSampleGet"
                } else {
                    "nvmlGpmSampleGet"
                };
                match call(what, gpu, e) {
                    lost @ NvmlError::GpuLost { .. } => return Err(lost),
                    NvmlError::NotSupported { .. } => {}
                    other => warnings.push(other.to_string()),
                }
                continue;
            }
        };
        let previous = st.kept.remove(&key).map(|Kept(handle)| {
            // SAFETY: the handle came from nvmlGpmSampleAlloc of this library and was removed from
            // the map, so this wrapper is its only owner and frees it once, on drop.
            unsafe { GpmSample::from_handle(nvml, handle) }
        });
        if let Some(previous) = &previous {
            match gpm_metrics_get(nvml, previous, &sample, &METRICS) {
                Ok(results) => {
                    let a = activity(&results);
                    match gi {
                        None => out.gpu = Some(a),
                        Some((id, _, _)) => {
                            out.instances.insert(id, a);
                        }
                    }
                }
                Err(e) => match call("nvmlGpmMetricsGet", gpu, e) {
                    lost @ NvmlError::GpuLost { .. } => return Err(lost),
                    NvmlError::NotSupported { .. } => {}
                    other => warnings.push(other.to_string()),
                },
            }
        }
        st.kept.insert(key, Kept(sample.into_handle()));
    }
    // Instances destroyed since the last snapshot: their samples are freed, not kept forever.
    let stale: Vec<Key> = st
        .kept
        .keys()
        .filter(|k| k.uuid == uuid && !seen.contains(*k))
        .cloned()
        .collect();
    for key in stale {
        if let Some(Kept(handle)) = st.kept.remove(&key) {
            // SAFETY: as above: removed from the map, owned and freed once here.
            drop(unsafe { GpmSample::from_handle(nvml, handle) });
        }
    }
    Ok(out)
}

/// The results of [`METRICS`] as DCGM's profiling fields: ratios instead of percentages, bytes
/// instead of MiB. A metric the GPU refuses is `None`.
fn activity(
    results: &[Result<nvml_wrapper::struct_wrappers::gpm::GpmMetricResult, WrapperError>],
) -> Activity {
    let value = |i: usize| -> Option<f64> {
        results
            .get(i)?
            .as_ref()
            .ok()
            .map(|r| r.value)
            .filter(|v| v.is_finite())
    };
    let ratio = |i: usize| value(i).map(|pct| (pct / 100.0).clamp(0.0, 1.0));
    let bytes = |i: usize| value(i).map(|mib| (mib * MIB).max(0.0));
    Activity {
        gr_engine_active: ratio(0),
        sm_active: ratio(1),
        sm_occupancy: ratio(2),
        tensor_active: ratio(3),
        dram_active: ratio(4),
        pcie_tx_bytes_per_second: bytes(5),
        pcie_rx_bytes_per_second: bytes(6),
        nvlink_tx_bytes_per_second: bytes(7),
        nvlink_rx_bytes_per_second: bytes(8),
    }
}
