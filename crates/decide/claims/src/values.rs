//! Kubernetes' CEL value types that device selectors compare: `quantity` (capacities) and
//! `semver` (version attributes), as the API server's CEL library defines them.

use crate::ClaimError;
use cel::objects::Opaque;
use std::cmp::Ordering;

/// A quantity in nano-units: exact for every suffix Kubernetes accepts (`n` is the smallest)
/// and wide enough for exabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(pub i128);

const NANO: i128 = 1_000_000_000;

impl Quantity {
    pub fn from_units(units: u64) -> Quantity {
        Quantity(i128::from(units) * NANO)
    }

    /// Parses `40Gi`, `80G`, `1.5Gi`, `500m`, `1e3`, `+2Ki`, `-1`.
    pub fn parse(s: &str) -> Result<Quantity, ClaimError> {
        let bad = || ClaimError::Quantity(s.to_string());
        let (neg, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(bad());
        }
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        // Value = mantissa / 10^frac_digits * multiplier, in nano-units.
        let mut mantissa: i128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            let d = i128::from(c.to_digit(10).ok_or_else(bad)?);
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(d))
                .ok_or_else(bad)?;
        }
        let frac_digits = u32::try_from(frac_part.len()).map_err(|_| bad())?;
        let (mul_num, mul_den): (i128, i128) = match suffix {
            "" => (NANO, 1),
            "n" => (1, 1),
            "u" => (1_000, 1),
            "m" => (1_000_000, 1),
            "k" => (NANO * 1_000, 1),
            "M" => (NANO * 1_000_000, 1),
            "G" => (NANO * 1_000_000_000, 1),
            "T" => (NANO * 1_000_000_000_000, 1),
            "P" => (NANO * 1_000_000_000_000_000, 1),
            "E" => (NANO * 1_000_000_000_000_000_000, 1),
            "Ki" => (NANO << 10, 1),
            "Mi" => (NANO << 20, 1),
            "Gi" => (NANO << 30, 1),
            "Ti" => (NANO << 40, 1),
            "Pi" => (NANO << 50, 1),
            "Ei" => (NANO << 60, 1),
            e if e.starts_with(['e', 'E']) => {
                let exp: i32 = e[1..].parse().map_err(|_| bad())?;
                if !(-9..=18).contains(&exp) {
                    return Err(bad());
                }
                if exp >= 0 {
                    (NANO * 10i128.pow(exp.unsigned_abs()), 1)
                } else {
                    (NANO, 10i128.pow(exp.unsigned_abs()))
                }
            }
            _ => return Err(bad()),
        };
        let den = 10i128
            .checked_pow(frac_digits)
            .and_then(|d| d.checked_mul(mul_den))
            .ok_or_else(bad)?;
        let v = mantissa.checked_mul(mul_num).ok_or_else(bad)? / den;
        Ok(Quantity(if neg { -v } else { v }))
    }

    /// The whole units, rounded up as Kubernetes' `asInteger` does not (it refuses fractions);
    /// here a fraction is an error too.
    pub fn as_integer(self) -> Option<i64> {
        (self.0 % NANO == 0)
            .then(|| i64::try_from(self.0 / NANO).ok())
            .flatten()
    }
}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

/// A semantic version 2.0.0 (build metadata ignored in comparisons, as the spec says).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Semver {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: Vec<String>,
}

impl Semver {
    pub fn parse(s: &str) -> Result<Semver, ClaimError> {
        let bad = || ClaimError::Semver(s.to_string());
        let core_pre = s.split_once('+').map_or(s, |(a, _)| a);
        let (core, pre) = match core_pre.split_once('-') {
            Some((c, p)) => (c, Some(p)),
            None => (core_pre, None),
        };
        let nums: Vec<&str> = core.split('.').collect();
        if nums.len() != 3 {
            return Err(bad());
        }
        let num = |t: &str| -> Result<u64, ClaimError> {
            if t.is_empty() || (t.len() > 1 && t.starts_with('0')) {
                return Err(bad());
            }
            t.parse().map_err(|_| bad())
        };
        let pre = match pre {
            Some(p) if p.is_empty() || p.split('.').any(str::is_empty) => return Err(bad()),
            Some(p) => p.split('.').map(str::to_string).collect(),
            None => Vec::new(),
        };
        Ok(Semver {
            major: num(nums[0])?,
            minor: num(nums[1])?,
            patch: num(nums[2])?,
            pre,
        })
    }
}

impl Ord for Semver {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                // A pre-release sorts before its release.
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => cmp_pre(&self.pre, &other.pre),
            })
    }
}

impl PartialOrd for Semver {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

fn cmp_pre(a: &[String], b: &[String]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (x.parse::<u64>(), y.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_compare_across_suffixes() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("40Gi"), Quantity::from_units(40 << 30));
        assert_eq!(q("1.5Gi"), Quantity::from_units(3 << 29));
        assert_eq!(q("1k"), q("1000"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(q("500m").0 * 2, q("1").0);
        assert!(q("80G") < q("80Gi"));
        assert_eq!(q("-1").0, -NANO);
        for bad in ["", "Gi", "1.2.3", "4Xi", "1..", "1e99"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(q("2Ki").as_integer(), Some(2048));
        assert_eq!(q("500m").as_integer(), None);
    }

    #[test]
    fn versions_order_as_semver_says() {
        let v = |s| Semver::parse(s).unwrap();
        assert!(v("9.0.0") > v("8.9.0"));
        assert!(v("10.0.0") > v("9.0.0"), "numeric, not lexical");
        assert!(v("1.0.0-rc.1") < v("1.0.0"));
        assert!(v("1.0.0-alpha") < v("1.0.0-alpha.1"));
        assert!(v("1.0.0-2") < v("1.0.0-alpha"));
        assert_eq!(v("1.2.3+build"), v("1.2.3"));
        for bad in ["1.2", "01.2.3", "1.2.3-", "a.b.c", "1.2.3.4"] {
            assert!(Semver::parse(bad).is_err(), "{bad}");
        }
    }
}
