//! Give the CLI its source revision (`TALOS_SSO_REVISION`), for
//! `--version`.

include!("../build-support/revision.rs");

fn main() {
    emit_revision();
}
