//! The agent's CDI spec: the driver's files probed under the driver root, and a task that writes
//! the spec at start and again whenever the node's devices change (a MIG change included).
//!
//! The spec is rebuilt from every new node state and written only when it differs from what was
//! last written, so a failed write is retried at the next state, and a GPU read with no GPUs
//! (NVML not loaded yet) leaves the last spec in place rather than taking devices away from
//! containers that still name them.

use crate::error::AgentError;
use crate::state::NodeState;
use gpuops_resources::HostDevices;
use gpuops_resources::cdi::{self, CdiSpec, DriverFiles, SpecOptions};
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Directories, relative to the driver root, where distributions and NVIDIA's installers put the
/// driver's libraries. All that exist are searched (plus what the root's ld.so.conf lists):
/// nothing presumes one layout.
pub const LIBRARY_DIRS: &[&str] = &[
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "lib",
    "usr/local/nvidia/lib64",
    "usr/local/nvidia/lib",
];
/// Where the driver's programs may be.
pub const BINARY_DIRS: &[&str] = &[
    "usr/bin",
    "usr/sbin",
    "bin",
    "sbin",
    "usr/local/bin",
    "usr/local/nvidia/bin",
    "usr/local/nvidia/toolkit",
];
/// The driver's user-space libraries a CUDA, NVML or video container needs (nvidia-ctk's
/// compute, utility and video sets), by the name before the version.
pub const LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-encode.so",
    "libnvidia-opticalflow.so",
    "libnvcuvid.so",
];
/// The driver's programs mounted into containers.
pub const BINARIES: &[&str] = &[
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// IPC endpoints, relative to the driver root, mounted when they exist.
pub const IPC: &[&str] = &[
    "run/nvidia-persistenced/socket",
    "run/nvidia-fabricmanager/socket",
    "tmp/nvidia-mps",
];

/// How the agent writes its spec.
#[derive(Debug, Clone)]
pub struct CdiConfig {
    /// The spec file (in a directory the runtime reads, e.g. /var/run/cdi).
    pub path: PathBuf,
    /// Where the driver root is visible to the agent (CONTAINER_DRIVER_ROOT), to probe.
    pub probe_root: PathBuf,
    /// Kind, host roots and hook of the spec.
    pub options: SpecOptions,
}

/// `name` is `<base>.<version>` with a numeric version of at least two parts (`libcuda.so.550.54.15`),
/// and that version is `driver_version` when known.
fn versioned(name: &str, base: &str, driver_version: &str) -> bool {
    let Some(version) = name
        .strip_prefix(base)
        .and_then(|rest| rest.strip_prefix('.'))
    else {
        return false;
    };
    if !driver_version.is_empty() {
        return version == driver_version;
    }
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Library directories listed in the root's `etc/ld.so.conf` and `etc/ld.so.conf.d/*.conf`
/// (absolute paths only; `include` lines other than the usual glob are not followed).
fn ld_so_conf_dirs(root: &Path) -> Vec<String> {
    let mut files = vec![root.join("etc/ld.so.conf")];
    if let Ok(entries) = std::fs::read_dir(root.join("etc/ld.so.conf.d")) {
        let mut more: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        more.sort();
        files.extend(more);
    }
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| l.starts_with('/'))
                .map(|l| l.trim_start_matches('/').trim_end_matches('/').to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Where `gpuops cdi generate` was told to look, and what its spec is to name.
#[derive(Debug, Clone)]
pub struct GenerateRoots {
    pub dev_root: String,
    pub driver_root: String,
    /// Where the driver root is on the host, when it is seen elsewhere here.
    pub host_driver_root: Option<String>,
    pub kind: String,
    pub hook_path: Option<String>,
}

/// What `gpuops cdi generate` builds its spec from: the host's device nodes, the driver's files
/// and the spec's roots. `simulated`: the GPUs are the simulated driver's; `sim_state`: the
/// simulator state the command was pointed at (`--sim-state`). A simulated node's device nodes
/// and driver files are in its state directory (`gpuops sim dev-nodes`), the driver's under
/// `sim_driver_root`; without them, or in a temporary state (gone when the command exits), the
/// spec names the usual paths. The caller names the driver root so that the product does not
/// link the simulator to learn its layout.
pub fn generate_inputs(
    inventory: &gpuops_inventory::Inventory,
    simulated: bool,
    sim_state: Option<(&Path, &Path)>,
    given: GenerateRoots,
) -> Result<(HostDevices, DriverFiles, SpecOptions), AgentError> {
    let sim = sim_state.filter(|(dir, _)| simulated && dir.join("dev").is_dir());
    let (dev_root, driver_root) = match sim {
        Some((dir, sim_driver_root)) => (
            dir.display().to_string(),
            sim_driver_root.display().to_string(),
        ),
        None => (given.dev_root, given.driver_root),
    };
    let sim = sim.map(|(dir, _)| dir);
    let (host, driver) = match sim {
        Some(dir) => (
            gpuops_deviceplugin::probe_host(dir, &dir.join("proc")),
            probe_driver(Path::new(&driver_root), &inventory.driver_version)?,
        ),
        None if simulated => (HostDevices::default(), DriverFiles::default()),
        None => (
            gpuops_deviceplugin::probe_host(Path::new(&dev_root), Path::new("/proc")),
            probe_driver(Path::new(&driver_root), &inventory.driver_version)?,
        ),
    };
    let options = SpecOptions {
        kind: given.kind,
        dev_root,
        driver_root: given.host_driver_root.unwrap_or(driver_root),
        gpuops_hook: given.hook_path,
    };
    Ok((host, driver, options))
}

/// `gpuops cdi hook update-ldcache`, run by the container runtime with the OCI state on stdin:
/// writes `folders` to the container's ld.so.conf.d and runs `ldconfig -r` on its root.
pub fn update_ldcache(
    oci_state: &str,
    folders: &[String],
    ldconfig: &Path,
) -> Result<(), AgentError> {
    let root =
        cdi::hook_rootfs(oci_state, |p| std::fs::read_to_string(p)).map_err(AgentError::CdiHook)?;
    let conf = cdi::ldcache_conf(folders).map_err(AgentError::CdiHook)?;
    // The hook runs as root before the container's root is pivoted to: a link in the image
    // (etc -> /etc) would make it write on the host.
    let mut at = root.clone();
    for part in Path::new(cdi::LDCACHE_CONF).iter() {
        at.push(part);
        if at
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
        {
            return Err(AgentError::CdiHookSymlink(at));
        }
    }
    gpuops_atomicfile::write(&root.join(cdi::LDCACHE_CONF), conf)
        .map_err(|error| AgentError::CdiHookWrite { error })?;
    let status = std::process::Command::new(ldconfig)
        .arg("-r")
        .arg(&root)
        .status()
        .map_err(|error| AgentError::Ldconfig {
            ldconfig: ldconfig.to_path_buf(),
            error,
        })?;
    if !status.success() {
        return Err(AgentError::LdconfigFailed {
            ldconfig: ldconfig.to_path_buf(),
            root,
            status,
        });
    }
    Ok(())
}

/// Finds the driver's libraries (of `driver_version` when known), their soname links, programs,
/// NVIDIA's CDI hook and the IPC endpoints under `root`. A root that does not exist or cannot be
/// read is an error; finding no library is not (a node may have only the kernel driver yet, or
/// be simulated): the spec then holds device nodes only.
pub fn probe_driver(root: &Path, driver_version: &str) -> Result<DriverFiles, AgentError> {
    let root_buf = || root.to_path_buf();
    let meta = std::fs::metadata(root).map_err(|error| AgentError::DriverRoot {
        root: root_buf(),
        error,
    })?;
    if !meta.is_dir() {
        return Err(AgentError::DriverRootNotDir { root: root_buf() });
    }
    std::fs::read_dir(root).map_err(|error| AgentError::DriverRootUnreadable {
        root: root_buf(),
        error,
    })?;
    let mut files = DriverFiles::default();
    let mut seen: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut dirs: Vec<String> = LIBRARY_DIRS.iter().map(|d| d.to_string()).collect();
    for d in ld_so_conf_dirs(root) {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut here = Vec::new();
        for name in &names {
            let path = root.join(dir).join(name);
            let Ok(m) = path.symlink_metadata() else {
                continue;
            };
            if !m.is_file() || !LIBRARIES.iter().any(|b| versioned(name, b, driver_version)) {
                continue;
            }
            // /lib -> usr/lib (merged /usr) shows the same file twice.
            if seen.insert((m.dev(), m.ino())) {
                files.libraries.push(format!("/{dir}/{name}"));
                here.push(name.clone());
            }
        }
        for name in &names {
            if !LIBRARIES.iter().any(|b| name.starts_with(b)) {
                continue;
            }
            let mut target = name.clone();
            for _ in 0..8 {
                match std::fs::read_link(root.join(dir).join(&target)) {
                    Ok(t) => match t.file_name().and_then(|n| n.to_str()) {
                        // Only links within the directory: an absolute one points outside
                        // the root as the agent sees it.
                        Some(n) if t.parent().is_none_or(|p| p.as_os_str().is_empty()) => {
                            target = n.to_string();
                        }
                        _ => break,
                    },
                    Err(_) => break,
                }
            }
            if &target != name && here.contains(&target) {
                files
                    .links
                    .push((format!("/{dir}/{name}"), format!("/{dir}/{target}")));
            }
        }
    }
    for bin in BINARIES {
        if let Some(dir) = BINARY_DIRS
            .iter()
            .find(|d| root.join(d).join(bin).is_file())
        {
            files.binaries.push(format!("/{dir}/{bin}"));
        }
    }
    files.nvidia_cdi_hook = BINARY_DIRS
        .iter()
        .find(|d| root.join(d).join("nvidia-cdi-hook").is_file())
        .map(|d| format!("/{d}/nvidia-cdi-hook"));
    for ipc in IPC {
        if root.join(ipc).exists() {
            files.ipc.push(format!("/{ipc}"));
        }
    }
    Ok(files)
}

/// The spec for a state, or why there is none.
fn build(
    cfg: &CdiConfig,
    host: &HostDevices,
    state: &NodeState,
    driver: &DriverFiles,
) -> Result<CdiSpec, AgentError> {
    let spec = cdi::spec(&state.inventory, host, driver, &cfg.options)?;
    cdi::validate(&spec).map_err(AgentError::CdiSpecInvalid)?;
    Ok(spec)
}

/// Writes the spec for the first state now (an error here stops the agent's start: a spec
/// directory that cannot be written is a configuration error), then for every state whose spec
/// differs from the last one written, until `stop`.
pub fn spawn(
    cfg: CdiConfig,
    host: Arc<HostDevices>,
    mut state_rx: watch::Receiver<Arc<NodeState>>,
    mut stop: watch::Receiver<bool>,
) -> Result<JoinHandle<()>, AgentError> {
    let first = state_rx.borrow_and_update().clone();
    let mut driver_version = first.inventory.driver_version.clone();
    let mut driver = probe_driver(&cfg.probe_root, &driver_version)?;
    if driver.libraries.is_empty() {
        tracing::warn!(
            root = %cfg.probe_root.display(),
            "no NVIDIA driver libraries under the driver root {}: the CDI spec holds device nodes only",
            cfg.probe_root.display()
        );
    }
    let mut written: Option<CdiSpec> = None;
    if !first.inventory.gpus.is_empty() {
        let spec = build(&cfg, &host, &first, &driver).map_err(|e| AgentError::Cdi(Box::new(e)))?;
        write(&cfg.path, &spec)?;
        written = Some(spec);
    }
    Ok(tokio::spawn(async move {
        let mut reported: Option<String> = None;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                changed = state_rx.changed() => if changed.is_err() { return },
            }
            let state = state_rx.borrow_and_update().clone();
            if state.inventory.gpus.is_empty() {
                continue;
            }
            if state.inventory.driver_version != driver_version {
                driver_version = state.inventory.driver_version.clone();
                match probe_driver(&cfg.probe_root, &driver_version) {
                    Ok(d) => driver = d,
                    Err(e) => {
                        tracing::warn!(error = %e, "CDI: {e}; keeping the files found before")
                    }
                }
            }
            let result = build(&cfg, &host, &state, &driver).and_then(|spec| {
                if written.as_ref() == Some(&spec) {
                    return Ok(());
                }
                write(&cfg.path, &spec)?;
                written = Some(spec);
                Ok(())
            });
            match result.map_err(|e| e.to_string()) {
                Ok(()) => reported = None,
                // Once per distinct problem; retried at every new state.
                Err(e) if reported.as_ref() != Some(&e) => {
                    tracing::warn!(error = %e, "CDI spec not written: {e}");
                    reported = Some(e);
                }
                Err(_) => {}
            }
        }
    }))
}

fn write(path: &Path, spec: &CdiSpec) -> Result<(), AgentError> {
    let text = serde_json::to_string_pretty(spec).map_err(AgentError::CdiSerialize)?;
    gpuops_atomicfile::write(path, text + "\n").map_err(AgentError::CdiWrite)?;
    tracing::info!(
        path = %path.display(),
        devices = spec.devices.len(),
        "wrote the CDI spec {} ({} devices of kind {})",
        path.display(),
        spec.devices.len(),
        spec.kind
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuops_inventory::{Gpu, Inventory, MigDevice};

    const VERSION: &str = "550.54.15";

    fn touch(root: &Path, rel: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "x").unwrap();
    }

    fn link(root: &Path, rel: &str, target: &str) {
        std::os::unix::fs::symlink(target, root.join(rel)).unwrap();
    }

    /// A Debian-style driver root with a leftover library of an older driver, an unrelated
    /// library, a merged /lib and NVIDIA's hook.
    fn debian_root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let lib = "usr/lib/x86_64-linux-gnu";
        for l in [
            "libcuda.so",
            "libnvidia-ml.so",
            "libnvidia-ptxjitcompiler.so",
        ] {
            touch(r, &format!("{lib}/{l}.{VERSION}"));
        }
        touch(r, &format!("{lib}/libcuda.so.535.104.05"));
        touch(r, &format!("{lib}/libz.so.1.2.13"));
        link(
            r,
            &format!("{lib}/libcuda.so.1"),
            &format!("libcuda.so.{VERSION}"),
        );
        link(r, &format!("{lib}/libcuda.so"), "libcuda.so.1");
        link(
            r,
            &format!("{lib}/libnvidia-ml.so.1"),
            &format!("libnvidia-ml.so.{VERSION}"),
        );
        // An absolute link points outside the root the agent sees: not followed.
        link(
            r,
            &format!("{lib}/libnvidia-ptxjitcompiler.so.1"),
            "/nowhere/libnvidia-ptxjitcompiler.so",
        );
        std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
        touch(r, "usr/bin/nvidia-smi");
        touch(r, "usr/bin/nvidia-debugdump");
        touch(r, "usr/bin/nvidia-cdi-hook");
        touch(r, "run/nvidia-persistenced/socket");
        std::fs::create_dir_all(r.join("tmp/nvidia-mps")).unwrap();
        dir
    }

    #[test]
    fn the_probe_finds_the_drivers_files_of_its_version_and_their_links() {
        let root = debian_root();
        let f = probe_driver(root.path(), VERSION).unwrap();
        let lib = "/usr/lib/x86_64-linux-gnu";
        assert_eq!(
            f.libraries,
            vec![
                format!("{lib}/libcuda.so.{VERSION}"),
                format!("{lib}/libnvidia-ml.so.{VERSION}"),
                format!("{lib}/libnvidia-ptxjitcompiler.so.{VERSION}"),
            ]
        );
        assert_eq!(
            f.links,
            vec![
                (
                    format!("{lib}/libcuda.so"),
                    format!("{lib}/libcuda.so.{VERSION}")
                ),
                (
                    format!("{lib}/libcuda.so.1"),
                    format!("{lib}/libcuda.so.{VERSION}")
                ),
                (
                    format!("{lib}/libnvidia-ml.so.1"),
                    format!("{lib}/libnvidia-ml.so.{VERSION}")
                ),
            ]
        );
        assert_eq!(
            f.binaries,
            vec!["/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump"]
        );
        assert_eq!(
            f.nvidia_cdi_hook.as_deref(),
            Some("/usr/bin/nvidia-cdi-hook")
        );
        assert_eq!(
            f.ipc,
            vec!["/run/nvidia-persistenced/socket", "/tmp/nvidia-mps"]
        );
        // Unknown driver version: any numeric version counts (both libcuda files).
        let f = probe_driver(root.path(), "").unwrap();
        assert_eq!(
            f.libraries
                .iter()
                .filter(|l| l.contains("libcuda.so."))
                .count(),
            2
        );
    }

    #[test]
    fn the_probe_follows_the_layout_it_finds() {
        // RHEL-style /usr/lib64, a directory only ld.so.conf.d names, binaries in /usr/local.
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        touch(r, &format!("usr/lib64/libcuda.so.{VERSION}"));
        touch(r, &format!("opt/nvidia/lib/libnvidia-ml.so.{VERSION}"));
        touch(r, "etc/ld.so.conf.d/nvidia.conf");
        std::fs::write(
            r.join("etc/ld.so.conf.d/nvidia.conf"),
            "# driver\n/opt/nvidia/lib/\n",
        )
        .unwrap();
        touch(r, "usr/local/nvidia/bin/nvidia-smi");
        let f = probe_driver(r, VERSION).unwrap();
        assert_eq!(
            f.libraries,
            vec![
                format!("/usr/lib64/libcuda.so.{VERSION}"),
                format!("/opt/nvidia/lib/libnvidia-ml.so.{VERSION}"),
            ]
        );
        assert_eq!(f.binaries, vec!["/usr/local/nvidia/bin/nvidia-smi"]);
        assert!(f.links.is_empty() && f.ipc.is_empty() && f.nvidia_cdi_hook.is_none());
        // An empty root: nothing found, not an error.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            probe_driver(empty.path(), VERSION).unwrap(),
            DriverFiles::default()
        );
    }

    #[test]
    fn a_missing_or_unreadable_driver_root_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-root");
        let e = probe_driver(&missing, VERSION).unwrap_err().to_string();
        assert!(
            e.contains("no-such-root") && e.contains("No such file"),
            "{e}"
        );
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let e = probe_driver(&file, VERSION).unwrap_err().to_string();
        assert!(e.contains("a-file: not a directory"), "{e}");
    }

    fn state(gpus: Vec<Gpu>) -> Arc<NodeState> {
        Arc::new(NodeState {
            inventory: Arc::new(Inventory {
                driver_version: VERSION.into(),
                gpus,
                ..Inventory::default()
            }),
            health: Default::default(),
            xids: Default::default(),
            collection: None,
            nvml_errors: 0,
            nvml_loaded: true,
        })
    }

    fn gpu(index: u32) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            minor_number: Some(index),
            ..Gpu::default()
        }
    }

    fn names(path: &Path) -> Vec<String> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect()
    }

    async fn wait_for(path: &Path, want: &[&str]) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if std::fs::read_to_string(path).is_ok() && names(path) == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "spec never became {want:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_task_writes_the_spec_at_start_and_after_a_mig_change() {
        let root = debian_root();
        let out = tempfile::tempdir().unwrap();
        let path = out.path().join("cdi/k8s.device-plugin.nvidia.com-gpu.json");
        let cfg = CdiConfig {
            path: path.clone(),
            probe_root: root.path().to_path_buf(),
            options: SpecOptions::default(),
        };
        let (state_tx, state_rx) = watch::channel(state(vec![gpu(0)]));
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = spawn(cfg, Arc::new(HostDevices::default()), state_rx, stop_rx).unwrap();
        // Written before spawn returns.
        assert_eq!(names(&path), vec!["GPU-0", "0", "all"]);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            v["containerEdits"]["mounts"][0]["containerPath"],
            format!("/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}")
        );
        // No GPUs (NVML gone for a moment): the spec stays.
        state_tx.send(state(vec![])).unwrap();
        // A MIG device appears.
        let mut g = gpu(0);
        g.mig_devices = vec![MigDevice {
            uuid: "MIG-a".into(),
            gi_id: 1,
            ..MigDevice::default()
        }];
        state_tx.send(state(vec![g])).unwrap();
        wait_for(&path, &["GPU-0", "0", "MIG-a", "0:0", "all"]).await;
        stop_tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn an_unwritable_spec_directory_fails_the_start_naming_it() {
        let root = debian_root();
        let out = tempfile::tempdir().unwrap();
        std::fs::write(out.path().join("cdi"), "").unwrap();
        let cfg = CdiConfig {
            path: out.path().join("cdi/spec.json"),
            probe_root: root.path().to_path_buf(),
            options: SpecOptions::default(),
        };
        let (_state_tx, state_rx) = watch::channel(state(vec![gpu(0)]));
        let (_stop_tx, stop_rx) = watch::channel(false);
        let e = spawn(cfg, Arc::new(HostDevices::default()), state_rx, stop_rx)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("writing the CDI spec") && e.contains("cdi"),
            "{e}"
        );
    }
}
