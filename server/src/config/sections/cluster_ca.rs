//! Where a cluster's CAs come from: the signing CA (`ca`, exactly one
//! source: PEM files, a key in a PKCS#11 token, a secrets bundle, a machine
//! config), the CA that takes over at a date (`next_ca`), and, in
//! accepted-CA mode, the Talos cluster CA certificate alone (`talos_ca`).
//! Data only: `ca` reads and checks the material.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;
use time::OffsetDateTime;

use crate::config::de::rfc3339;
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

/// A cluster's `next_ca`: a CA (PEM files, or a certificate with its key in
/// a PKCS#11 token) that signs instead of `ca` from `signs_from` on. Both are
/// loaded and checked at start; the switch needs no reload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextCaConfig {
    pub cert_file: PathBuf,
    pub key_file: Option<PathBuf>,
    pub pkcs11: Option<Pkcs11Source>,
    /// From this moment on (RFC 3339), certificates are signed by this CA.
    #[serde(deserialize_with = "rfc3339")]
    pub signs_from: OffsetDateTime,
    #[serde(default)]
    pub allow_insecure_key_permissions: bool,
}

impl NextCaConfig {
    pub fn source(&self) -> Result<CaSource, ConfigError> {
        CaSource::from_parts(
            Some(&self.cert_file),
            self.key_file.as_ref(),
            None,
            None,
            self.pkcs11.as_ref(),
        )
        .ok_or_else(|| invalid("a cluster's `next_ca` needs cert_file with either key_file or pkcs11"))
    }
}

/// A cluster's `talos_ca`: the Talos cluster CA certificate, from exactly
/// one source; a source that holds the CA key is refused.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TalosCaConfig {
    /// PEM certificate(s), no key.
    pub cert_file: Option<PathBuf>,
    /// A talosconfig: its context's `ca`.
    pub talosconfig: Option<PathBuf>,
    /// Which context of `talosconfig` (default: its current context).
    pub context: Option<String>,
    /// A secrets bundle whose `certs.os.key` is absent, empty or redacted.
    pub secrets_bundle: Option<PathBuf>,
    /// A machine config whose `machine.ca.key` is empty or redacted (a
    /// worker's, or `talosctl get machineconfig` output).
    pub machine_config: Option<PathBuf>,
}

impl TalosCaConfig {
    pub fn source(&self) -> Result<TalosCaSource, ConfigError> {
        let source = match (
            &self.cert_file,
            &self.talosconfig,
            &self.secrets_bundle,
            &self.machine_config,
        ) {
            (Some(path), None, None, None) => TalosCaSource::CertFile(path.clone()),
            (None, Some(path), None, None) => TalosCaSource::Talosconfig {
                path: path.clone(),
                context: self.context.clone(),
            },
            (None, None, Some(path), None) => TalosCaSource::SecretsBundle(path.clone()),
            (None, None, None, Some(path)) => TalosCaSource::MachineConfig(path.clone()),
            _ => {
                return Err(invalid(
                    "a cluster's `talos_ca` needs exactly one of: cert_file, talosconfig, secrets_bundle, \
                     machine_config",
                ));
            }
        };
        if self.context.is_some() && self.talosconfig.is_none() {
            return Err(invalid("`talos_ca.context` goes with `talos_ca.talosconfig`"));
        }
        Ok(source)
    }
}

/// Where the Talos cluster CA certificate comes from (accepted-CA mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TalosCaSource {
    CertFile(PathBuf),
    Talosconfig { path: PathBuf, context: Option<String> },
    SecretsBundle(PathBuf),
    MachineConfig(PathBuf),
}

impl TalosCaSource {
    /// The file it is read from (watched for reloads).
    pub fn path(&self) -> &PathBuf {
        match self {
            TalosCaSource::CertFile(path)
            | TalosCaSource::Talosconfig { path, .. }
            | TalosCaSource::SecretsBundle(path)
            | TalosCaSource::MachineConfig(path) => path,
        }
    }
}

impl fmt::Display for TalosCaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TalosCaSource::CertFile(p) => write!(f, "cert_file {}", p.display()),
            TalosCaSource::Talosconfig { path, context: None } => write!(f, "talosconfig {}", path.display()),
            TalosCaSource::Talosconfig {
                path,
                context: Some(context),
            } => write!(f, "talosconfig {} context {context}", path.display()),
            TalosCaSource::SecretsBundle(p) => write!(f, "secrets bundle {}", p.display()),
            TalosCaSource::MachineConfig(p) => write!(f, "machine config {}", p.display()),
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
