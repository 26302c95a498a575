//! DRA ResourceClaims as autoscaling demand, pure: the devices a new node of a pool would
//! publish (gpuops-dra's model, the agent's code, on an inventory built from the catalog), the
//! claims' CEL selectors evaluated on them with Kubernetes' `quantity` and `semver`, and which
//! node in flight, re-partitioned node or cheapest pool serves each pending pod. No I/O: the
//! controller reads claims, templates and DeviceClasses and acts. docs/autoscaling.md says what
//! is evaluated and what is refused.
#![forbid(unsafe_code)]

pub mod cel;
pub mod claim;
pub mod demand;
mod error;
pub mod k8s;
pub mod node;
pub mod plan;
pub mod published;
pub mod values;

pub use claim::{AlternativeSpec, ClaimSpec, Classes, Count, NodeDevices, RequestSpec};
pub use error::ClaimError;
pub use plan::{Existing, ExistingKind, Outcome, Plan, PodClaims, PoolShape, plan};

#[cfg(test)]
mod tests;
