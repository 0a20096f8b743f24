#![no_main]
//! libFuzzer entry point of the `forwarded_for` target; the checks are
//! [`talos_sso_fuzz::forwarded_for`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::forwarded_for(data));
