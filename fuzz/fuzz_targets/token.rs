#![no_main]
//! libFuzzer entry point of the `token` target; the checks are
//! [`talos_sso_fuzz::token`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::token(data));
