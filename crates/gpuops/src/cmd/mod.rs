//! One module per subcommand: argument parsing and I/O; the logic they call lives in library crates.

pub mod agent;
pub mod catalog;
pub mod cdi;
pub mod doctor;
pub mod extender;
pub mod inventory;
pub mod manifests;
pub mod mig;
pub mod sim;
pub mod simulate;
pub mod top;

use std::time::Duration;

/// Parses `500ms`, `10s`, `5m`, `1h` (a bare number is seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 500ms, 10s, 5m or 1h"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => {
            return Err(format!(
                "{text:?}: unknown unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
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
        assert!(parse_duration("0s").is_err());
        assert!(
            parse_duration("ten")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
    }
}
