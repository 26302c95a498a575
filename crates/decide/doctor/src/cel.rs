//! The few CEL device selectors claims are written with, evaluated on a ResourceSlice's device
//! without a CEL interpreter: comparisons of an attribute
//! (`device.attributes["gpu.nvidia.com"].productName == "..."`), of a capacity
//! (`device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0`) or of
//! `device.driver`, joined by `&&`. Anything else is [`Eval::Unknown`]: the doctor quotes it and
//! says it cannot evaluate it, rather than guessing. (gpuops-claims has a full interpreter for the
//! autoscaler; the doctor stays free of it until that crate lands.)

use k8s_openapi::api::resource::v1::Device;
use std::cmp::Ordering;

/// A selector's verdict on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eval {
    Match,
    NoMatch,
    /// The expression is outside what this module reads.
    Unknown,
}

/// What one comparison reads from the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    Driver,
    /// Domain and name: `device.attributes["<domain>"].<name>`.
    Attribute(String, String),
    Capacity(String, String),
}

#[derive(Debug, Clone, PartialEq)]
enum Literal {
    Str(String),
    Int(i64),
    Bool(bool),
    /// A `quantity("...")` in bytes or units.
    Quantity(f64),
}

#[derive(Debug, Clone, PartialEq)]
struct Comparison {
    operand: Operand,
    op: &'static str,
    value: Literal,
}

/// A selector read into comparisons joined by `&&`; `None` when it is not that shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Selector {
    terms: Vec<Comparison>,
}

const OPS: [&str; 6] = ["==", "!=", ">=", "<=", ">", "<"];

impl Selector {
    pub fn parse(expression: &str) -> Option<Selector> {
        let e = strip_parens(expression.trim());
        if e.contains("||") || e.is_empty() {
            return None;
        }
        let terms = split_top(e, "&&")
            .into_iter()
            .map(|t| comparison(strip_parens(t.trim())))
            .collect::<Option<Vec<_>>>()?;
        Some(Selector { terms })
    }

    /// The attributes and capacities it reads, for quoting the values that exist.
    pub fn operands(&self) -> Vec<Operand> {
        let mut v: Vec<Operand> = self.terms.iter().map(|t| t.operand.clone()).collect();
        v.dedup();
        v
    }

    pub fn eval(&self, driver: &str, d: &Device) -> Eval {
        let mut all = true;
        for t in &self.terms {
            match t.eval(driver, d) {
                Some(true) => {}
                Some(false) => all = false,
                None => return Eval::Unknown,
            }
        }
        if all { Eval::Match } else { Eval::NoMatch }
    }
}

/// Evaluates `expression` on a device of `driver`'s slice.
pub fn eval(expression: &str, driver: &str, d: &Device) -> Eval {
    Selector::parse(expression).map_or(Eval::Unknown, |s| s.eval(driver, d))
}

/// The value an operand has on a device, as text (for quoting what exists); `None` when absent.
pub fn value_of(operand: &Operand, driver: &str, d: &Device) -> Option<String> {
    match operand {
        Operand::Driver => Some(driver.to_string()),
        Operand::Attribute(domain, name) => {
            let a = lookup(d.attributes.as_ref()?, driver, domain, name)?;
            a.string
                .clone()
                .or_else(|| a.version.clone())
                .or_else(|| a.int.map(|i| i.to_string()))
                .or_else(|| a.bool.map(|b| b.to_string()))
        }
        Operand::Capacity(domain, name) => Some(
            lookup(d.capacity.as_ref()?, driver, domain, name)?
                .value
                .0
                .clone(),
        ),
    }
}

impl std::fmt::Display for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operand::Driver => f.write_str("driver"),
            Operand::Attribute(d, n) => write!(f, "{d}/{n}"),
            Operand::Capacity(d, n) => write!(f, "capacity {d}/{n}"),
        }
    }
}

/// An attribute of the driver's own domain is published unqualified (`productName`); others
/// (`resource.kubernetes.io/pcieRoot`) with their domain.
fn lookup<'a, T>(
    map: &'a std::collections::BTreeMap<String, T>,
    driver: &str,
    domain: &str,
    name: &str,
) -> Option<&'a T> {
    map.get(&format!("{domain}/{name}"))
        .or_else(|| (domain == driver).then(|| map.get(name)).flatten())
}

impl Comparison {
    fn eval(&self, driver: &str, d: &Device) -> Option<bool> {
        let ord = match (&self.operand, &self.value) {
            (Operand::Driver, Literal::Str(s)) => driver.cmp(s.as_str()),
            (Operand::Attribute(domain, name), v) => {
                // A missing attribute is a CEL runtime error, which the allocator counts as no match.
                let Some(a) = d
                    .attributes
                    .as_ref()
                    .and_then(|m| lookup(m, driver, domain, name))
                else {
                    return Some(false);
                };
                match v {
                    Literal::Str(s) => a.string.as_deref()?.cmp(s.as_str()),
                    Literal::Int(i) => a.int?.cmp(i),
                    Literal::Bool(b) => a.bool?.cmp(b),
                    Literal::Quantity(_) => return None,
                }
            }
            (Operand::Capacity(domain, name), Literal::Quantity(q)) => {
                let Some(c) = d
                    .capacity
                    .as_ref()
                    .and_then(|m| lookup(m, driver, domain, name))
                else {
                    return Some(false);
                };
                quantity(&c.value.0)?.partial_cmp(q)?
            }
            _ => return None,
        };
        Some(match self.op {
            "==" => ord == Ordering::Equal,
            "!=" => ord != Ordering::Equal,
            ">=" => ord != Ordering::Less,
            "<=" => ord != Ordering::Greater,
            ">" => ord == Ordering::Greater,
            _ => ord == Ordering::Less,
        })
    }
}

fn strip_parens(mut s: &str) -> &str {
    while s.starts_with('(') && s.ends_with(')') && balanced(&s[1..s.len() - 1]) {
        s = s[1..s.len() - 1].trim();
    }
    s
}

fn balanced(s: &str) -> bool {
    let mut depth = 0i32;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return false;
        }
    }
    depth == 0
}

/// Splits on `sep` outside quotes and parentheses.
fn split_top<'a>(s: &'a str, sep: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0usize);
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < s.len() {
        let c = bytes[i] as char;
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '(') => depth += 1,
            (None, ')') => depth -= 1,
            (None, _) if depth == 0 && s[i..].starts_with(sep) => {
                out.push(&s[start..i]);
                i += sep.len();
                start = i;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    out.push(&s[start..]);
    out
}

/// `<operand> <op> <literal>`, or `<capacity>.compareTo(quantity("q")) <op> 0`.
fn comparison(t: &str) -> Option<Comparison> {
    let (i, op) = OPS
        .iter()
        .filter_map(|op| split_top(t, op).first().map(|l| (l.len(), *op)))
        .filter(|(i, _)| *i < t.len())
        .min_by_key(|(i, op)| (*i, std::cmp::Reverse(op.len())))?;
    let (lhs, rhs) = (t[..i].trim(), t[i + op.len()..].trim());
    if let Some((cap, q)) = lhs.split_once(".compareTo(") {
        if rhs != "0" {
            return None;
        }
        let q = q.strip_suffix(')')?.trim();
        let q = q.strip_prefix("quantity(")?.strip_suffix(')')?;
        let q = quantity(unquote(q.trim())?)?;
        let Operand::Attribute(domain, name) = operand(cap.trim(), "device.capacity")? else {
            return None;
        };
        return Some(Comparison {
            operand: Operand::Capacity(domain, name),
            op,
            value: Literal::Quantity(q),
        });
    }
    let operand = if lhs == "device.driver" {
        Operand::Driver
    } else {
        operand(lhs, "device.attributes")?
    };
    let value = if let Some(s) = unquote(rhs) {
        Literal::Str(s.to_string())
    } else if let Ok(i) = rhs.parse() {
        Literal::Int(i)
    } else {
        match rhs {
            "true" => Literal::Bool(true),
            "false" => Literal::Bool(false),
            _ => return None,
        }
    };
    Some(Comparison { operand, op, value })
}

/// `<prefix>["domain"].name` or `<prefix>["domain"]["name"]`.
fn operand(s: &str, prefix: &str) -> Option<Operand> {
    let rest = s.strip_prefix(prefix)?.strip_prefix('[')?;
    let (domain, rest) = rest.split_once(']')?;
    let domain = unquote(domain.trim())?;
    let name = if let Some(n) = rest.strip_prefix('.') {
        n
    } else {
        unquote(rest.strip_prefix('[')?.strip_suffix(']')?.trim())?
    };
    let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then(|| Operand::Attribute(domain.to_string(), name.to_string()))
}

fn unquote(s: &str) -> Option<&str> {
    ['"', '\''].iter().find_map(|q| {
        s.strip_prefix(*q)
            .and_then(|r| r.strip_suffix(*q))
            .filter(|r| !r.contains(*q))
    })
}

/// A Kubernetes quantity as a number (`40Gi`, `80G`, `500m`, `1e3`).
pub fn quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let m = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0f64.powi(2),
        "Gi" => 1024.0f64.powi(3),
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn h100() -> Device {
        Device {
            name: "gpu-0".into(),
            attributes: Some(
                [
                    (
                        "productName",
                        DeviceAttribute {
                            string: Some("NVIDIA H100 80GB HBM3".into()),
                            ..Default::default()
                        },
                    ),
                    (
                        "type",
                        DeviceAttribute {
                            string: Some("gpu".into()),
                            ..Default::default()
                        },
                    ),
                    (
                        "resource.kubernetes.io/pcieRoot",
                        DeviceAttribute {
                            string: Some("pci0000:00".into()),
                            ..Default::default()
                        },
                    ),
                    (
                        "index",
                        DeviceAttribute {
                            int: Some(0),
                            ..Default::default()
                        },
                    ),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ),
            capacity: Some(
                [(
                    "memory".to_string(),
                    DeviceCapacity {
                        value: Quantity("81559Mi".into()),
                        ..Default::default()
                    },
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn the_selectors_claims_are_written_with() {
        let d = h100();
        let g = "gpu.nvidia.com";
        for (e, want) in [
            (
                r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3""#,
                Eval::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HMB3""#,
                Eval::NoMatch,
            ),
            (
                r#"device.attributes['gpu.nvidia.com']['type'] == 'gpu' && device.driver == "gpu.nvidia.com""#,
                Eval::Match,
            ),
            (r#"device.driver == "gpu.nvidia.com""#, Eval::Match),
            (r#"device.driver != "gpu.nvidia.com""#, Eval::NoMatch),
            (
                r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
                Eval::Match,
            ),
            (
                r#"(device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) > 0)"#,
                Eval::NoMatch,
            ),
            (
                r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
                Eval::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].index < 2"#,
                Eval::Match,
            ),
            // Missing attribute: a runtime error, no match.
            (
                r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#,
                Eval::NoMatch,
            ),
            // Outside what is read: never guessed.
            (
                r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")"#,
                Eval::Unknown,
            ),
            (
                r#"device.driver == "a" || device.driver == "gpu.nvidia.com""#,
                Eval::Unknown,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].index == x"#,
                Eval::Unknown,
            ),
        ] {
            assert_eq!(eval(e, g, &d), want, "{e}");
        }
        let s = Selector::parse(
            r#"device.attributes["gpu.nvidia.com"].productName == "x" && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1Gi")) >= 0"#,
        )
        .unwrap();
        let ops = s.operands();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            value_of(&ops[0], g, &d).as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(value_of(&ops[1], g, &d).as_deref(), Some("81559Mi"));
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("40Gi"), Some(40.0 * 1024.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("80G"), Some(80e9));
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("1e3"), Some(1000.0));
        assert_eq!(quantity("7"), Some(7.0));
        assert_eq!(quantity("x"), None);
        assert_eq!(quantity("4Xi"), None);
    }
}
