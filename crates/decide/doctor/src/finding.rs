//! What the doctor reports: a finding with severity, category, objects, evidence and a fix.

use serde::Serialize;
use std::fmt;

/// How urgent a finding is. Ordered most urgent first, so sorting puts critical findings on top.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something is broken and will not heal by itself (the doctor exits non-zero).
    Critical,
    /// Something is wrong or wasteful and deserves attention.
    Warning,
    /// Worth knowing; no action needed now.
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What area a finding is about (the report groups by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// Pending GPU pods and why the scheduler cannot place them.
    Scheduling,
    /// Pod specs that cannot work (requests without limits, shared replicas).
    Workload,
    /// Device plugin registration and drivers.
    Node,
    /// MIG configuration state and layout.
    Mig,
    /// XIDs, lost GPUs, unhealthy devices.
    Health,
    /// Host OOM kills and CUDA out-of-memory errors.
    Memory,
    /// Idle allocated GPUs and free GPUs nothing can use.
    Cost,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Scheduling => "scheduling",
            Category::Workload => "workload",
            Category::Node => "node",
            Category::Mig => "mig",
            Category::Health => "health",
            Category::Memory => "memory",
            Category::Cost => "cost",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Kubernetes object a finding is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ObjectRef {
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRef {
    pub fn node(name: &str) -> ObjectRef {
        ObjectRef {
            kind: "Node".into(),
            namespace: None,
            name: name.into(),
        }
    }

    pub fn pod(namespace: &str, name: &str) -> ObjectRef {
        ObjectRef::namespaced("Pod", namespace, name)
    }

    pub fn namespaced(kind: &str, namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            kind: kind.into(),
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One diagnosis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub category: Category,
    /// Stable identifier of the rule that fired (`fragmentation`, `untolerated-taint`, ...).
    pub code: &'static str,
    pub title: String,
    pub objects: Vec<ObjectRef>,
    /// What was seen: event text, label values, numbers.
    pub evidence: Vec<String>,
    /// A concrete fix: a command or a manifest change.
    pub fix: String,
    /// The shell commands the fix names, each exactly as it appears there and complete (no
    /// placeholder), so a tool can run them (`kubectl ... --dry-run=server` checks them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
}

impl Finding {
    pub(crate) fn new(
        severity: Severity,
        category: Category,
        code: &'static str,
        title: impl Into<String>,
    ) -> Finding {
        Finding {
            severity,
            category,
            code,
            title: title.into(),
            objects: Vec::new(),
            evidence: Vec::new(),
            fix: String::new(),
            commands: Vec::new(),
        }
    }

    pub(crate) fn object(mut self, o: ObjectRef) -> Finding {
        if !self.objects.contains(&o) {
            self.objects.push(o);
        }
        self
    }

    pub(crate) fn objects(mut self, os: impl IntoIterator<Item = ObjectRef>) -> Finding {
        for o in os {
            self = self.object(o);
        }
        self
    }

    pub(crate) fn evidence(mut self, e: impl Into<String>) -> Finding {
        self.evidence.push(e.into());
        self
    }

    pub(crate) fn fix(mut self, f: impl Into<String>) -> Finding {
        self.fix = f.into();
        self
    }

    /// Records the command, if any.
    pub(crate) fn commands_from(self, c: Option<String>) -> Finding {
        match c {
            Some(c) => self.command(c),
            None => self,
        }
    }

    /// Records a command the fix names (see [`Finding::commands`]).
    pub(crate) fn command(mut self, c: impl Into<String>) -> Finding {
        let c = c.into();
        if !self.commands.contains(&c) {
            self.commands.push(c);
        }
        self
    }
}
