//! The Prometheus text exposition format (0.0.4): escaping and family headers.

use std::fmt::Write;

/// `Content-Type` of what [`crate::render`] produces.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Metric type, as written on the `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// Writes the `# HELP` and `# TYPE` lines of a family.
pub fn header(out: &mut String, name: &str, kind: Kind, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {}", kind.word());
}

/// Appends `name="value"` (with a leading comma unless `first`) to a label list being built.
pub fn push_label(out: &mut String, name: &str, value: &str) {
    if !out.is_empty() {
        out.push(',');
    }
    out.push_str(name);
    out.push_str("=\"");
    escape_label_value_into(out, value);
    out.push('"');
}

/// Writes one sample line: `name{labels} value`.
pub fn sample(out: &mut String, name: &str, labels: &[&str], value: Value) {
    out.push_str(name);
    let mut first = true;
    for part in labels.iter().filter(|p| !p.is_empty()) {
        out.push(if first { '{' } else { ',' });
        out.push_str(part);
        first = false;
    }
    if !first {
        out.push('}');
    }
    let _ = writeln!(out, " {value}");
}

/// A sample value: integers print without a decimal point, as DCGM's do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) if v.is_nan() => f.write_str("NaN"),
            Value::Float(v) if v.is_infinite() => {
                f.write_str(if *v > 0.0 { "+Inf" } else { "-Inf" })
            }
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

fn escape_label_value_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        let mut labels = String::new();
        push_label(&mut labels, "a", "x\"y\\z\nw");
        push_label(&mut labels, "b", "plain");
        assert_eq!(labels, r#"a="x\"y\\z\nw",b="plain""#);
    }

    #[test]
    fn samples_skip_empty_label_parts_and_print_values_like_dcgm() {
        let mut out = String::new();
        sample(&mut out, "m", &["a=\"1\"", "", "b=\"2\""], Value::Int(42));
        sample(&mut out, "m", &[], Value::Float(63.5));
        sample(&mut out, "m", &[""], Value::Float(f64::NAN));
        assert_eq!(out, "m{a=\"1\",b=\"2\"} 42\nm 63.5\nm NaN\n");
    }

    #[test]
    fn help_newlines_are_escaped() {
        let mut out = String::new();
        header(&mut out, "m", Kind::Counter, "two\nlines \\ here");
        assert_eq!(out, "# HELP m two\\nlines \\\\ here\n# TYPE m counter\n");
    }
}
