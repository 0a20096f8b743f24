//! What no mode lets through: an intermediate that can vouch for servers,
//! a client-only CA among the `accepted_cas` of the talosconfig `ca`, a
//! client CA that may sign other CAs, and a talosconfig holding a key in
//! any of its contexts. Each is refused with its code.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use der::Encode;
use ring::rand::SystemRandom;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::ca::{CaError, CaOptions, CertificateAuthority};
use talos_sso_server::config::{CaSource, TalosCaSource};
use talos_sso_server::keys::Signer;
use talos_sso_server::x509::{self, CertificateTemplate, ParsedCertificate, oid};
use talos_sso_tests::material::write_file;
use time::OffsetDateTime;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages};

const DAY: Duration = Duration::from_secs(86400);

fn code(result: Result<CertificateAuthority, CaError>) -> &'static str {
    match result {
        Ok(_) => "loaded",
        Err(e) => e.code(),
    }
}

/// A CA certificate for `key`, signed by `issuer` (or by itself), with the
/// extended key usages and path length given: what other tools can make.
fn ca_certificate(
    key: &dyn Signer,
    common_name: &str,
    issuer: Option<(&ParsedCertificate, &dyn Signer)>,
    extended: Option<Vec<der::oid::ObjectIdentifier>>,
    path_len: Option<u8>,
) -> String {
    let now = OffsetDateTime::now_utc();
    let subject = x509::encode_name(&[(oid::COMMON_NAME, common_name)]).unwrap();
    let spki = key.public_key_info().unwrap().to_der().unwrap();
    let mut extensions = vec![
        x509::extension(
            oid::KEY_USAGE,
            true,
            &KeyUsage(KeyUsages::KeyCertSign | KeyUsages::DigitalSignature),
        )
        .unwrap(),
        x509::extension(
            oid::BASIC_CONSTRAINTS,
            true,
            &BasicConstraints {
                ca: true,
                path_len_constraint: path_len,
            },
        )
        .unwrap(),
    ];
    if let Some(extended) = extended {
        extensions.push(
            x509::extension(
                oid::EXT_KEY_USAGE,
                false,
                &x509_cert::ext::pkix::ExtendedKeyUsage(extended),
            )
            .unwrap(),
        );
    }
    let issuer_name = issuer.map_or(subject.clone(), |(cert, _)| cert.raw_subject.clone());
    let serial = x509::random_serial(&SystemRandom::new()).unwrap();
    let template = CertificateTemplate {
        serial: &serial,
        issuer: &issuer_name,
        subject: &subject,
        subject_public_key_info: &spki,
        not_before: now - time::Duration::hours(1),
        not_after: now + time::Duration::days(30),
        extensions,
    };
    let signer = issuer.map_or(key, |(_, signer)| signer);
    x509::pem_encode("CERTIFICATE", &x509::sign_certificate(&template, signer).unwrap())
}

#[test]
fn what_could_vouch_for_a_server_or_sign_cas_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rng = SystemRandom::new();
    let now = OffsetDateTime::now_utc();
    let talos = generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        365 * DAY,
        now - time::Duration::hours(2),
    )
    .unwrap();
    let talos_file = write_file(dir.path(), "talos-ca.crt", &talos.cert_pem, 0o644);
    let talos_ca =
        CertificateAuthority::from_pem(&talos.cert_pem, &talos.key_pem, "talos", Vec::new(), now).unwrap();
    let load = |cert_pem: &str, key_pem: &str, name: &str, options: CaOptions| {
        let source = CaSource::Files {
            cert_file: write_file(dir.path(), &format!("{name}.crt"), cert_pem, 0o644),
            key_file: write_file(dir.path(), &format!("{name}.key"), key_pem, 0o600),
        };
        CertificateAuthority::load(&source, &options, now)
    };

    // An intermediate with no extended key usage (as `openssl ca` makes
    // one by default) could sign apid certificates under machine.ca.
    let key = generate::generate_key(NewKeyType::Ed25519, &rng).unwrap();
    let wide = ca_certificate(
        &key.key,
        "wide intermediate",
        Some((talos_ca.signer(), talos_ca.key())),
        None,
        Some(0),
    );
    let chain = format!("{wide}{}", talos.cert_pem);
    assert_eq!(
        code(load(&chain, &key.pem, "wide", CaOptions::default())),
        "ca_intermediate_not_client_only"
    );
    // The same, limited to clientAuth, is intermediate mode.
    let narrow = ca_certificate(
        &key.key,
        "narrow intermediate",
        Some((talos_ca.signer(), talos_ca.key())),
        Some(vec![oid::KP_CLIENT_AUTH]),
        Some(0),
    );
    let chain = format!("{narrow}{}", talos.cert_pem);
    assert_eq!(
        code(load(&chain, &key.pem, "narrow", CaOptions::default())),
        "loaded"
    );

    // A client CA that may sign other CAs (no path length).
    let unbounded = ca_certificate(&key.key, "client CA", None, Some(vec![oid::KP_CLIENT_AUTH]), None);
    let accepted_mode = || CaOptions {
        talos_ca: Some(TalosCaSource::CertFile(talos_file.clone())),
        ..Default::default()
    };
    assert_eq!(
        code(load(&unbounded, &key.pem, "unbounded", accepted_mode())),
        "ca_path_length_not_zero"
    );

    // A client-only CA among accepted_cas: in any mode, the talosconfig
    // `ca` verifies apid.
    let client = generate::new_client_ca(NewKeyType::Ed25519, "prod", 30 * DAY, now).unwrap();
    let client_file = write_file(dir.path(), "client-only.crt", &client.cert_pem, 0o644);
    let with_client_only = |options: CaOptions| CaOptions {
        accepted_cas: vec![client_file.clone()],
        ..options
    };
    assert_eq!(
        code(load(
            &client.cert_pem,
            &client.key_pem,
            "client",
            with_client_only(accepted_mode())
        )),
        "accepted_ca_client_only"
    );
    assert_eq!(
        code(load(
            &talos.cert_pem,
            &talos.key_pem,
            "cluster",
            with_client_only(CaOptions::default())
        )),
        "accepted_ca_client_only"
    );
    assert_eq!(
        code(load(
            &client.cert_pem,
            &client.key_pem,
            "client-ok",
            accepted_mode()
        )),
        "loaded"
    );

    // A talosconfig whose current context holds no key, but another does.
    let talosconfig = format!(
        "context: reader\ncontexts:\n  reader:\n    ca: {ca}\n  admin:\n    ca: {ca}\n    crt: {ca}\n    key: {key}\n",
        ca = STANDARD.encode(&talos.cert_pem),
        key = STANDARD.encode(&key.pem),
    );
    let talosconfig = write_file(dir.path(), "talosconfig", &talosconfig, 0o600);
    let options = CaOptions {
        talos_ca: Some(TalosCaSource::Talosconfig {
            path: talosconfig,
            context: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        code(load(&client.cert_pem, &client.key_pem, "client-tc", options)),
        "talos_ca_client_key_present"
    );
    // A talosconfig with no key but another secret (basic auth).
    let with_password = format!(
        "context: reader\ncontexts:\n  reader:\n    ca: {}\n    auth: {{basic: {{username: u, password: p}}}}\n",
        STANDARD.encode(&talos.cert_pem)
    );
    let options = CaOptions {
        talos_ca: Some(TalosCaSource::Talosconfig {
            path: write_file(dir.path(), "talosconfig-password", &with_password, 0o600),
            context: None,
        }),
        ..Default::default()
    };
    assert_eq!(
        code(load(&client.cert_pem, &client.key_pem, "client-pw", options)),
        "talos_ca_secret_present"
    );
}
