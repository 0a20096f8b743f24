//! What every CA source yields, and what the sources share: the PEM text of
//! the certificates and the key with where it came from, reading a file, the
//! base64-encoded `crt`/`key` pair of Talos's YAML documents, and PEM text
//! into certificates.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use super::CaError;
use crate::x509::{self, ParsedCertificate};

/// CA material as read from a source, not yet checked.
pub(super) struct Material {
    /// The signing certificate first, then its issuers.
    pub(super) cert_pem: String,
    /// CA certificates the source trusts next to its root that can verify
    /// apid (a machine config's `machine.acceptedCAs`).
    pub(super) accepted: Vec<ParsedCertificate>,
    pub(super) key_pem: String,
    /// The file whose permissions guard the key.
    pub(super) key_path: PathBuf,
    /// Where this came from, for messages.
    pub(super) origin: String,
}

pub(super) fn read_text(path: &Path) -> Result<String, CaError> {
    crate::text_file::read(path).map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The refusal for a YAML document of `path` that does not parse.
pub(super) fn yaml_error(path: &Path) -> impl Fn(serde_yaml_ng::Error) -> CaError + '_ {
    move |e| CaError::Yaml {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// A certificate and its key as Talos writes them in YAML: base64 of PEM.
#[derive(Deserialize)]
pub(super) struct EncodedPair {
    pub(super) crt: Option<String>,
    pub(super) key: Option<String>,
}

impl EncodedPair {
    /// The material of the pair found at `field` of `path`; `crt_field` names
    /// its certificate in messages.
    pub(super) fn decode(
        self,
        path: &Path,
        field: &'static str,
        crt_field: &'static str,
    ) -> Result<Material, CaError> {
        let origin = format!("{} ({field})", path.display());
        let crt = self.crt.ok_or_else(|| CaError::MissingField {
            path: path.to_owned(),
            field: crt_field,
        })?;
        let cert_pem = decode_base64(&crt, &origin, "crt")?;
        let key = self.key.unwrap_or_default();
        // An empty or redacted key is not base64 of anything: report it as such.
        let key_pem = match key.trim() {
            "" => return Err(CaError::EmptyKey { origin }),
            "******" => return Err(CaError::RedactedKey { origin }),
            encoded => decode_base64(encoded, &origin, "key")?,
        };
        Ok(Material {
            cert_pem,
            accepted: Vec::new(),
            key_pem,
            key_path: path.to_owned(),
            origin,
        })
    }
}

pub(super) fn decode_base64(value: &str, origin: &str, field: &'static str) -> Result<String, CaError> {
    let bytes = decode_base64_bytes(value).map_err(|_| CaError::Base64 {
        origin: origin.to_owned(),
        field,
    })?;
    String::from_utf8(bytes).map_err(|_| CaError::Base64 {
        origin: origin.to_owned(),
        field,
    })
}

/// Standard base64 as Go's `base64.StdEncoding` reads it in Talos's YAML:
/// line breaks (a `crt: |` block wrapped at 76 columns) and other ASCII
/// whitespace are skipped.
pub(super) fn decode_base64_bytes(value: &str) -> Result<Vec<u8>, base64::DecodeError> {
    let compact: String = value.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(compact)
}

/// Every CERTIFICATE block in `text`, parsed.
pub fn parse_certificates(text: &str, origin: &str) -> Result<Vec<ParsedCertificate>, CaError> {
    let blocks = x509::pem_blocks(text).map_err(|e| CaError::BadCertificate {
        origin: origin.to_owned(),
        reason: e.to_string(),
    })?;
    let certs: Vec<_> = blocks
        .into_iter()
        .filter(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| {
            ParsedCertificate::from_der(&der).map_err(|e| CaError::BadCertificate {
                origin: origin.to_owned(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    if certs.is_empty() {
        return Err(CaError::NotPem {
            origin: origin.to_owned(),
            what: "no CERTIFICATE block",
        });
    }
    Ok(certs)
}
