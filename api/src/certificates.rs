//! `POST /v1/certificates`: a CSR in, a five-minute Talos client certificate
//! out, with what the CLI writes into talosconfig.

use serde::{Deserialize, Serialize};

/// The request body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateRequest {
    pub cluster: String,
    /// PEM PKCS#10 request, signed by the key that stays on the client.
    pub csr: String,
    /// Talos roles asked for; empty means what the policy grants by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// Who the certificate is for, as the server verified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub issuer: String,
    #[serde(default)]
    pub tenant: Option<String>,
    pub subject: String,
    pub username: String,
}

/// `201 Created`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssuedCertificate {
    /// Leaf, then intermediates: the talosconfig `crt`.
    pub certificate: String,
    /// The Talos CA bundle: the talosconfig `ca`.
    pub ca: String,
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub nodes: Vec<String>,
    pub cluster: String,
    /// The talosconfig context name.
    pub context: String,
    pub roles: Vec<String>,
    pub identity: Identity,
    /// Hex, as in the audit record.
    pub serial: String,
    pub not_before: String,
    pub not_after: String,
    /// The `seq` of the audit record.
    pub audit_id: i64,
}
