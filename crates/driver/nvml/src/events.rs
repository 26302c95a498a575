//! XID and GPU-lost events: a watcher over NVML's event set, with MIG attribution kept.

use crate::error::NvmlError;
use crate::{Gpus, raw};
use nvml_wrapper_sys::bindings::{nvmlDevice_t, nvmlEventSet_t};

/// `nvmlEventTypeXidCriticalError`.
const XID_CRITICAL_ERROR: u64 = 0x8;
/// `0xFFFFFFFF`: the event is not specific to one MIG instance.
const NO_INSTANCE: u32 = u32::MAX;

/// Something the driver told us about a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuEvent {
    /// An XID; `gi_id`/`ci_id` name the MIG instance when the driver attributed it to one.
    Xid {
        gpu: u32,
        xid: u64,
        gi_id: Option<u32>,
        ci_id: Option<u32>,
    },
    /// A watched GPU fell off the bus; the driver does not say which (take a snapshot).
    GpuLost,
}

/// Waits for XID events on a set of GPUs.
pub struct XidWatcher<'a> {
    gpus: &'a Gpus,
    set: nvmlEventSet_t,
    devices: Vec<(nvmlDevice_t, u32)>,
}

impl std::fmt::Debug for XidWatcher<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XidWatcher")
            .field(
                "gpus",
                &self.devices.iter().map(|d| d.1).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Gpus {
    /// Registers for XID events on every GPU in `indices` that supports them; the others are
    /// returned so the caller can say so.
    pub fn watch_xids(
        &self,
        indices: &[u32],
    ) -> Result<(XidWatcher<'_>, Vec<(u32, NvmlError)>), NvmlError> {
        let lib = self.nvml.lib();
        let set = raw::event_set_create(lib)?;
        let mut watcher = XidWatcher {
            gpus: self,
            set,
            devices: Vec::new(),
        };
        let mut skipped = Vec::new();
        for &index in indices {
            let registered = self
                .nvml
                .device_by_index(index)
                .map_err(|e| crate::error::call("nvmlDeviceGetHandleByIndex", Some(index), e))
                .and_then(|d| {
                    let handle = raw::handle(&d);
                    let supported = raw::supported_events(lib, handle, Some(index))?;
                    if supported & XID_CRITICAL_ERROR == 0 {
                        return Err(NvmlError::NotSupported {
                            call: "XID events",
                            gpu: Some(index),
                        });
                    }
                    raw::register_events(lib, handle, XID_CRITICAL_ERROR, set, Some(index))?;
                    Ok(handle)
                });
            match registered {
                Ok(handle) => watcher.devices.push((handle, index)),
                Err(e) => skipped.push((index, e)),
            }
        }
        Ok((watcher, skipped))
    }
}

impl XidWatcher<'_> {
    /// GPU indices being watched.
    pub fn watched(&self) -> Vec<u32> {
        self.devices.iter().map(|d| d.1).collect()
    }

    /// Waits up to `timeout_ms` for the next event; `Ok(None)` when none came.
    pub fn wait(&self, timeout_ms: u32) -> Result<Option<GpuEvent>, NvmlError> {
        match raw::event_wait(self.gpus.nvml.lib(), self.set, timeout_ms) {
            Ok(None) => Ok(None),
            Err(NvmlError::GpuLost { .. }) => Ok(Some(GpuEvent::GpuLost)),
            Err(e) => Err(e),
            Ok(Some(data)) => {
                let gpu = self
                    .devices
                    .iter()
                    .find(|(h, _)| *h == data.device)
                    .map(|d| d.1)
                    .ok_or_else(|| NvmlError::Call {
                        call: "nvmlEventSetWait",
                        gpu: None,
                        reason: "event for a device this watcher did not register".into(),
                        code: None,
                    })?;
                let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
                Ok(Some(GpuEvent::Xid {
                    gpu,
                    xid: data.eventData,
                    gi_id: instance(data.gpuInstanceId),
                    ci_id: instance(data.computeInstanceId),
                }))
            }
        }
    }
}

impl Drop for XidWatcher<'_> {
    fn drop(&mut self) {
        raw::event_set_free(self.gpus.nvml.lib(), self.set);
    }
}
