//! NVIDIA's opaque configs: what they accept, their defaults, and errors that name the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_dra::DraError;
use gpuops_dra::config::*;
use std::collections::BTreeMap;

fn parse(json: &str) -> Result<OpaqueConfig, DraError> {
    parse_opaque(json.as_bytes())
}

fn gpu(sharing: &str) -> String {
    format!(
        r#"{{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {sharing}}}"#
    )
}

fn mig(sharing: &str) -> String {
    format!(
        r#"{{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {sharing}}}"#
    )
}

/// The error's path, value and what is accepted.
fn err(json: &str) -> (String, String, String) {
    match parse(json).unwrap_err() {
        DraError::Config {
            path,
            value,
            accepted,
        } => (path, value, accepted),
        other => panic!("{other:?}"),
    }
}

#[test]
fn nvidias_examples_parse_with_their_defaults() {
    assert_eq!(
        parse(r#"{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}"#).unwrap(),
        OpaqueConfig::Gpu(GpuConfig { sharing: None })
    );
    assert_eq!(
        parse(&gpu(r#"{"strategy": "TimeSlicing"}"#)).unwrap(),
        OpaqueConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing::TimeSlicing(TimeSlicingConfig {
                interval: TimeSliceInterval::Default
            }))
        })
    );
    assert_eq!(
        parse(&gpu(
            r#"{"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}"#
        ))
        .unwrap(),
        OpaqueConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing::TimeSlicing(TimeSlicingConfig {
                interval: TimeSliceInterval::Long
            }))
        })
    );
    assert_eq!(TimeSliceInterval::Long.as_int(), 3);
    assert_eq!(
        parse(&gpu(r#"{"strategy": "MPS"}"#)).unwrap(),
        OpaqueConfig::Gpu(GpuConfig {
            sharing: Some(GpuSharing::Mps(MpsConfig::default()))
        })
    );
    let full = parse(&gpu(
        r#"{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
            "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"0": "5Gi", "GPU-b": 1048576},
            "multiUser": true}}"#,
    ))
    .unwrap();
    let OpaqueConfig::Gpu(GpuConfig {
        sharing: Some(GpuSharing::Mps(mps)),
    }) = full
    else {
        panic!("{full:?}")
    };
    assert_eq!(mps.default_active_thread_percentage, Some(50));
    assert_eq!(mps.default_pinned_device_memory_limit, Some(10 << 30));
    assert_eq!(
        mps.default_per_device_pinned_memory_limit,
        BTreeMap::from([
            ("0".to_string(), 5u64 << 30),
            ("GPU-b".to_string(), 1 << 20)
        ])
    );
    assert_eq!(mps.multi_user, Some(true));
    // The daemon's limits per device: the default, then the per-device entries by index or UUID.
    let uuids = [
        "GPU-a".to_string(),
        "GPU-b".to_string(),
        "GPU-c".to_string(),
    ];
    assert_eq!(
        mps.pinned_limits(&uuids).unwrap(),
        BTreeMap::from([
            ("GPU-a".to_string(), "5120M".to_string()),
            ("GPU-b".to_string(), "1M".to_string()),
            ("GPU-c".to_string(), "10240M".to_string()),
        ])
    );
    let one = ["GPU-z".to_string()];
    let e = mps.pinned_limits(&one).unwrap_err();
    assert!(
        matches!(&e, DraError::UnknownDeviceKey { key, .. } if key == "GPU-b"),
        "{e}"
    );
    assert!(e.to_string().contains("defaultPerDevicePinnedMemoryLimit"));

    assert_eq!(
        parse(&mig(
            r#"{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}"#
        ))
        .unwrap(),
        OpaqueConfig::MigDevice(MigDeviceConfig {
            sharing: Some(MpsConfig {
                default_active_thread_percentage: Some(0),
                ..MpsConfig::default()
            })
        })
    );
    assert_eq!(
        parse(r#"{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": null}"#)
            .unwrap(),
        OpaqueConfig::MigDevice(MigDeviceConfig { sharing: None })
    );
}

// Long on purpose: a table of broken configs, each with the field, value and accepted values it must name.
#[test]
fn bad_configs_name_the_field_the_value_and_what_is_accepted() {
    let cases: &[(&str, (&str, &str, &str))] = &[
        (
            r#"{"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}"#,
            (
                "apiVersion",
                "\"resource.nvidia.com/v1\"",
                "resource.nvidia.com/v1beta1",
            ),
        ),
        (
            r#"{"kind": "GpuConfig"}"#,
            ("apiVersion", "missing", "resource.nvidia.com/v1beta1"),
        ),
        (
            r#"{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}"#,
            (
                "kind",
                "\"VfioDeviceConfig\"",
                "GpuConfig or MigDeviceConfig",
            ),
        ),
        (
            r#"{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharinq": {}}"#,
            (
                "sharinq",
                "an unknown field",
                "fields here are apiVersion, kind, sharing",
            ),
        ),
        (
            &gpu(r#"{"strategy": "Exclusive"}"#),
            ("sharing.strategy", "\"Exclusive\"", "TimeSlicing or MPS"),
        ),
        (
            &gpu(r#"{"strategy": "timeslicing"}"#),
            ("sharing.strategy", "\"timeslicing\"", "TimeSlicing or MPS"),
        ),
        (
            &gpu(r#"{}"#),
            ("sharing.strategy", "missing", "TimeSlicing or MPS"),
        ),
        (&gpu(r#""MPS""#), ("sharing", "\"MPS\"", "an object")),
        (
            &gpu(r#"{"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}"#),
            (
                "sharing.timeSlicingConfig.interval",
                "\"Forever\"",
                "Default, Short, Medium or Long",
            ),
        ),
        (
            &gpu(r#"{"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}"#),
            (
                "sharing.timeSlicingConfig.intervall",
                "an unknown field",
                "fields here are interval",
            ),
        ),
        (
            &gpu(r#"{"strategy": "TimeSlicing", "mpsConfig": {}}"#),
            (
                "sharing.mpsConfig",
                "{}",
                "no mpsConfig with strategy TimeSlicing (use timeSlicingConfig, or strategy MPS)",
            ),
        ),
        (
            &gpu(r#"{"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}"#),
            (
                "sharing.timeSlicingConfig",
                "{\"interval\":\"Long\"}",
                "no timeSlicingConfig with strategy MPS (use mpsConfig, or strategy TimeSlicing)",
            ),
        ),
        (
            &gpu(r#"{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}"#),
            (
                "sharing.mpsConfig.defaultActiveThreadPercentage",
                "101",
                "an integer from 0 to 100",
            ),
        ),
        (
            &gpu(r#"{"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": -1}}"#),
            (
                "sharing.mpsConfig.defaultActiveThreadPercentage",
                "-1",
                "an integer from 0 to 100",
            ),
        ),
        (
            &gpu(
                r#"{"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "100Ki"}}"#,
            ),
            (
                "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
                "\"100Ki\"",
                "a quantity of at least 1Mi, e.g. 4Gi or 512Mi",
            ),
        ),
        (
            &gpu(
                r#"{"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}}"#,
            ),
            (
                "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0",
                "\"lots\"",
                "a quantity of at least 1Mi, e.g. 4Gi or 512Mi",
            ),
        ),
        (
            &gpu(r#"{"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}}"#),
            ("sharing.mpsConfig.multiUser", "\"yes\"", "true or false"),
        ),
        (
            &gpu(r#"{"strategy": "MPS", "mpsConfig": {"activeThreadPercentage": 5}}"#),
            (
                "sharing.mpsConfig.activeThreadPercentage",
                "an unknown field",
                "fields here are defaultActiveThreadPercentage, defaultPinnedDeviceMemoryLimit, defaultPerDevicePinnedMemoryLimit, multiUser",
            ),
        ),
        (
            &mig(r#"{"strategy": "TimeSlicing"}"#),
            (
                "sharing.strategy",
                "\"TimeSlicing\"",
                "MPS (a MIG device cannot be time-sliced)",
            ),
        ),
        (
            &mig(r#"{"strategy": "MPS", "timeSlicingConfig": {}}"#),
            (
                "sharing.timeSlicingConfig",
                "{}",
                "MIG devices cannot be time-sliced; MigDeviceConfig takes only strategy MPS with mpsConfig",
            ),
        ),
        (r#"[1, 2]"#, ("(top level)", "[1,2]", "an object")),
    ];
    for (json, (path, value, accepted)) in cases {
        assert_eq!(
            err(json),
            (path.to_string(), value.to_string(), accepted.to_string()),
            "{json}"
        );
    }
    let e = parse(&gpu(r#"{"strategy": "Exclusive"}"#)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "opaque config: sharing.strategy: \"Exclusive\" is not accepted: TimeSlicing or MPS"
    );
    assert!(matches!(parse("{not json"), Err(DraError::ConfigSyntax(_))));
}

#[test]
fn quantities() {
    for (q, want) in [
        ("1Gi", Some(1u64 << 30)),
        ("512Mi", Some(512 << 20)),
        ("1.5Gi", Some(3 << 29)),
        ("1G", Some(1_000_000_000)),
        ("2k", Some(2000)),
        ("1e9", Some(1_000_000_000)),
        ("1048576", Some(1 << 20)),
        ("0.5", None),
        ("1.5", None),
        ("Gi", None),
        ("1Xi", None),
        ("-1Gi", None),
        ("100Ei", None),
        ("", None),
    ] {
        assert_eq!(parse_quantity(q), want, "{q:?}");
    }
}
