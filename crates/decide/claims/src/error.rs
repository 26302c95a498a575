use thiserror::Error;

/// Why a pod's claims cannot be judged (not: why they do not fit, which is an answer, not an error).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClaimError {
    /// A selector this evaluator does not support or cannot parse: the pod is reported, never
    /// bought for, since buying on a guess could buy the wrong GPU.
    #[error("claim {claim}: CEL expression {expression:?} is not supported: {reason}")]
    UnsupportedCel {
        claim: String,
        expression: String,
        reason: String,
    },
    /// A selector read from a cluster (a DeviceClass's or a claim's) that does not parse or stops
    /// with an error on a device: the CEL error text, with the expression quoted.
    #[error("CEL expression {expression:?} cannot be evaluated: {reason}")]
    Cel { expression: String, reason: String },
    /// A request names a DeviceClass the cluster does not have (the scheduler waits for it too).
    #[error("claim {claim}: request {request} names DeviceClass {class:?}, which does not exist")]
    UnknownClass {
        claim: String,
        request: String,
        class: String,
    },
    /// A request the allocator here does not model (adminAccess, capacity, constraints, ...).
    #[error("claim {claim}: {what} is not supported")]
    Unsupported { claim: String, what: String },
    /// A claim whose spec cannot be read (no requests, a request with neither form, a bad count).
    #[error("claim {claim}: {reason}")]
    Invalid { claim: String, reason: String },
    #[error("quantity {0:?} is not a Kubernetes quantity")]
    Quantity(String),
    #[error("version {0:?} is not a semantic version")]
    Semver(String),
}
