//! A cluster's section: where its CA is, its talosconfig details, its
//! lifetimes and its rules.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{PolicyConfig, Rule, Tenancy};
use crate::config::de::duration;
use crate::config::defaults::{default_max_ttl, default_skew, default_ttl};
use crate::config::{ConfigError, invalid};

/// A cluster's `ca` section: exactly one source.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub secrets_bundle: Option<PathBuf>,
    pub machine_config: Option<PathBuf>,
    /// The key inside a PKCS#11 token (with `cert_file`, without `key_file`).
    pub pkcs11: Option<Pkcs11Source>,
    /// Accept a CA key file readable by group or others (loudly logged).
    pub allow_insecure_key_permissions: bool,
}

impl CaConfig {
    pub fn source(&self) -> Result<CaSource, ConfigError> {
        CaSource::from_parts(
            self.cert_file.as_ref(),
            self.key_file.as_ref(),
            self.secrets_bundle.as_ref(),
            self.machine_config.as_ref(),
            self.pkcs11.as_ref(),
        )
        .ok_or_else(|| {
            invalid(
                "a cluster's `ca` needs exactly one of: cert_file + key_file, cert_file + pkcs11, \
                 secrets_bundle, machine_config",
            )
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub description: String,
    pub ca: CaConfig,
    /// Extra trusted CA certificates during a CA rotation.
    #[serde(default)]
    pub accepted_cas: Vec<PathBuf>,
    /// talosconfig `endpoints`.
    pub endpoints: Vec<String>,
    /// talosconfig `nodes` (default: none).
    #[serde(default)]
    pub nodes: Vec<String>,
    /// talosconfig context name (default: the cluster name).
    pub context: Option<String>,
    /// Default certificate lifetime.
    #[serde(default = "default_ttl", deserialize_with = "duration")]
    pub ttl: Duration,
    /// Longest lifetime a client may ask for.
    #[serde(default = "default_max_ttl", deserialize_with = "duration")]
    pub max_ttl: Duration,
    /// How far `not_before` is moved back.
    #[serde(default = "default_skew", deserialize_with = "duration")]
    pub clock_skew: Duration,
    /// Who gets which roles: see `policy` (rules match on groups, app
    /// roles, users or claims).
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Roles granted when the client names none.
    #[serde(default)]
    pub default_roles: Vec<String>,
    /// Allow a rule to grant `os:impersonator`.
    #[serde(default)]
    pub allow_impersonator: bool,
}

impl ClusterConfig {
    /// The cluster's rules, with the issuers' tenants they are read
    /// against (`IdentityConfig::tenancy`, of the `identity` section).
    pub fn policy(&self, tenancy: &Tenancy) -> PolicyConfig {
        PolicyConfig {
            rules: self.rules.clone(),
            default_roles: self.default_roles.clone(),
            allow_impersonator: self.allow_impersonator,
            tenancy: tenancy.clone(),
        }
    }
}

/// Where a cluster's CA comes from; the names match the configuration keys of
/// a cluster's `ca` section and the flags of `ca inspect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// PEM files. `cert_file` holds the signing certificate first, then (for an
    /// intermediate) the certificates above it up to the Talos root.
    Files { cert_file: PathBuf, key_file: PathBuf },
    /// A `talosctl gen secrets` bundle; the Talos API CA is `certs.os`.
    SecretsBundle(PathBuf),
    /// A control plane machine config; the CA is `machine.ca`.
    MachineConfig(PathBuf),
    /// The certificate from a PEM file (as `Files`), the key inside a
    /// PKCS#11 token: it never enters this process.
    Pkcs11 {
        cert_file: PathBuf,
        pkcs11: Pkcs11Source,
    },
}

impl CaSource {
    /// The one source named by the configuration keys (or command-line flags)
    /// of a cluster's `ca`: `cert_file` + `key_file`, `secrets_bundle`, or
    /// `machine_config`, or `cert_file` + `pkcs11`. `None` when there is
    /// not exactly one.
    pub fn from_parts(
        cert_file: Option<&PathBuf>,
        key_file: Option<&PathBuf>,
        secrets_bundle: Option<&PathBuf>,
        machine_config: Option<&PathBuf>,
        pkcs11: Option<&Pkcs11Source>,
    ) -> Option<Self> {
        match (cert_file, key_file, secrets_bundle, machine_config, pkcs11) {
            (Some(cert_file), Some(key_file), None, None, None) => Some(CaSource::Files {
                cert_file: cert_file.clone(),
                key_file: key_file.clone(),
            }),
            (Some(cert_file), None, None, None, Some(pkcs11)) => Some(CaSource::Pkcs11 {
                cert_file: cert_file.clone(),
                pkcs11: pkcs11.clone(),
            }),
            (None, None, Some(bundle), None, None) => Some(CaSource::SecretsBundle(bundle.clone())),
            (None, None, None, Some(config), None) => Some(CaSource::MachineConfig(config.clone())),
            _ => None,
        }
    }
}

impl fmt::Display for CaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaSource::Files { cert_file, key_file } => {
                write!(
                    f,
                    "cert_file {} + key_file {}",
                    cert_file.display(),
                    key_file.display()
                )
            }
            CaSource::SecretsBundle(p) => write!(f, "secrets bundle {}", p.display()),
            CaSource::MachineConfig(p) => write!(f, "machine config {}", p.display()),
            CaSource::Pkcs11 { cert_file, pkcs11 } => {
                write!(f, "cert_file {} + {}", cert_file.display(), pkcs11.describe())
            }
        }
    }
}

/// Where the key is: a cluster's `ca.pkcs11` section, and the `--pkcs11-*`
/// flags of `ca inspect`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pkcs11Source {
    /// The vendor's PKCS#11 library (`/usr/lib/softhsm/libsofthsm2.so`).
    pub module: PathBuf,
    /// The token's label (`CKA_LABEL` of the token, as `pkcs11-tool -L` shows).
    pub token_label: String,
    /// The private key's `CKA_LABEL` on that token.
    pub key_label: String,
    /// A file holding the user PIN; it must not be readable by group or others.
    pub pin_file: PathBuf,
}

impl Pkcs11Source {
    /// How messages name the key: `PKCS#11 token `t`, key `k``.
    pub fn describe(&self) -> String {
        format!("PKCS#11 token `{}`, key `{}`", self.token_label, self.key_label)
    }
}
