//! The claim checkpoint's format across agent versions.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_dra::DraError;
use gpuops_dra::checkpoint::*;
use serde_json::json;

fn sample() -> Checkpoint {
    let mut c = Checkpoint::default();
    c.claims.insert(
        "uid-1".into(),
        PreparedClaim {
            namespace: "ml".into(),
            name: "train-gpu".into(),
            state: ClaimState::Prepared,
            devices: vec![PreparedDevice {
                request_names: vec!["gpu".into()],
                pool: "node-a".into(),
                device: "gpu-0-mig-1g10gb-19-3".into(),
                cdi_device_ids: vec!["k8s.gpu.nvidia.com/claim=uid-1-gpu-0-mig-1g10gb-19-3".into()],
                share_id: None,
                mig: Some(CreatedMig {
                    parent_uuid: "GPU-a".into(),
                    gi_profile_id: 19,
                    placement_start: 3,
                    gi_id: 7,
                    ci_id: 0,
                    uuid: "MIG-x".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    c
}

#[test]
fn round_trips() {
    let c = sample();
    let bytes = to_json(&c).unwrap();
    assert_eq!(parse(&bytes).unwrap(), c);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["version"], 1);
    assert_eq!(v["minReaderVersion"], 1);
    assert_eq!(v["claims"]["uid-1"]["devices"][0]["mig"]["giProfileId"], 19);
    assert_eq!(v["claims"]["uid-1"]["state"], "Prepared");
}

#[test]
fn an_older_minimal_file_reads_with_defaults() {
    // What the first writer could have left: no state, no request names, no MIG, no share id.
    let old = json!({
        "version": 1,
        "minReaderVersion": 1,
        "claims": {"uid-2": {"namespace": "a", "name": "b",
            "devices": [{"pool": "n", "device": "gpu-1", "cdiDeviceIds": ["k8s.gpu.nvidia.com/claim=uid-2-gpu-1"]}]}}
    });
    let c = parse(old.to_string().as_bytes()).unwrap();
    let claim = &c.claims["uid-2"];
    assert_eq!(
        claim.state,
        ClaimState::Preparing,
        "unknown progress is redone, never assumed done"
    );
    assert_eq!(claim.devices[0].device, "gpu-1");
    assert!(claim.devices[0].mig.is_none() && claim.devices[0].request_names.is_empty());
    let empty = parse(br#"{"version": 1, "minReaderVersion": 1}"#).unwrap();
    assert!(empty.claims.is_empty());
}

#[test]
fn a_newer_file_reads_and_keeps_what_it_does_not_know() {
    let newer = json!({
        "version": 4,
        "minReaderVersion": 1,
        "nodeBootId": "b00t",
        "claims": {"uid-3": {"namespace": "a", "name": "b", "state": "Prepared", "mpsDaemon": {"pid": 42},
            "devices": [{"pool": "n", "device": "gpu-0", "requestNames": [], "cdiDeviceIds": [], "futureField": [1, 2],
                "mig": {"parentUuid": "GPU-a", "giProfileId": 19, "placementStart": 0, "giId": 1, "ciId": 0, "uuid": "MIG-y", "engines": 3}}]}}
    });
    let c = parse(newer.to_string().as_bytes()).unwrap();
    assert_eq!(c.version, 4);
    assert_eq!(c.extra["nodeBootId"], "b00t");
    assert_eq!(c.claims["uid-3"].extra["mpsDaemon"], json!({"pid": 42}));
    assert_eq!(
        c.claims["uid-3"].devices[0].extra["futureField"],
        json!([1, 2])
    );
    assert_eq!(
        c.claims["uid-3"].devices[0].mig.as_ref().unwrap().extra["engines"],
        3
    );
    // Written back by this (older) agent: nothing lost, and still marked as the newer format.
    let back: serde_json::Value = serde_json::from_slice(&to_json(&c).unwrap()).unwrap();
    assert_eq!(back, newer);
}

#[test]
fn files_this_agent_cannot_read_say_why() {
    let too_new = br#"{"version": 3, "minReaderVersion": 2, "claims": {}}"#;
    let e = parse(too_new).unwrap_err();
    assert_eq!(
        e,
        DraError::CheckpointTooNew {
            version: 3,
            min_reader: 2,
            supported: 1
        }
    );
    assert!(e.to_string().contains("reads up to version 1"), "{e}");

    for (bytes, needle) in [
        (&b""[..], "not JSON"),
        (
            b"{\"version\": 1, \"minReaderVersion\": 1, \"claims\": {\"u\": ",
            "not JSON",
        ),
        (b"[]", "not a JSON object"),
        (b"{\"minReaderVersion\": 1}", "no \"version\" field"),
        (b"{\"version\": 1}", "no \"minReaderVersion\" field"),
        (
            b"{\"version\": 0, \"minReaderVersion\": 0}",
            "\"version\" is 0",
        ),
        (
            b"{\"version\": \"1\", \"minReaderVersion\": 1}",
            "\"version\" is \"1\"",
        ),
        (
            b"{\"version\": 1, \"minReaderVersion\": 2}",
            "minReaderVersion 2 is newer than its own version 1",
        ),
        (
            b"{\"version\": 1, \"minReaderVersion\": 1, \"claims\": {\"u\": {\"namespace\": 5}}}",
            "invalid type",
        ),
        (
            b"{\"version\": 1, \"minReaderVersion\": 1, \"claims\": []}",
            "invalid type",
        ),
    ] {
        let e = parse(bytes).unwrap_err();
        assert!(matches!(e, DraError::Checkpoint(_)), "{e:?}");
        assert!(
            e.to_string().contains(needle),
            "{}: {e}",
            String::from_utf8_lossy(bytes)
        );
        assert!(e.to_string().starts_with("claim checkpoint: "), "{e}");
    }
}

#[test]
fn only_instances_no_claim_holds_may_be_destroyed() {
    use gpuops_inventory::{Gpu, Inventory, MigDevice};
    let mig = |uuid: &str, id: u32, start: u32| MigDevice {
        uuid: uuid.into(),
        gi_profile_id: id,
        placement_start: start,
        ..Default::default()
    };
    let inv = Inventory {
        gpus: vec![
            Gpu {
                uuid: "GPU-a".into(),
                mig_devices: vec![
                    mig("MIG-x", 19, 3),
                    mig("MIG-stale", 19, 4),
                    mig("MIG-new", 14, 0),
                ],
                ..Default::default()
            },
            Gpu {
                uuid: "GPU-static".into(),
                mig_devices: vec![mig("MIG-s", 19, 0)],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut c = sample(); // holds MIG-x by UUID
    // A crash right after creating an instance, before its UUID was read back.
    c.claims.insert(
        "uid-9".into(),
        PreparedClaim {
            devices: vec![PreparedDevice {
                device: "gpu-0-mig-2g20gb-14-0".into(),
                mig: Some(CreatedMig {
                    parent_uuid: "GPU-a".into(),
                    gi_profile_id: 14,
                    placement_start: 0,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    let managed = ["GPU-a".to_string()];
    let unheld: Vec<&str> = unheld_instances(&inv, &c, &managed)
        .iter()
        .map(|(_, m)| m.uuid.as_str())
        .collect();
    assert_eq!(
        unheld,
        ["MIG-stale"],
        "the static GPU is not dynamic MIG's to clean"
    );
    let none = Checkpoint::default();
    assert_eq!(unheld_instances(&inv, &none, &managed).len(), 3);
    assert!(unheld_instances(&inv, &none, &[]).is_empty());
}
