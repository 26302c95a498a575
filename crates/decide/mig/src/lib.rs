//! MIG partitioning logic: mig-parted configs, device selection, placement planning and layout
//! planning for a workload mix.
//!
//! Pure: every function takes catalog facts, inventory snapshots or config text and returns plans;
//! the binary applies them through the NVML layer.
#![forbid(unsafe_code)]

pub mod apply;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod hooks;
pub mod layout;
pub mod planner;
pub mod select;
pub mod validate;
pub mod workload;

pub use error::{FilterPart, HexIdProblem, MigError};
pub use layout::{Instance, Layout};
