//! The stand-in MPS control daemon's commands: the settings it keeps and what it answers. Pure;
//! `main.rs` carries the commands over the pipe directory.
//!
//! Wire (ours; NVIDIA does not document the real one): the daemon listens on the Unix socket
//! `<CUDA_MPS_PIPE_DIRECTORY>/control`; a client connects, writes one command line, shuts its
//! writing half and reads the answer to the end. An answer starting with [`ERROR_PREFIX`] is
//! a refusal, which the client prints on stderr and exits 1 with.

use std::collections::BTreeMap;

pub const ERROR_PREFIX: &str = "ERROR: ";
pub const SOCKET: &str = "control";
pub const LOG_FILE: &str = "control.log";
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
pub const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";

/// The settings a control daemon keeps until it quits (NVIDIA: "the set value is lost if a
/// quit command is executed").
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub active_thread_percentage: f64,
    pub pinned_limits: BTreeMap<String, String>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            active_thread_percentage: 100.0,
            pinned_limits: BTreeMap::new(),
        }
    }
}

/// What the daemon does with one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Answer and keep serving.
    Answer(String),
    Refuse(String),
    /// Answer, then stop.
    Quit,
}

impl Reply {
    /// The bytes sent back to the client.
    pub fn wire(&self) -> String {
        match self {
            Reply::Answer(a) => a.clone(),
            Reply::Refuse(why) => format!("{ERROR_PREFIX}{why}"),
            Reply::Quit => String::new(),
        }
    }
}

impl Settings {
    /// Carries out one command line.
    pub fn apply(&mut self, line: &str) -> Reply {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["quit"] => Reply::Quit,
            ["get_default_active_thread_percentage"] => {
                Reply::Answer(format!("{:.1}", self.active_thread_percentage))
            }
            ["set_default_active_thread_percentage", p] => match p.parse::<f64>() {
                Ok(v) if (0.0..=100.0).contains(&v) => {
                    self.active_thread_percentage = v;
                    Reply::Answer(format!("{v:.1}"))
                }
                _ => Reply::Refuse(format!("active thread percentage {p:?} is not 0-100")),
            },
            ["get_default_device_pinned_mem_limit", dev] => Reply::Answer(
                self.pinned_limits
                    .get(*dev)
                    .cloned()
                    .unwrap_or_else(|| "0".into()),
            ),
            ["set_default_device_pinned_mem_limit", dev, limit] => {
                if is_limit(limit) {
                    self.pinned_limits.insert((*dev).into(), (*limit).into());
                    Reply::Answer(String::new())
                } else {
                    Reply::Refuse(format!(
                        "pinned memory limit {limit:?} is not a number with an optional K, M or G"
                    ))
                }
            }
            // No CUDA here, so never a server or a client.
            ["get_server_list"] => Reply::Answer(String::new()),
            ["get_client_list", _] | ["get_device_client_list"] | ["get_device_client_list", _] => {
                Reply::Answer(String::new())
            }
            [] => Reply::Refuse("empty command".into()),
            _ => Reply::Refuse(format!("unknown command {line:?}")),
        }
    }
}

fn is_limit(s: &str) -> bool {
    let digits = s.trim_end_matches(['K', 'M', 'G']);
    s.len() - digits.len() <= 1 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_settings_and_answers_gets() {
        let mut s = Settings::default();
        assert_eq!(
            s.apply("get_default_active_thread_percentage"),
            Reply::Answer("100.0".into())
        );
        assert_eq!(
            s.apply("set_default_active_thread_percentage 25"),
            Reply::Answer("25.0".into())
        );
        assert_eq!(
            s.apply("get_default_active_thread_percentage\n"),
            Reply::Answer("25.0".into())
        );
        assert_eq!(
            s.apply("get_default_device_pinned_mem_limit GPU-a"),
            Reply::Answer("0".into())
        );
        assert_eq!(
            s.apply("set_default_device_pinned_mem_limit GPU-a 2048M"),
            Reply::Answer(String::new())
        );
        assert_eq!(
            s.apply("get_default_device_pinned_mem_limit GPU-a"),
            Reply::Answer("2048M".into())
        );
        assert_eq!(s.apply("quit"), Reply::Quit);
    }

    #[test]
    fn refuses_bad_values_and_unknown_commands_unchanged() {
        let mut s = Settings::default();
        for line in [
            "set_default_active_thread_percentage 101",
            "set_default_active_thread_percentage x",
            "set_default_device_pinned_mem_limit GPU-a 2MB",
            "start_mps_please",
            "",
        ] {
            let r = s.apply(line);
            assert!(matches!(r, Reply::Refuse(_)), "{line:?}: {r:?}");
            assert!(r.wire().starts_with(ERROR_PREFIX));
        }
        assert_eq!(s, Settings::default());
    }
}
