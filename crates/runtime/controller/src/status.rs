//! The status the controller publishes in its ConfigMap: built and rendered by the pure half
//! in `gpuops-autoscale` ([`gpuops_autoscale::status`]), here under the path the CLI reads it
//! by; the runtime writes and reads the ConfigMap (`crate::run`).

pub use gpuops_autoscale::status::*;
