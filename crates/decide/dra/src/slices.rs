//! The node's ResourceSlices (`resource.k8s.io/v1`) from its [`DeviceModel`].
//!
//! One pool named after the node, its generation supplied by the caller (bump it on every change,
//! so the scheduler never mixes slices of two generations). Devices go in publishing order into
//! slices of at most 128 (64 where a slice holds a device with taints or counter consumption);
//! counter sets go into slices of their own (Kubernetes 1.35: a slice has devices or shared
//! counters, never both), at most 8 sets each, placed before the device slices as NVIDIA's
//! driver does.

use crate::model::{AttrValue, CounterSet, Device, DeviceModel};
use crate::names::DRIVER_NAME;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Devices in one slice.
pub const MAX_DEVICES_PER_SLICE: usize = 128;
/// Devices in one slice where any of them has taints or consumes counters.
pub const MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS: usize = 64;
/// Counter sets in one slice.
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// Attributes and capacities of one device together.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;

/// The slices of `node_name`'s pool at `generation`. Empty when the model has no devices: the
/// caller then deletes the pool's slices rather than publish an empty one.
pub fn resource_slices(
    node_name: &str,
    generation: i64,
    model: &DeviceModel,
) -> Vec<res::ResourceSliceSpec> {
    let mut counter_chunks: Vec<&[CounterSet]> = Vec::new();
    let mut device_chunks: Vec<&[Device]> = Vec::new();
    if !model.devices.is_empty() {
        counter_chunks = model
            .counter_sets
            .chunks(MAX_COUNTER_SETS_PER_SLICE)
            .collect();
        device_chunks = chunk_devices(&model.devices);
    }
    let count = (counter_chunks.len() + device_chunks.len()) as i64;
    let spec = |devices: Option<Vec<res::Device>>,
                shared_counters: Option<Vec<res::CounterSet>>| {
        res::ResourceSliceSpec {
            driver: DRIVER_NAME.to_string(),
            node_name: Some(node_name.to_string()),
            pool: res::ResourcePool {
                name: node_name.to_string(),
                generation,
                resource_slice_count: count,
            },
            devices,
            shared_counters,
            ..Default::default()
        }
    };
    let mut out = Vec::new();
    for sets in counter_chunks {
        out.push(spec(None, Some(sets.iter().map(k8s_counter_set).collect())));
    }
    for devices in device_chunks {
        out.push(spec(Some(devices.iter().map(k8s_device).collect()), None));
    }
    out
}

/// Greedy, in order: a slice closes when the next device would exceed its limit, which drops to
/// 64 as soon as it holds a device with taints or counters.
fn chunk_devices(devices: &[Device]) -> Vec<&[Device]> {
    let mut out = Vec::new();
    let mut begin = 0;
    let mut restricted = false;
    for (i, d) in devices.iter().enumerate() {
        let this = !d.taints.is_empty() || d.consumes.is_some();
        let len = i - begin + 1;
        let limit = if restricted || this {
            MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS
        } else {
            MAX_DEVICES_PER_SLICE
        };
        if len > limit {
            out.push(&devices[begin..i]);
            begin = i;
            restricted = this;
        } else {
            restricted |= this;
        }
    }
    if begin < devices.len() {
        out.push(&devices[begin..]);
    }
    out
}

fn quantity(v: u64) -> Quantity {
    Quantity(v.to_string())
}

fn counters(c: &BTreeMap<String, u64>) -> BTreeMap<String, res::Counter> {
    c.iter()
        .map(|(k, v)| {
            (
                k.clone(),
                res::Counter {
                    value: quantity(*v),
                },
            )
        })
        .collect()
}

/// A counter set as the API writes it.
pub fn k8s_counter_set(set: &CounterSet) -> res::CounterSet {
    res::CounterSet {
        name: set.name.clone(),
        counters: counters(&set.counters),
    }
}

/// A device as the API writes it.
pub fn k8s_device(d: &Device) -> res::Device {
    let attributes = d
        .attributes
        .iter()
        .map(|(k, v)| {
            let mut a = res::DeviceAttribute::default();
            match v {
                AttrValue::String(s) => a.string = Some(s.clone()),
                AttrValue::Int(i) => a.int = Some(*i),
                AttrValue::Bool(b) => a.bool = Some(*b),
                AttrValue::Version(s) => a.version = Some(s.clone()),
            }
            (k.clone(), a)
        })
        .collect();
    let capacity = d
        .capacity
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                res::DeviceCapacity {
                    value: quantity(*v),
                    request_policy: None,
                },
            )
        })
        .collect::<BTreeMap<_, _>>();
    res::Device {
        name: d.name.clone(),
        attributes: Some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: d.consumes.as_ref().map(|c| {
            vec![res::DeviceCounterConsumption {
                counter_set: c.counter_set.clone(),
                counters: counters(&c.counters),
            }]
        }),
        taints: (!d.taints.is_empty()).then(|| {
            d.taints
                .iter()
                .map(|t| res::DeviceTaint {
                    key: t.key.clone(),
                    value: t.value.clone(),
                    effect: t.effect.as_str().to_string(),
                    time_added: None,
                })
                .collect()
        }),
        ..Default::default()
    }
}
