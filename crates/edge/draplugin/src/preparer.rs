//! What the caller implements: preparing and unpreparing claims' devices.

use std::collections::BTreeMap;
use std::future::Future;

/// A ResourceClaim's identity as the kubelet sends it; the preparer reads the allocation itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Claim {
    pub namespace: String,
    pub uid: String,
    pub name: String,
}

impl std::fmt::Display for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// One device made available to a claim's containers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests this device serves; empty means all of them.
    pub request_names: Vec<String>,
    /// The ResourceSlice pool holding the device.
    pub pool_name: String,
    /// The device's name in that pool.
    pub device_name: String,
    /// Fully qualified CDI device IDs the runtime injects.
    pub cdi_device_ids: Vec<String>,
    /// Which share of a device allocated more than once (v1 only; v1beta1 kubelets drop it).
    pub share_id: Option<String>,
}

/// Per claim UID: its devices, or why it could not be prepared.
pub type PrepareAnswers<E> = BTreeMap<String, Result<Vec<PreparedDevice>, E>>;
/// Per claim UID: success, or why it could not be unprepared.
pub type UnprepareAnswers<E> = BTreeMap<String, Result<(), E>>;

/// Prepares claims' devices on the node (CDI specs, MIG instances, sharing daemons).
///
/// Contract, which the plugin relies on:
/// - answer every claim by its UID; a claim left out is reported to the kubelet as failed (it
///   calls again), and one claim's error never fails the others;
/// - the plugin never calls for the same claim twice at once, and within one process it does
///   not call `prepare` again for a claim it already prepared; after a restart it does, so
///   `prepare` must answer a claim the checkpoint already holds with the same devices;
/// - `unprepare` of a claim never prepared (or already unprepared) succeeds: the kubelet retries
///   an error forever;
/// - both may be cancelled at any await point (at shutdown, after the drain), exactly as a
///   crash would stop them, so the checkpoint must say what to undo.
pub trait ClaimPreparer: Send + Sync + 'static {
    /// A claim's failure; its `Display` is the message the kubelet shows.
    type Error: std::fmt::Display + Send;

    fn prepare(
        &self,
        claims: Vec<Claim>,
    ) -> impl Future<Output = PrepareAnswers<Self::Error>> + Send;

    fn unprepare(
        &self,
        claims: Vec<Claim>,
    ) -> impl Future<Output = UnprepareAnswers<Self::Error>> + Send;
}
