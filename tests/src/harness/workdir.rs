//! A test's own folder: the throwaway Talos CA, TLS files and the
//! server's configuration.

use std::path::{Path, PathBuf};
use std::time::Duration;

use talos_sso_server::ca::generate::{self, NewKeyType};
use time::OffsetDateTime;

use crate::emulator::{
    CLI_CLIENT_ID, EmulatorHandle, GROUP_ONCALL, GROUP_PLATFORM_ADMINS, GROUP_SECURITY, SERVER_APP_ID,
    SERVER_APP_SECRET, TENANT_ID,
};
use crate::material::write_file;

/// Throwaway files of one test server: CA, secrets, SQLite database.
#[derive(Debug)]
pub struct Workdir {
    pub dir: tempfile::TempDir,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub graph_secret: PathBuf,
}

impl Workdir {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = generate::new_root(
            NewKeyType::Ed25519,
            "talos",
            Duration::from_secs(3650 * 86400),
            OffsetDateTime::now_utc(),
        )
        .expect("CA");
        let ca_cert = write_file(dir.path(), "talos-ca.crt", &ca.cert_pem, 0o644);
        let ca_key = write_file(dir.path(), "talos-ca.key", &ca.key_pem, 0o600);
        let graph_secret = write_file(dir.path(), "graph-secret", SERVER_APP_SECRET, 0o600);
        Self {
            dir,
            ca_cert,
            ca_key,
            graph_secret,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for Workdir {
    fn default() -> Self {
        Self::new()
    }
}

/// A serving certificate for 127.0.0.1 (ECDSA P-256, PKCS#8 `PRIVATE KEY`
/// as rustls reads it) and the CA that signed it, in `dir`. Returns
/// (CA PEM, certificate path, key path).
pub fn tls_files(dir: &Path) -> (String, PathBuf, PathBuf) {
    let now = OffsetDateTime::now_utc();
    let root = generate::new_root(
        NewKeyType::EcdsaP256,
        "talos-sso test TLS",
        Duration::from_secs(86400),
        now,
    )
    .expect("CA");
    let ca = talos_sso_server::ca::CertificateAuthority::from_pem(
        &root.cert_pem,
        &root.key_pem,
        "tls CA",
        vec![],
        now,
    )
    .expect("load CA");
    let (cert_pem, key_pem) = crate::material::serving_certificate(ca.signer(), ca.key());
    let cert_path = write_file(dir, "tls.crt", &cert_pem, 0o644);
    let key_path = write_file(dir, "tls.key", &key_pem, 0o600);
    (root.cert_pem, cert_path, key_path)
}

/// The test configuration: one cluster `prod` with the demo rules.
pub fn config_yaml(emulator: &EmulatorHandle, work: &Workdir, database_url: &str) -> String {
    format!(
        r#"
listen: "127.0.0.1:0"
insecure_http: true
data_dir: "{data_dir}"
database: {{ url: "{database_url}", acquire_timeout: 2s }}
identity:
  issuer: "{issuer}"
  additional_issuers: ["{issuer_v1}"]
  client_id: "{CLI_CLIENT_ID}"
  audiences: ["{CLI_CLIENT_ID}", "{SERVER_APP_ID}", "api://{SERVER_APP_ID}"]
  allowed_tenants: ["{TENANT_ID}"]
  entra_graph:
    tenant_id: "{TENANT_ID}"
    client_id: "{SERVER_APP_ID}"
    client_secret_file: "{secret}"
    authority: "{base}"
    graph_url: "{base}"
clusters:
  prod:
    description: "Production"
    ca: {{ cert_file: "{ca_cert}", key_file: "{ca_key}" }}
    endpoints: ["127.0.0.1"]
    nodes: ["127.0.0.1"]
    ttl: 5m
    max_ttl: 15m
    rules:
      - {{ groups: ["{GROUP_PLATFORM_ADMINS}"], roles: [os:admin] }}
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
      - {{ app_roles: ["Talos.Reader"], roles: [os:reader] }}
    default_roles: [os:operator, os:reader]
policy_examples:
  - {{ description: "on-call operates prod", cluster: prod, groups: ["{GROUP_ONCALL}"], expect_roles: [os:operator] }}
  - {{ description: "admins must ask for admin", cluster: prod, groups: ["{GROUP_PLATFORM_ADMINS}"], expect_denied: role_required }}
auditors: {{ groups: ["{GROUP_SECURITY}"] }}
admins: {{ groups: ["{GROUP_PLATFORM_ADMINS}"] }}
# Off here: the concurrency tests and the load generator send hundreds of
# requests per user; `rate_limits_apply_per_address_and_per_identity` turns them on.
rate_limits: {{ per_identity_per_minute: 0, per_address_per_minute: 0 }}
"#,
        data_dir = work.path().display(),
        issuer = emulator.issuer(),
        issuer_v1 = emulator.issuer_v1(),
        secret = work.graph_secret.display(),
        base = emulator.base_url,
        ca_cert = work.ca_cert.display(),
        ca_key = work.ca_key.display(),
    )
}
