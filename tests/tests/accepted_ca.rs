//! Accepted-CA mode judged by verifiers nobody here wrote: OpenSSL and Go's
//! standard library (`go_tls`, the code Talos runs). A client-only CA has
//! its profile; what it signs passes as a client and never as a server;
//! apid admits its leaves while Talos lists it in `machine.acceptedCAs`
//! and refuses them once it does not; a server certificate signed with its
//! (stolen) key does not fool talosctl; and the same with the key inside a
//! PKCS#11 token, the CA made by the real `talos-sso-server` binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso::key::ClientKey;
use talos_sso_server::ca::generate::{self, NewCa, NewKeyType};
use talos_sso_server::ca::{CaOptions, CertificateAuthority};
use talos_sso_server::certificate::{self, LeafRequest, SignedLeaf};
use talos_sso_server::config::{CaSource, DEFAULT_CLOCK_SKEW, Pkcs11Source, TalosCaSource};
use talos_sso_server::x509::{self, CertificateTemplate, ParsedCertificate, oid};
use talos_sso_tests::go_tls::{self, Apid, Usage};
use talos_sso_tests::material::{self, write_file};
use talos_sso_tests::softhsm::{SoftHsm, TokenKey};
use talos_sso_tests::{openssl, talos_checker};
use time::OffsetDateTime;
use x509_cert::ext::pkix::{KeyUsage, KeyUsages};

const ROLES: [&str; 2] = ["os:operator", "os:etcd:backup"];

/// A Talos cluster's CA (what `machine.ca` holds) and one of its nodes'
/// serving certificate, which talosctl verifies against it.
struct TalosCluster {
    ca: CertificateAuthority,
    /// The CA certificate alone, as `talos_ca.cert_file` names it.
    cert_file: PathBuf,
    node_cert_pem: String,
    node_key_pem: String,
}

impl TalosCluster {
    fn new(dir: &Path) -> Self {
        let now = OffsetDateTime::now_utc();
        let root = generate::new_root(NewKeyType::Ed25519, "talos", Duration::from_secs(86400), now).unwrap();
        let ca =
            CertificateAuthority::from_pem(&root.cert_pem, &root.key_pem, "talos", Vec::new(), now).unwrap();
        let (node_cert_pem, node_key_pem) = material::serving_certificate(ca.signer(), ca.key());
        Self {
            cert_file: write_file(dir, "talos-ca.crt", &root.cert_pem, 0o644),
            ca,
            node_cert_pem,
            node_key_pem,
        }
    }

    fn ca_pem(&self) -> String {
        self.ca.signer().to_pem()
    }

    /// `machine.ca` plus `machine.acceptedCAs` = [`accepted`].
    fn pool_with(&self, accepted: &CertificateAuthority) -> String {
        format!("{}{}", self.ca_pem(), accepted.signer().to_pem())
    }

    /// The apid of a node whose client pool is `client_ca_pem`.
    fn apid(&self, client_ca_pem: &str) -> Apid {
        Apid::start(&self.node_cert_pem, &self.node_key_pem, client_ca_pem)
    }
}

fn new_client_ca(key_type: NewKeyType) -> NewCa {
    generate::new_client_ca(
        key_type,
        "prod",
        Duration::from_secs(30 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap()
}

fn accepted_options(talos: &TalosCluster) -> CaOptions {
    CaOptions {
        talos_ca: Some(TalosCaSource::CertFile(talos.cert_file.clone())),
        ..Default::default()
    }
}

/// A cluster's CA in accepted-CA mode: a new client-only CA in files, loaded
/// with `talos_ca` naming `talos`'s CA certificate.
fn accepted_ca(dir: &Path, talos: &TalosCluster, key_type: NewKeyType) -> CertificateAuthority {
    let new = new_client_ca(key_type);
    let name = format!("client-ca-{key_type:?}");
    let source = CaSource::Files {
        cert_file: write_file(dir, &format!("{name}.crt"), &new.cert_pem, 0o644),
        key_file: write_file(dir, &format!("{name}.key"), &new.key_pem, 0o600),
    };
    let ca =
        CertificateAuthority::load(&source, &accepted_options(talos), OffsetDateTime::now_utc()).unwrap();
    assert_eq!(ca.mode(), talos_sso_server::ca::TrustMode::AcceptedCa);
    assert_eq!(
        ca.trust_bundle_pem(),
        talos.ca_pem(),
        "the talosconfig trusts the Talos CA alone"
    );
    ca
}

/// A five-minute leaf for alice with [`ROLES`], and her key.
fn issue(ca: &CertificateAuthority) -> (SignedLeaf, ClientKey) {
    let client = ClientKey::generate().unwrap();
    let roles: Vec<String> = ROLES.iter().map(|r| r.to_string()).collect();
    let request = LeafRequest {
        username: "alice@example.com",
        roles: &roles,
        ttl: Duration::from_secs(300),
        clock_skew: DEFAULT_CLOCK_SKEW,
    };
    let issued = certificate::issue(
        ca,
        client.csr_pem().unwrap().as_bytes(),
        &request,
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    (issued, client)
}

/// The client-only profile, read by our parser and by OpenSSL: self-signed,
/// basicConstraints critical CA pathLen 0, keyUsage critical keyCertSign +
/// cRLSign, extended key usage clientAuth only, a subject key id, nothing
/// else; a subject naming talos-sso and the cluster.
fn assert_client_only_profile(pem: &str, cluster: &str) {
    let der = x509::pem_blocks(pem).unwrap().remove(0).1;
    let cert = ParsedCertificate::from_der(&der).unwrap();
    assert!(cert.is_self_issued());
    cert.verify_signed_by(cert.spki()).expect("self-signed");
    let extensions: Vec<_> = cert
        .tbs()
        .extensions()
        .unwrap()
        .iter()
        .map(|e| (e.extn_id, e.critical))
        .collect();
    let mut expected = vec![
        (oid::KEY_USAGE, true),
        (oid::EXT_KEY_USAGE, false),
        (oid::BASIC_CONSTRAINTS, true),
        (oid::SUBJECT_KEY_ID, false),
    ];
    let mut found = extensions.clone();
    expected.sort();
    found.sort();
    assert_eq!(found, expected, "{extensions:?}");
    let constraints = cert.basic_constraints().unwrap();
    assert!(constraints.ca);
    assert_eq!(constraints.path_len_constraint, Some(0));
    assert_eq!(
        cert.key_usage().unwrap(),
        KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign)
    );
    assert_eq!(cert.ext_key_usage().unwrap(), vec![oid::KP_CLIENT_AUTH]);
    assert_eq!(cert.subject_organizations(), ["talos-sso"]);

    let text = openssl::certificate_text(pem);
    // The day it was made: its not_before is backdated five minutes.
    let today = (cert.not_before() + time::Duration::minutes(5)).date();
    let subject = format!(
        "Subject: O = talos-sso, OU = {cluster}, CN = talos-sso client CA {:04}-{:02}-{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    assert!(text.contains(&subject), "{text}");
    assert!(text.contains(&subject.replace("Subject:", "Issuer:")), "{text}");
    let after = |heading: &str| {
        let mut lines = text.lines().skip_while(|l| !l.contains(heading));
        let heading = lines.next().unwrap_or_else(|| panic!("no {heading}: {text}"));
        (
            heading.trim().to_owned(),
            lines.next().unwrap_or("").trim().to_owned(),
        )
    };
    assert_eq!(
        after("X509v3 Basic Constraints"),
        (
            "X509v3 Basic Constraints: critical".to_owned(),
            "CA:TRUE, pathlen:0".to_owned()
        )
    );
    assert_eq!(
        after("X509v3 Key Usage"),
        (
            "X509v3 Key Usage: critical".to_owned(),
            "Certificate Sign, CRL Sign".to_owned()
        )
    );
    assert_eq!(
        after("X509v3 Extended Key Usage"),
        (
            "X509v3 Extended Key Usage:".to_owned(),
            "TLS Web Client Authentication".to_owned()
        )
    );
}

#[test]
fn a_client_ca_is_self_signed_and_limited_to_client_authentication() {
    for key_type in [NewKeyType::Ed25519, NewKeyType::EcdsaP256, NewKeyType::EcdsaP384] {
        let ca = new_client_ca(key_type);
        assert_client_only_profile(&ca.cert_pem, "prod");
    }
}

#[test]
fn what_a_client_ca_signs_passes_as_a_client_and_never_as_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let talos = TalosCluster::new(dir.path());
    let ca = accepted_ca(dir.path(), &talos, NewKeyType::EcdsaP256);
    let client_ca_pem = ca.signer().to_pem();
    let (issued, _) = issue(&ca);
    let (impostor_pem, _) = material::serving_certificate(ca.signer(), ca.key());

    openssl::verify_client_certificate(&client_ca_pem, &issued.leaf.to_pem(), "").expect("OpenSSL: a client");
    go_tls::verify(&client_ca_pem, &issued.chain_pem, Usage::Client).expect("Go: a client");

    let refused = openssl::verify_server_certificate(&client_ca_pem, &impostor_pem, "").unwrap_err();
    assert!(
        refused.contains("at 1 depth lookup: unsuitable certificate purpose"),
        "{refused}"
    );
    let refused = go_tls::verify(&client_ca_pem, &impostor_pem, Usage::Server).unwrap_err();
    assert!(
        refused.contains("x509: certificate specifies an incompatible key usage"),
        "{refused}"
    );

    // The same server certificate, signed by the Talos CA, passes both: the
    // refusals above are the client CA's doing.
    openssl::verify_server_certificate(&talos.ca_pem(), &talos.node_cert_pem, "").expect("OpenSSL: a node");
    go_tls::verify(&talos.ca_pem(), &talos.node_cert_pem, Usage::Server).expect("Go: a node");
}

#[test]
fn apid_admits_the_leaves_while_talos_lists_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let talos = TalosCluster::new(dir.path());
    for key_type in [NewKeyType::Ed25519, NewKeyType::EcdsaP256] {
        let ca = accepted_ca(dir.path(), &talos, key_type);
        let (issued, client) = issue(&ca);
        let key_pem = client.private_key_pem();
        let listed = talos.pool_with(&ca);

        let apid = talos.apid(&listed);
        let answer = go_tls::talosctl(apid.addr(), ca.trust_bundle_pem(), &issued.chain_pem, &key_pem)
            .unwrap_or_else(|e| panic!("{key_type:?}: {e}"));
        assert_eq!(answer, ROLES.join(","));
        let logged = apid.next_log_line().unwrap();
        assert!(logged.starts_with("admitted: "), "{logged}");
        let accepted = talos_checker::handshake(&listed, &issued.chain_pem, &key_pem).unwrap();
        assert_eq!(accepted.roles, ROLES);

        // Removed from machine.acceptedCAs: Go's client finds no CA it
        // names among those apid asks for and sends no certificate.
        let apid = talos.apid(&talos.ca_pem());
        let refused =
            go_tls::talosctl(apid.addr(), ca.trust_bundle_pem(), &issued.chain_pem, &key_pem).unwrap_err();
        assert!(refused.contains("reading apid's answer"), "{refused}");
        let logged = apid.next_log_line().unwrap();
        assert!(
            logged.contains("refused: tls: client didn't provide a certificate"),
            "{logged}"
        );
        let refused = talos_checker::handshake(&talos.ca_pem(), &issued.chain_pem, &key_pem).unwrap_err();
        assert!(refused.contains("sent no certificate"), "{refused}");
    }
}

/// apid's own check on top of Go's chain verification: a leaf of the
/// client CA whose extended key usage is [serverAuth, clientAuth] chains
/// fine for a client, and is still refused.
#[test]
fn apid_refuses_a_leaf_whose_usage_is_not_exactly_client_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let talos = TalosCluster::new(dir.path());
    let ca = accepted_ca(dir.path(), &talos, NewKeyType::Ed25519);
    let client = ClientKey::generate().unwrap();
    let spki = der::Encode::to_der(&client.public_key_info().unwrap()).unwrap();
    let leaf_pem = leaf_with_usages(&ca, &spki, vec![oid::KP_SERVER_AUTH, oid::KP_CLIENT_AUTH]);
    go_tls::verify(&ca.signer().to_pem(), &leaf_pem, Usage::Client).expect("chains for a client");
    let apid = talos.apid(&talos.pool_with(&ca));
    let refused =
        go_tls::talosctl(apid.addr(), &talos.ca_pem(), &leaf_pem, &client.private_key_pem()).unwrap_err();
    assert!(refused.contains("reading apid's answer"), "{refused}");
    let logged = apid.next_log_line().unwrap();
    assert!(
        logged.contains("extended key usage must be exactly [ClientAuth]"),
        "{logged}"
    );
}

/// A leaf for `spki_der` signed by `ca` with the given extended key usages.
fn leaf_with_usages(
    ca: &CertificateAuthority,
    spki_der: &[u8],
    usages: Vec<der::oid::ObjectIdentifier>,
) -> String {
    let now = OffsetDateTime::now_utc();
    let subject =
        x509::encode_name(&[(oid::ORGANIZATION, "os:admin"), (oid::COMMON_NAME, "mallory")]).unwrap();
    let template = CertificateTemplate {
        serial: &[7, 7, 7],
        issuer: &ca.signer().raw_subject,
        subject: &subject,
        subject_public_key_info: spki_der,
        not_before: now - time::Duration::minutes(5),
        not_after: now + time::Duration::minutes(5),
        extensions: vec![
            x509::extension(
                oid::EXT_KEY_USAGE,
                false,
                &x509_cert::ext::pkix::ExtendedKeyUsage(usages),
            )
            .unwrap(),
        ],
    };
    let der = x509::sign_certificate(&template, ca.key()).unwrap();
    x509::pem_encode("CERTIFICATE", &der)
}

#[test]
fn a_stolen_client_ca_key_cannot_impersonate_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let talos = TalosCluster::new(dir.path());
    let ca = accepted_ca(dir.path(), &talos, NewKeyType::EcdsaP256);
    let (issued, client) = issue(&ca);
    let key_pem = client.private_key_pem();
    // A client that trusts the client CA as well (a talosconfig with the
    // whole pool as its `ca`): still no server of the client CA's passes.
    let pool = talos.pool_with(&ca);

    let (impostor_cert, impostor_key) = material::serving_certificate(ca.signer(), ca.key());
    let impostor = Apid::start(&impostor_cert, &impostor_key, &pool);
    let refused = go_tls::talosctl(impostor.addr(), &pool, &issued.chain_pem, &key_pem).unwrap_err();
    assert!(
        refused.contains("x509: certificate specifies an incompatible key usage"),
        "{refused}"
    );
    let logged = impostor.next_log_line().unwrap();
    assert!(logged.starts_with("refused: "), "{logged}");

    let node = talos.apid(&pool);
    let answer = go_tls::talosctl(node.addr(), &pool, &issued.chain_pem, &key_pem).unwrap();
    assert_eq!(answer, ROLES.join(","));
}

/// `talos-sso-server ca client-ca-for-token`, the real binary, within a minute.
async fn client_ca_for_token(token: &Pkcs11Source, generate: &str, out_cert: &Path) -> String {
    let binary = talos_sso_tests::faults::server_binary().expect("the server binary");
    let module = token.module.display().to_string();
    let pin = token.pin_file.display().to_string();
    let out = out_cert.display().to_string();
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(binary)
            .args(["ca", "client-ca-for-token", "--cluster", "prod"])
            .args(["--token-module", &module, "--token-label", &token.token_label])
            .args(["--token-key-label", &token.key_label, "--token-pin-file", &pin])
            .args(["--generate", generate, "--out-cert", &out])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("done within a minute")
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    text
}

#[tokio::test]
#[allow(clippy::await_holding_lock)] // one SoftHSM test at a time, on purpose
async fn a_client_ca_whose_key_is_in_a_token_signs_leaves_apid_admits() {
    let hsm = SoftHsm::exclusive();
    let dir = tempfile::tempdir().unwrap();
    let talos = TalosCluster::new(dir.path());
    for (key, generate) in [(TokenKey::Ed25519, "ed25519"), (TokenKey::EcdsaP256, "p256")] {
        // A token with another key on it: the binary makes the CA's.
        let token = hsm.token(dir.path(), key, "other");
        let source = Pkcs11Source {
            key_label: "talos-sso-client-ca".into(),
            ..token.source.clone()
        };
        let cert_file = dir.path().join(format!("{}.crt", token.label));
        let said = client_ca_for_token(&source, generate, &cert_file).await;
        assert!(said.contains(&format!("token `{}`", token.label)), "{said}");
        let cert_pem = std::fs::read_to_string(&cert_file).unwrap();
        assert_client_only_profile(&cert_pem, "prod");

        let ca = CertificateAuthority::load(
            &CaSource::Pkcs11 {
                cert_file,
                pkcs11: source,
            },
            &accepted_options(&talos),
            OffsetDateTime::now_utc(),
        )
        .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert_eq!(ca.mode(), talos_sso_server::ca::TrustMode::AcceptedCa);
        assert!(ca.key_location().is_some(), "the key is in the token");
        assert_eq!(ca.trust_bundle_pem(), talos.ca_pem());
        let (issued, client) = issue(&ca);
        let apid = talos.apid(&talos.pool_with(&ca));
        let answer = go_tls::talosctl(
            apid.addr(),
            ca.trust_bundle_pem(),
            &issued.chain_pem,
            &client.private_key_pem(),
        )
        .unwrap_or_else(|e| panic!("{key:?}: {e}"));
        assert_eq!(answer, ROLES.join(","));
        let (impostor_pem, _) = material::serving_certificate(ca.signer(), ca.key());
        go_tls::verify(&ca.signer().to_pem(), &impostor_pem, Usage::Server).unwrap_err();
    }
}
