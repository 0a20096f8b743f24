#![no_main]
//! libFuzzer entry point of the `audit_query` target; the checks are
//! [`talos_sso_fuzz::audit_query`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::audit_query(data));
