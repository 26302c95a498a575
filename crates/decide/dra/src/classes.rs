//! The DeviceClasses users' claims name, as NVIDIA's chart defines them.

use crate::names::DRIVER_NAME;
use k8s_openapi::api::resource::v1 as res;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Whole GPUs.
pub const CLASS_GPU: &str = "gpu.nvidia.com";
/// MIG devices, static or dynamic.
pub const CLASS_MIG: &str = "mig.nvidia.com";
/// The extended resource unchanged pods ask for (gate `DRAExtendedResource`).
pub const EXTENDED_RESOURCE_GPU: &str = "nvidia.com/gpu";

/// The CEL selector of devices of `device_type` (`gpu` or `mig`) of this driver.
pub fn selector(device_type: &str) -> String {
    format!(
        "device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == '{device_type}'"
    )
}

/// `gpu.nvidia.com` and `mig.nvidia.com`; with `extended_resource`, pods that ask for
/// `nvidia.com/gpu` get a whole GPU through `gpu.nvidia.com`.
pub fn device_classes(extended_resource: bool) -> Vec<res::DeviceClass> {
    let class = |name: &str, device_type: &str, extended: Option<&str>| res::DeviceClass {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: res::DeviceClassSpec {
            selectors: Some(vec![res::DeviceSelector {
                cel: Some(res::CELDeviceSelector {
                    expression: selector(device_type),
                }),
            }]),
            extended_resource_name: extended.map(str::to_string),
            config: None,
        },
    };
    vec![
        class(
            CLASS_GPU,
            "gpu",
            extended_resource.then_some(EXTENDED_RESOURCE_GPU),
        ),
        class(CLASS_MIG, "mig", None),
    ]
}
