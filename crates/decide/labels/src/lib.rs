//! Node labels and node health for one GPU node, computed from an inventory snapshot. Pure, no I/O.
//!
//! - [`gfd_labels`] — the labels NVIDIA's GPU Feature Discovery (GFD) would write for this node
//!   under a device plugin config (MIG strategies none / single / mixed, time-slicing, MPS).
//! - [`owned_label_key`] and [`label_patch`] — which label keys the agent owns, and the keys to
//!   set and to remove to get from the node's current labels to the desired ones.
//! - [`nfd_feature_file`] — the same labels as a Node Feature Discovery local feature file.
//! - [`gpu_health`] — the `GPUHealthy` node condition and the `NoSchedule` taint from the GPUs
//!   currently marked unhealthy (fatal XIDs, lost GPUs).
//! - [`mig_strategy_condition`] — the `GPUMIGStrategyValid` node condition: whether the MIG
//!   layout fits the MIG strategy (`single` with mixed profiles does not).
#![forbid(unsafe_code)]

mod error;
mod gfd;
mod health;
mod keys;
mod migstrategy;
mod nfd;
mod patch;
mod product;

pub use error::LabelError;
pub use gfd::{LabelContext, PCI_CLASS_3D_CONTROLLER, PCI_CLASS_VGA_CONTROLLER, gfd_labels};
pub use health::{
    ConditionStatus, DEFAULT_TAINT_KEY, GPU_HEALTH_ANNOTATION, GPU_HEALTHY_CONDITION, GpuProblem,
    HEALTH_REPORT_VERSION, HealthDecision, HealthPolicy, HealthReport, NodeCondition, ProblemKind,
    Taint, UnhealthyCause, UnhealthyDevice, gpu_health,
};
pub use keys::{RESOURCE_LABEL_SUFFIXES, owned_label_key};
pub use migstrategy::{
    MIG_LAYOUT_FITS, MIG_LAYOUT_INVALID, MIG_STRATEGY_CONDITION, mig_strategy_condition,
};
pub use nfd::{NFD_FEATURES_DIR, NFD_MAX_FILE_SIZE, nfd_feature_file};
pub use patch::{LabelPatch, label_patch};
pub use product::{MAX_LABEL_VALUE_LEN, family_label, product_label, sanitise};
