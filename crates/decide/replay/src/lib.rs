//! Cost replay of GPU autoscaling on pod traces: gpuops's decisions against a Cluster Autoscaler-like baseline and static MIG, in simulated time.
//!
//! [`pools::parse_pools`] reads the pools file, [`trace::parse_timed_pods`] a pod list with
//! `creation_time`/`deletion_time`, [`replay`] runs each policy event by event through the same
//! `gpuops_autoscale::decide` and `gpuops_autoscale::decide_mig` the controller runs, and
//! [`report`] renders the ledger. Pure: the caller reads the files. See
//! `docs/autoscaling-replay.md`.
#![forbid(unsafe_code)]

mod ca;
pub mod error;
pub mod pools;
pub mod report;
mod run;
mod sim;
pub mod trace;

pub use error::ReplayError;
pub use pools::{Fractional, PoolsFile, ReplayPool, parse_pools};
pub use run::replay;
pub use sim::{PolicyName, Progress, Replay, ReplayOptions, RunResult, Series};
pub use trace::{TimedPod, parse_timed_pods};

#[cfg(test)]
mod tests;
