//! Rebuild the server when a migration file is added or changed:
//! `sqlx::migrate!` embeds the folders, and cargo does not watch them
//! otherwise. And give the build its source revision (`TALOS_SSO_REVISION`
//! for the code, `--version` and `talos_sso_build_info` in the metrics).

include!("../build-support/revision.rs");

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
    emit_revision();
}
