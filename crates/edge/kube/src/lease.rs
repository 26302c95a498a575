//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager), so two replicas of a
//! controller never both act.

use crate::KubeError;
use std::time::Duration;
use tokio::sync::watch;

/// Who competes for which Lease, and how long a holder keeps it without renewing.
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (the pod name).
    pub identity: String,
    /// How long a lock lasts without renewal; a killed leader is replaced after at most this.
    pub duration: Duration,
    /// How long before expiry the holder renews.
    pub grace: Duration,
}

/// Starts competing for the Lease in the background; the receiver turns `true` while this
/// replica holds it and `false` when it loses it. Dropping every receiver releases the Lease.
///
/// # Errors
/// [`KubeError::Config`] when the durations are unusable (zero, or grace not below duration),
/// [`KubeError::Api`]-like failures when the Lease cannot be created or read.
pub async fn elect(
    client: kube::Client,
    options: &LeaseOptions,
) -> Result<watch::Receiver<bool>, KubeError> {
    let duration = options.duration.as_secs();
    let grace = options.grace.as_secs();
    // The crate panics on these; refuse them as an error instead.
    if duration == 0 || grace == 0 || grace >= duration {
        return Err(KubeError::Config {
            source: format!(
                "lease duration {duration}s and grace {grace}s: both must be at least 1s and grace below duration"
            )
            .into(),
        });
    }
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, &options.name)
        .with_namespace(&options.namespace)
        .with_identity(&options.identity)
        .with_duration(duration)
        .with_grace(grace)
        .with_field_manager(format!("gpuops-lease-{}", options.identity))
        .build()
        .await
        .map_err(|e| KubeError::Config {
            source: format!("lease {}/{}: {e}", options.namespace, options.name).into(),
        })?;
    let (rx, _task) = manager.watch().await;
    Ok(rx)
}
