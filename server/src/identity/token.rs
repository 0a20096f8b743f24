//! Verifying a bearer token (a JWS-signed JWT) and reading who it is about.
//!
//! Pure: keys, rules and the clock are parameters. The signature math is
//! ring's; this module does the parts a JWT library would otherwise do,
//! because nearly every check here is provider-specific anyway (Entra's v1
//! and v2 issuers, `{tenantid}` templates, `tid` allowlists, `azp`/`appid`):
//!
//! 1. compact form, base64url, JSON; `crit` headers refused;
//! 2. `alg` in the allowlist (RS256, ES256, EdDSA: never `none`, never HMAC),
//!    and equal to the only algorithm the `kid`'s key can verify;
//! 3. the signature;
//! 4. `exp` and `nbf` with leeway, `iat` not in the future;
//! 5. `iss` exactly one of the accepted issuers, where `{tenantid}` is
//!    replaced by the token's `tid` only when that tenant is allowed;
//! 6. `aud` among the accepted audiences; `azp`/`appid`, when present, equal
//!    to the CLI's client id;
//! 7. `tid` in the allowlist (Entra); the consumer tenant only when listed.
//!
//! Each failure has a stable code ([`TokenError::code`]).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature;
use serde_json::{Map, Value};
use time::OffsetDateTime;

use super::jwks::{KeySet, VerifyingKey};

/// Entra's tenant for personal Microsoft accounts.
pub const CONSUMER_TENANT: &str = "9188040d-6c67-4c5b-b112-36a304b66dad";

/// Algorithms accepted in a token header.
pub const ALLOWED_ALGORITHMS: [&str; 3] = ["RS256", "ES256", "EdDSA"];

/// Largest token accepted (Entra tokens with many claims are a few KiB).
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// What a token must satisfy, from the server's configuration.
#[derive(Debug, Clone)]
pub struct TokenRules {
    /// Accepted `iss` values; `{tenantid}` stands for the token's `tid`.
    pub issuers: Vec<String>,
    /// Accepted `aud` values (the CLI's client id for ID tokens, the server's
    /// API for access tokens).
    pub audiences: Vec<String>,
    /// When set, `azp` / `appid` must equal it where present.
    pub client_id: Option<String>,
    /// Entra tenants allowed. Non-empty means Entra mode: `tid` is required,
    /// and identity is (`tid`, `oid`).
    pub allowed_tenants: Vec<String>,
    /// Leeway on `exp`, `nbf` and `iat`.
    pub leeway: Duration,
    /// The claim that names the person. When set, a token without it is
    /// refused. When not set: `preferred_username`, `upn`, `unique_name`,
    /// a verified `email`, then the subject. `email` counts only with
    /// `email_verified: true`.
    pub username_claim: Option<String>,
}

impl TokenRules {
    fn entra(&self) -> bool {
        !self.allowed_tenants.is_empty()
    }
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
    pub fn code(&self) -> &'static str {
        match self {
            TokenError::Malformed(_) => "token_malformed",
            TokenError::AlgorithmNotAllowed(_) => "token_algorithm_not_allowed",
            TokenError::KeyUnknown(_) => "token_key_unknown",
            TokenError::BadSignature => "token_signature_invalid",
            TokenError::Expired => "token_expired",
            TokenError::NotYetValid => "token_not_yet_valid",
            TokenError::IssuedInFuture => "token_issued_in_future",
            TokenError::WrongIssuer(_) => "token_issuer_invalid",
            TokenError::WrongAudience => "token_audience_invalid",
            TokenError::WrongClient => "token_client_invalid",
            TokenError::TenantMissing => "token_tenant_missing",
            TokenError::TenantNotAllowed(_) => "token_tenant_not_allowed",
            TokenError::SubjectMissing(_) => "token_subject_missing",
            TokenError::UsernameMissing(_) => "token_username_missing",
        }
    }
}

/// A token that passed every check, and what it says.
#[derive(Debug, Clone)]
pub struct VerifiedToken {
    pub issuer: String,
    /// Entra tenant, when in Entra mode.
    pub tenant: Option<String>,
    /// Stable subject: `oid` (Entra) or `sub`.
    pub subject: String,
    pub username: String,
    pub groups: Vec<String>,
    pub app_roles: Vec<String>,
    /// `_claim_names.groups` or `hasgroups`: groups must come from Graph.
    pub groups_overage: bool,
    /// `uti` (Entra) or `jti`, for the replay guard.
    pub token_id: Option<String>,
    /// Hex SHA-256 of what the signature covers (header and payload): the
    /// replay key of a token without `uti`/`jti`. Not of the whole token:
    /// an ECDSA signature can be rewritten into another valid one, so the
    /// same token has more than one encoding.
    pub signed_sha256: String,
    pub issued_at: Option<OffsetDateTime>,
    pub expires_at: OffsetDateTime,
    /// Every claim, for policy `claims` selectors and the audit trail.
    pub claims: Map<String, Value>,
}

impl VerifiedToken {
    /// The key the replay guard claims: `uti`/`jti` (hashed when too long
    /// to be a key), else a hash of what the token's signature covers
    /// ([`VerifiedToken::signed_sha256`]).
    pub fn replay_key(&self) -> String {
        match &self.token_id {
            Some(id) if id.len() <= 128 && !id.starts_with("sha256:") => id.clone(),
            Some(id) => format!(
                "sha256:{}",
                hex::encode(ring::digest::digest(&ring::digest::SHA256, id.as_bytes()))
            ),
            None => format!("sha256:{}", self.signed_sha256),
        }
    }
}

/// The claims of a token whose signature was *not* checked, for recording
/// who a refused token claimed to be. Never use it to authorize anything.
pub fn unverified_claims(token: &str) -> Option<Map<String, Value>> {
    if token.len() > MAX_TOKEN_LEN {
        return None;
    }
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn decode_json(part: &str, what: &'static str) -> Result<Map<String, Value>, TokenError> {
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
fn time_claim(claims: &Map<String, Value>, name: &'static str) -> Result<Option<i64>, TokenError> {
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

fn string_claim<'a>(claims: &'a Map<String, Value>, name: &str) -> Option<&'a str> {
    claims.get(name).and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn string_list(claims: &Map<String, Value>, name: &str) -> Vec<String> {
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

/// Verify `token` with `keys` under `rules` at `now`.
pub fn verify(
    token: &str,
    keys: &KeySet,
    rules: &TokenRules,
    now: OffsetDateTime,
) -> Result<VerifiedToken, TokenError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(TokenError::Malformed("token too large"));
    }
    let mut parts = token.split('.');
    let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed("expected three dot-separated parts"));
    };
    let header = decode_json(header_b64, "header")?;
    let alg = header.get("alg").and_then(Value::as_str).unwrap_or("none");
    if !ALLOWED_ALGORITHMS.contains(&alg) {
        return Err(TokenError::AlgorithmNotAllowed(alg.chars().take(16).collect()));
    }
    if header.contains_key("crit") {
        return Err(TokenError::Malformed(
            "critical header extensions are not supported",
        ));
    }
    let kid = header
        .get("kid")
        .and_then(Value::as_str)
        .ok_or(TokenError::Malformed("no kid in header"))?;
    let key = keys
        .get(kid)
        .ok_or_else(|| TokenError::KeyUnknown(kid.chars().take(128).collect()))?;
    if key.algorithm() != alg {
        return Err(TokenError::AlgorithmNotAllowed(format!(
            "{alg} with a {} key",
            key.algorithm()
        )));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| TokenError::Malformed("signature"))?;
    let signed = &token[..header_b64.len() + 1 + payload_b64.len()];
    let valid = match key {
        VerifyingKey::Rsa { n, e } => signature::RsaPublicKeyComponents { n, e }
            .verify(
                &signature::RSA_PKCS1_2048_8192_SHA256,
                signed.as_bytes(),
                &signature,
            )
            .is_ok(),
        VerifyingKey::EcP256 { point } => {
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(signed.as_bytes(), &signature)
                .is_ok()
        }
        VerifyingKey::Ed25519 { x } => signature::UnparsedPublicKey::new(&signature::ED25519, x)
            .verify(signed.as_bytes(), &signature)
            .is_ok(),
    };
    if !valid {
        return Err(TokenError::BadSignature);
    }

    let claims = decode_json(payload_b64, "payload")?;
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

    let tenant = string_claim(&claims, "tid");
    let issuer = string_claim(&claims, "iss").ok_or(TokenError::Malformed("no iss"))?;
    let tenant_allowed = |tid: &str| rules.allowed_tenants.iter().any(|t| t.eq_ignore_ascii_case(tid));
    let issuer_ok = rules.issuers.iter().any(|accepted| {
        if accepted.contains("{tenantid}") {
            tenant.is_some_and(|tid| tenant_allowed(tid) && accepted.replace("{tenantid}", tid) == issuer)
        } else {
            accepted == issuer
        }
    });
    if !issuer_ok {
        return Err(TokenError::WrongIssuer(issuer.chars().take(200).collect()));
    }
    let audiences = string_list(&claims, "aud");
    if !audiences.iter().any(|aud| rules.audiences.contains(aud)) {
        return Err(TokenError::WrongAudience);
    }
    if let Some(client_id) = &rules.client_id {
        for name in ["azp", "appid"] {
            if string_claim(&claims, name).is_some_and(|v| v != client_id) {
                return Err(TokenError::WrongClient);
            }
        }
    }
    if rules.entra() {
        let tid = tenant.ok_or(TokenError::TenantMissing)?;
        if !tenant_allowed(tid) {
            return Err(TokenError::TenantNotAllowed(tid.chars().take(64).collect()));
        }
    }
    if let Some(tid) = tenant
        && tid.eq_ignore_ascii_case(CONSUMER_TENANT)
        && !tenant_allowed(tid)
    {
        return Err(TokenError::TenantNotAllowed(tid.to_owned()));
    }

    let subject = if rules.entra() {
        string_claim(&claims, "oid").ok_or(TokenError::SubjectMissing("oid"))?
    } else {
        string_claim(&claims, "sub").ok_or(TokenError::SubjectMissing("sub"))?
    }
    .to_owned();
    let usable = |name: &str| {
        let email_ok = name != "email" || claims.get("email_verified").and_then(Value::as_bool) == Some(true);
        string_claim(&claims, name).filter(|_| email_ok)
    };
    let username = match &rules.username_claim {
        Some(name) => usable(name)
            .ok_or_else(|| TokenError::UsernameMissing(name.chars().take(64).collect()))?
            .to_owned(),
        None => ["preferred_username", "upn", "unique_name", "email"]
            .iter()
            .find_map(|name| usable(name))
            .unwrap_or(&subject)
            .to_owned(),
    };
    let groups_overage = claims.get("_claim_names").and_then(|c| c.get("groups")).is_some()
        || claims.get("hasgroups").and_then(Value::as_bool).unwrap_or(false);
    Ok(VerifiedToken {
        issuer: issuer.to_owned(),
        tenant: tenant.filter(|_| rules.entra()).map(str::to_owned),
        subject,
        username,
        groups: string_list(&claims, "groups"),
        app_roles: string_list(&claims, "roles"),
        groups_overage,
        token_id: string_claim(&claims, "uti")
            .or_else(|| string_claim(&claims, "jti"))
            .map(str::to_owned),
        signed_sha256: hex::encode(ring::digest::digest(&ring::digest::SHA256, signed.as_bytes())),
        issued_at: iat.and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok()),
        expires_at: OffsetDateTime::from_unix_timestamp(exp).unwrap_or(OffsetDateTime::UNIX_EPOCH),
        claims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
    use serde_json::json;

    const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    const CLI: &str = "11111111-2222-3333-4444-555555555555";
    const NOW: i64 = 1_800_000_000;

    struct Signers {
        rsa: RsaKeyPair,
        ec: EcdsaKeyPair,
        ed: Ed25519KeyPair,
        keys: KeySet,
    }

    fn signers() -> Signers {
        let rng = SystemRandom::new();
        let pem = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/openssl/rsa-ca.key"
        ))
        .unwrap();
        let der = crate::x509::pem_blocks(&pem).unwrap().remove(0).1;
        let rsa = RsaKeyPair::from_der(&der).unwrap();
        let ec_pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let ec = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            ec_pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        let ed = Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
        let mut keys = KeySet::default();
        keys.insert(
            "rsa",
            VerifyingKey::Rsa {
                n: rsa.public_modulus_bytes(),
                e: rsa.public_exponent_bytes(),
            },
        );
        keys.insert(
            "ec",
            VerifyingKey::EcP256 {
                point: ec.public_key().as_ref().to_vec(),
            },
        );
        keys.insert(
            "ed",
            VerifyingKey::Ed25519 {
                x: ed.public_key().as_ref().to_vec(),
            },
        );
        Signers { rsa, ec, ed, keys }
    }

    trait PublicParts {
        fn public_modulus_bytes(&self) -> Vec<u8>;
        fn public_exponent_bytes(&self) -> Vec<u8>;
    }

    impl PublicParts for RsaKeyPair {
        fn public_modulus_bytes(&self) -> Vec<u8> {
            let components: signature::RsaPublicKeyComponents<Vec<u8>> = self.public().into();
            components.n
        }
        fn public_exponent_bytes(&self) -> Vec<u8> {
            let components: signature::RsaPublicKeyComponents<Vec<u8>> = self.public().into();
            components.e
        }
    }

    fn rules() -> TokenRules {
        TokenRules {
            issuers: vec![
                "https://login.microsoftonline.com/{tenantid}/v2.0".into(),
                format!("https://sts.windows.net/{TENANT}/"),
            ],
            audiences: vec![CLI.into()],
            client_id: Some(CLI.into()),
            allowed_tenants: vec![TENANT.into()],
            leeway: Duration::from_secs(300),
            username_claim: None,
        }
    }

    fn entra_claims() -> Value {
        json!({
            "aud": CLI, "iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
            "iat": NOW - 300, "nbf": NOW - 300, "exp": NOW - 300 + 3900,
            "tid": TENANT, "oid": "00000000-0000-0000-0000-0000000000a1", "sub": "pairwise-sub",
            "preferred_username": "alice@example.com", "name": "Alice",
            "groups": ["g1", "g2"], "roles": ["Talos.Reader"], "uti": "uti-1", "ver": "2.0", "nonce": "n"
        })
    }

    fn sign(s: &Signers, alg: &str, kid: &str, claims: &Value) -> String {
        let header = URL_SAFE_NO_PAD.encode(json!({"typ": "JWT", "alg": alg, "kid": kid}).to_string());
        let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
        let input = format!("{header}.{payload}");
        let rng = SystemRandom::new();
        let sig = match kid {
            "rsa" => {
                let mut out = vec![0; s.rsa.public().modulus_len()];
                s.rsa
                    .sign(&signature::RSA_PKCS1_SHA256, &rng, input.as_bytes(), &mut out)
                    .unwrap();
                out
            }
            "ec" => s.ec.sign(&rng, input.as_bytes()).unwrap().as_ref().to_vec(),
            _ => s.ed.sign(input.as_bytes()).as_ref().to_vec(),
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
    }

    /// Rules for a generic OpenID provider (not Entra).
    fn generic_rules(username_claim: Option<&str>) -> TokenRules {
        TokenRules {
            issuers: vec!["https://idp.example.com".into()],
            audiences: vec!["talos-sso".into()],
            client_id: None,
            allowed_tenants: vec![],
            leeway: Duration::from_secs(300),
            username_claim: username_claim.map(str::to_owned),
        }
    }

    fn at(seconds: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(seconds).unwrap()
    }

    fn code(s: &Signers, token: &str, rules: &TokenRules, now: i64) -> &'static str {
        match verify(token, &s.keys, rules, at(now)) {
            Ok(_) => "ok",
            Err(e) => e.code(),
        }
    }

    #[test]
    fn a_good_entra_token_yields_its_identity() {
        let s = signers();
        for (alg, kid) in [("RS256", "rsa"), ("ES256", "ec"), ("EdDSA", "ed")] {
            let token = sign(&s, alg, kid, &entra_claims());
            let verified = verify(&token, &s.keys, &rules(), at(NOW)).unwrap();
            assert_eq!(verified.subject, "00000000-0000-0000-0000-0000000000a1");
            assert_eq!(verified.tenant.as_deref(), Some(TENANT));
            assert_eq!(verified.username, "alice@example.com");
            assert_eq!(verified.groups, ["g1", "g2"]);
            assert_eq!(verified.app_roles, ["Talos.Reader"]);
            assert_eq!(verified.token_id.as_deref(), Some("uti-1"));
            assert!(!verified.groups_overage);
        }
    }

    #[test]
    fn every_bad_token_gets_its_own_code() {
        let s = signers();
        let r = rules();
        let with = |patch: Value| {
            let mut claims = entra_claims();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    claims.as_object_mut().unwrap().remove(k);
                } else {
                    claims[k] = v.clone();
                }
            }
            sign(&s, "RS256", "rsa", &claims)
        };
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
        // Issuer: exact, v1 and v2 forms, template only for an allowed tenant.
        assert_eq!(
            code(
                &s,
                &with(json!({"iss": format!("https://sts.windows.net/{TENANT}/"), "ver": "1.0"})),
                &r,
                NOW
            ),
            "ok"
        );
        assert_eq!(
            code(
                &s,
                &with(json!({"iss": format!("https://sts.windows.net/{TENANT}")})),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        assert_eq!(
            code(
                &s,
                &with(json!({"iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0/")})),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        assert_eq!(
            code(
                &s,
                &with(json!({"iss": format!("https://login.microsoftonline.com/{TENANT}/")})),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        let other_tenant = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{other_tenant}/v2.0"), "tid": other_tenant})
                ),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0"), "tid": other_tenant})
                ),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
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
        // Tenant: missing (the v1 issuer needs no template), foreign, consumer.
        let v1 = format!("https://sts.windows.net/{TENANT}/");
        assert_eq!(
            code(&s, &with(json!({"iss": v1, "tid": null})), &r, NOW),
            "token_tenant_missing"
        );
        let mut consumer_rules = r.clone();
        consumer_rules.issuers.push(format!(
            "https://login.microsoftonline.com/{CONSUMER_TENANT}/v2.0"
        ));
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{CONSUMER_TENANT}/v2.0"), "tid": CONSUMER_TENANT})
                ),
                &consumer_rules,
                NOW
            ),
            "token_tenant_not_allowed"
        );
        assert_eq!(
            code(&s, &with(json!({"oid": null})), &r, NOW),
            "token_subject_missing"
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
    fn generic_oidc_uses_iss_and_sub_and_overage_is_detected() {
        let s = signers();
        let rules = generic_rules(Some("email"));
        let claims = json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60, "email": "bob@example.com", "email_verified": true, "jti": "j-1"});
        let verified = verify(&sign(&s, "ES256", "ec", &claims), &s.keys, &rules, at(NOW)).unwrap();
        assert_eq!(
            (verified.subject.as_str(), verified.username.as_str()),
            ("u-1", "bob@example.com")
        );
        assert_eq!(verified.tenant, None);
        assert_eq!(verified.token_id.as_deref(), Some("j-1"));

        let mut overage = entra_claims();
        overage.as_object_mut().unwrap().remove("groups");
        overage["_claim_names"] = json!({"groups": "src1"});
        overage["_claim_sources"] =
            json!({"src1": {"endpoint": "https://graph.windows.net/x/users/y/getMemberObjects"}});
        let verified = verify(
            &sign(&s, "RS256", "rsa", &overage),
            &s.keys,
            &self::rules(),
            at(NOW),
        )
        .unwrap();
        assert!(verified.groups_overage && verified.groups.is_empty());
        let unverified = unverified_claims(&sign(&s, "RS256", "rsa", &overage)).unwrap();
        assert_eq!(unverified["oid"], "00000000-0000-0000-0000-0000000000a1");
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
    fn token_times_outside_what_the_stores_keep_are_refused() {
        let s = signers();
        let rules = generic_rules(None);
        for (name, value) in [
            ("iat", json!(-40_000_000_000i64)),
            ("exp", json!(300_000_000_000i64)),
            ("nbf", json!(-1)),
        ] {
            let mut claims =
                json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60});
            claims[name] = value;
            assert_eq!(
                code(&s, &sign(&s, "ES256", "ec", &claims), &rules, NOW),
                "token_malformed",
                "{name}"
            );
        }
    }

    #[test]
    fn the_replay_key_of_a_token_without_an_id_is_what_its_signature_covers() {
        let verified = VerifiedToken {
            issuer: "i".into(),
            tenant: None,
            subject: "s".into(),
            username: "u".into(),
            groups: vec![],
            app_roles: vec![],
            groups_overage: false,
            token_id: None,
            signed_sha256: "ab".repeat(32),
            issued_at: None,
            expires_at: OffsetDateTime::UNIX_EPOCH,
            claims: Default::default(),
        };
        assert_eq!(verified.replay_key(), format!("sha256:{}", "ab".repeat(32)));
        let with_id = VerifiedToken {
            token_id: Some("uti-1".into()),
            ..verified
        };
        assert_eq!(with_id.replay_key(), "uti-1");
        let long = VerifiedToken {
            token_id: Some("j".repeat(5000)),
            ..with_id
        };
        assert!(long.replay_key().starts_with("sha256:") && long.replay_key().len() == 71);
    }

    #[test]
    fn a_rewritten_ecdsa_signature_is_the_same_token_for_the_replay_guard() {
        let s = signers();
        let rules = generic_rules(None);
        // No jti: the replay guard keys on the token itself.
        let claims =
            json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60});
        let token = sign(&s, "ES256", "ec", &claims);
        let (input, signature) = token.rsplit_once('.').unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(signature).unwrap();
        let flipped = negate_s(&raw[32..]);
        raw[32..].copy_from_slice(&flipped);
        let twin = format!("{input}.{}", URL_SAFE_NO_PAD.encode(&raw));
        assert_ne!(twin, token);
        let first = verify(&token, &s.keys, &rules, at(NOW)).unwrap();
        let second = verify(&twin, &s.keys, &rules, at(NOW)).expect("(r, n - s) verifies too");
        assert_eq!(first.token_id, None);
        assert_eq!(first.signed_sha256, second.signed_sha256);
    }

    #[test]
    fn a_configured_username_claim_is_required_and_email_must_be_verified() {
        let s = signers();
        let mut rules = generic_rules(Some("preferred_username"));
        let base = json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60,
            "email": "mallory@example.com", "upn": "m@example.com"});
        // Configured and missing: refused, no falling back to another claim.
        assert_eq!(
            code(&s, &sign(&s, "ES256", "ec", &base), &rules, NOW),
            "token_username_missing"
        );
        rules.username_claim = Some("email".into());
        assert_eq!(
            code(&s, &sign(&s, "ES256", "ec", &base), &rules, NOW),
            "token_username_missing"
        );
        let mut verified_email = base.clone();
        verified_email["email_verified"] = json!(true);
        let v = verify(
            &sign(&s, "ES256", "ec", &verified_email),
            &s.keys,
            &rules,
            at(NOW),
        )
        .unwrap();
        assert_eq!(v.username, "mallory@example.com");
        // Not configured: the documented order; an unverified email is skipped.
        rules.username_claim = None;
        let only_email = json!({"iss": "https://idp.example.com", "aud": "talos-sso", "sub": "u-1", "exp": NOW + 60,
            "email": "mallory@example.com"});
        let v = verify(&sign(&s, "ES256", "ec", &only_email), &s.keys, &rules, at(NOW)).unwrap();
        assert_eq!(v.username, "u-1", "an unverified email is not a name");
        let v = verify(&sign(&s, "ES256", "ec", &base), &s.keys, &rules, at(NOW)).unwrap();
        assert_eq!(v.username, "m@example.com");
    }
}
