//! The state directory: `state.json` written atomically, a lock file serialising writers, and a
//! generation number the writers bump so readers can keep a parsed state while it is current.
//!
//! Readers never lock: writers replace the file by rename, so a reader sees either the old or the new
//! state, never half of one.

use crate::{SimError, SimState};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file holding the writers' generation number, next to `state.json`.
const GENERATION_FILE: &str = "generation";

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

/// What a reader last parsed, and which version of the directory it was: see
/// [`Store::load_cached`].
#[derive(Debug, Default)]
pub struct StateCache {
    seen: Option<Seen>,
    parses: u64,
}

impl StateCache {
    /// How many times the state was parsed through this cache (for tests and benches).
    pub fn parses(&self) -> u64 {
        self.parses
    }
}

#[derive(Debug)]
struct Seen {
    fingerprint: Fingerprint,
    /// `None`: there was no readable generation file.
    generation: Option<u64>,
    /// Whether the file was already settled when it was read: then its fingerprint alone names it.
    settled: bool,
    state: Arc<SimState>,
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
        // NVIDIA's tools read the node through procfs and sysfs, not NVML: give them the same GPUs.
        crate::procfs::create(&store.dir, state)?;
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
        state.check().map_err(|e| SimError::StateCorrupt {
            path,
            message: e.to_string(),
        })?;
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

    /// The current state, parsed again only when a writer saved a new one since `cache` was filled.
    ///
    /// The file's identity alone cannot say that: a save renames a new file over the old one, and
    /// the freed inode number is usually handed to the next save's file, so consecutive versions
    /// alternate between two inode numbers; two saves within one timestamp tick (milliseconds, or
    /// seconds on some filesystems) of the same length then look identical. On that alone a
    /// reader must re-parse whenever the file changed in the last two seconds (the "settled"
    /// rule), which under a storm of writes is every call. So every save also bumps a generation
    /// number, written after `state.json` under the writer lock: a reader reads the generation
    /// before the state, so the state it parses is at least that generation, and an unchanged
    /// generation (with an unchanged file identity, against writers that bypass [`Store`]) means
    /// no save has finished since. A missing or unreadable generation file (an older writer, a
    /// crash before it was written) falls back to the settled rule, judged when the file was
    /// read: a file fresh then may since have been replaced by one with the same identity.
    pub fn load_cached(&self, cache: &mut StateCache) -> Result<Arc<SimState>, SimError> {
        self.load_cached_at(cache, std::time::SystemTime::now())
    }

    /// [`Store::load_cached`] at wall-clock time `before` (taken before anything is read).
    fn load_cached_at(
        &self,
        cache: &mut StateCache,
        before: std::time::SystemTime,
    ) -> Result<Arc<SimState>, SimError> {
        let fingerprint = self.fingerprint()?;
        // A file that had settled before it was parsed, with the same identity now, is the same
        // file: a replacement would carry a later mtime. That costs one stat, as on a quiet node.
        if let Some(seen) = &cache.seen
            && seen.settled
            && seen.fingerprint == fingerprint
        {
            return Ok(Arc::clone(&seen.state));
        }
        // Read before the state, so the state parsed below is at least this generation.
        let generation = self.generation();
        if let Some(seen) = &mut cache.seen
            && generation.is_some()
            && seen.generation == generation
            && seen.fingerprint == fingerprint
        {
            // Known current and settled now: from here on the fingerprint alone names it.
            seen.settled = fingerprint.is_settled(before);
            return Ok(Arc::clone(&seen.state));
        }
        let state = Arc::new(self.load()?);
        cache.parses += 1;
        cache.seen = Some(Seen {
            fingerprint,
            generation,
            settled: fingerprint.is_settled(before),
            state: Arc::clone(&state),
        });
        Ok(state)
    }

    /// The generation number, or `None` when the file is missing or not a whole number (a torn or
    /// hand-edited file must never match a cached one by accident: it makes readers re-parse).
    fn generation(&self) -> Option<u64> {
        use std::io::Read;
        // Every NVML call comes here: one open and one read into the stack, no allocation. The
        // file is replaced whole, so one read gets all of it; a short one fails the newline test.
        let mut buf = [0u8; 24];
        let n = File::open(self.dir.join(GENERATION_FILE))
            .and_then(|mut f| f.read(&mut buf))
            .ok()?;
        std::str::from_utf8(&buf[..n])
            .ok()?
            .strip_suffix('\n')?
            .parse()
            .ok()
    }

    /// Bumps the generation after a save (caller holds the lock). Written by rename, so a reader
    /// sees the old number or the new one; not synced, since it only guards caches in running
    /// processes, which a power cut ends. Without a readable previous number it starts from the
    /// clock in nanoseconds, far from any number a reader can have cached.
    fn bump_generation(&self) -> Result<(), SimError> {
        let next = match self.generation() {
            Some(g) => g.wrapping_add(1),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        };
        let path = self.dir.join(GENERATION_FILE);
        // One writer at a time holds the lock, so a fixed temporary name cannot collide.
        let tmp = self.dir.join(".generation.tmp");
        File::create(&tmp)
            .and_then(|mut f| writeln!(f, "{next}"))
            .map_err(|e| SimError::io("writing", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| SimError::io("renaming into place", &path, e))
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
        gpuops_atomicfile::write(&path, json).map_err(|e| SimError::io(e.step, &path, e.source))?;
        self.bump_generation()
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

    fn lose_gpu(store: &Store, index: usize) {
        let r: Result<(), &str> = store
            .update(|s| {
                s.gpus[index].lost = true;
                Ok(())
            })
            .unwrap();
        r.unwrap();
    }

    #[test]
    fn a_cached_state_is_kept_until_a_save_and_the_save_is_seen_on_the_next_read() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        let mut cache = StateCache::default();
        let first = store.load_cached(&mut cache).unwrap();
        // The file is seconds fresh, which the fingerprint alone would never trust.
        let again = store.load_cached(&mut cache).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(cache.parses(), 1);
        lose_gpu(&store, 2);
        let after = store.load_cached(&mut cache).unwrap();
        assert!(after.gpus[2].lost, "the save is seen on the very next read");
        assert_eq!(cache.parses(), 2);
        store.load_cached(&mut cache).unwrap();
        assert_eq!(cache.parses(), 2);
    }

    /// A writer saving as fast as it can, a reader reading through the cache: every read returns
    /// at least the last save that had finished before it began.
    #[test]
    fn reads_under_a_stream_of_saves_are_never_stale() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        let saved = Arc::new(AtomicU64::new(0));
        let writer = {
            let (store, saved) = (store.clone(), Arc::clone(&saved));
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let seq = store
                        .update(|s| {
                            s.push_event(0, 8, 13, u32::MAX, u32::MAX);
                            Ok::<u64, ()>(s.next_event_seq - 1)
                        })
                        .unwrap()
                        .unwrap();
                    saved.store(seq, Ordering::SeqCst);
                }
            })
        };
        let mut cache = StateCache::default();
        let mut reads = 0u64;
        while !writer.is_finished() {
            let finished = saved.load(Ordering::SeqCst);
            let s = store.load_cached(&mut cache).unwrap();
            let seen = s.next_event_seq - 1;
            assert!(
                seen >= finished,
                "read event {seen} after the save of event {finished} had finished"
            );
            reads += 1;
        }
        writer.join().unwrap();
        let finished = saved.load(Ordering::SeqCst);
        assert_eq!(
            store.load_cached(&mut cache).unwrap().next_event_seq - 1,
            finished
        );
        // At most two parses per save (one may catch the new file before its generation), and
        // none for the reads in between.
        assert!(
            cache.parses() <= (2 * 200 + 1).min(reads + 1),
            "{} parses for {reads} reads of 200 saves",
            cache.parses()
        );
    }

    #[test]
    fn a_missing_or_torn_generation_file_falls_back_to_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        let generation = dir.path().join(GENERATION_FILE);
        assert!(fs::read_to_string(&generation).unwrap().ends_with('\n'));
        let mut cache = StateCache::default();
        store.load_cached(&mut cache).unwrap();
        for torn in [None, Some(""), Some("12"), Some("not a number\n")] {
            match torn {
                None => fs::remove_file(&generation).unwrap(),
                Some(text) => fs::write(&generation, text).unwrap(),
            }
            let before = cache.parses();
            // A fresh state.json without a usable generation is re-read on every call.
            store.load_cached(&mut cache).unwrap();
            store.load_cached(&mut cache).unwrap();
            assert_eq!(cache.parses(), before + 2, "generation file {torn:?}");
        }
        // A writer after that starts a generation again, and changes are still seen.
        lose_gpu(&store, 1);
        assert!(store.load_cached(&mut cache).unwrap().gpus[1].lost);
        let before = cache.parses();
        store.load_cached(&mut cache).unwrap();
        assert_eq!(cache.parses(), before);
    }

    /// Without a generation file only the age of the file when it was read counts: one read
    /// while fresh is never trusted later on its fingerprint (a same-tick replacement may share
    /// it), one read after it settled is.
    #[test]
    fn without_a_generation_only_a_file_settled_when_read_is_cached() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        fs::remove_file(dir.path().join(GENERATION_FILE)).unwrap();
        let now = std::time::SystemTime::now();
        let later = now + std::time::Duration::from_secs(3);
        let mut cache = StateCache::default();
        store.load_cached_at(&mut cache, now).unwrap();
        store.load_cached_at(&mut cache, later).unwrap();
        assert_eq!(cache.parses(), 2, "read while fresh: parsed again");
        store.load_cached_at(&mut cache, later).unwrap();
        assert_eq!(cache.parses(), 2, "read when settled: kept");
        // The settled shortcut also holds with a generation file, and a save still ends it.
        lose_gpu(&store, 0);
        let soon = std::time::SystemTime::now();
        assert!(store.load_cached_at(&mut cache, soon).unwrap().gpus[0].lost);
        store
            .load_cached_at(&mut cache, soon + std::time::Duration::from_secs(3))
            .unwrap();
        assert_eq!(cache.parses(), 3);
        fs::remove_file(dir.path().join(GENERATION_FILE)).unwrap();
        store.load_cached_at(&mut cache, soon).unwrap();
        assert_eq!(
            cache.parses(),
            3,
            "settled once known current: kept on its fingerprint"
        );
        lose_gpu(&store, 1);
        assert!(store.load_cached_at(&mut cache, soon).unwrap().gpus[1].lost);
    }

    /// Something writing state.json past the store (a test, a hand edit) changes the file's
    /// identity though not the generation: that is seen too.
    #[test]
    fn a_state_written_past_the_store_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(dir.path(), &state()).unwrap();
        let mut cache = StateCache::default();
        store.load_cached(&mut cache).unwrap();
        let mut s = state();
        s.gpus[3].lost = true;
        fs::write(store.state_path(), serde_json::to_string(&s).unwrap()).unwrap();
        assert!(store.load_cached(&mut cache).unwrap().gpus[3].lost);
        fs::remove_file(store.state_path()).unwrap();
        let err = store.load_cached(&mut cache).unwrap_err().to_string();
        assert!(err.contains("no state.json"), "{err}");
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
