//! gpuops-atomicfile: replaces a file atomically and durably.
//!
//! Readers (NFD reading the features file, the container runtime reading a CDI spec, the agent
//! reading its MIG checkpoint after a crash) see either the whole old file or the whole new one:
//! the content goes to a hidden temporary file in the same directory (`.name.PID.N.tmp`; NFD skips
//! dot files), which is fsynced, renamed over the target, and then the directory is fsynced so
//! the rename itself survives a power cut. On any failure the temporary file is removed and the
//! old file is left as it was.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A step of the write that failed, and on which path.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct AtomicWriteError {
    pub step: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

fn fail(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AtomicWriteError {
    let path = path.to_path_buf();
    move |source| AtomicWriteError { step, path, source }
}

/// Replaces `path` with `contents` (mode 0644), creating its directory if needed.
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), AtomicWriteError> {
    write_with(path, 0o644, |f| f.write_all(contents.as_ref()))
}

/// Replaces `path` with what `fill` writes into the temporary file; an error from `fill` leaves
/// the old file untouched.
pub fn write_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), AtomicWriteError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(fail("creating directory", dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = TempFile::create(dir, &name)?;
    fill(&mut tmp.file).map_err(fail("writing", &tmp.path))?;
    tmp.file.sync_all().map_err(fail("syncing", &tmp.path))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp.path, std::fs::Permissions::from_mode(mode))
            .map_err(fail("setting permissions on", &tmp.path))?;
    }
    std::fs::rename(&tmp.path, path).map_err(fail("renaming into place", path))?;
    tmp.persisted = true;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail("syncing directory", dir))?;
    Ok(())
}

/// The temporary file, removed on drop unless it was renamed into place.
///
/// Not `tempfile`: it seeds its name generator through `std::thread::current()`, which in a
/// dlopen'ed cdylib (the simulated driver, `libnvml_sim.so`, saves its state through this crate)
/// registers a thread-exit destructor inside the library; once NVML shutdown unloads the library,
/// the next thread to exit jumps into unmapped code. A name from the pid and a counter needs no
/// thread state.
struct TempFile {
    path: PathBuf,
    file: File,
    persisted: bool,
}

impl TempFile {
    fn create(dir: &Path, name: &str) -> Result<TempFile, AtomicWriteError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let pid = std::process::id();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!(".{name}.{pid}.{n}.tmp"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(TempFile {
                        path,
                        file,
                        persisted: false,
                    });
                }
                // Left by an earlier process with the same pid: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fail("creating a temporary file in", dir)(e)),
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect()
    }

    #[test]
    fn replaces_the_file_with_mode_0644_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/checkpoint.json");
        write(&path, "one").unwrap();
        write(&path, "two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        assert!(leftovers(&dir.path().join("sub")).is_empty());
    }

    #[test]
    fn a_failure_mid_write_leaves_the_old_file_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write(&path, "{\"old\": true}").unwrap();
        let err = write_with(&path, 0o644, |f| {
            f.write_all(b"{\"new\": ")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"old\": true}");
        assert!(err.to_string().starts_with("writing "), "{err}");
        assert!(err.to_string().ends_with("disk full"), "{err}");
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[test]
    fn a_rename_that_fails_names_the_target_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), "kept").unwrap();
        let err = write(&path, "x").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("renaming into place {}", path.display())),
            "{err}"
        );
        assert_eq!(
            std::fs::read_to_string(path.join("inside")).unwrap(),
            "kept"
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "").unwrap();
        let err = write(&file.join("below"), "x").unwrap_err();
        assert!(
            err.to_string().contains(&file.display().to_string()),
            "{err}"
        );
    }
}
