//! The XID thread: a blocking wait on NVML's event set, rebuilt when the set of healthy GPUs
//! changes; it only reports, the snapshot loop decides.

use gpuops_inventory::Inventory;
use gpuops_nvml::{GpuEvent, Gpus};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// What the XID thread tells the snapshot loop.
pub(crate) enum Report {
    Event(GpuEvent),
    /// The XID watch now covers these GPU indices.
    Watching(Vec<u32>),
    Problem(String),
}

/// How long one wait on the event set lasts, so a stop is seen within this.
const WAIT_MS: u32 = 500;

pub(crate) fn watch(
    gpus: &Gpus,
    healthy: &Mutex<Vec<u32>>,
    stop: &AtomicBool,
    tx: &mpsc::Sender<Report>,
) {
    let current = || healthy.lock().map(|h| h.clone()).unwrap_or_default();
    let mut announced: Option<Vec<u32>> = None;
    while !stop.load(Ordering::Relaxed) {
        let watched = current();
        let (watcher, skipped) = match gpus.watch_xids(&watched) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.blocking_send(Report::Problem(format!("cannot watch XID events: {e}")));
                std::thread::sleep(Duration::from_secs(5));
                continue;
            }
        };
        for (gpu, why) in skipped {
            let _ = tx.blocking_send(Report::Problem(format!(
                "GPU {gpu}: not watching XID events: {why}"
            )));
        }
        let now_watched = watcher.watched();
        if announced.as_ref() != Some(&now_watched) {
            let _ = tx.blocking_send(Report::Watching(now_watched.clone()));
            announced = Some(now_watched);
        }
        while !stop.load(Ordering::Relaxed) {
            match watcher.wait(WAIT_MS) {
                Ok(None) if current() == watched => {}
                Ok(None) => break,
                Ok(Some(event)) => {
                    let lost = event == GpuEvent::GpuLost;
                    let _ = tx.blocking_send(Report::Event(event));
                    if lost {
                        // The driver keeps answering "lost" until the GPU is gone from the watch
                        // list: wait for the next snapshot to drop it.
                        while !stop.load(Ordering::Relaxed) && current() == watched {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        break;
                    }
                }
                Err(e) => {
                    let _ =
                        tx.blocking_send(Report::Problem(format!("waiting for XID events: {e}")));
                    std::thread::sleep(Duration::from_secs(1));
                    break;
                }
            }
        }
    }
}

/// `XID 48 on GPU 3 (GPU-…): double-bit ECC error; action: drain the node and reset the GPU`.
pub fn describe_event(event: &GpuEvent, inv: &Inventory) -> String {
    match event {
        GpuEvent::GpuLost => {
            "a watched GPU fell off the bus (NVML: GPU is lost); the next read says which".into()
        }
        GpuEvent::Xid {
            gpu,
            xid,
            gi_id,
            ci_id,
        } => {
            let info = gpuops_catalog::xid::describe(*xid);
            let uuid = inv
                .gpus
                .iter()
                .find(|g| g.index == *gpu)
                .map(|g| g.uuid.clone())
                .unwrap_or_default();
            let instance = match (gi_id, ci_id) {
                (Some(gi), Some(ci)) => format!(" MIG gi {gi} ci {ci}"),
                (Some(gi), None) => format!(" MIG gi {gi}"),
                _ => String::new(),
            };
            let ignored = if gpuops_catalog::xid::DEFAULT_IGNORED_XIDS.contains(xid) {
                " (application fault: GPU stays healthy)"
            } else {
                ""
            };
            format!(
                "XID {xid} on GPU {gpu} ({uuid}){instance}: {}{ignored}; action: {}",
                info.meaning, info.action
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::Gpu;

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            ..Gpu::default()
        }
    }

    #[test]
    fn events_are_explained() {
        let inv = Inventory {
            gpus: vec![gpu(0), gpu(3)],
            ..Inventory::default()
        };
        let text = describe_event(
            &GpuEvent::Xid {
                gpu: 3,
                xid: 48,
                gi_id: None,
                ci_id: None,
            },
            &inv,
        );
        assert_eq!(
            text,
            "XID 48 on GPU 3 (GPU-3): double-bit ECC error; action: drain the node and reset the GPU"
        );
        let text = describe_event(
            &GpuEvent::Xid {
                gpu: 0,
                xid: 13,
                gi_id: Some(7),
                ci_id: Some(0),
            },
            &inv,
        );
        assert!(
            text.contains("MIG gi 7 ci 0") && text.contains("GPU stays healthy"),
            "{text}"
        );
    }
}
