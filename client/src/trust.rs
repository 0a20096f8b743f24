//! Which certificate authorities the CLI trusts, beyond the operating
//! system's trust store and the built-in public list: a PEM file given at
//! `login --certificate-authority` for a server behind a company CA (and
//! `--provider-certificate-authority` for its identity provider),
//! remembered per server so that every later command reaches it too.
//!
//! A file is read whole and every certificate in it must parse; a file that
//! holds none, or something else, is an error that names it, never an
//! empty trust list that fails later as "unknown issuer".

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The authorities remembered for one server.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerTrust {
    /// Also trusted for the talos-sso server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<PathBuf>,
    /// Also trusted for the identity provider this server announces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_certificate_authority: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read the certificate authority file {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("the certificate authority file {path} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)")]
    Empty { path: PathBuf },
    #[error("the certificate authority file {path} is not a PEM certificate bundle: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

/// Certificates loaded from one file, ready to add to an HTTP client.
#[derive(Debug, Clone)]
pub struct ExtraRoots {
    pub path: PathBuf,
    certificates: Vec<reqwest::Certificate>,
}

impl ExtraRoots {
    pub fn load(path: &Path) -> Result<Self, TrustError> {
        let bytes = std::fs::read(path).map_err(|e| TrustError::Unreadable {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let blocks = pem::parse_many(&bytes).map_err(|e| TrustError::Malformed {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if let Some(other) = blocks.iter().find(|b| b.tag() != "CERTIFICATE") {
            return Err(TrustError::Malformed {
                path: path.to_owned(),
                reason: format!("it holds a `{}` block", talos_sso_text::escape(other.tag())),
            });
        }
        if blocks.is_empty() {
            return Err(TrustError::Empty {
                path: path.to_owned(),
            });
        }
        let mut certificates = Vec::with_capacity(blocks.len());
        for (index, block) in blocks.iter().enumerate() {
            let malformed = |reason: String| TrustError::Malformed {
                path: path.to_owned(),
                reason: format!("certificate {}: {reason}", index + 1),
            };
            <x509_cert::Certificate as der::Decode>::from_der(block.contents())
                .map_err(|e| malformed(e.to_string()))?;
            certificates.push(
                reqwest::Certificate::from_der(block.contents()).map_err(|e| malformed(e.to_string()))?,
            );
        }
        Ok(Self {
            path: path.to_owned(),
            certificates,
        })
    }

    /// `builder`, also trusting these authorities.
    pub fn apply(roots: Option<&Self>, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        roots
            .into_iter()
            .flat_map(|r| r.certificates.iter())
            .fold(builder, |builder, certificate| {
                builder.add_root_certificate(certificate.clone())
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_are_not_certificate_bundles_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            ExtraRoots::load(&missing),
            Err(TrustError::Unreadable { .. })
        ));
        let empty = write("empty.pem", "no pem here\n");
        assert_eq!(
            ExtraRoots::load(&empty).unwrap_err().to_string(),
            format!(
                "the certificate authority file {} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)",
                empty.display()
            )
        );
        let key = write(
            "key.pem",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n",
        );
        assert!(
            ExtraRoots::load(&key)
                .unwrap_err()
                .to_string()
                .ends_with("is not a PEM certificate bundle: it holds a `PRIVATE KEY` block"),
        );
        let garbage = write(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END CERTIFICATE-----\n",
        );
        let error = ExtraRoots::load(&garbage).unwrap_err().to_string();
        assert!(
            error.contains("is not a PEM certificate bundle: certificate 1: "),
            "{error}"
        );
    }
}
