#![no_main]
//! libFuzzer entry point of the `ca_material` target; the checks are
//! [`talos_sso_fuzz::ca_material`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::ca_material(data));
