//! `ca_material`: the CA loader (`CertificateAuthority::load`) from each
//! source kind, through the files it reads in production.
//!
//! Input: one byte choosing the source (`f` PEM files, `b` secrets bundle,
//! `m` machine config; others by their value), then NUL-separated parts:
//! for PEM files the certificate file, the key file and an accepted CA
//! file; for the others the document and an accepted CA file. An empty
//! accepted CA part means none. The files are written (mode 0600) into a
//! directory of this process's own.
//!
//! Properties: nothing panics; a CA that loads is a CA, valid now, whose
//! key signs leaves that verify with its certificate, and whose trust
//! bundle reads back as certificates.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use talos_sso_server::ca::{CaOptions, CertificateAuthority, parse_certificates};
use talos_sso_server::certificate::{LeafRequest, sign_leaf};
use talos_sso_server::config::CaSource;

fn directory() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("talos-sso-fuzz-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        dir
    })
}

fn write(name: &str, content: &[u8]) -> PathBuf {
    let path = directory().join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.write_all(content)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let parts = crate::input::parts(rest, 3);
    let kind = match mode {
        b'f' => 0,
        b'b' => 1,
        b'm' => 2,
        other => other % 3,
    };
    let (source, accepted) = match kind {
        0 => (
            CaSource::Files {
                cert_file: write("ca.crt", parts[0]),
                key_file: write("ca.key", parts[1]),
            },
            parts[2],
        ),
        1 => (CaSource::SecretsBundle(write("secrets.yaml", parts[0])), parts[1]),
        _ => (
            CaSource::MachineConfig(write("controlplane.yaml", parts[0])),
            parts[1],
        ),
    };
    let options = CaOptions {
        accepted_cas: if accepted.is_empty() {
            Vec::new()
        } else {
            vec![write("accepted.crt", accepted)]
        },
        allow_insecure_key_permissions: false,
        talos_ca: None,
    };
    let now = crate::now();
    let Ok(ca) = CertificateAuthority::load(&source, &options, now) else {
        return;
    };

    let signer = ca.signer();
    assert!(
        signer.basic_constraints().is_some_and(|bc| bc.ca),
        "a certificate without CA:TRUE was loaded as a CA"
    );
    assert!(
        signer.not_before() <= now && now < signer.not_after(),
        "a CA not valid now was loaded"
    );
    let _ = ca.summary(now);
    let bundle = ca.trust_bundle_pem();
    let trusted = parse_certificates(bundle, "trust bundle")
        .unwrap_or_else(|e| panic!("the trust bundle does not read back: {e}"));
    assert_eq!(
        trusted[0].der,
        ca.root().der,
        "the trust bundle does not start with the root"
    );

    // The key is the certificate's: what it signs verifies with the certificate.
    let roles = ["os:reader".to_owned()];
    let request = LeafRequest {
        username: "alice@example.com",
        roles: &roles,
        ttl: Duration::from_secs(300),
        clock_skew: Duration::from_secs(300),
    };
    let leaf = sign_leaf(&ca, signer.spki(), &request, now)
        .unwrap_or_else(|e| panic!("a loaded CA cannot sign: {e}"));
    leaf.leaf
        .verify_signed_by(signer.spki())
        .unwrap_or_else(|e| panic!("a leaf of the loaded CA does not verify with it: {e}"));
    assert_eq!(leaf.leaf.raw_issuer, signer.raw_subject);
}
