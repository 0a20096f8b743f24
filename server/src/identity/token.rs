//! Verifying a bearer token (a JWS-signed JWT): the checks every issuer
//! shares. Pure: keys, rules and the clock are parameters. The signature
//! math is ring's; this module does the parts a JWT library would otherwise
//! do, and leaves to the issuer's kind (`identity::issuer`) what differs
//! between issuers: which `iss` values it accepts, tenants, and which
//! claims name the subject.
//!
//! 1. compact form, base64url, JSON; `crit` headers refused;
//! 2. `alg` in the allowlist (RS256, ES256, EdDSA: never `none`, never HMAC),
//!    and equal to the only algorithm the `kid`'s key can verify;
//! 3. the signature;
//! 4. `exp` and `nbf` with leeway, `iat` not in the future;
//! 5. `iss` accepted by the issuer (its kind decides);
//! 6. `aud` among the accepted audiences; `azp`/`appid`, when present, equal
//!    to the CLI's client id, except in an application's own token (client
//!    credentials: the issuer's kind tells), where they name that
//!    application, which `auditors`/`admins` then judge.
//!
//! Each failure has a stable code ([`TokenError::code`]), the kinds' own
//! refusals included.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use serde_json::{Map, Value};
use talos_sso_api::ErrorCode;
use time::OffsetDateTime;

use super::jwks::{KeySet, VerifyingKey};

/// Algorithms accepted in a token header.
pub const ALLOWED_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// Largest token accepted (Entra tokens with many claims are a few KiB).
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// A token's claims.
pub type ClaimSet = Map<String, Value>;

/// What every token of an issuer must satisfy, whatever its kind.
#[derive(Debug, Clone)]
pub struct TokenRules {
    /// Accepted `aud` values (the CLI's client id for ID tokens, the server's
    /// API for access tokens).
    pub audiences: Vec<String>,
    /// When not empty, `azp` / `appid` must equal one of these where
    /// present.
    pub clients: Vec<String>,
    /// Leeway on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a well-formed JWT: {0}")]
    Malformed(&'static str),
    #[error("token algorithm `{0}` is not allowed")]
    AlgorithmNotAllowed(String),
    #[error("no key `{0}` in the identity provider's key set")]
    KeyUnknown(String),
    #[error("the token signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token was issued in the future; check the clocks")]
    IssuedInFuture,
    #[error("the token's issuer `{0}` is not accepted")]
    WrongIssuer(String),
    #[error("the server trusts no issuer `{0}`")]
    IssuerUntrusted(String),
    #[error("the token is not meant for this server (audience)")]
    WrongAudience,
    #[error("the token was issued to another client (azp/appid)")]
    WrongClient,
    #[error("the token has no tenant (tid)")]
    TenantMissing,
    #[error("tenant `{0}` is not allowed")]
    TenantNotAllowed(String),
    #[error("the token names no subject ({0})")]
    SubjectMissing(&'static str),
    #[error(
        "the token has no usable `{0}` claim, which the server takes the username from \
         (an `email` counts only with `email_verified: true`)"
    )]
    UsernameMissing(String),
}

impl TokenError {
    /// The API code of this refusal; times are the server's clock at `now`.
    pub fn error_code(&self, now: OffsetDateTime) -> ErrorCode {
        let server_time = || talos_sso_api::audit::format_micros(now);
        match self {
            TokenError::Malformed(_) => ErrorCode::TokenMalformed,
            TokenError::AlgorithmNotAllowed(_) => ErrorCode::TokenAlgorithmNotAllowed,
            TokenError::KeyUnknown(_) => ErrorCode::TokenKeyUnknown,
            TokenError::BadSignature => ErrorCode::TokenSignatureInvalid,
            TokenError::Expired => ErrorCode::TokenExpired {
                server_time: server_time(),
            },
            TokenError::NotYetValid => ErrorCode::TokenNotYetValid {
                server_time: server_time(),
            },
            TokenError::IssuedInFuture => ErrorCode::TokenIssuedInFuture {
                server_time: server_time(),
            },
            TokenError::WrongIssuer(_) => ErrorCode::TokenIssuerInvalid,
            TokenError::IssuerUntrusted(_) => ErrorCode::TokenIssuerUntrusted,
            TokenError::WrongAudience => ErrorCode::TokenAudienceInvalid,
            TokenError::WrongClient => ErrorCode::TokenClientInvalid,
            TokenError::TenantMissing => ErrorCode::TokenTenantMissing,
            TokenError::TenantNotAllowed(_) => ErrorCode::TokenTenantNotAllowed,
            TokenError::SubjectMissing(_) => ErrorCode::TokenSubjectMissing,
            TokenError::UsernameMissing(_) => ErrorCode::TokenUsernameMissing,
        }
    }

    /// The stable code (the time in some codes' fields aside, which it
    /// does not depend on).
    pub fn code(&self) -> &'static str {
        self.error_code(OffsetDateTime::UNIX_EPOCH).code()
    }
}

/// A token whose signature and shared checks passed: what its issuer's
/// kind reads the person from.
#[derive(Debug, Clone)]
pub struct SignedToken {
    /// The token's `iss`.
    pub issuer: String,
    /// Hex SHA-256 of what the signature covers (header and payload). Not
    /// of the whole token: an ECDSA signature can be rewritten into another
    /// valid one, so the same token has more than one encoding.
    pub signed_sha256: String,
    pub issued_at: Option<OffsetDateTime>,
    pub expires_at: OffsetDateTime,
    pub claims: ClaimSet,
}

/// The claims of a token whose signature was *not* checked, for recording
/// who a refused token claimed to be. Never use it to authorize anything.
pub fn unverified_claims(token: &str) -> Option<ClaimSet> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn decode_json(part: &str, what: &'static str) -> Result<ClaimSet, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed(what))?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed(what))
}

/// Latest time a token may name: the end of year 9999, the last instant
/// that every store and the audit encoding can represent.
const LATEST_TOKEN_TIME: i64 = 253_402_300_799;

/// A time claim in seconds since 1970, refused outside 1970..=9999 (a time
/// the stores cannot keep would make its audit record unreadable).
fn time_claim(claims: &ClaimSet, name: &'static str) -> Result<Option<i64>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.is_finite()).map(|f| f as i64))
            .filter(|t| (0..=LATEST_TOKEN_TIME).contains(t))
            .map(Some)
            .ok_or(TokenError::Malformed("time claim out of range")),
        Some(_) => Err(TokenError::Malformed("time claim is not a number")),
    }
}

/// A non-empty string claim.
pub fn string_claim<'a>(claims: &'a ClaimSet, name: &str) -> Option<&'a str> {
    claims.get(name).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// A claim holding a list of strings (or one string).
pub fn string_list(claims: &ClaimSet, name: &str) -> Vec<String> {
    match claims.get(name) {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// A token taken apart, its header checked, nothing verified yet. Its
/// claims are readable before any key work, so that the token can be
/// routed to the issuer it names; an unreadable payload is refused only
/// after the signature, as before routing existed.
#[derive(Debug)]
pub struct Jwt<'a> {
    alg: &'static str,
    kid: String,
    /// Header and payload: what the signature covers.
    signed: &'a str,
    signature: &'a str,
    claims: Result<ClaimSet, TokenError>,
}

impl<'a> Jwt<'a> {
    /// Split `token` and check its header: compact form, `alg` allowed,
    /// no `crit`, a `kid`.
    pub fn parse(token: &'a str) -> Result<Self, TokenError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(TokenError::Malformed("token too large"));
        }
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("expected three dot-separated parts"));
        };
        let header = decode_json(header_b64, "header")?;
        let named = header.get("alg").and_then(Value::as_str).unwrap_or("none");
        let alg = ALLOWED_ALGORITHMS
            .into_iter()
            .find(|allowed| *allowed == named)
            .ok_or_else(|| TokenError::AlgorithmNotAllowed(named.chars().take(16).collect()))?;
        if header.contains_key("crit") {
            return Err(TokenError::Malformed(
                "critical header extensions are not supported",
            ));
        }
        let kid = header
            .get("kid")
            .and_then(Value::as_str)
            .ok_or(TokenError::Malformed("no kid in header"))?
            .to_owned();
        Ok(Self {
            alg,
            kid,
            signed: &token[..header_b64.len() + 1 + payload_b64.len()],
            signature,
            claims: decode_json(payload_b64, "payload"),
        })
    }

    /// The key the token says it is signed with.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The claims, *not verified*: for routing to an issuer only.
    pub fn unverified_claims(&self) -> Option<&ClaimSet> {
        self.claims.as_ref().ok()
    }

    /// Verify the signature with `keys` and the shared checks under
    /// `rules` at `now`; `accepts_issuer` is the issuer's kind deciding on
    /// `iss` (given the other claims, for tenant templates), and
    /// `application_token` whether the token is an application's own
    /// (app-only), whose `azp`/`appid` names that application.
    pub fn verify(
        self,
        keys: &KeySet,
        rules: &TokenRules,
        accepts_issuer: &dyn Fn(&str, &ClaimSet) -> bool,
        application_token: &dyn Fn(&ClaimSet) -> bool,
        now: OffsetDateTime,
    ) -> Result<SignedToken, TokenError> {
        let key = keys
            .get(&self.kid)
            .ok_or_else(|| TokenError::KeyUnknown(self.kid.chars().take(128).collect()))?;
        if key.algorithm() != self.alg {
            return Err(TokenError::AlgorithmNotAllowed(format!(
                "{} with a {} key",
                self.alg,
                key.algorithm()
            )));
        }
        let signature = URL_SAFE_NO_PAD
            .decode(self.signature)
            .map_err(|_| TokenError::Malformed("signature"))?;
        let signed = self.signed.as_bytes();
        let valid = match key {
            VerifyingKey::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, &signature)
                .is_ok(),
            VerifyingKey::EcP256 { point } => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed, &signature)
                    .is_ok()
            }
            VerifyingKey::Ed25519 { x } => signature::UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(signed, &signature)
                .is_ok(),
        };
        if !valid {
            return Err(TokenError::BadSignature);
        }

        let claims = self.claims?;
        let leeway = i64::try_from(rules.leeway.as_secs()).unwrap_or(i64::MAX);
        let now_s = now.unix_timestamp();
        let exp = time_claim(&claims, "exp")?.ok_or(TokenError::Malformed("no exp"))?;
        if now_s > exp.saturating_add(leeway) {
            return Err(TokenError::Expired);
        }
        if time_claim(&claims, "nbf")?.is_some_and(|nbf| now_s < nbf.saturating_sub(leeway)) {
            return Err(TokenError::NotYetValid);
        }
        let iat = time_claim(&claims, "iat")?;
        if iat.is_some_and(|iat| iat > now_s.saturating_add(leeway)) {
            return Err(TokenError::IssuedInFuture);
        }

        let issuer = string_claim(&claims, "iss").ok_or(TokenError::Malformed("no iss"))?;
        if !accepts_issuer(issuer, &claims) {
            return Err(TokenError::WrongIssuer(issuer.chars().take(200).collect()));
        }
        let audiences = string_list(&claims, "aud");
        if !audiences.iter().any(|aud| rules.audiences.contains(aud)) {
            return Err(TokenError::WrongAudience);
        }
        if !rules.clients.is_empty() && !application_token(&claims) {
            for name in ["azp", "appid"] {
                if string_claim(&claims, name).is_some_and(|v| !rules.clients.iter().any(|c| c == v)) {
                    return Err(TokenError::WrongClient);
                }
            }
        }
        Ok(SignedToken {
            issuer: issuer.to_owned(),
            signed_sha256: hex::encode(ring::digest::digest(&ring::digest::SHA256, signed)),
            issued_at: iat.and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok()),
            expires_at: OffsetDateTime::from_unix_timestamp(exp).unwrap_or(OffsetDateTime::UNIX_EPOCH),
            claims,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::testing::{
        CLI, NOW, Signers, TENANT, at, entra_claims, patched, sign, sign_payload, signers,
    };
    use serde_json::json;

    fn rules() -> TokenRules {
        TokenRules {
            audiences: vec![CLI.into()],
            clients: vec![CLI.into()],
            leeway: Duration::from_secs(300),
        }
    }

    fn no_application(_claims: &ClaimSet) -> bool {
        false
    }

    fn entra_issuer(iss: &str, _claims: &ClaimSet) -> bool {
        iss == format!("https://login.microsoftonline.com/{TENANT}/v2.0")
    }

    fn verify(
        token: &str,
        keys: &KeySet,
        rules: &TokenRules,
        now: OffsetDateTime,
    ) -> Result<SignedToken, TokenError> {
        Jwt::parse(token)?.verify(keys, rules, &entra_issuer, &no_application, now)
    }

    fn code(s: &Signers, token: &str, rules: &TokenRules, now: i64) -> &'static str {
        match verify(token, &s.keys, rules, at(now)) {
            Ok(_) => "ok",
            Err(e) => e.code(),
        }
    }

    #[test]
    fn a_good_token_is_verified_with_each_algorithm() {
        let s = signers();
        for (alg, kid) in [("RS256", "rsa"), ("ES256", "ec"), ("EdDSA", "ed")] {
            let token = sign(&s, alg, kid, &entra_claims());
            let signed = verify(&token, &s.keys, &rules(), at(NOW)).unwrap();
            assert_eq!(
                signed.issuer,
                format!("https://login.microsoftonline.com/{TENANT}/v2.0")
            );
            assert_eq!(signed.claims["oid"], "00000000-0000-0000-0000-0000000000a1");
            assert_eq!(signed.expires_at, at(NOW - 300 + 3900));
            assert_eq!(signed.issued_at, Some(at(NOW - 300)));
        }
    }

    #[test]
    fn every_bad_token_gets_its_own_code() {
        let s = signers();
        let r = rules();
        let with = |patch: Value| sign(&s, "RS256", "rsa", &patched(entra_claims(), patch));
        let good = with(json!({}));
        let (h, p, _) = {
            let mut it = good.split('.');
            (
                it.next().unwrap().to_owned(),
                it.next().unwrap().to_owned(),
                it.next().unwrap().to_owned(),
            )
        };
        // alg none, and HS256 "signed" with the RSA public key bytes.
        let none = format!("{}.{p}.", URL_SAFE_NO_PAD.encode(r#"{"alg":"none","kid":"rsa"}"#));
        assert_eq!(code(&s, &none, &r, NOW), "token_algorithm_not_allowed");
        let hs_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","kid":"rsa"}"#);
        let hs_key = s.rsa.public().as_ref().to_vec();
        let hs_sig = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &hs_key),
            format!("{hs_header}.{p}").as_bytes(),
        );
        let hs = format!("{hs_header}.{p}.{}", URL_SAFE_NO_PAD.encode(hs_sig.as_ref()));
        assert_eq!(code(&s, &hs, &r, NOW), "token_algorithm_not_allowed");
        // RS256 header on the Ed25519 key.
        assert_eq!(
            code(&s, &sign(&s, "RS256", "ed", &entra_claims()), &r, NOW),
            "token_algorithm_not_allowed"
        );
        // Wrong signature: the payload changed after signing.
        let forged_payload = URL_SAFE_NO_PAD.encode(entra_claims().to_string().replace("alice", "mallory"));
        assert_eq!(
            code(
                &s,
                &format!("{h}.{forged_payload}.{}", good.rsplit('.').next().unwrap()),
                &r,
                NOW
            ),
            "token_signature_invalid"
        );
        // A kid the key set does not have: the caller refreshes the set and retries.
        assert_eq!(
            code(
                &s,
                &sign(&s, "EdDSA", "rotated-in-later", &entra_claims()),
                &r,
                NOW
            ),
            "token_key_unknown"
        );
        assert_eq!(
            verify(&good, &KeySet::default(), &r, at(NOW)).unwrap_err(),
            TokenError::KeyUnknown("rsa".into())
        );
        // Time: exp + leeway is the last valid second.
        let exp = NOW - 300 + 3900;
        assert_eq!(code(&s, &good, &r, exp + 300), "ok");
        assert_eq!(code(&s, &good, &r, exp + 301), "token_expired");
        assert_eq!(
            code(&s, &with(json!({"nbf": NOW + 301, "iat": NOW})), &r, NOW),
            "token_not_yet_valid"
        );
        assert_eq!(
            code(&s, &with(json!({"nbf": NOW + 300, "iat": NOW})), &r, NOW),
            "ok"
        );
        assert_eq!(
            code(&s, &with(json!({"iat": NOW + 301, "nbf": NOW})), &r, NOW),
            "token_issued_in_future"
        );
        assert_eq!(code(&s, &with(json!({"exp": null})), &r, NOW), "token_malformed");
        // Issuer: the kind's predicate decides; no `iss` is malformed.
        assert_eq!(
            code(&s, &with(json!({"iss": "https://elsewhere.example"})), &r, NOW),
            "token_issuer_invalid"
        );
        assert_eq!(code(&s, &with(json!({"iss": null})), &r, NOW), "token_malformed");
        // Audience and client.
        assert_eq!(
            code(&s, &with(json!({"aud": "api://someone-else"})), &r, NOW),
            "token_audience_invalid"
        );
        assert_eq!(code(&s, &with(json!({"aud": ["api://x", CLI]})), &r, NOW), "ok");
        assert_eq!(
            code(&s, &with(json!({"azp": "another-app"})), &r, NOW),
            "token_client_invalid"
        );
        assert_eq!(
            code(&s, &with(json!({"appid": "another-app"})), &r, NOW),
            "token_client_invalid"
        );
        assert_eq!(code(&s, &with(json!({"azp": CLI})), &r, NOW), "ok");
        // A second client of the same provider (the console's own).
        let mut two_clients = r.clone();
        two_clients.clients.push("the-console".into());
        assert_eq!(
            code(&s, &with(json!({"azp": "the-console"})), &two_clients, NOW),
            "ok"
        );
        assert_eq!(code(&s, &with(json!({"azp": CLI})), &two_clients, NOW), "ok");
        assert_eq!(
            code(&s, &with(json!({"azp": "another-app"})), &two_clients, NOW),
            "token_client_invalid"
        );
        let mut any_client = r.clone();
        any_client.clients.clear();
        assert_eq!(
            code(&s, &with(json!({"azp": "another-app"})), &any_client, NOW),
            "ok"
        );
        // Structure.
        assert_eq!(code(&s, "a.b", &r, NOW), "token_malformed");
        assert_eq!(code(&s, "a.b.c.d", &r, NOW), "token_malformed");
        assert_eq!(code(&s, &format!("{h}.{p}.!!!"), &r, NOW), "token_malformed");
        let crit = sign(&s, "RS256", "rsa", &entra_claims()).replacen(
            &h,
            &URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256","kid":"rsa","crit":["x"]}"#),
            1,
        );
        assert_eq!(code(&s, &crit, &r, NOW), "token_malformed");
    }

    #[test]
    fn claims_are_readable_before_key_work_and_a_bad_payload_is_refused_after_the_signature() {
        let s = signers();
        let good = sign(&s, "RS256", "rsa", &entra_claims());
        let jwt = Jwt::parse(&good).unwrap();
        assert_eq!(jwt.kid(), "rsa");
        assert_eq!(jwt.unverified_claims().unwrap()["tid"], TENANT);
        // A payload that is not JSON: nothing to route by; refused as
        // malformed once its signature is good, as a bad signature otherwise.
        let signed = sign_payload(&s, "EdDSA", "ed", "not json");
        let jwt = Jwt::parse(&signed).unwrap();
        assert!(jwt.unverified_claims().is_none());
        assert_eq!(
            jwt.verify(&s.keys, &rules(), &entra_issuer, &no_application, at(NOW))
                .unwrap_err(),
            TokenError::Malformed("payload")
        );
        let (input, _) = signed.rsplit_once('.').unwrap();
        let unsigned = format!("{input}.{}", URL_SAFE_NO_PAD.encode([0u8; 64]));
        assert_eq!(code(&s, &unsigned, &rules(), NOW), "token_signature_invalid");
    }

    #[test]
    fn token_times_outside_what_the_stores_keep_are_refused() {
        let s = signers();
        for (name, value) in [
            ("iat", json!(-40_000_000_000i64)),
            ("exp", json!(300_000_000_000i64)),
            ("nbf", json!(-1)),
        ] {
            let claims = patched(entra_claims(), json!({ name: value }));
            assert_eq!(
                code(&s, &sign(&s, "ES256", "ec", &claims), &rules(), NOW),
                "token_malformed",
                "{name}"
            );
        }
    }
}
