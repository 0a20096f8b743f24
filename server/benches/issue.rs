//! What one issuance costs in CPU: verify the CSR's signature, then build and
//! sign the Talos client certificate, for each CA key type.
//!
//! Run: `cargo bench -p talos-sso-server --bench issue`. Figures are in
//! docs/performance.md.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use talos_sso::key::ClientKey;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::certificate::{self, DEFAULT_CLOCK_SKEW, LeafRequest};
use time::OffsetDateTime;

fn bench(c: &mut Criterion) {
    let now = OffsetDateTime::now_utc();
    let csr = ClientKey::generate()
        .map(|k| k.csr_der())
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    let roles = vec!["os:operator".to_owned(), "os:reader".to_owned()];
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
            csr: &csr,
            username: "alice@example.com",
            roles: &roles,
            ttl: Duration::from_secs(300),
            clock_skew: DEFAULT_CLOCK_SKEW,
        };
        c.bench_function(&format!("verify CSR + sign certificate ({key_type:?} CA)"), |b| {
            b.iter(|| certificate::issue(black_box(&ca), black_box(&request), now).is_ok())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
