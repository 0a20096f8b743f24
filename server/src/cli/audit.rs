//! `audit verify|checkpoint|public-key|new-key`: the audit trail checked
//! on the server host, checkpoints signed on demand, and the audit key.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use clap::Subcommand;
use time::OffsetDateTime;

use super::files::write_new_files;
use crate::app::open_store;
use crate::audit::checkpoint::{AuditKey, Checkpoints};
use crate::config::Config;

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

/// Run an `audit` command.
pub(super) async fn run(command: AuditCommand, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match command {
        AuditCommand::Verify { config, checkpoints } => {
            let config = super::load_config(&config)?;
            let store = open_store(&config, false).await?;
            let status = verify_on_host(&config, &store, &checkpoints).await;
            store.close().await;
            // The reasons quote the trail and the checkpoint files: escaped
            // for the terminal, line by line.
            let escape = |text: String| {
                text.lines()
                    .map(|l| talos_sso_text::clean(l, 1 << 20))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let text = talos_sso_api::chain::describe(&status?).map_err(|e| anyhow::anyhow!(escape(e)))?;
            writeln!(out, "{}", escape(text))?;
            Ok(())
        }
        AuditCommand::Checkpoint { config } => {
            let config = super::load_config(&config)?;
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
        AuditCommand::PublicKey { config } => {
            let config = super::load_config(&config)?;
            let Some(settings) = &config.audit.checkpoints else {
                bail!("audit.checkpoints is not configured: there is no audit key")
            };
            write!(out, "{}", AuditKey::configured(settings)?.public_pem())?;
            Ok(())
        }
        AuditCommand::NewKey { out_key, out_public } => {
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
