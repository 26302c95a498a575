//! ResourceSlices: one pool per node, the API's per-slice limits, counters in their own slices,
//! and health as taints or absence.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

mod common;

use common::{inventory, with_mig};
use gpuops_dra::health::{TAINT_KEY_GPU_LOST, TAINT_KEY_XID};
use gpuops_dra::model::{Device, DeviceModel};
use gpuops_dra::slices::{
    MAX_COUNTER_SETS_PER_SLICE, MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS, resource_slices,
};
use gpuops_dra::{NodeFacts, Options, TaintEffect, Unhealthy, build, publish};
use gpuops_inventory::Health;

fn check_pool(
    slices: &[k8s_openapi::api::resource::v1::ResourceSliceSpec],
    node: &str,
    generation: i64,
) {
    for s in slices {
        assert_eq!(s.driver, "gpu.nvidia.com");
        assert_eq!(s.node_name.as_deref(), Some(node));
        assert_eq!(s.pool.name, node);
        assert_eq!(s.pool.generation, generation);
        assert_eq!(s.pool.resource_slice_count, slices.len() as i64);
        // A slice has devices or shared counters, never both (1.35).
        assert!(s.devices.is_some() != s.shared_counters.is_some());
        let devices = s.devices.as_deref().unwrap_or_default();
        let restricted = devices
            .iter()
            .any(|d| d.taints.is_some() || d.consumes_counters.is_some());
        let limit = if restricted {
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        assert!(!devices.is_empty() || s.shared_counters.is_some());
        assert!(
            devices.len() <= limit,
            "{} devices, limit {limit}",
            devices.len()
        );
        assert!(
            s.shared_counters.as_deref().unwrap_or_default().len() <= MAX_COUNTER_SETS_PER_SLICE
        );
    }
}

#[test]
fn a_static_node_is_one_slice_of_its_devices() {
    let (slices, warnings) = publish(
        "node-a",
        3,
        &inventory("dgx-h100"),
        &NodeFacts::default(),
        &Options::default(),
    );
    assert!(warnings.is_empty());
    assert_eq!(slices.len(), 1);
    check_pool(&slices, "node-a", 3);
    assert_eq!(slices[0].devices.as_ref().unwrap().len(), 8);
}

#[test]
fn dynamic_mig_puts_counter_sets_first_in_their_own_slice() {
    let inv = inventory("dgx-h100");
    let opts = Options {
        dynamic_mig: true,
        ..Options::default()
    };
    let model = build(&inv, &NodeFacts::default(), &opts);
    let slices = resource_slices("n", 7, &model);
    check_pool(&slices, "n", 7);
    let sets = slices[0].shared_counters.as_ref().unwrap();
    assert_eq!(
        sets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        (0..8)
            .map(|i| format!("gpu-{i}-counter-set"))
            .collect::<Vec<_>>()
    );
    let published: Vec<String> = slices[1..]
        .iter()
        .flat_map(|s| s.devices.as_ref().unwrap().iter().map(|d| d.name.clone()))
        .collect();
    let expected: Vec<String> = model.devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(
        published, expected,
        "every device once, in publishing order"
    );
    // Every consumed counter set and counter exists in the pool.
    for d in slices[1..].iter().flat_map(|s| s.devices.as_ref().unwrap()) {
        for c in d.consumes_counters.as_ref().unwrap() {
            let set = sets.iter().find(|s| s.name == c.counter_set).unwrap();
            for k in c.counters.keys() {
                assert!(set.counters.contains_key(k), "{}: {k}", d.name);
            }
        }
    }
}

fn plain_device(i: usize) -> Device {
    Device {
        name: format!("gpu-{i}"),
        device_type: gpuops_dra::DeviceType::Gpu,
        gpu_uuid: format!("GPU-{i}"),
        gpu_minor: i as u32,
        gpu_index: i as u32,
        mig: None,
        attributes: Default::default(),
        capacity: Default::default(),
        consumes: None,
        taints: Vec::new(),
    }
}

#[test]
fn large_models_split_at_the_limits() {
    let mut model = DeviceModel {
        devices: (0..300).map(plain_device).collect(),
        ..DeviceModel::default()
    };
    let slices = resource_slices("n", 1, &model);
    check_pool(&slices, "n", 1);
    let sizes: Vec<usize> = slices
        .iter()
        .map(|s| s.devices.as_ref().unwrap().len())
        .collect();
    assert_eq!(sizes, [128, 128, 44]);

    // A tainted device in the second slice lowers its limit to 64.
    model.devices[200]
        .taints
        .push(gpuops_dra::health::taint_for(
            &Unhealthy::GpuLost,
            TaintEffect::NoSchedule,
        ));
    let slices = resource_slices("n", 1, &model);
    check_pool(&slices, "n", 1);
    let sizes: Vec<usize> = slices
        .iter()
        .map(|s| s.devices.as_ref().unwrap().len())
        .collect();
    assert_eq!(sizes.iter().sum::<usize>(), 300);
    assert_eq!(sizes[0], 128);

    // Counter sets: 8 per slice.
    model.counter_sets = (0..17)
        .map(|i| gpuops_dra::model::CounterSet {
            name: format!("gpu-{i}-counter-set"),
            counters: [("memory-slice-0".to_string(), 1)].into(),
        })
        .collect();
    let slices = resource_slices("n", 1, &model);
    check_pool(&slices, "n", 1);
    let set_sizes: Vec<usize> = slices
        .iter()
        .filter_map(|s| s.shared_counters.as_ref().map(Vec::len))
        .collect();
    assert_eq!(set_sizes, [8, 8, 1]);
}

#[test]
fn a_node_with_no_devices_has_no_slices() {
    assert!(resource_slices("n", 1, &DeviceModel::default()).is_empty());
}

#[test]
fn unhealthy_devices_are_tainted_or_leave() {
    let mut inv = inventory("dgx-h100");
    with_mig(&mut inv, 2, &[("1g.10gb", 3)]);
    inv.gpus[1].health = Health::Lost;
    let mut facts = NodeFacts::default();
    facts
        .unhealthy
        .insert(inv.gpus[0].uuid.clone(), Unhealthy::Xid { xid: 79 });
    facts.unhealthy.insert(
        inv.gpus[2].mig_devices[1].uuid.clone(),
        Unhealthy::Xid { xid: 94 },
    );

    let tainting = Options {
        device_taints: true,
        unhealthy_effect: TaintEffect::NoExecute,
        ..Options::default()
    };
    let m = build(&inv, &facts, &tainting);
    let gpu0 = m.device("gpu-0").unwrap();
    assert_eq!(gpu0.taints.len(), 1);
    assert_eq!(gpu0.taints[0].key, TAINT_KEY_XID);
    assert_eq!(gpu0.taints[0].value.as_deref(), Some("79"));
    assert_eq!(gpu0.taints[0].effect, TaintEffect::NoExecute);
    let gpu1 = m.device("gpu-1").unwrap();
    assert_eq!(gpu1.taints[0].key, TAINT_KEY_GPU_LOST);
    assert_eq!(gpu1.taints[0].value, None);
    let migs: Vec<_> = m.devices.iter().filter(|d| d.gpu_minor == 2).collect();
    assert_eq!(migs.len(), 3);
    let tainted: Vec<&str> = migs
        .iter()
        .filter(|d| !d.taints.is_empty())
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(tainted.len(), 1, "only the MIG device with the XID");
    assert!(m.device("gpu-3").unwrap().taints.is_empty());
    let slices = resource_slices("n", 1, &m);
    let json = serde_json::to_value(&slices[0]).unwrap();
    let d0 = &json["devices"][0];
    assert_eq!(d0["taints"][0]["key"], "gpu.nvidia.com/xid");
    assert_eq!(d0["taints"][0]["effect"], "NoExecute");
    assert!(d0["taints"][0].get("timeAdded").is_none());

    // Without the gate, they leave the slice instead; the rest stays.
    let m = build(&inv, &facts, &Options::default());
    let names: Vec<&str> = m.devices.iter().map(|d| d.name.as_str()).collect();
    assert!(!names.contains(&"gpu-0") && !names.contains(&"gpu-1"));
    assert_eq!(
        names.len(),
        5 + 2,
        "gpu-3..7 and the two healthy MIG devices: {names:?}"
    );
    assert!(m.devices.iter().all(|d| d.taints.is_empty()));
}

#[test]
fn a_lost_gpu_in_dynamic_mig_takes_its_counter_set_along() {
    let mut inv = inventory("dgx-h100");
    inv.gpus[4].health = Health::Unreachable { reason: "x".into() };
    let opts = Options {
        dynamic_mig: true,
        ..Options::default()
    };
    let m = build(&inv, &NodeFacts::default(), &opts);
    assert!(m.devices.iter().all(|d| d.gpu_index != 4));
    assert!(m.counter_sets.iter().all(|s| s.name != "gpu-4-counter-set"));
    assert_eq!(m.counter_sets.len(), 7);
    // With taints: everything of it published, tainted.
    let m = build(
        &inv,
        &NodeFacts::default(),
        &Options {
            device_taints: true,
            ..opts
        },
    );
    let of4: Vec<_> = m.devices.iter().filter(|d| d.gpu_index == 4).collect();
    assert!(of4.len() > 1 && of4.iter().all(|d| d.taints.len() == 1));
    assert_eq!(m.counter_sets.len(), 8);
}

#[test]
fn devices_serialise_as_the_api_expects() {
    let mut inv = inventory("dgx-a100");
    with_mig(&mut inv, 0, &[("7g.80gb", 1)]);
    let (slices, _) = publish("n", 1, &inv, &NodeFacts::default(), &Options::default());
    let json = serde_json::to_value(&slices[0]).unwrap();
    let d = &json["devices"][0];
    assert_eq!(d["name"], "gpu-0-mig-7g80gb-0-0");
    assert_eq!(
        d["attributes"]["type"],
        serde_json::json!({"string": "mig"})
    );
    assert_eq!(
        d["attributes"]["driverVersion"],
        serde_json::json!({"version": "580.105.8"})
    );
    assert_eq!(
        d["attributes"]["resource.kubernetes.io/numaNode"],
        serde_json::json!({"int": 0})
    );
    assert_eq!(
        d["capacity"]["memorySlice7"],
        serde_json::json!({"value": "1"})
    );
    assert_eq!(
        json["pool"],
        serde_json::json!({"name": "n", "generation": 1, "resourceSliceCount": 1})
    );
    assert_eq!(json["nodeName"], "n");
}
