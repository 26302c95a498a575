//! A pod's claims, allocated on modelled node devices the way the scheduler's allocator would:
//! each request takes devices of its class matching its selectors, `count` of them or `All`,
//! a `firstAvailable` list takes its first alternative that fits, and dynamic-MIG devices also
//! take their GPU's shared counters. Requests are tried in order without backtracking across
//! requests (the scheduler backtracks; docs/autoscaling.md says where that differs).

use crate::ClaimError;
use crate::cel::{Functions, Selector, Verdict, device_value};
use cel::Value;
use gpuops_dra::DeviceModel;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// How many devices a request wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Exact(u32),
    /// Every matching device of the node (`allocationMode: All`); at least one.
    All,
}

/// One way to satisfy a request: an `exactly` request, or one `firstAvailable` entry.
#[derive(Debug)]
pub struct Alternative {
    /// `request` or `request/subrequest`, as the scheduler names it.
    pub name: String,
    pub class: String,
    /// The class's selectors, then the request's, all of which must match.
    pub selectors: Vec<Selector>,
    pub count: Count,
}

#[derive(Debug)]
pub struct Request {
    pub name: String,
    /// One entry for `exactly`; the `firstAvailable` list in order otherwise.
    pub alternatives: Vec<Alternative>,
}

/// A claim as demand: its name (`namespace/name`) and requests, selectors compiled.
#[derive(Debug)]
pub struct Claim {
    pub name: String,
    pub requests: Vec<Request>,
}

/// The DeviceClasses' selectors, by class name.
pub type Classes = BTreeMap<String, Vec<String>>;

/// The devices of one node (modelled or in flight), what is taken, and the counters left.
pub struct NodeDevices {
    /// Shared by the copies: the demand clones one node per pool for thousands of nodes, and
    /// nothing changes the devices themselves, only what is taken of them.
    model: Arc<DeviceModel>,
    values: Vec<Value>,
    used: BTreeSet<usize>,
    counters: BTreeMap<String, BTreeMap<String, u64>>,
    /// Verdicts of selectors on the devices, by expression and device index, shared by the
    /// copies (same devices, same values): a verdict depends on nothing else, and the demand
    /// asked the same expressions of the same devices on thousands of copies of a pool's node.
    /// Errors are not kept: each is evaluated again and named for its own claim.
    verdicts: Arc<Mutex<HashMap<String, Vec<Option<bool>>>>>,
}

impl std::fmt::Debug for NodeDevices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeDevices")
            .field("devices", &self.model.devices.len())
            .field("used", &self.used)
            .finish()
    }
}

impl Clone for NodeDevices {
    fn clone(&self) -> Self {
        NodeDevices {
            model: self.model.clone(),
            values: self.values.clone(),
            used: self.used.clone(),
            counters: self.counters.clone(),
            verdicts: Arc::clone(&self.verdicts),
        }
    }
}

/// Devices one claim's requests got, by alternative name.
pub type Allocation = Vec<(String, String)>;

impl NodeDevices {
    pub fn new(model: DeviceModel) -> NodeDevices {
        let values = model.devices.iter().map(device_value).collect();
        let counters = model
            .counter_sets
            .iter()
            .map(|s| (s.name.clone(), s.counters.clone()))
            .collect();
        NodeDevices {
            model: Arc::new(model),
            values,
            used: BTreeSet::new(),
            counters,
            verdicts: Arc::default(),
        }
    }

    pub fn model(&self) -> &DeviceModel {
        &self.model
    }

    /// Marks devices already allocated (claims on a node in flight or running); unknown names
    /// are ignored, since a node's slice may have changed since the claim was allocated.
    pub fn mark_used<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        for name in names {
            if let Some(i) = self.model.devices.iter().position(|d| d.name == name) {
                self.take(i);
            }
        }
    }

    fn take(&mut self, i: usize) {
        if !self.used.insert(i) {
            return;
        }
        if let Some(c) = &self.model.devices[i].consumes
            && let Some(left) = self.counters.get_mut(&c.counter_set)
        {
            for (k, v) in &c.counters {
                if let Some(l) = left.get_mut(k) {
                    *l = l.saturating_sub(*v);
                }
            }
        }
    }

    fn available(&self, i: usize) -> bool {
        if self.used.contains(&i) {
            return false;
        }
        match &self.model.devices[i].consumes {
            None => true,
            Some(c) => {
                let Some(left) = self.counters.get(&c.counter_set) else {
                    return false;
                };
                c.counters
                    .iter()
                    .all(|(k, v)| left.get(k).is_some_and(|l| l >= v))
            }
        }
    }

    fn selected(&self, fns: &Functions, alt: &Alternative, i: usize) -> Result<bool, ClaimError> {
        for s in &alt.selectors {
            if !self.verdict(fns, s, i)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether selector `s` matches device `i`, from [`Self::verdicts`] when known.
    fn verdict(&self, fns: &Functions, s: &Selector, i: usize) -> Result<bool, ClaimError> {
        let known = self.verdicts.lock().ok().and_then(|m| {
            m.get(&s.expression)
                .and_then(|v| v.get(i).copied().flatten())
        });
        if let Some(v) = known {
            return Ok(v);
        }
        let v = s.matches(fns, &self.values[i])? == Verdict::Match;
        if let Ok(mut m) = self.verdicts.lock() {
            let n = self.values.len();
            if let Some(slot) = m
                .entry(s.expression.clone())
                .or_insert_with(|| vec![None; n])
                .get_mut(i)
            {
                *slot = Some(v);
            }
        }
        Ok(v)
    }

    /// Allocates one alternative on this node, or says it does not fit (node unchanged then).
    fn try_alternative(
        &mut self,
        fns: &Functions,
        alt: &Alternative,
    ) -> Result<Option<Vec<String>>, ClaimError> {
        let mut matching = Vec::new();
        for i in 0..self.model.devices.len() {
            if self.selected(fns, alt, i)? {
                matching.push(i);
            }
        }
        let trial_start = self.clone_state();
        let mut got = Vec::new();
        match alt.count {
            Count::All => {
                // All means every matching device, so one taken by another claim fails it.
                if matching.is_empty() {
                    return Ok(None);
                }
                for &i in &matching {
                    if !self.available(i) {
                        self.restore(trial_start);
                        return Ok(None);
                    }
                    self.take(i);
                    got.push(self.model.devices[i].name.clone());
                }
            }
            Count::Exact(n) => {
                for &i in &matching {
                    if got.len() == n as usize {
                        break;
                    }
                    if self.available(i) {
                        self.take(i);
                        got.push(self.model.devices[i].name.clone());
                    }
                }
                if got.len() < n as usize {
                    self.restore(trial_start);
                    return Ok(None);
                }
            }
        }
        Ok(Some(got))
    }

    fn clone_state(&self) -> (BTreeSet<usize>, BTreeMap<String, BTreeMap<String, u64>>) {
        (self.used.clone(), self.counters.clone())
    }

    fn restore(&mut self, s: (BTreeSet<usize>, BTreeMap<String, BTreeMap<String, u64>>)) {
        self.used = s.0;
        self.counters = s.1;
    }

    /// Allocates every claim of one pod here, all or nothing: `Some` with the devices per claim
    /// (and this node keeps them taken), or `None` with the node unchanged.
    pub fn allocate(
        &mut self,
        fns: &Functions,
        claims: &[Claim],
    ) -> Result<Option<Vec<Allocation>>, ClaimError> {
        let start = self.clone_state();
        let mut out = Vec::new();
        for claim in claims {
            let mut alloc = Allocation::new();
            for req in &claim.requests {
                let mut done = false;
                for alt in &req.alternatives {
                    if let Some(devs) = self.try_alternative(fns, alt)? {
                        alloc.extend(devs.into_iter().map(|d| (alt.name.clone(), d)));
                        done = true;
                        break;
                    }
                }
                if !done {
                    self.restore(start);
                    return Ok(None);
                }
            }
            out.push(alloc);
        }
        Ok(Some(out))
    }
}

/// A request as written, before compiling (from the API objects or a test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlternativeSpec {
    pub name: String,
    pub class: String,
    pub selectors: Vec<String>,
    pub count: Count,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    pub name: String,
    pub alternatives: Vec<AlternativeSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSpec {
    pub name: String,
    pub requests: Vec<RequestSpec>,
}

impl ClaimSpec {
    /// Compiles every selector (the class's first), failing on an unknown class or CEL that
    /// does not parse, naming the claim and the expression.
    pub fn compile(&self, classes: &Classes) -> Result<Claim, ClaimError> {
        self.compile_shared(classes, &mut HashMap::new())
    }

    /// As [`ClaimSpec::compile`], sharing the programs compiled for other claims
    /// ([`Selector::compile_shared`]).
    pub fn compile_shared(
        &self,
        classes: &Classes,
        programs: &mut HashMap<String, Arc<cel::Program>>,
    ) -> Result<Claim, ClaimError> {
        if self.requests.is_empty() {
            return Err(ClaimError::Invalid {
                claim: self.name.clone(),
                reason: "it has no device requests".into(),
            });
        }
        let mut requests = Vec::new();
        for r in &self.requests {
            let mut alternatives = Vec::new();
            for a in &r.alternatives {
                let class_sel = classes
                    .get(&a.class)
                    .ok_or_else(|| ClaimError::UnknownClass {
                        claim: self.name.clone(),
                        request: a.name.clone(),
                        class: a.class.clone(),
                    })?;
                let selectors = class_sel
                    .iter()
                    .chain(&a.selectors)
                    .map(|e| Selector::compile_shared(&self.name, e, programs))
                    .collect::<Result<Vec<_>, _>>()?;
                alternatives.push(Alternative {
                    name: a.name.clone(),
                    class: a.class.clone(),
                    selectors,
                    count: a.count,
                });
            }
            requests.push(Request {
                name: r.name.clone(),
                alternatives,
            });
        }
        Ok(Claim {
            name: self.name.clone(),
            requests,
        })
    }
}
