//! Kubernetes times against the controller's clock, pure.
//!
//! The controller's clock reads milliseconds; the API server writes `metav1.Time` (creation
//! times, condition transitions, our own `changed-at` annotation) in whole seconds, truncated.
//! A Kubernetes time `t` therefore names the whole second `[t, t + 999 ms]`: the event
//! happened somewhere in it. Comparing it as the instant `t` with a time of ours is wrong by up
//! to a second, and always in the same direction: a node created 300 ms after a scale-up
//! decided at 12:00:00.500 is stamped 12:00:00 and looks older than the decision. Every
//! comparison of a Kubernetes time with ours goes through this module and takes the side of
//! the second that cannot do harm: [`may_be_at_or_after`] when matching an event to what
//! caused it, [`second_end`] when measuring how long ago something happened (a timeout or a
//! minimum interval must not end early).

use crate::model::Millis;

/// One second, the resolution of a Kubernetes time.
pub const SECOND_MS: Millis = 1000;

/// The last millisecond of the second a Kubernetes time `t` names: the latest the event can
/// have happened. Timeouts and minimum intervals measured from it never end early.
pub fn second_end(t: Millis) -> Millis {
    (t - t % SECOND_MS).saturating_add(SECOND_MS - 1)
}

/// Whether something stamped with the Kubernetes time `k8s` can have happened at or after
/// `ours` (ms): the same second counts, as the stamp dropped the milliseconds.
pub fn may_be_at_or_after(k8s: Millis, ours: Millis) -> bool {
    second_end(k8s) >= ours
}

/// When a pod could have been created at the latest, for the batch window: a
/// creationTimestamp has whole seconds, so a pod created at x.9 s looked a second idle at
/// x+1.0 and a burst straddling a second was split (bench-autoscale (b): 6 pods alone, 12
/// nodes where 7 fit). The latest is its first sighting here, never past the end of the
/// timestamp's second.
pub fn latest_creation(created: Millis, first_seen: Millis) -> Millis {
    created.max(first_seen.min(second_end(created)))
}

/// Milliseconds since the epoch of an RFC 3339 timestamp (`2025-01-01T00:00:00Z`, an optional
/// fraction). Only what the API server writes: UTC.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    let (date, time) = s.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let time = time.split(['+']).next()?;
    let mut t = time.split(':');
    let (hh, mm) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let ss: f64 = t.next()?.parse().ok()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60;
    // A fraction below a millisecond is dropped; seconds are below 61.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let sub = (ss * 1000.0) as u64;
    u64::try_from(secs).ok().map(|s| s * 1000 + sub)
}

/// `2026-11-30T02:48:49Z` for unix seconds (what the status shows; the same text as
/// gpuops-kube's writer, which the edge uses for what it writes to the API server).
pub fn rfc3339(secs: u64) -> String {
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOON: Millis = 1_796_119_200_000; // 2026-12-01T10:00:00Z

    #[test]
    fn timestamps_parse_to_milliseconds_and_print_back() {
        assert_eq!(parse_rfc3339("2026-12-01T10:00:00Z"), Some(NOON));
        assert_eq!(parse_rfc3339("2026-12-01T10:00:00.250Z"), Some(NOON + 250));
        assert_eq!(parse_rfc3339("not a time"), None);
        assert_eq!(rfc3339(NOON / 1000), "2026-12-01T10:00:00Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn a_kubernetes_time_covers_its_whole_second() {
        assert_eq!(second_end(NOON), NOON + 999);
        assert_eq!(second_end(NOON + 999), NOON + 999);
        assert_eq!(second_end(NOON + 1000), NOON + 1999);
        // Created in the same second as our 12:00:00.500: it may be after it (read as the
        // instant NOON, it was not).
        assert!(may_be_at_or_after(NOON, NOON + 500));
        assert!(may_be_at_or_after(NOON, NOON + 999));
        // A whole second earlier cannot be.
        assert!(!may_be_at_or_after(NOON, NOON + 1000));
        assert!(!may_be_at_or_after(NOON - 1000, NOON));
    }

    #[test]
    fn a_pods_latest_creation_is_its_first_sighting_within_its_timestamps_second() {
        // Seen 0.9 s into its second: created then at the latest.
        assert_eq!(latest_creation(10_000, 10_900), 10_900);
        // Seen later (a restart, a slow watch): no more than the second's end.
        assert_eq!(latest_creation(10_000, 60_000), 10_999);
        // A clock behind the apiserver's: never before the timestamp.
        assert_eq!(latest_creation(10_000, 9_000), 10_000);
        assert_eq!(latest_creation(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(latest_creation(NOON, NOON + 400), NOON + 400);
    }
}
