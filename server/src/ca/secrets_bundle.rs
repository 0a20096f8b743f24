//! The `talosctl gen secrets` bundle source: the Talos API CA is `certs.os`.

use std::path::Path;

use serde::Deserialize;

use super::CaError;
use super::material::{EncodedPair, Material, read_text, yaml_error};

/// `talosctl gen secrets` output: only the part we read.
#[derive(Deserialize)]
struct SecretsBundle {
    certs: Option<BundleCerts>,
}

#[derive(Deserialize)]
struct BundleCerts {
    os: Option<EncodedPair>,
}

/// `certs.os` of a bundle's `text`, read from `path`.
pub(super) fn os_pair(text: &str, path: &Path) -> Result<EncodedPair, CaError> {
    let bundle: SecretsBundle = serde_yaml_ng::from_str(text).map_err(yaml_error(path))?;
    bundle
        .certs
        .and_then(|c| c.os)
        .ok_or_else(|| CaError::MissingField {
            path: path.to_owned(),
            field: "certs.os",
        })
}

pub(super) fn read(path: &Path) -> Result<Material, CaError> {
    os_pair(&read_text(path)?, path)?.decode(path, "certs.os", "certs.os.crt")
}
