//! The stand-in's TLS: rustls's server side as apid sets it up.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;

use super::Config;
use crate::talos_checker::{ExactClientAuthEku, certificates_from_pem, private_key_from_pem};

/// rustls's server side as apid sets it up: a client certificate required,
/// from the given roots, with exactly `[clientAuth]`; HTTP/2 by ALPN.
pub(super) fn server_config(config: &Config) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for ca in certificates_from_pem(&config.client_roots_pem)? {
        roots.add(ca).map_err(|e| format!("client root: {e}"))?;
    }
    let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let chain = certificates_from_pem(&config.server_cert_pem)?;
    let key = private_key_from_pem(&config.server_key_pem)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(Arc::new(ExactClientAuthEku(webpki)))
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tls)
}
