//! The devices of the simulator's fleets, against the names and values NVIDIA's DRA driver
//! publishes for the same GPUs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

mod common;

use common::{fleet_names, inventory, model_of, with_mig};
use gpuops_dra::model::{AttrValue, DeviceType};
use gpuops_dra::{NodeFacts, Options, build};
use std::collections::{BTreeMap, BTreeSet};

fn s(v: &str) -> AttrValue {
    AttrValue::String(v.to_string())
}
fn ver(v: &str) -> AttrValue {
    AttrValue::Version(v.to_string())
}

#[test]
fn dgx_h100_whole_gpus_carry_nvidias_attributes() {
    let inv = inventory("dgx-h100");
    let mut facts = NodeFacts::default();
    facts
        .pcie_roots
        .insert("0000:18:00.0".into(), "pci0000:15".into());
    let m = build(&inv, &facts, &Options::default());
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let names: Vec<&str> = m.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"
        ]
    );
    let d = &m.devices[0];
    let expected: BTreeMap<String, AttrValue> = [
        ("type", s("gpu")),
        ("uuid", s(&inv.gpus[0].uuid)),
        ("productName", s("NVIDIA H100 80GB HBM3")),
        ("brand", s("Nvidia")),
        ("architecture", s("Hopper")),
        ("cudaComputeCapability", ver("9.0.0")),
        ("driverVersion", ver("580.105.8")),
        ("cudaDriverVersion", ver("13.0.0")),
        ("resource.kubernetes.io/pciBusID", s("0000:18:00.0")),
        ("resource.kubernetes.io/pcieRoot", s("pci0000:15")),
        ("resource.kubernetes.io/numaNode", AttrValue::Int(0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(d.attributes, expected);
    assert_eq!(
        d.capacity,
        BTreeMap::from([("memory".to_string(), 81559 * 1024 * 1024)])
    );
    assert!(d.consumes.is_none() && d.taints.is_empty() && d.mig.is_none());
    // Without a PCIe root from sysfs the attribute is left out, as NVIDIA's driver does.
    assert!(
        !m.devices[1]
            .attributes
            .contains_key("resource.kubernetes.io/pcieRoot")
    );
}

#[test]
fn static_mig_publishes_only_the_mig_devices_with_nvidias_names() {
    let mut inv = inventory("dgx-h100");
    with_mig(&mut inv, 0, &[("1g.10gb", 7)]);
    with_mig(&mut inv, 1, &[("3g.40gb", 1), ("1c.4g.40gb", 1)]);
    with_mig(&mut inv, 2, &[("1g.10gb+me", 1)]);
    let m = build(&inv, &NodeFacts::default(), &Options::default());
    let on = |minor: u32| -> Vec<&str> {
        m.devices
            .iter()
            .filter(|d| d.gpu_minor == minor)
            .map(|d| d.name.as_str())
            .collect()
    };
    assert_eq!(
        on(0),
        (0..7)
            .map(|i| format!("gpu-0-mig-1g10gb-19-{i}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(on(1), ["gpu-1-mig-1c4g40gb-5-0", "gpu-1-mig-3g40gb-9-4"]);
    let start = inv.gpus[2].mig_devices[0].placement_start;
    assert_eq!(on(2), [format!("gpu-2-mig-1g10gb-me-20-{start}")]);
    assert_eq!(on(3), ["gpu-3"]);

    let d = m.device("gpu-1-mig-1c4g40gb-5-0").unwrap();
    assert_eq!(d.device_type, DeviceType::Mig);
    assert_eq!(d.attributes["type"], s("mig"));
    assert_eq!(d.attributes["profile"], s("1c.4g.40gb"));
    assert_eq!(d.attributes["parentUUID"], s(&inv.gpus[1].uuid));
    assert_eq!(d.attributes["uuid"], s(&inv.gpus[1].mig_devices[0].uuid));
    assert_eq!(d.attributes["productName"], s("NVIDIA H100 80GB HBM3"));
    let p = model_of(&inv.gpus[1]).gi_profile("4g.40gb").unwrap();
    let mut cap = BTreeMap::from([
        ("multiprocessors".to_string(), u64::from(p.sm_count)),
        ("copyEngines".to_string(), u64::from(p.copy_engines)),
        ("decoders".to_string(), u64::from(p.decoders)),
        ("encoders".to_string(), u64::from(p.encoders)),
        ("jpegEngines".to_string(), u64::from(p.jpegs)),
        ("ofaEngines".to_string(), u64::from(p.ofas)),
        ("memory".to_string(), p.memory_mib * 1024 * 1024),
    ]);
    for i in 0..4 {
        cap.insert(format!("memorySlice{i}"), 1);
    }
    assert_eq!(d.capacity, cap);
}

/// Every combination the builder can meet: each fleet with MIG off, with MIG on for half the
/// MIG-capable GPUs, static and dynamic, taints on and off.
fn every_case() -> Vec<(String, gpuops_inventory::Inventory, Options)> {
    let mut out = Vec::new();
    for fleet in fleet_names() {
        let off = inventory(fleet);
        let mut half = off.clone();
        for i in 0..half.gpus.len() {
            if half.gpus[i].mig.capable && i % 2 == 0 {
                with_mig(
                    &mut half,
                    i,
                    &[("1g.10gb", 2), ("2g.20gb", 1)].map(|(p, n)| {
                        // Profile names differ per memory size; take this model's 1g and 2g.
                        let model = model_of(&off.gpus[i]);
                        let want = p.split('.').next().unwrap_or(p);
                        let name = model
                            .mig
                            .as_ref()
                            .unwrap()
                            .gi_profiles
                            .iter()
                            .find(|g| g.name.starts_with(want) && !g.name.contains(['+', '-']))
                            .unwrap()
                            .name;
                        (name, n)
                    }),
                );
            }
        }
        for (label, inv) in [("mig off", &off), ("mig on half", &half)] {
            for dynamic_mig in [false, true] {
                for device_taints in [false, true] {
                    let opts = Options {
                        dynamic_mig,
                        device_taints,
                        ..Options::default()
                    };
                    out.push((format!("{fleet} {label} {opts:?}"), inv.clone(), opts));
                }
            }
        }
    }
    out
}

#[test]
fn no_gpu_is_offered_both_whole_and_partitioned() {
    for (case, inv, opts) in every_case() {
        let m = build(&inv, &NodeFacts::default(), &opts);
        for gpu in &inv.gpus {
            let whole = m
                .devices
                .iter()
                .find(|d| d.gpu_uuid == gpu.uuid && d.device_type == DeviceType::Gpu);
            let parts: Vec<_> = m
                .devices
                .iter()
                .filter(|d| d.gpu_uuid == gpu.uuid && d.device_type == DeviceType::Mig)
                .collect();
            let Some(whole) = whole else { continue };
            if parts.is_empty() {
                continue;
            }
            // Only dynamic MIG offers both, and there the whole GPU takes every counter of the
            // GPU's set, so the scheduler can never allocate it beside any partition.
            assert!(
                opts.dynamic_mig,
                "{case}: GPU {} whole and partitioned",
                gpu.index
            );
            let set = m
                .counter_sets
                .iter()
                .find(|s| Some(&s.name) == whole.consumes.as_ref().map(|c| &c.counter_set))
                .unwrap_or_else(|| panic!("{case}: whole GPU consumes no counter set"));
            assert_eq!(
                whole.consumes.as_ref().unwrap().counters,
                set.counters,
                "{case}"
            );
            for p in parts {
                let c = p.consumes.as_ref().unwrap();
                assert_eq!(c.counter_set, set.name, "{case}");
                assert!(
                    c.counters.keys().any(|k| k.starts_with("memory-slice-")),
                    "{case}: {} takes no memory slice",
                    p.name
                );
            }
        }
        // Static MIG: a MIG-mode GPU is never whole, a non-MIG one never partitioned.
        if !opts.dynamic_mig {
            for d in &m.devices {
                let gpu = inv.gpus.iter().find(|g| g.uuid == d.gpu_uuid).unwrap();
                assert_eq!(
                    d.device_type == DeviceType::Mig,
                    gpu.mig.current_enabled,
                    "{case}: {}",
                    d.name
                );
            }
        }
    }
}

/// A DNS label (RFC 1123): what the API takes for counter and counter set names.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An attribute or capacity name: a C identifier of at most 32 characters, optionally after a
/// DNS subdomain and a slash.
fn qualified_name(s: &str) -> bool {
    let (domain, id) = s.rsplit_once('/').unwrap_or(("", s));
    let c_ident = !id.is_empty()
        && id.len() <= 32
        && !id.as_bytes()[0].is_ascii_digit()
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    c_ident && (domain.is_empty() || (domain.len() <= 63 && domain.split('.').all(dns_label)))
}

#[test]
fn every_device_fits_the_api_limits_and_names_are_unique() {
    for (case, inv, opts) in every_case() {
        let m = build(&inv, &NodeFacts::default(), &opts);
        let mut seen = BTreeSet::new();
        for d in &m.devices {
            assert!(seen.insert(d.name.clone()), "{case}: {} twice", d.name);
            assert!(
                d.attributes.len() + d.capacity.len()
                    <= gpuops_dra::slices::MAX_ATTRIBUTES_AND_CAPACITIES,
                "{case}: {} has {} attributes and capacities",
                d.name,
                d.attributes.len() + d.capacity.len()
            );
            // A DNS label: what the API accepts as a device name.
            assert!(d.name.len() <= 63, "{case}: {}", d.name);
            assert!(
                d.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{case}: {}",
                d.name
            );
            assert!(
                gpuops_dra::names::parse_device_name(&d.name).is_ok(),
                "{case}: {}",
                d.name
            );
        }
        for set in &m.counter_sets {
            assert!(set.counters.len() <= 32, "{case}: {}", set.name);
            assert!(dns_label(&set.name), "{case}: {}", set.name);
            for k in set.counters.keys() {
                assert!(dns_label(k), "{case}: counter {k}");
            }
        }
        for d in &m.devices {
            for k in d.attributes.keys().chain(d.capacity.keys()) {
                assert!(qualified_name(k), "{case}: {}: {k}", d.name);
            }
            assert!(d.consumes.iter().all(|c| c.counters.len() <= 32));
        }
    }
}

#[test]
fn building_is_deterministic_whatever_the_inventory_order() {
    let mut inv = inventory("dgx-b200");
    with_mig(&mut inv, 3, &[("1g.23gb", 7)]);
    let opts = Options {
        dynamic_mig: true,
        ..Options::default()
    };
    let a = build(&inv, &NodeFacts::default(), &opts);
    let mut shuffled = inv.clone();
    shuffled.gpus.reverse();
    shuffled.gpus.swap(1, 5);
    let b = build(&shuffled, &NodeFacts::default(), &opts);
    assert_eq!(a, b);
    // Publishing order: GPUs by PCI bus id, names in byte order within a GPU.
    let minors: Vec<u32> = a.devices.iter().map(|d| d.gpu_minor).collect();
    let mut sorted = minors.clone();
    sorted.sort();
    assert_eq!(minors, sorted);
    for w in a.devices.windows(2) {
        if w[0].gpu_minor == w[1].gpu_minor {
            assert!(w[0].name < w[1].name, "{} before {}", w[0].name, w[1].name);
        }
    }
}

#[test]
fn gpus_without_mig_and_unknown_models_publish_whole_gpus_only() {
    let mut inv = inventory("l4x4");
    let opts = Options {
        dynamic_mig: true,
        ..Options::default()
    };
    let m = build(&inv, &NodeFacts::default(), &opts);
    assert_eq!(m.devices.len(), 4);
    assert!(m.counter_sets.is_empty());
    assert!(m.devices.iter().all(|d| d.consumes.is_none()));
    assert_eq!(m.devices[0].attributes["architecture"], s("Ada Lovelace"));
    assert_eq!(
        m.devices[0].attributes["cudaComputeCapability"],
        ver("8.9.0")
    );

    // A model the catalog lacks: no placements to offer, so no dynamic MIG, but still whole.
    inv.gpus[0].model = None;
    inv.gpus[0].mig.capable = true;
    let m = build(&inv, &NodeFacts::default(), &opts);
    assert_eq!(m.devices[0].name, "gpu-0");
    assert!(m.devices[0].consumes.is_none());
}

#[test]
fn unreadable_gpus_and_versions_are_left_out_with_a_warning() {
    let mut inv = inventory("h100-nvl-x2");
    inv.gpus[0].minor_number = None;
    inv.driver_version = "garbage".into();
    let m = build(&inv, &NodeFacts::default(), &Options::default());
    assert_eq!(m.devices.len(), 1);
    assert!(!m.devices[0].attributes.contains_key("driverVersion"));
    assert!(
        m.warnings.iter().any(|w| w.contains("no minor number")),
        "{:?}",
        m.warnings
    );
    assert!(
        m.warnings.iter().any(|w| w.contains("driverVersion")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn values_the_api_would_refuse_are_left_out_not_the_slice() {
    let mut inv = inventory("l4x4");
    inv.gpus[1].name = "NVIDIA ".repeat(10);
    let mut facts = NodeFacts::default();
    facts
        .brands
        .insert(inv.gpus[2].uuid.clone(), "GeForceRTX".into());
    let m = build(&inv, &facts, &Options::default());
    assert_eq!(m.devices.len(), 4);
    assert!(!m.devices[1].attributes.contains_key("productName"));
    assert_eq!(m.devices[0].attributes["productName"], s("NVIDIA L4"));
    assert_eq!(m.devices[2].attributes["brand"], s("GeForceRTX"));
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("productName") && w.contains("64")),
        "{:?}",
        m.warnings
    );
}

#[test]
fn static_mig_without_devices_publishes_nothing_for_that_gpu_and_says_so() {
    let mut inv = inventory("dgx-a100");
    inv.gpus[0].mig.current_enabled = true;
    let m = build(&inv, &NodeFacts::default(), &Options::default());
    assert!(m.devices.iter().all(|d| d.gpu_minor != 0));
    assert!(m.warnings.iter().any(|w| w.contains("no MIG devices")));
}
