//! `gpuops controller`: GPU node-pool autoscaling on Cluster API; watches, the decision of
//! `gpuops-autoscale` run level-triggered, actions, events, status, metrics, leader election.
#![forbid(unsafe_code)]

pub mod act;
pub mod clock;
pub mod error;
pub mod metrics;
pub mod mig;
pub mod prom;
pub mod run;
pub mod status;

pub use error::ControllerError;
pub use run::{ControllerConfig, run};
