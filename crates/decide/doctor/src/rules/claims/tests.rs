use crate::testkit::*;
use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodResourceClaimStatus};
use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, Device, DeviceAllocationResult, DeviceAttribute,
    DeviceClaim, DeviceClass, DeviceClassSpec, DeviceRequest, DeviceRequestAllocationResult,
    DeviceSelector, ExactDeviceRequest, ResourceClaim, ResourceClaimConsumerReference,
    ResourceClaimSpec, ResourceClaimStatus, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const H100: &str = "NVIDIA H100 80GB HBM3";
const SCHED: &str = "0/2 nodes are available: 2 cannot allocate all claims. still not schedulable, preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.";

fn meta(ns: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(str::to_string),
        ..ObjectMeta::default()
    }
}

fn selector(e: &str) -> DeviceSelector {
    DeviceSelector {
        cel: Some(CELDeviceSelector {
            expression: e.into(),
        }),
    }
}

/// The chart's gpu.nvidia.com class.
fn gpu_class() -> DeviceClass {
    DeviceClass {
        metadata: meta(None, "gpu.nvidia.com"),
        spec: DeviceClassSpec {
            selectors: Some(vec![selector(
                r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "gpu""#,
            )]),
            ..DeviceClassSpec::default()
        },
    }
}

/// A slice as the agent publishes it: pool = node, `gpu-<i>` devices.
fn slice(node: &str, product: &str, gpus: usize) -> ResourceSlice {
    let dev = |i: usize| Device {
        name: format!("gpu-{i}"),
        attributes: Some(
            [("type", "gpu"), ("productName", product)]
                .into_iter()
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        DeviceAttribute {
                            string: Some(v.into()),
                            ..DeviceAttribute::default()
                        },
                    )
                })
                .collect(),
        ),
        ..Device::default()
    };
    ResourceSlice {
        metadata: meta(None, &format!("{node}-gpu.nvidia.com")),
        spec: ResourceSliceSpec {
            driver: "gpu.nvidia.com".into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 1,
                resource_slice_count: 1,
            },
            devices: Some((0..gpus).map(dev).collect()),
            ..ResourceSliceSpec::default()
        },
    }
}

fn claim(ns: &str, name: &str, class: &str, sel: Option<&str>) -> ResourceClaim {
    ResourceClaim {
        metadata: meta(Some(ns), name),
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpu".into(),
                    exactly: Some(ExactDeviceRequest {
                        device_class_name: class.into(),
                        selectors: sel.map(|s| vec![selector(s)]),
                        ..ExactDeviceRequest::default()
                    }),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    }
}

fn allocated(mut c: ResourceClaim, node: &str, device: &str, pod: &str) -> ResourceClaim {
    c.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "gpu".into(),
                    driver: "gpu.nvidia.com".into(),
                    pool: node.into(),
                    device: device.into(),
                    ..DeviceRequestAllocationResult::default()
                }]),
                ..DeviceAllocationResult::default()
            }),
            ..AllocationResult::default()
        }),
        reserved_for: Some(vec![ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: pod.into(),
            uid: "u".into(),
            ..ResourceClaimConsumerReference::default()
        }]),
        ..ResourceClaimStatus::default()
    });
    c
}

/// A pod with one claim from a template, generated as `<pod>-gpu`.
fn claim_pod(ns: &str, name: &str) -> Pod {
    let mut p = pod(ns, name, &[]);
    p.spec.as_mut().unwrap().resource_claims = Some(vec![PodResourceClaim {
        name: "gpu".into(),
        resource_claim_template_name: Some("one-gpu".into()),
        ..PodResourceClaim::default()
    }]);
    p.status.as_mut().unwrap().resource_claim_statuses = Some(vec![PodResourceClaimStatus {
        name: "gpu".into(),
        resource_claim_name: Some(format!("{name}-gpu")),
    }]);
    p
}

fn gpu_nodes() -> Vec<k8s_openapi::api::core::v1::Node> {
    ["dra-1", "dra-2"]
        .into_iter()
        .map(|n| {
            let mut node = node(n);
            label(&mut node, "nvidia.com/gpu.present", "true");
            node
        })
        .collect()
}

/// Every claim finding's commands are in its fix, as printed (the doctor's contract).
fn run_claims(s: &crate::Snapshot) -> Vec<crate::Finding> {
    let f = crate::testkit::run(s);
    for x in f.iter().filter(|x| x.code.starts_with("claim-")) {
        assert!(!x.commands.is_empty(), "{x:#?}");
        for c in &x.commands {
            assert!(x.fix.contains(c.as_str()), "{c} not in {}", x.fix);
        }
    }
    f
}

fn cluster(
    pods: Vec<Pod>,
    claims: Vec<ResourceClaim>,
    slices: Vec<ResourceSlice>,
) -> crate::Snapshot {
    let mut s = snapshot(gpu_nodes(), pods, vec![]);
    s.dra.claims = claims;
    s.dra.slices = slices;
    s.dra.classes = vec![gpu_class()];
    s
}

#[test]
fn a_typo_in_product_name_quotes_the_values_that_exist() {
    let sel = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HMB3""#;
    let s = cluster(
        vec![unschedulable(claim_pod("ml", "train"), SCHED)],
        vec![claim("ml", "train-gpu", "gpu.nvidia.com", Some(sel))],
        vec![
            slice("dra-1", H100, 4),
            slice("dra-2", "NVIDIA A100-SXM4-40GB", 2),
        ],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-matches-none");
    assert!(
        got.title.contains("ml/train") && got.title.contains("train-gpu"),
        "{got:#?}"
    );
    let ev = got.evidence.join("\n");
    assert!(ev.contains(sel), "{ev}");
    assert!(
        ev.contains(&format!("{H100:?}")) && ev.contains("\"NVIDIA A100-SXM4-40GB\""),
        "{ev}"
    );
    assert!(ev.contains("cannot allocate all claims"), "{ev}");
    assert_eq!(
        got.commands,
        vec!["kubectl describe resourceclaim -n ml train-gpu"]
    );

    // Variant: the right name (the scheduler would allocate): nothing to say.
    let ok = r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3""#;
    let s = cluster(
        vec![claim_pod("ml", "train")],
        vec![claim("ml", "train-gpu", "gpu.nvidia.com", Some(ok))],
        vec![slice("dra-1", H100, 4), slice("dra-2", H100, 4)],
    );
    assert!(
        run(&s).iter().all(|f| !f.code.starts_with("claim-")),
        "{:#?}",
        run(&s)
    );

    // Variant: an attribute no device has (profile on whole GPUs).
    let sel = r#"device.attributes["gpu.nvidia.com"].profile == "1g.10gb""#;
    let s = cluster(
        vec![unschedulable(claim_pod("ml", "mig"), SCHED)],
        vec![claim("ml", "mig-gpu", "gpu.nvidia.com", Some(sel))],
        vec![slice("dra-1", H100, 4), slice("dra-2", H100, 4)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-matches-none");
    assert!(
        got.evidence.iter().any(|e| e.contains("no device has it")),
        "{got:#?}"
    );
}

#[test]
fn a_class_without_devices_and_a_class_that_does_not_exist() {
    // The mig.nvidia.com class exists but no slice has a MIG device.
    let mut mig = gpu_class();
    mig.metadata.name = Some("mig.nvidia.com".into());
    mig.spec.selectors = Some(vec![selector(
        r#"device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig""#,
    )]);
    let mut s = cluster(
        vec![unschedulable(claim_pod("ml", "small"), SCHED)],
        vec![claim("ml", "small-gpu", "mig.nvidia.com", None)],
        vec![slice("dra-1", H100, 4), slice("dra-2", H100, 4)],
    );
    s.dra.classes.push(mig);
    let f = run_claims(&s);
    let got = one(&f, "claim-no-device");
    assert!(got.title.contains("mig.nvidia.com"), "{got:#?}");
    assert!(got.fix.contains("gpu.nvidia.com"), "{}", got.fix);

    // No slices at all: the same, and drivers "none".
    let mut s = cluster(
        vec![unschedulable(claim_pod("ml", "small"), SCHED)],
        vec![claim("ml", "small-gpu", "gpu.nvidia.com", None)],
        vec![],
    );
    s.nodes.clear();
    let got = run_claims(&s);
    assert!(one(&got, "claim-no-device").fix.contains("none"));

    // A class name with a typo: the class does not exist.
    let s = cluster(
        vec![unschedulable(
            claim_pod("ml", "t"),
            "0/2 nodes are available: request gpu: device class gpu.nvidia.comm does not exist.",
        )],
        vec![claim("ml", "t-gpu", "gpu.nvidia.comm", None)],
        vec![slice("dra-1", H100, 4)],
    );
    let got = run_claims(&s);
    assert!(
        one(&got, "claim-no-class")
            .title
            .contains("gpu.nvidia.comm")
    );
}

#[test]
fn all_matching_devices_allocated_names_the_holders() {
    let s = cluster(
        vec![
            unschedulable(claim_pod("ml", "second"), SCHED),
            running(claim_pod("ml", "first"), "dra-1"),
        ],
        vec![
            claim("ml", "second-gpu", "gpu.nvidia.com", None),
            allocated(
                claim("ml", "first-gpu", "gpu.nvidia.com", None),
                "dra-1",
                "gpu-0",
                "first",
            ),
        ],
        vec![slice("dra-1", H100, 1)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-devices-allocated");
    let ev = got.evidence.join("\n");
    assert!(
        ev.contains("dra-1/gpu-0 to claim ml/first-gpu (pod ml/first)"),
        "{ev}"
    );
    // Variant: a second device free: nothing (the allocated claim itself is fine too).
    let s = cluster(
        vec![
            claim_pod("ml", "second"),
            running(claim_pod("ml", "first"), "dra-1"),
        ],
        vec![
            claim("ml", "second-gpu", "gpu.nvidia.com", None),
            allocated(
                claim("ml", "first-gpu", "gpu.nvidia.com", None),
                "dra-1",
                "gpu-0",
                "first",
            ),
        ],
        vec![slice("dra-1", H100, 2)],
    );
    assert!(run(&s).iter().all(|f| !f.code.starts_with("claim-")));
}

#[test]
fn driver_not_registered_and_prepare_failed() {
    // Devices exist on dra-1 only; the scheduler says it cannot allocate: dra-2 has no slice.
    let mut p = unschedulable(claim_pod("ml", "p"), SCHED);
    p.spec.as_mut().unwrap().node_selector =
        Some([("kubernetes.io/hostname".to_string(), "dra-2".to_string())].into());
    let s = cluster(
        vec![p],
        vec![claim("ml", "p-gpu", "gpu.nvidia.com", None)],
        vec![slice("dra-1", H100, 4)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-driver-not-registered");
    assert!(
        got.title.contains("dra-2") && !got.title.contains("dra-1"),
        "{got:#?}"
    );

    // Bound, the kubelet's prepare failed: the driver's message quoted.
    let msg = "Failed to prepare dynamic resources: prepare dynamic resources: NodePrepareResources failed for ResourceClaim ml/q-gpu: sharing.timeSlicingConfig.interval: unknown value \"Fast\"";
    let mut s = cluster(
        vec![claim_pod("ml", "q")],
        vec![allocated(
            claim("ml", "q-gpu", "gpu.nvidia.com", None),
            "dra-1",
            "gpu-0",
            "q",
        )],
        vec![slice("dra-1", H100, 4), slice("dra-2", H100, 4)],
    );
    s.pods[0].spec.as_mut().unwrap().node_name = Some("dra-1".into());
    s.events = vec![event(
        "Pod",
        "ml",
        "q",
        "FailedPrepareDynamicResources",
        msg,
        30,
    )];
    let f = run_claims(&s);
    let got = one(&f, "claim-prepare-failed");
    assert!(
        got.evidence.iter().any(|e| e.contains("unknown value")),
        "{got:#?}"
    );
    // A look-alike: the same pod without the event says nothing.
    s.events.clear();
    assert!(run(&s).iter().all(|f| !f.code.starts_with("claim-")));
}

#[test]
fn without_the_dra_objects_the_schedulers_words_are_explained() {
    let mut s = cluster(
        vec![unschedulable(claim_pod("ml", "p"), SCHED)],
        vec![],
        vec![],
    );
    s.dra = crate::Dra {
        unread: Some("resourceclaims.resource.k8s.io is forbidden".into()),
        ..crate::Dra::default()
    };
    let f = run_claims(&s);
    let got = one(&f, "claim-unschedulable");
    assert!(
        got.evidence.iter().any(|e| e.contains("cannot know")),
        "{got:#?}"
    );
    assert!(
        got.title.contains("no node's ResourceSlices"),
        "{}",
        got.title
    );

    // A missing claim (template not turned into a claim yet), with the objects read.
    let mut p = claim_pod("ml", "new");
    p.status.as_mut().unwrap().resource_claim_statuses = None;
    let s = cluster(vec![p.clone()], vec![], vec![slice("dra-1", H100, 1)]);
    let f = run_claims(&s);
    one(&f, "claim-missing");
    // ...but not while the controller may still be creating it.
    p.metadata.creation_timestamp = Some(ago(5));
    let s = cluster(vec![p], vec![], vec![slice("dra-1", H100, 1)]);
    assert!(with_code(&run(&s), "claim-missing").is_empty());

    // An expression the evaluator stops on (no regular expressions here) is quoted, never guessed.
    let sel = r#"device.attributes["gpu.nvidia.com"].productName.matches("^NVIDIA H1")"#;
    let s = cluster(
        vec![unschedulable(claim_pod("ml", "x"), SCHED)],
        vec![claim("ml", "x-gpu", "gpu.nvidia.com", Some(sel))],
        vec![slice("dra-1", H100, 1)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-not-evaluated");
    assert!(got.evidence.iter().any(|e| e.contains(sel)), "{got:#?}");
}

/// Selectors the doctor's former subset called "cannot evaluate" (`startsWith`, `||`, `in`) get
/// the scheduler's verdict: silence when a free device matches, the values that exist when none
/// does.
#[test]
fn selectors_beyond_comparisons_are_evaluated() {
    let a100 = "NVIDIA A100-SXM4-40GB";
    let pending = |sel: &str| {
        cluster(
            vec![unschedulable(claim_pod("ml", "x"), SCHED)],
            vec![claim("ml", "x-gpu", "gpu.nvidia.com", Some(sel))],
            vec![slice("dra-1", H100, 2), slice("dra-2", a100, 2)],
        )
    };
    for sel in [
        r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H1")"#,
        r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA B200" || device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3""#,
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA B200", "NVIDIA A100-SXM4-40GB"]"#,
    ] {
        let f = run_claims(&pending(sel));
        assert!(
            f.iter().all(|f| !f.code.starts_with("claim-selector")),
            "{sel}: {f:#?}"
        );
    }
    for sel in [
        r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H2")"#,
        r#"device.attributes["gpu.nvidia.com"].productName == "NVIDIA B200" || device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HMB3""#,
        r#"device.attributes["gpu.nvidia.com"].productName in ["NVIDIA B200", "NVIDIA A100-SXM4-80GB"]"#,
    ] {
        let f = run_claims(&pending(sel));
        let got = one(&f, "claim-selector-matches-none");
        let ev = got.evidence.join("\n");
        assert!(ev.contains(sel), "{ev}");
        assert!(
            ev.contains(&format!("gpu.nvidia.com/productName: \"{a100}\", {H100:?}")),
            "{ev}"
        );
    }
}

/// A selector that does not parse (a class's or a claim's) is reported with the CEL error and
/// the expression quoted; no device is judged on it.
#[test]
fn a_malformed_selector_is_quoted_with_the_cel_error() {
    let sel = r#"device.attributes["gpu.nvidia.com"].productName == "#;
    let s = cluster(
        vec![unschedulable(claim_pod("ml", "x"), SCHED)],
        vec![claim("ml", "x-gpu", "gpu.nvidia.com", Some(sel))],
        vec![slice("dra-1", H100, 1), slice("dra-2", H100, 1)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-not-evaluated");
    assert!(
        got.evidence
            .iter()
            .any(|e| e == &format!("selector not evaluated: {sel}")),
        "{got:#?}"
    );
    let cel = got
        .evidence
        .iter()
        .find(|e| e.starts_with("CEL: "))
        .unwrap_or_else(|| panic!("{got:#?}"));
    assert!(cel.len() > "CEL: ".len(), "{cel}");
    assert!(got.fix.contains(sel), "{}", got.fix);

    // The same in the class: reported for the class, before any claim selector.
    let mut s = cluster(
        vec![unschedulable(claim_pod("ml", "x"), SCHED)],
        vec![claim("ml", "x-gpu", "gpu.nvidia.com", None)],
        vec![slice("dra-1", H100, 1), slice("dra-2", H100, 1)],
    );
    s.dra.classes[0].spec.selectors = Some(vec![selector("device.driver ==")]);
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-not-evaluated");
    assert!(
        got.evidence
            .iter()
            .any(|e| e == "selector not evaluated: device.driver =="),
        "{got:#?}"
    );

    // A runtime error names the device it stopped on.
    let sel = r#"device.attributes["gpu.nvidia.com"].productName > 3"#;
    let s = cluster(
        vec![unschedulable(claim_pod("ml", "x"), SCHED)],
        vec![claim("ml", "x-gpu", "gpu.nvidia.com", Some(sel))],
        vec![slice("dra-1", H100, 1), slice("dra-2", H100, 1)],
    );
    let f = run_claims(&s);
    let got = one(&f, "claim-selector-not-evaluated");
    assert!(
        got.evidence.iter().any(
            |e| e.starts_with("CEL: ") && e.contains("on device dra-1/gpu-0 of gpu.nvidia.com")
        ),
        "{got:#?}"
    );
}
