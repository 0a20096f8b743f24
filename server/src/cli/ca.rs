//! `ca inspect|intermediate|intermediate-for-token|client-ca|
//! client-ca-for-token|new|patch`: reading, checking and making CA
//! material, named by the same keys as a cluster's `ca` and `talos_ca`
//! configuration; `patch` (in `ca_patch`) prints the Talos side of
//! accepted-CA mode.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use time::OffsetDateTime;

use super::files::{write_new_file, write_new_files};
use crate::ca::generate::{self, NewKeyType};
use crate::ca::{CaOptions, CaSummary, CertificateAuthority, TrustMode};
use crate::config::CaSource;

/// Where a new CA is written, and its key type.
#[derive(Debug, Args)]
pub struct NewCaOutput {
    /// Where to write the certificate; for an intermediate, followed by the
    /// root (must not exist).
    #[arg(long)]
    out_cert: PathBuf,
    /// Where to write the private key, mode 0600 (must not exist).
    #[arg(long)]
    out_key: PathBuf,
    /// Key type of the new CA.
    #[arg(long, value_enum, default_value = "ed25519")]
    key_type: KeyTypeArg,
}

/// The key pair on a PKCS#11 token that a new CA's key is, or becomes.
#[derive(Debug, Args)]
pub struct TokenKeyArgs {
    /// The PKCS#11 module holding the key.
    #[arg(long)]
    token_module: PathBuf,
    /// The token's label.
    #[arg(long)]
    token_label: String,
    /// The label of the key pair on the token.
    #[arg(long)]
    token_key_label: String,
}

impl TokenKeyArgs {
    /// The key as a cluster's `ca.pkcs11` names it, its PIN in `pin_file`.
    fn source(self, pin_file: PathBuf) -> crate::config::Pkcs11Source {
        crate::config::Pkcs11Source {
            module: self.token_module,
            token_label: self.token_label,
            key_label: self.token_key_label,
            pin_file,
        }
    }
}

/// Key types a token key can be made with.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum TokenKeyTypeArg {
    Ed25519,
    P256,
}

impl From<TokenKeyTypeArg> for crate::keys::KeyKind {
    fn from(kind: TokenKeyTypeArg) -> Self {
        match kind {
            TokenKeyTypeArg::Ed25519 => crate::keys::KeyKind::Ed25519,
            TokenKeyTypeArg::P256 => crate::keys::KeyKind::EcdsaP256,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Show subject, key type, fingerprint and validity of CA material, and
    /// exit non-zero with the reason if the server would refuse it.
    Inspect {
        #[command(flatten)]
        source: CaSourceArgs,
    },
    /// Create an intermediate CA signed by the Talos root, so that the root
    /// key can stay offline. The certificate file gets the intermediate then
    /// the root: use it as the cluster's `ca.cert_file`.
    Intermediate {
        #[command(flatten)]
        source: CaSourceArgs,
        /// How long the intermediate is valid (e.g. 90d, 1y); never past the root.
        #[arg(long, value_parser = humantime::parse_duration)]
        validity: Duration,
        #[command(flatten)]
        output: NewCaOutput,
        /// Common name of the intermediate's subject.
        #[arg(long, default_value = "talos-sso intermediate CA")]
        common_name: String,
    },
    /// Sign, with the Talos root, the certificate of an intermediate whose
    /// key was generated inside a PKCS#11 token (`pkcs11-tool --keypairgen`):
    /// only its public key leaves the token. Use the certificate file as the
    /// cluster's `ca.cert_file`, next to `ca.pkcs11`.
    IntermediateForToken {
        #[command(flatten)]
        source: CaSourceArgs,
        /// How long the intermediate is valid (e.g. 90d, 1y); never past the root.
        #[arg(long, value_parser = humantime::parse_duration)]
        validity: Duration,
        #[command(flatten)]
        token: TokenKeyArgs,
        /// Make that key pair inside the token first (it never leaves it).
        #[arg(long, value_enum, requires = "token_pin_file")]
        generate: Option<TokenKeyTypeArg>,
        /// The token's user PIN, for --generate (a file nobody else can read).
        #[arg(long)]
        token_pin_file: Option<PathBuf>,
        /// Where to write the certificate, followed by the root (must not exist).
        #[arg(long)]
        out_cert: PathBuf,
        /// Common name of the intermediate's subject.
        #[arg(long, default_value = "talos-sso intermediate CA")]
        common_name: String,
    },
    /// Create a client-only CA of talos-sso's own for a cluster in
    /// accepted-CA mode: Talos lists it in `machine.acceptedCAs` (print the
    /// patch with `ca patch add`), and the cluster CA key never reaches
    /// talos-sso. Self-signed, path length 0, key usage keyCertSign and
    /// cRLSign, extended key usage clientAuth only: what it signs cannot pass
    /// as a server.
    ClientCa {
        /// The cluster it is for (named in its subject).
        #[arg(long)]
        cluster: String,
        /// How long the CA is valid; rotate it before then (`next_ca`).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "365d")]
        validity: Duration,
        #[command(flatten)]
        output: NewCaOutput,
    },
    /// Create a client-only CA (as `client-ca`) whose key is inside a PKCS#11
    /// token and never leaves it: the token signs the CA's own certificate.
    /// Use the certificate file as the cluster's `ca.cert_file`, next to
    /// `ca.pkcs11`.
    ClientCaForToken {
        /// The cluster it is for (named in its subject).
        #[arg(long)]
        cluster: String,
        /// How long the CA is valid; rotate it before then (`next_ca`).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "365d")]
        validity: Duration,
        #[command(flatten)]
        token: TokenKeyArgs,
        /// Make that key pair inside the token first (it never leaves it).
        #[arg(long, value_enum)]
        generate: Option<TokenKeyTypeArg>,
        /// The token's user PIN (a file nobody else can read): the key signs
        /// the CA's certificate.
        #[arg(long)]
        token_pin_file: PathBuf,
        /// Where to write the certificate (must not exist).
        #[arg(long)]
        out_cert: PathBuf,
    },
    /// Write the Talos cluster CA certificate alone, for a cluster's
    /// `talos_ca.cert_file` (accepted-CA mode), from a talosconfig, a
    /// secrets bundle or a machine config; any key in them is left behind.
    /// Run it where those files already are (an administrator's machine).
    TalosCa {
        /// A talosconfig: its context's `ca`.
        #[arg(long, conflicts_with_all = ["secrets_bundle", "machine_config"], required_unless_present_any = ["secrets_bundle", "machine_config"])]
        talosconfig: Option<PathBuf>,
        /// Which context of --talosconfig (default: its current context).
        #[arg(long, requires = "talosconfig")]
        context: Option<String>,
        /// A `talosctl gen secrets` bundle: `certs.os.crt`.
        #[arg(long, conflicts_with = "machine_config")]
        secrets_bundle: Option<PathBuf>,
        /// A machine config: `machine.ca.crt`, and the `machine.acceptedCAs`
        /// that can vouch for a server (a Talos CA rotation in progress).
        #[arg(long)]
        machine_config: Option<PathBuf>,
        /// Where to write the certificate(s), PEM (must not exist).
        #[arg(long)]
        out_cert: PathBuf,
    },
    /// Print the machine-config patches that add a client-only CA to Talos's
    /// `machine.acceptedCAs`, or remove it, in both forms (append, and
    /// replace for automation), with how to apply them.
    Patch(super::ca_patch::PatchArgs),
    /// Create a new self-signed Talos-style CA (for evaluation clusters and
    /// demos; production clusters use the CA Talos generated).
    New {
        #[command(flatten)]
        output: NewCaOutput,
        /// Organization of the CA's subject (Talos uses `talos`).
        #[arg(long, default_value = "talos")]
        organization: String,
        /// How long the CA is valid.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10y")]
        validity: Duration,
    },
}

/// The key types of `ca new` and `ca intermediate`, as the flag spells them.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KeyTypeArg {
    Ed25519,
    EcdsaP256,
    EcdsaP384,
}

impl From<KeyTypeArg> for NewKeyType {
    fn from(arg: KeyTypeArg) -> Self {
        match arg {
            KeyTypeArg::Ed25519 => NewKeyType::Ed25519,
            KeyTypeArg::EcdsaP256 => NewKeyType::EcdsaP256,
            KeyTypeArg::EcdsaP384 => NewKeyType::EcdsaP384,
        }
    }
}

/// One CA source, named like the keys of a cluster's `ca` configuration.
#[derive(Debug, Args)]
#[group(required = true, multiple = true)]
pub struct CaSourceArgs {
    /// PEM certificate (signer first, then its issuers up to the Talos root).
    #[arg(long, conflicts_with_all = ["secrets_bundle", "machine_config"])]
    pub cert_file: Option<PathBuf>,
    /// PEM private key matching --cert-file.
    #[arg(long, requires = "cert_file", conflicts_with = "pkcs11_module")]
    pub key_file: Option<PathBuf>,
    /// PKCS#11 module holding the key of --cert-file (with the other --pkcs11-* flags).
    #[arg(long, requires_all = ["cert_file", "pkcs11_token_label", "pkcs11_key_label", "pkcs11_pin_file"])]
    pub pkcs11_module: Option<PathBuf>,
    /// Label of the PKCS#11 token.
    #[arg(long, requires = "pkcs11_module")]
    pub pkcs11_token_label: Option<String>,
    /// Label of the private key on the token.
    #[arg(long, requires = "pkcs11_module")]
    pub pkcs11_key_label: Option<String>,
    /// File holding the token's user PIN (mode 0600).
    #[arg(long, requires = "pkcs11_module")]
    pub pkcs11_pin_file: Option<PathBuf>,
    /// A `talosctl gen secrets` bundle (uses certs.os).
    #[arg(long, conflicts_with = "machine_config")]
    pub secrets_bundle: Option<PathBuf>,
    /// A control plane machine config (uses machine.ca).
    #[arg(long)]
    pub machine_config: Option<PathBuf>,
    /// Extra CA certificates trusted during a rotation.
    #[arg(long = "accepted-ca")]
    pub accepted_cas: Vec<PathBuf>,
    /// Accept a key file readable by group or others (never in production).
    #[arg(long)]
    pub allow_insecure_key_permissions: bool,
    /// Accepted-CA mode: the Talos cluster CA certificate, as PEM (as
    /// `talos_ca.cert_file`).
    #[arg(long, conflicts_with_all = ["talos_ca_talosconfig", "talos_ca_secrets_bundle", "talos_ca_machine_config"])]
    pub talos_ca_cert_file: Option<PathBuf>,
    /// Accepted-CA mode: the Talos cluster CA from a talosconfig's current
    /// context (as `talos_ca.talosconfig`).
    #[arg(long, conflicts_with_all = ["talos_ca_secrets_bundle", "talos_ca_machine_config"])]
    pub talos_ca_talosconfig: Option<PathBuf>,
    /// Accepted-CA mode: from a secrets bundle without the CA key (as
    /// `talos_ca.secrets_bundle`).
    #[arg(long, conflicts_with = "talos_ca_machine_config")]
    pub talos_ca_secrets_bundle: Option<PathBuf>,
    /// Accepted-CA mode: from a machine config without the CA key (as
    /// `talos_ca.machine_config`).
    #[arg(long)]
    pub talos_ca_machine_config: Option<PathBuf>,
}

impl CaSourceArgs {
    /// The flags name a source exactly as a cluster's `ca` keys do.
    pub fn source(&self) -> anyhow::Result<CaSource> {
        let keys = crate::config::CaConfig {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            secrets_bundle: self.secrets_bundle.clone(),
            machine_config: self.machine_config.clone(),
            pkcs11: self.pkcs11_source(),
            allow_insecure_key_permissions: self.allow_insecure_key_permissions,
        };
        keys.source().map_err(|_| {
            anyhow::anyhow!(
                "give exactly one CA source: --cert-file with --key-file or with the --pkcs11-* flags, \
                 --secrets-bundle, or --machine-config"
            )
        })
    }

    fn pkcs11_source(&self) -> Option<crate::config::Pkcs11Source> {
        Some(crate::config::Pkcs11Source {
            module: self.pkcs11_module.clone()?,
            token_label: self.pkcs11_token_label.clone()?,
            key_label: self.pkcs11_key_label.clone()?,
            pin_file: self.pkcs11_pin_file.clone()?,
        })
    }

    pub fn options(&self) -> anyhow::Result<CaOptions> {
        let talos_ca = crate::config::TalosCaConfig {
            cert_file: self.talos_ca_cert_file.clone(),
            talosconfig: self.talos_ca_talosconfig.clone(),
            context: None,
            secrets_bundle: self.talos_ca_secrets_bundle.clone(),
            machine_config: self.talos_ca_machine_config.clone(),
        };
        let named = [
            &talos_ca.cert_file,
            &talos_ca.talosconfig,
            &talos_ca.secrets_bundle,
            &talos_ca.machine_config,
        ]
        .iter()
        .any(|p| p.is_some());
        Ok(CaOptions {
            accepted_cas: self.accepted_cas.clone(),
            allow_insecure_key_permissions: self.allow_insecure_key_permissions,
            talos_ca: named.then(|| talos_ca.source()).transpose()?,
        })
    }

    fn load(&self, now: OffsetDateTime) -> anyhow::Result<CertificateAuthority> {
        let source = self.source()?;
        CertificateAuthority::load(&source, &self.options()?, now)
            .map_err(|e| anyhow::anyhow!("refused [{}]: {e}", e.code()))
    }
}

/// The `ca` commands: reading, checking and making CA material.
pub(super) fn run(
    command: CaCommand,
    now: OffsetDateTime,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    match command {
        CaCommand::Inspect { source } => {
            let ca = source.load(now)?;
            writeln!(out, "{}", source.source()?)?;
            writeln!(out, "{}", ca.summary(now))?;
            if let Some(token) = ca.key_location() {
                writeln!(out, "key:         {token}")?;
            }
            match ca.mode() {
                TrustMode::Intermediate => {
                    writeln!(out, "mode:        intermediate; Talos root:")?;
                    writeln!(out, "{}", CaSummary::of(ca.root(), now))?;
                }
                TrustMode::AcceptedCa => {
                    writeln!(out, "mode:        accepted-ca; talosconfigs verify apid with:")?;
                    for cert in crate::ca::parse_certificates(ca.trust_bundle_pem(), "trust bundle")? {
                        writeln!(out, "{}", CaSummary::of(&cert, now))?;
                    }
                }
                TrustMode::ClusterCa => writeln!(out, "mode:        cluster-ca")?,
            }
            for warning in ca.warnings() {
                writeln!(out, "warning: {warning}")?;
            }
            Ok(())
        }
        CaCommand::Intermediate {
            source,
            validity,
            output:
                NewCaOutput {
                    out_cert,
                    out_key,
                    key_type,
                },
            common_name,
        } => {
            let root = source.load(now)?;
            if root.is_intermediate() {
                bail!("`ca intermediate` needs the Talos root CA material, not an intermediate");
            }
            let ca = generate::new_intermediate(&root, key_type.into(), &common_name, validity, now)?;
            write_new_files(&out_cert, &ca.cert_pem, &out_key, &ca.key_pem)?;
            writeln!(
                out,
                "wrote {} (intermediate, then the Talos root) and {}",
                out_cert.display(),
                out_key.display()
            )?;
            writeln!(out, "{}", CaSummary::of(&ca.cert, now))?;
            Ok(())
        }
        CaCommand::IntermediateForToken {
            source,
            validity,
            token,
            generate,
            token_pin_file,
            out_cert,
            common_name,
        } => {
            let root = source.load(now)?;
            if root.is_intermediate() {
                bail!("`ca intermediate-for-token` needs the Talos root CA material, not an intermediate");
            }
            if out_cert.exists() {
                bail!("{} already exists; refusing to overwrite it", out_cert.display());
            }
            // Without --generate, no PIN: the public key is readable
            // without logging in.
            let token = token.source(token_pin_file.clone().unwrap_or_default());
            let pin = match (generate, &token_pin_file) {
                (Some(_), Some(pin_file)) => Some(crate::secret_file::read_secret(pin_file)?),
                _ => None,
            };
            let spki = token_key_pair(&token, generate, pin.as_deref().map(String::as_str))?;
            let (cert, cert_pem) =
                generate::intermediate_certificate(&root, &spki, &common_name, validity, now)?;
            write_new_file(&out_cert, &cert_pem, 0o644)?;
            writeln!(
                out,
                "wrote {} (intermediate, then the Talos root) for {}",
                out_cert.display(),
                token.describe()
            )?;
            writeln!(out, "{}", CaSummary::of(&cert, now))?;
            Ok(())
        }
        CaCommand::ClientCa {
            cluster,
            validity,
            output:
                NewCaOutput {
                    out_cert,
                    out_key,
                    key_type,
                },
        } => {
            let ca = generate::new_client_ca(key_type.into(), &cluster, validity, now)?;
            write_ca(out, &ca, &out_cert, &out_key, now)?;
            client_ca_next_steps(out, &out_cert)
        }
        CaCommand::ClientCaForToken {
            cluster,
            validity,
            token,
            generate,
            token_pin_file,
            out_cert,
        } => {
            if out_cert.exists() {
                bail!("{} already exists; refusing to overwrite it", out_cert.display());
            }
            let token = token.source(token_pin_file.clone());
            let pin = crate::secret_file::read_secret(&token_pin_file)?;
            let spki = token_key_pair(&token, generate, Some(&pin))?;
            let key = crate::keys::pkcs11::Pkcs11Key::open(&token, &pin, &spki).map_err(refused)?;
            let cert = generate::client_ca_certificate(&key, &cluster, validity, now)?;
            write_new_file(&out_cert, &cert.to_pem(), 0o644)?;
            writeln!(out, "wrote {} for {}", out_cert.display(), token.describe())?;
            writeln!(out, "{}", CaSummary::of(&cert, now))?;
            client_ca_next_steps(out, &out_cert)
        }
        CaCommand::Patch(args) => super::ca_patch::run(&args, out),
        CaCommand::TalosCa {
            talosconfig,
            context,
            secrets_bundle,
            machine_config,
            out_cert,
        } => {
            let source = crate::config::TalosCaConfig {
                cert_file: None,
                talosconfig,
                context,
                secrets_bundle,
                machine_config,
            }
            .source()?;
            let certs = crate::ca::talos_ca_certificates(&source, crate::ca::KeyPolicy::Ignore)
                .map_err(|e| anyhow::anyhow!("refused [{}]: {e}", e.code()))?;
            let pem: String = certs.iter().map(crate::x509::ParsedCertificate::to_pem).collect();
            write_new_file(&out_cert, &pem, 0o644)?;
            writeln!(out, "wrote {} from {source}:", out_cert.display())?;
            for cert in &certs {
                writeln!(out, "{}", CaSummary::of(cert, now))?;
            }
            Ok(())
        }
        CaCommand::New {
            output:
                NewCaOutput {
                    out_cert,
                    out_key,
                    key_type,
                },
            organization,
            validity,
        } => {
            let ca = generate::new_root(key_type.into(), &organization, validity, now)?;
            write_ca(out, &ca, &out_cert, &out_key, now)
        }
    }
}

/// Write a new CA's certificate and key (never over a file) and say what
/// was made.
fn write_ca(
    out: &mut (dyn Write + Send),
    ca: &generate::NewCa,
    out_cert: &std::path::Path,
    out_key: &std::path::Path,
    now: OffsetDateTime,
) -> anyhow::Result<()> {
    write_new_files(out_cert, &ca.cert_pem, out_key, &ca.key_pem)?;
    writeln!(out, "wrote {} and {}", out_cert.display(), out_key.display())?;
    writeln!(out, "{}", CaSummary::of(&ca.cert, now))?;
    Ok(())
}

/// The public key of the token's key pair: made inside the token first
/// when `generate` says so (which needs the PIN), else read (which does
/// not).
fn token_key_pair(
    token: &crate::config::Pkcs11Source,
    generate: Option<TokenKeyTypeArg>,
    pin: Option<&str>,
) -> anyhow::Result<spki::SubjectPublicKeyInfoOwned> {
    Ok(match (generate, pin) {
        (Some(kind), Some(pin)) => {
            crate::keys::pkcs11::generate_key_pair(token, pin, kind.into()).map_err(refused)?
        }
        _ => crate::keys::pkcs11::token_public_key(token).map_err(refused)?,
    })
}

/// A token's refusal, with its code.
fn refused(error: crate::keys::pkcs11::Pkcs11Error) -> anyhow::Error {
    anyhow::anyhow!("refused [{}]: {error}", error.code())
}

/// What to do with a new client-only CA.
fn client_ca_next_steps(out: &mut (dyn Write + Send), cert: &std::path::Path) -> anyhow::Result<()> {
    writeln!(
        out,
        "next: have Talos accept it (talos-sso-server ca patch add --ca-cert {} --current <machine config>), \
         then name it in the cluster's `ca` with the Talos CA certificate in `talos_ca`",
        cert.display()
    )?;
    Ok(())
}
