//! NVIDIA's MPS control daemon per MPS-shared resource (device plugin) or per claim (DRA): its directory
//! layout, its supervisor, and what a container needs to use it.

mod control;
mod daemons;
mod error;
mod layout;
mod supervisor;

pub use control::send;
pub use daemons::Daemons;
pub use error::MpsError;
pub use layout::{
    CONTAINER_PIPE_DIR, CONTAINER_SHM_DIR, ContainerEdits, DaemonSpec, Dirs, ENV_LOG_DIR,
    ENV_PIPE_DIR, ENV_VISIBLE_DEVICES, Mount, PID_FILE, container_edits, daemon_env,
};
pub use supervisor::{Config, Daemon, HEALTH_COMMAND, State, Status};
