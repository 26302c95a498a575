//! Unknown keys in the device plugin config files this process read: one warning per file and
//! key on stderr, and the `gpuops_config_unknown_keys{file}` gauge appended to the agent's metrics.

use gpuops_metrics::text::{Kind, header, push_label};
use gpuops_resources::{Config, UnknownKeyReport};
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};

fn report() -> &'static Mutex<UnknownKeyReport> {
    static REPORT: OnceLock<Mutex<UnknownKeyReport>> = OnceLock::new();
    REPORT.get_or_init(|| Mutex::new(UnknownKeyReport::default()))
}

/// Notes a config file just parsed: warns about unknown keys not warned about before, and
/// updates the file's count. Returns the config for chaining at the parse site.
pub fn note(origin: &str, config: Config) -> Config {
    let warnings = match report().lock() {
        Ok(mut r) => r.record(origin, &config),
        Err(poisoned) => poisoned.into_inner().record(origin, &config),
    };
    for w in warnings {
        tracing::warn!(file = origin, "{w}");
    }
    config
}

/// The gauge in Prometheus text format; empty until a config file was read.
pub fn exposition() -> String {
    let counts = match report().lock() {
        Ok(r) => r.counts().clone(),
        Err(poisoned) => poisoned.into_inner().counts().clone(),
    };
    render(&counts)
}

fn render(counts: &std::collections::BTreeMap<String, usize>) -> String {
    let mut out = String::new();
    if counts.is_empty() {
        return out;
    }
    header(
        &mut out,
        "gpuops_config_unknown_keys",
        Kind::Gauge,
        "Keys in a device plugin config file that NVIDIA's schema does not have (ignored; likely typos).",
    );
    for (file, n) in counts {
        let mut labels = String::new();
        push_label(&mut labels, "file", file);
        let _ = writeln!(out, "gpuops_config_unknown_keys{{{labels}}} {n}");
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn gauge_per_file() {
        let counts = [
            ("/etc/a \"x\".yaml".to_string(), 2),
            ("b.yaml".to_string(), 0),
        ]
        .into_iter()
        .collect();
        let text = super::render(&counts);
        assert!(
            text.contains("# TYPE gpuops_config_unknown_keys gauge\n"),
            "{text}"
        );
        assert!(
            text.contains("gpuops_config_unknown_keys{file=\"/etc/a \\\"x\\\".yaml\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("gpuops_config_unknown_keys{file=\"b.yaml\"} 0\n"),
            "{text}"
        );
        assert_eq!(super::render(&Default::default()), "");
    }
}
