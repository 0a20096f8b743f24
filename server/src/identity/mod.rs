//! Identity: what the server believes about the person (or workload)
//! behind a request.
//!
//! The server trusts nothing but a bearer token it has verified itself,
//! from an issuer it was configured to trust.
//! - `token`: the checks every JWT gets, whoever issued it (pure).
//! - `jwks`: a provider's key set, reduced to usable signing keys (pure).
//! - `provider`: discovery at start and the key cache of one issuer
//!   (refresh on unknown `kid`, rate-limited, last good set kept).
//! - `issuer`: one trusted issuer and its kind (`oidc`, `entra`): which
//!   `iss` it accepts and how its tokens name people, tenants and groups.
//! - `graph`: Microsoft Graph, for Entra group overage.
//! - `auth_error`: why a token was not accepted, as an API code.
//! - `authenticator`: every trusted issuer together: a token is routed to
//!   its issuer, verified, its groups completed and filtered.
//!
//! What the rest of the server reads: [`VerifiedIdentity`] for a token that
//! passed, [`ClaimedIdentity`] for one that did not.

pub mod auth_error;
pub mod authenticator;
pub mod graph;
pub mod issuer;
pub mod jwks;
pub mod provider;
pub mod token;

#[cfg(test)]
mod testing;

use serde_json::{Map, Value};
use time::OffsetDateTime;

use issuer::Principal;
use token::SignedToken;

/// A token that passed every check of its issuer, and who it is about.
#[derive(Debug, Clone)]
pub struct VerifiedIdentity {
    /// The configured issuer that verified it (`login` for the one people
    /// log in with, else its `trusted_issuers` name): what policy rules,
    /// `auditors` and `admins` are scoped by.
    pub issuer_name: String,
    /// The token's `iss`.
    pub issuer: String,
    /// The tenant, for issuers that have tenants (Entra `tid`).
    pub tenant: Option<String>,
    /// Stable subject: `oid` (Entra) or `sub`.
    pub subject: String,
    pub username: String,
    /// Groups some rule names (the others are dropped).
    pub groups: Vec<String>,
    pub app_roles: Vec<String>,
    /// `uti` (Entra) or `jti`.
    pub token_id: Option<String>,
    /// Hex SHA-256 of what the signature covers: the replay key of a token
    /// without an id (see [`SignedToken::signed_sha256`]).
    pub signed_sha256: String,
    pub issued_at: Option<OffsetDateTime>,
    pub expires_at: OffsetDateTime,
    /// Every claim, for policy `claims` selectors and the audit trail.
    pub claims: Map<String, Value>,
    /// An application's own token (client credentials): its client id.
    /// `None` for a person. Applications get no certificate unless a rule
    /// names them (`policy`), and read the trail only as `auditors` allow.
    pub application: Option<String>,
    /// A workload's token (CI job, service account): its kind and the
    /// claims workload rules match. Judged by workload rules only.
    pub workload: Option<issuer::workload::Workload>,
}

/// Longest token id used as a replay key as it is; longer ones are hashed.
const MAX_REPLAY_ID: usize = 128;

impl VerifiedIdentity {
    fn new(issuer_name: &str, signed: SignedToken, principal: Principal) -> Self {
        Self {
            issuer_name: issuer_name.to_owned(),
            issuer: signed.issuer,
            tenant: principal.tenant,
            subject: principal.subject,
            username: principal.username,
            groups: principal.groups,
            app_roles: principal.app_roles,
            token_id: principal.token_id,
            signed_sha256: signed.signed_sha256,
            issued_at: signed.issued_at,
            expires_at: signed.expires_at,
            claims: signed.claims,
            application: principal.application,
            workload: principal.workload,
        }
    }

    /// What the replay guard claims for this token: its id (hashed when too
    /// long to be a key, or when it could pass for a hash), else a hash of
    /// what its signature covers.
    /// Keys of a trusted issuer's tokens start with its name, so that
    /// another issuer's token ids (a workload issuer's may be predictable)
    /// cannot collide with them.
    pub fn replay_key(&self) -> String {
        let key = self.unqualified_replay_key();
        if self.from_login_issuer() {
            key
        } else {
            format!("{}:{key}", self.issuer_name)
        }
    }

    /// Whether the login issuer (the one people log in with) verified it.
    pub fn from_login_issuer(&self) -> bool {
        self.issuer_name == crate::config::LOGIN_ISSUER
    }

    /// The subject, qualified by the issuer's name for a trusted issuer: what
    /// per-person limits count, so that subjects of different issuers never
    /// share a quota.
    pub fn qualified_subject(&self) -> String {
        if self.from_login_issuer() {
            self.subject.clone()
        } else {
            format!("{}:{}", self.issuer_name, self.subject)
        }
    }

    fn unqualified_replay_key(&self) -> String {
        match &self.token_id {
            Some(id) if id.len() <= MAX_REPLAY_ID && !id.starts_with("sha256:") => id.clone(),
            Some(id) => format!(
                "sha256:{}",
                hex::encode(ring::digest::digest(&ring::digest::SHA256, id.as_bytes()))
            ),
            None => format!("sha256:{}", self.signed_sha256),
        }
    }
}

/// Who a token that failed verification claims to be, as its issuer's kind
/// reads it: for the record of the refusal, never for a decision. Every
/// value is cleaned for the audit trail (`talos_sso_text::clean_field`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimedIdentity {
    pub issuer: Option<String>,
    pub tenant: Option<String>,
    pub subject: Option<String>,
    pub username: Option<String>,
    pub token_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_key_of_a_token_without_an_id_is_what_its_signature_covers() {
        let verified = VerifiedIdentity {
            token_id: None,
            ..identity()
        };
        assert_eq!(verified.replay_key(), format!("sha256:{}", "ab".repeat(32)));
        let with_id = VerifiedIdentity {
            token_id: Some("uti-1".into()),
            ..verified
        };
        assert_eq!(with_id.replay_key(), "uti-1");
        let long = VerifiedIdentity {
            token_id: Some("j".repeat(5000)),
            ..with_id
        };
        assert!(long.replay_key().starts_with("sha256:") && long.replay_key().len() == 71);
        // A trusted issuer's keys and subjects are its own.
        let workload = VerifiedIdentity {
            issuer_name: "ci".into(),
            ..identity()
        };
        assert_eq!(workload.replay_key(), "ci:uti-1");
        assert_eq!(workload.qualified_subject(), "ci:s");
        assert!(!workload.from_login_issuer());
    }

    fn identity() -> VerifiedIdentity {
        VerifiedIdentity {
            issuer_name: crate::config::LOGIN_ISSUER.into(),
            issuer: "i".into(),
            tenant: None,
            subject: "s".into(),
            username: "u".into(),
            groups: vec![],
            app_roles: vec![],
            token_id: Some("uti-1".into()),
            signed_sha256: "ab".repeat(32),
            issued_at: None,
            expires_at: OffsetDateTime::UNIX_EPOCH,
            claims: Default::default(),
            application: None,
            workload: None,
        }
    }
}
