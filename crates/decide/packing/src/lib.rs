//! GPU cluster packing: nodes with CPU, memory and GPUs at milli-GPU granularity, pods that ask
//! for a share of one GPU, one whole GPU or several, GPU model constraints, and placement
//! policies, from the FGD paper's baselines (Random, DotProd, GpuClustering, GpuPacking,
//! BestFit, FGD) to our own.
//!
//! Pure: the library parses trace text the caller read ([`trace::read_nodes_file`] /
//! [`trace::read_pods_file`] are the only helpers that touch the file system), simulates,
//! and renders tables, CSV and SVG as strings. The `gpuops simulate` command and the
//! `gpuops scheduler-extender` server are thin layers over [`simulate::simulate`],
//! [`report`], [`extender`] and [`policy::PolicyKind`]. See `docs/packing.md`.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod error;
pub mod extender;
pub mod policy;
pub mod report;
pub mod rng;
pub mod simulate;
pub mod trace;

pub use cluster::{Cluster, GpuChoice, ModelSet, Node, PodReq};
pub use error::{PackingError, Result};
pub use policy::{Placement, Policy, PolicyKind, Scored, TieBreak, TypicalPods, select};
pub use simulate::{
    PolicySummary, Progress, RunResult, SimConfig, Simulation, parse_seeds, simulate, workload,
};
pub use trace::{NodeSpec, PodSpec, parse_nodes, parse_pods, read_nodes_file, read_pods_file};
