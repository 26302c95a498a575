//! dcgm-exporter's default metric set: names, types and help texts, and where each value comes
//! from in an inventory snapshot.
//!
//! Names and help texts are dcgm-exporter's `default-counters.csv` (pre-4.9 names, the ones
//! dashboards query). A value the GPU does not report is skipped, never written as a sentinel.

use crate::text::{Kind, Value};
use gpuops_inventory::{Activity, Gpu, MigDevice};

/// One DCGM field exported as a metric family.
pub struct Field {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// The value for a whole GPU.
    pub gpu: fn(&Gpu) -> Option<Value>,
    /// The value for one MIG instance; `None` when DCGM has no per-instance value.
    pub mig: Option<fn(&MigDevice) -> Option<Value>>,
}

fn int(v: Option<u32>) -> Option<Value> {
    v.map(|v| Value::Int(u64::from(v)))
}

/// The GPU's framebuffer figures, unless it could not be read (lost GPUs read as all zero).
fn fb(g: &Gpu) -> Option<&gpuops_inventory::Memory> {
    Some(&g.memory).filter(|m| m.total_mib > 0)
}

/// One GPM figure of a GPU (`None` on GPUs without GPM and before the second collection).
fn gpm(g: &Gpu, f: fn(&Activity) -> Option<f64>) -> Option<Value> {
    g.activity.as_ref().and_then(f).map(Value::Float)
}

/// The same figure of a MIG instance (NVML samples it per GPU instance).
fn gpm_mig(m: &MigDevice, f: fn(&Activity) -> Option<f64>) -> Option<Value> {
    m.activity.as_ref().and_then(f).map(Value::Float)
}

/// The value of `DCGM_FI_DEV_XID_ERRORS`; written by the renderer from the XID counters.
pub const XID_ERRORS: &str = "DCGM_FI_DEV_XID_ERRORS";
pub const XID_ERRORS_HELP: &str = "Value of the last XID error encountered.";

/// The default fields, in dcgm-exporter's order (the XID gauge is written after the utilizations).
pub const FIELDS: &[Field] = &[
    Field {
        name: "DCGM_FI_DEV_SM_CLOCK",
        kind: Kind::Gauge,
        help: "SM clock frequency (in MHz).",
        gpu: |g| int(g.telemetry.sm_clock_mhz),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        kind: Kind::Gauge,
        help: "Memory clock frequency (in MHz).",
        gpu: |g| int(g.telemetry.mem_clock_mhz),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        kind: Kind::Gauge,
        help: "Memory temperature (in C).",
        gpu: |g| int(g.telemetry.memory_temperature_c),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_GPU_TEMP",
        kind: Kind::Gauge,
        help: "GPU temperature (in C).",
        gpu: |g| int(g.telemetry.temperature_c),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: Kind::Gauge,
        help: "Power draw (in W).",
        gpu: |g| {
            g.telemetry
                .power_mw
                .map(|mw| Value::Float(f64::from(mw) / 1000.0))
        },
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        kind: Kind::Counter,
        help: "Total energy consumption since boot (in mJ).",
        gpu: |g| g.telemetry.energy_mj.map(Value::Int),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        kind: Kind::Counter,
        help: "Total number of PCIe retries.",
        gpu: |g| int(g.telemetry.pcie_replay_counter),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: Kind::Gauge,
        help: "GPU utilization (in %).",
        gpu: |g| int(g.telemetry.gpu_utilization_pct),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: Kind::Gauge,
        help: "Memory utilization (in %).",
        gpu: |g| int(g.telemetry.memory_utilization_pct),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_ENC_UTIL",
        kind: Kind::Gauge,
        help: "Encoder utilization (in %).",
        gpu: |g| int(g.telemetry.encoder_utilization_pct),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_DEC_UTIL",
        kind: Kind::Gauge,
        help: "Decoder utilization (in %).",
        gpu: |g| int(g.telemetry.decoder_utilization_pct),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_FB_FREE",
        kind: Kind::Gauge,
        help: "Framebuffer memory free (in MiB).",
        gpu: |g| fb(g).map(|m| Value::Int(m.free_mib)),
        mig: Some(|m| m.fb.map(|f| Value::Int(f.free_mib))),
    },
    Field {
        name: "DCGM_FI_DEV_FB_USED",
        kind: Kind::Gauge,
        help: "Framebuffer memory used (in MiB).",
        gpu: |g| fb(g).map(|m| Value::Int(m.used_mib)),
        mig: Some(|m| m.fb.map(|f| Value::Int(f.used_mib))),
    },
    Field {
        name: "DCGM_FI_DEV_FB_RESERVED",
        kind: Kind::Gauge,
        help: "Framebuffer memory reserved (in MiB).",
        gpu: |g| fb(g).map(|m| Value::Int(m.reserved_mib)),
        mig: Some(|m| m.fb.map(|f| Value::Int(f.reserved_mib))),
    },
    Field {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        kind: Kind::Counter,
        help: "Number of remapped rows for uncorrectable errors",
        gpu: |g| {
            g.telemetry
                .remapped_rows
                .map(|r| Value::Int(r.uncorrectable))
        },
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        kind: Kind::Counter,
        help: "Number of remapped rows for correctable errors",
        gpu: |g| g.telemetry.remapped_rows.map(|r| Value::Int(r.correctable)),
        mig: None,
    },
    Field {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        kind: Kind::Gauge,
        help: "Whether remapping of rows has failed",
        gpu: |g| {
            g.telemetry
                .remapped_rows
                .map(|r| Value::Int(u64::from(r.failure)))
        },
        mig: None,
    },
    // Profiling (DCP) fields of dcp-metrics-included.csv, from NVML's GPM metrics (Hopper and newer).
    Field {
        name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of time the graphics engine is active.",
        gpu: |g| gpm(g, |a| a.gr_engine_active),
        mig: Some(|m| gpm_mig(m, |a| a.gr_engine_active)),
    },
    Field {
        name: "DCGM_FI_PROF_SM_ACTIVE",
        kind: Kind::Gauge,
        help: "The ratio of cycles an SM has at least 1 warp assigned.",
        gpu: |g| gpm(g, |a| a.sm_active),
        mig: Some(|m| gpm_mig(m, |a| a.sm_active)),
    },
    Field {
        name: "DCGM_FI_PROF_SM_OCCUPANCY",
        kind: Kind::Gauge,
        help: "The ratio of number of warps resident on an SM.",
        gpu: |g| gpm(g, |a| a.sm_occupancy),
        mig: Some(|m| gpm_mig(m, |a| a.sm_occupancy)),
    },
    Field {
        name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of cycles the tensor (HMMA) pipe is active.",
        gpu: |g| gpm(g, |a| a.tensor_active),
        mig: Some(|m| gpm_mig(m, |a| a.tensor_active)),
    },
    Field {
        name: "DCGM_FI_PROF_DRAM_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of cycles the device memory interface is active sending or receiving data.",
        gpu: |g| gpm(g, |a| a.dram_active),
        mig: Some(|m| gpm_mig(m, |a| a.dram_active)),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        gpu: |g| gpm(g, |a| a.pcie_tx_bytes_per_second),
        mig: Some(|m| gpm_mig(m, |a| a.pcie_tx_bytes_per_second)),
    },
    Field {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        gpu: |g| gpm(g, |a| a.pcie_rx_bytes_per_second),
        mig: Some(|m| gpm_mig(m, |a| a.pcie_rx_bytes_per_second)),
    },
    Field {
        name: "DCGM_FI_PROF_NVLINK_TX_BYTES",
        kind: Kind::Gauge,
        help: "The number of bytes of active NvLink tx (transmit) data including both header and payload.",
        gpu: |g| gpm(g, |a| a.nvlink_tx_bytes_per_second),
        mig: Some(|m| gpm_mig(m, |a| a.nvlink_tx_bytes_per_second)),
    },
    Field {
        name: "DCGM_FI_PROF_NVLINK_RX_BYTES",
        kind: Kind::Gauge,
        help: "The number of bytes of active NvLink rx (read) data including both header and payload.",
        gpu: |g| gpm(g, |a| a.nvlink_rx_bytes_per_second),
        mig: Some(|m| gpm_mig(m, |a| a.nvlink_rx_bytes_per_second)),
    },
];
