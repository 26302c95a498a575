//! What the binary's end-to-end tests share: running `gpuops` isolated from the developer's setup.
#![allow(dead_code)] // each test file uses a different part

pub mod real_node;

use std::process::{Command, Output};

/// The `gpuops` binary with no inherited simulator, library, node or mig-parted settings.
pub fn gpuops() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuops"));
    for var in [
        "GPUOPS_NVML_SIM_STATE",
        "GPUOPS_NVML_LIB",
        "GPUOPS_NVML_SIM_LIB",
        "NODE_NAME",
        "MIG_PARTED_CONFIG_FILE",
        "MIG_PARTED_SELECTED_CONFIG",
        "MIG_PARTED_HOOKS_FILE",
        "GPUOPS_MIG_CHECKPOINT",
        "GPUOPS_MIG_STEP_DELAY",
        "GPUOPS_KUBERNETES",
        "GPUOPS_MIG_CONFIG_FILE",
    ] {
        c.env_remove(var);
    }
    // Tests run side by side: each agent takes a free loopback port, never the shared 9400.
    c.env("GPUOPS_METRICS_ADDRESS", "127.0.0.1:0");
    c.env_remove("GPUOPS_POD_RESOURCES_SOCKET");
    c
}

/// Runs `gpuops ARGS` to completion.
pub fn run(args: &[&str]) -> Output {
    gpuops().args(args).output().expect("run gpuops")
}

/// stdout and stderr together, for assertions and failure messages.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
