//! GPU activity as NVML's GPM (GPU Performance Monitoring) API reports it, derived from the load
//! `gpuops sim load` sets, so a loaded GPU shows activity and an idle one shows none.
//!
//! Real GPM samples are opaque counter snapshots; a metric is the counters' difference over the
//! time between two samples. The simulator's counters follow the load in steps: a sample records
//! the rates in force when it was taken, and an interval's metric is the time-weighted mix of the
//! two samples' rates around the last load change (see [`Activity::between`]).
//!
//! *Presumed* (no hardware figures behind them): the ratios of SM activity, occupancy and tensor
//! use to the utilization, and the PCIe/NVLink rates of a busy GPU.

use crate::SimGpu;
use gpuops_catalog::Family;

/// Bytes per second a fully busy GPU moves over PCIe towards the host (presumed).
const PCIE_TX_BUSY: f64 = 2.0 * GIB;
/// Bytes per second a fully busy GPU receives over PCIe (presumed: input batches).
const PCIE_RX_BUSY: f64 = 6.0 * GIB;
/// Bytes per second per direction over all NVLinks of a fully busy GPU (presumed, all-reduce).
const NVLINK_BUSY: f64 = 120.0 * GIB;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Activity rates at one moment: ratios 0-1 and bytes per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Activity {
    /// Graphics/compute engine busy (`NVML_GPM_METRIC_GRAPHICS_UTIL`).
    pub gr_engine: f64,
    /// SMs with at least one warp (`SM_UTIL`).
    pub sm_active: f64,
    /// Warps resident vs. the maximum (`SM_OCCUPANCY`).
    pub sm_occupancy: f64,
    /// Tensor pipes busy (`ANY_TENSOR_UTIL`).
    pub tensor: f64,
    /// DRAM bandwidth used (`DRAM_BW_UTIL`).
    pub dram: f64,
    pub pcie_tx_bytes: f64,
    pub pcie_rx_bytes: f64,
    /// `None` on GPUs without NVLink.
    pub nvlink_tx_bytes: Option<f64>,
    pub nvlink_rx_bytes: Option<f64>,
}

impl Activity {
    /// A GPU busy `util` of the time with its memory interface busy `mem_util` (both 0-1).
    fn of_load(util: f64, mem_util: f64, nvlink: bool) -> Activity {
        Activity {
            gr_engine: util,
            sm_active: util * 0.9,
            sm_occupancy: util * 0.45,
            tensor: util * 0.6,
            dram: mem_util,
            pcie_tx_bytes: util * PCIE_TX_BUSY,
            pcie_rx_bytes: util * PCIE_RX_BUSY,
            nvlink_tx_bytes: nvlink.then_some(util * NVLINK_BUSY),
            nvlink_rx_bytes: nvlink.then_some(util * NVLINK_BUSY),
        }
    }

    fn scaled(self, k: f64) -> Activity {
        Activity {
            gr_engine: self.gr_engine * k,
            sm_active: self.sm_active * k,
            sm_occupancy: self.sm_occupancy * k,
            tensor: self.tensor * k,
            dram: self.dram * k,
            pcie_tx_bytes: self.pcie_tx_bytes * k,
            pcie_rx_bytes: self.pcie_rx_bytes * k,
            nvlink_tx_bytes: self.nvlink_tx_bytes.map(|v| v * k),
            nvlink_rx_bytes: self.nvlink_rx_bytes.map(|v| v * k),
        }
    }

    fn plus(self, o: Activity) -> Activity {
        let add = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        Activity {
            gr_engine: self.gr_engine + o.gr_engine,
            sm_active: self.sm_active + o.sm_active,
            sm_occupancy: self.sm_occupancy + o.sm_occupancy,
            tensor: self.tensor + o.tensor,
            dram: self.dram + o.dram,
            pcie_tx_bytes: self.pcie_tx_bytes + o.pcie_tx_bytes,
            pcie_rx_bytes: self.pcie_rx_bytes + o.pcie_rx_bytes,
            nvlink_tx_bytes: add(self.nvlink_tx_bytes, o.nvlink_tx_bytes),
            nvlink_rx_bytes: add(self.nvlink_rx_bytes, o.nvlink_rx_bytes),
        }
    }

    /// The average over `[t1, t2]` of a step from `first` (sampled at `t1`) to `second` (sampled at
    /// `t2`) that happened at `changed` (the last load change), or at `t2` when it is not inside
    /// the interval.
    pub fn between(first: Activity, t1: u64, second: Activity, t2: u64, changed: u64) -> Activity {
        if t2 <= t1 || changed <= t1 || changed >= t2 {
            return second;
        }
        let span = (t2 - t1) as f64;
        let before = (changed - t1) as f64 / span;
        first.scaled(before).plus(second.scaled(1.0 - before))
    }
}

impl SimGpu {
    /// Whether the GPU has NVML's GPM API (Hopper and newer, as `nvmlGpmQueryDeviceSupport` says).
    pub fn gpm_supported(&self) -> bool {
        self.catalog()
            .is_some_and(|m| matches!(m.family, Family::Hopper | Family::Blackwell))
    }

    fn has_nvlink(&self) -> bool {
        self.catalog().is_some_and(|m| m.nvlinks > 0)
    }

    fn load_activity(&self) -> Activity {
        Activity::of_load(
            f64::from(self.load.gpu_util_pct.min(100)) / 100.0,
            f64::from(self.load.mem_util_pct.min(100)) / 100.0,
            self.has_nvlink(),
        )
    }

    /// Activity of one GPU instance: the GPU's load while a process runs in it, none otherwise
    /// (*presumed*: the load is the busy instances' load). `None` when the instance does not exist.
    pub fn gi_activity(&self, gi_id: u32) -> Option<Activity> {
        self.gpu_instances.iter().find(|g| g.id == gi_id)?;
        let busy = self.processes.iter().any(|p| p.gi_id == Some(gi_id));
        Some(if busy {
            self.load_activity()
        } else {
            Activity::of_load(0.0, 0.0, self.has_nvlink())
        })
    }

    /// Activity of the whole GPU; in MIG mode the instances' activity weighted by their memory
    /// slices, so one busy 1g instance of seven is a seventh (or an eighth) of the GPU.
    pub fn activity(&self) -> Activity {
        if !self.mig_current {
            return self.load_activity();
        }
        let slices = self
            .catalog()
            .and_then(|m| m.mig.as_ref())
            .map_or(8, |g| g.memory_slices)
            .max(1);
        self.gpu_instances
            .iter()
            .filter_map(|gi| {
                self.gi_activity(gi.id)
                    .map(|a| a.scaled(f64::from(gi.size) / f64::from(slices)))
            })
            .fold(
                Activity::of_load(0.0, 0.0, self.has_nvlink()),
                Activity::plus,
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fleet, SimProcess, SimState};

    fn node(fleet: &str) -> SimState {
        SimState::from_fleet(&Fleet::resolve(fleet).unwrap(), 0).unwrap()
    }

    #[test]
    fn idle_gpus_show_no_activity_and_loaded_ones_follow_the_load() {
        let mut s = node("dgx-h100");
        let g = &s.gpus[0];
        assert!(g.gpm_supported());
        let idle = g.activity();
        assert_eq!(idle.gr_engine, 0.0);
        assert_eq!(idle.pcie_rx_bytes, 0.0);
        assert_eq!(idle.nvlink_tx_bytes, Some(0.0), "H100 SXM has NVLink");
        s.gpus[0].load.gpu_util_pct = 80;
        s.gpus[0].load.mem_util_pct = 40;
        let busy = s.gpus[0].activity();
        assert!((busy.gr_engine - 0.8).abs() < 1e-9);
        assert!((busy.dram - 0.4).abs() < 1e-9);
        assert!(busy.sm_active > 0.5 && busy.sm_active < busy.gr_engine);
        assert!(busy.tensor > 0.0 && busy.pcie_tx_bytes > 0.0);
        assert!(
            !node("dgx-a100").gpus[0].gpm_supported(),
            "Ampere has no GPM"
        );
        assert!(!node("l4x4").gpus[0].gpm_supported(), "Ada has no GPM");
        assert_eq!(
            node("h100-nvl-x2").gpus[0].activity().nvlink_rx_bytes,
            Some(0.0)
        );
    }

    #[test]
    fn mig_instances_are_busy_only_with_a_process_and_weigh_by_their_slices() {
        let mut s = node("dgx-h100");
        s.gpus[0].set_mig_mode(true).unwrap();
        let busy_gi = s.gpus[0].create_gi(19, None).unwrap(); // 1g.10gb
        let idle_gi = s.gpus[0].create_gi(19, None).unwrap();
        s.gpus[0].load.gpu_util_pct = 100;
        s.add_process(
            0,
            SimProcess {
                pid: 7,
                used_memory_mib: 100,
                gi_id: Some(busy_gi),
                ci_id: None,
            },
        )
        .unwrap();
        let g = &s.gpus[0];
        assert_eq!(g.gi_activity(busy_gi).unwrap().gr_engine, 1.0);
        assert_eq!(g.gi_activity(idle_gi).unwrap().gr_engine, 0.0);
        assert_eq!(g.gi_activity(99), None);
        assert!((g.activity().gr_engine - 1.0 / 8.0).abs() < 1e-9);
    }

    #[test]
    fn an_interval_mixes_the_rates_around_the_load_change() {
        let idle = Activity::default();
        let busy = Activity {
            gr_engine: 1.0,
            ..Activity::default()
        };
        // Changed a quarter into the interval: busy three quarters of it.
        let mixed = Activity::between(idle, 1000, busy, 2000, 1250);
        assert!((mixed.gr_engine - 0.75).abs() < 1e-9);
        // A change before the interval: the second sample's rates held throughout.
        assert_eq!(Activity::between(idle, 1000, busy, 2000, 500), busy);
        assert_eq!(Activity::between(idle, 2000, busy, 2000, 2000), busy);
    }
}
