//! The stand-in's TLS: rustls's server side as apid sets it up.

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use talos_sso_server::x509::{ParsedCertificate, oid};

use super::Config;
use crate::talos_checker::{certificates_from_pem, private_key_from_pem};

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
        .with_client_cert_verifier(Arc::new(ExactClientAuth(webpki)))
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tls)
}

/// apid's `verifyExtKeyUsage` after the chain check: every non-CA
/// certificate the client sent has extended key usage exactly
/// `[clientAuth]`.
#[derive(Debug)]
struct ExactClientAuth(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ExactClientAuth {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.0.verify_client_cert(end_entity, intermediates, now)?;
        for der in std::iter::once(end_entity).chain(intermediates) {
            let cert = ParsedCertificate::from_der(der)
                .map_err(|e| rustls::Error::General(format!("unparsable certificate: {e}")))?;
            let is_ca = cert.basic_constraints().is_some_and(|bc| bc.ca);
            if !is_ca && cert.ext_key_usage() != Some(vec![oid::KP_CLIENT_AUTH]) {
                return Err(rustls::Error::General(
                    "extended key usage must be exactly [clientAuth]".into(),
                ));
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
