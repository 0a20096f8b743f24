//! The files of a gateway cluster, made fresh for a test: the Talos cluster
//! CA (what apid trusts, with a node's serving certificate for 127.0.0.1),
//! the gateway-only client CA that signs people's certificates, and the
//! gateway's serving certificate with its CA. And the configuration text
//! that turns the harness's cluster `prod` into a gateway cluster.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{self, NewKeyType};
use time::OffsetDateTime;

use crate::material::{serving_certificate, write_file};

/// A gateway cluster's files, in their own folder.
#[derive(Debug)]
pub struct GatewayFiles {
    pub dir: tempfile::TempDir,
    /// The Talos cluster CA (`machine.ca`), with its key: the cluster's
    /// `ca` in these tests (cluster-CA mode), what signs the gateway's own
    /// `os:impersonator` certificate.
    pub talos_ca_cert: PathBuf,
    pub talos_ca_key: PathBuf,
    pub talos_ca_pem: String,
    /// apid's serving certificate (127.0.0.1), signed by the Talos CA.
    pub node_cert_pem: String,
    pub node_key_pem: String,
    /// The gateway-only CA: people's certificates.
    pub client_ca_cert: PathBuf,
    pub client_ca_key: PathBuf,
    pub client_ca_pem: String,
    /// The gateway's serving certificate (127.0.0.1) and its CA.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_ca: PathBuf,
    pub tls_ca_pem: String,
}

impl GatewayFiles {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        // Made two hours ago: a test can sign with them as of an hour ago
        // (an expired certificate).
        let now = OffsetDateTime::now_utc() - time::Duration::hours(2);
        let year = Duration::from_secs(365 * 86400);
        let talos = generate::new_root(NewKeyType::Ed25519, "talos", year, now).expect("Talos CA");
        let talos_ca =
            CertificateAuthority::from_pem(&talos.cert_pem, &talos.key_pem, "talos", Vec::new(), now)
                .expect("load");
        let (node_cert_pem, node_key_pem) = serving_certificate(talos_ca.signer(), talos_ca.key());
        let client = generate::new_client_ca(NewKeyType::Ed25519, "prod", year, now).expect("client CA");
        let serving =
            generate::new_root(NewKeyType::EcdsaP256, "talos-sso gateway TLS", year, now).expect("TLS CA");
        let serving_ca =
            CertificateAuthority::from_pem(&serving.cert_pem, &serving.key_pem, "tls", Vec::new(), now)
                .expect("load");
        let (tls_cert_pem, tls_key_pem) = serving_certificate(serving_ca.signer(), serving_ca.key());
        let path = dir.path();
        Self {
            talos_ca_cert: write_file(path, "talos-ca.crt", &talos.cert_pem, 0o644),
            talos_ca_key: write_file(path, "talos-ca.key", &talos.key_pem, 0o600),
            talos_ca_pem: talos.cert_pem,
            node_cert_pem,
            node_key_pem,
            client_ca_cert: write_file(path, "gateway-ca.crt", &client.cert_pem, 0o644),
            client_ca_key: write_file(path, "gateway-ca.key", &client.key_pem, 0o600),
            client_ca_pem: client.cert_pem,
            tls_cert: write_file(path, "gateway-tls.crt", &tls_cert_pem, 0o644),
            tls_key: write_file(path, "gateway-tls.key", &tls_key_pem, 0o600),
            tls_ca: write_file(path, "gateway-tls-ca.crt", &serving.cert_pem, 0o644),
            tls_ca_pem: serving.cert_pem,
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The stand-in apid of this cluster's node: its serving certificate,
    /// and `machine.ca` (this Talos CA) as the client pool.
    pub fn standin_config(&self) -> crate::standin_apid::Config {
        crate::standin_apid::Config::new(&self.node_cert_pem, &self.node_key_pem, &self.talos_ca_pem)
    }

    /// The harness's configuration (`harness::config_yaml`) with cluster
    /// `prod` signing with this Talos CA, apid at `upstream`, and a
    /// gateway on 127.0.0.1 (a port of the system's choosing) whose
    /// section ends with `extra` (rules, examples: YAML lines indented six
    /// spaces).
    pub fn gateway_config(&self, yaml: &str, upstream: SocketAddr, extra: &str) -> String {
        let mut out = Vec::new();
        for line in yaml.lines() {
            let trimmed = line.trim_start();
            if trimmed.starts_with("ca: {") && line.starts_with("    ca:") {
                out.push(format!(
                    "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
                    self.talos_ca_cert.display(),
                    self.talos_ca_key.display()
                ));
            } else if line.starts_with("    endpoints: [") {
                out.push(format!("    endpoints: [\"{upstream}\"]"));
                out.push(format!(
                    "    gateway:\n      listen: \"127.0.0.1:0\"\n      endpoints: [\"{}\"]\n      \
                     client_ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n      \
                     tls: {{ cert_file: \"{}\", key_file: \"{}\", ca_file: \"{}\" }}\n{extra}",
                    GATEWAY_ENDPOINT_PLACEHOLDER,
                    self.client_ca_cert.display(),
                    self.client_ca_key.display(),
                    self.tls_cert.display(),
                    self.tls_key.display(),
                    self.tls_ca.display(),
                ));
            } else if line.starts_with("    nodes: [") {
                // Calls that name no node go to the endpoint itself.
                continue;
            } else {
                out.push(line.to_owned());
            }
        }
        out.join("\n")
    }
}

impl Default for GatewayFiles {
    fn default() -> Self {
        Self::new()
    }
}

/// What `gateway.endpoints` says in [`GatewayFiles::gateway_config`]: the
/// port is the system's choice, known only once the server listens, so the
/// tests dial the bound address and verify the name `127.0.0.1`.
pub const GATEWAY_ENDPOINT_PLACEHOLDER: &str = "127.0.0.1:50000";
