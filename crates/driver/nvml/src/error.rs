//! The NVML layer's error type: every failure names the call, the GPU and the driver's reason.

use nvml_wrapper::error::NvmlError as WrapperError;

/// Errors from the NVML layer.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    #[error(
        "cannot load the NVML library {path}: {reason}. Is the NVIDIA driver installed? \
         Without a GPU, use --simulate FLEET (e.g. --simulate dgx-h100)"
    )]
    LibraryNotLoaded { path: String, reason: String },
    #[error("NVML in {path} failed to initialise: {reason}")]
    Init { path: String, reason: String },
    #[error("GPU {} fell off the bus (NVML: GPU is lost); reset the GPU or reboot the node", gpu_name(*gpu))]
    GpuLost { gpu: Option<u32> },
    #[error("{call} is not supported on GPU {}", gpu_name(*gpu))]
    NotSupported {
        call: &'static str,
        gpu: Option<u32>,
    },
    #[error("{call} on GPU {}: {reason}", gpu_name(*gpu))]
    Call {
        call: &'static str,
        gpu: Option<u32>,
        reason: String,
        /// The `nvmlReturn_t`, when the driver gave one.
        code: Option<u32>,
    },
}

fn gpu_name(gpu: Option<u32>) -> String {
    gpu.map_or_else(|| "(node)".into(), |g| g.to_string())
}

impl NvmlError {
    /// Whether the error means the GPU is gone rather than that one call failed.
    pub fn is_gpu_lost(&self) -> bool {
        matches!(self, NvmlError::GpuLost { .. })
    }

    /// The NVML return code behind the error, where there is one.
    pub fn code(&self) -> Option<u32> {
        match self {
            NvmlError::GpuLost { .. } => Some(raw_codes::GPU_IS_LOST),
            NvmlError::NotSupported { .. } => Some(raw_codes::NOT_SUPPORTED),
            NvmlError::Call { code, .. } => *code,
            _ => None,
        }
    }
}

/// The `nvmlReturn_t` values the layer tells apart.
pub mod raw_codes {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const GPU_IS_LOST: u32 = 15;
    pub const IN_USE: u32 = 19;
    pub const INSUFFICIENT_RESOURCES: u32 = 23;
}

/// Human text for a raw `nvmlReturn_t`, as `nvmlErrorString` words it.
pub(crate) fn describe_code(code: u32) -> &'static str {
    match code {
        1 => "NVML not initialised",
        2 => "invalid argument",
        3 => "not supported",
        4 => "insufficient permissions",
        6 => "not found",
        7 => "insufficient size",
        9 => "driver not loaded",
        10 => "timeout",
        15 => "GPU is lost",
        16 => "GPU reset required",
        19 => "in use by another client",
        23 => "insufficient resources",
        25 => "argument version mismatch",
        _ => "unknown error",
    }
}

/// Maps a raw return code from a -sys call.
pub fn check(call: &'static str, gpu: Option<u32>, code: u32) -> Result<(), NvmlError> {
    match code {
        raw_codes::SUCCESS => Ok(()),
        raw_codes::GPU_IS_LOST => Err(NvmlError::GpuLost { gpu }),
        raw_codes::NOT_SUPPORTED => Err(NvmlError::NotSupported { call, gpu }),
        other => Err(NvmlError::Call {
            call,
            gpu,
            reason: describe_code(other).into(),
            code: Some(other),
        }),
    }
}

/// Maps an nvml-wrapper error from a wrapped call.
pub fn call(call: &'static str, gpu: Option<u32>, e: WrapperError) -> NvmlError {
    match e {
        WrapperError::GpuLost => NvmlError::GpuLost { gpu },
        WrapperError::NotSupported
        | WrapperError::FunctionNotFound
        | WrapperError::FailedToLoadSymbol(_) => NvmlError::NotSupported { call, gpu },
        other => NvmlError::Call {
            call,
            gpu,
            code: wrapper_code(&other),
            reason: other.to_string(),
        },
    }
}

fn wrapper_code(e: &WrapperError) -> Option<u32> {
    match e {
        WrapperError::InvalidArg => Some(raw_codes::INVALID_ARGUMENT),
        WrapperError::NotFound => Some(raw_codes::NOT_FOUND),
        WrapperError::InsufficientSize(_) => Some(raw_codes::INSUFFICIENT_SIZE),
        WrapperError::Timeout => Some(raw_codes::TIMEOUT),
        WrapperError::InUse => Some(raw_codes::IN_USE),
        _ => None,
    }
}

/// Maps a failure of loading or `nvmlInit`.
pub fn init_error(path: &str, e: WrapperError) -> NvmlError {
    match e {
        WrapperError::LibloadingError(inner) => NvmlError::LibraryNotLoaded {
            path: path.into(),
            reason: inner.to_string(),
        },
        WrapperError::FailedToLoadSymbol(reason) => NvmlError::LibraryNotLoaded {
            path: path.into(),
            reason: format!("not an NVML library ({reason})"),
        },
        WrapperError::DriverNotLoaded => NvmlError::Init {
            path: path.into(),
            reason: "the NVIDIA kernel driver is not loaded".into(),
        },
        other => NvmlError::Init {
            path: path.into(),
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_codes_map_to_named_errors() {
        assert!(check("x", Some(1), 0).is_ok());
        assert!(check("x", Some(1), 15).unwrap_err().is_gpu_lost());
        let e = check("nvmlDeviceCreateGpuInstance", Some(2), 23).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nvmlDeviceCreateGpuInstance on GPU 2: insufficient resources"
        );
        assert_eq!(e.code(), Some(23));
        assert!(matches!(
            check("x", None, 3),
            Err(NvmlError::NotSupported { .. })
        ));
    }
}
