//! Selectors evaluated on the devices a cluster's ResourceSlices publish, any driver's, with the
//! same interpreter and Kubernetes functions as the autoscaler's: the doctor explains a pending
//! claim with it. What a selector reads (`device.driver`, an attribute, a capacity) is found in
//! its syntax tree, so a selector that matches nothing can be shown next to the values that
//! exist.

use crate::ClaimError;
use crate::cel::{DeviceVar, Functions, Verdict, run};
use crate::values::{Quantity, Semver};
use cel::common::ast::operators::INDEX;
use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use cel::{Program, Value};
use k8s_openapi::api::resource::v1::Device;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a selector reads from a device.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operand {
    Driver,
    /// Domain and name: `device.attributes["<domain>"].<name>`.
    Attribute(String, String),
    /// Domain and name: `device.capacity["<domain>"].<name>`.
    Capacity(String, String),
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

/// A published device as the `device` variable, built once and shared by every selector.
pub struct PublishedDevice(Value);

impl PublishedDevice {
    /// `device` of `driver`'s slice. A version or capacity the API would have refused (not a
    /// semantic version, not a quantity) is left out, so a selector reading it does not match.
    pub fn new(driver: &str, device: &Device) -> PublishedDevice {
        let mut v = DeviceVar::default();
        for (k, a) in device.attributes.iter().flatten() {
            let value = if let Some(s) = &a.string {
                Value::String(Arc::new(s.clone()))
            } else if let Some(i) = a.int {
                Value::Int(i)
            } else if let Some(b) = a.bool {
                Value::Bool(b)
            } else if let Some(Ok(s)) = a.version.as_deref().map(Semver::parse) {
                Value::Opaque(Arc::new(s))
            } else {
                continue;
            };
            v.attribute(driver, k, value);
        }
        for (k, c) in device.capacity.iter().flatten() {
            if let Ok(q) = Quantity::parse(&c.value.0) {
                v.capacity(driver, k, q);
            }
        }
        PublishedDevice(v.value(driver, device.allow_multiple_allocations.unwrap_or(false)))
    }
}

/// One selector compiled for published devices, with what it reads.
pub struct SliceSelector {
    expression: String,
    program: Program,
    reads: Vec<Operand>,
}

impl std::fmt::Debug for SliceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceSelector")
            .field("expression", &self.expression)
            .field("reads", &self.reads)
            .finish()
    }
}

impl SliceSelector {
    /// A syntax error is [`ClaimError::Cel`], quoting the expression.
    pub fn compile(expression: &str) -> Result<SliceSelector, ClaimError> {
        let program = Program::compile(expression).map_err(|e| ClaimError::Cel {
            expression: expression.to_string(),
            reason: e.to_string(),
        })?;
        let mut reads = Vec::new();
        operands(program.expression(), &mut reads);
        Ok(SliceSelector {
            expression: expression.to_string(),
            program,
            reads,
        })
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// `device.driver`, the attributes and the capacities it names, in order of first mention.
    pub fn reads(&self) -> &[Operand] {
        &self.reads
    }

    /// A missing attribute or domain is no match, as in [`crate::cel::Selector::matches`]; an
    /// unknown function, a type mismatch or a non-boolean result is [`ClaimError::Cel`].
    pub fn matches(
        &self,
        env: &Functions,
        device: &PublishedDevice,
    ) -> Result<Verdict, ClaimError> {
        run(&self.program, env, &device.0, |reason| ClaimError::Cel {
            expression: self.expression.clone(),
            reason,
        })
    }
}

/// One selector on one device of `driver`'s slice. Compiles each time: for many devices, compile
/// a [`SliceSelector`] once and build each [`PublishedDevice`] once.
pub fn evaluate(expression: &str, driver: &str, device: &Device) -> Result<Verdict, ClaimError> {
    SliceSelector::compile(expression)?
        .matches(&Functions::new(), &PublishedDevice::new(driver, device))
}

/// The value an operand has on a device of `driver`'s slice, as published (a capacity's quantity
/// as written), for quoting what exists; `None` when the device does not have it.
pub fn value_of(operand: &Operand, driver: &str, device: &Device) -> Option<String> {
    match operand {
        Operand::Driver => Some(driver.to_string()),
        Operand::Attribute(domain, name) => {
            let a = lookup(device.attributes.as_ref()?, driver, domain, name)?;
            a.string
                .clone()
                .or_else(|| a.version.clone())
                .or_else(|| a.int.map(|i| i.to_string()))
                .or_else(|| a.bool.map(|b| b.to_string()))
        }
        Operand::Capacity(domain, name) => Some(
            lookup(device.capacity.as_ref()?, driver, domain, name)?
                .value
                .0
                .clone(),
        ),
    }
}

/// An attribute of the driver's own domain is published unqualified (`productName`); others
/// (`resource.kubernetes.io/pcieRoot`) with their domain.
fn lookup<'a, T>(
    map: &'a BTreeMap<String, T>,
    driver: &str,
    domain: &str,
    name: &str,
) -> Option<&'a T> {
    map.get(&format!("{domain}/{name}"))
        .or_else(|| (domain == driver).then(|| map.get(name)).flatten())
}

/// `device.attributes` or `device.capacity`.
fn device_map(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Select(s)
            if matches!(&s.operand.expr, Expr::Ident(d) if d == "device")
                && matches!(s.field.as_str(), "attributes" | "capacity") =>
        {
            Some(s.field.as_str())
        }
        _ => None,
    }
}

fn string_literal(e: &IdedExpr) -> Option<&str> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner()),
        _ => None,
    }
}

/// `device.attributes["<domain>"]` (or capacity): the map and the domain.
fn domain(e: &IdedExpr) -> Option<(&str, &str)> {
    match &e.expr {
        Expr::Call(c) if c.func_name == INDEX && c.target.is_none() && c.args.len() == 2 => {
            Some((device_map(&c.args[0])?, string_literal(&c.args[1])?))
        }
        _ => None,
    }
}

fn operand(map: &str, domain: &str, name: &str) -> Operand {
    if map == "capacity" {
        Operand::Capacity(domain.to_string(), name.to_string())
    } else {
        Operand::Attribute(domain.to_string(), name.to_string())
    }
}

/// The operand `e` itself is, if any: `device.driver`, `<map>["<domain>"].<name>` (also inside
/// `has()`) or `<map>["<domain>"]["<name>"]`.
fn operand_of(e: &IdedExpr) -> Option<Operand> {
    match &e.expr {
        Expr::Select(s) => {
            if s.field == "driver" && matches!(&s.operand.expr, Expr::Ident(d) if d == "device") {
                return Some(Operand::Driver);
            }
            let (map, d) = domain(&s.operand)?;
            Some(operand(map, d, &s.field))
        }
        Expr::Call(c) if c.func_name == INDEX && c.target.is_none() && c.args.len() == 2 => {
            let (map, d) = domain(&c.args[0])?;
            Some(operand(map, d, string_literal(&c.args[1])?))
        }
        _ => None,
    }
}

fn operands(e: &IdedExpr, out: &mut Vec<Operand>) {
    if let Some(o) = operand_of(e) {
        if !out.contains(&o) {
            out.push(o);
        }
        return;
    }
    let entries = |es: &[cel::common::ast::IdedEntryExpr], out: &mut Vec<Operand>| {
        for x in es {
            match &x.expr {
                EntryExpr::MapEntry(me) => {
                    operands(&me.key, out);
                    operands(&me.value, out);
                }
                EntryExpr::StructField(f) => operands(&f.value, out),
            }
        }
    };
    match &e.expr {
        Expr::Call(c) => {
            for x in c.target.as_deref().into_iter().chain(&c.args) {
                operands(x, out);
            }
        }
        Expr::Select(s) => operands(&s.operand, out),
        Expr::List(l) => {
            for x in &l.elements {
                operands(x, out);
            }
        }
        Expr::Map(m) => entries(&m.entries, out),
        Expr::Struct(s) => entries(&s.entries, out),
        Expr::Comprehension(c) => {
            for x in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                operands(x, out);
            }
        }
        Expr::Unspecified | Expr::Ident(_) | Expr::Literal(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;

    const G: &str = "gpu.nvidia.com";

    /// An H100 as the agent's slice publishes it (the doctor's cases ran on the same device).
    fn h100() -> Device {
        let s = |v: &str| DeviceAttribute {
            string: Some(v.into()),
            ..Default::default()
        };
        Device {
            name: "gpu-0".into(),
            attributes: Some(
                [
                    ("productName", s("NVIDIA H100 80GB HBM3")),
                    ("type", s("gpu")),
                    ("resource.kubernetes.io/pcieRoot", s("pci0000:00")),
                    (
                        "index",
                        DeviceAttribute {
                            int: Some(0),
                            ..Default::default()
                        },
                    ),
                    (
                        "driverVersion",
                        DeviceAttribute {
                            version: Some("580.65.6".into()),
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
                        value: K8sQuantity("81559Mi".into()),
                        ..Default::default()
                    },
                )]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        }
    }

    /// The cases the doctor's own subset evaluator was tested with, kept as they were: the
    /// comparisons joined by `&&` it read give the same verdicts here.
    #[test]
    fn the_selectors_claims_are_written_with() {
        let d = h100();
        for (e, want) in [
            (
                r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3""#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HMB3""#,
                Verdict::NoMatch,
            ),
            (
                r#"device.attributes['gpu.nvidia.com']['type'] == 'gpu' && device.driver == "gpu.nvidia.com""#,
                Verdict::Match,
            ),
            (r#"device.driver == "gpu.nvidia.com""#, Verdict::Match),
            (r#"device.driver != "gpu.nvidia.com""#, Verdict::NoMatch),
            (
                r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#,
                Verdict::Match,
            ),
            (
                r#"(device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) > 0)"#,
                Verdict::NoMatch,
            ),
            (
                r#"device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:00""#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].index < 2"#,
                Verdict::Match,
            ),
            // Missing attribute: a runtime error, no match.
            (
                r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#,
                Verdict::NoMatch,
            ),
        ] {
            assert_eq!(evaluate(e, G, &d), Ok(want), "{e}");
        }
        let s = SliceSelector::compile(
            r#"device.attributes["gpu.nvidia.com"].productName == "x" && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1Gi")) >= 0"#,
        )
        .unwrap();
        let ops = s.reads();
        assert_eq!(ops.len(), 2);
        assert_eq!(
            value_of(&ops[0], G, &d).as_deref(),
            Some("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(value_of(&ops[1], G, &d).as_deref(), Some("81559Mi"));
    }

    /// What the doctor's subset called "cannot evaluate" (`||`, `in`, `startsWith`, `has`,
    /// versions, a quantity on the left) now gets the scheduler's verdict, both ways, so a
    /// constant answer fails.
    #[test]
    fn what_the_subset_could_not_read_gets_a_verdict() {
        let d = h100();
        for (e, want) in [
            (
                r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")"#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].productName.startsWith("AMD")"#,
                Verdict::NoMatch,
            ),
            (
                r#"device.driver == "a" || device.driver == "gpu.nvidia.com""#,
                Verdict::Match,
            ),
            (
                r#"device.driver == "a" || device.driver == "b""#,
                Verdict::NoMatch,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]"#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100-SXM4-80GB"]"#,
                Verdict::NoMatch,
            ),
            (
                r#"!has(device.attributes["gpu.nvidia.com"].profile)"#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("570.0.0"))"#,
                Verdict::Match,
            ),
            (
                r#"device.attributes["gpu.nvidia.com"].driverVersion.isLessThan(semver("570.0.0"))"#,
                Verdict::NoMatch,
            ),
            (
                r#"quantity("80Gi").compareTo(device.capacity["gpu.nvidia.com"].memory) < 0"#,
                Verdict::NoMatch,
            ),
        ] {
            assert_eq!(evaluate(e, G, &d), Ok(want), "{e}");
        }
        // Another driver's device: the unqualified name is that driver's domain, not gpu.nvidia.com.
        assert_eq!(
            evaluate(
                r#"device.attributes["gpu.nvidia.com"].type == "gpu""#,
                "other.example.com",
                &d
            ),
            Ok(Verdict::NoMatch)
        );
    }

    #[test]
    fn a_bad_expression_is_an_error_that_quotes_it() {
        let d = h100();
        for e in [
            // Malformed: does not parse.
            r#"device.attributes["gpu.nvidia.com"].productName == "#,
            // An undeclared variable.
            r#"device.attributes["gpu.nvidia.com"].index == x"#,
            // Not a boolean.
            r#"device.attributes["gpu.nvidia.com"].index"#,
            // Regular expressions are not compiled into this evaluator (no regex feature).
            r#"device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA H1")"#,
        ] {
            let err = evaluate(e, G, &d).unwrap_err();
            let ClaimError::Cel { expression, reason } = &err else {
                panic!("{err:?}")
            };
            assert_eq!(expression, e);
            assert!(!reason.is_empty(), "{err}");
            assert!(err.to_string().contains(&format!("{e:?}")), "{err}");
        }
    }

    #[test]
    fn reads_names_what_the_selector_looks_at() {
        let s = SliceSelector::compile(
            r#"device.driver == "gpu.nvidia.com" && (device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H") || device.attributes['resource.kubernetes.io']['pcieRoot'] in ["a"]) && has(device.attributes["gpu.nvidia.com"].profile) && device.capacity["gpu.nvidia.com"].memory.isGreaterThan(quantity("1Gi")) && device.driver != "x""#,
        )
        .unwrap();
        assert_eq!(
            s.reads(),
            [
                Operand::Driver,
                Operand::Attribute(G.into(), "productName".into()),
                Operand::Attribute("resource.kubernetes.io".into(), "pcieRoot".into()),
                Operand::Attribute(G.into(), "profile".into()),
                Operand::Capacity(G.into(), "memory".into()),
            ]
        );
        let d = h100();
        assert_eq!(
            value_of(&s.reads()[2], G, &d).as_deref(),
            Some("pci0000:00")
        );
        assert_eq!(value_of(&s.reads()[3], G, &d), None);
        assert_eq!(s.reads()[4].to_string(), "capacity gpu.nvidia.com/memory");
        // A quantity the API would have refused is left out: no match, not an error.
        let mut bad = h100();
        if let Some(c) = bad.capacity.as_mut().and_then(|c| c.get_mut("memory")) {
            c.value = K8sQuantity("lots".into());
        }
        assert_eq!(
            evaluate(
                r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("1Gi")) > 0"#,
                G,
                &bad
            ),
            Ok(Verdict::NoMatch)
        );
    }
}
