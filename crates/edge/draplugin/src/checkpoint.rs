//! The plugin's state file: read at start, replaced atomically on every change.

use crate::error::DraPluginError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A checkpoint file of `T`. Its format (the version rules that let an older and a newer agent
/// read it) is the caller's: `gpuops_dra::checkpoint`'s `parse` and `to_json` for the agent's
/// prepared claims, or plain JSON through [`CheckpointStore::json`].
#[derive(Debug, Clone)]
pub struct CheckpointStore<T, E> {
    path: PathBuf,
    parse: fn(&[u8]) -> Result<T, E>,
    encode: fn(&T) -> Result<Vec<u8>, E>,
}

impl<T: Serialize + DeserializeOwned> CheckpointStore<T, serde_json::Error> {
    /// A checkpoint of `T` as pretty JSON, read back with serde alone.
    pub fn json(path: &Path) -> CheckpointStore<T, serde_json::Error> {
        CheckpointStore::new(
            path,
            |bytes| serde_json::from_slice(bytes),
            |data| serde_json::to_vec_pretty(data),
        )
    }
}

impl<T, E: std::error::Error + Send + Sync + 'static> CheckpointStore<T, E> {
    /// A checkpoint at `path` read with `parse` and written with `encode`.
    pub fn new(
        path: &Path,
        parse: fn(&[u8]) -> Result<T, E>,
        encode: fn(&T) -> Result<Vec<u8>, E>,
    ) -> CheckpointStore<T, E> {
        CheckpointStore {
            path: path.to_path_buf(),
            parse,
            encode,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpoint, or `None` when there is none yet (a first start). A file that does not
    /// parse is [`DraPluginError::CheckpointCorrupt`] naming it, with the parser's reason; the
    /// file is left as it was so nothing is lost.
    pub fn load(&self) -> Result<Option<T>, DraPluginError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(DraPluginError::CheckpointRead {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        (self.parse)(&bytes)
            .map(Some)
            .map_err(|e| DraPluginError::CheckpointCorrupt {
                path: self.path.clone(),
                source: BoxError::from(e),
            })
    }

    /// Replaces the checkpoint with `data`: a crash leaves either the old file or the new one.
    pub fn save(&self, data: &T) -> Result<(), DraPluginError> {
        let mut bytes = (self.encode)(data).map_err(|e| DraPluginError::CheckpointEncode {
            path: self.path.clone(),
            source: BoxError::from(e),
        })?;
        if bytes.last() != Some(&b'\n') {
            bytes.push(b'\n');
        }
        gpuops_atomicfile::write(&self.path, bytes)?;
        Ok(())
    }

    /// Renames a corrupt checkpoint to `<name>.corrupt-<suffix>` beside it (kept for a human to
    /// read) so the plugin can start without it; returns the new path.
    pub fn set_aside(&self, suffix: &str) -> Result<PathBuf, DraPluginError> {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".corrupt-{suffix}"));
        let to = self.path.with_file_name(name);
        std::fs::rename(&self.path, &to).map_err(|source| DraPluginError::CheckpointSetAside {
            path: self.path.clone(),
            to: to.clone(),
            source,
        })?;
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Data {
        version: u32,
        claims: BTreeMap<String, Vec<String>>,
    }

    fn data() -> Data {
        Data {
            version: 1,
            claims: BTreeMap::from([("uid-1".into(), vec!["gpu-0".into()])]),
        }
    }

    #[test]
    fn missing_is_none_saved_reads_back_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::<Data, _>::json(&dir.path().join("drv/checkpoint.json"));
        assert_eq!(store.load().unwrap(), None);
        store.save(&data()).unwrap();
        assert_eq!(store.load().unwrap(), Some(data()));
        let empty = Data {
            version: 1,
            claims: BTreeMap::new(),
        };
        store.save(&empty).unwrap();
        assert_eq!(store.load().unwrap(), Some(empty));
        // Only the checkpoint is left: no temporary files beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("drv"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["checkpoint.json"]);
    }

    #[test]
    fn corrupt_names_the_file_and_where_and_is_kept_until_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(
            &path,
            "{\"version\": 1,\n \"claims\": {\"uid-1\": [\"gpu-0\"",
        )
        .unwrap();
        let store = CheckpointStore::<Data, _>::json(&path);
        let err = store.load().unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, DraPluginError::CheckpointCorrupt { .. }));
        assert!(
            message.contains(&path.display().to_string()) && message.contains("line 2"),
            "{message}"
        );
        assert!(path.exists(), "a corrupt checkpoint is never deleted");
        // Truncated to nothing (a crash of a writer that did not write atomically) is corrupt too.
        std::fs::write(&path, "").unwrap();
        assert!(matches!(
            store.load(),
            Err(DraPluginError::CheckpointCorrupt { .. })
        ));
        let aside = store.set_aside("20261203T150000Z").unwrap();
        assert_eq!(
            aside.file_name().unwrap(),
            "checkpoint.json.corrupt-20261203T150000Z"
        );
        assert!(aside.exists());
        assert_eq!(store.load().unwrap(), None);
    }

    #[test]
    fn wrong_shape_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        std::fs::write(&path, "{\"version\": \"one\"}").unwrap();
        let err = CheckpointStore::<Data, _>::json(&path).load().unwrap_err();
        assert!(err.to_string().contains("checkpoint.json"), "{err}");
    }

    #[test]
    fn unreadable_is_a_read_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the file should be: reading it fails with something other than
        // NotFound, whoever runs the test (root reads files of any mode).
        let path = dir.path().join("checkpoint.json");
        std::fs::create_dir(&path).unwrap();
        let err = CheckpointStore::<Data, _>::json(&path).load().unwrap_err();
        assert!(
            matches!(err, DraPluginError::CheckpointRead { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("checkpoint.json"));
    }

    /// A format with its own version rule, as gpuops-dra's checkpoint has.
    #[derive(Debug, thiserror::Error)]
    #[error("written by format version {0}; this agent reads up to version 1")]
    struct TooNew(u32);

    fn versioned(bytes: &[u8]) -> Result<u32, TooNew> {
        let v = bytes.first().map_or(0, |b| u32::from(b - b'0'));
        if v > 1 { Err(TooNew(v)) } else { Ok(v) }
    }

    fn encode(v: &u32) -> Result<Vec<u8>, TooNew> {
        Ok(v.to_string().into_bytes())
    }

    #[test]
    fn the_callers_format_decides_and_its_reason_is_kept_with_the_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.json");
        let store = CheckpointStore::new(&path, versioned, encode);
        store.save(&1).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "1\n");
        assert_eq!(store.load().unwrap(), Some(1));
        std::fs::write(&path, "2").unwrap();
        let message = store.load().unwrap_err().to_string();
        assert_eq!(
            message,
            format!(
                "the DRA checkpoint {} cannot be used: written by format version 2; this agent reads up to version 1",
                path.display()
            )
        );
    }
}
