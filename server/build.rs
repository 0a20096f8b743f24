//! Rebuild the server when a migration file is added or changed:
//! `sqlx::migrate!` embeds the folders, and cargo does not watch them
//! otherwise.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
