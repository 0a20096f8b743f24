#![no_main]
//! libFuzzer entry point of the `jwks` target; the checks are
//! [`talos_sso_fuzz::jwks`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::jwks(data));
