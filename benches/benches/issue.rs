//! What one issuance costs in CPU: verify the bearer token (RS256, as Entra
//! signs), verify the CSR's signature, then build and sign the Talos client
//! certificate, for each CA key type.
//!
//! Run: `cargo bench --manifest-path benches/Cargo.toml --bench issue`. Figures are in
//! docs/evidence/performance.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use talos_sso::key::ClientKey;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::certificate::{self, LeafRequest};
use talos_sso_server::config::DEFAULT_CLOCK_SKEW;
use talos_sso_server::config::IssuerConfig;
use talos_sso_server::identity::issuer::IssuerRules;
use talos_sso_server::identity::jwks::{KeySet, VerifyingKey};
use time::OffsetDateTime;

/// An Entra-shaped RS256 token and the key set and rules that accept it.
fn entra_token(now: OffsetDateTime) -> Option<(String, KeySet, IssuerRules)> {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use ring::signature::{self, RsaKeyPair, RsaPublicKeyComponents};
    let pem = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/openssl/rsa-ca.key"
    ))
    .ok()?;
    let der = talos_sso_server::x509::pem_blocks(&pem).ok()?.pop()?.1;
    let key = RsaKeyPair::from_der(&der).ok()?;
    let public: RsaPublicKeyComponents<Vec<u8>> = key.public().into();
    let mut keys = KeySet::default();
    keys.insert(
        "k1",
        VerifyingKey::Rsa {
            n: public.n,
            e: public.e,
        },
    );
    let tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    let iat = now.unix_timestamp() - 300;
    let claims = serde_json::json!({
        "aud": "cli", "iss": format!("https://login.microsoftonline.com/{tenant}/v2.0"), "iat": iat, "nbf": iat,
        "exp": iat + 3900, "tid": tenant, "oid": "o", "preferred_username": "alice@example.com",
        "groups": ["0f2a7c3e-2222-4c5d-9e8f-000000000002"], "uti": "u"
    });
    let input = format!(
        "{}.{}",
        B64.encode(r#"{"typ":"JWT","alg":"RS256","kid":"k1"}"#),
        B64.encode(claims.to_string())
    );
    let mut sig = vec![0; key.public().modulus_len()];
    key.sign(
        &signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .ok()?;
    let rules = IssuerRules::new(&IssuerConfig {
        name: "login".into(),
        kind: "entra".into(),
        issuer: "https://login.microsoftonline.com/{tenantid}/v2.0".into(),
        discovery_url: None,
        additional_issuers: Vec::new(),
        audiences: vec!["cli".into()],
        clients: vec!["cli".into()],
        allowed_tenants: vec![tenant.into()],
        username_claim: None,
        leeway: Duration::from_secs(300),
        entra_graph: None,
        ca_file: None,
        jwks_file: None,
        certificates_per_token: None,
    })
    .ok()?;
    Some((format!("{input}.{}", B64.encode(sig)), keys, rules))
}

fn bench(c: &mut Criterion) {
    let now = OffsetDateTime::now_utc();
    let csr = ClientKey::generate()
        .map(|k| k.csr_der())
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let roles = vec!["os:operator".to_owned(), "os:reader".to_owned()];
    if let Some((jwt, keys, rules)) = entra_token(now) {
        c.bench_function("verify token (RS256, RSA-2048, ring)", |b| {
            b.iter(|| rules.verify(black_box(&jwt), &keys, now).is_ok())
        });
    }
    c.bench_function("verify CSR (Ed25519)", |b| {
        b.iter(|| certificate::verify_csr(black_box(&csr)).is_ok())
    });
    for key_type in [NewKeyType::Ed25519, NewKeyType::EcdsaP256, NewKeyType::EcdsaP384] {
        let Ok(new) = generate::new_root(key_type, "talos", Duration::from_secs(86400), now) else {
            return;
        };
        let Ok(ca) = CertificateAuthority::from_pem(&new.cert_pem, &new.key_pem, "bench", Vec::new(), now)
        else {
            return;
        };
        let request = LeafRequest {
            username: "alice@example.com",
            roles: &roles,
            ttl: Duration::from_secs(300),
            clock_skew: DEFAULT_CLOCK_SKEW,
        };
        c.bench_function(&format!("verify CSR + sign certificate ({key_type:?} CA)"), |b| {
            b.iter(|| certificate::issue(black_box(&ca), black_box(&csr), black_box(&request), now).is_ok())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
