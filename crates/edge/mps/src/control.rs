//! Sending one command to a control daemon the way NVIDIA's tools do: the same binary, run
//! without arguments, reads the command on stdin and prints the daemon's answer.

use crate::MpsError;
use crate::layout::{Dirs, daemon_env};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// Runs `echo <command> | <binary>` with the daemon's environment and returns the answer,
/// trimmed. A client that outlives `timeout` is killed: a daemon that hangs must not hang the
/// caller (the health check, a claim's prepare).
pub async fn send(
    binary: &Path,
    dirs: &Dirs,
    uuids: &[String],
    command: &str,
    timeout: Duration,
) -> Result<String, MpsError> {
    let mut child = Command::new(binary)
        .envs(daemon_env(dirs, uuids))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| MpsError::Spawn {
            path: binary.to_path_buf(),
            source,
        })?;
    let failed = |detail: String| MpsError::Command {
        command: command.to_string(),
        pipe_dir: dirs.pipe.clone(),
        detail,
    };
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(format!("{command}\n").as_bytes())
                .await
                .map_err(|e| failed(format!("writing the command: {e}")))?;
            // Dropping stdin closes it: the client reads to the end before it answers.
        }
        child
            .wait_with_output()
            .await
            .map_err(|e| failed(format!("waiting for the client: {e}")))
    };
    let output = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| MpsError::Timeout {
            command: command.to_string(),
            pipe_dir: dirs.pipe.clone(),
            timeout,
        })??;
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        let said = [stderr, stdout]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        return Err(failed(format!("{} ({said})", output.status)));
    }
    Ok(stdout)
}
