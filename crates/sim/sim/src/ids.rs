//! Deterministic identifiers (GPU and MIG UUIDs, serials) derived from a seed.
//!
//! Real drivers read UUIDs from the board; the simulator derives them from the host name and index so
//! the same fleet always yields the same UUIDs, which keeps test expectations stable.

/// SplitMix64: a tiny, well-distributed hash step; no need for a crypto hash here.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a over a string, to turn a host name into a seed.
pub fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A UUID-formatted string (`8-4-4-4-12` hex) with the given prefix (`GPU-` or `MIG-`).
pub fn uuid(prefix: &str, seed: u64, parts: &[u64]) -> String {
    let mut h = mix(seed);
    for p in parts {
        h = mix(h ^ *p);
    }
    let lo = mix(h ^ 0x5555);
    let hex = format!("{h:016x}{lo:016x}");
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A 13-digit board serial number, as NVML reports for data-centre boards.
pub fn serial(seed: u64, index: u32) -> String {
    format!(
        "{:013}",
        mix(seed ^ u64::from(index) ^ 0xABCD) % 10_000_000_000_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_distinct_and_well_formed() {
        let a = uuid("GPU-", 1, &[0]);
        assert_eq!(a, uuid("GPU-", 1, &[0]));
        assert_ne!(a, uuid("GPU-", 1, &[1]));
        assert_ne!(a, uuid("GPU-", 2, &[0]));
        let body = a.strip_prefix("GPU-").unwrap();
        let lens: Vec<usize> = body.split('-').map(str::len).collect();
        assert_eq!(lens, vec![8, 4, 4, 4, 12]);
        assert!(body.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert_eq!(serial(7, 3).len(), 13);
    }
}
