//! When to register again after the kubelet refused or did not answer (pure, tested).

use std::time::{Duration, Instant};

/// 500 ms after a failed registration, doubling up to 30 s; exact (no jitter): each resource
/// registers against its own kubelet socket, so there is no crowd to spread.
const BACKOFF: gpuops_backoff::Policy =
    gpuops_backoff::Policy::new(Duration::from_millis(500), Duration::from_secs(30));

/// Backoff of one resource's registration, reset by a new kubelet socket or a success.
#[derive(Debug, Clone, Default)]
pub struct RegistrationBackoff {
    failures: u32,
    next_at: Option<Instant>,
    /// The kubelet socket the failures were against: a new kubelet is tried at once.
    against: Option<(u64, u64)>,
    /// The last failure logged, so a lasting one is logged once.
    logged: Option<String>,
}

impl RegistrationBackoff {
    /// Whether to try registering with `kubelet` (its socket's identity) now.
    pub fn due(&mut self, kubelet: (u64, u64), now: Instant) -> bool {
        if self.against != Some(kubelet) {
            self.failures = 0;
            self.next_at = None;
            self.against = Some(kubelet);
        }
        self.next_at.is_none_or(|t| now >= t)
    }

    /// Records a failure; returns the wait before the next try and whether this failure is new
    /// (worth a log line).
    pub fn failed(&mut self, message: &str, now: Instant) -> (Duration, bool) {
        self.failures = self.failures.saturating_add(1);
        let wait = BACKOFF.delay(self.failures);
        self.next_at = Some(now + wait);
        let new = self.logged.as_deref() != Some(message);
        if new {
            self.logged = Some(message.to_string());
        }
        (wait, new)
    }

    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.next_at = None;
        self.logged = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejected_registration_backs_off_and_is_logged_once_per_reason() {
        let kubelet = (1, 42);
        let mut b = RegistrationBackoff::default();
        let t0 = Instant::now();
        assert!(b.due(kubelet, t0));
        let (wait, new) = b.failed("resource name is not valid", t0);
        assert_eq!((wait, new), (Duration::from_millis(500), true));
        assert!(!b.due(kubelet, t0 + Duration::from_millis(499)));
        assert!(b.due(kubelet, t0 + wait));
        let waits: Vec<u64> = (0..8)
            .map(|_| b.failed("resource name is not valid", t0).0.as_millis() as u64)
            .collect();
        assert_eq!(waits, [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert!(!b.failed("resource name is not valid", t0).1, "logged once");
        assert!(
            b.failed("connection refused", t0).1,
            "a new reason is logged"
        );
        // A restarted kubelet (a new socket) is tried at once.
        assert!(b.due((1, 43), t0));
        b.succeeded();
        assert!(
            b.failed("connection refused", t0).1,
            "logged again after a success"
        );
    }
}
