//! One module per subcommand: argument parsing and I/O; the logic they call lives in library crates.

pub mod agent;
pub mod autoscaler;
pub mod catalog;
pub mod cdi;
pub mod completion;
pub mod controller;
pub mod doctor;
pub mod extender;
pub mod flags;
pub mod inventory;
pub mod manifests;
pub mod mig;
pub mod migrate;
pub mod sim;
pub mod simulate;
pub mod simulate_autoscale;
pub mod top;

use std::path::Path;
use std::time::Duration;

/// Reads an input file given with `flag` through the shared size and encoding check (at most
/// `max` bytes of UTF-8; a UTF-16 or binary file is named as such), one message naming the flag
/// and the file.
pub fn read_input(path: &Path, flag: &str, max: u64, what: &str) -> anyhow::Result<String> {
    let file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("{flag}: cannot read {}: {e}", path.display()))?;
    gpuops_yamlpos::read_text(file, max, what)
        .map_err(|e| anyhow::anyhow!("{flag}: {}: {e}", path.display()))
}

/// Parses a flag's duration: Go/Kubernetes style (`500ms`, `10s`, `1m30s`, `1h2m3.5s`; a bare
/// number is seconds). Zero is refused because every duration flag is an interval or a timeout.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = gpuops_duration::parse(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("{text:?}: must be more than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(
            parse_duration("1h2m3.5s"),
            Ok(Duration::from_millis(3_723_500))
        );
        assert!(parse_duration("0s").unwrap_err().contains("more than zero"));
        assert!(
            parse_duration("ten")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        // Used to wrap around silently (n * 3600 in u64).
        assert!(
            parse_duration("5124095576030432h")
                .unwrap_err()
                .contains("too long")
        );
    }
}
