//! The gateway's two TLS configurations: the listener's (its serving
//! certificate; client certificates required, and only those of the
//! cluster's gateway CA), and the upstream's (apid verified with what a
//! talosconfig would verify it with; the gateway's own `os:impersonator`
//! certificate as the client's). Both speak HTTP/2 only.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::client::ClientConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ServerConfig, WebPkiClientVerifier};
use tokio_rustls::rustls::{self, RootCertStore};

use crate::ca::CertificateAuthority;
use crate::config::GatewayTls;

/// Why a TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(pub String);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The PEM blocks of a file the operator named.
fn pem_file(path: &Path) -> Result<Vec<(String, Vec<u8>)>, TlsError> {
    let text = crate::text_file::read(path).map_err(|e| TlsError(format!("{}: {e}", path.display())))?;
    crate::x509::pem_blocks(&text).map_err(|e| TlsError(format!("{}: {e}", path.display())))
}

fn certificates(blocks: &[(String, Vec<u8>)]) -> Vec<CertificateDer<'static>> {
    blocks
        .iter()
        .filter(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| CertificateDer::from(der.clone()))
        .collect()
}

fn private_key(blocks: Vec<(String, Vec<u8>)>, origin: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    blocks
        .into_iter()
        .find_map(|(label, der)| match label.as_str() {
            // Talos writes Ed25519 keys as "ED25519 PRIVATE KEY" (PKCS#8).
            "PRIVATE KEY" | "ED25519 PRIVATE KEY" => Some(PrivateKeyDer::Pkcs8(der.into())),
            "RSA PRIVATE KEY" => Some(PrivateKeyDer::Pkcs1(der.into())),
            "EC PRIVATE KEY" => Some(PrivateKeyDer::Sec1(der.into())),
            _ => None,
        })
        .ok_or_else(|| TlsError(format!("{origin}: no private key block")))
}

/// The listener's configuration: `tls` serves, and only certificates that
/// chain to `client_ca` (within their validity, for client
/// authentication) get past the handshake.
pub fn listener(tls: &GatewayTls, client_ca: &CertificateAuthority) -> Result<ServerConfig, TlsError> {
    let chain = certificates(&pem_file(&tls.cert_file)?);
    if chain.is_empty() {
        return Err(TlsError(format!(
            "{}: no CERTIFICATE block",
            tls.cert_file.display()
        )));
    }
    let key = private_key(pem_file(&tls.key_file)?, &tls.key_file.display().to_string())?;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(client_ca.signer().der.clone()))
        .map_err(|e| TlsError(format!("gateway.client_ca: {e}")))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| TlsError(format!("gateway.client_ca: {e}")))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError(format!("{}: {e}", tls.key_file.display())))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The upstream's configuration: apid verified with `trust_bundle_pem`
/// (the cluster's talosconfig `ca`), and the gateway's certificate chain
/// and PKCS#8 key as the client's.
pub fn upstream(
    trust_bundle_pem: &str,
    chain_pem: &str,
    key_pkcs8: Vec<u8>,
) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    let bundle =
        crate::x509::pem_blocks(trust_bundle_pem).map_err(|e| TlsError(format!("trust bundle: {e}")))?;
    for der in certificates(&bundle) {
        roots
            .add(der)
            .map_err(|e| TlsError(format!("trust bundle: {e}")))?;
    }
    let chain = certificates(
        &crate::x509::pem_blocks(chain_pem).map_err(|e| TlsError(format!("gateway certificate: {e}")))?,
    );
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, PrivateKeyDer::Pkcs8(key_pkcs8.into()))
        .map_err(|e| TlsError(format!("gateway certificate: {e}")))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
