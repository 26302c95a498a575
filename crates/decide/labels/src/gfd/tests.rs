//! GFD label sets for hand-written nodes, each compared with the whole map NVIDIA's GFD writes.

use super::*;
use gpuops_inventory::{Gpu, Memory, MigDevice, MigState};
use gpuops_resources::Overrides;

const DRIVER: &str = "580.105.08";
const CUDA: &str = "13.0";
const TS: i64 = 1_760_000_000;

fn uuid(i: u32) -> String {
    format!("GPU-{i:08x}-1111-2222-3333-444444444444")
}

fn gpu(i: u32, name: &str, model: &str, mib: u64, cc: (u32, u32), mig_capable: bool) -> Gpu {
    Gpu {
        index: i,
        uuid: uuid(i),
        name: name.into(),
        model: Some(model.into()),
        memory: Memory {
            total_mib: mib,
            ..Memory::default()
        },
        compute_capability: Some(cc),
        mig: MigState {
            capable: mig_capable,
            ..MigState::default()
        },
        pci_class: Some(PCI_CLASS_3D_CONTROLLER),
        ..Gpu::default()
    }
}

fn h100(i: u32) -> Gpu {
    gpu(
        i,
        "NVIDIA H100 80GB HBM3",
        "H100-SXM5-80GB",
        81559,
        (9, 0),
        true,
    )
}

fn a100(i: u32) -> Gpu {
    gpu(
        i,
        "NVIDIA A100-SXM4-80GB",
        "A100-SXM4-80GB",
        81920,
        (8, 0),
        true,
    )
}

/// MIG enabled, one MIG device per profile, figures from the catalog as NVML reports them.
fn with_mig(mut g: Gpu, profiles: &[&str]) -> Gpu {
    let model = gpuops_catalog::lookup(g.model.as_deref().unwrap()).unwrap();
    g.mig.current_enabled = true;
    g.mig.pending_enabled = true;
    g.mig_devices = profiles
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let info = model.gi_profile(p).unwrap();
            let j = j as u32;
            MigDevice {
                uuid: format!("MIG-{:04x}{j:04x}-aaaa-bbbb-cccc-dddddddddddd", g.index),
                index: j,
                gi_id: j + 1,
                ci_id: 0,
                profile: (*p).into(),
                ci_profile: (*p).into(),
                gi_profile_id: info.nvml_id,
                memory_mib: info.memory_mib,
                sm_count: info.sm_count,
                gi_slices: info.compute_slices,
                ci_slices: info.compute_slices,
                ..MigDevice::default()
            }
        })
        .collect();
    g
}

fn inv(gpus: Vec<Gpu>) -> Inventory {
    Inventory {
        driver_version: DRIVER.into(),
        cuda_driver_version: CUDA.into(),
        nvml_version: format!("13.{DRIVER}"),
        gpus,
        ..Inventory::default()
    }
}

fn cfg(yaml: &str) -> Config {
    // An empty config file is an error now; "" here stands for "no file".
    let file = if yaml.is_empty() {
        Config::default()
    } else {
        Config::parse(yaml, "t.yaml").unwrap()
    };
    Config::effective(Some(file), &Overrides::default(), &Overrides::default()).unwrap()
}

/// A DMI name and a timestamp (the GPUs of `gpu()` are in compute mode).
fn ctx(_n: u32) -> LabelContext {
    LabelContext {
        machine_type: Some("PowerEdge XE9680".into()),
        timestamp: Some(TS),
        cuda_runtime_version: None,
    }
}

fn map(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// The node-wide labels every GPU node of these tests gets with [`ctx`]: driver 580.105.08,
/// CUDA 13.0, MIG-capable GPUs in compute mode.
fn node(mps_capable: &str) -> Vec<(&'static str, String)> {
    [
        ("nvidia.com/cuda.driver-version.major", "580"),
        ("nvidia.com/cuda.driver-version.minor", "105"),
        ("nvidia.com/cuda.driver-version.revision", "08"),
        ("nvidia.com/cuda.driver-version.full", "580.105.08"),
        ("nvidia.com/cuda.driver.major", "580"),
        ("nvidia.com/cuda.driver.minor", "105"),
        ("nvidia.com/cuda.driver.rev", "08"),
        ("nvidia.com/cuda.runtime-version.major", "13"),
        ("nvidia.com/cuda.runtime-version.minor", "0"),
        ("nvidia.com/cuda.runtime-version.full", "13.0"),
        ("nvidia.com/cuda.runtime.major", "13"),
        ("nvidia.com/cuda.runtime.minor", "0"),
        ("nvidia.com/gfd.timestamp", "1760000000"),
        ("nvidia.com/gpu.machine", "PowerEdge-XE9680"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/gpu.mode", "compute"),
        ("nvidia.com/mps.capable", mps_capable),
    ]
    .into_iter()
    .map(|(k, v)| (k, v.to_string()))
    .collect()
}

type Kv = Vec<(String, String)>;

fn kv(pairs: &[(&str, &str)]) -> Kv {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// [`node`] plus `resource` labels.
fn expect(mps_capable: &str, resource: Kv) -> Labels {
    let mut out: Labels = node(mps_capable)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    for (k, v) in resource {
        assert!(out.insert(k.clone(), v).is_none(), "{k} twice");
    }
    out
}

/// `nvidia.com/gpu.*` for whole A100 80GB GPUs.
fn a100_whole(count: &str, replicas: &str) -> Kv {
    kv(&[
        ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
        ("nvidia.com/gpu.count", count),
        ("nvidia.com/gpu.replicas", replicas),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("nvidia.com/gpu.memory", "81920"),
        ("nvidia.com/gpu.family", "ampere"),
        ("nvidia.com/gpu.compute.major", "8"),
        ("nvidia.com/gpu.compute.minor", "0"),
    ])
}

/// `nvidia.com/gpu.*` for two whole H100s.
fn h100_pair(product: &str, replicas: &str, strategy: &str) -> Kv {
    kv(&[
        ("nvidia.com/gpu.product", product),
        ("nvidia.com/gpu.count", "2"),
        ("nvidia.com/gpu.replicas", replicas),
        ("nvidia.com/gpu.sharing-strategy", strategy),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
    ])
}

/// `<resource>.*` for 1g.10gb MIG devices on A100 80GB.
fn mig_1g(resource: &str, count: &str, replicas: &str, strategy: &str, product: &str) -> Kv {
    let k = |s: &str| format!("{resource}.{s}");
    [
        ("product", product),
        ("count", count),
        ("replicas", replicas),
        ("sharing-strategy", strategy),
        ("memory", "9728"),
        ("multiprocessors", "14"),
        ("slices.gi", "1"),
        ("slices.ci", "1"),
        ("engines.copy", "1"),
        ("engines.decoder", "0"),
        ("engines.encoder", "0"),
        ("engines.jpeg", "0"),
        ("engines.ofa", "0"),
    ]
    .into_iter()
    .map(|(s, v)| (k(s), v.to_string()))
    .collect()
}

#[test]
fn strategy_none_eight_whole_h100s() {
    let i = inv((0..8).map(h100).collect());
    let got = gfd_labels(&i, &cfg(""), &ctx(8)).unwrap();
    // Written out in full once.
    let want = map(&[
        ("nvidia.com/cuda.driver-version.major", "580"),
        ("nvidia.com/cuda.driver-version.minor", "105"),
        ("nvidia.com/cuda.driver-version.revision", "08"),
        ("nvidia.com/cuda.driver-version.full", "580.105.08"),
        ("nvidia.com/cuda.driver.major", "580"),
        ("nvidia.com/cuda.driver.minor", "105"),
        ("nvidia.com/cuda.driver.rev", "08"),
        ("nvidia.com/cuda.runtime-version.major", "13"),
        ("nvidia.com/cuda.runtime-version.minor", "0"),
        ("nvidia.com/cuda.runtime-version.full", "13.0"),
        ("nvidia.com/cuda.runtime.major", "13"),
        ("nvidia.com/cuda.runtime.minor", "0"),
        ("nvidia.com/gfd.timestamp", "1760000000"),
        ("nvidia.com/gpu.machine", "PowerEdge-XE9680"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/mps.capable", "false"),
        ("nvidia.com/gpu.mode", "compute"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.replicas", "1"),
        ("nvidia.com/gpu.sharing-strategy", "none"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/gpu.family", "hopper"),
        ("nvidia.com/gpu.compute.major", "9"),
        ("nvidia.com/gpu.compute.minor", "0"),
    ]);
    assert_eq!(got, want);
    assert!(got.keys().all(|k| crate::owned_label_key(k)));
}

// Long on purpose: a table of NVIDIA's label sets, one case per MIG strategy, layout and sharing config.
#[test]
fn label_sets_match_nvidia() {
    let seven = ["1g.10gb"; 7];
    let balanced = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"];
    // The labels GFD leaves under single when the MIG layout is invalid: the whole-GPU labels of
    // the MIG-enabled GPUs (family, compute) with product, count, replicas, memory and
    // sharing-strategy replaced; GFD sets sharing-strategy to the empty string there, not `none`.
    let invalid = kv(&[
        ("nvidia.com/mig.strategy", "single"),
        (
            "nvidia.com/gpu.product",
            "NVIDIA-A100-SXM4-80GB-MIG-INVALID",
        ),
        ("nvidia.com/gpu.count", "0"),
        ("nvidia.com/gpu.replicas", "0"),
        ("nvidia.com/gpu.sharing-strategy", ""),
        ("nvidia.com/gpu.memory", "0"),
        ("nvidia.com/gpu.family", "ampere"),
        ("nvidia.com/gpu.compute.major", "8"),
        ("nvidia.com/gpu.compute.minor", "0"),
    ]);
    // (what, inventory, config, expected labels)
    let cases: Vec<(&str, Inventory, &str, Labels)> = vec![
        (
            "none: a MIG-enabled GPU is labelled whole, without sharing (replicas 0)",
            inv(vec![with_mig(a100(0), &["1g.10gb"])]),
            "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
            expect("false", a100_whole("1", "0")),
        ),
        (
            "single: 2x A100 80GB with 7x 1g.10gb become nvidia.com/gpu",
            inv(vec![with_mig(a100(0), &seven), with_mig(a100(1), &seven)]),
            "flags: {migStrategy: single}",
            expect(
                "false",
                kv(&[
                    ("nvidia.com/mig.strategy", "single"),
                    (
                        "nvidia.com/gpu.product",
                        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                    ),
                    ("nvidia.com/gpu.count", "14"),
                    ("nvidia.com/gpu.replicas", "1"),
                    ("nvidia.com/gpu.sharing-strategy", "none"),
                    ("nvidia.com/gpu.memory", "9728"),
                    ("nvidia.com/gpu.multiprocessors", "14"),
                    ("nvidia.com/gpu.slices.gi", "1"),
                    ("nvidia.com/gpu.slices.ci", "1"),
                    ("nvidia.com/gpu.engines.copy", "1"),
                    ("nvidia.com/gpu.engines.decoder", "0"),
                    ("nvidia.com/gpu.engines.encoder", "0"),
                    ("nvidia.com/gpu.engines.jpeg", "0"),
                    ("nvidia.com/gpu.engines.ofa", "0"),
                    // Left by the whole-GPU labels of the MIG-enabled parents.
                    ("nvidia.com/gpu.family", "ampere"),
                    ("nvidia.com/gpu.compute.major", "8"),
                    ("nvidia.com/gpu.compute.minor", "0"),
                ]),
            ),
        ),
        (
            "single: no GPU has MIG enabled, whole-GPU labels plus the strategy",
            inv(vec![h100(0), h100(1)]),
            "flags: {migStrategy: single}",
            expect(
                "false",
                [
                    kv(&[("nvidia.com/mig.strategy", "single")]),
                    h100_pair("NVIDIA-H100-80GB-HBM3", "1", "none"),
                ]
                .concat(),
            ),
        ),
        (
            "single: two different profiles is invalid",
            inv(vec![
                with_mig(a100(0), &["1g.10gb", "1g.10gb"]),
                with_mig(a100(1), &["2g.20gb"]),
            ]),
            "flags: {migStrategy: single}",
            expect("false", invalid.clone()),
        ),
        (
            "single: a MIG-enabled GPU without MIG devices is invalid",
            inv(vec![with_mig(a100(0), &seven), with_mig(a100(1), &[])]),
            "flags: {migStrategy: single}",
            expect("false", invalid.clone()),
        ),
        (
            "single: MIG enabled on some GPUs only is invalid",
            inv(vec![with_mig(a100(0), &seven), a100(1)]),
            "flags: {migStrategy: single}",
            expect("false", invalid.clone()),
        ),
        (
            // GFD counts nvidia.com/gpu by GPU name, MIG enabled or not: 2 here though only GPU 1
            // is advertised whole.
            "mixed: one GPU partitioned 3g+2g+2x1g, one whole",
            inv(vec![with_mig(a100(0), &balanced), a100(1)]),
            "flags: {migStrategy: mixed}",
            expect(
                "false",
                [
                    kv(&[("nvidia.com/mig.strategy", "mixed")]),
                    a100_whole("2", "1"),
                    mig_1g(
                        "nvidia.com/mig-1g.10gb",
                        "2",
                        "1",
                        "none",
                        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                    ),
                    kv(&[
                        (
                            "nvidia.com/mig-2g.20gb.product",
                            "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb",
                        ),
                        ("nvidia.com/mig-2g.20gb.count", "1"),
                        ("nvidia.com/mig-2g.20gb.replicas", "1"),
                        ("nvidia.com/mig-2g.20gb.sharing-strategy", "none"),
                        ("nvidia.com/mig-2g.20gb.memory", "19968"),
                        ("nvidia.com/mig-2g.20gb.multiprocessors", "28"),
                        ("nvidia.com/mig-2g.20gb.slices.gi", "2"),
                        ("nvidia.com/mig-2g.20gb.slices.ci", "2"),
                        ("nvidia.com/mig-2g.20gb.engines.copy", "2"),
                        ("nvidia.com/mig-2g.20gb.engines.decoder", "1"),
                        ("nvidia.com/mig-2g.20gb.engines.encoder", "0"),
                        ("nvidia.com/mig-2g.20gb.engines.jpeg", "0"),
                        ("nvidia.com/mig-2g.20gb.engines.ofa", "0"),
                        (
                            "nvidia.com/mig-3g.40gb.product",
                            "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
                        ),
                        ("nvidia.com/mig-3g.40gb.count", "1"),
                        ("nvidia.com/mig-3g.40gb.replicas", "1"),
                        ("nvidia.com/mig-3g.40gb.sharing-strategy", "none"),
                        ("nvidia.com/mig-3g.40gb.memory", "40192"),
                        ("nvidia.com/mig-3g.40gb.multiprocessors", "42"),
                        ("nvidia.com/mig-3g.40gb.slices.gi", "3"),
                        ("nvidia.com/mig-3g.40gb.slices.ci", "3"),
                        ("nvidia.com/mig-3g.40gb.engines.copy", "3"),
                        ("nvidia.com/mig-3g.40gb.engines.decoder", "2"),
                        ("nvidia.com/mig-3g.40gb.engines.encoder", "0"),
                        ("nvidia.com/mig-3g.40gb.engines.jpeg", "0"),
                        ("nvidia.com/mig-3g.40gb.engines.ofa", "0"),
                    ]),
                ]
                .concat(),
            ),
        ),
        (
            "mixed: every GPU partitioned; nvidia.com/gpu still labelled, replicas 0",
            inv(vec![with_mig(a100(0), &seven)]),
            "flags: {migStrategy: mixed}",
            expect(
                "false",
                [
                    kv(&[("nvidia.com/mig.strategy", "mixed")]),
                    a100_whole("1", "0"),
                    mig_1g(
                        "nvidia.com/mig-1g.10gb",
                        "7",
                        "1",
                        "none",
                        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                    ),
                ]
                .concat(),
            ),
        ),
        (
            "mixed: time-slicing a MIG profile, not renamed",
            inv(vec![with_mig(a100(0), &seven)]),
            "flags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n    resources: [{name: mig-1g.10gb, replicas: 2}]\n",
            expect(
                "false",
                [
                    kv(&[("nvidia.com/mig.strategy", "mixed")]),
                    a100_whole("1", "0"),
                    mig_1g(
                        "nvidia.com/mig-1g.10gb",
                        "7",
                        "2",
                        "time-slicing",
                        "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED",
                    ),
                ]
                .concat(),
            ),
        ),
        (
            "time-slicing replicas 4, not renamed: -SHARED, count stays the GPU count",
            inv(vec![h100(0), h100(1)]),
            "sharing:\n  timeSlicing:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
            expect(
                "false",
                h100_pair("NVIDIA-H100-80GB-HBM3-SHARED", "4", "time-slicing"),
            ),
        ),
        (
            "time-slicing replicas 4, renameByDefault: no suffix, labels stay under nvidia.com/gpu",
            inv(vec![h100(0), h100(1)]),
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources: [{name: gpu, replicas: 4}]\n",
            expect(
                "false",
                h100_pair("NVIDIA-H100-80GB-HBM3", "4", "time-slicing"),
            ),
        ),
        (
            "time-slicing replicas 4, custom rename: no suffix",
            inv(vec![h100(0), h100(1)]),
            "sharing:\n  timeSlicing:\n    resources: [{name: gpu, rename: gpu-quarter, replicas: 4}]\n",
            expect(
                "false",
                h100_pair("NVIDIA-H100-80GB-HBM3", "4", "time-slicing"),
            ),
        ),
        (
            "MPS replicas 4",
            inv(vec![h100(0), h100(1)]),
            "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 4}]\n",
            expect(
                "true",
                h100_pair("NVIDIA-H100-80GB-HBM3-SHARED", "4", "mps"),
            ),
        ),
        (
            "a sharing entry for another resource changes nothing",
            inv(vec![h100(0), h100(1)]),
            "sharing:\n  timeSlicing:\n    resources: [{name: mig-1g.10gb, replicas: 4}]\n",
            expect("false", h100_pair("NVIDIA-H100-80GB-HBM3", "1", "none")),
        ),
    ];
    for (what, inventory, text, want) in cases {
        let n = inventory.gpus.len() as u32;
        let got = gfd_labels(&inventory, &cfg(text), &ctx(n)).unwrap();
        let missing: Vec<_> = want
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .collect();
        let extra: Vec<_> = got.iter().filter(|(k, _)| !want.contains_key(*k)).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{what}\nwanted but missing or different: {missing:?}\nnot wanted: {extra:?}"
        );
        assert!(got.keys().all(|k| crate::owned_label_key(k)), "{what}");
    }
}

#[test]
fn no_gpus_only_the_timestamp() {
    let empty = Inventory::default();
    assert_eq!(
        gfd_labels(&empty, &cfg(""), &ctx(0)).unwrap(),
        map(&[("nvidia.com/gfd.timestamp", "1760000000")])
    );
    let quiet = LabelContext::default();
    assert_eq!(
        gfd_labels(&empty, &cfg("flags: {migStrategy: mixed}"), &quiet).unwrap(),
        Labels::new()
    );
    // A GPU lost before it was ever read is not a GPU to label.
    let lost = inv(vec![Gpu {
        index: 0,
        health: gpuops_inventory::Health::Lost,
        ..Gpu::default()
    }]);
    assert_eq!(gfd_labels(&lost, &cfg(""), &quiet).unwrap(), Labels::new());
}

#[test]
fn context_machine_mode_timestamp_and_cuda() {
    let mut i = inv(vec![h100(0), h100(1)]);
    let mut c = ctx(2);
    c.machine_type = None;
    c.timestamp = None;
    i.gpus[0].pci_class = Some(PCI_CLASS_VGA_CONTROLLER);
    c.cuda_runtime_version = Some("12.8".into());
    let got = gfd_labels(&i, &cfg(""), &c).unwrap();
    assert_eq!(got.get("nvidia.com/gpu.machine").unwrap(), "unknown");
    assert!(!got.contains_key("nvidia.com/gfd.timestamp"));
    // GFD takes the first GPU's PCI class.
    assert_eq!(got.get("nvidia.com/gpu.mode").unwrap(), "graphics");
    assert_eq!(
        got.get("nvidia.com/cuda.runtime-version.full").unwrap(),
        "12.8"
    );
    assert_eq!(got.get("nvidia.com/cuda.runtime.minor").unwrap(), "8");

    i.gpus[0].pci_class = None;
    c.machine_type = Some("  Standard PC (Q35 + ICH9, 2009)\n".into());
    let got = gfd_labels(&i, &cfg(""), &c).unwrap();
    assert_eq!(got.get("nvidia.com/gpu.mode").unwrap(), "unknown");
    assert_eq!(
        got.get("nvidia.com/gpu.machine").unwrap(),
        "Standard-PC-Q35-ICH9-2009"
    );
    c.machine_type = Some("g6.12xlarge\n".into());
    let got = gfd_labels(&i, &cfg(""), &c).unwrap();
    assert_eq!(got.get("nvidia.com/gpu.machine").unwrap(), "g6.12xlarge");
}

#[test]
fn two_part_driver_versions_and_errors() {
    let mut i = inv(vec![h100(0)]);
    i.driver_version = "400.300".into();
    let got = gfd_labels(&i, &cfg(""), &ctx(1)).unwrap();
    assert_eq!(
        got.get("nvidia.com/cuda.driver-version.revision").unwrap(),
        ""
    );
    assert_eq!(got.get("nvidia.com/cuda.driver.rev").unwrap(), "");
    assert_eq!(
        got.get("nvidia.com/cuda.driver-version.full").unwrap(),
        "400.300"
    );

    for bad in ["580", "1.2.3.4", ""] {
        i.driver_version = bad.into();
        assert_eq!(
            gfd_labels(&i, &cfg(""), &ctx(1)),
            Err(LabelError::InvalidDriverVersion(bad.into()))
        );
    }
    i.driver_version = DRIVER.into();
    for bad in ["13", "x.y", ""] {
        i.cuda_driver_version = bad.into();
        assert_eq!(
            gfd_labels(&i, &cfg(""), &ctx(1)),
            Err(LabelError::InvalidCudaVersion(bad.into()))
        );
    }

    // GFD refuses MPS when a GPU has MIG enabled.
    let i = inv(vec![h100(0), with_mig(a100(1), &["1g.10gb"])]);
    let err = gfd_labels(
        &i,
        &cfg("sharing:\n  mps:\n    resources: [{name: gpu, replicas: 2}]\n"),
        &ctx(2),
    )
    .unwrap_err();
    assert_eq!(err, LabelError::MpsWithMig { gpus: vec![1] });
    assert!(err.to_string().contains("MIG is enabled on GPU 1"));
}

#[test]
fn mixed_models_pick_the_lowest_index_gpu_and_unknown_profiles_lose_engines() {
    let l4 = gpu(1, "NVIDIA L4", "L4", 23034, (8, 9), false);
    let got = gfd_labels(&inv(vec![l4.clone(), h100(0)]), &cfg(""), &ctx(2)).unwrap();
    assert_eq!(
        got.get("nvidia.com/gpu.product").unwrap(),
        "NVIDIA-H100-80GB-HBM3"
    );
    assert_eq!(got.get("nvidia.com/gpu.count").unwrap(), "1");
    assert_eq!(got.get("nvidia.com/gpu.family").unwrap(), "hopper");
    let got = gfd_labels(&inv(vec![l4]), &cfg(""), &ctx(2)).unwrap();
    assert_eq!(got.get("nvidia.com/gpu.family").unwrap(), "ada-lovelace");
    assert_eq!(got.get("nvidia.com/mig.capable").unwrap(), "false");

    // A model the catalog lacks: everything but the engine counts.
    let mut g = with_mig(a100(0), &["1g.10gb"]);
    g.model = None;
    g.name = "NVIDIA Future GPU".into();
    let got = gfd_labels(&inv(vec![g]), &cfg("flags: {migStrategy: single}"), &ctx(1)).unwrap();
    assert_eq!(
        got.get("nvidia.com/gpu.product").unwrap(),
        "NVIDIA-Future-GPU-MIG-1g.10gb"
    );
    assert_eq!(got.get("nvidia.com/gpu.multiprocessors").unwrap(), "14");
    assert!(!got.keys().any(|k| k.contains(".engines.")));
}
