//! What a simulated node has on disk besides NVML: device nodes, the driver's MIG capability
//! minors and placeholder driver files, under the state directory, so the agent's host probe and
//! its CDI spec find them as they would on a real node and a container runtime can inject them.
//!
//! Faked, and documented in docs/simulator.md: the nodes are character devices with NVIDIA's
//! numbers (major 195 for `/dev/nvidiaN`, `nvidiactl`, `nvidia-modeset`; the majors the driver
//! picks at load time for `nvidia-uvm` and `nvidia-caps` are fixed here) where `mknod` is
//! permitted (CAP_MKNOD), else empty regular files. No driver answers them: opening one fails
//! with ENXIO. The libraries and `nvidia-smi` are text files, not ELF: a program that loads them
//! fails with "invalid ELF header"; NVML itself comes from `libnvml_sim.so`.

use crate::{SimError, SimState};
use std::path::{Path, PathBuf};

/// The character major of `/dev/nvidiaN`, `nvidiactl` and `nvidia-modeset` (fixed by the driver).
pub const NVIDIA_MAJOR: u32 = 195;
/// Majors the real driver allocates dynamically; any free number will do for placeholders.
pub const UVM_MAJOR: u32 = 510;
pub const CAPS_MAJOR: u32 = 511;
/// GPU instances and compute instances per GPU the driver lists capability minors for.
const GI_IDS: u32 = 15;
const CI_IDS: u32 = 8;
/// Where the placeholder driver files live in the state directory (a driver root).
pub const DRIVER_ROOT: &str = "driver";
/// Where the placeholder libraries are, relative to [`DRIVER_ROOT`].
pub const LIBRARY_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// The driver libraries given placeholders, with their soname link.
pub const LIBRARIES: &[&str] = &[
    "libcuda.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
];
/// The driver programs given placeholders, relative to [`DRIVER_ROOT`].
pub const BINARIES: &[&str] = &["usr/bin/nvidia-smi"];

/// What [`create`] made the device nodes as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// Character devices with NVIDIA's numbers.
    CharDevices,
    /// Regular files: `mknod` was refused. Runtimes that inject CDI device nodes reject them
    /// ("not a device node"); only the probe finds them.
    RegularFiles,
}

/// The capability minor of a MIG device's GI (`ci` None) or CI access file, in the layout the
/// driver writes to `/proc/driver/nvidia-caps/mig-minors`.
fn cap_minor(gpu_minor: u32, gi: u32, ci: Option<u32>) -> u32 {
    let gi_minor = 3 + gpu_minor * GI_IDS * (CI_IDS + 1) + gi * (CI_IDS + 1);
    ci.map_or(gi_minor, |c| gi_minor + 1 + c)
}

/// The `mig-minors` file's text for these GPU minors, as the driver writes it.
pub fn mig_minors(gpu_minors: &[u32]) -> String {
    let mut out = String::from("config 1\nmonitor 2\n");
    for &m in gpu_minors {
        for gi in 0..GI_IDS {
            out.push_str(&format!(
                "gpu{m}/gi{gi}/access {}\n",
                cap_minor(m, gi, None)
            ));
            for ci in 0..CI_IDS {
                out.push_str(&format!(
                    "gpu{m}/gi{gi}/ci{ci}/access {}\n",
                    cap_minor(m, gi, Some(ci))
                ));
            }
        }
    }
    out
}

/// The device nodes of a node with these GPU minors, and the capability nodes of the MIG devices
/// `(gpu minor, GI id, CI id)` that exist: (path under `dev/`, major, minor). The driver's
/// helper makes capability nodes on demand, and so does the simulator (each `mknod` costs up to
/// a millisecond here: all 135 per GPU up front would slow every `sim init`).
pub fn nodes(gpu_minors: &[u32], mig: &[(u32, u32, u32)]) -> Vec<(String, u32, u32)> {
    let mut out = vec![
        ("nvidiactl".to_string(), NVIDIA_MAJOR, 255),
        ("nvidia-modeset".to_string(), NVIDIA_MAJOR, 254),
        ("nvidia-uvm".to_string(), UVM_MAJOR, 0),
        ("nvidia-uvm-tools".to_string(), UVM_MAJOR, 1),
        ("nvidia-caps/nvidia-cap1".to_string(), CAPS_MAJOR, 1),
        ("nvidia-caps/nvidia-cap2".to_string(), CAPS_MAJOR, 2),
    ];
    for &m in gpu_minors {
        out.push((format!("nvidia{m}"), NVIDIA_MAJOR, m));
    }
    for &(m, gi, ci) in mig {
        for minor in [cap_minor(m, gi, None), cap_minor(m, gi, Some(ci))] {
            out.push((format!("nvidia-caps/nvidia-cap{minor}"), CAPS_MAJOR, minor));
        }
    }
    out
}

/// `(gpu minor, GI id, CI id)` of every MIG device of `state`.
fn mig_devices(state: &SimState) -> Vec<(u32, u32, u32)> {
    state
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices()
                .into_iter()
                .map(|(gi, ci)| (g.minor_number, gi.id, ci.id))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SimError {
    let path = path.to_path_buf();
    move |source| SimError::Io {
        action,
        path,
        source,
    }
}

fn mkdir(dir: &Path) -> Result<(), SimError> {
    std::fs::create_dir_all(dir).map_err(io("creating", dir))
}

/// Creates `dev/`, `proc/driver/nvidia-caps/mig-minors` and the placeholder driver root under
/// `state_dir` for `state`'s GPUs. Nodes that exist are left alone, so it can run again.
pub fn create(state_dir: &Path, state: &SimState) -> Result<NodeKind, SimError> {
    let minors: Vec<u32> = state.gpus.iter().map(|g| g.minor_number).collect();
    let dev = state_dir.join("dev");
    mkdir(&dev.join("nvidia-caps"))?;
    let kind = make_nodes(&dev, &nodes(&minors, &mig_devices(state)))?;
    let caps = state_dir.join("proc/driver/nvidia-caps");
    mkdir(&caps)?;
    let file = caps.join("mig-minors");
    std::fs::write(&file, mig_minors(&minors)).map_err(io("writing", &file))?;
    write_driver_files(&state_dir.join(DRIVER_ROOT), &state.driver_version)?;
    Ok(kind)
}

/// Makes the capability nodes of `state`'s MIG devices that do not exist yet, when the state
/// directory has device nodes at all (`gpuops sim dev-nodes` made them): called after every change of
/// the simulated driver, so a new MIG device has its nodes before anyone reads the new state.
pub fn refresh(state_dir: &Path, state: &SimState) -> Result<(), SimError> {
    let dev = state_dir.join("dev");
    if !dev.join("nvidia-caps").is_dir() {
        return Ok(());
    }
    let minors: Vec<u32> = state.gpus.iter().map(|g| g.minor_number).collect();
    make_nodes(&dev, &nodes(&minors, &mig_devices(state)))?;
    Ok(())
}

fn make_nodes(dev: &Path, nodes: &[(String, u32, u32)]) -> Result<NodeKind, SimError> {
    let mut kind = NodeKind::CharDevices;
    for (name, major, minor) in nodes {
        let (major, minor) = (*major, *minor);
        let path = dev.join(name);
        if path.symlink_metadata().is_ok() {
            continue;
        }
        if kind == NodeKind::CharDevices {
            match rustix::fs::mknodat(
                rustix::fs::CWD,
                &path,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o666),
                rustix::fs::makedev(major, minor),
            ) {
                // As the driver makes them (the umask took some bits away).
                Ok(()) => {
                    std::fs::set_permissions(
                        &path,
                        std::os::unix::fs::PermissionsExt::from_mode(0o666),
                    )
                    .map_err(io("chmod", &path))?;
                    continue;
                }
                Err(rustix::io::Errno::PERM) => kind = NodeKind::RegularFiles,
                Err(e) => return Err(io("mknod", &path)(e.into())),
            }
        }
        std::fs::write(&path, "").map_err(io("writing", &path))?;
    }
    Ok(kind)
}

/// The placeholder libraries (`libcuda.so.<version>` and its soname link `libcuda.so.1`, ...) and
/// programs of a driver root.
fn write_driver_files(root: &Path, version: &str) -> Result<(), SimError> {
    let lib_dir = root.join(LIBRARY_DIR);
    mkdir(&lib_dir)?;
    for lib in LIBRARIES {
        let file = format!("{lib}.{version}");
        let path = lib_dir.join(&file);
        std::fs::write(
            &path,
            format!("gpuops simulator placeholder for the NVIDIA driver's {file}; not a library\n"),
        )
        .map_err(io("writing", &path))?;
        let link: PathBuf = lib_dir.join(format!("{lib}.1"));
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(&file, &link).map_err(io("linking", &link))?;
        }
    }
    for bin in BINARIES {
        let path = root.join(bin);
        if let Some(dir) = path.parent() {
            mkdir(dir)?;
        }
        std::fs::write(
            &path,
            "#!/bin/sh\necho 'gpuops simulator placeholder for nvidia-smi: no driver here' >&2\nexit 9\n",
        )
        .map_err(io("writing", &path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fleet;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn capability_minors_follow_the_drivers_layout() {
        // What real drivers list (`gpu0/gi0/access 3`, `gpu0/gi1/access 12`, `gpu1/gi0/access 138`).
        assert_eq!(cap_minor(0, 0, None), 3);
        assert_eq!(cap_minor(0, 0, Some(0)), 4);
        assert_eq!(cap_minor(0, 1, None), 12);
        assert_eq!(cap_minor(0, 14, Some(7)), 137);
        assert_eq!(cap_minor(1, 0, None), 138);
        let text = mig_minors(&[0, 1]);
        assert!(
            text.starts_with("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n")
        );
        assert!(text.contains("gpu1/gi2/ci0/access 157\n"), "{text}");
        assert_eq!(text.lines().count(), 2 + 2 * 15 * 9);
        // The MIG devices' nodes only: config, monitor, then GI and CI of each.
        let caps: Vec<u32> = nodes(&[0, 1], &[(1, 2, 0)])
            .iter()
            .filter(|(_, major, _)| *major == CAPS_MAJOR)
            .map(|(_, _, m)| *m)
            .collect();
        assert_eq!(caps, vec![1, 2, 156, 157]);
    }

    #[test]
    fn create_makes_the_nodes_the_probe_looks_for_and_can_run_again() {
        let dir = tempfile::tempdir().unwrap();
        let state = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        let kind = create(dir.path(), &state).unwrap();
        let dev = dir.path().join("dev");
        for name in [
            "nvidiactl",
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia-modeset",
            "nvidia0",
            "nvidia3",
            "nvidia-caps/nvidia-cap1",
        ] {
            let meta = dev.join(name).symlink_metadata().unwrap();
            match kind {
                NodeKind::CharDevices => assert!(meta.file_type().is_char_device(), "{name}"),
                NodeKind::RegularFiles => assert!(meta.is_file(), "{name}"),
            }
        }
        assert!(!dev.join("nvidia4").exists());
        let minors =
            std::fs::read_to_string(dir.path().join("proc/driver/nvidia-caps/mig-minors")).unwrap();
        assert!(minors.contains("gpu3/gi0/access "), "{minors}");
        let lib = dir.path().join(DRIVER_ROOT).join(LIBRARY_DIR);
        let versioned = format!("libcuda.so.{}", state.driver_version);
        assert!(lib.join(&versioned).is_file());
        assert_eq!(
            std::fs::read_link(lib.join("libcuda.so.1")).unwrap(),
            PathBuf::from(&versioned)
        );
        assert!(
            dir.path()
                .join(DRIVER_ROOT)
                .join("usr/bin/nvidia-smi")
                .is_file()
        );
        assert_eq!(create(dir.path(), &state).unwrap(), kind);
    }

    #[test]
    fn a_new_mig_device_gets_its_capability_nodes_with_the_state_change() {
        let dir = tempfile::tempdir().unwrap();
        let state = SimState::from_fleet(&Fleet::resolve("dgx-h100").unwrap(), 0).unwrap();
        let store = crate::Store::create(dir.path(), &state).unwrap();
        create(dir.path(), &state).unwrap();
        let caps = dir.path().join("dev/nvidia-caps");
        let count = || std::fs::read_dir(&caps).unwrap().count();
        assert_eq!(count(), 2, "config and monitor only, no MIG device yet");
        let gi = store
            .update(|s| -> Result<u32, crate::NvmlCode> {
                let g = &mut s.gpus[1];
                g.set_mig_mode(true)?;
                let gi = g.create_gi(19, None)?;
                g.create_ci(gi, 0, None, "MIG-x".into())?;
                Ok(gi)
            })
            .unwrap()
            .unwrap();
        let minor = state.gpus[1].minor_number;
        for m in [cap_minor(minor, gi, None), cap_minor(minor, gi, Some(0))] {
            assert!(caps.join(format!("nvidia-cap{m}")).exists(), "cap {m}");
        }
        assert_eq!(count(), 4);
        // A state directory without device nodes gets none.
        let bare = tempfile::tempdir().unwrap();
        let store = crate::Store::create(bare.path(), &state).unwrap();
        store
            .update(|s| s.gpus[0].set_mig_mode(true).map(|_| ()))
            .unwrap()
            .unwrap();
        assert!(!bare.path().join("dev").exists());
    }

    #[test]
    fn an_unwritable_state_directory_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        let state = SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap();
        let e = create(&file, &state).unwrap_err().to_string();
        assert!(e.contains("not-a-dir/dev"), "{e}");
    }
}
