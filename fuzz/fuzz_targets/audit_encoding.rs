#![no_main]
//! libFuzzer entry point of the `audit_encoding` target; the checks are
//! [`talos_sso_fuzz::audit_encoding`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::audit_encoding(data));
