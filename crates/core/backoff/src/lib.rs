//! One exponential backoff with jitter for every retry in gpuops; `backon` drives retried calls.

use backon::BackoffBuilder;
/// Retrying a fallible call (sync or async) with a [`Policy`]: `call.retry(policy).await`.
pub use backon::{BlockingRetryable, Retryable};
use std::time::Duration;

/// How waits grow after consecutive failures: `min` after the first, times `factor` after each
/// next one, never above `max`; then up to `jitter` of the wait is added at random, so replicas
/// and loops that fail together do not retry in lock-step. The jitter only ever lengthens a wait:
/// a caller's first retry is never sooner than `min`, and the longest wait is `max * (1 + jitter)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    pub min: Duration,
    pub max: Duration,
    /// Growth per failure; below 1 is taken as 1 (a wait that shrinks is no backoff).
    pub factor: f64,
    /// Fraction of the wait added at random, in `0.0..=1.0` (clamped).
    pub jitter: f64,
}

impl Policy {
    /// Doubling from `min` to `max`, no jitter.
    #[must_use]
    pub const fn new(min: Duration, max: Duration) -> Policy {
        Policy {
            min,
            max,
            factor: 2.0,
            jitter: 0.0,
        }
    }

    #[must_use]
    pub const fn factor(mut self, factor: f64) -> Policy {
        self.factor = factor;
        self
    }

    #[must_use]
    pub const fn jitter(mut self, jitter: f64) -> Policy {
        self.jitter = jitter;
        self
    }

    /// The wait after `failures` failures in a row, without jitter: zero for none.
    #[must_use]
    pub fn base(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let max = self.max.max(self.min);
        let factor = self.factor.max(1.0);
        let exponent = f64::from(failures - 1);
        // Past the step that reaches the cap the wait is the cap; computing the power there
        // would overflow for a count of failures in the billions.
        if factor > 1.0 && !self.min.is_zero() {
            let steps_to_cap = (max.as_secs_f64() / self.min.as_secs_f64()).ln() / factor.ln();
            if exponent >= steps_to_cap.ceil() {
                return max;
            }
        }
        // f64, not backon's f32: 100 ms doubled is 200 ms, not 200.000003 ms.
        Duration::try_from_secs_f64(self.min.as_secs_f64() * factor.powf(exponent))
            .map_or(max, |d| d.min(max))
    }

    /// The wait after `failures` failures in a row, jittered: zero for none.
    #[must_use]
    pub fn delay(&self, failures: u32) -> Duration {
        self.jittered(self.base(failures), fastrand::f64())
    }

    /// `base` lengthened by `unit` (in `0.0..1.0`, the random draw) of the jitter fraction.
    #[must_use]
    pub fn jittered(&self, base: Duration, unit: f64) -> Duration {
        let fraction = self.jitter.clamp(0.0, 1.0) * unit.clamp(0.0, 1.0);
        base.saturating_add(base.mul_f64(fraction))
    }

    /// A stateful backoff that counts the failures itself.
    #[must_use]
    pub const fn start(self) -> Backoff {
        Backoff {
            policy: self,
            failures: 0,
        }
    }
}

/// Consecutive failures and the wait each asks for. An endless iterator of waits, so it also
/// plugs into `backon`'s `Retryable::retry`.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    policy: Policy,
    failures: u32,
}

impl Backoff {
    /// Records one more failure; returns the wait before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.policy.delay(self.failures)
    }

    /// A success: the next failure waits `min` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    #[must_use]
    pub const fn failures(&self) -> u32 {
        self.failures
    }

    #[must_use]
    pub const fn policy(&self) -> &Policy {
        &self.policy
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.failed())
    }
}

/// A policy is what `backon`'s `Retryable::retry` takes: each retried call starts counting
/// from no failures.
impl BackoffBuilder for Policy {
    type Backoff = Backoff;

    fn build(self) -> Backoff {
        self.start()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waits_grow_by_the_factor_and_stop_at_the_cap() {
        let p = Policy::new(ms(500), Duration::from_secs(30));
        let waits: Vec<u128> = (1..=9).map(|f| p.base(f).as_millis()).collect();
        assert_eq!(
            waits,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        let p = Policy::new(Duration::from_secs(1), Duration::from_secs(100)).factor(3.0);
        assert_eq!(p.base(3), Duration::from_secs(9));
    }

    #[test]
    fn a_huge_failure_count_is_the_cap_and_cheap() {
        let p = Policy::new(Duration::from_secs(10), Duration::from_secs(600));
        assert_eq!(p.base(u32::MAX), Duration::from_secs(600));
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(600));
        // A factor of 1 never reaches the cap: it must still end.
        let flat = p.factor(1.0);
        assert_eq!(flat.base(u32::MAX), Duration::from_secs(10));
        // A factor below 1 does not shrink the wait.
        assert_eq!(p.factor(0.5).base(5), Duration::from_secs(10));
    }

    #[test]
    fn no_failures_no_wait() {
        let p = Policy::new(ms(500), ms(2000)).jitter(1.0);
        assert_eq!(p.base(0), Duration::ZERO);
        assert_eq!(p.delay(0), Duration::ZERO);
    }

    #[test]
    fn a_max_below_min_is_min() {
        let p = Policy::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(p.base(1), Duration::from_secs(5));
        assert_eq!(p.base(4), Duration::from_secs(5));
    }

    #[test]
    fn jitter_only_lengthens_and_stays_within_its_fraction() {
        let p = Policy::new(ms(500), ms(2000)).jitter(0.2);
        assert_eq!(p.jittered(ms(1000), 0.0), ms(1000));
        assert_eq!(p.jittered(ms(1000), 0.5), ms(1100));
        assert_eq!(p.jittered(ms(1000), 1.0), ms(1200));
        // Out-of-range draws and fractions are clamped.
        assert_eq!(p.jittered(ms(1000), 7.0), ms(1200));
        assert_eq!(p.jitter(-1.0).jittered(ms(1000), 0.9), ms(1000));
        let mut seen = std::collections::BTreeSet::new();
        for f in 1..=6 {
            for _ in 0..200 {
                let d = p.delay(f);
                assert!(d >= p.base(f) && d <= p.base(f).mul_f64(1.2), "{f}: {d:?}");
                seen.insert(d);
            }
        }
        assert!(
            seen.len() > 50,
            "the jitter is random: {} distinct",
            seen.len()
        );
        // No jitter: exactly the base.
        let exact = Policy::new(ms(500), ms(2000));
        assert!((1..=5).all(|f| exact.delay(f) == exact.base(f)));
    }

    #[test]
    fn the_stateful_form_counts_failures_and_resets() {
        let mut b = Policy::new(ms(100), ms(400)).start();
        let waits: Vec<Duration> = (0..4).map(|_| b.failed()).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(400)]);
        assert_eq!(b.failures(), 4);
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.next(), Some(ms(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn it_drives_backons_retry() {
        let mut tries = 0u32;
        let result: Result<u32, &str> = (|| {
            tries += 1;
            let t = tries;
            async move { if t < 3 { Err("not yet") } else { Ok(t) } }
        })
        .retry(Policy::new(ms(10), ms(40)))
        .sleep(tokio::time::sleep)
        .await;
        assert_eq!(result, Ok(3));
    }
}
