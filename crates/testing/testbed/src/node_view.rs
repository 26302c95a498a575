//! Running a command that sees a simulated node through procfs and sysfs, as NVIDIA's tools read
//! a real one: in a private mount namespace (`unshare --mount --propagation private`, so nothing
//! leaks to the host), the simulator's `proc/driver/nvidia`, `proc/modules` and
//! `sys/bus/pci/devices` (written by `gpuops sim init`) are bind-mounted over the real ones. On a
//! host without NVIDIA's driver `/proc/driver/nvidia` does not exist and procfs takes no new
//! directories, so a tmpfs covers `/proc/driver` first (with the simulator's `nvidia-caps` when
//! the state directory has one). `/proc/modules` is covered only where the kernel has one (a
//! kernel without loadable modules, or a sandboxed one, has none). Needs root (CAP_SYS_ADMIN) and util-linux's `unshare`.

use crate::BedError;
use std::path::Path;
use std::process::{Command, Output};

/// The namespace's setup, then the command: `$1` is the state directory, `$2` the command.
const SETUP: &str = r#"set -e
root="$1"; shift
if [ ! -d /proc/driver/nvidia ]; then
  mount -t tmpfs gpuops-sim-proc-driver /proc/driver
  mkdir /proc/driver/nvidia
  if [ -d "$root/proc/driver/nvidia-caps" ]; then
    mkdir /proc/driver/nvidia-caps
    mount --bind "$root/proc/driver/nvidia-caps" /proc/driver/nvidia-caps
  fi
fi
mount --bind "$root/proc/driver/nvidia" /proc/driver/nvidia
if [ -e /proc/modules ]; then mount --bind "$root/proc/modules" /proc/modules; fi
mount --bind "$root/sys/bus/pci/devices" /sys/bus/pci/devices
exec sh -c "$1"
"#;

/// Runs `script` with `sh -c` where `/proc/driver/nvidia`, `/proc/modules` and
/// `/sys/bus/pci/devices` are those of the simulated node in `state_dir`; its output and status.
/// A failed setup (not root, no `unshare`) shows as a failed status with the reason on stderr.
pub fn run_in_node_view(state_dir: &Path, script: &str) -> Result<Output, BedError> {
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", SETUP])
        .arg("gpuops-node-view")
        .arg(state_dir)
        .arg(script)
        .output()
        .map_err(|source| BedError::Spawn {
            what: "unshare for the simulated node's procfs/sysfs view".into(),
            source,
        })
}
