//! Any OpenID Connect provider as an issuer: `iss` exactly one of the
//! configured issuers, the person is `sub` (an application's own token, as
//! RFC 9068 writes it, is its `client_id`), the token id `uti` or `jti`,
//! groups from `groups` and app roles from `roles`. No tenants; a token of
//! Entra's personal-account tenant is refused, and one whose groups did not
//! fit in it (Entra's overage markers) is refused rather than judged
//! without its groups: only the `entra` kind can look them up.

use talos_sso_api::issuer::is_template;

use super::{
    BoxFuture, Kind, Principal, Registration, claim_text, claimed_token_id, claimed_username, entra,
    principal,
};
use crate::config::IssuerConfig;
use crate::identity::auth_error::AuthError;
use crate::identity::token::{ClaimSet, TokenError, string_claim};
use crate::identity::{ClaimedIdentity, VerifiedIdentity};

pub(super) const KIND: Registration = Registration {
    name: "oidc",
    accepted_issuers,
    build,
};

fn accepted_issuers(config: &IssuerConfig) -> Result<Vec<String>, String> {
    if !config.allowed_tenants.is_empty() {
        return Err("`allowed_tenants` is for Entra issuers: set `kind: entra`".into());
    }
    if config.entra_graph.is_some() {
        return Err("`entra_graph` is for Entra issuers: set `kind: entra` and `allowed_tenants`".into());
    }
    let mut issuers = vec![config.issuer.clone()];
    issuers.extend(config.additional_issuers.iter().cloned());
    if let Some(template) = issuers.iter().find(|iss| is_template(iss)) {
        return Err(format!(
            "`{template}` is an Entra multi-tenant issuer: set `kind: entra` and `allowed_tenants`"
        ));
    }
    Ok(issuers)
}

fn build(config: &IssuerConfig) -> Result<Box<dyn Kind>, String> {
    Ok(Box::new(Oidc {
        issuers: accepted_issuers(config)?,
        username_claim: config.username_claim.clone(),
    }))
}

/// The client id of an application's own token, as RFC 9068 writes one
/// for the client credentials grant: `client_id`, and a `sub` that is that
/// client (or none). A person's token names them in `sub`.
fn application_client(claims: &ClaimSet) -> Option<&str> {
    let client_id = string_claim(claims, "client_id")?;
    match string_claim(claims, "sub") {
        None => Some(client_id),
        Some(sub) => (sub == client_id).then_some(client_id),
    }
}

#[derive(Debug)]
struct Oidc {
    issuers: Vec<String>,
    username_claim: Option<String>,
}

impl Kind for Oidc {
    fn accepts(&self, iss: &str, _claims: &ClaimSet) -> bool {
        self.issuers.iter().any(|accepted| accepted == iss)
    }

    fn identify(&self, claims: &ClaimSet) -> Result<Principal, TokenError> {
        if let Some(tid) = string_claim(claims, "tid")
            && tid.eq_ignore_ascii_case(super::CONSUMER_TENANT)
        {
            return Err(TokenError::TenantNotAllowed(tid.to_owned()));
        }
        let application = application_client(claims);
        let subject = string_claim(claims, "sub")
            .or(application)
            .ok_or(TokenError::SubjectMissing("sub"))?;
        principal(claims, None, subject, self.username_claim.as_deref(), application)
    }

    fn application_token(&self, claims: &ClaimSet) -> bool {
        application_client(claims).is_some()
    }

    fn claimed(&self, claims: &ClaimSet) -> ClaimedIdentity {
        ClaimedIdentity {
            issuer: claim_text(claims, "iss"),
            tenant: None,
            subject: claim_text(claims, "sub"),
            username: claimed_username(claims),
            token_id: claimed_token_id(claims),
        }
    }

    fn complete<'a>(
        &'a self,
        verified: VerifiedIdentity,
    ) -> BoxFuture<'a, Result<VerifiedIdentity, AuthError>> {
        let answer = if entra::groups_overage(&verified.claims) {
            Err(AuthError::OverageUnresolved {
                reason: "the issuer is configured as `kind: oidc`, which cannot look groups up".into(),
                identity: Box::new(verified),
            })
        } else {
            Ok(verified)
        };
        Box::pin(std::future::ready(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::testing::{NOW, at, code, oidc_config, rules, sign, signers};
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use serde_json::json;

    fn claims(extra: serde_json::Value) -> serde_json::Value {
        let mut claims =
            json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        claims
    }

    #[test]
    fn generic_oidc_uses_iss_sub_and_its_token_id() {
        let s = signers();
        let rules = rules(&oidc_config(Some("email")));
        let token = sign(
            &s,
            "ES256",
            "ec",
            &claims(
                json!({"email": "bob@example.com", "email_verified": true, "jti": "j-1",
                "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47", "oid": "o-1", "uti": "u", "groups": ["ops"]}),
            ),
        );
        let verified = rules.verify(&token, &s.keys, at(NOW)).unwrap();
        assert_eq!(
            (verified.subject.as_str(), verified.username.as_str()),
            ("u-1", "bob@example.com")
        );
        assert_eq!(verified.tenant, None, "a `tid` claim is no tenant here");
        assert_eq!(
            verified.token_id.as_deref(),
            Some("u"),
            "`uti` first, as Entra sends it"
        );
        assert_eq!(verified.groups, ["ops"]);
        // Issuers are compared exactly; there are no templates.
        for iss in ["https://idp.example.com/", "https://IDP.example.com"] {
            let other = sign(&s, "ES256", "ec", &claims(json!({ "iss": iss })));
            assert_eq!(code(&s, &other, &rules, NOW), "token_issuer_invalid", "{iss}");
        }
        let anonymous = sign(&s, "ES256", "ec", &claims(json!({"sub": ""})));
        assert_eq!(code(&s, &anonymous, &rules, NOW), "token_subject_missing");
        let claimed = rules.claimed(
            json!({"iss": "https://idp.example.com", "sub": "u-1", "oid": "o-1", "tid": "t",
                "email": "bob@example.com", "jti": "j-1", "uti": "u"})
            .as_object()
            .unwrap(),
        );
        assert_eq!(
            claimed,
            ClaimedIdentity {
                issuer: Some("https://idp.example.com".into()),
                tenant: None,
                subject: Some("u-1".into()),
                username: Some("bob@example.com".into()),
                token_id: Some("u".into()),
            }
        );
    }

    #[tokio::test]
    async fn overage_markers_and_the_consumer_tenant_are_refused() {
        let s = signers();
        let rules = rules(&oidc_config(None));
        let consumer = sign(
            &s,
            "ES256",
            "ec",
            &claims(json!({"tid": super::super::CONSUMER_TENANT})),
        );
        assert_eq!(code(&s, &consumer, &rules, NOW), "token_tenant_not_allowed");
        let kind = build(&oidc_config(None)).unwrap();
        for marker in [
            json!({"hasgroups": true}),
            json!({"_claim_names": {"groups": "src1"}}),
        ] {
            let token = sign(&s, "ES256", "ec", &claims(marker.clone()));
            let verified = rules.verify(&token, &s.keys, at(NOW)).unwrap();
            let refused = kind.complete(verified).await.unwrap_err();
            assert_eq!(refused.code(), "groups_overage_unresolved", "{marker}");
        }
        let plain = sign(&s, "ES256", "ec", &claims(json!({"groups": ["ops"]})));
        let verified = rules.verify(&plain, &s.keys, at(NOW)).unwrap();
        assert_eq!(kind.complete(verified).await.unwrap().groups, ["ops"]);
    }

    /// `n - s` for a P-256 signature's `s` (big-endian, 32 bytes).
    fn negate_s(s: &[u8]) -> Vec<u8> {
        let n = hex::decode("ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551").unwrap();
        let mut out = vec![0u8; 32];
        let mut borrow = 0i16;
        for i in (0..32).rev() {
            let mut d = i16::from(n[i]) - i16::from(s[i]) - borrow;
            borrow = if d < 0 {
                d += 256;
                1
            } else {
                0
            };
            out[i] = d as u8;
        }
        out
    }

    #[test]
    fn a_rewritten_ecdsa_signature_is_the_same_token_for_the_replay_guard() {
        let s = signers();
        let rules = rules(&oidc_config(None));
        // No jti: the replay guard keys on the token itself.
        let token = sign(&s, "ES256", "ec", &claims(json!({})));
        let (input, signature) = token.rsplit_once('.').unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let flipped = negate_s(&raw[32..]);
        raw[32..].copy_from_slice(&flipped);
        let twin = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&raw));
        assert_ne!(twin, token);
        let first = rules.verify(&token, &s.keys, at(NOW)).unwrap();
        let second = rules
            .verify(&twin, &s.keys, at(NOW))
            .expect("(r, n - s) verifies too");
        assert_eq!(first.token_id, None);
        assert_eq!(first.signed_sha256, second.signed_sha256);
        assert_eq!(first.replay_key(), second.replay_key());
    }

    #[test]
    fn a_configured_username_claim_is_required_and_email_must_be_verified() {
        let s = signers();
        let base = claims(json!({"email": "mallory@example.com", "upn": "m@example.com"}));
        // Configured and missing: refused, no falling back to another claim.
        let preferred = rules(&oidc_config(Some("preferred_username")));
        assert_eq!(
            code(&s, &sign(&s, "ES256", "ec", &base), &preferred, NOW),
            "token_username_missing"
        );
        let email = rules(&oidc_config(Some("email")));
        assert_eq!(
            code(&s, &sign(&s, "ES256", "ec", &base), &email, NOW),
            "token_username_missing"
        );
        let mut verified_email = base.clone();
        verified_email["email_verified"] = json!(true);
        let v = email
            .verify(&sign(&s, "ES256", "ec", &verified_email), &s.keys, at(NOW))
            .unwrap();
        assert_eq!(v.username, "mallory@example.com");
        // Not configured: the documented order; an unverified email is skipped.
        let default = rules(&oidc_config(None));
        let only_email = claims(json!({"email": "mallory@example.com"}));
        let v = default
            .verify(&sign(&s, "ES256", "ec", &only_email), &s.keys, at(NOW))
            .unwrap();
        assert_eq!(v.username, "u-1", "an unverified email is not a name");
        let v = default
            .verify(&sign(&s, "ES256", "ec", &base), &s.keys, at(NOW))
            .unwrap();
        assert_eq!(v.username, "m@example.com");
    }

    #[test]
    fn entra_settings_on_an_oidc_issuer_are_refused() {
        let mut config = oidc_config(None);
        config.allowed_tenants = vec!["t".into()];
        assert!(accepted_issuers(&config).unwrap_err().contains("kind: entra"));
        let mut template = oidc_config(None);
        template.additional_issuers = vec!["https://login.microsoftonline.com/{tenantid}/v2.0".into()];
        assert!(accepted_issuers(&template).unwrap_err().contains("multi-tenant"));
    }

    #[test]
    fn an_rfc_9068_client_credentials_token_is_an_application() {
        let s = signers();
        let mut config = oidc_config(Some("email"));
        config.clients = vec!["talos-sso-cli".into()];
        let rules = rules(&config);
        for patch in [
            json!({"sub": "collector", "client_id": "collector"}),
            json!({"sub": null, "client_id": "collector"}),
        ] {
            let token = sign(&s, "ES256", "ec", &claims(patch));
            let verified = rules.verify(&token, &s.keys, at(NOW)).unwrap();
            assert_eq!(verified.application.as_deref(), Some("collector"));
            assert_eq!(
                (verified.subject.as_str(), verified.username.as_str()),
                ("collector", "collector"),
                "no username claim is needed"
            );
        }
        // A person's token through a client names the person in `sub`.
        let person = sign(
            &s,
            "ES256",
            "ec",
            &claims(json!({"client_id": "collector", "email": "bob@example.com", "email_verified": true})),
        );
        let verified = rules.verify(&person, &s.keys, at(NOW)).unwrap();
        assert_eq!((verified.application, verified.subject.as_str()), (None, "u-1"));
        let delegated = sign(
            &s,
            "ES256",
            "ec",
            &claims(json!({"azp": "another-app", "email": "b@x", "email_verified": true})),
        );
        assert_eq!(code(&s, &delegated, &rules, NOW), "token_client_invalid");
    }
}
