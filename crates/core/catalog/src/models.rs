//! The catalog's data: one [`GpuModel`] per GPU model.
//!
//! Sources: /work/shared/reference/mig.md (geometry, placements, profile names, maxima, PCI IDs,
//! minimum drivers), `nvidia-smi mig -lgip` / `-lgipp` transcripts published with NVIDIA's MIG user
//! guide and mig-parted / gpu-operator pull requests (profile ids, SMs, engines, instance memory),
//! and `nvidia-smi --query-gpu` output seen on real hosts (NVML names, total memory).
//! `// presumed` marks a value not confirmed from such output.
//!
//! Instance memory (`memory_mib`) is `memorySizeMB` as the driver reports it; it moves by a few
//! hundred MiB between driver branches, and names do not (see `memory_gb_for_name`), so planners
//! must not depend on the exact figure.

use crate::nvml_enum::{
    GI_1_SLICE, GI_1_SLICE_ALL_ME, GI_1_SLICE_GFX, GI_1_SLICE_NO_ME, GI_1_SLICE_REV1,
    GI_1_SLICE_REV2, GI_2_SLICE, GI_2_SLICE_ALL_ME, GI_2_SLICE_GFX, GI_2_SLICE_NO_ME,
    GI_2_SLICE_REV1, GI_3_SLICE, GI_4_SLICE, GI_4_SLICE_GFX, GI_7_SLICE,
};
use crate::{Family, GiProfile, GpuModel, MigGeometry};

/// Engines a GPU instance owns: copy engines, NVDECs, NVENCs, NVJPGs, optical-flow accelerators.
#[derive(Clone, Copy)]
struct Engines {
    ce: u32,
    dec: u32,
    enc: u32,
    jpg: u32,
    ofa: u32,
}

/// Shorthand for [`Engines`] in the order `nvidia-smi mig -lgip` prints them (CE, DEC, ENC, JPEG, OFA).
const fn eng(ce: u32, dec: u32, enc: u32, jpg: u32, ofa: u32) -> Engines {
    Engines {
        ce,
        dec,
        enc,
        jpg,
        ofa,
    }
}

/// The part of a profile that is the same on every GPU of one geometry: NVML enum and id, slices,
/// instance limit and placement starts.
#[derive(Clone, Copy)]
struct Shape {
    nvml_enum: u32,
    nvml_id: u32,
    memory_slices: u32,
    compute_slices: u32,
    max_count: u32,
    placement_starts: &'static [u32],
}

/// A GI profile from its shape and the per-model figures.
const fn gi(
    name: &'static str,
    shape: Shape,
    memory_mib: u64,
    sm_count: u32,
    e: Engines,
) -> GiProfile {
    GiProfile {
        name,
        nvml_enum: shape.nvml_enum,
        nvml_id: shape.nvml_id,
        memory_slices: shape.memory_slices,
        compute_slices: shape.compute_slices,
        max_count: shape.max_count,
        placement_starts: shape.placement_starts,
        memory_mib,
        sm_count,
        copy_engines: e.ce,
        decoders: e.dec,
        encoders: e.enc,
        jpegs: e.jpg,
        ofas: e.ofa,
    }
}

// Shapes on GPUs with 8 memory slices and 7 compute slices. Ids and placements are the mig.md
// table (confirmed on A100 40/80GB, H100 80GB, H100 NVL; the H200, GH200, B200 and GB200 -lgip
// transcripts show the same ids; their placements are presumed identical).
/// `1g`: one memory slice; no 1g starts at slot 7.
const S1G: Shape = Shape {
    nvml_enum: GI_1_SLICE,
    nvml_id: 19,
    memory_slices: 1,
    compute_slices: 1,
    max_count: 7,
    placement_starts: &[0, 1, 2, 3, 4, 5, 6],
};
/// `1g+me`: like `1g`, but the media engines allow only one.
const S1G_ME: Shape = Shape {
    nvml_enum: GI_1_SLICE_REV1,
    nvml_id: 20,
    max_count: 1,
    ..S1G
};
/// `1g` with two memory slices (`1g.20gb` on 80GB parts).
const S1G_2M: Shape = Shape {
    nvml_enum: GI_1_SLICE_REV2,
    nvml_id: 15,
    memory_slices: 2,
    compute_slices: 1,
    max_count: 4,
    placement_starts: &[0, 2, 4, 6],
};
/// `2g`.
const S2G: Shape = Shape {
    nvml_enum: GI_2_SLICE,
    nvml_id: 14,
    memory_slices: 2,
    compute_slices: 2,
    max_count: 3,
    placement_starts: &[0, 2, 4],
};
/// `3g`: three compute slices but four memory slices (half the GPU).
const S3G: Shape = Shape {
    nvml_enum: GI_3_SLICE,
    nvml_id: 9,
    memory_slices: 4,
    compute_slices: 3,
    max_count: 2,
    placement_starts: &[0, 4],
};
/// `4g`: only the lower half.
const S4G: Shape = Shape {
    nvml_enum: GI_4_SLICE,
    nvml_id: 5,
    memory_slices: 4,
    compute_slices: 4,
    max_count: 1,
    placement_starts: &[0],
};
/// `7g`: the whole GPU.
const S7G: Shape = Shape {
    nvml_enum: GI_7_SLICE,
    nvml_id: 0,
    memory_slices: 8,
    compute_slices: 7,
    max_count: 1,
    placement_starts: &[0],
};

// A30 shapes: 4 memory and 4 compute slices. Ids and placements from an A30's -lgip/-lgipp
// transcript (mig.md marks the placements presumed; the transcript agrees with them).
/// A30 `1g`.
const A30_1G: Shape = Shape {
    nvml_enum: GI_1_SLICE,
    nvml_id: 14,
    memory_slices: 1,
    compute_slices: 1,
    max_count: 4,
    placement_starts: &[0, 1, 2, 3],
};
/// A30 `1g+me`.
const A30_1G_ME: Shape = Shape {
    nvml_enum: GI_1_SLICE_REV1,
    nvml_id: 21,
    max_count: 1,
    ..A30_1G
};
/// A30 `2g`.
const A30_2G: Shape = Shape {
    nvml_enum: GI_2_SLICE,
    nvml_id: 5,
    memory_slices: 2,
    compute_slices: 2,
    max_count: 2,
    placement_starts: &[0, 2],
};
/// A30 `2g+me`.
const A30_2G_ME: Shape = Shape {
    nvml_enum: GI_2_SLICE_REV1,
    nvml_id: 6,
    max_count: 1,
    ..A30_2G
};
/// A30 `4g`: the whole GPU.
const A30_4G: Shape = Shape {
    nvml_enum: GI_4_SLICE,
    nvml_id: 0,
    memory_slices: 4,
    compute_slices: 4,
    max_count: 1,
    placement_starts: &[0],
};

// RTX PRO 6000 Blackwell shapes: 4 memory and 4 compute slices like the A30, plus graphics
// (`+gfx`), all-media (`+me.all`) and no-media (`-me`) variants. Ids 14, 21, 47, 65, 5 and 0 are
// from -lgip transcripts (GoogleCloudPlatform/container-engine-accelerators #564,
// bigstack-oss/cubecos #312); the other ids are presumed. Placements are presumed the A30's.
/// RTX PRO `1g+gfx`.
const RTX_1G_GFX: Shape = Shape {
    nvml_enum: GI_1_SLICE_GFX,
    nvml_id: 47,
    ..A30_1G
};
/// RTX PRO `1g+me.all`: every media engine, so only one.
const RTX_1G_ALL_ME: Shape = Shape {
    nvml_enum: GI_1_SLICE_ALL_ME,
    nvml_id: 65,
    max_count: 1,
    ..A30_1G
};
/// RTX PRO `1g-me`.
const RTX_1G_NO_ME: Shape = Shape {
    nvml_enum: GI_1_SLICE_NO_ME,
    nvml_id: 67, // presumed
    ..A30_1G
};
/// RTX PRO `2g+gfx`.
const RTX_2G_GFX: Shape = Shape {
    nvml_enum: GI_2_SLICE_GFX,
    nvml_id: 35, // presumed
    ..A30_2G
};
/// RTX PRO `2g+me.all`.
const RTX_2G_ALL_ME: Shape = Shape {
    nvml_enum: GI_2_SLICE_ALL_ME,
    nvml_id: 64, // presumed
    max_count: 1,
    ..A30_2G
};
/// RTX PRO `2g-me`.
const RTX_2G_NO_ME: Shape = Shape {
    nvml_enum: GI_2_SLICE_NO_ME,
    nvml_id: 66, // presumed
    ..A30_2G
};
/// RTX PRO `4g+gfx`: the whole GPU with graphics.
const RTX_4G_GFX: Shape = Shape {
    nvml_enum: GI_4_SLICE_GFX,
    nvml_id: 32, // presumed
    ..A30_4G
};

/// A100 40GB (SXM4 and PCIe). Memory from an R525+ -lgip (4.75/9.62/19.50/39.25 GiB); the PCIe
/// card is presumed to report the same.
const A100_40GB_PROFILES: &[GiProfile] = &[
    gi("1g.5gb", S1G, 4864, 14, eng(1, 0, 0, 0, 0)),
    gi("1g.5gb+me", S1G_ME, 4864, 14, eng(1, 1, 0, 1, 1)),
    // Needs R525 or later.
    gi("1g.10gb", S1G_2M, 9856, 14, eng(1, 1, 0, 0, 0)),
    gi("2g.10gb", S2G, 9856, 28, eng(2, 1, 0, 0, 0)),
    gi("3g.20gb", S3G, 19968, 42, eng(3, 2, 0, 0, 0)),
    gi("4g.20gb", S4G, 19968, 56, eng(4, 2, 0, 0, 0)),
    gi("7g.40gb", S7G, 40192, 98, eng(7, 5, 0, 1, 1)),
];

/// A100 80GB (SXM4 and PCIe). Memory from -lgip (9.50/19.50/39.25/79.00 GiB); SMs and engines as
/// on the 40GB part.
const A100_80GB_PROFILES: &[GiProfile] = &[
    gi("1g.10gb", S1G, 9728, 14, eng(1, 0, 0, 0, 0)),
    gi("1g.10gb+me", S1G_ME, 9728, 14, eng(1, 1, 0, 1, 1)),
    gi("1g.20gb", S1G_2M, 19968, 14, eng(1, 1, 0, 0, 0)),
    gi("2g.20gb", S2G, 19968, 28, eng(2, 1, 0, 0, 0)),
    gi("3g.40gb", S3G, 40192, 42, eng(3, 2, 0, 0, 0)),
    gi("4g.40gb", S4G, 40192, 56, eng(4, 2, 0, 0, 0)),
    gi("7g.80gb", S7G, 80896, 98, eng(7, 5, 0, 1, 1)),
];

/// A30 24GB, from -lgip (5.81/11.69/23.44 GiB). NVML gives the plain 1g one decoder even though
/// the user guide's table says none.
const A30_PROFILES: &[GiProfile] = &[
    gi("1g.6gb", A30_1G, 5952, 14, eng(1, 1, 0, 0, 0)),
    gi("1g.6gb+me", A30_1G_ME, 5952, 14, eng(1, 1, 0, 1, 1)),
    gi("2g.12gb", A30_2G, 11968, 28, eng(2, 2, 0, 0, 0)),
    // Needs R525 or later.
    gi("2g.12gb+me", A30_2G_ME, 11968, 28, eng(2, 2, 0, 1, 1)),
    gi("4g.24gb", A30_4G, 24000, 56, eng(4, 4, 0, 1, 1)),
];

/// H100 SXM5 80GB, from -lgip (9.75/19.62/39.50/79.25 GiB). The 2-memory-slice 1g gets 26 SMs,
/// not 16.
const H100_SXM5_80GB_PROFILES: &[GiProfile] = &[
    gi("1g.10gb", S1G, 9984, 16, eng(1, 1, 0, 1, 0)),
    gi("1g.10gb+me", S1G_ME, 9984, 16, eng(1, 1, 0, 1, 1)),
    gi("1g.20gb", S1G_2M, 20096, 26, eng(1, 1, 0, 1, 0)),
    gi("2g.20gb", S2G, 20096, 32, eng(2, 2, 0, 2, 0)),
    gi("3g.40gb", S3G, 40448, 60, eng(3, 3, 0, 3, 0)),
    gi("4g.40gb", S4G, 40448, 64, eng(4, 4, 0, 4, 0)),
    gi("7g.80gb", S7G, 81152, 132, eng(8, 7, 0, 7, 1)),
];

/// H100 PCIe 80GB, from -lgip: same memory and engines as SXM5, fewer SMs (114 in all).
const H100_PCIE_80GB_PROFILES: &[GiProfile] = &[
    gi("1g.10gb", S1G, 9984, 14, eng(1, 1, 0, 1, 0)),
    gi("1g.10gb+me", S1G_ME, 9984, 14, eng(1, 1, 0, 1, 1)),
    gi("1g.20gb", S1G_2M, 20096, 14, eng(1, 1, 0, 1, 0)),
    gi("2g.20gb", S2G, 20096, 30, eng(2, 2, 0, 2, 0)),
    gi("3g.40gb", S3G, 40448, 46, eng(3, 3, 0, 3, 0)),
    gi("4g.40gb", S4G, 40448, 62, eng(4, 4, 0, 4, 0)),
    gi("7g.80gb", S7G, 81152, 114, eng(8, 7, 0, 7, 1)),
];

/// H100 NVL 94GB, from -lgip (10.62/21.50/46.12/92.62 GiB).
const H100_NVL_PROFILES: &[GiProfile] = &[
    gi("1g.12gb", S1G, 10880, 16, eng(1, 1, 0, 1, 0)),
    gi("1g.12gb+me", S1G_ME, 10880, 16, eng(1, 1, 0, 1, 1)),
    gi("1g.24gb", S1G_2M, 22016, 26, eng(1, 1, 0, 1, 0)),
    gi("2g.24gb", S2G, 22016, 32, eng(2, 2, 0, 2, 0)),
    gi("3g.47gb", S3G, 47232, 60, eng(3, 3, 0, 3, 0)),
    gi("4g.47gb", S4G, 47232, 64, eng(4, 4, 0, 4, 0)),
    gi("7g.94gb", S7G, 94848, 132, eng(8, 7, 0, 7, 1)),
];

/// H200 141GB, from mig-parted #120's -lgip (16.00/32.25/69.50/139.75 GiB). The H200 NVL is
/// presumed to report the same.
const H200_PROFILES: &[GiProfile] = &[
    gi("1g.18gb", S1G, 16384, 16, eng(1, 1, 0, 1, 0)),
    gi("1g.18gb+me", S1G_ME, 16384, 16, eng(1, 1, 0, 1, 1)),
    gi("1g.35gb", S1G_2M, 33024, 26, eng(1, 1, 0, 1, 0)),
    gi("2g.35gb", S2G, 33024, 32, eng(2, 2, 0, 2, 0)),
    gi("3g.71gb", S3G, 71168, 60, eng(3, 3, 0, 3, 0)),
    gi("4g.71gb", S4G, 71168, 64, eng(4, 4, 0, 4, 0)),
    gi("7g.141gb", S7G, 143104, 132, eng(8, 7, 0, 7, 1)),
];

/// GH200 with 96GB HBM3 ("GH200 480GB"), from -lgip (11.00/23.00/46.50/93.00 GiB). mig.md omits
/// `1g.12gb+me`; the transcript shows it.
const GH200_96GB_PROFILES: &[GiProfile] = &[
    gi("1g.12gb", S1G, 11264, 16, eng(1, 1, 0, 1, 0)),
    gi("1g.12gb+me", S1G_ME, 11264, 16, eng(1, 1, 0, 1, 1)),
    gi("1g.24gb", S1G_2M, 23552, 26, eng(1, 1, 0, 1, 0)),
    gi("2g.24gb", S2G, 23552, 32, eng(2, 2, 0, 2, 0)),
    gi("3g.48gb", S3G, 47616, 60, eng(3, 3, 0, 3, 0)),
    gi("4g.48gb", S4G, 47616, 64, eng(4, 4, 0, 4, 0)),
    gi("7g.96gb", S7G, 95232, 132, eng(8, 7, 0, 7, 1)),
];

/// GH200 144GB HBM3e, from mig-parted #139's -lgip for the 1g and 2g rows (17.50/35.25 GiB).
/// mig.md omits `1g.18gb+me`; the transcript shows it.
const GH200_144GB_PROFILES: &[GiProfile] = &[
    gi("1g.18gb", S1G, 17920, 16, eng(1, 1, 0, 1, 0)),
    gi("1g.18gb+me", S1G_ME, 17920, 16, eng(1, 1, 0, 1, 1)),
    gi("1g.36gb", S1G_2M, 36096, 26, eng(1, 1, 0, 1, 0)),
    gi("2g.36gb", S2G, 36096, 32, eng(2, 2, 0, 2, 0)),
    // presumed: memory (70.75 / 142.50 GiB), SMs and engines as on H200.
    gi("3g.72gb", S3G, 72448, 60, eng(3, 3, 0, 3, 0)),
    gi("4g.72gb", S4G, 72448, 64, eng(4, 4, 0, 4, 0)),
    gi("7g.144gb", S7G, 145920, 132, eng(8, 7, 0, 7, 1)),
];

/// B200 180GB, from mig-parted #187's -lgip for the 1g and 2g rows (20.50/44.25 GiB; an earlier
/// driver showed 22.00 for 1g). Copy engines of 3g/4g/7g from NVIDIA's B200 profile table.
const B200_PROFILES: &[GiProfile] = &[
    gi("1g.23gb", S1G, 20992, 18, eng(2, 1, 0, 1, 0)),
    gi("1g.23gb+me", S1G_ME, 20992, 18, eng(2, 1, 0, 1, 1)),
    gi("1g.45gb", S1G_2M, 45312, 30, eng(2, 1, 0, 1, 0)),
    gi("2g.45gb", S2G, 45312, 36, eng(4, 2, 0, 2, 0)),
    // presumed: memory (89.25 / 178.50 GiB), SMs, decoders and JPEG engines.
    gi("3g.90gb", S3G, 91392, 66, eng(6, 3, 0, 3, 0)),
    gi("4g.90gb", S4G, 91392, 72, eng(8, 4, 0, 4, 0)),
    gi("7g.180gb", S7G, 182784, 148, eng(16, 7, 0, 7, 1)),
];

/// GB200 186GB, from mig-parted #227's -lgip (production boards) for the 1g and 2g rows
/// (22.00/45.50 GiB). mig.md omits `1g.23gb+me`; the transcript shows it.
const GB200_PROFILES: &[GiProfile] = &[
    gi("1g.23gb", S1G, 22528, 18, eng(2, 1, 0, 1, 0)),
    gi("1g.23gb+me", S1G_ME, 22528, 18, eng(2, 1, 0, 1, 1)),
    gi("1g.47gb", S1G_2M, 46592, 32, eng(2, 1, 0, 1, 0)),
    gi("2g.47gb", S2G, 46592, 38, eng(4, 2, 0, 2, 0)),
    // presumed: memory (92.00 / 184.00 GiB), SMs and engines, by analogy with B200.
    gi("3g.93gb", S3G, 94208, 68, eng(6, 3, 0, 3, 0)),
    gi("4g.93gb", S4G, 94208, 76, eng(8, 4, 0, 4, 0)),
    gi("7g.186gb", S7G, 188416, 152, eng(16, 7, 0, 7, 1)),
];

/// GB200 as pre-production HGX GB200 boards reported it (189 GiB in all), from the -lgip in
/// mig-parted #175 / gpu-operator #1303 for the 1g and 2g rows (20.00/45.50 GiB); NVIDIA's
/// default config still ships its `3g.95gb`, `4g.95gb` and `7g.189gb` configs. Production
/// boards report [`GB200_PROFILES`] (mig-parted #227/#228).
const GB200_189GB_PROFILES: &[GiProfile] = &[
    gi("1g.24gb", S1G, 20480, 18, eng(2, 1, 0, 1, 0)),
    gi("1g.24gb+me", S1G_ME, 20480, 18, eng(2, 1, 0, 1, 1)),
    gi("1g.47gb", S1G_2M, 46592, 32, eng(2, 1, 0, 1, 0)),
    gi("2g.47gb", S2G, 46592, 38, eng(4, 2, 0, 2, 0)),
    // presumed: memory (93.25 / 186.50 GiB), SMs and engines, as on production GB200.
    gi("3g.95gb", S3G, 95488, 68, eng(6, 3, 0, 3, 0)),
    gi("4g.95gb", S4G, 95488, 76, eng(8, 4, 0, 4, 0)),
    gi("7g.189gb", S7G, 190976, 152, eng(16, 7, 0, 7, 1)),
];

/// B300 (Blackwell Ultra, 288GB HBM3e). NVIDIA's default config (mig-parted #47c56d9) gives the
/// names 1g.34gb ×7, 1g.34gb+me, 1g.67gb ×4, 2g.67gb ×3, 3g.135gb ×2, 4g.135gb and 7g.269gb, which
/// fix total memory to 268-269 GiB.
/// presumed: every figure below other than the names and maxima (memory just under an eighth
/// per slice, SMs and engines as on B200).
const B300_PROFILES: &[GiProfile] = &[
    gi("1g.34gb", S1G, 33792, 18, eng(2, 1, 0, 1, 0)),
    gi("1g.34gb+me", S1G_ME, 33792, 18, eng(2, 1, 0, 1, 1)),
    gi("1g.67gb", S1G_2M, 67840, 30, eng(2, 1, 0, 1, 0)),
    gi("2g.67gb", S2G, 67840, 36, eng(4, 2, 0, 2, 0)),
    gi("3g.135gb", S3G, 135936, 66, eng(6, 3, 0, 3, 0)),
    gi("4g.135gb", S4G, 135936, 72, eng(8, 4, 0, 4, 0)),
    gi("7g.269gb", S7G, 272128, 148, eng(16, 7, 0, 7, 1)),
];

/// GB300 (Grace Blackwell Ultra). NVIDIA's default config (mig-parted #7544911) names 1g.35gb ×7,
/// 1g.35gb+me, 1g.70gb ×4, 2g.70gb ×3, 3g.139gb ×2, 4g.139gb and 7g.278gb: 277-278 GiB in all.
/// presumed: every figure below other than the names and maxima (memory just under an eighth
/// per slice, SMs and engines as on GB200).
const GB300_PROFILES: &[GiProfile] = &[
    gi("1g.35gb", S1G, 35072, 18, eng(2, 1, 0, 1, 0)),
    gi("1g.35gb+me", S1G_ME, 35072, 18, eng(2, 1, 0, 1, 1)),
    gi("1g.70gb", S1G_2M, 70400, 32, eng(2, 1, 0, 1, 0)),
    gi("2g.70gb", S2G, 70400, 38, eng(4, 2, 0, 2, 0)),
    gi("3g.139gb", S3G, 140800, 68, eng(6, 3, 0, 3, 0)),
    gi("4g.139gb", S4G, 140800, 76, eng(8, 4, 0, 4, 0)),
    gi("7g.278gb", S7G, 281600, 152, eng(16, 7, 0, 7, 1)),
];

/// RTX PRO 6000 Blackwell Server Edition (96GB GDDR7). The 1g rows' memory (23.62 GiB), SMs (46)
/// and engines (1 CE, 1 NVDEC, 1 NVENC, 1 NVJPG; +me adds the OFA) are from a -lgip transcript
/// (GoogleCloudPlatform/container-engine-accelerators #564); names and maxima from NVIDIA's
/// default config and MIG user guide.
/// presumed: 2g/4g memory and SMs, and the `+me.all`/`-me` engine counts (all / none).
const RTX_PRO_6000_PROFILES: &[GiProfile] = &[
    gi("1g.24gb", A30_1G, 24186, 46, eng(1, 1, 1, 1, 0)),
    gi("1g.24gb+me", A30_1G_ME, 24186, 46, eng(1, 1, 1, 1, 1)),
    gi("1g.24gb+gfx", RTX_1G_GFX, 24186, 46, eng(1, 1, 1, 1, 0)),
    gi(
        "1g.24gb+me.all",
        RTX_1G_ALL_ME,
        24186,
        46,
        eng(1, 4, 4, 4, 1),
    ),
    gi("1g.24gb-me", RTX_1G_NO_ME, 24186, 46, eng(1, 0, 0, 0, 0)),
    gi("2g.48gb", A30_2G, 48384, 94, eng(2, 2, 2, 2, 0)),
    gi("2g.48gb+gfx", RTX_2G_GFX, 48384, 94, eng(2, 2, 2, 2, 0)),
    gi(
        "2g.48gb+me.all",
        RTX_2G_ALL_ME,
        48384,
        94,
        eng(2, 4, 4, 4, 1),
    ),
    gi("2g.48gb-me", RTX_2G_NO_ME, 48384, 94, eng(2, 0, 0, 0, 0)),
    gi("4g.96gb", A30_4G, 96768, 188, eng(4, 4, 4, 4, 1)),
    gi("4g.96gb+gfx", RTX_4G_GFX, 96768, 188, eng(4, 4, 4, 4, 1)),
];

/// H100 96GB, named with GH200 96GB, H20 and PG506-96GB in NVIDIA's default config (the 96GB
/// `all-balanced` entry: 1g.12gb, 1g.24gb, 2g.24gb, 3g.48gb, 4g.48gb, 7g.96gb). presumed: memory,
/// SMs and engines as on GH200 96GB (the same H100 die and HBM3 stack).
const H100_96GB_PROFILES: &[GiProfile] = GH200_96GB_PROFILES;

/// H20 96GB: GH200 96GB's names and memory. presumed: memory as on GH200 96GB; SMs scaled to the
/// H20's 78 and engines as on H100.
const H20_PROFILES: &[GiProfile] = &[
    gi("1g.12gb", S1G, 11264, 10, eng(1, 1, 0, 1, 0)),
    gi("1g.12gb+me", S1G_ME, 11264, 10, eng(1, 1, 0, 1, 1)),
    gi("1g.24gb", S1G_2M, 23552, 16, eng(1, 1, 0, 1, 0)),
    gi("2g.24gb", S2G, 23552, 20, eng(2, 2, 0, 2, 0)),
    gi("3g.48gb", S3G, 47616, 32, eng(3, 3, 0, 3, 0)),
    gi("4g.48gb", S4G, 47616, 40, eng(4, 4, 0, 4, 0)),
    gi("7g.96gb", S7G, 95232, 78, eng(8, 7, 0, 7, 1)),
];

/// PG506-96GB (PCI 0x20B6, an A100-class board with 96GB), listed with the 96GB parts in NVIDIA's
/// default config. presumed: memory as GH200 96GB, SMs and engines as A100.
const PG506_96GB_PROFILES: &[GiProfile] = &[
    gi("1g.12gb", S1G, 11264, 14, eng(1, 0, 0, 0, 0)),
    gi("1g.12gb+me", S1G_ME, 11264, 14, eng(1, 1, 0, 1, 1)),
    gi("1g.24gb", S1G_2M, 23552, 14, eng(1, 1, 0, 0, 0)),
    gi("2g.24gb", S2G, 23552, 28, eng(2, 1, 0, 0, 0)),
    gi("3g.48gb", S3G, 47616, 42, eng(3, 2, 0, 0, 0)),
    gi("4g.48gb", S4G, 47616, 56, eng(4, 2, 0, 0, 0)),
    gi("7g.96gb", S7G, 95232, 98, eng(7, 5, 0, 1, 1)),
];

/// MIG geometry of an Ampere part with 8 memory slices (mode stored in InfoROM).
const fn ampere(gi_profiles: &'static [GiProfile]) -> Option<MigGeometry> {
    Some(MigGeometry {
        memory_slices: 8,
        compute_slices: 7,
        mode_persists_across_reload: true,
        gi_profiles,
    })
}

/// MIG geometry of a Hopper or Blackwell part (mode lost on driver reload).
const fn hopper_or_later(gi_profiles: &'static [GiProfile]) -> Option<MigGeometry> {
    Some(MigGeometry {
        memory_slices: 8,
        compute_slices: 7,
        mode_persists_across_reload: false,
        gi_profiles,
    })
}

/// MIG geometry of a Blackwell part with 4 memory and 4 compute slices (RTX PRO Blackwell;
/// presumed to lose MIG mode on driver reload like the other Blackwell parts).
const fn four_slice_blackwell(gi_profiles: &'static [GiProfile]) -> Option<MigGeometry> {
    Some(MigGeometry {
        memory_slices: 4,
        compute_slices: 4,
        mode_persists_across_reload: false,
        gi_profiles,
    })
}

/// Every model the catalog knows, in the order `known_keys` lists them.
///
/// Power limits are the default limits in mW; clocks are the maximum SM / memory clocks.
pub static MODELS: &[GpuModel] = &[
    GpuModel {
        key: "A100-SXM4-40GB",
        nvml_name: "NVIDIA A100-SXM4-40GB",
        // 0x20B0 A100 SXM4 40GB.
        pci_device_ids: &[0x20B0],
        // Some hosts (e.g. AWS p4d) report 40536; the name rule gives the same profile names.
        memory_mib: 40960,
        sm_count: 108,
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 450,
        power_limit_mw: 400_000, // presumed
        max_sm_clock_mhz: 1410,  // presumed
        max_mem_clock_mhz: 1215, // presumed
        nvlinks: 12,
        mig: ampere(A100_40GB_PROFILES),
    },
    GpuModel {
        key: "A100-PCIE-40GB",
        nvml_name: "NVIDIA A100-PCIE-40GB",
        // 0x20B1/0x20F1 A100 PCIe 40GB; 0x20F6 (A800 40GB PCIe, presumed) is in mig.md's A100-40 list.
        pci_device_ids: &[0x20B1, 0x20F1, 0x20F6],
        memory_mib: 40960,
        sm_count: 108,
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 450,
        power_limit_mw: 250_000, // presumed
        max_sm_clock_mhz: 1410,  // presumed
        max_mem_clock_mhz: 1215, // presumed
        // A PCIe card; an optional NVLink bridge is not assumed.
        nvlinks: 0,
        mig: ampere(A100_40GB_PROFILES),
    },
    GpuModel {
        key: "A100-SXM4-80GB",
        nvml_name: "NVIDIA A100-SXM4-80GB",
        // 0x20B2 A100 SXM4 80GB; 0x20F3 (A800 SXM4 80GB, presumed) is in mig.md's A100-80 list.
        pci_device_ids: &[0x20B2, 0x20F3],
        memory_mib: 81920,
        sm_count: 108,
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 450,
        power_limit_mw: 400_000, // presumed
        max_sm_clock_mhz: 1410,  // presumed
        max_mem_clock_mhz: 1593, // presumed
        nvlinks: 12,
        mig: ampere(A100_80GB_PROFILES),
    },
    GpuModel {
        key: "A100-PCIE-80GB",
        nvml_name: "NVIDIA A100 80GB PCIe",
        // 0x20B5 A100 PCIe 80GB; 0x20F5 (A800 80GB PCIe, presumed) is in mig.md's A100-80 list.
        pci_device_ids: &[0x20B5, 0x20F5],
        memory_mib: 81920,
        sm_count: 108,
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 450,
        power_limit_mw: 300_000, // presumed
        max_sm_clock_mhz: 1410,  // presumed
        max_mem_clock_mhz: 1512, // presumed
        nvlinks: 0,
        mig: ampere(A100_80GB_PROFILES),
    },
    GpuModel {
        key: "A30",
        nvml_name: "NVIDIA A30",
        pci_device_ids: &[0x20B7],
        memory_mib: 24576,
        sm_count: 56,
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 460,
        power_limit_mw: 165_000, // presumed
        max_sm_clock_mhz: 1440,  // presumed
        max_mem_clock_mhz: 1215, // presumed
        nvlinks: 0,
        mig: Some(MigGeometry {
            memory_slices: 4,
            compute_slices: 4,
            mode_persists_across_reload: true,
            gi_profiles: A30_PROFILES,
        }),
    },
    GpuModel {
        key: "H100-SXM5-80GB",
        nvml_name: "NVIDIA H100 80GB HBM3",
        // 0x2330 H100 SXM5 80GB; 0x2324 (H800 SXM5) is in mig.md's H100-80 list.
        pci_device_ids: &[0x2330, 0x2324],
        memory_mib: 81559,
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 525,
        power_limit_mw: 700_000,
        max_sm_clock_mhz: 1980,
        max_mem_clock_mhz: 2619,
        nvlinks: 18,
        mig: hopper_or_later(H100_SXM5_80GB_PROFILES),
    },
    GpuModel {
        key: "H100-PCIE-80GB",
        nvml_name: "NVIDIA H100 PCIe",
        // 0x2331 H100 PCIe; 0x2322 (H800 PCIe) is in mig.md's H100-80 list.
        pci_device_ids: &[0x2331, 0x2322],
        memory_mib: 81559,
        sm_count: 114,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 525,
        power_limit_mw: 350_000,
        max_sm_clock_mhz: 1755,  // presumed
        max_mem_clock_mhz: 1593, // presumed
        nvlinks: 0,
        mig: hopper_or_later(H100_PCIE_80GB_PROFILES),
    },
    GpuModel {
        key: "H100-NVL",
        nvml_name: "NVIDIA H100 NVL",
        // 0x2321 H100 NVL (H100L 94GB); 0x233A (H800 NVL) per mig.md.
        pci_device_ids: &[0x2321, 0x233A],
        memory_mib: 95830,
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 525,   // presumed (mig.md gives R525 for H100)
        power_limit_mw: 400_000, // presumed
        max_sm_clock_mhz: 1785,  // presumed
        max_mem_clock_mhz: 2619, // presumed
        // Sold in pairs with NVLink bridges.
        nvlinks: 12, // presumed
        mig: hopper_or_later(H100_NVL_PROFILES),
    },
    GpuModel {
        key: "H200",
        nvml_name: "NVIDIA H200",
        // 0x2335 H200 SXM 141GB (the NVL, 0x233B, is its own entry).
        pci_device_ids: &[0x2335],
        memory_mib: 143771,
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 550,
        power_limit_mw: 700_000, // presumed
        max_sm_clock_mhz: 1980,  // presumed
        max_mem_clock_mhz: 3201, // presumed
        nvlinks: 18,
        mig: hopper_or_later(H200_PROFILES),
    },
    GpuModel {
        key: "H200-NVL",
        nvml_name: "NVIDIA H200 NVL",
        pci_device_ids: &[0x233B],
        memory_mib: 143771, // presumed (same HBM as H200 SXM)
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 550,
        power_limit_mw: 600_000, // presumed
        max_sm_clock_mhz: 1785,  // presumed
        max_mem_clock_mhz: 3201, // presumed
        nvlinks: 18,             // presumed (NVLink bridge)
        mig: hopper_or_later(H200_PROFILES),
    },
    GpuModel {
        key: "GH200",
        // The Grace Hopper superchip with 96GB HBM3; "480GB" is its CPU memory.
        nvml_name: "NVIDIA GH200 480GB",
        pci_device_ids: &[0x2342],
        memory_mib: 97871,
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 535,   // presumed
        power_limit_mw: 900_000, // presumed
        max_sm_clock_mhz: 1980,  // presumed
        max_mem_clock_mhz: 2619, // presumed
        nvlinks: 18,             // presumed
        mig: hopper_or_later(GH200_96GB_PROFILES),
    },
    GpuModel {
        key: "GH200-144GB",
        nvml_name: "NVIDIA GH200 144G HBM3e",
        pci_device_ids: &[0x2348],
        memory_mib: 146831,
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 550,   // presumed
        power_limit_mw: 900_000, // presumed
        max_sm_clock_mhz: 1980,
        max_mem_clock_mhz: 2619, // presumed
        // Two GH200 144G on one host show NV18 in `nvidia-smi topo -m`.
        nvlinks: 18,
        mig: hopper_or_later(GH200_144GB_PROFILES),
    },
    GpuModel {
        key: "B200",
        nvml_name: "NVIDIA B200",
        pci_device_ids: &[0x2901],
        memory_mib: 183359,
        sm_count: 148,
        compute_capability: (10, 0),
        family: Family::Blackwell,
        min_driver_major: 570,
        power_limit_mw: 1_000_000,
        max_sm_clock_mhz: 1965,
        max_mem_clock_mhz: 3996, // presumed
        nvlinks: 18,
        mig: hopper_or_later(B200_PROFILES),
    },
    GpuModel {
        key: "GB200",
        nvml_name: "NVIDIA GB200",
        pci_device_ids: &[0x2941],
        memory_mib: 189471,
        sm_count: 152,
        compute_capability: (10, 0),
        family: Family::Blackwell,
        min_driver_major: 570,     // presumed (as B200)
        power_limit_mw: 1_200_000, // presumed
        max_sm_clock_mhz: 2062,    // presumed
        max_mem_clock_mhz: 3996,
        nvlinks: 18,
        mig: hopper_or_later(GB200_PROFILES),
    },
    GpuModel {
        // Listed after GB200 so the shared PCI id and NVML name resolve to the production board.
        key: "GB200-189GB",
        nvml_name: "NVIDIA GB200",
        pci_device_ids: &[0x2941],
        memory_mib: 193024, // presumed (188.50 GiB: the 189 in 7g.189gb)
        sm_count: 152,
        compute_capability: (10, 0),
        family: Family::Blackwell,
        min_driver_major: 570,     // presumed (as B200)
        power_limit_mw: 1_200_000, // presumed
        max_sm_clock_mhz: 2062,    // presumed
        max_mem_clock_mhz: 3996,   // presumed
        nvlinks: 18,
        mig: hopper_or_later(GB200_189GB_PROFILES),
    },
    GpuModel {
        key: "B300",
        nvml_name: "NVIDIA B300 SXM6 AC", // presumed
        // 0x3182, the id NVIDIA's default config filters B300 by.
        pci_device_ids: &[0x3182],
        memory_mib: 275040, // presumed (268.59 GiB: the 269 in 7g.269gb)
        sm_count: 148,      // presumed
        compute_capability: (10, 3),
        family: Family::Blackwell,
        min_driver_major: 580,     // presumed
        power_limit_mw: 1_100_000, // presumed
        max_sm_clock_mhz: 2032,    // presumed
        max_mem_clock_mhz: 3996,   // presumed
        nvlinks: 18,
        mig: hopper_or_later(B300_PROFILES),
    },
    GpuModel {
        key: "GB300",
        nvml_name: "NVIDIA GB300", // presumed
        // 0x31C2, the id NVIDIA's default config filters GB300 by.
        pci_device_ids: &[0x31C2],
        memory_mib: 284672, // presumed (278 GiB: the 278 in 7g.278gb)
        sm_count: 152,      // presumed
        compute_capability: (10, 3),
        family: Family::Blackwell,
        min_driver_major: 580,     // presumed
        power_limit_mw: 1_400_000, // presumed
        max_sm_clock_mhz: 2062,    // presumed
        max_mem_clock_mhz: 3996,   // presumed
        nvlinks: 18,
        mig: hopper_or_later(GB300_PROFILES),
    },
    GpuModel {
        key: "RTX-PRO-6000-BSE",
        nvml_name: "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        // 0x2BB5, the id NVIDIA's default config filters it by.
        pci_device_ids: &[0x2BB5],
        memory_mib: 97887,
        sm_count: 188,
        compute_capability: (12, 0),
        family: Family::Blackwell,
        min_driver_major: 575,    // presumed
        power_limit_mw: 600_000,  // presumed
        max_sm_clock_mhz: 2617,   // presumed
        max_mem_clock_mhz: 14001, // presumed
        nvlinks: 0,
        mig: four_slice_blackwell(RTX_PRO_6000_PROFILES),
    },
    GpuModel {
        key: "H100-96GB",
        nvml_name: "NVIDIA H100 96GB HBM3", // presumed
        // 0x233D, in NVIDIA's default config's 96GB group.
        pci_device_ids: &[0x233D],
        memory_mib: 97871, // presumed (as GH200 96GB)
        sm_count: 132,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 525,   // presumed (as H100)
        power_limit_mw: 700_000, // presumed
        max_sm_clock_mhz: 1980,  // presumed
        max_mem_clock_mhz: 2619, // presumed
        nvlinks: 18,             // presumed
        mig: hopper_or_later(H100_96GB_PROFILES),
    },
    GpuModel {
        key: "H20",
        nvml_name: "NVIDIA H20",
        // 0x2329, in NVIDIA's default config's 96GB group.
        pci_device_ids: &[0x2329],
        memory_mib: 97871, // presumed (as GH200 96GB)
        sm_count: 78,
        compute_capability: (9, 0),
        family: Family::Hopper,
        min_driver_major: 535,   // presumed
        power_limit_mw: 400_000, // presumed
        max_sm_clock_mhz: 1980,  // presumed
        max_mem_clock_mhz: 2619, // presumed
        nvlinks: 18,             // presumed
        mig: hopper_or_later(H20_PROFILES),
    },
    GpuModel {
        key: "PG506-96GB",
        nvml_name: "NVIDIA PG506-96GB", // presumed
        // 0x20B6, in NVIDIA's default config's 96GB group.
        pci_device_ids: &[0x20B6],
        memory_mib: 97871, // presumed
        sm_count: 108,     // presumed (A100)
        compute_capability: (8, 0),
        family: Family::Ampere,
        min_driver_major: 450,   // presumed (A100)
        power_limit_mw: 400_000, // presumed
        max_sm_clock_mhz: 1410,  // presumed
        max_mem_clock_mhz: 1593, // presumed
        nvlinks: 12,             // presumed
        mig: ampere(PG506_96GB_PROFILES),
    },
    GpuModel {
        key: "L4",
        nvml_name: "NVIDIA L4",
        pci_device_ids: &[0x27B8],
        memory_mib: 23034,
        sm_count: 58,
        compute_capability: (8, 9),
        family: Family::AdaLovelace,
        min_driver_major: 525,
        power_limit_mw: 72_000,
        max_sm_clock_mhz: 2040,  // presumed
        max_mem_clock_mhz: 6251, // presumed
        nvlinks: 0,
        mig: None,
    },
    GpuModel {
        key: "A10",
        nvml_name: "NVIDIA A10",
        pci_device_ids: &[0x2236],
        memory_mib: 23028,
        sm_count: 72,
        compute_capability: (8, 6),
        family: Family::Ampere,
        min_driver_major: 460,
        power_limit_mw: 150_000,
        max_sm_clock_mhz: 1695,  // presumed
        max_mem_clock_mhz: 6251, // presumed
        nvlinks: 0,
        mig: None,
    },
];
