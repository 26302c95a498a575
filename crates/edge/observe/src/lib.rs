//! Reads what the doctor and top diagnose: cluster objects, agents' and Prometheus's metrics.

mod cluster;
mod controllers;
pub mod dra;
mod error;
mod http;
pub mod migrate;
mod snapshot;
mod sources;

pub use cluster::{Read, client, cluster, list_all, logs};
pub use error::{ObserveError, chain};
pub use http::{Http, HttpOptions, encode};
pub use snapshot::{SnapshotOptions, snapshot};
pub use sources::{Collected, MetricSources, collect};
