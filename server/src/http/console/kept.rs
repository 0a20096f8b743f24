//! What a console session keeps of the person who logged in, as the
//! database holds it (JSON): only what the console decides on and records
//! after login. The ID token's own fields (its claims, expiry, the hash of
//! what its signature covers) are not kept; nothing after login reads them.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::identity::VerifiedIdentity;

/// A session's person, as stored.
#[derive(Debug, Serialize, Deserialize)]
struct Kept {
    issuer: String,
    tenant: Option<String>,
    subject: String,
    username: String,
    /// The groups some rule names, as at login: who is an auditor or admin
    /// is decided from them at each request, under the configuration of
    /// the moment.
    groups: Vec<String>,
    app_roles: Vec<String>,
    /// The ID token's `uti`/`jti` and `iat`, as the records of the
    /// session's requests name them.
    token_id: Option<String>,
    issued_at: Option<i64>,
}

/// `identity` as a session keeps it. Only people of the login issuer get
/// a session (the callback checks it).
pub fn keep(identity: &VerifiedIdentity) -> String {
    let kept = Kept {
        issuer: identity.issuer.clone(),
        tenant: identity.tenant.clone(),
        subject: identity.subject.clone(),
        username: identity.username.clone(),
        groups: identity.groups.clone(),
        app_roles: identity.app_roles.clone(),
        token_id: identity.token_id.clone(),
        issued_at: identity.issued_at.map(OffsetDateTime::unix_timestamp),
    };
    // Strings and lists of strings: serialising cannot fail.
    serde_json::to_string(&kept).unwrap_or_default()
}

/// The identity a session kept; `None` when the text is not one.
pub fn restore(text: &str) -> Option<VerifiedIdentity> {
    let kept: Kept = serde_json::from_str(text).ok()?;
    Some(VerifiedIdentity {
        issuer_name: crate::config::LOGIN_ISSUER.into(),
        issuer: kept.issuer,
        tenant: kept.tenant,
        subject: kept.subject,
        username: kept.username,
        groups: kept.groups,
        app_roles: kept.app_roles,
        token_id: kept.token_id,
        signed_sha256: String::new(),
        issued_at: kept
            .issued_at
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok()),
        expires_at: OffsetDateTime::UNIX_EPOCH,
        claims: Default::default(),
        application: None,
        workload: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_console_decides_on_and_records_survives_the_database() {
        let identity = VerifiedIdentity {
            issuer_name: crate::config::LOGIN_ISSUER.into(),
            issuer: "https://login.example/t/v2.0".into(),
            tenant: Some("t".into()),
            subject: "oid-1".into(),
            username: "sam@example.com".into(),
            groups: vec!["security".into()],
            app_roles: vec!["Talos.Auditor".into()],
            token_id: Some("uti-1".into()),
            signed_sha256: "00".repeat(32),
            issued_at: Some(OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()),
            expires_at: OffsetDateTime::UNIX_EPOCH,
            claims: [("nonce".to_owned(), "n".into())].into_iter().collect(),
            application: None,
            workload: None,
        };
        let text = keep(&identity);
        assert!(!text.contains("nonce"), "claims are not kept: {text}");
        let back = restore(&text).unwrap();
        assert!(back.from_login_issuer() && back.application.is_none());
        assert_eq!(
            (back.issuer, back.tenant, back.subject, back.username),
            (
                identity.issuer,
                identity.tenant,
                identity.subject,
                identity.username
            )
        );
        assert_eq!(
            (back.groups, back.app_roles),
            (identity.groups, identity.app_roles)
        );
        assert_eq!(
            (back.token_id, back.issued_at),
            (identity.token_id, identity.issued_at)
        );
        assert!(restore("{\"issuer\": 5}").is_none());
    }
}
