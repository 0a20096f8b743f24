//! Throwaway CA material for tests: fresh CAs of each key type, the fixtures
//! copied from Talos, files written with the permissions the server
//! demands of key files, and serving certificates for 127.0.0.1.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::ca::{CaOptions, CertificateAuthority};
use talos_sso_server::config::CaSource;
use talos_sso_server::keys::Signer;
use talos_sso_server::x509::{self, CertificateTemplate, ParsedCertificate, oid};
use time::OffsetDateTime;

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

pub fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).expect("read fixture")
}

/// Write `contents` to `dir/name` with `mode` and return the path.
pub fn write_file(dir: &Path, name: &str, contents: &str, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

/// Copy a fixture into `dir` as a private (0600) file, as an operator would
/// keep a CA key.
pub fn private_copy(dir: &Path, fixture_name: &str) -> PathBuf {
    let name = Path::new(fixture_name)
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    write_file(dir, &name, &read_fixture(fixture_name), 0o600)
}

/// A fresh self-signed Talos-style CA, loaded.
pub fn fresh_ca(key_type: NewKeyType) -> CertificateAuthority {
    let now = OffsetDateTime::now_utc();
    let ca = generate::new_root(key_type, "talos", Duration::from_secs(3650 * 86400), now).expect("new CA");
    CertificateAuthority::from_pem(&ca.cert_pem, &ca.key_pem, "fresh CA", Vec::new(), now).expect("load CA")
}

/// Load a CA source with default options at the real time.
pub fn load(source: &CaSource) -> Result<CertificateAuthority, talos_sso_server::ca::CaError> {
    CertificateAuthority::load(source, &CaOptions::default(), OffsetDateTime::now_utc())
}

/// A serving certificate for 127.0.0.1 (extended key usage serverAuth, an
/// ECDSA P-256 key) signed by `issuer` with `issuer_key`, valid for an
/// hour: what a test server or a Talos node presents, or, signed by a key
/// that should not vouch for servers, what an impostor would. Returns (certificate PEM,
/// key PEM).
pub fn serving_certificate(issuer: &ParsedCertificate, issuer_key: &dyn Signer) -> (String, String) {
    let now = OffsetDateTime::now_utc();
    let rng = ring::rand::SystemRandom::new();
    let key = generate::generate_key(NewKeyType::EcdsaP256, &rng).expect("key");
    let spki = der::Encode::to_der(&key.key.public_key_info().expect("spki")).expect("spki der");
    let subject = x509::encode_name(&[(oid::COMMON_NAME, "localhost")]).expect("name");
    let san = x509_cert::ext::pkix::SubjectAltName(vec![x509_cert::ext::pkix::name::GeneralName::IpAddress(
        der::asn1::OctetString::new(vec![127, 0, 0, 1]).expect("ip"),
    )]);
    let serial = x509::random_serial(&rng).expect("serial");
    let template = CertificateTemplate {
        serial: &serial,
        issuer: &issuer.raw_subject,
        subject: &subject,
        subject_public_key_info: &spki,
        not_before: now - time::Duration::minutes(5),
        not_after: now + time::Duration::hours(1),
        extensions: vec![
            x509::extension(oid::SUBJECT_ALT_NAME, false, &san).expect("san"),
            x509::extension(
                oid::EXT_KEY_USAGE,
                false,
                &x509_cert::ext::pkix::ExtendedKeyUsage(vec![oid::KP_SERVER_AUTH]),
            )
            .expect("eku"),
        ],
    };
    let der = x509::sign_certificate(&template, issuer_key).expect("sign");
    (x509::pem_encode("CERTIFICATE", &der), key.pem)
}
