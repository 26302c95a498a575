//! The agent's kubelet device plugin servers: one socket and registration per resource,
//! re-registering whenever the kubelet restarts.
//!
//! The resource model (which resources and device IDs, how to allocate) is pure and lives in
//! `gpuops-resources`; this crate is the I/O edge: gRPC over Unix sockets, registration, and noticing
//! a kubelet restart (its `kubelet.sock` replaced, or our socket deleted) at once through inotify,
//! or within half a second where inotify is unavailable.

mod error;
mod published;
mod register;
mod service;
mod supervisor;

pub use error::PluginError;
pub use published::{Published, probe_host};
pub use register::RegistrationBackoff;
pub use supervisor::{serve, serve_reporting};
