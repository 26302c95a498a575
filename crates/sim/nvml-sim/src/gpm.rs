//! GPM (GPU Performance Monitoring, Hopper and newer): samples and the metrics between two of them.
//!
//! Samples are process-local, like the driver's sample buffers: `nvmlGpmSampleAlloc` hands out a
//! handle, `nvmlGpmSampleGet` / `nvmlGpmMigSampleGet` fill it with the activity rates of the GPU
//! (or one GPU instance) at that moment, `nvmlGpmMetricsGet` turns two filled samples into metric
//! values and `nvmlGpmSampleFree` releases the handle. The values follow the load model of
//! `gpuops_sim::activity`.

use crate::handles::{Handle, decode, encode};
use crate::{current_state, driver, now_ms, put, query_gpu, ret};
use gpuops_sim::{Activity, NvmlCode};
use nvml_wrapper_sys::bindings::*;
use std::ffi::CStr;
use std::os::raw::{c_char, c_uint};

const MIB: f64 = 1024.0 * 1024.0;

/// What one filled sample holds.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    gpu: u32,
    /// The GPU instance of a MIG sample.
    gi: Option<u32>,
    taken_ms: u64,
    /// When the GPU's load last changed, as of this sample.
    load_since_ms: u64,
    rates: Activity,
}

fn sample_id(sample: nvmlGpmSample_t) -> Result<u64, NvmlCode> {
    match decode(sample as usize) {
        Handle::GpmSample { id } => Ok(id),
        _ => Err(NvmlCode::InvalidArgument),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    crate::trace("nvmlGpmSampleAlloc");
    ret((|| {
        let mut guard = driver();
        let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
        let id = d.next_gpm_sample;
        // SAFETY: NVML contract: `sample` is null or a valid out-pointer.
        unsafe { put(sample, encode(Handle::GpmSample { id }) as nvmlGpmSample_t) }?;
        d.next_gpm_sample += 1;
        d.gpm_samples.insert(id, None);
        Ok(())
    })())
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    crate::trace("nvmlGpmSampleFree");
    ret((|| {
        let id = sample_id(sample)?;
        let mut guard = driver();
        let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
        d.gpm_samples
            .remove(&id)
            .map(|_| ())
            .ok_or(NvmlCode::InvalidArgument)
    })())
}

fn store(sample: nvmlGpmSample_t, filled: Sample) -> Result<(), NvmlCode> {
    let id = sample_id(sample)?;
    let mut guard = driver();
    let d = guard.as_mut().ok_or(NvmlCode::Uninitialized)?;
    let slot = d
        .gpm_samples
        .get_mut(&id)
        .ok_or(NvmlCode::InvalidArgument)?;
    *slot = Some(filled);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpmQueryDeviceSupport");
    query_gpu(device, |t| {
        if support.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller sets `version` first (NVML contract).
        let version = unsafe { std::ptr::addr_of!((*support).version).read() };
        if version != NVML_GPM_SUPPORT_VERSION {
            return Err(NvmlCode::ArgumentVersionMismatch);
        }
        let out = nvmlGpmSupport_t {
            version,
            isSupportedDevice: c_uint::from(t.gpu.gpm_supported()),
        };
        // SAFETY: a valid out-pointer (checked non-null above).
        unsafe { put(support, out) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleGet(device: nvmlDevice_t, sample: nvmlGpmSample_t) -> nvmlReturn_t {
    crate::trace("nvmlGpmSampleGet");
    sample_into(device, None, sample)
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    crate::trace("nvmlGpmMigSampleGet");
    sample_into(device, Some(gpu_instance_id), sample)
}

fn sample_into(device: nvmlDevice_t, gi: Option<u32>, sample: nvmlGpmSample_t) -> nvmlReturn_t {
    // The sample must be ours before the device is even looked at.
    if let Err(code) = sample_id(sample) {
        return code.code();
    }
    let mut filled = None;
    let code = query_gpu(device, |t| {
        if !t.gpu.gpm_supported() {
            return Err(NvmlCode::NotSupported);
        }
        let rates = match gi {
            None => t.gpu.activity(),
            Some(_) if !t.gpu.mig_current => return Err(NvmlCode::NotSupported),
            Some(id) => t.gpu.gi_activity(id).ok_or(NvmlCode::NotFound)?,
        };
        filled = Some(Sample {
            gpu: t.gpu.index,
            gi,
            taken_ms: now_ms(),
            load_since_ms: t.gpu.load_since_unix_ms,
            rates,
        });
        Ok(())
    });
    match filled {
        Some(s) if code == 0 => ret(store(sample, s)),
        _ => code,
    }
}

/// A supported metric: how to read it from the rates, and the info NVML attaches.
struct Metric {
    value: fn(&Activity) -> Option<f64>,
    short: &'static CStr,
    long: &'static CStr,
    unit: &'static CStr,
}

fn pct(v: f64) -> Option<f64> {
    Some((v * 100.0).clamp(0.0, 100.0))
}

/// The metrics the simulated GPUs answer; every other id is `NOT_SUPPORTED` for that entry.
/// Names and units as nvml.h documents the ids (the exact strings the driver returns are
/// *presumed*).
fn metric(id: u32) -> Option<Metric> {
    let m = |value, short, long, unit| {
        Some(Metric {
            value,
            short,
            long,
            unit,
        })
    };
    match id {
        nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL => m(
            |a| pct(a.gr_engine),
            c"GR_UTIL",
            c"Percentage of time any compute/graphics app was active on the GPU",
            c"%",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL => m(
            |a| pct(a.sm_active),
            c"SM_UTIL",
            c"Percentage of SMs that were busy",
            c"%",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY => m(
            |a| pct(a.sm_occupancy),
            c"SM_OCCUPANCY",
            c"Percentage of warps that were active vs theoretical maximum",
            c"%",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL => m(
            |a| pct(a.tensor),
            c"ANY_TENSOR_UTIL",
            c"Percentage of time the GPU's SMs were doing any tensor operations",
            c"%",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL => m(
            |a| pct(a.dram),
            c"DRAM_BW_UTIL",
            c"Percentage of DRAM bw used vs theoretical maximum",
            c"%",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_TX_PER_SEC => m(
            |a| Some(a.pcie_tx_bytes / MIB),
            c"PCIE_TX",
            c"PCIe traffic from this GPU",
            c"MiB/sec",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_PCIE_RX_PER_SEC => m(
            |a| Some(a.pcie_rx_bytes / MIB),
            c"PCIE_RX",
            c"PCIe traffic to this GPU",
            c"MiB/sec",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC => m(
            |a| a.nvlink_tx_bytes.map(|b| b / MIB),
            c"NVLINK_TOTAL_TX",
            c"NvLink write bandwidth for all links",
            c"MiB/sec",
        ),
        nvmlGpmMetricId_t_NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC => m(
            |a| a.nvlink_rx_bytes.map(|b| b / MIB),
            c"NVLINK_TOTAL_RX",
            c"NvLink read bandwidth for all links",
            c"MiB/sec",
        ),
        _ => None,
    }
}

fn filled(id: u64) -> Result<Sample, NvmlCode> {
    let guard = driver();
    let d = guard.as_ref().ok_or(NvmlCode::Uninitialized)?;
    d.gpm_samples
        .get(&id)
        .copied()
        .ok_or(NvmlCode::InvalidArgument)?
        .ok_or(NvmlCode::InvalidArgument)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(request: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    crate::trace("nvmlGpmMetricsGet");
    ret((|| {
        if request.is_null() {
            return Err(NvmlCode::InvalidArgument);
        }
        // SAFETY: non-null; the caller owns a whole nvmlGpmMetricsGet_t (NVML contract).
        let (version, count, s1, s2) = unsafe {
            (
                std::ptr::addr_of!((*request).version).read(),
                std::ptr::addr_of!((*request).numMetrics).read(),
                std::ptr::addr_of!((*request).sample1).read(),
                std::ptr::addr_of!((*request).sample2).read(),
            )
        };
        if version != NVML_GPM_METRICS_GET_VERSION {
            return Err(NvmlCode::ArgumentVersionMismatch);
        }
        if count as usize > nvmlGpmMetricId_t_NVML_GPM_METRIC_MAX as usize {
            return Err(NvmlCode::InvalidArgument);
        }
        // Initialised driver, and both samples ours and filled, from the same GPU or instance.
        current_state()?;
        let first = filled(sample_id(s1)?)?;
        let second = filled(sample_id(s2)?)?;
        if (first.gpu, first.gi) != (second.gpu, second.gi) || second.taken_ms < first.taken_ms {
            return Err(NvmlCode::InvalidArgument);
        }
        let rates = Activity::between(
            first.rates,
            first.taken_ms,
            second.rates,
            second.taken_ms,
            second.load_since_ms,
        );
        for i in 0..count as usize {
            // SAFETY: `i < numMetrics <= NVML_GPM_METRIC_MAX`, the array's length.
            let entry = unsafe { std::ptr::addr_of_mut!((*request).metrics[i]) };
            // SAFETY: `entry` points into the caller's struct; the caller set `metricId`.
            let id = unsafe { std::ptr::addr_of!((*entry).metricId).read() };
            let found = metric(id).and_then(|m| (m.value)(&rates).map(|v| (m, v)));
            let out = match found {
                Some((m, value)) => nvmlGpmMetric_t {
                    metricId: id,
                    nvmlReturn: 0,
                    value,
                    metricInfo: nvmlGpmMetric_t__bindgen_ty_1 {
                        shortName: m.short.as_ptr() as *mut c_char,
                        longName: m.long.as_ptr() as *mut c_char,
                        unit: m.unit.as_ptr() as *mut c_char,
                    },
                },
                None => nvmlGpmMetric_t {
                    metricId: id,
                    nvmlReturn: NvmlCode::NotSupported.code(),
                    value: 0.0,
                    metricInfo: nvmlGpmMetric_t__bindgen_ty_1 {
                        shortName: std::ptr::null_mut(),
                        longName: std::ptr::null_mut(),
                        unit: std::ptr::null_mut(),
                    },
                },
            };
            // SAFETY: `entry` is valid for writes (the caller's array); the strings are 'static.
            unsafe { entry.write(out) };
        }
        Ok(())
    })())
}
