//! Go/Kubernetes-style duration strings: `300ms`, `1m30s`, `1h2m3.5s`, `2us`/`2µs`, `3ns`.
//!
//! The grammar is Go's `time.ParseDuration` (what kubectl, the kubelet and NVIDIA's Go daemons
//! accept): one or more `<decimal><unit>` terms, units `ns`, `us`/`µs`/`μs`, `ms`, `s`, `m`, `h`,
//! fractions allowed in any term. Two differences, both for the CLI's sake: a bare number means
//! seconds (`10` is `10s`, as gpuops always accepted), and negative durations are refused (no
//! setting of ours means anything by them). Like Go, the total must fit in a signed 64-bit count
//! of nanoseconds (about 292 years); anything larger is an error rather than a wrapped value.
#![forbid(unsafe_code)]

use std::fmt;
use std::time::Duration;

/// The largest duration Go can represent: `i64::MAX` nanoseconds.
pub const MAX_NANOS: u128 = i64::MAX as u128;

/// Why a duration string was refused. Every message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("empty duration: write one like 500ms, 10s, 1m30s or 1h")]
    Empty,
    #[error("{text:?}: negative durations are not allowed")]
    Negative { text: String },
    #[error("{text:?} is not a duration like 500ms, 10s, 1m30s or 1h: {why} at character {at}")]
    Syntax {
        text: String,
        /// 1-based character position of the problem.
        at: usize,
        why: &'static str,
    },
    #[error("{text:?}: unknown unit {unit:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit { text: String, unit: String },
    #[error("{text:?}: a number without a unit after {number:?} (write {number}s, {number}m, ...)")]
    MissingUnit { text: String, number: String },
    #[error(
        "{text:?} is too long: durations are limited to {} (about 292 years)",
        format(Duration::from_nanos(i64::MAX as u64))
    )]
    Overflow { text: String },
}

/// Nanoseconds per unit, longest unit names first so `ms` is not read as `m` + `s`.
const UNITS: &[(&str, u128)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("\u{b5}s", 1_000),  // µ MICRO SIGN, as Go accepts
    ("\u{3bc}s", 1_000), // μ GREEK SMALL LETTER MU, as Go accepts
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a duration; see the crate documentation for the grammar. Zero (`0`, `0s`) is allowed;
/// callers for which zero means nothing say so themselves.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let (t, offset) = match t.strip_prefix('+') {
        Some(rest) => (rest, 1),
        None if t.starts_with('-') => {
            return Err(DurationError::Negative {
                text: text.to_string(),
            });
        }
        None => (t, 0),
    };
    let syntax = |at: usize, why: &'static str| DurationError::Syntax {
        text: text.to_string(),
        at: at + offset + 1,
        why,
    };
    let overflow = || DurationError::Overflow {
        text: text.to_string(),
    };
    // A bare number (no unit anywhere) is seconds.
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return match term(t, 1_000_000_000) {
            Ok(nanos) => to_duration(nanos).ok_or_else(overflow),
            Err(Term::Malformed) => Err(syntax(0, "a malformed number")),
            Err(Term::Overflow) => Err(overflow()),
        };
    }
    let chars: Vec<(usize, char)> = t.char_indices().collect();
    let mut total: u128 = 0;
    let mut i = 0;
    while i < chars.len() {
        let start = i;
        while i < chars.len() && (chars[i].1.is_ascii_digit() || chars[i].1 == '.') {
            i += 1;
        }
        if i == start {
            return Err(syntax(start, "expected a number"));
        }
        let number = &t[chars[start].0..chars.get(i).map_or(t.len(), |c| c.0)];
        let unit_start = i;
        while i < chars.len() && !(chars[i].1.is_ascii_digit() || chars[i].1 == '.') {
            i += 1;
        }
        let unit = &t
            [chars.get(unit_start).map_or(t.len(), |c| c.0)..chars.get(i).map_or(t.len(), |c| c.0)];
        if unit.is_empty() {
            return Err(DurationError::MissingUnit {
                text: text.to_string(),
                number: number.to_string(),
            });
        }
        let Some(&(_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(DurationError::UnknownUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            });
        };
        let nanos = term(number, scale).map_err(|e| match e {
            Term::Malformed => syntax(start, "a malformed number"),
            Term::Overflow => overflow(),
        })?;
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        if total > MAX_NANOS {
            return Err(overflow());
        }
    }
    to_duration(total).ok_or_else(overflow)
}

enum Term {
    Malformed,
    Overflow,
}

/// `number` (digits with at most one `.`, at least one digit) times `scale` nanoseconds, exactly
/// for the integer part and truncated below a nanosecond for the fraction (as Go does).
fn term(number: &str, scale: u128) -> Result<u128, Term> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(Term::Malformed);
    }
    let mut whole: u128 = 0;
    for d in int.bytes() {
        whole = whole * 10 + u128::from(d - b'0');
        if whole > MAX_NANOS {
            return Err(Term::Overflow);
        }
    }
    // Digits past the 19th cannot change the result by a whole nanosecond at any unit we have.
    let mut divisor: u128 = 1;
    let mut fraction: u128 = 0;
    for d in frac.bytes().take(19) {
        fraction = fraction * 10 + u128::from(d - b'0');
        divisor *= 10;
    }
    // whole <= MAX_NANOS < 2^63 and scale < 2^42, so neither product overflows u128.
    let nanos = whole * scale + fraction * scale / divisor;
    if nanos > MAX_NANOS {
        return Err(Term::Overflow);
    }
    Ok(nanos)
}

fn to_duration(nanos: u128) -> Option<Duration> {
    if nanos > MAX_NANOS {
        return None;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    let sub = u32::try_from(nanos % 1_000_000_000).ok()?;
    Some(Duration::new(secs, sub))
}

/// Formats like Go's `Duration.String()`: `1h2m3.5s`, `1m30s`, `500ms`, `2µs`, `0s`.
pub fn format(d: Duration) -> String {
    Formatted(d).to_string()
}

struct Formatted(Duration);

impl fmt::Display for Formatted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000_000_000 {
            let (unit, scale) = match nanos {
                n if n < 1_000 => ("ns", 1),
                n if n < 1_000_000 => ("\u{b5}s", 1_000),
                _ => ("ms", 1_000_000),
            };
            return write!(f, "{}{unit}", decimal(nanos, scale));
        }
        let hours = nanos / 3_600_000_000_000;
        let minutes = nanos / 60_000_000_000 % 60;
        let seconds = nanos % 60_000_000_000;
        if hours > 0 {
            write!(f, "{hours}h{minutes}m")?;
        } else if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write!(f, "{}s", decimal(seconds, 1_000_000_000))
    }
}

/// `value / scale` as a decimal without trailing zeros.
fn decimal(value: u128, scale: u128) -> String {
    let whole = value / scale;
    let mut frac = value % scale;
    if frac == 0 {
        return whole.to_string();
    }
    let mut digits = String::new();
    let mut s = scale / 10;
    while s > 0 && frac > 0 {
        digits.push(char::from(b'0' + u8::try_from(frac / s).unwrap_or(0)));
        frac %= s;
        s /= 10;
    }
    format!("{whole}.{digits}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(d) => panic!("{text:?} parsed as {d:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn go_and_kubernetes_forms() {
        let table: &[(&str, Duration)] = &[
            ("1m30s", Duration::from_secs(90)),
            ("1h2m3.5s", Duration::from_millis(3_723_500)),
            ("500ms", Duration::from_millis(500)),
            ("2us", Duration::from_micros(2)),
            ("2\u{b5}s", Duration::from_micros(2)),
            ("2\u{3bc}s", Duration::from_micros(2)),
            ("3ns", Duration::from_nanos(3)),
            ("1.5h", Duration::from_secs(5400)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("1h0m0s", Duration::from_secs(3600)),
            ("+5m", Duration::from_secs(300)),
            ("2h45m", Duration::from_secs(9900)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            // gpuops' own: a bare number is seconds.
            ("10", Duration::from_secs(10)),
            ("1.25", Duration::from_millis(1250)),
            (" 10s ", Duration::from_secs(10)),
            ("1s1s", Duration::from_secs(2)),
            ("0.000000001s", Duration::from_nanos(1)),
            ("0.0000000019s", Duration::from_nanos(1)),
        ];
        for (text, want) in table {
            assert_eq!(ok(text), *want, "{text:?}");
        }
    }

    #[test]
    fn the_largest_go_duration_is_accepted_and_one_more_nanosecond_is_not() {
        assert_eq!(ok("2562047h47m16.854775807s").as_nanos(), MAX_NANOS);
        assert_eq!(ok("9223372036854775807ns").as_nanos(), MAX_NANOS);
        for text in [
            "2562047h47m16.854775808s",
            "9223372036854775808ns",
            "2562048h",
            "99999999999999999999h",
            "18446744073709551616",
            "9999999999999999999999999999999999999999s",
            "2562047h2562047h",
        ] {
            let e = err(text);
            assert!(e.contains("too long") && e.contains(text), "{text}: {e}");
            assert!(e.contains("2562047h47m16.854775807s"), "{e}");
        }
    }

    #[test]
    fn bad_input_names_the_problem() {
        assert_eq!(
            err(""),
            "empty duration: write one like 500ms, 10s, 1m30s or 1h"
        );
        assert!(err("-5s").contains("negative"));
        let e = err("3d");
        assert!(e.contains("unknown unit \"d\""), "{e}");
        let e = err("1m30");
        assert!(e.contains("without a unit after \"30\""), "{e}");
        let e = err("ten");
        assert!(e.contains("expected a number at character 1"), "{e}");
        let e = err("1m x");
        assert!(e.contains("unknown unit \"m x\""), "{e}");
        let e = err("1..5s");
        assert!(e.contains("malformed number"), "{e}");
        let e = err(".s");
        assert!(e.contains("malformed number"), "{e}");
        let e = err("1.2.3");
        assert!(e.contains("malformed number"), "{e}");
        let e = err("5 s");
        assert!(e.contains("unknown unit \" s\""), "{e}");
    }

    #[test]
    fn formats_like_go() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(3), "3ns"),
            (Duration::from_micros(2), "2\u{b5}s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(3_723_500), "1h2m3.5s"),
        ] {
            assert_eq!(format(d), want);
            assert_eq!(parse(want), Ok(d), "{want} reads back");
        }
    }
}
