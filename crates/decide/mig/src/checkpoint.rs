//! The checkpoint an apply writes before changing anything, so `restore` (or the next apply) can
//! converge after a crash.

use crate::error::MigError;
use crate::layout::Layout;
use serde::{Deserialize, Serialize};

/// One GPU as it was before the apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCheckpoint {
    pub index: u32,
    /// Identifies the board: indices can change across reboots, UUIDs do not.
    pub uuid: String,
    pub mig_enabled: bool,
    pub layout: Layout,
}

/// The checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    pub version: String,
    /// The config the apply was going to, while it has not finished.
    pub applying: Option<String>,
    pub gpus: Vec<GpuCheckpoint>,
}

impl Checkpoint {
    pub const VERSION: &'static str = "v1";

    /// Parses checkpoint JSON; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Checkpoint, MigError> {
        let c: Checkpoint = serde_json::from_str(text).map_err(|e| MigError::CheckpointJson {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        if c.version != Self::VERSION {
            return Err(MigError::CheckpointVersion {
                origin: origin.to_string(),
                version: c.version,
            });
        }
        Ok(c)
    }

    /// Whether an apply started from this checkpoint and did not finish.
    pub fn interrupted(&self) -> bool {
        self.applying.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Instance;

    #[test]
    fn round_trips_and_checks_version() {
        let c = Checkpoint {
            version: "v1".into(),
            applying: Some("all-1g.10gb".into()),
            gpus: vec![GpuCheckpoint {
                index: 0,
                uuid: "GPU-a".into(),
                mig_enabled: true,
                layout: Layout::new(vec![Instance::new("3g.40gb", 4)]),
            }],
        };
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(Checkpoint::parse(&text, "c.json").unwrap(), c);
        assert!(c.interrupted());
        let bad = text.replace("\"v1\"", "\"v9\"");
        assert!(
            Checkpoint::parse(&bad, "c.json")
                .unwrap_err()
                .to_string()
                .contains("v9")
        );
        assert!(
            Checkpoint::parse("{", "c.json")
                .unwrap_err()
                .to_string()
                .contains("c.json")
        );
    }
}
