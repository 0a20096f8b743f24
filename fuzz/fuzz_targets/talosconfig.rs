#![no_main]
//! libFuzzer entry point of the `talosconfig` target; the checks are
//! [`talos_sso_fuzz::talosconfig`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| talos_sso_fuzz::talosconfig(data));
