//! Talos CA material: loading it from every form Talos produces, refusing it
//! when it cannot be used safely, and holding the signing key.
//!
//! Sources are a PEM certificate + key pair (the certificate file may carry an
//! intermediate followed by its issuers, up to the Talos root), a
//! `talosctl gen secrets` bundle (`certs.os`) and a control plane machine
//! config (`machine.ca`, plus its `machine.acceptedCAs`). Every refusal has its
//! own [`CaError`] variant and stable [`CaError::code`]. This module reads
//! files and checks material; it does not decide what a certificate says
//! (`certificate`) and knows nothing about HTTP or databases.

pub mod generate;

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use der::Decode;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, RsaKeyPair};
use serde::Deserialize;
use spki::ObjectIdentifier;
use time::{Duration, OffsetDateTime};

use crate::x509::{self, KeyKind, ParsedCertificate, SigningKey, oid};

/// A CA whose certificate expires sooner than this produces a warning: a Talos
/// CA that quietly expires is an outage with a long fuse.
pub const EXPIRY_WARNING: Duration = Duration::days(90);

/// The PEM labels Talos's own loader accepts for private keys.
pub const ACCEPTED_KEY_LABELS: [&str; 4] = [
    "ED25519 PRIVATE KEY",
    "PRIVATE KEY",
    "EC PRIVATE KEY",
    "RSA PRIVATE KEY",
];

/// Where a cluster's CA comes from; the names match the configuration keys of
/// a cluster's `ca` section and the flags of `ca inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// PEM files. `cert_file` holds the signing certificate first, then (for an
    /// intermediate) the certificates above it up to the Talos root.
    Files { cert_file: PathBuf, key_file: PathBuf },
    /// A `talosctl gen secrets` bundle; the Talos API CA is `certs.os`.
    SecretsBundle(PathBuf),
    /// A control plane machine config; the CA is `machine.ca`.
    MachineConfig(PathBuf),
}

impl CaSource {
    /// The one source named by the configuration keys (or command-line flags)
    /// of a cluster's `ca`: `cert_file` + `key_file`, `secrets_bundle`, or
    /// `machine_config`. `None` when there is not exactly one.
    pub fn from_parts(
        cert_file: Option<&PathBuf>,
        key_file: Option<&PathBuf>,
        secrets_bundle: Option<&PathBuf>,
        machine_config: Option<&PathBuf>,
    ) -> Option<Self> {
        match (cert_file, key_file, secrets_bundle, machine_config) {
            (Some(cert_file), Some(key_file), None, None) => Some(CaSource::Files {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            }),
            (None, None, Some(bundle), None) => Some(CaSource::SecretsBundle(bundle.clone())),
            (None, None, None, Some(config)) => Some(CaSource::MachineConfig(config.clone())),
            _ => None,
        }
    }
}

impl fmt::Display for CaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaSource::Files { cert_file, key_file } => {
                write!(
                    f,
                    "cert_file {} + key_file {}",
                    cert_file.display(),
                    key_file.display()
                )
            }
            CaSource::SecretsBundle(p) => write!(f, "secrets bundle {}", p.display()),
            CaSource::MachineConfig(p) => write!(f, "machine config {}", p.display()),
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
    #[error("{origin}: unsupported private key PEM label `{label}`; expected one of {}", ACCEPTED_KEY_LABELS.join(", "))]
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
        "{path} holds a CA key but is readable by group or others (mode {mode:04o}): \
         run `chmod 600 {path}`"
    )]
    InsecurePermissions { path: PathBuf, mode: u32 },
    #[error("certificate chain in {origin} is broken: {reason}")]
    BrokenChain { origin: String, reason: String },
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
            CaWarning::AcceptedCaExpired { subject, not_after } => {
                write!(
                    f,
                    "accepted CA {subject} expired on {not_after}; remove it from accepted_cas"
                )
            }
        }
    }
}

/// A loaded, checked CA that can sign client certificates.
#[derive(Debug)]
pub struct CertificateAuthority {
    /// The certificate whose key we hold: the Talos root, or an intermediate.
    signer: ParsedCertificate,
    /// Certificates above the signer, nearest first, ending at the Talos root.
    /// Empty when the signer is the root itself.
    chain: Vec<ParsedCertificate>,
    key: SigningKey,
    /// What goes into the talosconfig `ca`: the root, then accepted CAs.
    trust_bundle: Vec<ParsedCertificate>,
    warnings: Vec<CaWarning>,
    rng: SystemRandom,
}

impl CertificateAuthority {
    /// Read and check CA material. `now` decides expiry; nothing here reads
    /// the wall clock, so tests can walk the validity edges.
    pub fn load(source: &CaSource, options: &CaOptions, now: OffsetDateTime) -> Result<Self, CaError> {
        let material = read_source(source)?;
        let mut warnings = Vec::new();
        if let Some(warning) =
            check_key_permissions(&material.key_path, options.allow_insecure_key_permissions)?
        {
            tracing::warn!(path = %material.key_path.display(), "{warning}");
            warnings.push(warning);
        }
        let mut accepted = Vec::new();
        for path in &options.accepted_cas {
            let text = read_text(path)?;
            accepted.extend(parse_certificates(&text, &path.display().to_string())?);
        }
        let ca = Self::from_pem(
            &material.cert_pem,
            &material.key_pem,
            &material.origin,
            accepted,
            now,
        )?;
        warnings.extend(ca.warnings);
        Ok(Self { warnings, ..ca })
    }

    /// Check PEM material already in memory. `cert_pem` is the signer first,
    /// then its issuers; `accepted` are extra trusted CAs.
    pub fn from_pem(
        cert_pem: &str,
        key_pem: &str,
        origin: &str,
        accepted: Vec<ParsedCertificate>,
        now: OffsetDateTime,
    ) -> Result<Self, CaError> {
        let mut certs = parse_certificates(cert_pem, origin)?.into_iter();
        let signer = certs.next().ok_or_else(|| CaError::NotPem {
            origin: origin.to_owned(),
            what: "no CERTIFICATE block",
        })?;
        let chain: Vec<ParsedCertificate> = certs.collect();

        check_signing_ca(&signer, now)?;
        let kind = x509::key_kind(signer.spki());
        if !signing_key_kind_supported(&kind) {
            return Err(CaError::UnsupportedKeyType { kind });
        }
        let key = decode_key(key_pem, origin, &signer)?;
        check_chain(&signer, &chain, origin, now)?;

        let mut warnings = Vec::new();
        for cert in std::iter::once(&signer).chain(&chain) {
            let left = cert.not_after() - now;
            if left < EXPIRY_WARNING {
                warnings.push(CaWarning::ExpiresSoon {
                    subject: describe_name(&cert.raw_subject),
                    not_after: format_time(cert.not_after()),
                    days_left: left.whole_days(),
                });
            }
        }
        let root = chain.last().unwrap_or(&signer).clone();
        let mut trust_bundle = vec![root];
        for ca in accepted {
            if ca.basic_constraints().is_none_or(|bc| !bc.ca) {
                return Err(CaError::NotACa {
                    subject: describe_name(&ca.raw_subject),
                });
            }
            if ca.not_after() < now {
                warnings.push(CaWarning::AcceptedCaExpired {
                    subject: describe_name(&ca.raw_subject),
                    not_after: format_time(ca.not_after()),
                });
            }
            if !trust_bundle.iter().any(|c| c.der == ca.der) {
                trust_bundle.push(ca);
            }
        }
        Ok(Self {
            signer,
            chain,
            key,
            trust_bundle,
            warnings,
            rng: SystemRandom::new(),
        })
    }

    /// The certificate that signs leaves (root or intermediate).
    pub fn signer(&self) -> &ParsedCertificate {
        &self.signer
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    pub fn rng(&self) -> &SystemRandom {
        &self.rng
    }

    /// True when the signer is an intermediate below the Talos root.
    pub fn is_intermediate(&self) -> bool {
        !self.chain.is_empty()
    }

    /// The Talos root CA (what Talos's `machine.ca` holds).
    pub fn root(&self) -> &ParsedCertificate {
        self.chain.last().unwrap_or(&self.signer)
    }

    /// Certificates to send after the leaf: the intermediate(s), never the root.
    pub fn chain_to_send(&self) -> impl Iterator<Item = &ParsedCertificate> {
        let intermediates = self.chain.len().saturating_sub(1);
        std::iter::once(&self.signer)
            .filter(|_| self.is_intermediate())
            .chain(self.chain.iter().take(intermediates))
    }

    /// The talosconfig `ca` value before base64: root then accepted CAs, PEM.
    pub fn trust_bundle_pem(&self) -> String {
        self.trust_bundle.iter().map(ParsedCertificate::to_pem).collect()
    }

    pub fn warnings(&self) -> &[CaWarning] {
        &self.warnings
    }

    /// A human summary of the signer, for `ca inspect` and `check`.
    pub fn summary(&self, now: OffsetDateTime) -> CaSummary {
        CaSummary::of(&self.signer, now)
    }
}

/// What `ca inspect` prints about one certificate.
#[derive(Debug, Clone)]
pub struct CaSummary {
    pub subject: String,
    pub key_type: KeyKind,
    pub sha256_fingerprint: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub days_left: i64,
}

impl CaSummary {
    pub fn of(cert: &ParsedCertificate, now: OffsetDateTime) -> Self {
        Self {
            subject: describe_name(&cert.raw_subject),
            key_type: x509::key_kind(cert.spki()),
            sha256_fingerprint: cert.sha256_fingerprint(),
            not_before: cert.not_before(),
            not_after: cert.not_after(),
            days_left: (cert.not_after() - now).whole_days(),
        }
    }
}

impl fmt::Display for CaSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "subject:     {}", self.subject)?;
        writeln!(f, "key type:    {}", self.key_type)?;
        writeln!(f, "sha256:      {}", self.sha256_fingerprint)?;
        writeln!(f, "not before:  {}", format_time(self.not_before))?;
        writeln!(f, "not after:   {}", format_time(self.not_after))?;
        write!(f, "days left:   {}", self.days_left)
    }
}

pub fn format_time(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// RFC 4514-ish rendering of a DER name for messages (O=talos, CN=...).
pub fn describe_name(raw: &[u8]) -> String {
    match x509_cert::name::Name::from_der(raw) {
        Ok(name) if !name.is_empty() => name.to_string(),
        Ok(_) => "(empty subject)".into(),
        Err(_) => "(unreadable subject)".into(),
    }
}

struct Material {
    cert_pem: String,
    key_pem: String,
    /// The file whose permissions guard the key.
    key_path: PathBuf,
    /// Where this came from, for messages.
    origin: String,
}

/// `talosctl gen secrets` output: only the part we read.
#[derive(Deserialize)]
struct SecretsBundle {
    certs: Option<BundleCerts>,
}

#[derive(Deserialize)]
struct BundleCerts {
    os: Option<EncodedPair>,
}

#[derive(Deserialize)]
struct EncodedPair {
    crt: Option<String>,
    key: Option<String>,
}

/// A v1alpha1 machine config: only the part we read.
#[derive(Deserialize)]
struct MachineConfigDoc {
    machine: Option<MachineSection>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineSection {
    ca: Option<EncodedPair>,
    #[serde(default)]
    accepted_c_as: Vec<EncodedPair>,
}

fn read_text(path: &Path) -> Result<String, CaError> {
    std::fs::read_to_string(path).map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })
}

fn read_source(source: &CaSource) -> Result<Material, CaError> {
    match source {
        CaSource::Files { cert_file, key_file } => Ok(Material {
            cert_pem: read_text(cert_file)?,
            key_pem: read_text(key_file)?,
            key_path: key_file.clone(),
            origin: key_file.display().to_string(),
        }),
        CaSource::SecretsBundle(path) => {
            let text = read_text(path)?;
            let bundle: SecretsBundle = serde_yaml_ng::from_str(&text).map_err(|e| CaError::Yaml {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let pair = bundle
                .certs
                .and_then(|c| c.os)
                .ok_or_else(|| CaError::MissingField {
                    path: path.clone(),
                    field: "certs.os",
                })?;
            decode_pair(pair, path, "certs.os")
        }
        CaSource::MachineConfig(path) => {
            let text = read_text(path)?;
            // Talos machine configs may hold several YAML documents; the
            // v1alpha1 one carries `machine`.
            let mut found = None;
            for document in serde_yaml_ng::Deserializer::from_str(&text) {
                let value = serde_yaml_ng::Value::deserialize(document).map_err(|e| CaError::Yaml {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                if value.get("machine").is_some() {
                    let doc: MachineConfigDoc =
                        serde_yaml_ng::from_value(value).map_err(|e| CaError::Yaml {
                            path: path.clone(),
                            reason: e.to_string(),
                        })?;
                    found = doc.machine;
                    break;
                }
            }
            let machine = found.ok_or_else(|| CaError::MissingField {
                path: path.clone(),
                field: "machine",
            })?;
            let pair = machine.ca.ok_or_else(|| CaError::MissingField {
                path: path.clone(),
                field: "machine.ca",
            })?;
            let mut material = decode_pair(pair, path, "machine.ca")?;
            // acceptedCAs travel with the config; they only need a certificate.
            for extra in machine.accepted_c_as {
                if let Some(crt) = extra.crt {
                    let pem = decode_base64(&crt, &material.origin, "machine.acceptedCAs[].crt")?;
                    material.cert_pem.push('\n');
                    material.cert_pem.push_str(&pem);
                }
            }
            Ok(material)
        }
    }
}

fn decode_pair(pair: EncodedPair, path: &Path, field: &'static str) -> Result<Material, CaError> {
    let origin = format!("{} ({field})", path.display());
    let crt = pair.crt.ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field: if field == "certs.os" {
            "certs.os.crt"
        } else {
            "machine.ca.crt"
        },
    })?;
    let cert_pem = decode_base64(&crt, &origin, "crt")?;
    let key = pair.key.unwrap_or_default();
    // An empty or redacted key is not base64 of anything: report it as such.
    let key_pem = match key.trim() {
        "" => return Err(CaError::EmptyKey { origin }),
        "******" => return Err(CaError::RedactedKey { origin }),
        encoded => decode_base64(encoded, &origin, "key")?,
    };
    Ok(Material {
        cert_pem,
        key_pem,
        key_path: path.to_owned(),
        origin,
    })
}

fn decode_base64(value: &str, origin: &str, field: &'static str) -> Result<String, CaError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| CaError::Base64 {
            origin: origin.to_owned(),
            field,
        })?;
    String::from_utf8(bytes).map_err(|_| CaError::Base64 {
        origin: origin.to_owned(),
        field,
    })
}

/// The key file must not be readable by anyone but its owner.
fn check_key_permissions(path: &Path, allow_insecure: bool) -> Result<Option<CaWarning>, CaError> {
    let verdict = crate::secret_file::check(path).map_err(|source| CaError::Read {
        path: path.to_owned(),
        source,
    })?;
    match verdict {
        Ok(()) => Ok(None),
        Err(too_open) if allow_insecure => Ok(Some(CaWarning::InsecurePermissionsAllowed {
            path: path.to_owned(),
            mode: too_open.mode,
        })),
        Err(too_open) => Err(CaError::InsecurePermissions {
            path: path.to_owned(),
            mode: too_open.mode,
        }),
    }
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

fn check_signing_ca(cert: &ParsedCertificate, now: OffsetDateTime) -> Result<(), CaError> {
    let subject = describe_name(&cert.raw_subject);
    if cert.basic_constraints().is_none_or(|bc| !bc.ca) {
        return Err(CaError::NotACa { subject });
    }
    if cert.key_usage().is_some_and(|ku| !ku.key_cert_sign()) {
        return Err(CaError::CannotSignCertificates { subject });
    }
    if now > cert.not_after() {
        return Err(CaError::Expired {
            subject,
            not_after: format_time(cert.not_after()),
        });
    }
    if now < cert.not_before() {
        return Err(CaError::NotYetValid {
            subject,
            not_before: format_time(cert.not_before()),
        });
    }
    Ok(())
}

fn signing_key_kind_supported(kind: &KeyKind) -> bool {
    match kind {
        KeyKind::Ed25519 | KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => true,
        KeyKind::Rsa { bits } => *bits >= 2048,
        KeyKind::Other(_) => false,
    }
}

/// Each certificate must be a valid CA signed by the next; the last must be
/// self-signed (the Talos root).
fn check_chain(
    signer: &ParsedCertificate,
    chain: &[ParsedCertificate],
    origin: &str,
    now: OffsetDateTime,
) -> Result<(), CaError> {
    let broken = |reason: String| CaError::BrokenChain {
        origin: origin.to_owned(),
        reason,
    };
    let mut child = signer;
    for parent in chain {
        check_signing_ca(parent, now)?;
        if child.raw_issuer != parent.raw_subject {
            return Err(broken(format!(
                "{} was issued by {}, but the next certificate is {}",
                describe_name(&child.raw_subject),
                describe_name(&child.raw_issuer),
                describe_name(&parent.raw_subject)
            )));
        }
        child.verify_signed_by(parent.spki()).map_err(|e| {
            broken(format!(
                "{} is not signed by {}: {e}",
                describe_name(&child.raw_subject),
                describe_name(&parent.raw_subject)
            ))
        })?;
        child = parent;
    }
    let ends_at_root = child.is_self_issued() && child.verify_signed_by(child.spki()).is_ok();
    if !chain.is_empty() && !ends_at_root {
        return Err(broken(format!(
            "it must end with the self-signed Talos root CA; it ends with {}",
            describe_name(&child.raw_subject)
        )));
    }
    Ok(())
}

/// Decode the private key and prove it belongs to `cert` by signing a probe
/// and verifying it with the certificate's public key.
fn decode_key(text: &str, origin: &str, cert: &ParsedCertificate) -> Result<SigningKey, CaError> {
    match text.trim() {
        "" => {
            return Err(CaError::EmptyKey {
                origin: origin.to_owned(),
            });
        }
        "******" => {
            return Err(CaError::RedactedKey {
                origin: origin.to_owned(),
            });
        }
        _ => {}
    }
    let mut blocks = x509::pem_blocks(text).map_err(|_| CaError::NotPem {
        origin: origin.to_owned(),
        what: "unreadable PEM",
    })?;
    // A key file may hold other blocks first (`openssl ecparam -genkey`
    // writes EC PARAMETERS before the key): take the private key block, and
    // only name another label when there is none.
    let position = blocks
        .iter()
        .position(|(label, _)| label.ends_with("PRIVATE KEY"))
        .or_else(|| blocks.iter().position(|(label, _)| label != "CERTIFICATE"));
    let Some((label, der)) = position.map(|i| blocks.swap_remove(i)) else {
        return Err(CaError::NotPem {
            origin: origin.to_owned(),
            what: "no PRIVATE KEY block",
        });
    };
    let bad = |reason: String| CaError::BadKey {
        origin: origin.to_owned(),
        label: label.clone(),
        reason,
    };
    let rng = SystemRandom::new();
    let cert_key = cert.spki().subject_public_key.raw_bytes();
    let key = match label.as_str() {
        "ED25519 PRIVATE KEY" | "PRIVATE KEY" => {
            let info = pkcs8::PrivateKeyInfoRef::from_der(&der).map_err(|e| bad(e.to_string()))?;
            let algorithm = info.algorithm.oid;
            if algorithm == oid::ED25519 {
                SigningKey::Ed25519(
                    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| bad(e.to_string()))?,
                )
            } else if algorithm == oid::EC_PUBLIC_KEY {
                let curve = info
                    .algorithm
                    .parameters
                    .and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
                let sec1 = sec1::EcPrivateKey::from_der(info.private_key.as_bytes())
                    .map_err(|e| bad(e.to_string()))?;
                ecdsa_key(curve, sec1.private_key, cert_key, &rng, origin)
                    .map_err(|e| e.unwrap_or_else(&bad))?
            } else if algorithm == oid::RSA_ENCRYPTION {
                SigningKey::Rsa(RsaKeyPair::from_pkcs8(&der).map_err(|e| bad(e.to_string()))?)
            } else {
                return Err(bad(format!("unsupported key algorithm {algorithm}")));
            }
        }
        "EC PRIVATE KEY" => {
            let sec1 = sec1::EcPrivateKey::from_der(&der).map_err(|e| bad(e.to_string()))?;
            let curve = sec1.parameters.and_then(|p| p.named_curve());
            ecdsa_key(curve, sec1.private_key, cert_key, &rng, origin).map_err(|e| e.unwrap_or_else(&bad))?
        }
        "RSA PRIVATE KEY" => SigningKey::Rsa(RsaKeyPair::from_der(&der).map_err(|e| bad(e.to_string()))?),
        _ => {
            return Err(CaError::UnsupportedKeyLabel {
                origin: origin.to_owned(),
                label,
            });
        }
    };
    let probe = b"talos-sso: does this key belong to the CA certificate?";
    let matches = key
        .sign(&rng, probe)
        .and_then(|sig| x509::verify_signature(cert.spki(), &key.signature_algorithm(), probe, &sig))
        .is_ok();
    if !matches {
        return Err(CaError::KeyMismatch {
            origin: origin.to_owned(),
        });
    }
    Ok(key)
}

/// ring needs the public point next to the scalar; SEC1 keys may omit it, so
/// take it from the certificate: ring refuses a scalar that does not produce
/// that point, which is exactly a key that does not match its certificate.
/// The error is `Ok(CaError)` for a mismatch, `Err(reason)` for a bad key.
fn ecdsa_key(
    curve: Option<ObjectIdentifier>,
    scalar: &[u8],
    cert_public_key: &[u8],
    rng: &SystemRandom,
    origin: &str,
) -> Result<SigningKey, Result<CaError, String>> {
    let (algorithm, wrap): (_, fn(EcdsaKeyPair) -> SigningKey) = match curve {
        Some(c) if c == oid::SECP256R1 => (&signature::ECDSA_P256_SHA256_ASN1_SIGNING, SigningKey::EcdsaP256),
        Some(c) if c == oid::SECP384R1 => (&signature::ECDSA_P384_SHA384_ASN1_SIGNING, SigningKey::EcdsaP384),
        Some(c) => return Err(Err(format!("unsupported curve {c}"))),
        None => return Err(Err("the key names no curve".into())),
    };
    EcdsaKeyPair::from_private_key_and_public_key(algorithm, scalar, cert_public_key, rng)
        .map(wrap)
        .map_err(|_| {
            Ok(CaError::KeyMismatch {
                origin: origin.to_owned(),
            })
        })
}
