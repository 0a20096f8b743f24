//! Loading Talos CA material in every form, and every refusal.

use std::time::Duration;

use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::ca::{CaOptions, CaWarning, CertificateAuthority};
use talos_sso_server::cli::{Cli, run};
use talos_sso_server::config::CaSource;
use talos_sso_server::keys::KeyKind;
use talos_sso_tests::material::{fixture, load, private_copy, read_fixture, write_file};
use time::OffsetDateTime;
use time::macros::datetime;

use clap::Parser;

fn code(result: Result<CertificateAuthority, talos_sso_server::ca::CaError>) -> &'static str {
    match result {
        Ok(_) => "loaded",
        Err(e) => e.code(),
    }
}

/// Replace `machine.ca.key` (or `certs.os.key`) in a YAML fixture.
fn with_key(yaml: &str, old_key_line_prefix: &str, new_value: &str) -> String {
    yaml.lines()
        .map(|line| {
            if line.trim_start().starts_with("key:") && line.contains(old_key_line_prefix) {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}key: {new_value}")
            } else {
                line.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn decode_b64_field(yaml: &str, path: &[&str]) -> String {
    use base64::Engine;
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let mut node = &value;
    for key in path {
        node = &node[*key];
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(node.as_str().unwrap())
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn every_talos_fixture_source_loads() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["talos/secrets-bundle.yaml", "talos/stability-secrets.yaml"] {
        let ca = load(&CaSource::SecretsBundle(private_copy(dir.path(), name))).unwrap();
        assert_eq!(ca.signer().subject_organizations(), ["talos"], "{name}");
        assert_eq!(
            talos_sso_server::keys::key_kind(ca.signer().spki()),
            KeyKind::Ed25519
        );
        assert!(!ca.is_intermediate());
    }
    let cp = load(&CaSource::MachineConfig(private_copy(
        dir.path(),
        "talos/controlplane-v1.12.yaml",
    )))
    .unwrap();
    let stability = load(&CaSource::SecretsBundle(
        dir.path().join("stability-secrets.yaml"),
    ))
    .unwrap();
    // The fixtures' README: machine.ca of the control plane equals certs.os of stability-secrets.
    assert_eq!(cp.signer().der, stability.signer().der);
}

#[test]
fn pem_files_with_every_key_label_load() {
    let dir = tempfile::tempdir().unwrap();
    // ED25519 PRIVATE KEY (PKCS#8 v1), straight out of the Talos bundle.
    let bundle = read_fixture("talos/secrets-bundle.yaml");
    let cert = write_file(
        dir.path(),
        "os.crt",
        &decode_b64_field(&bundle, &["certs", "os", "crt"]),
        0o644,
    );
    let key_pem = decode_b64_field(&bundle, &["certs", "os", "key"]);
    assert!(key_pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----"));
    let key = write_file(dir.path(), "os.key", &key_pem, 0o600);
    load(&CaSource::Files {
        cert_file: cert.clone(),
        key_file: key,
    })
    .unwrap();
    // The same key relabelled `PRIVATE KEY`.
    let relabelled = write_file(
        dir.path(),
        "os-pkcs8.key",
        &key_pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY"),
        0o600,
    );
    load(&CaSource::Files {
        cert_file: cert,
        key_file: relabelled,
    })
    .unwrap();
    // EC PRIVATE KEY (SEC1), the ECDSA P-256 etcd CA of the bundle.
    let etcd_cert = write_file(
        dir.path(),
        "etcd.crt",
        &decode_b64_field(&bundle, &["certs", "etcd", "crt"]),
        0o644,
    );
    let etcd_key = write_file(
        dir.path(),
        "etcd.key",
        &decode_b64_field(&bundle, &["certs", "etcd", "key"]),
        0o600,
    );
    let etcd = load(&CaSource::Files {
        cert_file: etcd_cert,
        key_file: etcd_key,
    })
    .unwrap();
    assert_eq!(
        talos_sso_server::keys::key_kind(etcd.signer().spki()),
        KeyKind::EcdsaP256
    );
    // EC PRIVATE KEY for P-384 and RSA PRIVATE KEY (PKCS#1), made by OpenSSL.
    for (name, kind) in [
        ("p384-ca", KeyKind::EcdsaP384),
        ("rsa-ca", KeyKind::Rsa { bits: 2048 }),
    ] {
        let ca = load(&CaSource::Files {
            cert_file: fixture(&format!("openssl/{name}.crt")),
            key_file: private_copy(dir.path(), &format!("openssl/{name}.key")),
        })
        .unwrap();
        assert_eq!(talos_sso_server::keys::key_kind(ca.signer().spki()), kind);
    }
}

#[test]
fn worker_config_is_refused_for_its_empty_key() {
    let dir = tempfile::tempdir().unwrap();
    let worker = private_copy(dir.path(), "talos/worker-v1.12.yaml");
    let error = load(&CaSource::MachineConfig(worker)).unwrap_err();
    assert_eq!(error.code(), "ca_key_empty");
    assert!(error.to_string().contains("worker"), "{error}");
}

#[test]
fn redacted_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = with_key(
        &read_fixture("talos/controlplane-v1.12.yaml"),
        "LS0tLS1CRUdJTiBFRDI1NTE5",
        "'******'",
    );
    let path = write_file(dir.path(), "redacted.yaml", &yaml, 0o600);
    assert_eq!(code(load(&CaSource::MachineConfig(path))), "ca_key_redacted");
}

#[test]
fn key_of_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = read_fixture("talos/secrets-bundle.yaml");
    let stability = read_fixture("talos/stability-secrets.yaml");
    let cert = write_file(
        dir.path(),
        "a.crt",
        &decode_b64_field(&bundle, &["certs", "os", "crt"]),
        0o644,
    );
    // Same type (Ed25519), different key.
    let other = write_file(
        dir.path(),
        "b.key",
        &decode_b64_field(&stability, &["certs", "os", "key"]),
        0o600,
    );
    assert_eq!(
        code(load(&CaSource::Files {
            cert_file: cert.clone(),
            key_file: other
        })),
        "ca_key_mismatch"
    );
    // Different type (ECDSA key for an Ed25519 certificate).
    let ec = write_file(
        dir.path(),
        "c.key",
        &decode_b64_field(&bundle, &["certs", "etcd", "key"]),
        0o600,
    );
    assert_eq!(
        code(load(&CaSource::Files {
            cert_file: cert,
            key_file: ec
        })),
        "ca_key_mismatch"
    );
    // ECDSA certificate with another ECDSA key.
    let etcd_cert = write_file(
        dir.path(),
        "etcd.crt",
        &decode_b64_field(&bundle, &["certs", "etcd", "crt"]),
        0o644,
    );
    let k8s_key = write_file(
        dir.path(),
        "k8s.key",
        &decode_b64_field(&bundle, &["certs", "k8s", "key"]),
        0o600,
    );
    assert_eq!(
        code(load(&CaSource::Files {
            cert_file: etcd_cert,
            key_file: k8s_key
        })),
        "ca_key_mismatch"
    );
}

#[test]
fn leaf_certificate_is_not_a_ca() {
    // The 2021 talosconfig's client certificate is a real Talos leaf.
    let dir = tempfile::tempdir().unwrap();
    let talosconfig = read_fixture("talos/talosconfig-2021-admin.yaml");
    let crt = decode_b64_field(&talosconfig, &["contexts", "no-roles", "crt"]);
    let key = decode_b64_field(&talosconfig, &["contexts", "no-roles", "key"]);
    let cert = write_file(dir.path(), "leaf.crt", &crt, 0o644);
    let key = write_file(dir.path(), "leaf.key", &key, 0o600);
    assert_eq!(
        code(load(&CaSource::Files {
            cert_file: cert,
            key_file: key
        })),
        "ca_not_a_ca"
    );
}

#[test]
fn expiry_edges_use_the_injected_clock() {
    let dir = tempfile::tempdir().unwrap();
    let source = CaSource::SecretsBundle(private_copy(dir.path(), "talos/secrets-bundle.yaml"));
    let options = CaOptions::default();
    // The bundle's CA: not before 2023-05-25T12:14:42Z, not after 2033-05-22T12:14:42Z.
    let at = |t: OffsetDateTime| CertificateAuthority::load(&source, &options, t);
    assert_eq!(code(at(datetime!(2033-05-22 12:14:43 UTC))), "ca_expired");
    assert_eq!(code(at(datetime!(2023-05-25 12:14:41 UTC))), "ca_not_yet_valid");
    assert_eq!(code(at(datetime!(2033-05-22 12:14:42 UTC))), "loaded");

    let quiet = at(datetime!(2033-02-20 12:14:42 UTC)).unwrap(); // 91 days left
    assert!(quiet.warnings().is_empty(), "{:?}", quiet.warnings());
    let warned = at(datetime!(2033-02-22 12:14:42 UTC)).unwrap(); // 89 days left
    assert!(
        matches!(warned.warnings(), [CaWarning::ExpiresSoon { days_left: 89, .. }]),
        "{:?}",
        warned.warnings()
    );
}

#[test]
fn readable_key_file_is_refused_unless_overridden() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = read_fixture("talos/secrets-bundle.yaml");
    for mode in [0o644, 0o604, 0o660, 0o666] {
        let path = write_file(dir.path(), "bundle.yaml", &bundle, mode);
        assert_eq!(
            code(load(&CaSource::SecretsBundle(path))),
            "ca_key_permissions",
            "mode {mode:o}"
        );
    }
    // Readable by a group that is not the server's own: refused.
    let foreign = write_file(dir.path(), "foreign-group.yaml", &bundle, 0o640);
    std::os::unix::fs::chown(&foreign, None, Some(4242)).unwrap();
    assert_eq!(
        code(load(&CaSource::SecretsBundle(foreign))),
        "ca_key_permissions"
    );
    // Kubernetes mounts Secrets root-owned, 0440, group = the pod's fsGroup
    // (the server's own group): nobody else can read it, so it loads.
    let mounted = write_file(dir.path(), "mounted.yaml", &bundle, 0o440);
    assert_eq!(code(load(&CaSource::SecretsBundle(mounted))), "loaded");
    let path = write_file(
        dir.path(),
        "bundle.yaml",
        &read_fixture("talos/secrets-bundle.yaml"),
        0o644,
    );
    let options = CaOptions {
        allow_insecure_key_permissions: true,
        ..Default::default()
    };
    let ca = CertificateAuthority::load(
        &CaSource::SecretsBundle(path),
        &options,
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    assert!(matches!(
        ca.warnings(),
        [CaWarning::InsecurePermissionsAllowed { mode: 0o644, .. }]
    ));
}

#[test]
fn garbage_is_refused_with_its_own_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cert = fixture("openssl/rsa-ca.crt");
    let cases = [
        ("not pem at all", "ca_not_pem"),
        (
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
            "ca_key_label_unsupported",
        ),
        (
            "-----BEGIN ED25519 PRIVATE KEY-----\nAAAA\n-----END ED25519 PRIVATE KEY-----\n",
            "ca_key_invalid",
        ),
        ("", "ca_key_empty"),
        ("******", "ca_key_redacted"),
    ];
    for (i, (key, expected)) in cases.iter().enumerate() {
        let key = write_file(dir.path(), &format!("k{i}.key"), key, 0o600);
        assert_eq!(
            code(load(&CaSource::Files {
                cert_file: cert.clone(),
                key_file: key
            })),
            *expected,
            "case {i}"
        );
    }
    let key = private_copy(dir.path(), "openssl/rsa-ca.key");
    let bad_cert = write_file(
        dir.path(),
        "bad.crt",
        "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n",
        0o644,
    );
    assert_eq!(
        code(load(&CaSource::Files {
            cert_file: bad_cert,
            key_file: key.clone()
        })),
        "ca_certificate_invalid"
    );
    let yaml = write_file(dir.path(), "x.yaml", "certs: [unclosed", 0o600);
    assert_eq!(code(load(&CaSource::SecretsBundle(yaml))), "ca_yaml_invalid");
    let wrong_kind = write_file(dir.path(), "y.yaml", "machine: {}\n", 0o600);
    assert_eq!(
        code(load(&CaSource::SecretsBundle(wrong_kind))),
        "ca_field_missing"
    );
    let missing = dir.path().join("absent.yaml");
    assert_eq!(code(load(&CaSource::MachineConfig(missing))), "ca_unreadable");
}

#[test]
fn small_rsa_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let result = load(&CaSource::Files {
        cert_file: fixture("openssl/rsa1024-ca.crt"),
        key_file: private_copy(dir.path(), "openssl/rsa1024-ca.key"),
    });
    assert_eq!(code(result), "ca_key_type_unsupported");
}

#[test]
fn accepted_cas_join_the_trust_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let options = CaOptions {
        accepted_cas: vec![fixture("openssl/rsa-ca.crt")],
        ..Default::default()
    };
    let source = CaSource::SecretsBundle(private_copy(dir.path(), "talos/secrets-bundle.yaml"));
    let ca = CertificateAuthority::load(&source, &options, OffsetDateTime::now_utc()).unwrap();
    let bundle = talos_sso_server::ca::parse_certificates(ca.trust_bundle_pem(), "bundle").unwrap();
    assert_eq!(bundle.len(), 2);
    assert_eq!(bundle[0].der, ca.signer().der);
    assert_eq!(
        bundle[1].der,
        talos_sso_server::ca::parse_certificates(&read_fixture("openssl/rsa-ca.crt"), "x").unwrap()[0].der
    );

    // A leaf is not an acceptable CA.
    let talosconfig = read_fixture("talos/talosconfig-2021-admin.yaml");
    let leaf = write_file(
        dir.path(),
        "leaf.crt",
        &decode_b64_field(&talosconfig, &["contexts", "no-roles", "crt"]),
        0o644,
    );
    let options = CaOptions {
        accepted_cas: vec![leaf],
        ..Default::default()
    };
    assert_eq!(
        code(CertificateAuthority::load(
            &source,
            &options,
            OffsetDateTime::now_utc()
        )),
        "ca_not_a_ca"
    );
}

#[test]
fn intermediate_chain_must_lead_to_a_self_signed_root() {
    let now = OffsetDateTime::now_utc();
    let root = talos_sso_tests::material::fresh_ca(NewKeyType::Ed25519);
    let other = talos_sso_tests::material::fresh_ca(NewKeyType::EcdsaP256);
    let inter =
        generate::new_intermediate(&root, NewKeyType::Ed25519, "i", Duration::from_secs(86400), now).unwrap();
    let loaded = CertificateAuthority::from_pem(&inter.cert_pem, &inter.key_pem, "ok", vec![], now).unwrap();
    assert!(loaded.is_intermediate());
    assert_eq!(loaded.root().der, root.signer().der);

    // Intermediate followed by the wrong root.
    let wrong = format!("{}{}", inter.cert.to_pem(), other.signer().to_pem());
    let error = CertificateAuthority::from_pem(&wrong, &inter.key_pem, "wrong", vec![], now).unwrap_err();
    assert_eq!(error.code(), "ca_chain_broken");
    // An intermediate alone is not enough either: the root must be present
    // (a client-only one could not verify apid in the talosconfig).
    let lone = CertificateAuthority::from_pem(&inter.cert.to_pem(), &inter.key_pem, "lone", vec![], now);
    let error = lone.unwrap_err();
    assert_eq!(error.code(), "ca_chain_broken");
    assert!(
        error
            .to_string()
            .contains("CN=i is issued by O=talos, which is not in the file"),
        "{error}"
    );
    // A server-capable CA alone is the root: cluster-CA mode.
    let company_root =
        generate::new_root(NewKeyType::Ed25519, "company", Duration::from_secs(86400), now).unwrap();
    let company =
        CertificateAuthority::from_pem(&company_root.cert_pem, &company_root.key_pem, "c", vec![], now)
            .unwrap();
    assert!(!company.is_intermediate());
    // A self-signed client-only CA alone is for accepted-CA mode.
    let client =
        generate::new_client_ca(NewKeyType::Ed25519, "prod", Duration::from_secs(86400), now).unwrap();
    let error =
        CertificateAuthority::from_pem(&client.cert_pem, &client.key_pem, "client", vec![], now).unwrap_err();
    assert_eq!(error.code(), "ca_client_only_without_talos_ca");
}

fn inspect(args: &[&str]) -> (bool, String) {
    let cli = Cli::try_parse_from(
        std::iter::once("talos-sso-server")
            .chain(["ca", "inspect"])
            .chain(args.iter().copied()),
    )
    .unwrap();
    let mut out = Vec::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = runtime.block_on(run(cli, &mut out));
    let text = String::from_utf8(out).unwrap();
    match result {
        Ok(()) => (true, text),
        Err(e) => (false, format!("{text}{e:#}")),
    }
}

#[test]
fn ca_inspect_prints_facts_or_the_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = private_copy(dir.path(), "talos/secrets-bundle.yaml");
    let (ok, text) = inspect(&["--secrets-bundle", bundle.to_str().unwrap()]);
    assert!(ok, "{text}");
    for expected in [
        "subject:     O=talos",
        "key type:    Ed25519",
        "not after:   2033-05-22T12:14:42Z",
        "days left:",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // sha256 of the certificate DER, as `openssl x509 -fingerprint -sha256` prints it.
    assert!(
        text.contains("3481473438531edaf8c210ce320d234bd94f6b4cecd29d5cfb2d4715d66243a2"),
        "{text}"
    );

    let worker = private_copy(dir.path(), "talos/worker-v1.12.yaml");
    let (ok, text) = inspect(&["--machine-config", worker.to_str().unwrap()]);
    assert!(!ok);
    assert!(text.contains("ca_key_empty"), "{text}");

    let cert = fixture("openssl/p384-ca.crt");
    let key = private_copy(dir.path(), "openssl/p384-ca.key");
    let (ok, text) = inspect(&[
        "--cert-file",
        cert.to_str().unwrap(),
        "--key-file",
        key.to_str().unwrap(),
    ]);
    assert!(ok && text.contains("ECDSA P-384"), "{text}");
}

#[test]
fn a_key_file_with_ec_parameters_first_loads() {
    // `openssl ecparam -name secp384r1 -genkey` writes EC PARAMETERS, then the key.
    let dir = tempfile::tempdir().unwrap();
    let key = read_fixture("openssl/p384-ca.key");
    let with_parameters =
        format!("-----BEGIN EC PARAMETERS-----\nBgUrgQQAIg==\n-----END EC PARAMETERS-----\n{key}");
    let key_file = write_file(dir.path(), "p384.key", &with_parameters, 0o600);
    let ca = load(&CaSource::Files {
        cert_file: fixture("openssl/p384-ca.crt"),
        key_file,
    })
    .unwrap();
    assert_eq!(
        talos_sso_server::keys::key_kind(ca.signer().spki()),
        KeyKind::EcdsaP384
    );
}
