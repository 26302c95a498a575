#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpuops_fuzzcases::autoscale_annotations(data));
