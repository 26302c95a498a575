//! Opaque NVML handles: the simulator encodes what a handle names into the pointer value itself.
//!
//! Real handles are pointers into the driver; callers only pass them back, never dereference them,
//! so an encoded integer is indistinguishable to them and needs no allocation or lifetime tracking.

const TAG_SHIFT: u32 = 40;
const TAG_DEVICE: usize = 0x6701;
const TAG_MIG: usize = 0x6702;
const TAG_GI: usize = 0x6703;
const TAG_CI: usize = 0x6704;
const TAG_EVENT_SET: usize = 0x6705;
const TAG_GPM_SAMPLE: usize = 0x6706;

/// What an NVML handle refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handle {
    Device { gpu: u32 },
    MigDevice { gpu: u32, gi: u32, ci: u32 },
    GpuInstance { gpu: u32, gi: u32 },
    ComputeInstance { gpu: u32, gi: u32, ci: u32 },
    EventSet { id: u64 },
    GpmSample { id: u64 },
    Invalid,
}

fn pack(tag: usize, gpu: u32, gi: u32, ci: u32) -> usize {
    (tag << TAG_SHIFT)
        | ((gpu as usize & 0xFFFF) << 16)
        | ((gi as usize & 0xFF) << 8)
        | (ci as usize & 0xFF)
}

/// The pointer value for a handle.
pub fn encode(handle: Handle) -> usize {
    match handle {
        Handle::Device { gpu } => pack(TAG_DEVICE, gpu, 0, 0),
        Handle::MigDevice { gpu, gi, ci } => pack(TAG_MIG, gpu, gi, ci),
        Handle::GpuInstance { gpu, gi } => pack(TAG_GI, gpu, gi, 0),
        Handle::ComputeInstance { gpu, gi, ci } => pack(TAG_CI, gpu, gi, ci),
        Handle::EventSet { id } => (TAG_EVENT_SET << TAG_SHIFT) | (id as usize & 0xFF_FFFF_FFFF),
        Handle::GpmSample { id } => (TAG_GPM_SAMPLE << TAG_SHIFT) | (id as usize & 0xFF_FFFF_FFFF),
        Handle::Invalid => 0,
    }
}

/// What a pointer value names; `Invalid` for anything this simulator did not hand out.
pub fn decode(value: usize) -> Handle {
    let gpu = ((value >> 16) & 0xFFFF) as u32;
    let gi = ((value >> 8) & 0xFF) as u32;
    let ci = (value & 0xFF) as u32;
    match value >> TAG_SHIFT {
        TAG_DEVICE if gi == 0 && ci == 0 => Handle::Device { gpu },
        TAG_MIG => Handle::MigDevice { gpu, gi, ci },
        TAG_GI if ci == 0 => Handle::GpuInstance { gpu, gi },
        TAG_CI => Handle::ComputeInstance { gpu, gi, ci },
        TAG_EVENT_SET => Handle::EventSet {
            id: (value & 0xFF_FFFF_FFFF) as u64,
        },
        TAG_GPM_SAMPLE => Handle::GpmSample {
            id: (value & 0xFF_FFFF_FFFF) as u64,
        },
        _ => Handle::Invalid,
    }
}

/// Handle pointer constructors for each NVML handle type.
pub fn device_ptr(gpu: u32) -> nvml_wrapper_sys::bindings::nvmlDevice_t {
    encode(Handle::Device { gpu }) as _
}

pub fn mig_ptr(gpu: u32, gi: u32, ci: u32) -> nvml_wrapper_sys::bindings::nvmlDevice_t {
    encode(Handle::MigDevice { gpu, gi, ci }) as _
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_invalid() {
        for h in [
            Handle::Device { gpu: 7 },
            Handle::MigDevice {
                gpu: 3,
                gi: 13,
                ci: 0,
            },
            Handle::GpuInstance { gpu: 1, gi: 2 },
            Handle::ComputeInstance {
                gpu: 0,
                gi: 0,
                ci: 4,
            },
            Handle::EventSet { id: 42 },
            Handle::GpmSample { id: 7 },
        ] {
            assert_eq!(decode(encode(h)), h);
        }
        assert_eq!(decode(0), Handle::Invalid);
        assert_eq!(decode(0xdead_beef), Handle::Invalid);
    }
}
