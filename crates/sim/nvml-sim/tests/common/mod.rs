//! Opening the built cdylib as a C program would: `dlopen` and `dlsym`, the way go-nvml (and so
//! NVIDIA's tools) load `libnvidia-ml.so.1`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::PathBuf;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}

/// `RTLD_LAZY`, as go-nvml opens the library (glibc's value).
const RTLD_LAZY: c_int = 0x1;

/// The cdylib cargo built beside this test binary (target/<profile>/ or its deps/).
pub fn sim_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let name = format!(
        "{}nvml_sim{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let dir = exe.parent().unwrap();
    [dir.to_path_buf(), dir.join(".."), dir.join("../deps")]
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found near {}", dir.display()))
}

/// The loaded simulator; never closed (the driver's statics live as long as the process).
pub struct Library(*mut c_void);

impl Library {
    pub fn open() -> Library {
        let path = CString::new(sim_library().to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; our own library's initialisers only set statics.
        let handle = unsafe { dlopen(path.as_ptr(), RTLD_LAZY) };
        if handle.is_null() {
            // SAFETY: dlerror returns a valid C string after a failed dlopen.
            let why = unsafe { CStr::from_ptr(dlerror()) };
            panic!("dlopen {path:?}: {why:?}");
        }
        Library(handle)
    }

    /// The address of `name`, if the library exports it.
    pub fn symbol(&self, name: &str) -> Option<*mut c_void> {
        let name = CString::new(name).unwrap();
        // SAFETY: a live handle and a valid NUL-terminated name.
        let p = unsafe { dlsym(self.0, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// `name` as a function of type `F` (a `unsafe extern "C" fn` type matching nvml.h).
    ///
    /// # Safety
    /// `F` must be the function's real C signature.
    pub unsafe fn get<F: Copy>(&self, name: &str) -> F {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let p = self
            .symbol(name)
            .unwrap_or_else(|| panic!("{name} is not exported"));
        // SAFETY: same size as a pointer; the caller vouches for the signature.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }
}
