//! A second opinion from OpenSSL 3 (`openssl verify`, `openssl pkey`),
//! run as a separate process on files in a temporary directory.

use std::path::Path;
use std::process::Command;

fn write(dir: &Path, name: &str, contents: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("write temp file");
    path
}

/// `openssl verify -purpose sslclient` of a leaf, with `chain_pem` as
/// untrusted intermediates (may be empty). Returns OpenSSL's output on failure.
pub fn verify_client_certificate(ca_pem: &str, leaf_pem: &str, chain_pem: &str) -> Result<(), String> {
    verify_for("sslclient", ca_pem, leaf_pem, chain_pem)
}

/// `openssl verify -purpose sslserver`: could the leaf serve TLS (a Talos
/// node's apid) to a client trusting `ca_pem`?
pub fn verify_server_certificate(ca_pem: &str, leaf_pem: &str, chain_pem: &str) -> Result<(), String> {
    verify_for("sslserver", ca_pem, leaf_pem, chain_pem)
}

fn verify_for(purpose: &str, ca_pem: &str, leaf_pem: &str, chain_pem: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = write(dir.path(), "ca.pem", ca_pem);
    let leaf = write(dir.path(), "leaf.pem", leaf_pem);
    let mut command = Command::new("openssl");
    command
        .arg("verify")
        .arg("-purpose")
        .arg(purpose)
        .arg("-CAfile")
        .arg(&ca);
    if !chain_pem.is_empty() {
        command
            .arg("-untrusted")
            .arg(write(dir.path(), "chain.pem", chain_pem));
    }
    let output = command
        .arg(&leaf)
        .output()
        .expect("run openssl (is it installed?)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() && text.contains(": OK") {
        Ok(())
    } else {
        Err(text)
    }
}

/// Ask OpenSSL to read a private key; returns its text form on success.
pub fn read_private_key(key_pem: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = write(dir.path(), "key.pem", key_pem);
    let output = Command::new("openssl")
        .args(["pkey", "-noout", "-text", "-in"])
        .arg(&key)
        .output()
        .expect("run openssl (is it installed?)");
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// `openssl x509 -text` of a certificate.
pub fn certificate_text(pem: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "cert.pem", pem);
    let output = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&path)
        .output()
        .expect("run openssl (is it installed?)");
    String::from_utf8_lossy(&output.stdout).into_owned()
}
