//! `gpuops migrate`'s translation, pure: NVIDIA's GPU Operator (its `ClusterPolicy`,
//! `nvidia.com/v1`) or the standalone device plugin, GPU Feature Discovery, MIG manager and
//! dcgm-exporter (their DaemonSets and ConfigMaps) into the gpuops chart's values, with a warning
//! for every setting that cannot be carried over, and the per-node check of what would change.
//!
//! Configs are parsed with the agent's own parsers (device plugin `version: v1` configs,
//! mig-parted configs), so a config the agent would refuse is refused here, naming the object.
#![forbid(unsafe_code)]

mod check;
mod csv;
mod error;
mod objects;
mod translate;

#[cfg(test)]
mod tests;

pub use check::{Change, NodeCheck, check_nodes};
pub use csv::{CsvField, served};
pub use error::MigrateError;
pub use objects::parse_documents;
pub use translate::{Migration, Options, Plan, Warning, migrate};
