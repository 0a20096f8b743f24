//! [`CertificateAuthority`]: CA material that passed every check, holding
//! the signing key, the chain to send after a leaf, the trust bundle for
//! talosconfigs and the [`TrustMode`]; and [`CaSummary`], what `ca inspect`
//! and `check` print.

use std::fmt;
use std::sync::Arc;

use ring::rand::SystemRandom;
use time::{Duration, OffsetDateTime};

use super::checks::{
    can_vouch_for_a_server, check_chain, check_key_permissions, check_signing_ca, signing_key_kind_supported,
};
use super::key::{PROBE, decode_key};
use super::material::{Material, parse_certificates, read_text};
use super::{CaError, CaOptions, CaSource, CaWarning, TrustMode, describe_name, format_time, talos_ca};
use crate::config::Pkcs11Source;
use crate::keys::pkcs11::Pkcs11Key;
use crate::keys::{KeyKind, Signer, key_kind};
use crate::x509::{self, ParsedCertificate, oid};

/// A CA whose certificate expires sooner than this produces a warning: a Talos
/// CA that quietly expires is an outage with a long fuse.
pub const EXPIRY_WARNING: Duration = Duration::days(90);

/// A loaded, checked CA that can sign client certificates.
#[derive(Debug)]
pub struct CertificateAuthority {
    /// The certificate whose key we hold: the Talos root, or an intermediate.
    signer: ParsedCertificate,
    /// Certificates above the signer, nearest first, ending at the Talos root.
    /// Empty when the signer is the root itself.
    chain: Vec<ParsedCertificate>,
    /// The signer's private key, of whichever kind the source named.
    key: Arc<dyn Signer>,
    /// What goes into the talosconfig `ca` before base64: the root (in
    /// accepted-CA mode, the Talos cluster CA), then accepted CAs, as PEM;
    /// made once, it is in every answer.
    trust_bundle_pem: String,
    mode: TrustMode,
    warnings: Vec<CaWarning>,
    rng: SystemRandom,
}

impl CertificateAuthority {
    /// Read and check CA material. `now` decides expiry; nothing here reads
    /// the wall clock, so tests can walk the validity edges.
    pub fn load(source: &CaSource, options: &CaOptions, now: OffsetDateTime) -> Result<Self, CaError> {
        let mut material = source.read()?;
        let mut warnings = Vec::new();
        if let Some(warning) =
            check_key_permissions(&material.key_path, options.allow_insecure_key_permissions)?
        {
            tracing::warn!(path = %material.key_path.display(), "{warning}");
            warnings.push(warning);
        }
        let mut accepted = std::mem::take(&mut material.accepted);
        for path in &options.accepted_cas {
            let text = read_text(path)?;
            accepted.extend(parse_certificates(&text, &path.display().to_string())?);
        }
        let talos_ca = options
            .talos_ca
            .as_ref()
            .map(|source| talos_ca::talos_ca_certificates(source, talos_ca::KeyPolicy::Refuse))
            .transpose()?;
        let ca = Self::from_signer(
            &material.cert_pem,
            &material.origin,
            talos_ca,
            accepted,
            now,
            |signer| open_key(source, &material, signer),
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
        Self::from_signer(cert_pem, origin, None, accepted, now, |signer| {
            Ok(Arc::new(decode_key(key_pem, origin, signer)?))
        })
    }

    /// Check the certificates, and get the key matching the signer from
    /// `key_for` (which proves the match). With `talos_ca` (accepted-CA
    /// mode), the signer must be a self-signed client-only CA, and the
    /// Talos cluster CA is what the talosconfig trusts.
    fn from_signer(
        cert_pem: &str,
        origin: &str,
        talos_ca: Option<Vec<ParsedCertificate>>,
        accepted: Vec<ParsedCertificate>,
        now: OffsetDateTime,
        key_for: impl FnOnce(&ParsedCertificate) -> Result<Arc<dyn Signer>, CaError>,
    ) -> Result<Self, CaError> {
        let mut certs = parse_certificates(cert_pem, origin)?.into_iter();
        let signer = certs.next().ok_or_else(|| CaError::NotPem {
            origin: origin.to_owned(),
            what: "no CERTIFICATE block",
        })?;
        let chain: Vec<ParsedCertificate> = certs.collect();

        check_signing_ca(&signer, now)?;
        let kind = key_kind(signer.spki());
        if !signing_key_kind_supported(&kind) {
            return Err(CaError::UnsupportedKeyType { kind });
        }
        let key = key_for(&signer)?;
        check_chain(&signer, &chain, origin, now)?;
        let mode = match &talos_ca {
            Some(talos_ca) => {
                check_client_only_ca(&signer, &chain, talos_ca, origin)?;
                TrustMode::AcceptedCa
            }
            None if !chain.is_empty() => {
                // What the intermediate signs must not pass as a server:
                // its key would otherwise sign apid certificates that chain
                // to machine.ca.
                if can_vouch_for_a_server(&signer) {
                    return Err(CaError::IntermediateNotClientOnly {
                        subject: describe_name(&signer.raw_subject),
                    });
                }
                TrustMode::Intermediate
            }
            None if can_vouch_for_a_server(&signer) => TrustMode::ClusterCa,
            // A client-only intermediate alone (as `ca intermediate` makes
            // them) lacks the issuers its file must carry; told so, rather
            // than sent to accepted-CA mode, where it would be refused too.
            None if !signer.is_self_issued() => {
                return Err(CaError::BrokenChain {
                    origin: origin.to_owned(),
                    reason: format!(
                        "{} is issued by {}, which is not in the file: put the certificates above it, \
                         up to the Talos root, after it",
                        describe_name(&signer.raw_subject),
                        describe_name(&signer.raw_issuer)
                    ),
                });
            }
            None => {
                return Err(CaError::ClientOnlyWithoutTalosCa {
                    subject: describe_name(&signer.raw_subject),
                });
            }
        };

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
        // The talosconfig `ca` verifies apid: an accepted CA that cannot
        // vouch for a server (the client CA itself, say) has no place there.
        // (Checked after being a CA, which the loop below checks of all.)
        if let Some(ca) = accepted
            .iter()
            .find(|ca| ca.basic_constraints().is_some_and(|bc| bc.ca) && !can_vouch_for_a_server(ca))
        {
            return Err(CaError::AcceptedCaClientOnly {
                subject: describe_name(&ca.raw_subject),
            });
        }
        let mut trust_bundle: Vec<ParsedCertificate> = Vec::new();
        let trusted = match talos_ca {
            Some(talos_ca) => talos_ca,
            None => vec![chain.last().unwrap_or(&signer).clone()],
        };
        for ca in trusted.into_iter().chain(accepted) {
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
            trust_bundle_pem: trust_bundle.iter().map(ParsedCertificate::to_pem).collect(),
            mode,
            warnings,
            rng: SystemRandom::new(),
        })
    }

    /// The certificate that signs leaves (root or intermediate).
    pub fn signer(&self) -> &ParsedCertificate {
        &self.signer
    }

    pub fn key(&self) -> &dyn Signer {
        &*self.key
    }

    /// Where the key lives when it is outside this process (a PKCS#11
    /// token), for `check` and `ca inspect`.
    pub fn key_location(&self) -> Option<String> {
        self.key.location()
    }

    /// Wait for a turn to sign a leaf: at once for a key in a file, and for
    /// a key in a token, until fewer than a bounded number of issuances are
    /// signing with it ([`Signer::turns`]). Held while signing.
    pub async fn turn_to_sign(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // The semaphore is never closed: an error cannot happen.
        self.key.turns()?.acquire().await.ok()
    }

    /// Whether the CA can sign now. A key in memory always can; a key
    /// outside the process signs a probe (a token reopens its module after a
    /// failure), so this blocks on it: call it off the async runtime.
    pub fn signing_available(&self) -> bool {
        self.key.location().is_none() || self.key.sign(PROBE).is_ok()
    }

    pub fn rng(&self) -> &SystemRandom {
        &self.rng
    }

    /// How Talos comes to trust what this CA signs.
    pub fn mode(&self) -> TrustMode {
        self.mode
    }

    /// True when the signer is an intermediate below the Talos root.
    pub fn is_intermediate(&self) -> bool {
        !self.chain.is_empty()
    }

    /// The top of the signer's chain: the Talos root CA (what Talos's
    /// `machine.ca` holds), or in accepted-CA mode the client-only CA itself.
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
    pub fn trust_bundle_pem(&self) -> &str {
        &self.trust_bundle_pem
    }

    pub fn warnings(&self) -> &[CaWarning] {
        &self.warnings
    }

    /// A human summary of the signer, for `ca inspect` and `check`.
    pub fn summary(&self, now: OffsetDateTime) -> CaSummary {
        CaSummary::of(&self.signer, now)
    }
}

/// The signer of a cluster in accepted-CA mode: one self-signed CA whose
/// extended key usage is clientAuth and nothing that vouches for a server,
/// and not the Talos cluster CA itself.
fn check_client_only_ca(
    signer: &ParsedCertificate,
    chain: &[ParsedCertificate],
    talos_ca: &[ParsedCertificate],
    origin: &str,
) -> Result<(), CaError> {
    let subject = describe_name(&signer.raw_subject);
    let self_signed = signer.is_self_issued() && signer.verify_signed_by(signer.spki()).is_ok();
    if !chain.is_empty() || !self_signed {
        return Err(CaError::NotSelfSigned {
            subject,
            origin: origin.to_owned(),
        });
    }
    let usages = signer.ext_key_usage();
    let client_only = usages
        .as_ref()
        .is_some_and(|u| u.contains(&oid::KP_CLIENT_AUTH) && !can_vouch_for_a_server(signer));
    if !client_only {
        let usages = match usages {
            None => "absent, which allows every use".to_owned(),
            Some(u) => u.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        };
        return Err(CaError::NotClientOnly { subject, usages });
    }
    if signer.basic_constraints().and_then(|bc| bc.path_len_constraint) != Some(0) {
        return Err(CaError::ClientCaPathLength { subject });
    }
    if talos_ca.iter().any(|ca| ca.spki() == signer.spki()) {
        return Err(CaError::TalosCaIsSigner { subject });
    }
    if let Some(ca) = talos_ca.iter().find(|ca| !can_vouch_for_a_server(ca)) {
        return Err(CaError::TalosCaClientOnly {
            subject: describe_name(&ca.raw_subject),
        });
    }
    Ok(())
}

/// The signer's key, of the kind the source names, proved to be the
/// certificate's: the one place where a CA's key kind is chosen.
fn open_key(
    source: &CaSource,
    material: &Material,
    signer: &ParsedCertificate,
) -> Result<Arc<dyn Signer>, CaError> {
    Ok(match source {
        CaSource::Pkcs11 { pkcs11, .. } => Arc::new(open_pkcs11(pkcs11, signer)?),
        CaSource::Files { .. } | CaSource::SecretsBundle(_) | CaSource::MachineConfig(_) => {
            Arc::new(decode_key(&material.key_pem, &material.origin, signer)?)
        }
    })
}

/// Open the token's key (its PIN from the file the source names) and prove
/// with a probe signature that it is the certificate's: a mismatch names
/// the token and the key label.
fn open_pkcs11(source: &Pkcs11Source, signer: &ParsedCertificate) -> Result<Pkcs11Key, CaError> {
    let pin = zeroize::Zeroizing::new(read_text(&source.pin_file)?);
    let key = Pkcs11Key::open(source, pin.trim_end_matches(['\n', '\r']), signer.spki())?;
    let signature = key.sign(PROBE)?;
    if x509::verify_signature(
        signer.spki(),
        &Signer::signature_algorithm(&key),
        PROBE,
        &signature,
    )
    .is_err()
    {
        return Err(CaError::KeyMismatch {
            origin: source.describe(),
        });
    }
    Ok(key)
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
            key_type: key_kind(cert.spki()),
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

#[cfg(test)]
mod tests {
    use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages};

    use super::*;
    use crate::ca::generate::{NewKeyType, generate_key};
    use crate::x509::{CertificateTemplate, oid};

    #[test]
    fn a_ca_certificate_with_an_extension_twice_is_refused() {
        let rng = SystemRandom::new();
        let key = generate_key(NewKeyType::Ed25519, &rng).unwrap();
        let spki = der::Encode::to_der(&key.key.public_key_info().unwrap()).unwrap();
        let name = x509::encode_name(&[(oid::ORGANIZATION, "talos")]).unwrap();
        let now = OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap();
        let usage =
            |usages: KeyUsages| x509::extension(oid::KEY_USAGE, true, &KeyUsage(usages.into())).unwrap();
        let ca = BasicConstraints {
            ca: true,
            path_len_constraint: None,
        };
        let ca = x509::extension(oid::BASIC_CONSTRAINTS, true, &ca).unwrap();
        // Either order: a verifier reading the first or the last sees another CA.
        let orders = [
            [usage(KeyUsages::KeyCertSign), usage(KeyUsages::DigitalSignature)],
            [usage(KeyUsages::DigitalSignature), usage(KeyUsages::KeyCertSign)],
        ];
        for [first, second] in orders {
            let template = CertificateTemplate {
                serial: &[1],
                issuer: &name,
                subject: &name,
                subject_public_key_info: &spki,
                not_before: now - Duration::hours(1),
                not_after: now + Duration::hours(1),
                extensions: vec![ca.clone(), first, second],
            };
            let der = x509::sign_certificate(&template, &key.key).unwrap();
            let pem = x509::pem_encode("CERTIFICATE", &der);
            let error = CertificateAuthority::from_pem(&pem, &key.pem, "test", Vec::new(), now).unwrap_err();
            assert_eq!(error.code(), "ca_certificate_invalid");
            assert!(error.to_string().contains("more than once"), "{error}");
        }
    }
}
