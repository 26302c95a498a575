//! Names and value formats, case by case against what NVIDIA's driver and Kubernetes write.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test support code

use gpuops_dra::DraError;
use gpuops_dra::names::*;

#[test]
fn device_names() {
    assert_eq!(gpu_device_name(3), "gpu-3");
    assert_eq!(
        mig_device_name(0, "1g.10gb", 19, 6),
        "gpu-0-mig-1g10gb-19-6"
    );
    assert_eq!(
        mig_device_name(2, "1g.10gb+me", 20, 0),
        "gpu-2-mig-1g10gb-me-20-0"
    );
    assert_eq!(
        mig_device_name(2, "1g.10gb-me", 32, 0),
        "gpu-2-mig-1g10gb-me-32-0"
    );
    assert_eq!(
        mig_device_name(1, "1g.10gb+me.all", 33, 0),
        "gpu-1-mig-1g10gb-meall-33-0"
    );
    assert_eq!(
        mig_device_name(1, "1c.3g.40gb", 9, 4),
        "gpu-1-mig-1c3g40gb-9-4"
    );
    assert_eq!(
        mig_device_name(0, "1g.24gb+gfx", 47, 1),
        "gpu-0-mig-1g24gb-gfx-47-1"
    );
    assert_eq!(profile_token("+1G.5GB+"), "1g5gb");
    assert_eq!(counter_set_name(7), "gpu-7-counter-set");
    assert_eq!(memory_slice_counter(5), "memory-slice-5");
    assert_eq!(memory_slice_capacity(5), "memorySlice5");
    for (cap, counter) in [
        ("multiprocessors", "multiprocessors"),
        ("copyEngines", "copy-engines"),
        ("jpegEngines", "jpeg-engines"),
        ("ofaEngines", "ofa-engines"),
        ("memory", "memory"),
    ] {
        assert_eq!(counter_name(cap), counter);
    }
}

#[test]
fn device_names_parse_back() {
    assert_eq!(
        parse_device_name("gpu-12").unwrap(),
        DeviceName::Gpu { minor: 12 }
    );
    assert_eq!(
        parse_device_name("gpu-2-mig-1g10gb-me-20-6").unwrap(),
        DeviceName::Mig {
            minor: 2,
            profile_token: "1g10gb-me".into(),
            gi_profile_id: 20,
            placement_start: 6
        }
    );
    for bad in [
        "",
        "gpu-",
        "gpu-x",
        "gpu-1-mig-",
        "gpu-1-mig-19-0",
        "gpu-1-mig-1g10gb-19-",
        "gpu--1",
        "gpu-+1",
        "vfio-0",
        "gpu-0-mig-1g10gb-x-0",
    ] {
        let err = parse_device_name(bad).unwrap_err();
        assert_eq!(err, DraError::DeviceName(bad.to_string()), "{bad}");
        assert!(err.to_string().contains("gpu-<minor>"));
    }
}

#[test]
fn pci_addresses_and_roots() {
    assert_eq!(
        normalize_pci_bus_id("00000000:1A:00.0").as_deref(),
        Some("0000:1a:00.0")
    );
    assert_eq!(
        normalize_pci_bus_id("0000:1a:00.0").as_deref(),
        Some("0000:1a:00.0")
    );
    assert_eq!(
        normalize_pci_bus_id("00010000:1A:00.0"),
        None,
        "a domain that needs 8 digits"
    );
    assert_eq!(normalize_pci_bus_id("1a:00.0"), None);
    assert_eq!(normalize_pci_bus_id(""), None);
    assert_eq!(normalize_pci_bus_id("0000:1g:00.0"), None);
    assert_eq!(
        pcie_root_from_sysfs_link(
            "../../../devices/pci0000:15/0000:15:01.0/0000:18:00.0",
            "0000:18:00.0"
        )
        .as_deref(),
        Some("pci0000:15")
    );
    assert_eq!(
        pcie_root_from_sysfs_link("/sys/devices/pci0000:00/0000:00:02.0", "0000:00:02.0")
            .as_deref(),
        Some("pci0000:00")
    );
    assert_eq!(
        pcie_root_from_sysfs_link("../../../devices/pci0000:15/0000:15:01.0", "0000:18:00.0"),
        None
    );
    assert_eq!(
        pcie_root_from_sysfs_link("../../../devices/virtual/0000:18:00.0", "0000:18:00.0"),
        None
    );
    assert_eq!(
        pcie_root_from_sysfs_link("0000:18:00.0", "0000:18:00.0"),
        None
    );
}

#[test]
fn versions_as_semver() {
    for (raw, want) in [
        ("580.105.08", Some("580.105.8")),
        ("9.0", Some("9.0.0")),
        ("13.0", Some("13.0.0")),
        ("535", Some("535.0.0")),
        ("v1.2.3", Some("1.2.3")),
        ("1.2.3.4", None),
        ("", None),
        ("1..2", None),
        ("1.2-rc1", None),
        ("abc", None),
    ] {
        assert_eq!(semver(raw).as_deref(), want, "{raw:?}");
    }
}

#[test]
fn architectures_as_nvml_names_them() {
    assert_eq!(architecture_name(Some((9, 0))), "Hopper");
    assert_eq!(architecture_name(Some((8, 0))), "Ampere");
    assert_eq!(architecture_name(Some((8, 9))), "Ada Lovelace");
    assert_eq!(architecture_name(Some((10, 0))), "Blackwell");
    assert_eq!(architecture_name(Some((7, 5))), "Turing");
    assert_eq!(architecture_name(Some((7, 0))), "Volta");
    assert_eq!(architecture_name(None), "Unknown");
    assert_eq!(architecture_name(Some((3, 0))), "Unknown");
}

#[test]
fn device_classes_match_nvidias_chart() {
    use gpuops_dra::classes::device_classes;
    let classes = device_classes(true);
    let summary: Vec<(String, String, Option<String>)> = classes
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap(),
                c.spec.selectors.as_ref().unwrap()[0]
                    .cel
                    .as_ref()
                    .unwrap()
                    .expression
                    .clone(),
                c.spec.extended_resource_name.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "gpu.nvidia.com".to_string(),
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'".to_string(),
                Some("nvidia.com/gpu".to_string())
            ),
            (
                "mig.nvidia.com".to_string(),
                "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'".to_string(),
                None
            ),
        ]
    );
    assert!(
        device_classes(false)
            .iter()
            .all(|c| c.spec.extended_resource_name.is_none())
    );
    let json = serde_json::to_value(&device_classes(false)[1]).unwrap();
    assert_eq!(json["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(json["kind"], "DeviceClass");
}
