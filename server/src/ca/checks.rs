//! The checks CA material must pass before it signs anything: the signer is
//! a CA allowed to sign certificates and valid now, its key type can sign
//! here, an intermediate's chain leads to the self-signed Talos root, and the
//! key file is readable by its owner only.

use std::path::Path;

use time::OffsetDateTime;

use super::{CaError, CaWarning, describe_name, format_time};
use crate::keys::KeyKind;
use crate::x509::{ParsedCertificate, oid};

/// The key file must not be readable by anyone but its owner.
pub(super) fn check_key_permissions(path: &Path, allow_insecure: bool) -> Result<Option<CaWarning>, CaError> {
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

/// A certificate that signs others: a CA, allowed to sign certificates (a
/// key usage without keyCertSign forbids it), and valid at `now`.
pub(super) fn check_signing_ca(cert: &ParsedCertificate, now: OffsetDateTime) -> Result<(), CaError> {
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

/// Key types this server can sign with.
pub(super) fn signing_key_kind_supported(kind: &KeyKind) -> bool {
    match kind {
        KeyKind::Ed25519 | KeyKind::EcdsaP256 | KeyKind::EcdsaP384 => true,
        KeyKind::Rsa { bits } => *bits >= 2048,
        KeyKind::Other(_) => false,
    }
}

/// Each certificate must be a valid CA signed by the next; the last must be
/// self-signed (the Talos root).
pub(super) fn check_chain(
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

/// Whether a CA can verify a server certificate (its extended key usage,
/// when it has one, allows serverAuth): the talosconfig `ca` is for
/// verifying apid, so a client-only CA (talos-sso's own, listed in the same
/// `machine.acceptedCAs`) has nothing to do there.
pub fn can_vouch_for_a_server(cert: &ParsedCertificate) -> bool {
    cert.ext_key_usage().is_none_or(|usages| {
        usages.contains(&oid::KP_SERVER_AUTH) || usages.contains(&oid::ANY_EXTENDED_KEY_USAGE)
    })
}
