//! Generates the tonic/prost code for the kubelet APIs from our own `.proto`
//! files. Pure Rust: `protox` parses the protos, no `protoc` is needed.

use std::error::Error;

const PROTOS: &[&str] = &[
    "proto/deviceplugin/v1beta1/api.proto",
    "proto/podresources/v1/api.proto",
    "proto/pluginregistration/v1/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
