//! The PEM files source: a certificate file (the signer first, then for an
//! intermediate the certificates above it up to the Talos root) and a key
//! file, as `talosctl` and OpenSSL write them.

use std::path::Path;

use super::CaError;
use super::material::{Material, read_text};

pub(super) fn read(cert_file: &Path, key_file: &Path) -> Result<Material, CaError> {
    Ok(Material {
        cert_pem: read_text(cert_file)?,
        accepted: Vec::new(),
        key_pem: read_text(key_file)?,
        key_path: key_file.to_owned(),
        origin: key_file.display().to_string(),
    })
}
