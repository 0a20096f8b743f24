//! Talos CA material: loading it from every form Talos produces, refusing it
//! when it cannot be used safely, and holding the signing key.
//!
//! Sources are a PEM certificate + key pair (the certificate file may carry an
//! intermediate followed by its issuers, up to the Talos root), a
//! `talosctl gen secrets` bundle (`certs.os`) and a control plane machine
//! config (`machine.ca`, plus its `machine.acceptedCAs`), and a certificate
//! file whose key is inside a PKCS#11 token (`crate::keys::pkcs11`). Every refusal
//! has its own [`CaError`] variant and stable [`CaError::code`].
//!
//! Loading reads files (the source, accepted CAs, the key file's mode); the
//! checks themselves take the clock as a parameter. This module does not
//! decide what a leaf certificate says (`certificate`, which uses it to sign)
//! and knows nothing about HTTP or databases.
//!
//! This file holds the vocabulary shared by the parts: where material comes
//! from, the load options, refusals and warnings, and how names and times are
//! written in messages. The parts:
//! - `pem_files`, `secrets_bundle`, `machine_config`: one source each, read
//!   into `material::Material` (PEM text of the certificates and the key);
//! - `material`: what the sources share, and PEM text into certificates;
//! - `key`: the private key in a PEM block, decoded and proved to match its
//!   certificate;
//! - `checks`: signing CA, intermediate chain and key file permissions;
//! - `authority`: [`CertificateAuthority`], the checked signer (where the
//!   key kind is chosen), and its [`CaSummary`];
//! - `talos_ca`: the Talos cluster CA certificate alone (accepted-CA mode);
//! - `generate`: new roots, intermediates and client-only CAs;
//! - `patch`: the machine-config patches that add a client-only CA to
//!   Talos's `machine.acceptedCAs`, or remove it.

mod authority;
mod checks;
pub mod generate;
mod key;
mod machine_config;
mod material;
pub mod patch;
mod pem_files;
mod secret_scan;
mod secrets_bundle;
mod talos_ca;

use std::fmt;
use std::path::PathBuf;

use der::Decode;
use time::OffsetDateTime;

use crate::keys::KeyKind;
pub use crate::keys::pkcs11::Pkcs11Error;
use material::Material;

pub use authority::{CaSummary, CertificateAuthority, EXPIRY_WARNING};
pub use checks::can_vouch_for_a_server;
pub use key::ACCEPTED_KEY_LABELS;
pub use material::parse_certificates;
pub use talos_ca::{KeyPolicy, talos_ca_certificates};

/// Where a cluster's CAs come from: configuration data (`config`).
use crate::config::{CaSource, TalosCaSource};

impl CaSource {
    /// The certificate and key text this source holds (`Pkcs11` holds no
    /// key text, and is read by `authority`).
    fn read(&self) -> Result<Material, CaError> {
        match self {
            CaSource::Files { cert_file, key_file } => pem_files::read(cert_file, key_file),
            CaSource::SecretsBundle(path) => secrets_bundle::read(path),
            CaSource::MachineConfig(path) => machine_config::read(path),
            CaSource::Pkcs11 { cert_file, pkcs11 } => Ok(Material {
                cert_pem: material::read_text(cert_file)?,
                accepted: Vec::new(),
                key_pem: String::new(),
                key_path: pkcs11.pin_file.clone(),
                origin: pkcs11.describe(),
            }),
        }
    }
}

/// Knobs that change what is accepted at load time.
#[derive(Debug, Clone, Default)]
pub struct CaOptions {
    /// Extra CA certificate files trusted during a CA rotation; they go into
    /// the talosconfig `ca` bundle next to the signing root.
    pub accepted_cas: Vec<PathBuf>,
    /// Accept a key file readable by group or others. Logged loudly; meant
    /// for throwaway evaluation setups only.
    pub allow_insecure_key_permissions: bool,
    /// Accepted-CA mode: the Talos cluster CA certificate, for the
    /// talosconfig `ca`; the signer is then a client-only CA of its own.
    pub talos_ca: Option<TalosCaSource>,
}

/// How a cluster's certificates come to be trusted by Talos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TrustMode {
    /// Signed with the cluster CA itself (`machine.ca`).
    ClusterCa,
    /// Signed with an intermediate under the cluster CA.
    Intermediate,
    /// Signed with a client-only CA of talos-sso's own that Talos lists in
    /// `machine.acceptedCAs`; the cluster CA key never reaches talos-sso.
    AcceptedCa,
}

impl TrustMode {
    /// The name `check`, `/readyz` and the docs use.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustMode::ClusterCa => "cluster-ca",
            TrustMode::Intermediate => "intermediate",
            TrustMode::AcceptedCa => "accepted-ca",
        }
    }
}

impl fmt::Display for TrustMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why CA material was refused. Each variant is one thing an operator fixes.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid YAML: {reason}")]
    Yaml { path: PathBuf, reason: String },
    #[error("{path} has no `{field}`: is this the right kind of file?")]
    MissingField { path: PathBuf, field: &'static str },
    #[error("{origin}: `{field}` is not base64-encoded PEM")]
    Base64 { origin: String, field: &'static str },
    #[error(
        "the CA key in {origin} is empty: worker machine configs carry no CA key; \
         use a control plane machine config or the secrets bundle"
    )]
    EmptyKey { origin: String },
    #[error(
        "the CA key in {origin} is redacted (`******`): export the config with its secrets \
         (`talosctl get mc -o yaml` redacts them) or use the secrets bundle"
    )]
    RedactedKey { origin: String },
    #[error("{origin} contains no PEM data ({what})")]
    NotPem { origin: String, what: &'static str },
    #[error("{origin}: unsupported private key PEM label `{label}`; expected one of {}", key::ACCEPTED_KEY_LABELS.join(", "))]
    UnsupportedKeyLabel { origin: String, label: String },
    #[error("{origin}: the `{label}` key cannot be read: {reason}")]
    BadKey {
        origin: String,
        label: String,
        reason: String,
    },
    #[error("{origin}: not a certificate: {reason}")]
    BadCertificate { origin: String, reason: String },
    #[error(
        "the CA uses a {kind} key, which cannot sign here; use Ed25519 (Talos's default), ECDSA P-256/P-384 or RSA of at least 2048 bits"
    )]
    UnsupportedKeyType { kind: KeyKind },
    #[error("the CA private key does not match the CA certificate ({origin})")]
    KeyMismatch { origin: String },
    #[error("the certificate {subject} is not a CA (basicConstraints CA:TRUE is missing)")]
    NotACa { subject: String },
    #[error("the CA certificate {subject} may not sign certificates (its key usage lacks keyCertSign)")]
    CannotSignCertificates { subject: String },
    #[error("the CA certificate {subject} expired on {not_after}")]
    Expired { subject: String, not_after: String },
    #[error("the CA certificate {subject} is not valid before {not_before}")]
    NotYetValid { subject: String, not_before: String },
    #[error(
        "{path} holds a CA secret (its private key, or the PIN of the token that holds it) but is readable \
         by group or others (mode {mode:04o}): run `chmod 600 {path}`"
    )]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("certificate chain in {origin} is broken: {reason}")]
    BrokenChain { origin: String, reason: String },
    #[error(
        "{origin} holds the Talos cluster CA key: accepted-CA mode exists so that this key never \
         reaches talos-sso; write the certificate alone with `talos-sso-server ca talos-ca` and name \
         that in `talos_ca.cert_file`"
    )]
    TalosCaKeyPresent { origin: String },
    #[error(
        "{origin} holds a client key: the server needs only its `ca`; write the certificate alone with \
         `talos-sso-server ca talos-ca --talosconfig FILE --out-cert talos-ca.crt` and name that in \
         `talos_ca.cert_file`"
    )]
    TalosconfigKeyPresent { origin: String },
    #[error(
        "{origin} is a Talos secret: `talos_ca` needs a certificate and nothing else (a join token, \
         for one, lets trustd sign server certificates under the cluster CA); write the certificate \
         alone with `talos-sso-server ca talos-ca` and name that in `talos_ca.cert_file`"
    )]
    TalosCaSecretPresent { origin: String },
    #[error("{path} has no context `{context}`; its contexts: {}", known.join(", "))]
    TalosconfigContextUnknown {
        path: PathBuf,
        context: String,
        known: Vec<String>,
    },
    #[error(
        "the CA {subject} can vouch for servers (its extended key usage is {usages}): a cluster in \
         accepted-CA mode signs with a CA limited to clientAuth, so that its key cannot impersonate \
         apid; make one with `talos-sso-server ca client-ca`"
    )]
    NotClientOnly { subject: String, usages: String },
    #[error(
        "the CA {subject} in {origin} is not a self-signed CA alone: a cluster in accepted-CA mode \
         signs with a self-signed client-only CA (`talos-sso-server ca client-ca`), its file holding \
         that one certificate"
    )]
    NotSelfSigned { subject: String, origin: String },
    #[error(
        "`talos_ca` holds the signing CA {subject} itself: `talos_ca` is the Talos cluster CA \
         (what `machine.ca` holds), `ca` the client-only CA of talos-sso"
    )]
    TalosCaIsSigner { subject: String },
    #[error(
        "`talos_ca` holds {subject}, a CA limited to client authentication: talosctl verifies apid \
         with `talos_ca`, so it must be the Talos cluster CA (what `machine.ca` holds)"
    )]
    TalosCaClientOnly { subject: String },
    #[error(
        "the intermediate CA {subject} can vouch for servers (its extended key usage allows serverAuth, or \
         it has none): its key could sign apid certificates that chain to machine.ca; make one limited \
         to clientAuth (`talos-sso-server ca intermediate`)"
    )]
    IntermediateNotClientOnly { subject: String },
    #[error(
        "the accepted CA {subject} is limited to client authentication: `accepted_cas` go into the \
         talosconfig `ca`, which verifies apid, so they must be Talos CAs"
    )]
    AcceptedCaClientOnly { subject: String },
    #[error(
        "the client CA {subject} may sign other CAs (its path length is not 0): a client CA signs \
         people's certificates only; make one with `talos-sso-server ca client-ca`"
    )]
    ClientCaPathLength { subject: String },
    #[error(
        "the CA {subject} is limited to client authentication, so talosctl could not verify apid \
         with it: it looks like a talos-sso client CA; name the Talos cluster CA certificate in the \
         cluster's `talos_ca` (accepted-CA mode)"
    )]
    ClientOnlyWithoutTalosCa { subject: String },
    #[error(transparent)]
    Pkcs11(#[from] Pkcs11Error),
}

impl CaError {
    /// A stable identifier for each refusal, for tests, logs and `check`.
    pub fn code(&self) -> &'static str {
        match self {
            CaError::Read { .. } => "ca_unreadable",
            CaError::Yaml { .. } => "ca_yaml_invalid",
            CaError::MissingField { .. } => "ca_field_missing",
            CaError::Base64 { .. } => "ca_base64_invalid",
            CaError::EmptyKey { .. } => "ca_key_empty",
            CaError::RedactedKey { .. } => "ca_key_redacted",
            CaError::NotPem { .. } => "ca_not_pem",
            CaError::UnsupportedKeyLabel { .. } => "ca_key_label_unsupported",
            CaError::BadKey { .. } => "ca_key_invalid",
            CaError::BadCertificate { .. } => "ca_certificate_invalid",
            CaError::UnsupportedKeyType { .. } => "ca_key_type_unsupported",
            CaError::KeyMismatch { .. } => "ca_key_mismatch",
            CaError::NotACa { .. } => "ca_not_a_ca",
            CaError::CannotSignCertificates { .. } => "ca_cannot_sign",
            CaError::Expired { .. } => "ca_expired",
            CaError::NotYetValid { .. } => "ca_not_yet_valid",
            CaError::InsecurePermissions { .. } => "ca_key_permissions",
            CaError::BrokenChain { .. } => "ca_chain_broken",
            CaError::TalosCaKeyPresent { .. } => "talos_ca_key_present",
            CaError::TalosconfigContextUnknown { .. } => "talos_ca_context_unknown",
            CaError::TalosconfigKeyPresent { .. } => "talos_ca_client_key_present",
            CaError::TalosCaSecretPresent { .. } => "talos_ca_secret_present",
            CaError::NotClientOnly { .. } => "ca_not_client_only",
            CaError::NotSelfSigned { .. } => "ca_not_self_signed",
            CaError::TalosCaIsSigner { .. } => "talos_ca_is_signer",
            CaError::TalosCaClientOnly { .. } => "talos_ca_client_only",
            CaError::IntermediateNotClientOnly { .. } => "ca_intermediate_not_client_only",
            CaError::AcceptedCaClientOnly { .. } => "accepted_ca_client_only",
            CaError::ClientCaPathLength { .. } => "ca_path_length_not_zero",
            CaError::ClientOnlyWithoutTalosCa { .. } => "ca_client_only_without_talos_ca",
            CaError::Pkcs11(error) => error.code(),
        }
    }
}

/// Something worth an operator's attention that does not stop the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaWarning {
    ExpiresSoon {
        subject: String,
        not_after: String,
        days_left: i64,
    },
    InsecurePermissionsAllowed {
        path: PathBuf,
        mode: u32,
    },
    AcceptedCaExpired {
        subject: String,
        not_after: String,
    },
    /// The rotation's date has passed: `next_ca` signs, `ca` is kept for
    /// nothing.
    NextCaSigning {
        since: String,
    },
}

impl fmt::Display for CaWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaWarning::ExpiresSoon {
                subject,
                not_after,
                days_left,
            } => write!(
                f,
                "the CA certificate {subject} expires on {not_after} ({days_left} days left): \
                 plan the rotation now (talosctl rotate-ca, then accepted_cas here)"
            ),
            CaWarning::InsecurePermissionsAllowed { path, mode } => write!(
                f,
                "INSECURE: CA key file {} is readable by group or others (mode {mode:04o}) and \
                 allow_insecure_key_permissions is set",
                path.display()
            ),
            CaWarning::NextCaSigning { since } => write!(
                f,
                "next_ca signs since {since}: make it `ca` and remove the old CA from Talos's \
                 acceptedCAs once the last certificate the old one signed has expired (max_ttl)"
            ),
            CaWarning::AcceptedCaExpired { subject, not_after } => {
                write!(
                    f,
                    "accepted CA {subject} expired on {not_after}; remove it from accepted_cas"
                )
            }
        }
    }
}

pub fn format_time(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// RFC 4514-ish rendering of a DER name for messages (O=talos, CN=...),
/// with control and bidirectional characters escaped: names come from
/// certificates, some of them from a node's config, and end on terminals
/// and in logs.
pub fn describe_name(raw: &[u8]) -> String {
    match x509_cert::name::Name::from_der(raw) {
        Ok(name) if !name.is_empty() => talos_sso_text::clean_field(&name.to_string()),
        Ok(_) => "(empty subject)".into(),
        Err(_) => "(unreadable subject)".into(),
    }
}
