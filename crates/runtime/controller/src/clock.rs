//! The controller's clock: the wall clock, because the decision compares it with the apiserver's
//! timestamps (pod creation, Machine stages), with jumps of the local clock detected against the
//! monotonic clock so the decision's own remembered instants (idle timers, back-offs) can be
//! moved with the jump instead of expiring at once or an hour late.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A difference between wall and monotonic time below this is drift or scheduling, not a jump.
const TOLERANCE_MS: i64 = 2_000;

#[derive(Debug, Default)]
pub struct Clock {
    last: Option<(u64, Instant)>,
}

impl Clock {
    /// Now in wall-clock milliseconds, and how far the wall clock jumped since the last read
    /// beyond what monotonic time says passed.
    pub fn read(&mut self) -> (u64, Option<i64>) {
        let (wall, mono) = (wall_ms(), Instant::now());
        let jumped = self.last.and_then(|(w, m)| {
            let elapsed = u64::try_from(mono.duration_since(m).as_millis()).unwrap_or(u64::MAX);
            jump(w, elapsed, wall)
        });
        self.last = Some((wall, mono));
        (wall, jumped)
    }
}

/// The jump, if the wall clock moved from `prev` to `wall` while `elapsed_ms` passed.
fn jump(prev: u64, elapsed_ms: u64, wall: u64) -> Option<i64> {
    let expected = i128::from(prev) + i128::from(elapsed_ms);
    let delta = i64::try_from(i128::from(wall) - expected).ok()?;
    (delta.abs() > TOLERANCE_MS).then_some(delta)
}

pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_are_told_from_drift() {
        const H: u64 = 3_600_000;
        assert_eq!(jump(10 * H, 5_000, 10 * H + 5_000), None);
        assert_eq!(
            jump(10 * H, 5_000, 10 * H + 6_500),
            None,
            "drift and scheduling"
        );
        assert_eq!(jump(10 * H, 5_000, 11 * H + 5_000), Some(3_600_000));
        assert_eq!(jump(10 * H, 5_000, 9 * H + 5_000), Some(-3_600_000));
        assert_eq!(
            jump(0, 0, u64::MAX),
            None,
            "beyond i64: not a jump anyone can shift by"
        );
    }

    #[test]
    fn the_first_read_reports_no_jump() {
        let mut c = Clock::default();
        assert_eq!(c.read().1, None);
        assert_eq!(c.read().1, None);
    }
}
