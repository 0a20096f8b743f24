//! Certificates Talos accepts: the profile, the apid stand-in, OpenSSL, and
//! every CSR refusal.

use std::time::Duration;

use talos_sso::key::ClientKey;
use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::certificate::{self, CsrError, IssueError, LeafRequest, SignedLeaf};
use talos_sso_server::config::{CaSource, DEFAULT_CLOCK_SKEW};
use talos_sso_server::x509::{self, CertificateTemplate, ParsedCertificate, oid};
use talos_sso_tests::material::{fixture, fresh_ca, load, private_copy, read_fixture};
use talos_sso_tests::{openssl, talos_checker};
use time::OffsetDateTime;
use time::macros::datetime;

const ROLE_SETS: [&[&str]; 3] = [
    &["os:reader"],
    &["os:operator", "os:etcd:backup"],
    &["os:admin", "os:operator", "os:reader", "os:etcd:backup"],
];

fn roles(names: &[&str]) -> Vec<String> {
    names.iter().map(|r| r.to_string()).collect()
}

fn issue_at(
    ca: &CertificateAuthority,
    csr: &[u8],
    role_names: &[&str],
    ttl: Duration,
    now: OffsetDateTime,
) -> Result<SignedLeaf, IssueError> {
    let roles = roles(role_names);
    let request = LeafRequest {
        username: "alice@example.com",
        roles: &roles,
        ttl,
        clock_skew: DEFAULT_CLOCK_SKEW,
    };
    certificate::issue(ca, csr, &request, now)
}

/// Every CA the tests sign with: the Talos fixtures and fresh ones of each type.
fn all_cas(dir: &std::path::Path) -> Vec<(String, CertificateAuthority)> {
    let mut cas = vec![
        (
            "secrets-bundle".to_owned(),
            load(&CaSource::SecretsBundle(private_copy(
                dir,
                "talos/secrets-bundle.yaml",
            )))
            .unwrap(),
        ),
        (
            "stability-secrets".to_owned(),
            load(&CaSource::SecretsBundle(private_copy(
                dir,
                "talos/stability-secrets.yaml",
            )))
            .unwrap(),
        ),
        (
            "controlplane-v1.12".to_owned(),
            load(&CaSource::MachineConfig(private_copy(
                dir,
                "talos/controlplane-v1.12.yaml",
            )))
            .unwrap(),
        ),
        (
            "openssl-rsa".to_owned(),
            load(&CaSource::Files {
                cert_file: fixture("openssl/rsa-ca.crt"),
                key_file: private_copy(dir, "openssl/rsa-ca.key"),
            })
            .unwrap(),
        ),
        (
            "openssl-p384".to_owned(),
            load(&CaSource::Files {
                cert_file: fixture("openssl/p384-ca.crt"),
                key_file: private_copy(dir, "openssl/p384-ca.key"),
            })
            .unwrap(),
        ),
    ];
    for key_type in [NewKeyType::Ed25519, NewKeyType::EcdsaP256, NewKeyType::EcdsaP384] {
        cas.push((format!("fresh-{key_type:?}"), fresh_ca(key_type)));
    }
    cas
}

#[test]
fn talos_accepts_certificates_from_every_ca_with_1_2_and_4_roles() {
    let dir = tempfile::tempdir().unwrap();
    for (name, ca) in all_cas(dir.path()) {
        for role_set in ROLE_SETS {
            let key = ClientKey::generate().unwrap();
            let issued = issue_at(
                &ca,
                key.csr_pem().unwrap().as_bytes(),
                role_set,
                Duration::from_secs(300),
                OffsetDateTime::now_utc(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            // The rule Go's TLS client applies before it sends anything.
            assert_eq!(issued.leaf.raw_issuer, ca.signer().raw_subject, "{name}");
            let accepted =
                talos_checker::handshake(ca.trust_bundle_pem(), &issued.chain_pem, &key.private_key_pem())
                    .unwrap_or_else(|e| panic!("{name} {role_set:?}: {e}"));
            assert_eq!(accepted.roles, roles(role_set), "{name}");
            assert_eq!(accepted.common_name.as_deref(), Some("alice@example.com"));
            openssl::verify_client_certificate(ca.trust_bundle_pem(), &issued.leaf.to_pem(), "")
                .unwrap_or_else(|e| panic!("{name}: openssl: {e}"));
        }
    }
}

#[test]
fn certificate_profile_matches_product_section_5() {
    let ca = load(&CaSource::SecretsBundle(private_copy(
        tempfile::tempdir().unwrap().path(),
        "talos/secrets-bundle.yaml",
    )))
    .unwrap();
    let key = ClientKey::generate().unwrap();
    let now = datetime!(2027-03-01 10:00:00 UTC);
    let issued = issue_at(
        &ca,
        &key.csr_der().unwrap(),
        &["os:admin", "os:reader"],
        Duration::from_secs(300),
        now,
    )
    .unwrap();
    let leaf = &issued.leaf;

    assert_eq!(leaf.subject_organizations(), ["os:admin", "os:reader"]);
    assert_eq!(leaf.subject_common_name().as_deref(), Some("alice@example.com"));
    assert_eq!(leaf.raw_issuer, ca.signer().raw_subject);
    let key_usage = leaf.extension(oid::KEY_USAGE).unwrap();
    assert!(key_usage.critical);
    let ku = leaf.key_usage().unwrap();
    assert!(ku.digital_signature() && !ku.key_cert_sign() && !ku.key_encipherment());
    assert_eq!(leaf.ext_key_usage(), Some(vec![oid::KP_CLIENT_AUTH]));
    assert!(!leaf.basic_constraints().unwrap().ca);
    let aki = leaf.extension(oid::AUTHORITY_KEY_ID).unwrap();
    assert!(
        aki.extn_value
            .as_bytes()
            .ends_with(&ca.signer().subject_key_id().unwrap())
    );
    assert!(leaf.extension(oid::SUBJECT_ALT_NAME).is_none());

    // Only the CSR's public key is used.
    assert_eq!(leaf.spki(), &key.public_key_info().unwrap());
    // Validity: now - skew .. now + ttl, to the second.
    assert_eq!(issued.not_before, now - DEFAULT_CLOCK_SKEW);
    assert_eq!(issued.not_after, now + Duration::from_secs(300));
    // Serial: positive, 128 random bits, unique.
    let serial = leaf.tbs().serial_number().as_bytes();
    assert!(serial.len() <= 17 && serial[0] & 0x80 == 0);
    let other = issue_at(
        &ca,
        &key.csr_der().unwrap(),
        &["os:admin"],
        Duration::from_secs(300),
        now,
    )
    .unwrap();
    assert_ne!(issued.serial_hex, other.serial_hex);
    // The audit facts are hashes of what was signed.
    assert_eq!(issued.certificate_sha256, leaf.sha256_fingerprint());
    assert_eq!(issued.public_key_sha256.len(), 64);

    let text = openssl::certificate_text(&leaf.to_pem());
    assert!(
        text.contains("TLS Web Client Authentication") && !text.contains("Server Authentication"),
        "{text}"
    );
    assert!(text.contains("CA:FALSE"), "{text}");
}

#[test]
fn validity_edges_follow_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    let ca = load(&CaSource::SecretsBundle(private_copy(
        dir.path(),
        "talos/secrets-bundle.yaml",
    )))
    .unwrap();
    let csr = ClientKey::generate().unwrap().csr_der().unwrap();
    let five_minutes = Duration::from_secs(300);
    // CA: 2023-05-25T12:14:42Z .. 2033-05-22T12:14:42Z.
    let before = issue_at(
        &ca,
        &csr,
        &["os:reader"],
        five_minutes,
        datetime!(2023-05-25 12:14:41 UTC),
    );
    assert!(matches!(before, Err(IssueError::CaNotValid)));
    let at_end = issue_at(
        &ca,
        &csr,
        &["os:reader"],
        five_minutes,
        datetime!(2033-05-22 12:14:42 UTC),
    );
    assert!(matches!(at_end, Err(IssueError::CaNotValid)));
    // Two minutes before the CA expires, a five-minute leaf is cut to the CA's end.
    let near = issue_at(
        &ca,
        &csr,
        &["os:reader"],
        five_minutes,
        datetime!(2033-05-22 12:12:42 UTC),
    )
    .unwrap();
    assert_eq!(near.not_after, datetime!(2033-05-22 12:14:42 UTC));
    assert_eq!(near.not_before, datetime!(2033-05-22 12:07:42 UTC));
    let zero = issue_at(
        &ca,
        &csr,
        &["os:reader"],
        Duration::ZERO,
        datetime!(2030-01-01 00:00:00 UTC),
    );
    assert!(matches!(zero, Err(IssueError::InvalidTtl)));
    // A custom skew allowance moves not_before only.
    let request = LeafRequest {
        username: "bob",
        roles: &roles(&["os:reader"]),
        ttl: five_minutes,
        clock_skew: Duration::from_secs(30),
    };
    let skewed = certificate::issue(&ca, &csr, &request, datetime!(2030-01-01 00:00:00 UTC)).unwrap();
    assert_eq!(skewed.not_before, datetime!(2029-12-31 23:59:30 UTC));
    assert_eq!(skewed.not_after, datetime!(2030-01-01 00:05:00 UTC));
}

#[test]
fn identity_and_roles_are_checked() {
    let ca = fresh_ca(NewKeyType::Ed25519);
    let csr = ClientKey::generate().unwrap().csr_der().unwrap();
    let now = OffsetDateTime::now_utc();
    let ttl = Duration::from_secs(300);
    assert!(matches!(
        issue_at(&ca, &csr, &[], ttl, now),
        Err(IssueError::NoRoles)
    ));
    assert!(matches!(
        issue_at(&ca, &csr, &["os:admin,os:reader"], ttl, now),
        Err(IssueError::InvalidRole(_))
    ));
    assert!(matches!(
        issue_at(&ca, &csr, &[""], ttl, now),
        Err(IssueError::InvalidRole(_))
    ));
    let duplicated = issue_at(&ca, &csr, &["os:reader", "os:reader"], ttl, now).unwrap();
    assert_eq!(duplicated.leaf.subject_organizations(), ["os:reader"]);
    for username in ["", "bad\nname"] {
        let request = LeafRequest {
            username,
            roles: &roles(&["os:reader"]),
            ttl,
            clock_skew: DEFAULT_CLOCK_SKEW,
        };
        assert!(matches!(
            certificate::issue(&ca, &csr, &request, now),
            Err(IssueError::InvalidUsername)
        ));
    }
}

fn csr_reason(csr: &[u8]) -> &'static str {
    match certificate::verify_csr(csr) {
        Ok(_) => "accepted",
        Err(e) => e.reason(),
    }
}

#[test]
fn csr_key_types_and_damage_are_refused_distinctly() {
    let csr = |name: &str| read_fixture(&format!("openssl/{name}.csr"));
    assert_eq!(csr_reason(csr("ed25519").as_bytes()), "accepted");
    assert_eq!(csr_reason(csr("p256").as_bytes()), "accepted");
    assert_eq!(csr_reason(csr("rsa2048").as_bytes()), "accepted");
    assert_eq!(csr_reason(csr("rsa1024").as_bytes()), "csr_key_too_small");
    assert_eq!(csr_reason(csr("p384").as_bytes()), "csr_key_type_unsupported");
    assert_eq!(csr_reason(csr("ed448").as_bytes()), "csr_key_type_unsupported");
    assert!(matches!(
        certificate::verify_csr(csr("rsa1024").as_bytes()),
        Err(CsrError::RsaKeyTooSmall { bits: 1024 })
    ));

    let good = ClientKey::generate().unwrap().csr_der().unwrap();
    assert_eq!(csr_reason(&good), "accepted");
    // Flip one bit of the signature (the last byte of the DER).
    let mut tampered = good.clone();
    *tampered.last_mut().unwrap() ^= 0x01;
    assert_eq!(csr_reason(&tampered), "csr_signature_invalid");
    // A CSR whose signed part was changed after signing (the CN's last letter).
    let mut altered = good.clone();
    let cn = altered.windows(9).position(|w| w == b"talos-sso").unwrap();
    altered[cn + 8] = b'x';
    assert_eq!(csr_reason(&altered), "csr_signature_invalid");
    assert_eq!(csr_reason(&good[..good.len() - 3]), "csr_malformed");
    assert_eq!(
        csr_reason(b"-----BEGIN CERTIFICATE REQUEST-----\n!!!\n-----END CERTIFICATE REQUEST-----\n"),
        "csr_malformed"
    );
    assert_eq!(
        csr_reason(b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"),
        "csr_malformed"
    );
    assert_eq!(csr_reason(b"hello"), "csr_malformed");
    assert_eq!(
        csr_reason(&vec![b'A'; certificate::MAX_CSR_LEN + 1]),
        "csr_too_large"
    );

    // An RSA CSR can be issued, and Talos accepts the result.
    let ca = fresh_ca(NewKeyType::Ed25519);
    let issued = issue_at(
        &ca,
        csr("rsa2048").as_bytes(),
        &["os:reader"],
        Duration::from_secs(300),
        OffsetDateTime::now_utc(),
    );
    assert!(issued.is_ok());
    // A refused CSR issues nothing.
    let refused = issue_at(
        &ca,
        &tampered,
        &["os:reader"],
        Duration::from_secs(300),
        OffsetDateTime::now_utc(),
    );
    assert!(matches!(refused, Err(IssueError::Csr(CsrError::BadSignature))));
}

#[test]
fn intermediate_mode_sends_the_chain_and_talos_accepts_it() {
    let now = OffsetDateTime::now_utc();
    let dir = tempfile::tempdir().unwrap();
    let root = load(&CaSource::SecretsBundle(private_copy(
        dir.path(),
        "talos/secrets-bundle.yaml",
    )))
    .unwrap();
    for key_type in [NewKeyType::Ed25519, NewKeyType::EcdsaP256] {
        let inter = generate::new_intermediate(
            &root,
            key_type,
            "talos-sso intermediate CA",
            Duration::from_secs(30 * 86400),
            now,
        )
        .unwrap();
        // Path length 0, keyCertSign, clientAuth only, signed by the root.
        assert_eq!(
            inter.cert.basic_constraints().unwrap().path_len_constraint,
            Some(0)
        );
        assert!(inter.cert.key_usage().unwrap().key_cert_sign());
        assert_eq!(inter.cert.ext_key_usage(), Some(vec![oid::KP_CLIENT_AUTH]));
        inter.cert.verify_signed_by(root.signer().spki()).unwrap();
        assert!(
            openssl::read_private_key(&inter.key_pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY")).is_ok()
        );

        let ca = CertificateAuthority::from_pem(&inter.cert_pem, &inter.key_pem, "intermediate", vec![], now)
            .unwrap();
        assert!(ca.is_intermediate());
        // The talosconfig `ca` is the Talos root, not the intermediate.
        assert_eq!(ca.trust_bundle_pem(), root.signer().to_pem());
        for role_set in ROLE_SETS {
            let key = ClientKey::generate().unwrap();
            let issued = issue_at(
                &ca,
                &key.csr_der().unwrap(),
                role_set,
                Duration::from_secs(300),
                now,
            )
            .unwrap();
            let chain = talos_sso_server::ca::parse_certificates(&issued.chain_pem, "chain").unwrap();
            assert_eq!(chain.len(), 2, "leaf then intermediate");
            assert_eq!(chain[1].der, inter.cert.der);
            let accepted =
                talos_checker::handshake(ca.trust_bundle_pem(), &issued.chain_pem, &key.private_key_pem())
                    .unwrap_or_else(|e| panic!("{key_type:?}: {e}"));
            assert_eq!(accepted.roles, roles(role_set));
            openssl::verify_client_certificate(
                ca.trust_bundle_pem(),
                &issued.leaf.to_pem(),
                &inter.cert.to_pem(),
            )
            .unwrap();
            // Without the intermediate, Talos cannot build the chain.
            assert!(
                talos_checker::handshake(
                    ca.trust_bundle_pem(),
                    &issued.leaf.to_pem(),
                    &key.private_key_pem()
                )
                .is_err()
            );
        }
    }
}

#[test]
fn checker_rejects_the_2021_talosconfig_for_its_extended_key_usage() {
    use base64::Engine;
    let yaml: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read_fixture("talos/talosconfig-2021-admin.yaml")).unwrap();
    let context = &yaml["contexts"]["no-roles"];
    let field = |name: &str| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(context[name].as_str().unwrap())
            .unwrap();
        String::from_utf8(bytes).unwrap()
    };
    let error = talos_checker::handshake(&field("ca"), &field("crt"), &field("key")).unwrap_err();
    assert!(error.contains("exactly [clientAuth]"), "{error}");
}

#[test]
fn checker_refuses_a_leaf_whose_issuer_bytes_differ() {
    // Same CA key and the same issuer *meaning* (O=talos), but encoded as
    // UTF8String instead of the CA's PrintableString: Go's client would not
    // send it, and neither does the stand-in.
    let ca = load(&CaSource::SecretsBundle(private_copy(
        tempfile::tempdir().unwrap().path(),
        "talos/secrets-bundle.yaml",
    )))
    .unwrap();
    let key = ClientKey::generate().unwrap();
    let issued = issue_at(
        &ca,
        &key.csr_der().unwrap(),
        &["os:admin"],
        Duration::from_secs(300),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let mut rdn = x509_cert::name::RelativeDistinguishedName::default();
    rdn.insert(x509_cert::attr::AttributeTypeAndValue {
        oid: oid::ORGANIZATION,
        value: der::asn1::Any::new(der::Tag::Utf8String, b"talos".as_slice()).unwrap(),
    })
    .unwrap();
    let mut name = x509_cert::name::RdnSequence::default();
    name.push(rdn);
    let utf8_issuer = der::Encode::to_der(&name).unwrap();
    assert_ne!(utf8_issuer, ca.signer().raw_subject);
    let spki = der::Encode::to_der(issued.leaf.spki()).unwrap();
    let subject = x509::encode_name(&[(oid::ORGANIZATION, "os:admin")]).unwrap();
    let template = CertificateTemplate {
        serial: &[7; 16],
        issuer: &utf8_issuer,
        subject: &subject,
        subject_public_key_info: &spki,
        not_before: issued.not_before,
        not_after: issued.not_after,
        extensions: issued.leaf.tbs().extensions().unwrap().to_vec(),
    };
    let forged = x509::sign_certificate(&template, ca.key()).unwrap();
    let forged = ParsedCertificate::from_der(&forged).unwrap();
    let error = talos_checker::handshake(ca.trust_bundle_pem(), &forged.to_pem(), &key.private_key_pem())
        .unwrap_err();
    assert_eq!(error, "peer sent no certificates");
    // The genuine one passes the same checker.
    talos_checker::handshake(ca.trust_bundle_pem(), &issued.chain_pem, &key.private_key_pem()).unwrap();
}

/// The issuance service on its own, without HTTP: what it returns has been
/// committed, and what cannot be committed is not returned.
mod service {
    use std::sync::Mutex;

    use talos_sso::key::ClientKey;
    use talos_sso_server::audit::recorder::Recorder;
    use talos_sso_server::audit::store::{Append, Appended};
    use talos_sso_server::audit::writer::AuditError;
    use talos_sso_server::audit::{GENESIS_HASH, StoredRecord, chain, event, outcome};
    use talos_sso_server::identity::VerifiedIdentity;
    use talos_sso_server::issuance::{CertificateRequest, Issuance, IssuanceError};
    use talos_sso_server::metrics::Metrics;
    use talos_sso_tests::emulator::GROUP_ONCALL;
    use talos_sso_tests::harness::{Backend, TestEnv};

    /// Keeps records in memory, or refuses them all.
    #[derive(Default)]
    struct MemoryRecorder {
        records: Mutex<Vec<StoredRecord>>,
        unavailable: bool,
    }

    impl Recorder for MemoryRecorder {
        async fn append(&self, append: Append) -> Result<Appended, AuditError> {
            if self.unavailable {
                return Err(AuditError::Unavailable);
            }
            let mut records = self.records.lock().unwrap();
            let (seq, hash) = records
                .last()
                .map(|r| (r.seq, r.hash.clone()))
                .unwrap_or((0, GENESIS_HASH.into()));
            let stored = chain(seq, &hash, append.record);
            records.push(stored.clone());
            Ok(Appended::Recorded(stored))
        }
    }

    fn on_call() -> VerifiedIdentity {
        VerifiedIdentity {
            issuer_name: "login".into(),
            issuer: "https://idp.example".into(),
            tenant: None,
            subject: "subject-1".into(),
            username: "oncall@example.com".into(),
            groups: vec![GROUP_ONCALL.into()],
            app_roles: vec![],
            token_id: Some("jti-1".into()),
            signed_sha256: "00".repeat(32),
            issued_at: None,
            expires_at: time::OffsetDateTime::now_utc() + time::Duration::minutes(5),
            claims: Default::default(),
            application: None,
            workload: None,
        }
    }

    fn request(roles: &[&str]) -> CertificateRequest {
        let key = ClientKey::generate().unwrap();
        CertificateRequest {
            cluster: "prod".into(),
            csr: key.csr_pem().unwrap(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            ttl_seconds: None,
        }
    }

    #[tokio::test]
    async fn what_it_returns_is_recorded_and_what_it_cannot_record_it_refuses() {
        let env = TestEnv::start(Backend::Sqlite).await;
        let settings = env.server.app.settings();
        let metrics = Metrics::new();
        let now = time::OffsetDateTime::now_utc();
        let record = || {
            talos_sso_server::audit::AuditRecord::new(event::CERTIFICATE_DENIED, outcome::DENIED, "r-1", now)
        };

        let memory = MemoryRecorder::default();
        let issuance = Issuance {
            clusters: &settings.clusters,
            recorder: &memory,
            metrics: &metrics,
        };
        let issued = issuance
            .issue(&on_call(), &request(&[]), record(), now)
            .await
            .expect("issued");
        assert_eq!(issued.certificate.roles, ["os:operator"]);
        let kept = memory.records.lock().unwrap().clone();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0], issued.record, "the record returned is the one committed");
        assert_eq!(kept[0].record.event, event::CERTIFICATE_ISSUED);
        assert_eq!(
            kept[0].record.serial.as_deref(),
            Some(issued.certificate.serial_hex.as_str())
        );

        // A refusal is recorded too, with its code.
        let refused = issuance
            .issue(&on_call(), &request(&["os:admin"]), record(), now)
            .await;
        assert!(matches!(refused, Err(IssuanceError::Policy(_))), "{refused:?}");
        let kept = memory.records.lock().unwrap().clone();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1].record.outcome, outcome::DENIED);
        assert_eq!(kept[1].record.reason_code.as_deref(), Some("role_not_permitted"));

        // Nothing can be recorded: no certificate, and no refusal either
        // (the caller cannot be told "denied" for a decision nobody kept).
        let down = MemoryRecorder {
            unavailable: true,
            ..Default::default()
        };
        let issuance = Issuance {
            clusters: &settings.clusters,
            recorder: &down,
            metrics: &metrics,
        };
        for roles in [&[][..], &["os:admin"][..]] {
            let answer = issuance.issue(&on_call(), &request(roles), record(), now).await;
            assert!(
                matches!(answer, Err(IssuanceError::AuditUnavailable)),
                "{roles:?}: {answer:?}"
            );
        }
        env.finish().await;
    }
}
