//! The client's key and CSR, as Talos, OpenSSL and the server read them.

use talos_sso::key::ClientKey;
use talos_sso_server::certificate;
use talos_sso_tests::openssl;

#[test]
fn openssl_reads_the_key_after_relabelling_and_refuses_the_talos_label() {
    let key = ClientKey::generate().unwrap();
    let pem = key.private_key_pem();
    // OpenSSL 3 does not know Talos's label: a known fact, kept as a check that
    // we really write what Talos writes.
    assert!(openssl::read_private_key(&pem).is_err());
    let text = openssl::read_private_key(&pem.replace("ED25519 PRIVATE KEY", "PRIVATE KEY")).unwrap();
    assert!(text.contains("ED25519 Private-Key"), "{text}");
}

#[test]
fn the_server_accepts_the_client_csr_and_takes_its_key() {
    let key = ClientKey::generate().unwrap();
    let spki = certificate::verify_csr(key.csr_pem().unwrap().as_bytes()).unwrap();
    assert_eq!(spki, key.public_key_info().unwrap());
    assert!(!key.csr_pem().unwrap().contains("PRIVATE"));
}
