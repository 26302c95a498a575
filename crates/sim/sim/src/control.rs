//! Fault and load injection: what `gpuops sim` does to the simulated driver.

use crate::state::NO_INSTANCE;
use crate::{SimError, SimProcess, SimState};

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 0x8;

/// A change to a GPU's load; `None` leaves a figure as it is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadChange {
    pub gpu_util_pct: Option<u32>,
    pub mem_util_pct: Option<u32>,
    pub memory_used_mib: Option<u64>,
    pub power_mw: Option<u32>,
    pub temperature_c: Option<u32>,
}

impl SimState {
    /// Queues an XID event, as the driver does when the kernel reports one. `gi`/`ci` attribute it to a
    /// MIG instance, which must exist.
    pub fn inject_xid(
        &mut self,
        gpu: u32,
        xid: u64,
        gi: Option<u32>,
        ci: Option<u32>,
    ) -> Result<(), SimError> {
        let g = self.gpu(gpu)?;
        if let Some(gi_id) = gi {
            let instance = g
                .gpu_instances
                .iter()
                .find(|i| i.id == gi_id)
                .ok_or_else(|| {
                    SimError::Invalid(format!("GPU {gpu} has no GPU instance {gi_id}"))
                })?;
            if let Some(ci_id) = ci
                && !instance.compute_instances.iter().any(|c| c.id == ci_id)
            {
                return Err(SimError::Invalid(format!(
                    "GPU {gpu} GPU instance {gi_id} has no compute instance {ci_id}"
                )));
            }
        } else if ci.is_some() {
            return Err(SimError::Invalid(
                "a compute instance needs its GPU instance (--gi)".into(),
            ));
        }
        self.push_event(
            gpu,
            EVENT_XID,
            xid,
            gi.unwrap_or(NO_INSTANCE),
            ci.unwrap_or(NO_INSTANCE),
        );
        Ok(())
    }

    /// Marks a GPU as fallen off the bus (every NVML call on it then fails with `GPU_IS_LOST`).
    pub fn set_lost(&mut self, gpu: u32, lost: bool) -> Result<(), SimError> {
        self.gpu_mut(gpu)?.lost = lost;
        Ok(())
    }

    /// A GPU reset: back on the bus, processes gone, MIG instances gone (layouts never survive a
    /// reset), MIG mode kept.
    pub fn reset(&mut self, gpu: u32) -> Result<(), SimError> {
        let g = self.gpu_mut(gpu)?;
        g.lost = false;
        g.mig_current = g.mig_pending;
        g.processes.clear();
        g.gpu_instances.clear();
        g.remapped_rows_pending = false;
        Ok(())
    }

    /// Marks a GPU as held by a client, so MIG mode changes need a reset (or releases it).
    pub fn set_driver_hung(&mut self, hung: bool) {
        self.driver_hung = hung;
    }

    pub fn set_held(&mut self, gpu: u32, held: bool) -> Result<(), SimError> {
        self.gpu_mut(gpu)?.held = held;
        Ok(())
    }

    /// [`SimState::set_load`] on the GPU `gpu` names: an index, or `all`.
    pub fn set_load_on(
        &mut self,
        gpu: &str,
        change: LoadChange,
        now_ms: u64,
    ) -> Result<(), SimError> {
        let targets: Vec<u32> = if gpu == "all" {
            (0..self.gpus.len() as u32).collect()
        } else {
            vec![gpu.parse().map_err(|_| {
                SimError::Invalid(format!("--gpu {gpu:?}: expected a GPU index or `all`"))
            })?]
        };
        targets
            .into_iter()
            .try_for_each(|g| self.set_load(g, change, now_ms))
    }

    /// `8x H100-SXM5-80GB`, or `4x L4 + 2x A100-SXM4-80GB` for mixed fleets.
    pub fn summary(&self) -> String {
        let mut groups: Vec<(&str, usize)> = Vec::new();
        for g in &self.gpus {
            match groups.last_mut() {
                Some((m, n)) if *m == g.model => *n += 1,
                _ => groups.push((&g.model, 1)),
            }
        }
        groups
            .iter()
            .map(|(m, n)| format!("{n}x {m}"))
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// Changes load figures, keeping the energy counter continuous across power changes.
    pub fn set_load(&mut self, gpu: u32, change: LoadChange, now_ms: u64) -> Result<(), SimError> {
        let g = self.gpu_mut(gpu)?;
        let model = g
            .catalog()
            .ok_or_else(|| SimError::Invalid(format!("GPU {gpu} has an unknown model")))?;
        for (name, pct) in [
            ("utilization", change.gpu_util_pct),
            ("memory utilization", change.mem_util_pct),
        ] {
            if pct.is_some_and(|p| p > 100) {
                return Err(SimError::Invalid(format!("{name} must be 0-100 %")));
            }
        }
        if let Some(used) = change.memory_used_mib
            && used > model.memory_mib
        {
            return Err(SimError::Invalid(format!(
                "memory used {used} MiB is more than GPU {gpu}'s {} MiB",
                model.memory_mib
            )));
        }
        if let Some(mw) = change.power_mw {
            g.energy_base_mj = g.energy_mj(now_ms);
            g.power_since_unix_ms = now_ms;
            g.load.power_mw = mw;
        }
        g.load_since_unix_ms = now_ms;
        if let Some(v) = change.gpu_util_pct {
            g.load.gpu_util_pct = v;
        }
        if let Some(v) = change.mem_util_pct {
            g.load.mem_util_pct = v;
        }
        if let Some(v) = change.memory_used_mib {
            g.load.memory_used_mib = v;
        }
        if let Some(v) = change.temperature_c {
            g.load.temperature_c = v;
        }
        Ok(())
    }

    /// Adds a process using `memory_mib` on a GPU, or on one of its MIG devices.
    pub fn add_process(&mut self, gpu: u32, process: SimProcess) -> Result<(), SimError> {
        let g = self.gpu_mut(gpu)?;
        if g.processes.iter().any(|p| p.pid == process.pid) {
            return Err(SimError::Invalid(format!(
                "pid {} already runs on GPU {gpu}",
                process.pid
            )));
        }
        if let Some(gi) = process.gi_id {
            let ok = g.gpu_instances.iter().any(|i| {
                i.id == gi
                    && process
                        .ci_id
                        .is_none_or(|ci| i.compute_instances.iter().any(|c| c.id == ci))
            });
            if !ok {
                return Err(SimError::Invalid(format!(
                    "GPU {gpu} has no MIG device gi={gi} ci={:?}",
                    process.ci_id
                )));
            }
        }
        g.processes.push(process);
        Ok(())
    }

    /// Ends every process on a GPU.
    pub fn clear_processes(&mut self, gpu: u32) -> Result<(), SimError> {
        self.gpu_mut(gpu)?.processes.clear();
        Ok(())
    }

    /// Sets the row-remapping counters (NVML fields 142-145).
    pub fn set_remapped_rows(
        &mut self,
        gpu: u32,
        correctable: u64,
        uncorrectable: u64,
        pending: bool,
        failure: bool,
    ) -> Result<(), SimError> {
        let g = self.gpu_mut(gpu)?;
        g.remapped_rows_correctable = correctable;
        g.remapped_rows_uncorrectable = uncorrectable;
        g.remapped_rows_pending = pending;
        g.remapped_rows_failure = failure;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fleet;

    fn dgx() -> SimState {
        SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap()
    }

    #[test]
    fn xid_needs_existing_gpu_and_instance() {
        let mut s = dgx();
        s.inject_xid(3, 48, None, None).unwrap();
        assert_eq!(s.events[0].data, 48);
        assert_eq!(s.events[0].gi_id, NO_INSTANCE);
        assert!(
            s.inject_xid(9, 48, None, None)
                .unwrap_err()
                .to_string()
                .contains("no GPU with index 9")
        );
        assert!(
            s.inject_xid(0, 48, Some(7), None)
                .unwrap_err()
                .to_string()
                .contains("no GPU instance 7")
        );
        s.gpus[0].set_mig_mode(true).unwrap();
        let gi = s.gpus[0].create_gi(19, None).unwrap();
        s.gpus[0].create_ci(gi, 0, None, "MIG-x".into()).unwrap();
        s.inject_xid(0, 94, Some(gi), Some(0)).unwrap();
        assert!(s.inject_xid(0, 94, Some(gi), Some(3)).is_err());
        assert!(s.inject_xid(0, 94, None, Some(0)).is_err());
    }

    #[test]
    fn reset_brings_a_lost_gpu_back_without_its_instances() {
        let mut s = dgx();
        s.gpus[2].set_mig_mode(true).unwrap();
        s.gpus[2].create_gi(0, None).unwrap();
        s.set_lost(2, true).unwrap();
        assert!(s.gpus[2].lost);
        s.reset(2).unwrap();
        assert!(!s.gpus[2].lost && s.gpus[2].gpu_instances.is_empty() && s.gpus[2].mig_current);
    }

    #[test]
    fn summaries_group_models_and_load_targets_are_an_index_or_all() {
        let mut s = SimState::from_fleet(&crate::Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
        assert_eq!(s.summary(), "8x H100-SXM5-80GB");
        let busy = LoadChange {
            gpu_util_pct: Some(90),
            ..LoadChange::default()
        };
        s.set_load_on("all", busy, 1).unwrap();
        assert!(s.gpus.iter().all(|g| g.load.gpu_util_pct == 90));
        let e = s.set_load_on("first", busy, 2).unwrap_err().to_string();
        assert!(
            e.contains("--gpu \"first\": expected a GPU index or `all`"),
            "{e}"
        );
    }

    #[test]
    fn load_changes_are_validated_and_energy_stays_continuous() {
        let mut s = dgx();
        let before = s.gpus[0].energy_mj(10_000);
        s.set_load(
            0,
            LoadChange {
                power_mw: Some(700_000),
                gpu_util_pct: Some(90),
                ..LoadChange::default()
            },
            10_000,
        )
        .unwrap();
        assert_eq!(s.gpus[0].energy_mj(10_000), before);
        assert_eq!(s.gpus[0].energy_mj(11_000), before + 700_000);
        let bad = LoadChange {
            gpu_util_pct: Some(101),
            ..LoadChange::default()
        };
        assert!(s.set_load(0, bad, 0).is_err());
        let too_much = LoadChange {
            memory_used_mib: Some(1 << 30),
            ..LoadChange::default()
        };
        assert!(
            s.set_load(0, too_much, 0)
                .unwrap_err()
                .to_string()
                .contains("more than")
        );
    }

    #[test]
    fn processes_must_target_existing_mig_devices() {
        let mut s = dgx();
        let p = |pid, gi| SimProcess {
            pid,
            used_memory_mib: 100,
            gi_id: gi,
            ci_id: None,
        };
        s.add_process(0, p(10, None)).unwrap();
        assert!(s.add_process(0, p(10, None)).is_err());
        assert!(s.add_process(0, p(11, Some(1))).is_err());
        assert_eq!(s.gpus[0].memory_used_mib(), 100);
        s.clear_processes(0).unwrap();
        assert!(s.gpus[0].processes.is_empty());
    }
}
