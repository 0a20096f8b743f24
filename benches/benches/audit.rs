//! What the audit writer computes for each record while it holds the chain
//! lock: the record's canonical encoding (RFC 8785), written field by field
//! as the server does, and by the general route (the record as a JSON
//! value, canonicalised), each with the SHA-256 of the chain on top.
//!
//! Run: `cargo bench --manifest-path benches/Cargo.toml --bench audit`. Figures are in
//! docs/evidence/performance.md.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use talos_sso_api::chain::canonical_encoding_by_value;
use talos_sso_server::audit::{AuditRecord, GENESIS_HASH, canonical_encoding, event, outcome, record_hash};
use time::OffsetDateTime;

/// An issuance record as the server writes it for an Entra user.
fn issued() -> AuditRecord {
    let now = OffsetDateTime::now_utc();
    let tenant = "72f988bf-86f1-41af-91ab-2d7cd011db47";
    let mut r = AuditRecord::new(
        event::CERTIFICATE_ISSUED,
        outcome::SUCCESS,
        "9778fb4dc57b3f431383cd12b1ad5f16",
        now,
    );
    r.cluster = Some("prod".into());
    r.issuer = Some(format!("https://login.microsoftonline.com/{tenant}/v2.0"));
    r.tenant = Some(tenant.into());
    r.subject = Some("c3000000-0000-4000-8000-000000000003".into());
    r.username = Some("carol@example.com".into());
    r.identity_verified = true;
    r.groups_evaluated = vec!["0f2a7c3e-2222-4c5d-9e8f-000000000002".into()];
    r.roles_granted = vec!["os:operator".into(), "os:reader".into()];
    r.serial = Some("949b16870497eaeaac0e5bba459e7ed5".into());
    r.certificate_sha256 = Some("dd325bb829a13b43ca2ff59729b5557c03a389a3aa123251a3b2ed08ebd44867".into());
    r.public_key_sha256 = Some("7651816163abeea72cefbf5fce20ca2431c6c9fbcadc9a5689bb71f38a354a92".into());
    r.not_before = Some(now);
    r.not_after = Some(now + time::Duration::minutes(5));
    r.client_ip = Some("10.0.0.7".into());
    r.user_agent = Some("talos-sso/0.1.0".into());
    r.client_version = Some("0.1.0".into());
    r.token_id = Some("SLBwIlYbuJOtBsSGxvJQJg".into());
    r.token_issued_at = Some(now);
    r
}

fn bench(c: &mut Criterion) {
    let record = issued();
    assert_eq!(
        canonical_encoding(41, &record, GENESIS_HASH),
        canonical_encoding_by_value(41, &record, GENESIS_HASH),
        "the two routes must give the same bytes"
    );
    c.bench_function("canonical encoding, field by field (the server's)", |b| {
        b.iter(|| canonical_encoding(black_box(41), black_box(&record), GENESIS_HASH))
    });
    c.bench_function("canonical encoding, through a JSON value", |b| {
        b.iter(|| canonical_encoding_by_value(black_box(41), black_box(&record), GENESIS_HASH))
    });
    c.bench_function("record hash (encoding + SHA-256)", |b| {
        b.iter(|| record_hash(black_box(41), black_box(&record), GENESIS_HASH))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
