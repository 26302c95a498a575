//! Everything gpuops says to the Kubernetes API server: one client builder (request timeouts, user
//! agent, kubeconfig and context), the server-side-apply node writer with one field manager per
//! concern, events through kube's `Recorder`, watches with managedFields stripped, paged lists, and
//! a node's DRA ResourceSlices kept equal to the desired set (`SlicePublisher`).
//!
//! Every request this crate sends has a deadline ([`ClientOptions::request_timeout`]): a hung API
//! server costs a caller at most that long, and the caller decides what to do meanwhile.

mod client;
mod error;
mod lease;
mod node;
pub mod runtime;
mod slices;
mod time;
mod watch;

pub use client::{ClientOptions, DEFAULT_REQUEST_TIMEOUT};
pub use error::KubeError;
pub use lease::{LeaseOptions, elect};
pub use node::{NodeWriter, TaintWanted};
pub use slices::{
    ObservedSlice, Published, SLICE_FIELD_MANAGER, SLICE_HASH_ANNOTATION, SlicePlan,
    SlicePublisher, plan_slices, slice_name,
};
pub use time::{now_secs, rfc3339};
pub use watch::{list_all, strip_managed_fields, watch_configmap, watch_node};

pub use k8s_openapi;
pub use kube;
