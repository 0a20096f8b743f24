//! Signing keys, tokens and issuer configurations for the identity tests.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::issuer::IssuerRules;
use super::jwks::{KeySet, VerifyingKey};
use crate::config::IssuerConfig;

pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
pub const CLI: &str = "11111111-2222-3333-4444-555555555555";
pub const NOW: i64 = 1_800_000_000;

/// One key of each algorithm, and the key set that publishes them as
/// `rsa`, `ec` and `ed`.
pub struct Signers {
    pub rsa: RsaKeyPair,
    ec: EcdsaKeyPair,
    ed: Ed25519KeyPair,
    pub keys: KeySet,
}

pub fn signers() -> Signers {
    let rng = SystemRandom::new();
    let pem = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/openssl/rsa-ca.key"
    ))
    .unwrap();
    let der = crate::x509::pem_blocks(&pem).unwrap().remove(0).1;
    let rsa = RsaKeyPair::from_der(&der).unwrap();
    let ec_pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let ec = EcdsaKeyPair::from_pkcs8(
        &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        ec_pkcs8.as_ref(),
        &rng,
    )
    .unwrap();
    let ed = Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
    let components: signature::RsaPublicKeyComponents<Vec<u8>> = rsa.public().into();
    let mut keys = KeySet::default();
    keys.insert(
        "rsa",
        VerifyingKey::Rsa {
            n: components.n,
            e: components.e,
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

/// `claims` signed with the key `kid` under the header `alg`.
pub fn sign(s: &Signers, alg: &str, kid: &str, claims: &Value) -> String {
    sign_payload(s, alg, kid, &claims.to_string())
}

/// `payload`, whatever it is, signed with the key `kid` under the header `alg`.
pub fn sign_payload(s: &Signers, alg: &str, kid: &str, payload: &str) -> String {
    let header = URL_SAFE_NO_PAD.encode(json!({"typ": "JWT", "alg": alg, "kid": kid}).to_string());
    let payload = URL_SAFE_NO_PAD.encode(payload);
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

pub fn at(seconds: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(seconds).unwrap()
}

/// An Entra v2 ID token's claims for the CLI, issued at `NOW - 300`.
pub fn entra_claims() -> Value {
    json!({
        "aud": CLI, "iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
        "iat": NOW - 300, "nbf": NOW - 300, "exp": NOW - 300 + 3900,
        "tid": TENANT, "oid": "00000000-0000-0000-0000-0000000000a1", "sub": "pairwise-sub",
        "preferred_username": "alice@example.com", "name": "Alice",
        "groups": ["g1", "g2"], "roles": ["Talos.Reader"], "uti": "uti-1", "ver": "2.0", "nonce": "n"
    })
}

/// `claims` with `patch` applied (`null` removes a claim).
pub fn patched(mut claims: Value, patch: Value) -> Value {
    for (k, v) in patch.as_object().unwrap() {
        if v.is_null() {
            claims.as_object_mut().unwrap().remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

/// A multi-tenant Entra login issuer allowing `TENANT`, for the CLI.
pub fn entra_config() -> IssuerConfig {
    IssuerConfig {
        name: crate::config::LOGIN_ISSUER.into(),
        kind: "entra".into(),
        issuer: "https://login.microsoftonline.com/{tenantid}/v2.0".into(),
        discovery_url: None,
        additional_issuers: vec![],
        audiences: vec![CLI.into()],
        clients: vec![CLI.into()],
        allowed_tenants: vec![TENANT.into()],
        username_claim: None,
        leeway: std::time::Duration::from_secs(300),
        entra_graph: None,
        ca_file: None,
        jwks_file: None,
        certificates_per_token: None,
    }
}

/// A generic OpenID provider `https://idp.example.com`, audience `talos-sso`.
pub fn oidc_config(username_claim: Option<&str>) -> IssuerConfig {
    IssuerConfig {
        name: "idp".into(),
        kind: "oidc".into(),
        issuer: "https://idp.example.com".into(),
        audiences: vec!["talos-sso".into()],
        clients: Vec::new(),
        allowed_tenants: vec![],
        username_claim: username_claim.map(str::to_owned),
        ..entra_config()
    }
}

pub fn rules(config: &IssuerConfig) -> IssuerRules {
    IssuerRules::new(config).unwrap()
}

/// The code of `token`'s refusal under `rules` at `now`, or `ok`.
pub fn code(s: &Signers, token: &str, rules: &IssuerRules, now: i64) -> &'static str {
    match rules.verify(token, &s.keys, at(now)) {
        Ok(_) => "ok",
        Err(e) => e.code(),
    }
}
