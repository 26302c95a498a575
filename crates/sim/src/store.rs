//! The state directory: `state.json` written atomically, a lock file serialising writers.
//!
//! Readers never lock: writers replace the file by rename, so a reader sees either the old or the new
//! state, never half of one.

use crate::{SimError, SimState};
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

/// A simulator state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// Identifies one version of the state file, so readers can cache the parsed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
}

impl Fingerprint {
    /// Whether a cache keyed by this fingerprint can be trusted at `now`. Two saves within one
    /// timestamp tick may leave length and mtime equal, and the inode alternates between two
    /// values, so a file changed in the last two seconds is always re-read (git's "racily clean"
    /// rule).
    pub fn is_settled(&self, now: std::time::SystemTime) -> bool {
        self.modified
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(2))
    }
}

impl Store {
    /// A handle on `dir`; nothing is read until asked.
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// Creates (or replaces) the state in `dir`, creating the directory if needed.
    pub fn create(dir: impl Into<PathBuf>, state: &SimState) -> Result<Store, SimError> {
        let store = Store::new(dir);
        fs::create_dir_all(&store.dir)
            .map_err(|e| SimError::io("creating state directory", &store.dir, e))?;
        let _lock = store.lock()?;
        store.save(state)?;
        Ok(store)
    }

    /// Reads and checks the state.
    pub fn load(&self) -> Result<SimState, SimError> {
        let path = self.state_path();
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SimError::StateMissing {
                    dir: self.dir.clone(),
                });
            }
            Err(e) => return Err(SimError::io("reading", path, e)),
        };
        let state: SimState = serde_json::from_str(&text).map_err(|e| SimError::StateCorrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        state
            .check()
            .map_err(|message| SimError::StateCorrupt { path, message })?;
        Ok(state)
    }

    /// The current file's identity, for cache validation.
    pub fn fingerprint(&self) -> Result<Fingerprint, SimError> {
        let path = self.state_path();
        let meta = fs::metadata(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => SimError::StateMissing {
                dir: self.dir.clone(),
            },
            _ => SimError::io("reading", &path, e),
        })?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Ok(Fingerprint {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        })
    }

    /// Runs `change` on the current state under the writer lock and saves the result if it succeeds.
    pub fn update<T, E>(
        &self,
        change: impl FnOnce(&mut SimState) -> Result<T, E>,
    ) -> Result<Result<T, E>, SimError> {
        let _lock = self.lock()?;
        let mut state = self.load()?;
        match change(&mut state) {
            Ok(value) => {
                self.save(&state)?;
                crate::devnodes::refresh(&self.dir, &state)?;
                Ok(Ok(value))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    fn lock(&self) -> Result<File, SimError> {
        let path = self.dir.join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| SimError::io("opening lock file", &path, e))?;
        file.lock().map_err(|e| SimError::io("locking", &path, e))?;
        Ok(file)
    }

    fn save(&self, state: &SimState) -> Result<(), SimError> {
        let path = self.state_path();
        let json =
            serde_json::to_vec_pretty(state).map_err(|e| SimError::Invalid(e.to_string()))?;
        gpuops_atomicfile::write(&path, json).map_err(|e| SimError::io(e.step, &path, e.source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Fleet;

    fn state() -> SimState {
        SimState::from_fleet(&Fleet::resolve("l4x4").unwrap(), 0).unwrap()
    }

    #[test]
    fn round_trips_and_updates() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path().join("sim"), &state()).unwrap();
        assert_eq!(store.load().unwrap(), state());
        let before = store.fingerprint().unwrap();
        let r: Result<(), &str> = store
            .update(|s| {
                s.gpus[0].lost = true;
                Ok(())
            })
            .unwrap();
        r.unwrap();
        assert!(store.load().unwrap().gpus[0].lost);
        assert_ne!(store.fingerprint().unwrap(), before);
        // A failed change is not saved.
        let r: Result<(), &str> = store
            .update(|s| {
                s.gpus[1].lost = true;
                Err("no")
            })
            .unwrap();
        assert_eq!(r, Err("no"));
        assert!(!store.load().unwrap().gpus[1].lost);
    }

    #[test]
    fn fresh_files_are_never_trusted_from_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        let f = store.fingerprint().unwrap();
        let now = std::time::SystemTime::now();
        assert!(!f.is_settled(now));
        assert!(f.is_settled(now + std::time::Duration::from_secs(3)));
    }

    #[test]
    fn missing_and_corrupt_state_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path());
        let err = store.load().unwrap_err().to_string();
        assert!(
            err.contains("no state.json") && err.contains("gpuops sim init"),
            "{err}"
        );
        fs::write(store.state_path(), "{ not json").unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(
            err.contains("state.json") && err.contains("corrupt"),
            "{err}"
        );
        let mut s = state();
        s.format = 99;
        fs::write(store.state_path(), serde_json::to_string(&s).unwrap()).unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("format 99"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn read_only_directory_is_a_clear_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        fs::remove_file(dir.path().join("lock")).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o555)).unwrap();
        let probe = dir.path().join("probe");
        if File::create(&probe).is_ok() {
            // Root ignores permission bits (as in CI): make the lock path unopenable instead.
            fs::remove_file(probe).unwrap();
            fs::create_dir(dir.path().join("lock")).unwrap();
        }
        let err = store.update(|_| Ok::<(), ()>(())).unwrap_err().to_string();
        assert!(
            err.contains("opening lock file") && err.contains(&dir.path().display().to_string()),
            "{err}"
        );
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    }
}
