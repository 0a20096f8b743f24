//! A stand-in for Talos's apid and talosctl, to check that a talosconfig's
//! certificate would really be accepted (facts in docs/talos-compatibility.md).
//!
//! The server half behaves like apid: TLS with a required client certificate
//! verified against the Talos CA (`RequireAndVerifyClientCert`), then its
//! extra check that every non-CA certificate in the chain has extended key
//! usage exactly `[clientAuth]` (Talos >= 1.12), then roles read from the
//! leaf's Subject Organization values, trimmed and without empty ones
//! (`role.Parse`).
//!
//! The client half behaves like Go's `crypto/tls` as talosctl uses it: it
//! sends its certificate only if some certificate of its chain has a raw
//! issuer byte-equal to one of the CA names the server asked for, and
//! otherwise sends no certificate at all.
//!
//! Everything runs over real TCP on 127.0.0.1 with rustls.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::ResolvesClientCert;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::keys::Signer;
use talos_sso_server::x509::{self, CertificateTemplate, ParsedCertificate, oid};
use time::OffsetDateTime;

/// What the stand-in apid saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Roles parsed from the leaf, as apid's `role.Parse` would.
    pub roles: Vec<String>,
    /// The CN, for completeness (apid never reads it).
    pub common_name: Option<String>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Decode PEM the way Go's `tls.X509KeyPair` does: any `... PRIVATE KEY`
/// label, PKCS#8 / SEC1 / PKCS#1 by label.
pub fn private_key_from_pem(pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    let blocks = x509::pem_blocks(pem).map_err(|e| e.to_string())?;
    let (label, der) = blocks
        .into_iter()
        .find(|(label, _)| label == "PRIVATE KEY" || label.ends_with(" PRIVATE KEY"))
        .ok_or("no private key block")?;
    Ok(match label.as_str() {
        "EC PRIVATE KEY" => PrivateKeyDer::Sec1(der.into()),
        "RSA PRIVATE KEY" => PrivateKeyDer::Pkcs1(der.into()),
        _ => PrivateKeyDer::Pkcs8(der.into()),
    })
}

pub fn certificates_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    Ok(x509::pem_blocks(pem)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|(label, _)| label == "CERTIFICATE")
        .map(|(_, der)| CertificateDer::from(der))
        .collect())
}

/// apid's `verifyExtKeyUsage` on top of the WebPKI chain check (also the
/// gRPC stand-in's, `standin_apid`).
#[derive(Debug)]
pub(crate) struct ExactClientAuthEku(pub(crate) Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for ExactClientAuthEku {
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
                return Err(rustls::Error::General(format!(
                    "extended key usage must be exactly [clientAuth], got {:?}",
                    cert.ext_key_usage()
                )));
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

/// Go's client certificate selection: present the chain only if one of its
/// certificates was issued by a CA the server named, byte for byte.
#[derive(Debug)]
struct GoLikeClientCert {
    key: Arc<CertifiedKey>,
    raw_issuers: Vec<Vec<u8>>,
}

impl ResolvesClientCert for GoLikeClientCert {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let named = self
            .raw_issuers
            .iter()
            .any(|issuer| root_hint_subjects.contains(&issuer.as_slice()));
        named.then(|| self.key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The stand-in node's own serving identity; its CA is what talosctl's `ca`
/// would trust. Independent of the client CA under test.
struct NodeIdentity {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn node_identity() -> Result<NodeIdentity, String> {
    let now = OffsetDateTime::now_utc();
    let root = generate::new_root(NewKeyType::Ed25519, "talos", Duration::from_secs(3600), now)
        .map_err(|e| e.to_string())?;
    let root_key = talos_sso_server::ca::CertificateAuthority::from_pem(
        &root.cert_pem,
        &root.key_pem,
        "node CA",
        Vec::new(),
        now,
    )
    .map_err(|e| e.to_string())?;
    let rng = ring::rand::SystemRandom::new();
    let leaf_key = generate::generate_key(NewKeyType::Ed25519, &rng).map_err(|e| e.to_string())?;
    let spki = leaf_key.key.public_key_info().map_err(|e| e.to_string())?;
    let spki_der = der::Encode::to_der(&spki).map_err(|e| e.to_string())?;
    let subject = x509::encode_name(&[(oid::COMMON_NAME, "talos-node")]).map_err(|e| e.to_string())?;
    let san = x509_cert::ext::pkix::SubjectAltName(vec![x509_cert::ext::pkix::name::GeneralName::IpAddress(
        der::asn1::OctetString::new(vec![127, 0, 0, 1]).map_err(|e| e.to_string())?,
    )]);
    let template = CertificateTemplate {
        serial: &[1, 2, 3],
        issuer: &root.cert.raw_subject,
        subject: &subject,
        subject_public_key_info: &spki_der,
        not_before: now - time::Duration::minutes(5),
        not_after: now + time::Duration::hours(1),
        extensions: vec![
            x509::extension(oid::SUBJECT_ALT_NAME, false, &san).map_err(|e| e.to_string())?,
            x509::extension(
                oid::EXT_KEY_USAGE,
                false,
                &x509_cert::ext::pkix::ExtendedKeyUsage(vec![oid::KP_SERVER_AUTH]),
            )
            .map_err(|e| e.to_string())?,
        ],
    };
    let leaf = x509::sign_certificate(&template, root_key.key()).map_err(|e| e.to_string())?;
    Ok(NodeIdentity {
        ca: CertificateDer::from(root.cert.der.clone()),
        chain: vec![CertificateDer::from(leaf)],
        key: private_key_from_pem(&leaf_key.pem)?,
    })
}

/// Connect to a stand-in apid that trusts `talos_ca_pem` (one or more CA
/// certificates: `machine.ca` plus `machine.acceptedCAs`) with the client
/// certificate chain and key of a talosconfig context. `Ok` carries what
/// apid authorized; `Err` says why the handshake failed, from the server's
/// side when it has something to say.
pub fn handshake(
    talos_ca_pem: &str,
    client_chain_pem: &str,
    client_key_pem: &str,
) -> Result<Accepted, String> {
    let provider = provider();
    let node = node_identity()?;

    let mut client_roots = RootCertStore::empty();
    for ca in certificates_from_pem(talos_ca_pem)? {
        client_roots
            .add(ca)
            .map_err(|e| format!("Talos CA not usable as a trust anchor: {e}"))?;
    }
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(client_roots), provider.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let server_config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(Arc::new(ExactClientAuthEku(inner)))
        .with_single_cert(node.chain, node.key)
        .map_err(|e| e.to_string())?;

    let chain = certificates_from_pem(client_chain_pem)?;
    let raw_issuers = chain
        .iter()
        .map(|der| ParsedCertificate::from_der(der).map(|c| c.raw_issuer))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let key = private_key_from_pem(client_key_pem)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| e.to_string())?;
    let resolver = GoLikeClientCert {
        key: Arc::new(CertifiedKey::new(chain, signing_key)),
        raw_issuers,
    };
    let mut server_roots = RootCertStore::empty();
    server_roots.add(node.ca).map_err(|e| e.to_string())?;
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(server_roots)
        .with_client_cert_resolver(Arc::new(resolver));

    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || -> Result<Accepted, String> {
        let (mut tcp, _) = listener.accept().map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let mut conn = rustls::ServerConnection::new(Arc::new(server_config)).map_err(|e| e.to_string())?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp).map_err(|e| e.to_string())?;
        }
        let leaf = conn
            .peer_certificates()
            .and_then(|certs| certs.first())
            .ok_or("the client sent no certificate")?;
        let leaf = ParsedCertificate::from_der(leaf).map_err(|e| e.to_string())?;
        let roles = leaf
            .subject_organizations()
            .into_iter()
            .map(|o| o.trim().to_owned())
            .filter(|o| !o.is_empty())
            .collect();
        let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
        stream.write_all(b"ok").map_err(|e| e.to_string())?;
        stream.flush().map_err(|e| e.to_string())?;
        Ok(Accepted {
            roles,
            common_name: leaf.subject_common_name(),
        })
    });

    let client_result = (|| -> Result<(), String> {
        let mut tcp = TcpStream::connect(address).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let server_name = rustls::pki_types::ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
        let mut conn = rustls::ClientConnection::new(Arc::new(client_config), server_name.to_owned())
            .map_err(|e| e.to_string())?;
        let mut stream = rustls::Stream::new(&mut conn, &mut tcp);
        let mut reply = [0u8; 2];
        stream.read_exact(&mut reply).map_err(|e| e.to_string())?;
        Ok(())
    })();
    let server_result = server.join().map_err(|_| "server thread panicked".to_owned())?;
    match (server_result, client_result) {
        (Ok(accepted), Ok(())) => Ok(accepted),
        (Err(server), _) => Err(server),
        (Ok(_), Err(client)) => Err(client),
    }
}
