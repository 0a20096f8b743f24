//! The Talos cluster CA *certificate*, without its key, for a cluster in
//! accepted-CA mode: what talosctl verifies apid's server certificate
//! against, so it goes into the talosconfig `ca`. It comes from a PEM file,
//! a talosconfig (`contexts.<name>.ca`), a secrets bundle (`certs.os.crt`)
//! or a machine config (`machine.ca.crt`, plus the `machine.acceptedCAs`
//! that can vouch for a server, as during `talosctl rotate-ca`).
//!
//! The mode exists so that the cluster CA key never reaches talos-sso: a
//! source that carries it is refused, and so is one that carries any other
//! secret (`secret_scan`): a client key in a talosconfig (a long-lived
//! credential the server has no use for), a join token in a worker's
//! machine config (with it, trustd signs server certificates under the
//! cluster CA). `ca talos-ca` extracts the certificate from any
//! of them on the operator's machine ([`KeyPolicy::Ignore`]).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::CaError;
use super::material::{EncodedPair, decode_base64, parse_certificates, read_text, yaml_error};
use super::secret_scan::{first_secret, redacted};
use crate::config::TalosCaSource;
use crate::x509::ParsedCertificate;

/// What to do with a private key found next to the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPolicy {
    /// Refuse the source (the server's `talos_ca`).
    Refuse,
    /// Read the certificate and leave the key (`ca talos-ca`, which writes
    /// the certificate alone for the server).
    Ignore,
}

/// The certificates of the source, the Talos CA first.
pub fn talos_ca_certificates(
    source: &TalosCaSource,
    keys: KeyPolicy,
) -> Result<Vec<ParsedCertificate>, CaError> {
    match source {
        TalosCaSource::CertFile(path) => cert_file(path, keys),
        TalosCaSource::Talosconfig { path, context } => talosconfig(path, context.as_deref(), keys),
        TalosCaSource::SecretsBundle(path) => secrets_bundle(path, keys),
        TalosCaSource::MachineConfig(path) => machine_config(path, keys),
    }
}

fn cert_file(path: &Path, keys: KeyPolicy) -> Result<Vec<ParsedCertificate>, CaError> {
    let text = read_text(path)?;
    let origin = path.display().to_string();
    let has_key = crate::x509::pem_blocks(&text)
        .map(|blocks| blocks.iter().any(|(label, _)| label.ends_with("PRIVATE KEY")))
        .unwrap_or(false);
    if has_key && keys == KeyPolicy::Refuse {
        return Err(CaError::TalosCaKeyPresent { origin });
    }
    parse_certificates(&text, &origin)
}

/// A talosconfig: only the part read.
#[derive(Deserialize)]
struct Talosconfig {
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, TalosconfigContext>,
}

#[derive(Deserialize)]
struct TalosconfigContext {
    ca: Option<String>,
}

fn talosconfig(
    path: &Path,
    context: Option<&str>,
    keys: KeyPolicy,
) -> Result<Vec<ParsedCertificate>, CaError> {
    let document: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read_text(path)?).map_err(yaml_error(path))?;
    let config: Talosconfig = serde_yaml_ng::from_value(document.clone()).map_err(yaml_error(path))?;
    let name = context
        .map(str::to_owned)
        .or(config.context)
        .ok_or(CaError::MissingField {
            path: path.to_owned(),
            field: "context",
        })?;
    let origin = format!(
        "{} (context `{}`)",
        path.display(),
        talos_sso_text::clean_field(&name)
    );
    let entry = config
        .contexts
        .get(&name)
        .ok_or_else(|| CaError::TalosconfigContextUnknown {
            path: path.to_owned(),
            context: talos_sso_text::clean_field(&name),
            known: config
                .contexts
                .keys()
                .map(|k| talos_sso_text::clean_field(k))
                .collect(),
        })?;
    if keys == KeyPolicy::Refuse {
        // Any context's key, not only the one read: the file is what the
        // server keeps.
        if let Some(secret) = first_secret(&document) {
            let origin = format!("{} ({})", path.display(), talos_sso_text::clean_field(&secret));
            return Err(if secret.ends_with(".key") {
                CaError::TalosconfigKeyPresent { origin }
            } else {
                CaError::TalosCaSecretPresent { origin }
            });
        }
    }
    let ca = entry.ca.as_deref().ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field: "contexts.<context>.ca",
    })?;
    parse_certificates(&decode_base64(ca, &origin, "ca")?, &origin)
}

fn secrets_bundle(path: &Path, keys: KeyPolicy) -> Result<Vec<ParsedCertificate>, CaError> {
    let text = read_text(path)?;
    let pair = super::secrets_bundle::os_pair(&text, path)?;
    let certs = certificate_without_key(pair, path, "certs.os", keys)?;
    if keys == KeyPolicy::Refuse {
        let document: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).map_err(yaml_error(path))?;
        refuse_secrets(std::slice::from_ref(&document), path)?;
    }
    Ok(certs)
}

fn machine_config(path: &Path, keys: KeyPolicy) -> Result<Vec<ParsedCertificate>, CaError> {
    let text = read_text(path)?;
    let (pair, accepted) = super::machine_config::machine_cas(&text, path)?;
    let mut certs = certificate_without_key(pair, path, "machine.ca", keys)?;
    if keys == KeyPolicy::Refuse {
        let documents = super::machine_config::config_documents(&text).map_err(yaml_error(path))?;
        refuse_secrets(&documents, path)?;
    }
    certs.extend(super::machine_config::server_cas(accepted, path)?);
    Ok(certs)
}

/// Refuse documents that hold any Talos secret ([`first_secret`]).
fn refuse_secrets(documents: &[serde_yaml_ng::Value], path: &Path) -> Result<(), CaError> {
    match documents.iter().find_map(first_secret) {
        Some(secret) => Err(CaError::TalosCaSecretPresent {
            origin: format!("{} ({})", path.display(), talos_sso_text::clean_field(&secret)),
        }),
        None => Ok(()),
    }
}

/// The certificate of a Talos `{crt, key}` pair whose key must be absent,
/// empty or redacted (`******`, as `talosctl get machineconfig` shows it).
fn certificate_without_key(
    pair: EncodedPair,
    path: &Path,
    field: &'static str,
    keys: KeyPolicy,
) -> Result<Vec<ParsedCertificate>, CaError> {
    let origin = format!("{} ({field})", path.display());
    if keys == KeyPolicy::Refuse && pair.key.as_deref().is_some_and(|key| !redacted(key)) {
        return Err(CaError::TalosCaKeyPresent { origin });
    }
    let crt = pair.crt.ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field,
    })?;
    parse_certificates(&decode_base64(&crt, &origin, "crt")?, &origin)
}
