#![no_main]
//! libFuzzer entry point of the `csr` target; the checks are
//! [`talos_sso_fuzz::csr`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::csr(data));
