use crate::ClaimError;
use crate::cel::{Functions, Selector, Verdict, device_value};
use crate::claim::{AlternativeSpec, ClaimSpec, Classes, Count, NodeDevices, RequestSpec};
use crate::node::{self, NewNode};
use crate::plan::{Existing, ExistingKind, Outcome, PodClaims, PoolShape, plan};
use gpuops_dra::classes::{CLASS_GPU, CLASS_MIG, device_classes};

fn classes() -> Classes {
    crate::k8s::classes(&device_classes(false))
}

fn model(key: &str) -> &'static gpuops_catalog::GpuModel {
    gpuops_catalog::lookup(key).unwrap()
}

fn new_node(key: &str, gpus: u32, dynamic_mig: bool) -> gpuops_dra::DeviceModel {
    node::devices(&NewNode {
        model: model(key),
        gpus,
        dynamic_mig,
    })
}

/// Whether `expr` selects the first device of a one-GPU node of `key`.
fn eval(key: &str, expr: &str) -> Result<Verdict, ClaimError> {
    let m = new_node(key, 1, false);
    let s = Selector::compile("ns/c", expr)?;
    s.matches(&Functions::new(), &device_value(&m.devices[0]))
}

fn claim(name: &str, class: &str, sel: &[&str], count: Count) -> ClaimSpec {
    ClaimSpec {
        name: name.into(),
        requests: vec![RequestSpec {
            name: "gpu".into(),
            alternatives: vec![AlternativeSpec {
                name: "gpu".into(),
                class: class.into(),
                selectors: sel.iter().map(|s| s.to_string()).collect(),
                count,
            }],
        }],
    }
}

#[test]
fn product_memory_and_compute_capability_are_evaluated() {
    let h100 = model("H100-SXM5-80GB").nvml_name;
    let product = format!("device.attributes['gpu.nvidia.com'].productName == '{h100}'");
    assert_eq!(eval("H100-SXM5-80GB", &product), Ok(Verdict::Match));
    assert_eq!(eval("A100-SXM4-40GB", &product), Ok(Verdict::NoMatch));
    let mem = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0";
    assert_eq!(eval("H100-SXM5-80GB", mem), Ok(Verdict::Match));
    assert_eq!(
        eval("A100-SXM4-40GB", mem),
        Ok(Verdict::NoMatch),
        "40 GiB is not more than 40Gi"
    );
    let cc =
        "device.attributes['gpu.nvidia.com'].cudaComputeCapability.isGreaterThan(semver('8.9.0'))";
    assert_eq!(eval("H100-SXM5-80GB", cc), Ok(Verdict::Match));
    assert_eq!(eval("A100-SXM4-40GB", cc), Ok(Verdict::NoMatch));
    assert_eq!(
        eval(
            "H100-SXM5-80GB",
            "device.attributes['gpu.nvidia.com'].cudaComputeCapability.major() == 9"
        ),
        Ok(Verdict::Match)
    );
    assert_eq!(
        eval(
            "H100-SXM5-80GB",
            "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
        ),
        Ok(Verdict::Match)
    );
    // The qualified standard attributes live under their own domain.
    assert_eq!(
        eval(
            "H100-SXM5-80GB",
            "device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000')"
        ),
        Ok(Verdict::Match)
    );
    // A missing attribute or domain is no match, not an error.
    assert_eq!(
        eval(
            "H100-SXM5-80GB",
            "device.attributes['gpu.nvidia.com'].nope == 'x'"
        ),
        Ok(Verdict::NoMatch)
    );
    assert_eq!(
        eval(
            "H100-SXM5-80GB",
            "device.attributes['other.example.com'].x == 1"
        ),
        Ok(Verdict::NoMatch)
    );
}

#[test]
fn unsupported_cel_names_the_claim_and_the_expression() {
    for expr in [
        "device.attributes['gpu.nvidia.com'].productName.matchesGlob('H*')",
        "device.capacity['gpu.nvidia.com'].memory > ",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(semver('1.0.0')) > 0",
        "'not a bool'",
    ] {
        match eval("H100-SXM5-80GB", expr) {
            Err(ClaimError::UnsupportedCel {
                claim, expression, ..
            }) => {
                assert_eq!(claim, "ns/c");
                assert_eq!(expression, expr);
            }
            other => panic!("{expr}: {other:?}"),
        }
    }
    let e = eval("H100-SXM5-80GB", "quantity('40Qi') == quantity('1')").unwrap_err();
    assert!(
        e.to_string().contains("ns/c") && e.to_string().contains("40Qi"),
        "{e}"
    );
}

#[test]
fn mig_profiles_are_selected_on_a_dynamic_mig_node() {
    let m = new_node("H100-SXM5-80GB", 1, true);
    let fns = Functions::new();
    let sel = Selector::compile(
        "ns/c",
        "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'",
    )
    .unwrap();
    let n = m
        .devices
        .iter()
        .filter(|d| sel.matches(&fns, &device_value(d)) == Ok(Verdict::Match))
        .count();
    assert_eq!(n, 7, "seven 1g.10gb placements on an H100");
    // Seven fit on one GPU (the counters), an eighth does not.
    let c = |count| {
        claim(
            "ns/m",
            CLASS_MIG,
            &["device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"],
            Count::Exact(count),
        )
    };
    let mut node = NodeDevices::new(m.clone());
    let cls = classes();
    assert!(
        node.allocate(&fns, &[c(7).compile(&cls).unwrap()])
            .unwrap()
            .is_some()
    );
    let mut node = NodeDevices::new(m.clone());
    assert!(
        node.allocate(&fns, &[c(8).compile(&cls).unwrap()])
            .unwrap()
            .is_none()
    );
    // A whole GPU and any MIG device share the counters: never both.
    let mut node = NodeDevices::new(m);
    let whole = claim("ns/w", CLASS_GPU, &[], Count::Exact(1))
        .compile(&cls)
        .unwrap();
    assert!(node.allocate(&fns, &[whole]).unwrap().is_some());
    assert!(
        node.allocate(&fns, &[c(1).compile(&cls).unwrap()])
            .unwrap()
            .is_none()
    );
}

#[test]
fn count_and_all_take_the_devices_they_say() {
    let fns = Functions::new();
    let cls = classes();
    let m = new_node("A100-SXM4-40GB", 4, false);
    let mut node = NodeDevices::new(m.clone());
    let four = claim("ns/a", CLASS_GPU, &[], Count::Exact(4))
        .compile(&cls)
        .unwrap();
    let got = node.allocate(&fns, &[four]).unwrap().unwrap();
    assert_eq!(got[0].len(), 4);
    let one = claim("ns/b", CLASS_GPU, &[], Count::Exact(1))
        .compile(&cls)
        .unwrap();
    assert!(
        node.allocate(&fns, &[one]).unwrap().is_none(),
        "all four taken"
    );
    let mut node = NodeDevices::new(m.clone());
    let all = claim("ns/all", CLASS_GPU, &[], Count::All)
        .compile(&cls)
        .unwrap();
    assert_eq!(node.allocate(&fns, &[all]).unwrap().unwrap()[0].len(), 4);
    // All fails once any matching device is taken.
    let mut node = NodeDevices::new(m);
    node.mark_used(["gpu-0"]);
    let all = claim("ns/all", CLASS_GPU, &[], Count::All)
        .compile(&cls)
        .unwrap();
    assert!(node.allocate(&fns, &[all]).unwrap().is_none());
}

#[test]
fn first_available_takes_the_first_alternative_that_fits() {
    let fns = Functions::new();
    let cls = classes();
    let h100 = model("H100-SXM5-80GB").nvml_name;
    let spec = ClaimSpec {
        name: "ns/fa".into(),
        requests: vec![RequestSpec {
            name: "gpu".into(),
            alternatives: vec![
                AlternativeSpec {
                    name: "gpu/big".into(),
                    class: CLASS_GPU.into(),
                    selectors: vec![format!(
                        "device.attributes['gpu.nvidia.com'].productName == '{h100}'"
                    )],
                    count: Count::Exact(2),
                },
                AlternativeSpec {
                    name: "gpu/any".into(),
                    class: CLASS_GPU.into(),
                    selectors: vec![],
                    count: Count::Exact(1),
                },
            ],
        }],
    };
    let c = spec.compile(&cls).unwrap();
    let mut h = NodeDevices::new(new_node("H100-SXM5-80GB", 2, false));
    assert_eq!(
        h.allocate(&fns, std::slice::from_ref(&c)).unwrap().unwrap()[0][0].0,
        "gpu/big"
    );
    let mut a = NodeDevices::new(new_node("A100-SXM4-40GB", 2, false));
    let got = a.allocate(&fns, std::slice::from_ref(&c)).unwrap().unwrap();
    assert_eq!(got[0], vec![("gpu/any".to_string(), "gpu-0".to_string())]);
}

fn pools() -> Vec<PoolShape> {
    vec![
        PoolShape {
            name: "a100".into(),
            price_per_hour: 10.0,
            devices: new_node("A100-SXM4-40GB", 8, false),
            room: 10,
        },
        PoolShape {
            name: "h100".into(),
            price_per_hour: 30.0,
            devices: new_node("H100-SXM5-80GB", 8, false),
            room: 10,
        },
    ]
}

#[test]
fn the_cheapest_pool_whose_node_satisfies_every_claim_is_bought() {
    let cls = classes();
    let h100 = model("H100-SXM5-80GB").nvml_name;
    let pods = vec![
        PodClaims {
            pod: "ns/any".into(),
            claims: vec![claim("ns/c1", CLASS_GPU, &[], Count::Exact(1))],
        },
        PodClaims {
            pod: "ns/h".into(),
            claims: vec![claim(
                "ns/c2",
                CLASS_GPU,
                &[&format!(
                    "device.attributes['gpu.nvidia.com'].productName == '{h100}'"
                )],
                Count::Exact(1),
            )],
        },
        PodClaims {
            pod: "ns/none".into(),
            claims: vec![claim(
                "ns/c3",
                CLASS_GPU,
                &["device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('100Gi'))"],
                Count::Exact(1),
            )],
        },
        PodClaims {
            pod: "ns/bad".into(),
            claims: vec![claim(
                "ns/c4",
                CLASS_GPU,
                &["device.nope()"],
                Count::Exact(1),
            )],
        },
    ];
    let p = plan(&pods, &cls, vec![], &pools());
    assert!(matches!(&p.outcomes[0].1, Outcome::Buy { pool, .. } if pool == "a100"));
    assert!(matches!(&p.outcomes[1].1, Outcome::Buy { pool, .. } if pool == "h100"));
    assert!(matches!(&p.outcomes[2].1, Outcome::NoPool { tried } if tried.len() == 2));
    assert!(
        matches!(&p.outcomes[3].1, Outcome::Error(ClaimError::UnsupportedCel { claim, .. }) if claim == "ns/c4")
    );
    assert_eq!(p.buys.values().sum::<u32>(), 2);
}

#[test]
fn one_need_buys_one_node_counting_claims_in_flight() {
    let cls = classes();
    let pod = |i: u32| PodClaims {
        pod: format!("ns/p{i}"),
        claims: vec![claim(&format!("ns/c{i}"), CLASS_GPU, &[], Count::Exact(4))],
    };
    // Two 4-GPU pods share one new 8-GPU node; a third buys a second.
    let p = plan(&[pod(0), pod(1), pod(2)], &cls, vec![], &pools());
    assert_eq!(p.buys.get("a100"), Some(&2));
    // A machine in flight with 4 of its 8 GPUs already allocated serves one more pod, not two.
    let mut inflight = NodeDevices::new(new_node("A100-SXM4-40GB", 8, false));
    inflight.mark_used(["gpu-0", "gpu-1", "gpu-2", "gpu-3"]);
    let existing = vec![Existing {
        node: "a100-xyz".into(),
        devices: inflight,
        kind: ExistingKind::InFlight,
    }];
    let p = plan(&[pod(0), pod(1)], &cls, existing, &pools());
    assert!(matches!(&p.outcomes[0].1, Outcome::InFlight { node, .. } if node == "a100-xyz"));
    assert!(matches!(&p.outcomes[1].1, Outcome::Buy { .. }));
    assert_eq!(p.buys.values().sum::<u32>(), 1);
}

#[test]
fn a_mig_claim_that_fits_an_existing_node_after_repartition_buys_nothing() {
    let cls = classes();
    let mig = |i: u32, profile: &str| PodClaims {
        pod: format!("ns/m{i}"),
        claims: vec![claim(
            &format!("ns/m{i}"),
            CLASS_MIG,
            &[&format!(
                "device.attributes['gpu.nvidia.com'].profile == '{profile}'"
            )],
            Count::Exact(1),
        )],
    };
    let mut existing_node = NodeDevices::new(new_node("H100-SXM5-80GB", 1, true));
    // Its one GPU already holds a 4g.40gb and a 3g.40gb: 1g.10gb no longer fits.
    let full: Vec<String> = existing_node
        .model()
        .devices
        .iter()
        .filter(|d| {
            d.mig.as_ref().is_some_and(|m| {
                (m.profile == "4g.40gb" && m.placement_start == 0)
                    || (m.profile == "3g.40gb" && m.placement_start == 4)
            })
        })
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(full.len(), 2, "{full:?}");
    let mut busy = existing_node.clone();
    busy.mark_used(full.iter().map(String::as_str));
    existing_node.mark_used(full.iter().take(1).map(String::as_str));
    let pools = vec![PoolShape {
        name: "h100".into(),
        price_per_hour: 30.0,
        devices: new_node("H100-SXM5-80GB", 8, true),
        room: 1,
    }];
    let p = plan(
        &[mig(0, "1g.10gb")],
        &cls,
        vec![Existing {
            node: "h1".into(),
            devices: existing_node,
            kind: ExistingKind::Repartitionable,
        }],
        &pools,
    );
    assert!(
        matches!(&p.outcomes[0].1, Outcome::Repartition { node, .. } if node == "h1"),
        "{p:?}"
    );
    assert!(p.buys.is_empty());
    let p = plan(
        &[mig(0, "1g.10gb")],
        &cls,
        vec![Existing {
            node: "h1".into(),
            devices: busy,
            kind: ExistingKind::Repartitionable,
        }],
        &pools,
    );
    assert!(matches!(&p.outcomes[0].1, Outcome::Buy { .. }), "{p:?}");
}

#[test]
fn pending_claims_come_from_names_and_templates_and_skip_allocated_ones() {
    use k8s_openapi::api::core::v1::{
        Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::api::resource::v1 as res;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let spec = |class: &str| res::ResourceClaimSpec {
        devices: Some(res::DeviceClaim {
            requests: Some(vec![res::DeviceRequest {
                name: "gpu".into(),
                exactly: Some(res::ExactDeviceRequest {
                    device_class_name: class.into(),
                    count: Some(2),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    };
    let meta = |n: &str| ObjectMeta {
        name: Some(n.into()),
        namespace: Some("ns".into()),
        ..Default::default()
    };
    let mut claims = crate::k8s::ByName::new();
    claims.insert(
        ("ns".into(), "named".into()),
        res::ResourceClaim {
            metadata: meta("named"),
            spec: spec(CLASS_GPU),
            status: None,
        },
    );
    claims.insert(
        ("ns".into(), "done".into()),
        res::ResourceClaim {
            metadata: meta("done"),
            spec: spec(CLASS_GPU),
            status: Some(res::ResourceClaimStatus {
                allocation: Some(res::AllocationResult {
                    devices: Some(res::DeviceAllocationResult {
                        results: Some(vec![res::DeviceRequestAllocationResult {
                            device: "gpu-3".into(),
                            driver: "gpu.nvidia.com".into(),
                            pool: "node-a".into(),
                            request: "gpu".into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        },
    );
    let mut templates = crate::k8s::ByName::new();
    templates.insert(
        ("ns".into(), "tmpl".into()),
        res::ResourceClaimTemplate {
            metadata: meta("tmpl"),
            spec: res::ResourceClaimTemplateSpec {
                metadata: None,
                spec: spec(CLASS_MIG),
            },
        },
    );
    let prc = |n: &str, claim: Option<&str>, tmpl: Option<&str>| PodResourceClaim {
        name: n.into(),
        resource_claim_name: claim.map(str::to_string),
        resource_claim_template_name: tmpl.map(str::to_string),
    };
    let pod = Pod {
        metadata: meta("p"),
        spec: Some(PodSpec {
            resource_claims: Some(vec![
                prc("a", Some("named"), None),
                prc("b", Some("done"), None),
                prc("c", None, Some("tmpl")),
            ]),
            ..Default::default()
        }),
        status: Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "c".into(),
                resource_claim_name: Some("p-c-xyz".into()),
            }]),
            ..Default::default()
        }),
    };
    let got = crate::k8s::pending_claims(&pod, &claims, &templates).unwrap();
    let names: Vec<&str> = got.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["ns/named", "ns/tmpl"]);
    assert_eq!(got[1].requests[0].alternatives[0].class, CLASS_MIG);
    assert_eq!(got[0].requests[0].alternatives[0].count, Count::Exact(2));
    let by_node = crate::k8s::allocated_devices(&claims);
    assert_eq!(by_node.get("node-a"), Some(&vec!["gpu-3".to_string()]));
}

#[test]
fn a_pool_at_zero_is_scaled_for_a_claim_and_not_again_while_in_flight() {
    use gpuops_autoscale::model::{NodeTemplate, Pool, Snapshot, StageTimeouts};
    let pool = |name: &str, product: &str, price: f64| Pool {
        name: name.into(),
        min: 0,
        max: 3,
        replicas: 0,
        price_per_hour: price,
        template: NodeTemplate {
            cpu_milli: 8000,
            memory_mib: 65536,
            gpus: 8,
            gpu_resource: String::new(),
            gpu_replicas: 1,
            gpu_product: product.into(),
            scalars: Default::default(),
            labels: Default::default(),
            taints: vec![],
        },
        timeouts: StageTimeouts::default(),
    };
    let h100 = model("H100-SXM5-80GB").nvml_name;
    let snap = Snapshot {
        pools: vec![
            pool("ns/a100", "NVIDIA-A100-SXM4-40GB", 10.0),
            pool("ns/h100", &h100.replace(' ', "-"), 30.0),
        ],
        nodes: vec![],
        machines: vec![],
        pending: vec![],
        pdbs: vec![],
        skipped_pools: vec![],
    };
    let sel = format!("device.attributes['gpu.nvidia.com'].productName == '{h100}'");
    let pods = vec![
        PodClaims {
            pod: "ns/p".into(),
            claims: vec![claim("ns/c", CLASS_GPU, &[&sel], Count::Exact(1))],
        },
        PodClaims {
            pod: "ns/q".into(),
            claims: vec![claim(
                "ns/d",
                CLASS_GPU,
                &["device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B300'"],
                Count::Exact(1),
            )],
        },
    ];
    let cls = classes();
    let d = crate::demand::decide(&snap, &[], &[], &pods, &cls, &Default::default());
    assert_eq!(d.scale_ups.len(), 1, "{:?}", d.scale_ups);
    assert_eq!(
        (
            d.scale_ups[0].pool.as_str(),
            d.scale_ups[0].from,
            d.scale_ups[0].to
        ),
        ("ns/h100", 0, 1)
    );
    assert!(
        d.events
            .iter()
            .any(|e| e.target == gpuops_autoscale::Target::Pod("ns/q".into()) && e.warning)
    );
    // Next pass: the replica is in flight, so the same need buys nothing more.
    let flying = [gpuops_autoscale::InFlight {
        pool: "ns/h100".into(),
        stage: None,
        count: 1,
    }];
    let mut snap2 = snap.clone();
    snap2.pools[1].replicas = 1;
    let d2 = crate::demand::decide(&snap2, &flying, &[], &pods[..1], &cls, &Default::default());
    assert!(d2.scale_ups.is_empty(), "{:?}", d2.scale_ups);
    // Registered, its slices not yet seen by the scheduler: the node's free devices serve the
    // pod, nothing more is bought; once its 8 GPUs are held by claims, a new need buys again.
    let mut snap3 = snap2.clone();
    snap3.nodes.push(serde_node("h100-node-0", "ns/h100"));
    let d3 = crate::demand::decide(&snap3, &[], &[], &pods[..1], &cls, &Default::default());
    assert!(d3.scale_ups.is_empty(), "{:?}", d3.scale_ups);
    let held = std::collections::BTreeMap::from([(
        "h100-node-0".to_string(),
        (0..8).map(|i| format!("gpu-{i}")).collect::<Vec<_>>(),
    )]);
    let d4 = crate::demand::decide(&snap3, &[], &[], &pods[..1], &cls, &held);
    assert_eq!(d4.scale_ups.len(), 1, "{:?}", d4.scale_ups);
    // Merged with the pass's own scale-up of the same pool: one patch, both nodes.
    let mut ups = vec![ScaleUpFixture::of("ns/h100", 0, 2)];
    crate::demand::merge(&mut ups, d.scale_ups);
    assert_eq!((ups.len(), ups[0].to), (1, 3));
}

struct ScaleUpFixture;
impl ScaleUpFixture {
    fn of(pool: &str, from: u32, to: u32) -> gpuops_autoscale::ScaleUp {
        gpuops_autoscale::ScaleUp {
            pool: pool.into(),
            from,
            to,
            pods: vec![],
            triggered_by: vec![],
            message: String::new(),
        }
    }
}

fn serde_node(name: &str, pool: &str) -> gpuops_autoscale::Node {
    gpuops_autoscale::Node {
        name: name.into(),
        pool: Some(pool.into()),
        machine: None,
        labels: Default::default(),
        taints: vec![],
        unschedulable: false,
        cpu_free_milli: 8000,
        memory_free_mib: 65536,
        gpu_resource: String::new(),
        gpu_replicas: 1,
        gpu_free: vec![],
        gpu_product: String::new(),
        scalars_free: Default::default(),
        pods: vec![],
        gpu_util: None,
        removing: false,
    }
}
