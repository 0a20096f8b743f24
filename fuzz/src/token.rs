//! `token` and `jwks`.
//!
//! `token` reads its input twice. As a bearer token: `Jwt::parse`, the
//! unverified claims, routing (`IssuerRules::accepts`) and the record of a
//! refused token (`IssuerRules::claimed`), for an OpenID Connect issuer and
//! an Entra issuer; and the whole verification, which must refuse every
//! token whose signature is not by the key its `kid` names. As a payload:
//! the harness signs it with its own Ed25519 key, so that the checks after
//! the signature (times, issuer, audience, client, the kind's subject,
//! tenant and username) run on arbitrary claims, and a signature changed
//! afterwards must be refused.
//!
//! `jwks`: `KeySet::from_json` keeps only keys it can verify with, each
//! shaped for its algorithm, and verifying with any of them never panics.

use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, Ed25519KeyPair, KeyPair};
use serde_json::Value;
use talos_sso_server::config::IssuerConfig;
use talos_sso_server::identity::issuer::IssuerRules;
use talos_sso_server::identity::jwks::{KeySet, VerifyingKey};
use talos_sso_server::identity::token::{Jwt, MAX_TOKEN_LEN, unverified_claims};
use talos_sso_text::clean_field;

const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT: &str = "11111111-2222-3333-4444-555555555555";
const KID: &str = "fuzz-ed";
const LEEWAY: Duration = Duration::from_secs(300);

struct Fixture {
    key: Ed25519KeyPair,
    keys: KeySet,
    /// (name, rules, claim naming the subject)
    issuers: Vec<(&'static str, IssuerRules, &'static str)>,
}

fn issuer_config(name: &str, kind: &str, issuer: &str, tenants: &[&str]) -> IssuerConfig {
    IssuerConfig {
        name: name.into(),
        kind: kind.into(),
        issuer: issuer.into(),
        discovery_url: None,
        additional_issuers: Vec::new(),
        audiences: vec![CLIENT.into(), "api://talos-sso".into()],
        clients: vec![CLIENT.into()],
        allowed_tenants: tenants.iter().map(|t| t.to_string()).collect(),
        username_claim: None,
        leeway: LEEWAY,
        entra_graph: None,
        ca_file: None,
        jwks_file: None,
        certificates_per_token: None,
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let key = Ed25519KeyPair::from_seed_unchecked(&[0x5a; 32]).unwrap_or_else(|e| panic!("key: {e}"));
        let mut keys = KeySet::default();
        keys.insert(
            KID,
            VerifyingKey::Ed25519 {
                x: key.public_key().as_ref().to_vec(),
            },
        );
        let rules = |config: IssuerConfig| IssuerRules::new(&config).unwrap_or_else(|e| panic!("rules: {e}"));
        let issuers = vec![
            (
                "oidc",
                rules(issuer_config("login", "oidc", "https://idp.example.com", &[])),
                "sub",
            ),
            (
                "entra",
                rules(issuer_config(
                    "entra",
                    "entra",
                    "https://login.microsoftonline.com/{tenantid}/v2.0",
                    &[TENANT],
                )),
                "oid",
            ),
        ];
        Fixture { key, keys, issuers }
    })
}

/// Whether `token`'s signature is our key's over its first two parts.
fn signed_by_fixture(token: &str) -> bool {
    let Some((signed, signature)) = token.rsplit_once('.') else {
        return false;
    };
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    signature::UnparsedPublicKey::new(&signature::ED25519, fixture().key.public_key().as_ref())
        .verify(signed.as_bytes(), &signature)
        .is_ok()
}

fn assert_cleaned(what: &str, value: &Option<String>) {
    if let Some(v) = value {
        assert_eq!(&clean_field(v), v, "claimed {what} is not cleaned");
    }
}

pub fn run_token(data: &[u8]) {
    let fixture = fixture();
    let now = crate::now();
    let token = String::from_utf8_lossy(data);

    // As a bearer token.
    let claims = unverified_claims(&token);
    if let Ok(jwt) = Jwt::parse(&token) {
        assert!(token.len() <= MAX_TOKEN_LEN);
        assert_eq!(
            token.split('.').count(),
            3,
            "parsed a token that is not three parts"
        );
        assert_eq!(
            jwt.unverified_claims(),
            claims.as_ref(),
            "routing and the refusal record read different claims"
        );
    }
    if let Some(claims) = &claims {
        for (_, rules, _) in &fixture.issuers {
            let _ = rules.accepts(claims);
            let claimed = rules.claimed(claims);
            for (what, value) in [
                ("issuer", &claimed.issuer),
                ("tenant", &claimed.tenant),
                ("subject", &claimed.subject),
                ("username", &claimed.username),
                ("token id", &claimed.token_id),
            ] {
                assert_cleaned(what, value);
            }
        }
    }
    for (name, rules, _) in &fixture.issuers {
        if rules.verify(&token, &fixture.keys, now).is_ok() {
            assert!(
                signed_by_fixture(&token),
                "{name}: a token verified without our signature"
            );
        }
    }

    // As the payload of a token we sign.
    if data.len() > MAX_TOKEN_LEN {
        return;
    }
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"EdDSA","typ":"JWT","kid":"{KID}"}}"#));
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(data));
    let signature = URL_SAFE_NO_PAD.encode(fixture.key.sign(signed.as_bytes()).as_ref());
    let token = format!("{signed}.{signature}");
    let payload: Option<serde_json::Map<String, Value>> = serde_json::from_slice(data).ok();
    for (name, rules, subject_claim) in &fixture.issuers {
        let verified = rules.verify(&token, &fixture.keys, now);
        let Ok(identity) = verified else { continue };
        let Some(claims) = &payload else {
            panic!("{name}: a payload that is not a JSON object verified");
        };
        assert_eq!(
            claims.get(*subject_claim).and_then(Value::as_str),
            Some(identity.subject.as_str()),
            "{name}: the subject is not the `{subject_claim}` claim"
        );
        assert!(!identity.subject.is_empty() && !identity.username.is_empty());
        assert_eq!(
            claims.get("iss").and_then(Value::as_str),
            Some(identity.issuer.as_str())
        );
        let leeway = time::Duration::try_from(LEEWAY).unwrap_or(time::Duration::ZERO);
        assert!(
            identity.expires_at + leeway >= now,
            "{name}: an expired token verified"
        );
        if let Some(iat) = identity.issued_at {
            assert!(iat <= now + leeway, "{name}: a token from the future verified");
        }
        let audiences = match claims.get("aud") {
            Some(Value::String(a)) => vec![a.clone()],
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        assert!(
            audiences.iter().any(|a| a == CLIENT || a == "api://talos-sso"),
            "{name}: a token for another audience verified"
        );
        for client in ["azp", "appid"] {
            if let Some(other) = claims.get(client).and_then(Value::as_str) {
                assert!(
                    other.is_empty() || other == CLIENT,
                    "{name}: a token of another client verified"
                );
            }
        }
        let _ = (identity.replay_key(), identity.qualified_subject());
        // The same token with its signature changed is refused.
        let mut forged = token.clone().into_bytes();
        let last = forged.len() - 2;
        forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8_lossy(&forged);
        assert!(
            rules.verify(&forged, &fixture.keys, now).is_err(),
            "{name}: a changed signature verified"
        );
    }
}

pub fn run_jwks(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(set) = KeySet::from_json(&text) else { return };
    let document: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("accepted a non-JSON set: {e}"));
    let entries = document
        .get("keys")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("accepted a set without `keys`"));
    assert!(set.len() <= entries.len() && !set.is_empty());
    for entry in entries {
        let Some(kid) = entry.get("kid").and_then(Value::as_str) else {
            continue;
        };
        let Some(key) = set.get(kid) else { continue };
        let message = b"header.payload";
        let garbage = [0x42u8; 64];
        let verified = match key {
            VerifyingKey::Rsa { n, e } => {
                let bits = n.len() * 8 - n.first().map_or(0, |b| b.leading_zeros() as usize);
                assert!(bits >= 2048, "kept an RSA key of {bits} bits");
                assert!(!e.is_empty(), "kept an RSA key without an exponent");
                signature::RsaPublicKeyComponents { n, e }
                    .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, &garbage)
                    .is_ok()
            }
            VerifyingKey::EcP256 { point } => {
                assert!(point.len() == 65 && point[0] == 4, "kept a malformed P-256 point");
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, &garbage)
                    .is_ok()
            }
            VerifyingKey::Ed25519 { x } => {
                assert_eq!(x.len(), 32, "kept a malformed Ed25519 key");
                signature::UnparsedPublicKey::new(&signature::ED25519, x)
                    .verify(message, &garbage)
                    .is_ok()
            }
        };
        assert!(!verified, "a constant signature verified");
        if let Some(alg) = entry.get("alg").and_then(Value::as_str) {
            // The last entry with this kid wins; only check when unique.
            let same_kid = entries
                .iter()
                .filter(|e| e.get("kid").and_then(Value::as_str) == Some(kid))
                .count();
            if same_kid == 1 {
                assert_eq!(
                    alg,
                    key.algorithm(),
                    "kept a key whose `alg` is not its algorithm"
                );
            }
        }
    }
}
