//! `NVML_GPU_INSTANCE_PROFILE_*` enum values (from `nvml.h`), the argument of
//! `nvmlDeviceGetGpuInstanceProfileInfo`. Not to be confused with the profile *id* NVML returns in
//! `info.id`, which is what `nvidia-smi mig -lgip` shows and differs per GPU family.

/// 1 compute slice (e.g. `1g.10gb`).
pub const GI_1_SLICE: u32 = 0x0;
/// 2 compute slices (`2g.20gb`).
pub const GI_2_SLICE: u32 = 0x1;
/// 3 compute slices (`3g.40gb`).
pub const GI_3_SLICE: u32 = 0x2;
/// 4 compute slices (`4g.40gb`).
pub const GI_4_SLICE: u32 = 0x3;
/// 7 compute slices (`7g.80gb`).
pub const GI_7_SLICE: u32 = 0x4;
/// 8 compute slices (no shipping GPU uses it yet).
pub const GI_8_SLICE: u32 = 0x5;
/// 6 compute slices (no shipping GPU uses it yet).
pub const GI_6_SLICE: u32 = 0x6;
/// 1 compute slice with media engines (`1g.10gb+me`).
pub const GI_1_SLICE_REV1: u32 = 0x7;
/// 2 compute slices with media engines (`2g.12gb+me` on A30).
pub const GI_2_SLICE_REV1: u32 = 0x8;
/// 1 compute slice with 2 memory slices (`1g.20gb` on 80GB parts, `1g.10gb` on A100 40GB).
pub const GI_1_SLICE_REV2: u32 = 0x9;
/// 1 compute slice with graphics (`+gfx`, RTX PRO Blackwell).
pub const GI_1_SLICE_GFX: u32 = 0xA;
/// 2 compute slices with graphics.
pub const GI_2_SLICE_GFX: u32 = 0xB;
/// 4 compute slices with graphics.
pub const GI_4_SLICE_GFX: u32 = 0xC;
/// 1 compute slice without media engines (`-me`).
pub const GI_1_SLICE_NO_ME: u32 = 0xD;
/// 2 compute slices without media engines.
pub const GI_2_SLICE_NO_ME: u32 = 0xE;
/// 1 compute slice with all media engines (`+me.all`).
pub const GI_1_SLICE_ALL_ME: u32 = 0xF;
/// 2 compute slices with all media engines.
pub const GI_2_SLICE_ALL_ME: u32 = 0x10;
/// 3 compute slices with graphics (newer `nvml.h`; older headers end the enum at 0x10).
pub const GI_3_SLICE_GFX: u32 = 0x11;

/// The name-suffix attributes a profile enum implies, in [`crate::ProfileName::attrs`] form:
/// `["me"]` for the REV1 variants, `["me.all"]`, `["-me"]`, `["gfx"]`, and none for plain sizes.
pub fn attrs_for_enum(nvml_enum: u32) -> &'static [&'static str] {
    match nvml_enum {
        GI_1_SLICE_REV1 | GI_2_SLICE_REV1 => &["me"],
        GI_1_SLICE_GFX | GI_2_SLICE_GFX | GI_4_SLICE_GFX | GI_3_SLICE_GFX => &["gfx"],
        GI_1_SLICE_NO_ME | GI_2_SLICE_NO_ME => &["-me"],
        GI_1_SLICE_ALL_ME | GI_2_SLICE_ALL_ME => &["me.all"],
        _ => &[],
    }
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` enum (equal to the CI profile id) for a compute instance of
/// `slices` compute slices.
pub fn ci_profile_for_slices(slices: u32) -> Option<u32> {
    match slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

#[cfg(test)]
mod ci_tests {
    #[test]
    fn ci_profiles_for_every_valid_size() {
        assert_eq!(super::ci_profile_for_slices(7), Some(4));
        assert_eq!(super::ci_profile_for_slices(6), Some(6));
        assert_eq!(super::ci_profile_for_slices(5), None);
    }
}
