//! A talos-sso server's configuration for the real provider, with the
//! console on or off.

use std::path::PathBuf;

use super::{CLIENT_ID, COLLECTOR_ID, CONSOLE_CLIENT_ID, GROUP_AUDITORS, GROUP_ONCALL, RealOp};
use crate::harness::Workdir;

/// The talos-sso server configuration for the provider: one cluster
/// `prod` where on-call operates, the auditors group and the collector read
/// the trail, and `token` (`id_token` or `access_token`) is what the CLI
/// sends.
pub fn config_yaml(op: &RealOp, work: &Workdir, token: &str) -> String {
    server_yaml(op, work, token, None)
}

/// The console as the server is to serve it: the port the server listens
/// on (browsers reach it at [`Self::public_url`]), and the file with its
/// client's secret.
#[derive(Debug)]
pub struct ConsoleSetup {
    pub port: u16,
    pub secret_file: PathBuf,
}

impl ConsoleSetup {
    /// `console.public_url`: `http://127.0.0.1:<port>`.
    pub fn public_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The console's callback: the redirect URI the provider registers.
    pub fn redirect_uri(&self) -> String {
        format!("{}/ui/callback", self.public_url())
    }
}

/// [`config_yaml`] with the console on as `console` says, logging in as
/// the confidential client [`CONSOLE_CLIENT_ID`], whose ID tokens (for
/// that audience) the server accepts as the CLI's.
pub fn console_config_yaml(op: &RealOp, work: &Workdir, token: &str, console: &ConsoleSetup) -> String {
    server_yaml(op, work, token, Some(console))
}

/// The server's configuration, with the console as `console` says (on
/// its port), or off (on any port).
fn server_yaml(op: &RealOp, work: &Workdir, token: &str, console: Option<&ConsoleSetup>) -> String {
    let port = console.map_or(0, |c| c.port);
    let console_audience = if console.is_some() {
        format!(", {CONSOLE_CLIENT_ID}")
    } else {
        String::new()
    };
    let console_section = console.map_or_else(String::new, |c| {
        format!(
            "console: {{ enabled: true, public_url: \"{}\", client_id: {CONSOLE_CLIENT_ID}, client_secret_file: \"{}\" }}\n",
            c.public_url(),
            c.secret_file.display()
        )
    });
    format!(
        r#"
listen: "127.0.0.1:{port}"
insecure_http: true
data_dir: "{data_dir}"
database: {{ url: "sqlite://{data_dir}/audit.db" }}
identity:
  kind: oidc
  issuer: "{issuer}"
  client_id: "{CLIENT_ID}"
  audiences: ["{CLIENT_ID}", talos-sso{console_audience}]
  scopes: [openid, profile, email, groups, offline_access]
  token: {token}
  username_claim: preferred_username
clusters:
  prod:
    description: "Production"
    ca: {{ cert_file: "{ca_cert}", key_file: "{ca_key}" }}
    endpoints: ["127.0.0.1"]
    nodes: ["127.0.0.1"]
    rules:
      - {{ groups: ["{GROUP_ONCALL}"], roles: [os:operator] }}
auditors: {{ groups: ["{GROUP_AUDITORS}"], client_ids: ["{COLLECTOR_ID}"] }}
rate_limits: {{ per_identity_per_minute: 0, per_address_per_minute: 0 }}
{console_section}"#,
        data_dir = work.path().display(),
        issuer = op.issuer,
        ca_cert = work.ca_cert.display(),
        ca_key = work.ca_key.display(),
    )
}
