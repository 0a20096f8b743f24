//! The `talos-sso-server` command line: `serve`, `check`, `migrate`,
//! `audit verify|checkpoint|public-key|new-key`, `break-glass`, and the CA tools (`ca inspect`,
//! `ca intermediate`, `ca new`).
//!
//! `anyhow` stops here: commands turn domain errors into a message and an
//! exit status; the domain modules keep their own error enums.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use time::OffsetDateTime;

use crate::app::{
    SystemClock, load_clusters, migrate_store, open_store, owner_warning, require_current_schema,
};
use crate::audit::checkpoint::{AuditKey, Checkpoints};
use crate::audit::store::AuditStore;
use crate::break_glass::BreakGlassRequest;
use crate::ca::generate::{self, NewKeyType};
use crate::ca::{CaOptions, CaSource, CaSummary, CertificateAuthority};
use crate::config::Config;
use crate::server::Server;

#[derive(Debug, Parser)]
#[command(
    name = "talos-sso-server",
    version,
    about = "Short-lived Talos client certificates for people who log in with single sign-on"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API.
    Serve {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate the configuration, CA material and policy examples; exit
    /// non-zero with the reasons when something is wrong.
    Check {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Create or upgrade the audit database schema, connected as its owner.
    Migrate {
        /// The configuration file (YAML or TOML); its database role owns the schema.
        #[arg(long)]
        config: PathBuf,
        /// The Postgres role the server runs as: granted exactly what it
        /// needs (SELECT and INSERT; DELETE on deny_list; SELECT on every
        /// view) and checked to hold nothing more. Run again after every
        /// upgrade.
        #[arg(long, value_name = "ROLE")]
        runtime_role: Option<String>,
    },
    /// Work with the audit trail.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Issue a certificate without the identity provider (it is down) and
    /// write a talosconfig; recorded in the audit trail with the operator,
    /// host and reason.
    BreakGlass {
        /// The server's configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
        /// The cluster to issue for, as named in the configuration.
        #[arg(long)]
        cluster: String,
        /// Talos role to grant (repeat for several).
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Certificate lifetime, at most the cluster's max_ttl.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "15m")]
        ttl: Duration,
        /// Why the identity provider cannot be used (required; recorded).
        #[arg(long)]
        reason: String,
        /// Where to write the talosconfig (must not exist; mode 0600), or
        /// `-` for standard output (then nothing else goes there: in a
        /// container, `kubectl exec ... --out - > file`).
        #[arg(long)]
        out: PathBuf,
    },
    /// Work with Talos CA material.
    #[command(subcommand)]
    Ca(Box<CaCommand>),
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Recompute the hash chain from the database and report the first
    /// record that does not match; with `audit.checkpoints` configured,
    /// also every record a signed checkpoint names, and that none is
    /// missing from the end.
    Verify {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
        /// More checkpoint files to check against (other replicas' or a
        /// copy kept elsewhere), besides the configured one.
        #[arg(long = "checkpoints")]
        checkpoints: Vec<PathBuf>,
    },
    /// Sign the chain head now and publish the checkpoint (file, log,
    /// webhook), as the server does at each interval.
    Checkpoint {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the public key of the configured audit key (a file or a
    /// token), PEM: what `talos-sso audit verify --public-key` takes.
    PublicKey {
        /// The configuration file (YAML or TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Create an audit signing key (Ed25519) for `audit.checkpoints.key_file`
    /// and its public key, for whoever verifies checkpoints.
    NewKey {
        /// Where to write the private key, mode 0600 (must not exist).
        #[arg(long)]
        out_key: PathBuf,
        /// Where to write the public key (must not exist).
        #[arg(long)]
        out_public: PathBuf,
    },
}

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
        /// The PKCS#11 module holding the intermediate's key.
        #[arg(long)]
        token_module: PathBuf,
        /// The token's label.
        #[arg(long)]
        token_label: String,
        /// The label of the key pair on the token (its public key is read).
        #[arg(long)]
        token_key_label: String,
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

    fn pkcs11_source(&self) -> Option<crate::ca::Pkcs11Source> {
        Some(crate::ca::Pkcs11Source {
            module: self.pkcs11_module.clone()?,
            token_label: self.pkcs11_token_label.clone()?,
            key_label: self.pkcs11_key_label.clone()?,
            pin_file: self.pkcs11_pin_file.clone()?,
        })
    }

    pub fn options(&self) -> CaOptions {
        CaOptions {
            accepted_cas: self.accepted_cas.clone(),
            allow_insecure_key_permissions: self.allow_insecure_key_permissions,
        }
    }

    fn load(&self, now: OffsetDateTime) -> anyhow::Result<CertificateAuthority> {
        let source = self.source()?;
        CertificateAuthority::load(&source, &self.options(), now)
            .map_err(|e| anyhow::anyhow!("refused [{}]: {e}", e.code()))
    }
}

/// A configuration error as the operator reads it: prefixed with the file,
/// unless the file is fine and an environment override is not.
fn config_error_message(path: &Path, error: &crate::config::ConfigError) -> String {
    match error {
        crate::config::ConfigError::Environment { .. } => error.to_string(),
        _ => format!("{}: {error}", path.display()),
    }
}

fn load_config(path: &Path) -> anyhow::Result<Config> {
    let config = Config::load(path).map_err(|e| anyhow::anyhow!(config_error_message(path, &e)))?;
    crate::telemetry::init_logging(&config.log.format);
    Ok(config)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = interrupt.await;
                return;
            }
        };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let server = Server::bind(config, Arc::new(SystemClock)).await?;
    server.run_until_stopped(shutdown_signal()).await;
    Ok(())
}

/// `migrate`: a runtime role is checked before anything changes, granted
/// after the schema is current.
async fn migrate(
    store: &AuditStore,
    runtime_role: Option<&str>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    if let Some(role) = runtime_role {
        store.check_runtime_role(role).await?;
    }
    migrate_store(store).await?;
    writeln!(out, "audit database ({}) is up to date", store.kind())?;
    if let Some(role) = runtime_role {
        let grants = store.grant_runtime_role(role).await?;
        writeln!(out, "runtime role {} may:", grants.role)?;
        for line in &grants.granted {
            writeln!(out, "  {line}")?;
        }
    }
    Ok(())
}

/// Run a command; the returned error is printed by `main` and exits 1.
pub async fn run(cli: Cli, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    if let Command::Ca(_) = &cli.command {
        crate::telemetry::init_logging("text");
    }
    match cli.command {
        Command::Serve { config } => {
            // SIGHUP reloads the configuration. Taken from here on, so that
            // one sent while the server starts (`systemctl reload` during a
            // slow start) does not end it: what is being loaded is the
            // newest configuration anyway.
            let _hangups_while_starting =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
            serve(load_config(&config)?).await
        }
        Command::Check { config } => {
            let config = load_config(&config)?;
            let (clusters, warnings) = load_clusters(&config, now)?;
            for (name, cluster) in &clusters {
                writeln!(
                    out,
                    "cluster {name}: CA {} ({} days left), {} rules",
                    crate::ca::describe_name(&cluster.ca.signer().raw_subject),
                    cluster.ca.summary(now).days_left,
                    cluster.config.rules.len()
                )?;
                if let Some(token) = cluster.ca.key_location() {
                    writeln!(out, "cluster {name}: key in {token}")?;
                }
            }
            writeln!(out, "policy examples: {} passed", config.policy_examples.len())?;
            for (cluster, warning) in &warnings {
                writeln!(out, "warning: cluster {cluster}: {warning}")?;
            }
            for warning in config.warnings() {
                writeln!(out, "warning: {warning}")?;
            }
            match &config.audit.checkpoints {
                None => writeln!(
                    out,
                    "note: {}",
                    config.unsigned_trail_notice().unwrap_or_default()
                )?,
                Some(settings) => {
                    let keys = crate::audit::checkpoint::configured_keys(settings)?;
                    writeln!(
                        out,
                        "audit checkpoints: signed every {} with key {}, appended to {}",
                        humantime::format_duration(settings.interval),
                        keys[0].key_id,
                        settings.file.display()
                    )?;
                }
            }
            let store = open_store(&config, false).await?;
            store
                .ping()
                .await
                .map_err(|e| anyhow::anyhow!("audit database: {e}"))?;
            writeln!(out, "audit database: reachable")?;
            if config.database.migrate_on_start == Some(false) {
                require_current_schema(&store).await?;
                writeln!(out, "audit database: schema current")?;
            }
            if let Some(warning) = owner_warning(&store).await? {
                writeln!(out, "warning: audit database: {warning}")?;
            }
            // The identity issuers, as `serve` will meet them at start.
            let authenticator = crate::app::authenticator(&config).await?;
            for line in authenticator.check().await.map_err(anyhow::Error::msg)? {
                writeln!(out, "{line}")?;
            }
            Ok(())
        }
        Command::Migrate { config, runtime_role } => {
            let config = load_config(&config)?;
            let store = open_store(&config, false).await?;
            let result = migrate(&store, runtime_role.as_deref(), out).await;
            store.close().await;
            result
        }
        Command::Audit(AuditCommand::Verify { config, checkpoints }) => {
            let config = load_config(&config)?;
            let store = open_store(&config, false).await?;
            let status = verify_on_host(&config, &store, &checkpoints).await;
            store.close().await;
            // The reasons quote the trail and the checkpoint files: escaped
            // for the terminal, line by line.
            let escape = |text: String| {
                text.lines()
                    .map(|l| crate::audit::text::clean(l, 1 << 20))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let text = talos_sso_api::chain::describe(&status?).map_err(|e| anyhow::anyhow!(escape(e)))?;
            writeln!(out, "{}", escape(text))?;
            Ok(())
        }
        Command::Audit(AuditCommand::Checkpoint { config }) => {
            let config = load_config(&config)?;
            let Some(settings) = &config.audit.checkpoints else {
                bail!("audit.checkpoints is not configured: there is no audit key to sign with")
            };
            let checkpoints = Checkpoints::open(settings)?;
            let store = open_store(&config, false).await?;
            let signed = checkpoints
                .publish(
                    &store,
                    talos_sso_api::checkpoint::trigger::COMMAND,
                    OffsetDateTime::now_utc(),
                )
                .await;
            store.close().await;
            let signed = signed?;
            writeln!(
                out,
                "checkpoint signed: record {} ({}), appended to {}",
                signed.seq,
                signed.hash,
                checkpoints.file().display()
            )?;
            Ok(())
        }
        Command::Audit(AuditCommand::PublicKey { config }) => {
            let config = load_config(&config)?;
            let Some(settings) = &config.audit.checkpoints else {
                bail!("audit.checkpoints is not configured: there is no audit key")
            };
            write!(out, "{}", AuditKey::configured(settings)?.public_pem())?;
            Ok(())
        }
        Command::Audit(AuditCommand::NewKey { out_key, out_public }) => {
            let (key, private_pem, public_pem) = AuditKey::generate().map_err(anyhow::Error::msg)?;
            write_new_files(&out_public, &public_pem, &out_key, &private_pem)?;
            writeln!(
                out,
                "audit signing key written to {} (mode 0600), its public key to {}\nkey id {}",
                out_key.display(),
                out_public.display(),
                key.public().key_id
            )?;
            Ok(())
        }
        Command::BreakGlass {
            config,
            cluster,
            roles,
            ttl,
            reason,
            out: path,
        } => {
            let config = load_config(&config)?;
            let request = BreakGlassRequest {
                cluster: &cluster,
                roles: &roles,
                ttl,
                reason: &reason,
                out: &path,
            };
            let result = crate::break_glass::run(&config, &request).await?;
            let summary = format!(
                "(context {}): serial {}, valid until {}, audit record {}",
                result.context,
                result.serial,
                crate::ca::format_time(result.not_after),
                result.audit_seq
            );
            match &result.talosconfig {
                // Standard output carries the talosconfig alone; what is
                // said about it goes to standard error.
                Some(talosconfig) => {
                    out.write_all(talosconfig.as_bytes())?;
                    out.flush()?;
                    eprintln!("wrote the talosconfig to standard output {summary}");
                }
                None => writeln!(out, "wrote {} {summary}", path.display())?,
            }
            Ok(())
        }
        Command::Ca(ca) => run_ca(*ca, now, out),
    }
}

/// The `ca` commands: reading, checking and making CA material.
fn run_ca(command: CaCommand, now: OffsetDateTime, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match command {
        CaCommand::Inspect { source } => {
            let ca = source.load(now)?;
            writeln!(out, "{}", source.source()?)?;
            writeln!(out, "{}", ca.summary(now))?;
            if let Some(token) = ca.key_location() {
                writeln!(out, "key:         {token}")?;
            }
            if ca.is_intermediate() {
                writeln!(out, "mode:        intermediate; Talos root:")?;
                writeln!(out, "{}", CaSummary::of(ca.root(), now))?;
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
            token_module,
            token_label,
            token_key_label,
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
            let token = crate::ca::Pkcs11Source {
                module: token_module,
                token_label,
                key_label: token_key_label,
                pin_file: token_pin_file.clone().unwrap_or_default(),
            };
            let refused =
                |e: crate::keys::pkcs11::Pkcs11Error| anyhow::anyhow!("refused [{}]: {e}", e.code());
            let spki = match (generate, &token_pin_file) {
                (Some(kind), Some(pin_file)) => {
                    let pin = crate::config::read_secret(pin_file)?;
                    crate::keys::pkcs11::generate_key_pair(&token, &pin, kind.into()).map_err(refused)?
                }
                _ => crate::keys::pkcs11::token_public_key(&token).map_err(refused)?,
            };
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
            write_new_files(&out_cert, &ca.cert_pem, &out_key, &ca.key_pem)?;
            writeln!(out, "wrote {} and {}", out_cert.display(), out_key.display())?;
            writeln!(out, "{}", CaSummary::of(&ca.cert, now))?;
            Ok(())
        }
    }
}

/// `audit verify` on the server host: the chain from the database, against
/// the configured checkpoint file and `extra` ones (all checked with the
/// configured keys). A checkpoint file that is not what was signed fails
/// the verification, naming the file and line.
async fn verify_on_host(
    config: &Config,
    store: &crate::audit::store::AuditStore,
    extra: &[PathBuf],
) -> anyhow::Result<talos_sso_api::audit::ChainStatus> {
    // The chain is read from seq 1: rows below it would pass unseen.
    store.require_chain_only().await?;
    let signed = match &config.audit.checkpoints {
        None if !extra.is_empty() => {
            bail!(
                "--checkpoints needs audit.checkpoints in the configuration (its key checks the signatures)"
            )
        }
        None => None,
        Some(settings) => {
            let keys = crate::audit::checkpoint::configured_keys(settings)?;
            let files = std::iter::once(&settings.file).chain(extra);
            let read: Result<Vec<Vec<_>>, _> = files
                .map(|path| crate::audit::checkpoint::read_file(path, &keys))
                .collect();
            Some(read.map(|files| files.concat()))
        }
    };
    crate::audit::checkpoint::verify_store(store, signed)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Write a certificate (0644) and its key (0600); never overwrite either.
pub fn write_new_files(
    cert_path: &Path,
    cert_pem: &str,
    key_path: &Path,
    key_pem: &str,
) -> anyhow::Result<()> {
    for path in [cert_path, key_path] {
        if path.exists() {
            bail!("{} already exists; refusing to overwrite it", path.display());
        }
    }
    write_new_file(key_path, key_pem, 0o600)?;
    write_new_file(cert_path, cert_pem, 0o644)?;
    Ok(())
}

fn write_new_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    let _ = mode;
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Subcommands and arguments under `command` that have no help text.
    fn undocumented(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id != "help" && id != "version" && arg.get_help().is_none() {
                missing.push(format!("{path} --{id}"));
            }
        }
        for sub in command.get_subcommands() {
            let sub_path = format!("{path} {}", sub.get_name());
            if sub.get_about().is_none() && sub.get_name() != "help" {
                missing.push(sub_path.clone());
            }
            undocumented(sub, &sub_path, missing);
        }
    }

    #[test]
    fn every_command_and_flag_has_help() {
        let mut missing = Vec::new();
        undocumented(&Cli::command(), "talos-sso-server", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn an_override_typo_is_not_blamed_on_the_file() {
        let path = Path::new("good.yaml");
        let typo = crate::config::ConfigError::Environment {
            variables: "TALOS_SSO__CLUSTERS__PROD__MAXTTL".into(),
            reason: "unknown field `maxttl`".into(),
        };
        let message = config_error_message(path, &typo);
        assert!(!message.contains("good.yaml"), "{message}");
        assert!(message.contains("TALOS_SSO__CLUSTERS__PROD__MAXTTL"), "{message}");
        let file = crate::config::ConfigError::Invalid("unknown field `maxttl`".into());
        assert!(config_error_message(path, &file).starts_with("good.yaml: "));
    }

    #[test]
    fn break_glass_needs_a_reason_on_the_command_line() {
        let parsed = Cli::try_parse_from([
            "talos-sso-server",
            "break-glass",
            "--config",
            "c.yaml",
            "--cluster",
            "prod",
            "--role",
            "os:reader",
            "--out",
            "o.yaml",
        ]);
        let error = parsed.unwrap_err().to_string();
        assert!(error.contains("--reason"), "{error}");
    }
}
