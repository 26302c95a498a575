//! A CDI (Container Device Interface) spec for the node's GPUs and MIG devices, what `nvidia-ctk
//! cdi generate` writes that a container needs, so the `cdi-annotations` / `cdi-cri` device list
//! strategies work without NVIDIA's container toolkit.
//!
//! Pure: [`spec`] turns an inventory snapshot, what is known about the host's device nodes
//! ([`HostDevices`]) and the driver's files found under the driver root ([`DriverFiles`], probed
//! by the agent crate) into a [`CdiSpec`]; [`validate`] checks what the CDI schema requires of it.
//!
//! Every name [`crate::allocate`] can emit (`k8s.device-plugin.nvidia.com/gpu=<id>` with a GPU UUID,
//! a GPU index `i`, a MIG UUID or a MIG index `i:j`) has a device here, and `all` names them all.

use crate::ResourcesError;
use crate::allocate::{CDI_KIND, HostDevices, VISIBLE_DEVICES_ENV, mig_cap_minors};
use gpuops_inventory::Inventory;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// The CDI spec version written: the oldest that has everything the spec uses (device node
/// `hostPath` came in 0.5.0, the relaxed device names in 0.6.0); containerd 2.x and CRI-O accept
/// 0.3.0 to 1.0.0.
pub const CDI_VERSION: &str = "0.6.0";
/// CDI spec versions [`validate`] accepts.
pub const KNOWN_CDI_VERSIONS: &[&str] = &[
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0",
];
/// Where `gpuops cdi generate --output` users usually put the device plugin's spec.
pub const DEFAULT_SPEC_PATH: &str = "/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json";
/// The directory the agent writes its spec to: cleared at boot, as the spec must be (device
/// minors and MIG UUIDs change); containerd 2.x and CRI-O read it by default.
pub const DEFAULT_SPEC_DIR: &str = "/var/run/cdi";
/// The name of the device that stands for every GPU and MIG device, as in nvidia-ctk's specs.
pub const ALL_DEVICES: &str = "all";
/// Mount options of the driver's libraries and binaries (nvidia-ctk mounts them the same way):
/// read-only, and nothing in them can become a device or a setuid program in the container.
pub const READ_ONLY_MOUNT: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];
/// Mount options of the IPC sockets and directories: writable (a client talks to the daemon), not
/// executable.
pub const IPC_MOUNT: &[&str] = &["nosuid", "nodev", "noexec", "rbind", "rprivate"];
/// Hook names the CDI schema allows.
const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The driver's files under the driver root, as the host probe found them. Every path is the
/// one the container gets: relative to the driver root, written absolute (`/usr/bin/nvidia-smi`);
/// the host path is [`SpecOptions::driver_root`] + that path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriverFiles {
    /// The driver's libraries, real files (`/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15`).
    pub libraries: Vec<String>,
    /// Symlinks to those libraries (`libcuda.so.1`, the soname programs load), as
    /// `(link, library)`.
    pub links: Vec<(String, String)>,
    /// The driver's programs (`/usr/bin/nvidia-smi`, ...).
    pub binaries: Vec<String>,
    /// IPC endpoints that exist: the persistenced and fabric manager sockets, the MPS pipe
    /// directory.
    pub ipc: Vec<String>,
    /// NVIDIA's `nvidia-cdi-hook`, when the container toolkit is installed under the root.
    pub nvidia_cdi_hook: Option<String>,
}

/// The ldcache hook: a `createContainer` hook that makes the container's dynamic linker cache
/// know the driver's library directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LdcacheHook {
    /// NVIDIA's `nvidia-cdi-hook update-ldcache`, at this host path.
    Nvidia(String),
    /// `gpuops cdi hook update-ldcache`, a gpuops binary at this host path.
    Gpuops(String),
}

/// How the spec is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecOptions {
    /// `vendor/class`.
    pub kind: String,
    /// Where the host's `/dev` lives (`NVIDIA_DEV_ROOT`); `/` or empty: `/dev` itself, and the
    /// spec leaves `hostPath` out.
    pub dev_root: String,
    /// Where the driver's files live on the host (`NVIDIA_DRIVER_ROOT`), prefixed to
    /// [`DriverFiles`]' paths.
    pub driver_root: String,
    /// A gpuops binary the runtime can run on the host, for the ldcache hook; `None`: NVIDIA's
    /// hook when [`DriverFiles::nvidia_cdi_hook`] was found, else no hook.
    pub gpuops_hook: Option<String>,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions {
            kind: CDI_KIND.into(),
            dev_root: "/".into(),
            driver_root: "/".into(),
            gpuops_hook: None,
        }
    }
}

/// A CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CdiSpec {
    #[serde(default)]
    pub cdi_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub devices: Vec<CdiDevice>,
    /// Edits every device of this spec needs.
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One device: `kind=name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CdiDevice {
    pub name: String,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<CdiMount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host, when it differs from `path` (a driver root other than `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct CdiMount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub mount_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// `root` + `path` for a host path; `/` or empty root: `path` itself.
fn under(root: &str, path: &str) -> String {
    format!("{}{path}", root.trim_end_matches('/'))
}

fn node(dev_root: &str, path: String) -> DeviceNode {
    let root = dev_root.trim_end_matches('/');
    DeviceNode {
        host_path: (!root.is_empty()).then(|| format!("{root}{path}")),
        path,
        permissions: None,
    }
}

fn mount(root: &str, host: &str, container: &str, options: &[&str]) -> CdiMount {
    CdiMount {
        host_path: under(root, host),
        container_path: container.to_string(),
        options: options.iter().map(|o| o.to_string()).collect(),
        mount_type: Some("bind".into()),
    }
}

/// The directory part of an absolute path (`/a/b/c` -> `/a/b`).
fn parent(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((dir, _)) => dir,
    }
}

// Why the ldcache hook is optional and not gpuops's by default: the libraries are mounted at the
// paths they have on the host, and every soname link found next to them (libcuda.so.1, what
// programs dlopen) gets its library mounted at the link's path too, so a container whose loader
// searches that directory (the multiarch directories of Debian, Ubuntu and NVIDIA's CUDA images)
// loads the driver with no hook at all, under any CDI runtime. A hook is only needed where the
// host's directory is not on the container's path (a RHEL host's /usr/lib64 in a Debian image);
// the runtime runs it on the host, so it must be a binary the host has: NVIDIA's nvidia-cdi-hook
// when the toolkit is installed, or a gpuops binary the operator installed (`--cdi-hook-path`;
// the agent's own binary lives in its image, which the runtime cannot see, and copying it out
// would run a binary built against the image's glibc on the host's).
fn ldcache_hook(driver: &DriverFiles, opts: &SpecOptions) -> Option<Hook> {
    let folders: BTreeSet<&str> = driver.libraries.iter().map(|l| parent(l)).collect();
    if folders.is_empty() {
        return None;
    }
    let (path, mut args) = match (&opts.gpuops_hook, &driver.nvidia_cdi_hook) {
        (Some(p), _) => (
            p.clone(),
            vec!["gpuops".to_string(), "cdi".into(), "hook".into()],
        ),
        (None, Some(p)) => (
            under(&opts.driver_root, p),
            vec!["nvidia-cdi-hook".to_string()],
        ),
        (None, None) => return None,
    };
    args.push("update-ldcache".into());
    for f in folders {
        args.push("--folder".into());
        args.push(f.to_string());
    }
    Some(Hook {
        hook_name: "createContainer".into(),
        path,
        args,
        env: Vec::new(),
        timeout: None,
    })
}

/// The spec for `inv`'s GPUs (named by UUID and by index `i`), MIG devices (by MIG UUID and by
/// `i:j`) and `all`, each with its device nodes. The edits every device needs go to the top
/// level: `NVIDIA_VISIBLE_DEVICES=void` (so an NVIDIA runtime hook, if one is still configured,
/// injects nothing more), the control nodes `host` says exist, the driver's libraries, their
/// soname links and binaries read-only, the IPC endpoints, and the ldcache hook (see
/// [`SpecOptions::gpuops_hook`]). A GPU with no known minor number gets no device nodes
/// ([`validate`] then rejects its devices).
pub fn spec(
    inv: &Inventory,
    host: &HostDevices,
    driver: &DriverFiles,
    opts: &SpecOptions,
) -> Result<CdiSpec, ResourcesError> {
    if inv.gpus.is_empty() {
        return Err(ResourcesError::NoDevices);
    }
    match opts.kind.split_once('/') {
        Some((vendor, class)) if valid_kind_part(vendor, true) && valid_kind_part(class, false) => {
        }
        _ => {
            return Err(ResourcesError::BadKind {
                kind: opts.kind.clone(),
                example: CDI_KIND,
            });
        }
    }
    let dev_root = opts.dev_root.as_str();
    let mut devices = Vec::new();
    let mut every: Vec<String> = Vec::new();
    let mut add = |names: [String; 2], paths: &[String]| {
        let edits = ContainerEdits {
            device_nodes: paths.iter().map(|p| node(dev_root, p.clone())).collect(),
            ..ContainerEdits::default()
        };
        for p in paths {
            if !every.contains(p) {
                every.push(p.clone());
            }
        }
        for name in names {
            devices.push(CdiDevice {
                name,
                container_edits: edits.clone(),
            });
        }
    };
    for g in &inv.gpus {
        let gpu_node = g.minor_number.map(|m| format!("/dev/nvidia{m}"));
        add([g.uuid.clone(), g.index.to_string()], gpu_node.as_slice());
        for m in &g.mig_devices {
            let mut paths: Vec<String> = gpu_node.iter().cloned().collect();
            if let Some(minor) = g.minor_number {
                let (gi, ci) = mig_cap_minors(host, minor, m.gi_id, m.ci_id);
                paths.push(format!("/dev/nvidia-caps/nvidia-cap{gi}"));
                paths.push(format!("/dev/nvidia-caps/nvidia-cap{ci}"));
            }
            add([m.uuid.clone(), format!("{}:{}", g.index, m.index)], &paths);
        }
    }
    devices.push(CdiDevice {
        name: ALL_DEVICES.into(),
        container_edits: ContainerEdits {
            device_nodes: every.into_iter().map(|p| node(dev_root, p)).collect(),
            ..ContainerEdits::default()
        },
    });
    let mut top = ContainerEdits {
        env: vec![format!("{VISIBLE_DEVICES_ENV}=void")],
        ..ContainerEdits::default()
    };
    for (present, p) in [
        (host.nvidiactl, "/dev/nvidiactl"),
        (host.nvidia_uvm, "/dev/nvidia-uvm"),
        (host.nvidia_uvm_tools, "/dev/nvidia-uvm-tools"),
        (host.nvidia_modeset, "/dev/nvidia-modeset"),
    ] {
        if present {
            top.device_nodes.push(node(dev_root, p.to_string()));
        }
    }
    let root = opts.driver_root.as_str();
    for lib in &driver.libraries {
        top.mounts.push(mount(root, lib, lib, READ_ONLY_MOUNT));
    }
    for (link, lib) in &driver.links {
        // The library itself at the link's path: a bind mount needs no symlink in the image.
        top.mounts.push(mount(root, lib, link, READ_ONLY_MOUNT));
    }
    for bin in &driver.binaries {
        top.mounts.push(mount(root, bin, bin, READ_ONLY_MOUNT));
    }
    for ipc in &driver.ipc {
        top.mounts.push(mount(root, ipc, ipc, IPC_MOUNT));
    }
    top.hooks.extend(ldcache_hook(driver, opts));
    Ok(CdiSpec {
        cdi_version: CDI_VERSION.into(),
        kind: opts.kind.clone(),
        devices,
        container_edits: top,
    })
}

/// The file name a spec of `kind` gets in a spec directory, as the CDI library names the specs it
/// writes (`vendor-class`; JSON, as [`DEFAULT_SPEC_PATH`]): one file per kind, so the agent
/// replaces its own spec (or one `gpuops cdi generate` wrote there) and never another tool's,
/// such as nvidia-ctk's `nvidia.yaml` of kind `nvidia.com/gpu`. Two files with the same kind and
/// device names would make the runtime reject those devices as conflicting.
pub fn spec_file_name(kind: &str) -> String {
    format!("{}.json", kind.replace('/', "-"))
}

/// The file `gpuops cdi hook update-ldcache` writes in the container, so that ldconfig (now and
/// whenever the container runs it again) knows the driver's library directories.
pub const LDCACHE_CONF: &str = "etc/ld.so.conf.d/00-gpuops-cdi.conf";

/// The container's root filesystem, from the OCI state a runtime gives a hook on stdin (its
/// `bundle`) and the bundle's `config.json` (`root.path`, absolute or relative to the bundle),
/// which `read_config` reads.
pub fn hook_rootfs(
    state: &str,
    read_config: impl FnOnce(&std::path::Path) -> std::io::Result<String>,
) -> Result<std::path::PathBuf, ResourcesError> {
    #[derive(Deserialize)]
    struct State {
        bundle: String,
    }
    #[derive(Deserialize)]
    struct Config {
        root: Root,
    }
    #[derive(Deserialize)]
    struct Root {
        path: String,
    }
    let state: State = serde_json::from_str(state).map_err(|e| ResourcesError::OciState {
        message: e.to_string(),
    })?;
    let bundle = std::path::Path::new(&state.bundle);
    if !bundle.is_absolute() {
        return Err(ResourcesError::BundleNotAbsolute(state.bundle));
    }
    let file = bundle.join("config.json");
    let text = read_config(&file).map_err(|e| ResourcesError::ReadBundleConfig {
        path: file.display().to_string(),
        message: e.to_string(),
    })?;
    let config: Config =
        serde_json::from_str(&text).map_err(|e| ResourcesError::BundleRootPath {
            path: file.display().to_string(),
            message: e.to_string(),
        })?;
    Ok(bundle.join(config.root.path))
}

/// The text of [`LDCACHE_CONF`]: one absolute directory a line; anything else is refused.
pub fn ldcache_conf(folders: &[String]) -> Result<String, ResourcesError> {
    let mut out =
        String::from("# The NVIDIA driver's libraries, mounted by the CDI spec gpuops wrote.\n");
    for f in folders {
        if !f.starts_with('/') || f.contains('\n') || f.split('/').any(|c| c == "..") {
            return Err(ResourcesError::NotAbsoluteFolder(f.clone()));
        }
        out.push_str(f);
        out.push('\n');
    }
    Ok(out)
}

/// `^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$`.
fn valid_device_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
}

/// CDI's vendor / class rules: starts with a letter, ends with a letter or digit, in between
/// letters, digits, `-`, `_` (and `.` for vendors).
fn valid_kind_part(s: &str, allow_dot: bool) -> bool {
    let (Some(first), Some(last)) = (s.chars().next(), s.chars().last()) else {
        return false;
    };
    first.is_ascii_alphabetic()
        && last.is_ascii_alphanumeric()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || (allow_dot && c == '.'))
}

fn validate_edits(what: &str, e: &ContainerEdits, problems: &mut Vec<String>) {
    for env in &e.env {
        match env.split_once('=') {
            Some((k, _)) if !k.is_empty() => {}
            _ => problems.push(format!("{what}: env entry {env:?} is not KEY=VALUE")),
        }
    }
    for n in &e.device_nodes {
        if !n.path.starts_with('/') {
            problems.push(format!(
                "{what}: device node path {:?} is not absolute",
                n.path
            ));
        }
        if let Some(h) = &n.host_path
            && !h.starts_with('/')
        {
            problems.push(format!(
                "{what}: device node hostPath {h:?} is not absolute"
            ));
        }
        if let Some(p) = &n.permissions
            && (p.is_empty() || !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
        {
            problems.push(format!(
                "{what}: device node {:?} has permissions {p:?} (want some of r, w, m)",
                n.path
            ));
        }
    }
    for m in &e.mounts {
        if m.host_path.is_empty() || m.container_path.is_empty() {
            problems.push(format!(
                "{what}: mount needs both hostPath and containerPath ({:?} -> {:?})",
                m.host_path, m.container_path
            ));
        }
    }
    for h in &e.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            problems.push(format!("{what}: unknown hook name {:?}", h.hook_name));
        }
        if h.path.is_empty() {
            problems.push(format!("{what}: hook {:?} has no path", h.hook_name));
        }
    }
}

/// Checks what the CDI schema requires: a known `cdiVersion`, a `vendor/class` kind, at least one
/// device, valid and unique device names, non-empty device edits, absolute device node paths and
/// `KEY=VALUE` env entries. All problems found, in order.
pub fn validate(spec: &CdiSpec) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    if spec.cdi_version.is_empty() {
        problems.push("cdiVersion is missing".to_string());
    } else if !KNOWN_CDI_VERSIONS.contains(&spec.cdi_version.as_str()) {
        problems.push(format!(
            "cdiVersion {:?} is not one of {}",
            spec.cdi_version,
            KNOWN_CDI_VERSIONS.join(", ")
        ));
    }
    match spec.kind.split_once('/') {
        Some((vendor, class)) if valid_kind_part(vendor, true) && valid_kind_part(class, false) => {
        }
        _ => problems.push(format!(
            "kind {:?} is not vendor/class (e.g. {CDI_KIND})",
            spec.kind
        )),
    }
    if spec.devices.is_empty() {
        problems.push("no devices".to_string());
    }
    let mut seen = BTreeSet::new();
    for d in &spec.devices {
        if !valid_device_name(&d.name) {
            problems.push(format!(
                "device name {:?} does not match ^[a-zA-Z0-9][a-zA-Z0-9_.:-]*$",
                d.name
            ));
        }
        if !seen.insert(d.name.as_str()) {
            problems.push(format!("device name {:?} is used more than once", d.name));
        }
        if d.container_edits.is_empty() {
            problems.push(format!("device {:?} has empty containerEdits", d.name));
        }
        validate_edits(
            &format!("device {:?}", d.name),
            &d.container_edits,
            &mut problems,
        );
    }
    validate_edits("spec containerEdits", &spec.container_edits, &mut problems);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocate::allocate;
    use crate::config::Overrides;
    use crate::model::resources;
    use crate::testutil::*;
    use crate::{Config, parse_mig_minors};

    fn mig_inv() -> Inventory {
        inv(vec![
            gpu(0),
            mig_gpu(1, &["1g.10gb", "1g.10gb", "3g.40gb"]),
            mig_gpu(2, &["7g.80gb"]),
        ])
    }

    fn build(inv: &Inventory, host: &HostDevices, dev_root: &str) -> CdiSpec {
        let opts = SpecOptions {
            dev_root: dev_root.into(),
            ..SpecOptions::default()
        };
        spec(inv, host, &DriverFiles::default(), &opts).unwrap()
    }

    fn names(s: &CdiSpec) -> Vec<&str> {
        s.devices.iter().map(|d| d.name.as_str()).collect()
    }

    fn paths(s: &CdiSpec, name: &str) -> Vec<String> {
        s.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap()
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.clone())
            .collect()
    }

    #[test]
    fn generated_spec_is_valid_and_names_every_device() {
        let s = build(&mig_inv(), &HostDevices::default(), "/");
        assert_eq!(validate(&s), Ok(()));
        assert_eq!(s.cdi_version, "0.6.0");
        assert_eq!(s.kind, "k8s.device-plugin.nvidia.com/gpu");
        assert_eq!(s.devices.len(), 2 * (3 + 4) + 1);
        let n = names(&s);
        for want in [
            uuid(0),
            "0".into(),
            uuid(1),
            "1".into(),
            mig_uuid(1, 0),
            "1:0".into(),
            mig_uuid(1, 2),
            "1:2".into(),
            mig_uuid(2, 0),
            "2:0".into(),
        ] {
            assert!(n.contains(&want.as_str()), "{want} not in {n:?}");
        }
        assert_eq!(paths(&s, &uuid(0)), vec!["/dev/nvidia0"]);
        assert_eq!(paths(&s, "0"), vec!["/dev/nvidia0"]);
        // gi 2 ci 0 on minor 1: 3 + 135 + 18 = 156, 157.
        assert_eq!(
            paths(&s, "1:1"),
            vec![
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap156",
                "/dev/nvidia-caps/nvidia-cap157"
            ]
        );
        assert_eq!(paths(&s, &mig_uuid(1, 1)), paths(&s, "1:1"));
        assert_eq!(s.container_edits.env, vec!["NVIDIA_VISIBLE_DEVICES=void"]);
        let top: Vec<&str> = s
            .container_edits
            .device_nodes
            .iter()
            .map(|n| n.path.as_str())
            .collect();
        assert_eq!(
            top,
            vec![
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia-modeset"
            ]
        );
        assert!(
            s.devices
                .iter()
                .flat_map(|d| &d.container_edits.device_nodes)
                .all(|n| n.host_path.is_none())
        );
    }

    #[test]
    fn host_devices_and_dev_root_shape_the_nodes() {
        let host = HostDevices {
            nvidia_uvm_tools: false,
            nvidia_modeset: false,
            mig_minors: Some(parse_mig_minors(
                "config 1\nmonitor 2\ngpu1/gi1/access 500\ngpu1/gi1/ci0/access 501\n",
            )),
            ..HostDevices::default()
        };
        let s = build(&mig_inv(), &host, "/run/nvidia/driver/");
        assert_eq!(validate(&s), Ok(()));
        let top: Vec<(&str, Option<&str>)> = s
            .container_edits
            .device_nodes
            .iter()
            .map(|n| (n.path.as_str(), n.host_path.as_deref()))
            .collect();
        assert_eq!(
            top,
            vec![
                ("/dev/nvidiactl", Some("/run/nvidia/driver/dev/nvidiactl")),
                ("/dev/nvidia-uvm", Some("/run/nvidia/driver/dev/nvidia-uvm")),
            ]
        );
        assert_eq!(
            paths(&s, "1:0"),
            vec![
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap500",
                "/dev/nvidia-caps/nvidia-cap501"
            ]
        );
        let d = s.devices.iter().find(|d| d.name == "1:0").unwrap();
        assert_eq!(
            d.container_edits.device_nodes[1].host_path.as_deref(),
            Some("/run/nvidia/driver/dev/nvidia-caps/nvidia-cap500")
        );
        // No control nodes at all: still valid (the env edit remains).
        let none = HostDevices {
            nvidiactl: false,
            nvidia_uvm: false,
            nvidia_uvm_tools: false,
            nvidia_modeset: false,
            mig_minors: None,
        };
        let s = build(&mig_inv(), &none, "");
        assert!(s.container_edits.device_nodes.is_empty());
        assert_eq!(validate(&s), Ok(()));
    }

    #[test]
    fn every_cdi_name_allocate_emits_is_in_the_spec() {
        let inventory = mig_inv();
        let s = build(&inventory, &HostDevices::default(), "/");
        let prefix = format!("{}=", s.kind);
        for strategy in ["uuid", "index"] {
            let yaml = format!(
                "version: v1\nflags:\n  migStrategy: mixed\n  plugin:\n    deviceIDStrategy: {strategy}\n    deviceListStrategy: [cdi-cri, cdi-annotations]\n"
            );
            let file = Config::parse(&yaml, "t.yaml").unwrap();
            let cfg = Config::effective(Some(file), &Overrides::default(), &Overrides::default())
                .unwrap();
            let rs = resources(&inventory, &cfg).unwrap();
            let mut emitted = 0;
            for r in &rs {
                for d in &r.devices {
                    let a = allocate(
                        r,
                        std::slice::from_ref(&d.id),
                        &cfg,
                        &HostDevices::default(),
                    )
                    .unwrap();
                    assert!(!a.cdi_devices.is_empty());
                    let from_annotations: Vec<&str> =
                        a.annotations.values().flat_map(|v| v.split(',')).collect();
                    for full in a
                        .cdi_devices
                        .iter()
                        .map(String::as_str)
                        .chain(from_annotations)
                    {
                        let name = full.strip_prefix(&prefix).unwrap_or_else(|| {
                            panic!("{full} is not of kind {}", s.kind);
                        });
                        assert!(
                            s.devices.iter().any(|x| x.name == name),
                            "{full} ({strategy}) has no device in the spec"
                        );
                        emitted += 1;
                    }
                }
            }
            // 1 full GPU + 4 MIG devices, each via cri and annotations.
            assert_eq!(emitted, 2 * 5, "{strategy}");
        }
    }

    fn good() -> CdiSpec {
        build(&inv(vec![gpu(0)]), &HostDevices::default(), "/")
    }

    fn problems(s: &CdiSpec) -> Vec<String> {
        validate(s).unwrap_err()
    }

    #[test]
    fn validate_rejects_broken_specs() {
        assert_eq!(validate(&good()), Ok(()));

        let mut s = good();
        s.cdi_version.clear();
        assert_eq!(problems(&s), vec!["cdiVersion is missing"]);
        s.cdi_version = "9.9.9".into();
        assert!(problems(&s)[0].contains("not one of"));

        for kind in [
            "",
            "gpu",
            "nvidia.com/",
            "/gpu",
            "nvidia.com/gpu/x",
            "-nvidia.com/gpu",
            "nvidia.com/g.pu",
            "nvidia com/gpu",
        ] {
            let mut s = good();
            s.kind = kind.into();
            let p = problems(&s);
            assert!(
                p.len() == 1 && p[0].contains("is not vendor/class"),
                "{kind}: {p:?}"
            );
        }
        for kind in ["nvidia.com/gpu", "vendor/class", "a-b_c.d/e_f-1"] {
            let mut s = good();
            s.kind = kind.into();
            assert_eq!(validate(&s), Ok(()), "{kind}");
        }

        let mut s = good();
        s.devices.clear();
        assert_eq!(problems(&s), vec!["no devices"]);

        for bad in ["", "-0", ":x", "a b", "a/b", "a=b"] {
            let mut s = good();
            s.devices[1].name = bad.into();
            let p = problems(&s);
            assert!(
                p.len() == 1 && p[0].contains("does not match"),
                "{bad}: {p:?}"
            );
        }
        let mut s = good();
        s.devices[1].name = "a_b.c:d-e".into();
        assert_eq!(validate(&s), Ok(()));

        let mut s = good();
        s.devices[1].name = s.devices[0].name.clone();
        assert!(problems(&s)[0].contains("more than once"));

        let mut s = good();
        s.devices[0].container_edits = ContainerEdits::default();
        assert!(problems(&s)[0].contains("empty containerEdits"));

        let mut s = good();
        s.devices[0].container_edits.device_nodes[0].path = "dev/nvidia0".into();
        s.container_edits.device_nodes[0].host_path = Some("relative".into());
        s.container_edits.device_nodes[1].permissions = Some("rx".into());
        let p = problems(&s);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].contains("\"dev/nvidia0\" is not absolute"));
        assert!(p[1].contains("hostPath \"relative\" is not absolute"));
        assert!(p[2].contains("permissions \"rx\""));

        for env in ["NOEQUALS", "=value"] {
            let mut s = good();
            s.container_edits.env.push(env.into());
            assert!(problems(&s)[0].contains("not KEY=VALUE"), "{env}");
        }
        let mut s = good();
        s.container_edits.env.push("EMPTY=".into());
        assert_eq!(validate(&s), Ok(()));

        let mut s = good();
        s.container_edits.mounts.push(CdiMount::default());
        s.container_edits.hooks.push(Hook {
            hook_name: "onStart".into(),
            ..Hook::default()
        });
        assert_eq!(problems(&s).len(), 3);

        // A GPU without a minor number yields devices validate rejects (its UUID, its index
        // and `all`, which has nothing either).
        let mut g = gpu(0);
        g.minor_number = None;
        let s = build(&inv(vec![g]), &HostDevices::default(), "/");
        let p = problems(&s);
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[2].contains("\"all\" has empty containerEdits"), "{p:?}");

        // Several problems at once are all reported.
        let mut s = good();
        s.cdi_version.clear();
        s.kind = "x".into();
        s.devices[0].name = "".into();
        assert_eq!(problems(&s).len(), 3);
    }

    fn driver() -> DriverFiles {
        let lib = "/usr/lib/x86_64-linux-gnu";
        DriverFiles {
            libraries: vec![
                format!("{lib}/libcuda.so.550.54.15"),
                format!("{lib}/libnvidia-ml.so.550.54.15"),
                "/usr/lib64/libnvidia-ptxjitcompiler.so.550.54.15".into(),
            ],
            links: vec![(
                format!("{lib}/libcuda.so.1"),
                format!("{lib}/libcuda.so.550.54.15"),
            )],
            binaries: vec!["/usr/bin/nvidia-smi".into()],
            ipc: vec!["/run/nvidia-persistenced/socket".into()],
            nvidia_cdi_hook: None,
        }
    }

    #[test]
    fn driver_files_become_read_only_mounts_under_the_driver_root() {
        let opts = SpecOptions {
            driver_root: "/run/nvidia/driver".into(),
            ..SpecOptions::default()
        };
        let s = spec(&mig_inv(), &HostDevices::default(), &driver(), &opts).unwrap();
        assert_eq!(validate(&s), Ok(()));
        let mounts: Vec<(&str, &str, &[String])> = s
            .container_edits
            .mounts
            .iter()
            .map(|m| {
                (
                    m.host_path.as_str(),
                    m.container_path.as_str(),
                    m.options.as_slice(),
                )
            })
            .collect();
        let ro: Vec<String> = READ_ONLY_MOUNT.iter().map(|o| o.to_string()).collect();
        let ipc: Vec<String> = IPC_MOUNT.iter().map(|o| o.to_string()).collect();
        let d = "/run/nvidia/driver";
        let lib = "/usr/lib/x86_64-linux-gnu";
        assert_eq!(
            mounts,
            vec![
                (
                    format!("{d}{lib}/libcuda.so.550.54.15").as_str(),
                    format!("{lib}/libcuda.so.550.54.15").as_str(),
                    ro.as_slice()
                ),
                (
                    format!("{d}{lib}/libnvidia-ml.so.550.54.15").as_str(),
                    format!("{lib}/libnvidia-ml.so.550.54.15").as_str(),
                    ro.as_slice()
                ),
                (
                    "/run/nvidia/driver/usr/lib64/libnvidia-ptxjitcompiler.so.550.54.15",
                    "/usr/lib64/libnvidia-ptxjitcompiler.so.550.54.15",
                    ro.as_slice()
                ),
                // The soname link: the library mounted at the link's path.
                (
                    format!("{d}{lib}/libcuda.so.550.54.15").as_str(),
                    format!("{lib}/libcuda.so.1").as_str(),
                    ro.as_slice()
                ),
                (
                    "/run/nvidia/driver/usr/bin/nvidia-smi",
                    "/usr/bin/nvidia-smi",
                    ro.as_slice()
                ),
                (
                    "/run/nvidia/driver/run/nvidia-persistenced/socket",
                    "/run/nvidia-persistenced/socket",
                    ipc.as_slice()
                ),
            ]
        );
        assert!(
            s.container_edits
                .mounts
                .iter()
                .all(|m| m.mount_type.as_deref() == Some("bind"))
        );
        // No hook binary known: no hook (the soname mounts make the libraries loadable).
        assert!(s.container_edits.hooks.is_empty());
        // Driver root `/`: host paths are the container paths.
        let s = spec(
            &mig_inv(),
            &HostDevices::default(),
            &driver(),
            &SpecOptions::default(),
        )
        .unwrap();
        assert_eq!(s.container_edits.mounts[4].host_path, "/usr/bin/nvidia-smi");
    }

    #[test]
    fn the_ldcache_hook_is_gpuops_when_configured_else_nvidias_when_installed() {
        let mut files = driver();
        files.nvidia_cdi_hook = Some("/usr/bin/nvidia-cdi-hook".into());
        let opts = SpecOptions {
            driver_root: "/host".into(),
            ..SpecOptions::default()
        };
        let s = spec(&mig_inv(), &HostDevices::default(), &files, &opts).unwrap();
        assert_eq!(validate(&s), Ok(()));
        let hooks = &s.container_edits.hooks;
        assert_eq!(hooks.len(), 1);
        assert_eq!(hooks[0].hook_name, "createContainer");
        assert_eq!(hooks[0].path, "/host/usr/bin/nvidia-cdi-hook");
        assert_eq!(
            hooks[0].args,
            vec![
                "nvidia-cdi-hook",
                "update-ldcache",
                "--folder",
                "/usr/lib/x86_64-linux-gnu",
                "--folder",
                "/usr/lib64"
            ]
        );
        let opts = SpecOptions {
            gpuops_hook: Some("/opt/gpuops/bin/gpuops".into()),
            ..opts
        };
        let s = spec(&mig_inv(), &HostDevices::default(), &files, &opts).unwrap();
        let hooks = &s.container_edits.hooks;
        assert_eq!(hooks[0].path, "/opt/gpuops/bin/gpuops");
        assert_eq!(
            hooks[0].args[..5],
            ["gpuops", "cdi", "hook", "update-ldcache", "--folder"]
        );
        // No libraries: nothing for ldconfig to learn, no hook.
        let s = spec(
            &mig_inv(),
            &HostDevices::default(),
            &DriverFiles::default(),
            &opts,
        )
        .unwrap();
        assert!(s.container_edits.hooks.is_empty());
    }

    #[test]
    fn all_names_every_device_node_once() {
        let s = build(&mig_inv(), &HostDevices::default(), "/");
        let all = paths(&s, "all");
        let mut want: Vec<String> = s
            .devices
            .iter()
            .filter(|d| d.name != "all")
            .flat_map(|d| {
                d.container_edits
                    .device_nodes
                    .iter()
                    .map(|n| n.path.clone())
            })
            .collect();
        want.sort();
        want.dedup();
        let mut got = all.clone();
        got.sort();
        assert_eq!(got, want);
        assert_eq!(all.len(), got.len(), "no duplicates: {all:?}");
        // 3 GPUs and 4 MIG devices with 2 capability nodes each.
        assert_eq!(all.len(), 3 + 4 * 2);
    }

    #[test]
    fn no_gpus_or_a_bad_kind_is_an_error_that_says_so() {
        let e = spec(
            &inv(vec![]),
            &HostDevices::default(),
            &DriverFiles::default(),
            &SpecOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e, ResourcesError::NoDevices);
        assert!(e.to_string().contains("no GPUs in the inventory"), "{e}");
        for kind in ["nvidia.com", "", "nvidia.com/gpu/x"] {
            let opts = SpecOptions {
                kind: kind.into(),
                ..SpecOptions::default()
            };
            let e = spec(&mig_inv(), &HostDevices::default(), &driver(), &opts).unwrap_err();
            assert_eq!(
                e,
                ResourcesError::BadKind {
                    kind: kind.into(),
                    example: CDI_KIND
                }
            );
            assert!(e.to_string().contains("is not vendor/class"), "{e}");
        }
        let opts = SpecOptions {
            kind: "nvidia.com/gpu".into(),
            ..SpecOptions::default()
        };
        let s = spec(&mig_inv(), &HostDevices::default(), &driver(), &opts).unwrap();
        assert_eq!(s.kind, "nvidia.com/gpu");
        assert_eq!(
            spec_file_name(CDI_KIND),
            "k8s.device-plugin.nvidia.com-gpu.json"
        );
        assert_eq!(
            format!("{DEFAULT_SPEC_DIR}/{}", spec_file_name(CDI_KIND)),
            DEFAULT_SPEC_PATH
        );
    }

    #[test]
    fn the_hook_finds_the_containers_root_and_refuses_bad_input() {
        let state = r#"{"ociVersion":"1.0.2","id":"c1","status":"creating","bundle":"/run/b/c1"}"#;
        let root = hook_rootfs(state, |p| {
            assert_eq!(p, std::path::Path::new("/run/b/c1/config.json"));
            Ok(r#"{"root":{"path":"rootfs"}}"#.into())
        })
        .unwrap();
        assert_eq!(root, std::path::PathBuf::from("/run/b/c1/rootfs"));
        let root = hook_rootfs(state, |_| Ok(r#"{"root":{"path":"/var/lib/r"}}"#.into())).unwrap();
        assert_eq!(root, std::path::PathBuf::from("/var/lib/r"));
        let e = hook_rootfs("not json", |_| unreachable!())
            .unwrap_err()
            .to_string();
        assert!(e.contains("OCI state on stdin is not valid"), "{e}");
        let e = hook_rootfs(r#"{"bundle":"rel"}"#, |_| unreachable!())
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"rel\" is not absolute"), "{e}");
        let e = hook_rootfs(state, |_| Err(std::io::Error::other("gone")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("reading /run/b/c1/config.json: gone"), "{e}");
        let e = hook_rootfs(state, |_| Ok("{}".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/run/b/c1/config.json: no root.path"), "{e}");

        let conf =
            ldcache_conf(&["/usr/lib64".into(), "/usr/lib/x86_64-linux-gnu".into()]).unwrap();
        assert!(
            conf.ends_with("\n/usr/lib64\n/usr/lib/x86_64-linux-gnu\n"),
            "{conf}"
        );
        for bad in ["lib", "/a/../etc", "/a\n/b"] {
            let e = ldcache_conf(&[bad.into()]).unwrap_err().to_string();
            assert!(e.contains("is not an absolute directory"), "{bad}: {e}");
        }
    }

    #[test]
    fn json_shape_round_trips() {
        let s = build(&mig_inv(), &HostDevices::default(), "/");
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["cdiVersion"], "0.6.0");
        assert_eq!(v["containerEdits"]["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
        assert_eq!(
            v["devices"][0]["containerEdits"]["deviceNodes"][0]["path"],
            "/dev/nvidia0"
        );
        assert!(v["devices"][0]["containerEdits"].get("mounts").is_none());
        let back: CdiSpec = serde_json::from_value(v).unwrap();
        assert_eq!(back, s);
        let y = serde_saphyr::to_string(&s).unwrap();
        assert!(
            y.contains("cdiVersion: 0.6.0") || y.contains("cdiVersion: \"0.6.0\""),
            "{y}"
        );
    }
}
