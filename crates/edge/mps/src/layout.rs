//! Where a daemon's files live and what its settings are, as NVIDIA's device plugin lays them
//! out: `<root>/<name>/pipe`, `<root>/<name>/log`, one `<root>/shm` for all. Pure.

use crate::MpsError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where NVIDIA's tools look for the control pipe when `CUDA_MPS_PIPE_DIRECTORY` is unset; the
/// container sees its daemon's pipe directory there, as with NVIDIA's DRA driver, so images
/// that never set the variable still find it.
pub const CONTAINER_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// MPS clients and the server share memory through `/dev/shm`.
pub const CONTAINER_SHM_DIR: &str = "/dev/shm";
/// The control daemon writes its PID here, in its pipe directory (NVIDIA's MPS docs).
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";

pub const ENV_PIPE_DIR: &str = "CUDA_MPS_PIPE_DIRECTORY";
pub const ENV_LOG_DIR: &str = "CUDA_MPS_LOG_DIRECTORY";
pub const ENV_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// The directories of one daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    /// `<root>/<name>`: removed when the daemon is released.
    pub base: PathBuf,
    pub pipe: PathBuf,
    pub log: PathBuf,
    /// Shared by every daemon under the root.
    pub shm: PathBuf,
}

impl Dirs {
    /// The directories of daemon `name` under `root`. The name is one path segment (a GPU's
    /// UUID, a claim's UID for DRA) or an extended resource name `<domain>/<name>` (the device
    /// plugin's daemon per MPS-shared resource: NVIDIA's device plugin hands containers
    /// `<root>/nvidia.com/gpu/pipe`). Either way two daemons never share a pipe directory and
    /// none can reach outside the root or onto the shared `shm`.
    pub fn new(root: &Path, name: &str) -> Result<Dirs, MpsError> {
        let segments: Vec<&str> = name.split('/').collect();
        let why = if name.is_empty() {
            Some("it is empty")
        } else if segments.len() > 2 {
            Some("it has more than one '/' (one segment, or <domain>/<name>)")
        } else if segments.iter().any(|s| s.is_empty()) {
            Some("it has an empty path segment")
        } else if segments.iter().any(|s| *s == "." || *s == "..") {
            Some("it is a relative path segment")
        } else if name.contains('\0') {
            Some("it contains NUL")
        } else if segments[0] == "shm" {
            Some("`shm` is the shared memory directory of every daemon")
        } else if segments.len() == 2 && (segments[1] == "pipe" || segments[1] == "log") {
            // `<a>/pipe` would be daemon `<a>`'s pipe directory.
            Some("`pipe` and `log` are a daemon's own directories")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(MpsError::BadName {
                name: name.to_string(),
                why,
            });
        }
        let base = root.join(name);
        Ok(Dirs {
            pipe: base.join("pipe"),
            log: base.join("log"),
            shm: root.join("shm"),
            base,
        })
    }

    /// The file the control daemon writes its PID to.
    pub fn pid_file(&self) -> PathBuf {
        self.pipe.join(PID_FILE)
    }
}

/// What one daemon serves and how it limits its clients.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DaemonSpec {
    /// The directory name: a resource name such as `nvidia.com/gpu` (device plugin) or a claim
    /// UID (DRA); see [`Dirs::new`].
    pub name: String,
    /// GPU or MIG device UUIDs the daemon sees (`CUDA_VISIBLE_DEVICES`).
    pub uuids: Vec<String>,
    /// `set_default_active_thread_percentage`, 0-100; none leaves the daemon's default (100).
    pub active_thread_percentage: Option<u32>,
    /// `set_default_device_pinned_mem_limit <uuid> <limit>` per UUID, in the daemon's unit
    /// (`<N>M`, `<N>G`, ...), as `gpuops_dra::MpsConfig::pinned_limits` returns them.
    pub pinned_limits: BTreeMap<String, String>,
}

impl DaemonSpec {
    /// The device plugin's MPS sharing, as NVIDIA's device plugin sets it: each of `replicas`
    /// clients gets `100 / replicas` percent of the threads and `memory / replicas` (whole MiB)
    /// of each device's memory. `devices` are (UUID, total memory in bytes); a device whose
    /// memory is unknown (0) gets no limit.
    pub fn replicated(name: &str, devices: &[(String, u64)], replicas: u32) -> DaemonSpec {
        let replicas = replicas.max(1);
        DaemonSpec {
            name: name.to_string(),
            uuids: devices.iter().map(|(u, _)| u.clone()).collect(),
            active_thread_percentage: Some(100 / replicas),
            pinned_limits: devices
                .iter()
                .filter(|(_, bytes)| *bytes > 0)
                .map(|(u, bytes)| {
                    let mib = bytes / u64::from(replicas) / (1024 * 1024);
                    (u.clone(), format!("{mib}M"))
                })
                .collect(),
        }
    }

    /// Refuses what the daemon would reject later, or what would put a command on two lines.
    pub fn validate(&self) -> Result<(), MpsError> {
        let bad = |why: String| MpsError::BadSpec {
            name: self.name.clone(),
            why,
        };
        if self.uuids.is_empty() {
            return Err(bad("no GPU or MIG device UUID to make visible".into()));
        }
        for u in &self.uuids {
            if u.is_empty() || u.contains(|c: char| c.is_whitespace() || c == ',') {
                return Err(bad(format!(
                    "device UUID {u:?} is empty or has a space or comma"
                )));
            }
        }
        if let Some(p) = self.active_thread_percentage
            && p > 100
        {
            return Err(bad(format!("active thread percentage {p} is over 100")));
        }
        for (uuid, limit) in &self.pinned_limits {
            if !self.uuids.contains(uuid) {
                return Err(bad(format!(
                    "pinned memory limit for {uuid}, which is not one of its devices"
                )));
            }
            if !is_limit(limit) {
                return Err(bad(format!(
                    "pinned memory limit {limit:?} for {uuid} is not a number with an optional K, M or G"
                )));
            }
        }
        Ok(())
    }

    /// The control commands that apply the settings, limits first: a new daemon (or one started
    /// again after it died) gets them all.
    pub fn commands(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .pinned_limits
            .iter()
            .map(|(uuid, limit)| format!("set_default_device_pinned_mem_limit {uuid} {limit}"))
            .collect();
        if let Some(p) = self.active_thread_percentage {
            out.push(format!("set_default_active_thread_percentage {p}"));
        }
        out
    }
}

fn is_limit(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G']);
    s.len() - digits.len() <= 1 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// The environment of the control daemon and of every client command sent to it.
pub fn daemon_env(dirs: &Dirs, uuids: &[String]) -> Vec<(String, String)> {
    vec![
        (ENV_PIPE_DIR.into(), dirs.pipe.display().to_string()),
        (ENV_LOG_DIR.into(), dirs.log.display().to_string()),
        (ENV_VISIBLE_DEVICES.into(), uuids.join(",")),
    ]
}

/// One bind mount a container needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    pub options: Vec<String>,
}

/// What a container using a daemon gets: CDI container edits as data, for the device plugin's
/// Allocate response and the DRA preparer's per-claim CDI spec alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEdits {
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
}

/// The container edits for daemon `dirs`: its pipe directory at [`CONTAINER_PIPE_DIR`] with
/// `CUDA_MPS_PIPE_DIRECTORY` naming it, and the shared shm at `/dev/shm`. The log directory
/// stays on the host: clients do not write it.
pub fn container_edits(dirs: &Dirs) -> ContainerEdits {
    let options = || ["rw", "nosuid", "nodev", "bind"].map(String::from).to_vec();
    ContainerEdits {
        env: vec![(ENV_PIPE_DIR.into(), CONTAINER_PIPE_DIR.into())],
        mounts: vec![
            Mount {
                host_path: dirs.pipe.clone(),
                container_path: CONTAINER_PIPE_DIR.into(),
                options: options(),
            },
            Mount {
                host_path: dirs.shm.clone(),
                container_path: CONTAINER_SHM_DIR.into(),
                options: options(),
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> DaemonSpec {
        DaemonSpec {
            name: "claim-1".into(),
            uuids: vec!["GPU-a".into(), "MIG-b".into()],
            active_thread_percentage: Some(50),
            pinned_limits: [("GPU-a".to_string(), "1024M".to_string())].into(),
        }
    }

    #[test]
    fn layout_is_nvidias_with_one_shared_shm() {
        let a = Dirs::new(Path::new("/run/nvidia/mps"), "GPU-a").unwrap();
        let b = Dirs::new(Path::new("/run/nvidia/mps"), "GPU-b").unwrap();
        assert_eq!(a.pipe, Path::new("/run/nvidia/mps/GPU-a/pipe"));
        assert_eq!(a.log, Path::new("/run/nvidia/mps/GPU-a/log"));
        assert_eq!(a.shm, Path::new("/run/nvidia/mps/shm"));
        assert_eq!(a.shm, b.shm);
        assert_ne!(a.pipe, b.pipe);
        assert_eq!(
            a.pid_file(),
            Path::new("/run/nvidia/mps/GPU-a/pipe/nvidia-cuda-mps-control.pid")
        );
    }

    #[test]
    fn names_that_escape_or_collide_are_refused() {
        for name in [
            "", ".", "..", "../x", "a/..", "/a", "a/", "a//b", "a/b/c", "shm", "shm/x", "a\0b",
            "a/pipe", "a/log",
        ] {
            let err = Dirs::new(Path::new("/r"), name).unwrap_err();
            assert!(matches!(err, MpsError::BadName { .. }), "{name:?}: {err}");
        }
    }

    /// The device plugin's daemon per resource sits where Allocate points containers:
    /// `<root>/<resource name>/pipe`, the resource name with its domain.
    #[test]
    fn a_resource_name_lays_out_under_its_domain() {
        let d = Dirs::new(Path::new("/run/nvidia/mps"), "nvidia.com/gpu").unwrap();
        assert_eq!(d.base, Path::new("/run/nvidia/mps/nvidia.com/gpu"));
        assert_eq!(d.pipe, Path::new("/run/nvidia/mps/nvidia.com/gpu/pipe"));
        assert_eq!(d.log, Path::new("/run/nvidia/mps/nvidia.com/gpu/log"));
        assert_eq!(d.shm, Path::new("/run/nvidia/mps/shm"));
        let shared = Dirs::new(Path::new("/run/nvidia/mps"), "nvidia.com/gpu.shared").unwrap();
        assert_ne!(d.pipe, shared.pipe);
    }

    #[test]
    fn commands_set_limits_then_threads() {
        assert_eq!(
            spec().commands(),
            [
                "set_default_device_pinned_mem_limit GPU-a 1024M",
                "set_default_active_thread_percentage 50"
            ]
        );
        assert!(DaemonSpec::default().commands().is_empty());
    }

    #[test]
    fn replicated_divides_threads_and_memory_like_nvidias_plugin() {
        let s = DaemonSpec::replicated(
            "GPU-a",
            &[
                ("GPU-a".into(), 80 * 1024 * 1024 * 1024),
                ("GPU-z".into(), 0),
            ],
            3,
        );
        assert_eq!(s.active_thread_percentage, Some(33));
        assert_eq!(
            s.pinned_limits.get("GPU-a").map(String::as_str),
            Some("27306M")
        );
        assert!(!s.pinned_limits.contains_key("GPU-z"));
        s.validate().unwrap();
        // Zero replicas is taken as one rather than dividing by zero.
        assert_eq!(
            DaemonSpec::replicated("x", &[("GPU-a".into(), 1 << 30)], 0).active_thread_percentage,
            Some(100)
        );
    }

    #[test]
    fn validate_names_what_is_wrong() {
        spec().validate().unwrap();
        let cases: Vec<(DaemonSpec, &str)> = vec![
            (
                DaemonSpec {
                    uuids: vec![],
                    ..spec()
                },
                "no GPU",
            ),
            (
                DaemonSpec {
                    uuids: vec!["GPU-a b".into()],
                    pinned_limits: BTreeMap::new(),
                    ..spec()
                },
                "space",
            ),
            (
                DaemonSpec {
                    active_thread_percentage: Some(101),
                    ..spec()
                },
                "over 100",
            ),
            (
                DaemonSpec {
                    pinned_limits: [("GPU-x".to_string(), "1M".to_string())].into(),
                    ..spec()
                },
                "GPU-x",
            ),
            (
                DaemonSpec {
                    pinned_limits: [("GPU-a".to_string(), "1MB".to_string())].into(),
                    ..spec()
                },
                "\"1MB\"",
            ),
            (
                DaemonSpec {
                    pinned_limits: [("GPU-a".to_string(), "1\nquit".to_string())].into(),
                    ..spec()
                },
                "K, M or G",
            ),
        ];
        for (s, want) in cases {
            let err = s.validate().unwrap_err().to_string();
            assert!(err.contains(want) && err.contains("claim-1"), "{err}");
        }
        assert!(is_limit("2048") && is_limit("2G") && !is_limit("M") && !is_limit("1MM"));
    }

    #[test]
    fn env_and_container_edits() {
        let d = Dirs::new(Path::new("/run/nvidia/mps"), "claim-1").unwrap();
        let env = daemon_env(&d, &spec().uuids);
        assert_eq!(
            env,
            [
                (
                    "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                    "/run/nvidia/mps/claim-1/pipe".to_string()
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY".to_string(),
                    "/run/nvidia/mps/claim-1/log".to_string()
                ),
                (
                    "CUDA_VISIBLE_DEVICES".to_string(),
                    "GPU-a,MIG-b".to_string()
                ),
            ]
        );
        let e = container_edits(&d);
        assert_eq!(
            e.env,
            [(
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                "/tmp/nvidia-mps".to_string()
            )]
        );
        let pairs: Vec<(&Path, &Path)> = e
            .mounts
            .iter()
            .map(|m| (m.host_path.as_path(), m.container_path.as_path()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    Path::new("/run/nvidia/mps/claim-1/pipe"),
                    Path::new("/tmp/nvidia-mps")
                ),
                (Path::new("/run/nvidia/mps/shm"), Path::new("/dev/shm")),
            ]
        );
        assert!(
            e.mounts
                .iter()
                .all(|m| m.options.contains(&"bind".to_string()))
        );
    }
}
