//! Device selectors in CEL, evaluated on the devices gpuops-dra models, with the variables and
//! functions Kubernetes gives them: `device.driver`, `device.attributes[<domain>].<name>`,
//! `device.capacity[<domain>].<name>` (a quantity), version attributes as `semver`, and the
//! `quantity`/`semver` functions with `compareTo`, `isGreaterThan`, `isLessThan`.

use crate::ClaimError;
use crate::values::{Quantity, Semver};
use cel::extractors::This;
use cel::objects::{Key, Map, Opaque};
use cel::{Context, ExecutionError, Program, Value};
use gpuops_dra::model::AttrValue;
use gpuops_dra::{DRIVER_NAME, Device};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

/// One compiled selector, with the claim and expression kept to name them in errors.
pub struct Selector {
    pub claim: String,
    pub expression: String,
    /// Shared by the selectors of every claim with this expression ([`Selector::compile_shared`]).
    program: Arc<Program>,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selector")
            .field("claim", &self.claim)
            .field("expression", &self.expression)
            .finish()
    }
}

/// What a selector said about one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Match,
    NoMatch,
}

impl Selector {
    pub fn compile(claim: &str, expression: &str) -> Result<Selector, ClaimError> {
        let program = Program::compile(expression).map_err(|e| ClaimError::UnsupportedCel {
            claim: claim.to_string(),
            expression: expression.to_string(),
            reason: e.to_string(),
        })?;
        Ok(Selector {
            claim: claim.to_string(),
            expression: expression.to_string(),
            program: Arc::new(program),
        })
    }

    /// As [`Selector::compile`], with the programs already compiled for other claims by
    /// expression: thousands of pending pods carry the same few expressions, and compiling each
    /// pod's again was most of the claim demand's time. A compile error is not kept, so each
    /// claim's error names that claim.
    pub fn compile_shared(
        claim: &str,
        expression: &str,
        programs: &mut HashMap<String, Arc<Program>>,
    ) -> Result<Selector, ClaimError> {
        if let Some(p) = programs.get(expression) {
            return Ok(Selector {
                claim: claim.to_string(),
                expression: expression.to_string(),
                program: Arc::clone(p),
            });
        }
        let s = Selector::compile(claim, expression)?;
        programs.insert(expression.to_string(), Arc::clone(&s.program));
        Ok(s)
    }

    /// Whether `device` is selected. A missing attribute or domain is no match, as for the
    /// scheduler's selectors guarded by `has()` or written for another driver's devices; an
    /// unknown function, a type mismatch or a non-boolean result is an error naming the claim
    /// and the expression, since guessing could buy the wrong GPU.
    pub fn matches(&self, env: &Functions, device: &Value) -> Result<Verdict, ClaimError> {
        run(&self.program, env, device, |reason| {
            ClaimError::UnsupportedCel {
                claim: self.claim.clone(),
                expression: self.expression.clone(),
                reason,
            }
        })
    }
}

/// One evaluation, shared by the autoscaler's selectors and those read from a cluster
/// ([`crate::published`]), which name their errors differently.
pub(crate) fn run<E>(
    program: &Program,
    env: &Functions,
    device: &Value,
    error: impl Fn(String) -> E,
) -> Result<Verdict, E> {
    let mut ctx = env.ctx.new_inner_scope();
    ctx.add_variable_from_value("device", device.clone());
    match program.execute(&ctx) {
        Ok(Value::Bool(true)) => Ok(Verdict::Match),
        Ok(Value::Bool(false)) => Ok(Verdict::NoMatch),
        Ok(other) => Err(error(format!("it gives {other:?}, not a boolean"))),
        Err(ExecutionError::NoSuchKey(_)) => Ok(Verdict::NoMatch),
        Err(e) => Err(error(e.to_string())),
    }
}

/// The functions selectors may call, registered once and shared by every evaluation.
pub struct Functions {
    ctx: Context<'static, 'static>,
}

impl Default for Functions {
    fn default() -> Self {
        Functions::new()
    }
}

fn opaque_quantity(v: &Arc<dyn Opaque>) -> Option<Quantity> {
    v.downcast_ref::<Quantity>().copied()
}

fn opaque_semver(v: &Arc<dyn Opaque>) -> Option<Semver> {
    v.downcast_ref::<Semver>().cloned()
}

fn compare(
    name: &str,
    a: &Arc<dyn Opaque>,
    b: &Arc<dyn Opaque>,
) -> Result<Ordering, ExecutionError> {
    if let (Some(a), Some(b)) = (opaque_quantity(a), opaque_quantity(b)) {
        return Ok(a.cmp(&b));
    }
    if let (Some(a), Some(b)) = (opaque_semver(a), opaque_semver(b)) {
        return Ok(a.cmp(&b));
    }
    Err(ExecutionError::function_error(
        name,
        format!(
            "compares a quantity with a quantity or a semver with a semver, not {} with {}",
            a.runtime_type_name(),
            b.runtime_type_name()
        ),
    ))
}

fn semver_part(
    name: &str,
    v: &Arc<dyn Opaque>,
    part: fn(&Semver) -> u64,
) -> Result<i64, ExecutionError> {
    let s =
        opaque_semver(v).ok_or_else(|| ExecutionError::function_error(name, "needs a semver"))?;
    i64::try_from(part(&s)).map_err(|e| ExecutionError::function_error(name, e))
}

impl Functions {
    pub fn new() -> Functions {
        let mut ctx = Context::default();
        // Names the standard library has are refused by add_function; none of these is one, and
        // a refusal would only make that function unknown (an error naming it), never a panic.
        let _ = ctx.add_function(
            "quantity",
            |s: Arc<String>| -> Result<Value, ExecutionError> {
                Quantity::parse(&s)
                    .map(|q| Value::Opaque(Arc::new(q)))
                    .map_err(|e| ExecutionError::function_error("quantity", e))
            },
        );
        let _ = ctx.add_function("isQuantity", |s: Arc<String>| Quantity::parse(&s).is_ok());
        let _ = ctx.add_function(
            "semver",
            |s: Arc<String>| -> Result<Value, ExecutionError> {
                Semver::parse(&s)
                    .map(|v| Value::Opaque(Arc::new(v)))
                    .map_err(|e| ExecutionError::function_error("semver", e))
            },
        );
        let _ = ctx.add_function("isSemver", |s: Arc<String>| Semver::parse(&s).is_ok());
        let _ = ctx.add_function(
            "compareTo",
            |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| -> Result<i64, ExecutionError> {
                Ok(match compare("compareTo", &a, &b)? {
                    Ordering::Less => -1,
                    Ordering::Equal => 0,
                    Ordering::Greater => 1,
                })
            },
        );
        let _ = ctx.add_function(
            "isGreaterThan",
            |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| -> Result<bool, ExecutionError> {
                Ok(compare("isGreaterThan", &a, &b)? == Ordering::Greater)
            },
        );
        let _ = ctx.add_function(
            "isLessThan",
            |This(a): This<Arc<dyn Opaque>>, b: Arc<dyn Opaque>| -> Result<bool, ExecutionError> {
                Ok(compare("isLessThan", &a, &b)? == Ordering::Less)
            },
        );
        let _ = ctx.add_function(
            "asInteger",
            |This(a): This<Arc<dyn Opaque>>| -> Result<i64, ExecutionError> {
                opaque_quantity(&a)
                    .and_then(Quantity::as_integer)
                    .ok_or_else(|| {
                        ExecutionError::function_error("asInteger", "needs a whole quantity")
                    })
            },
        );
        let _ = ctx.add_function("major", |This(v): This<Arc<dyn Opaque>>| {
            semver_part("major", &v, |s| s.major)
        });
        let _ = ctx.add_function("minor", |This(v): This<Arc<dyn Opaque>>| {
            semver_part("minor", &v, |s| s.minor)
        });
        let _ = ctx.add_function("patch", |This(v): This<Arc<dyn Opaque>>| {
            semver_part("patch", &v, |s| s.patch)
        });
        Functions { ctx }
    }
}

/// The `device` variable for one modelled device: attributes and capacities grouped by domain
/// (an unqualified name belongs to the driver's own domain, as in the API).
pub fn device_value(device: &Device) -> Value {
    let mut v = DeviceVar::default();
    for (k, a) in &device.attributes {
        let value = match a {
            AttrValue::String(s) => Value::String(Arc::new(s.clone())),
            AttrValue::Int(i) => Value::Int(*i),
            AttrValue::Bool(b) => Value::Bool(*b),
            AttrValue::Version(s) => match Semver::parse(s) {
                Ok(v) => Value::Opaque(Arc::new(v)),
                // gpuops-dra only publishes what names::semver normalised; anything else is
                // left out as the API would refuse it.
                Err(_) => continue,
            },
        };
        v.attribute(DRIVER_NAME, k, value);
    }
    for (k, c) in &device.capacity {
        v.capacity(DRIVER_NAME, k, Quantity::from_units(*c));
    }
    v.value(DRIVER_NAME, false)
}

/// The attributes and capacities of a `device` variable being built, by domain.
#[derive(Default)]
pub(crate) struct DeviceVar {
    attrs: HashMap<String, HashMap<Key, Value>>,
    caps: HashMap<String, HashMap<Key, Value>>,
}

impl DeviceVar {
    pub(crate) fn attribute(&mut self, driver: &str, key: &str, value: Value) {
        let (domain, name) = split_name(driver, key);
        self.attrs
            .entry(domain.to_string())
            .or_default()
            .insert(Key::String(Arc::new(name.to_string())), value);
    }

    pub(crate) fn capacity(&mut self, driver: &str, key: &str, q: Quantity) {
        let (domain, name) = split_name(driver, key);
        self.caps.entry(domain.to_string()).or_default().insert(
            Key::String(Arc::new(name.to_string())),
            Value::Opaque(Arc::new(q)),
        );
    }

    pub(crate) fn value(self, driver: &str, allow_multiple: bool) -> Value {
        let by_domain = |m: HashMap<String, HashMap<Key, Value>>| -> Value {
            let m: HashMap<Key, Value> = m
                .into_iter()
                .map(|(d, inner)| (Key::String(Arc::new(d)), Value::Map(Map::from(inner))))
                .collect();
            Value::Map(Map::from(m))
        };
        let mut top: HashMap<Key, Value> = HashMap::new();
        top.insert(
            Key::String(Arc::new("driver".into())),
            Value::String(Arc::new(driver.to_string())),
        );
        top.insert(
            Key::String(Arc::new("attributes".into())),
            by_domain(self.attrs),
        );
        top.insert(
            Key::String(Arc::new("capacity".into())),
            by_domain(self.caps),
        );
        top.insert(
            Key::String(Arc::new("allowMultipleAllocations".into())),
            Value::Bool(allow_multiple),
        );
        Value::Map(Map::from(top))
    }
}

/// `domain/name` as published, or an unqualified name of the driver's own domain.
pub(crate) fn split_name<'a>(driver: &'a str, k: &'a str) -> (&'a str, &'a str) {
    k.split_once('/').unwrap_or((driver, k))
}
