//! DCGM-compatible Prometheus metrics for one node's GPUs, rendered from an inventory snapshot.
//!
//! Pure: the agent collects (NVML snapshot, kubelet PodResources, XID events) on an interval and
//! hands the pieces to [`render`]; the HTTP server only serves the last rendered text, so a scrape
//! never waits on the driver or the kubelet.
#![forbid(unsafe_code)]

pub mod dcgm;
pub mod dcgm_env;
pub mod pods;
pub mod render;
pub mod text;
pub mod xids;

pub use dcgm_env::{DcgmExporterEnv, EnvError};
pub use pods::{Assignment, PodMap, PodRef};
pub use render::{AgentStats, HostnameLabel, NodeView, render, render_scrapes};
pub use xids::XidCounters;
