//! The crate's one error type: a config, a request or a node's GPUs that cannot be turned into
//! what the kubelet is told. Each message names the problem and where it is.

use std::collections::BTreeMap;

/// Why a config, a node's GPUs, an allocation request or a CDI spec was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourcesError {
    /// A problem with a config file, an env var or a flag: where (file:line:column when known)
    /// and what.
    #[error("{}: {problem}", place(.origin, *.line, *.column))]
    Config {
        /// File name, `env`, `flags` or `config`.
        origin: String,
        line: Option<u64>,
        column: Option<u64>,
        problem: String,
    },
    // Why a node's GPUs cannot be turned into resources under a config.
    #[error(
        "MIG strategy single needs every GPU in the same MIG mode: MIG is enabled on GPU {} and disabled on GPU {}; use migStrategy mixed or change the MIG mode",
        list(.enabled), list(.disabled)
    )]
    MixedMigModes {
        enabled: Vec<u32>,
        disabled: Vec<u32>,
    },
    #[error(
        "MIG strategy single needs one MIG profile on the node, found {}; use migStrategy mixed or repartition",
        .profiles.iter().map(|(p, g)| format!("{p} (GPU {})", list(g))).collect::<Vec<_>>().join(", ")
    )]
    MultipleMigProfiles {
        profiles: BTreeMap<String, Vec<u32>>,
    },
    #[error(
        "MIG strategy single: MIG is enabled on GPU {} but it has no MIG devices; create instances or disable MIG",
        list(.gpus)
    )]
    NoMigDevices { gpus: Vec<u32> },
    #[error("device {device} (GPU {gpu}) is selected by two sharing entries: {first} and {second}")]
    DeviceSharedTwice {
        device: String,
        gpu: u32,
        first: String,
        second: String,
    },
    #[error(
        "resource {name} would mix devices with different sharing ({a} and {b}); give the shared devices their own name with rename or renameByDefault"
    )]
    ConflictingSharing { name: String, a: String, b: String },
    #[error("invalid resource name: {0}")]
    InvalidName(#[source] Box<ResourcesError>),
    // A resource name NVIDIA would not accept.
    #[error("resource name {name:?} must be in the {domain}/ domain")]
    NameDomain { name: String, domain: &'static str },
    #[error("resource name {name:?} is longer than {max} characters")]
    NameTooLong { name: String, max: usize },
    #[error("resource name is empty")]
    NameEmpty,
    #[error(
        "resource name {name:?} contains {bad:?}; only letters, digits, '-', '_' and '.' are allowed"
    )]
    NameCharacter { name: String, bad: char },
    #[error("resource name {name:?} must start and end with a letter or digit")]
    NameEnds { name: String },
    // A value of an env var, a flag or a config field that cannot be used.
    #[error(
        "unknown device list strategy {0:?}; expected envvar, volume-mounts, cdi-annotations or cdi-cri"
    )]
    UnknownDeviceListStrategy(String),
    #[error("empty device list strategy")]
    EmptyDeviceListStrategy,
    #[error("device {0:?} is not a GPU index, an i:j MIG index or a GPU-/MIG- UUID")]
    BadDeviceRef(String),
    #[error("{0:?} is not a boolean")]
    NotBoolean(String),
    #[error("{given:?}: expected one of {expected}")]
    NotOneOf {
        given: String,
        expected: &'static str,
    },
    #[error("{0:?} is not a whole number")]
    NotWholeNumber(String),
    #[error("must be at least 1 (1 = no sharing)")]
    SplitCountZero,
    #[error(
        "{given} is more than {max}, the most time-slicing replicas per GPU; accepted: 1 (no sharing) to {max}"
    )]
    SplitCountTooLarge { given: String, max: i64 },
    #[error("{var}: {given:?} is not an XID number (or all/xids)")]
    NotAnXid { var: &'static str, given: String },
    /// A device plugin flag with a value it cannot take.
    #[error("--{flag} {value:?}: {source}")]
    Flag {
        flag: String,
        value: String,
        #[source]
        source: Box<ResourcesError>,
    },
    #[error("device ID {id} (GPU {gpu}) is longer than {max} characters")]
    IdTooLong { id: String, gpu: u32, max: usize },
    // Allocate requests the kubelet sent.
    #[error("unknown device ID {id} for resource {resource}")]
    AllocateUnknownDevice { resource: String, id: String },
    #[error(
        "request for '{resource}: {count}' too large: maximum request size for shared resources is 1"
    )]
    SharedRequestTooLarge { resource: String, count: usize },
    #[error("GPU {gpu} has no known /dev/nvidiaN minor number; cannot pass device specs")]
    NoMinorNumber { gpu: u32 },
    #[error("empty request for resource {resource}")]
    EmptyRequest { resource: String },
    // GetPreferredAllocation requests.
    #[error("resource {resource}: asked for {size} devices but only {available} are available")]
    TooFew {
        resource: String,
        size: usize,
        available: usize,
    },
    #[error("resource {resource}: {required} required devices exceed the request size {size}")]
    TooManyRequired {
        resource: String,
        required: usize,
        size: usize,
    },
    #[error("resource {resource}: unknown device ID {id}")]
    PreferredUnknownDevice { resource: String, id: String },
    #[error("resource {resource}: required device {id} is not among the available ones")]
    RequiredNotAvailable { resource: String, id: String },
    // Why a CDI spec cannot be built.
    #[error(
        "no GPUs in the inventory: a CDI spec needs at least one device (is the driver loaded? with --simulate, is the fleet empty?)"
    )]
    NoDevices,
    #[error("CDI kind {kind:?} is not vendor/class (e.g. {example} or nvidia.com/gpu)")]
    BadKind { kind: String, example: &'static str },
    // What the CDI ldcache hook was given (`message` is serde_json's or the OS's).
    #[error("the OCI state on stdin is not valid (want a JSON object with \"bundle\"): {message}")]
    OciState { message: String },
    #[error("the OCI state's bundle {0:?} is not absolute")]
    BundleNotAbsolute(String),
    #[error("reading {path}: {message}")]
    ReadBundleConfig { path: String, message: String },
    #[error("{path}: no root.path: {message}")]
    BundleRootPath { path: String, message: String },
    #[error("--folder {0:?} is not an absolute directory")]
    NotAbsoluteFolder(String),
}

/// `file:line:column`, as far as known.
fn place(origin: &str, line: Option<u64>, column: Option<u64>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!("{origin}:{l}:{c}"),
        (Some(l), None) => format!("{origin}:{l}"),
        _ => origin.to_string(),
    }
}

fn list(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}
