//! Throwaway CA material for tests: fresh CAs of each key type, the fixtures
//! copied from Talos, and files written with the permissions the server
//! demands of key files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::ca::{CaOptions, CertificateAuthority};
use talos_sso_server::config::CaSource;
use time::OffsetDateTime;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

pub fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("read fixture")
}

/// Write `contents` to `dir/name` with `mode` and return the path.
pub fn write_file(dir: &Path, name: &str, contents: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

/// Copy a fixture into `dir` as a private (0600) file, as an operator would
/// keep a CA key.
pub fn private_copy(dir: &Path, fixture_name: &str) -> PathBuf {
    let name = Path::new(fixture_name)
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    write_file(dir, &name, &read_fixture(fixture_name), 0o600)
}

/// A fresh self-signed Talos-style CA, loaded.
pub fn fresh_ca(key_type: NewKeyType) -> CertificateAuthority {
    let now = OffsetDateTime::now_utc();
    let ca = generate::new_root(key_type, "talos", Duration::from_secs(3650 * 86400), now).expect("new CA");
    CertificateAuthority::from_pem(&ca.cert_pem, &ca.key_pem, "fresh CA", Vec::new(), now).expect("load CA")
}

/// Load a CA source with default options at the real time.
pub fn load(source: &CaSource) -> Result<CertificateAuthority, talos_sso_server::ca::CaError> {
    CertificateAuthority::load(source, &CaOptions::default(), OffsetDateTime::now_utc())
}
