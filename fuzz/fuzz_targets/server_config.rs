#![no_main]
//! libFuzzer entry point of the `server_config` target; the checks are
//! [`talos_sso_fuzz::server_config`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::server_config(data));
