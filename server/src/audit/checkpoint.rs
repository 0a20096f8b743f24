//! Signing and publishing checkpoints of the audit trail
//! (`audit.checkpoints`): the chain head (last `seq` and its hash) signed
//! with the server's own Ed25519 audit key, at the configured interval when
//! the trail has grown, at start, at shutdown and on demand, and published
//! outside the database: appended to the checkpoint file (fsync'd), written
//! to the log (so log shipping carries it away), and POSTed to the webhook
//! when one is configured. Whoever can rewrite the table cannot rewrite
//! what was signed before: `audit verify` then names the checkpoint the
//! trail contradicts.
//!
//! The checkpoint itself, its signed bytes and the reading of a checkpoint
//! file are the API's ([`talos_sso_api::checkpoint`]), so that the CLI
//! checks them without a server.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use der::{Decode, Encode};
use ring::signature::Ed25519KeyPair;
use talos_sso_api::checkpoint::{
    CHECKPOINT_TYPE, Checkpoint, CheckpointError, CheckpointKey, read_checkpoints,
};
use time::OffsetDateTime;

use super::store::{AuditStore, StoreError};
use crate::config::CheckpointConfig;
use crate::keys::{KeyKind, SignError, Signer, SoftwareKey, key_kind, pkcs11, software};
use crate::x509::{self, oid};

/// Longest a webhook may take to take a checkpoint.
const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Why checkpoints cannot be signed with this configuration.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointSetupError {
    #[error("audit.checkpoints.key_file {}: {reason}", .path.display())]
    Key { path: PathBuf, reason: String },
    #[error("audit.checkpoints.pkcs11 ({origin}): {reason}")]
    TokenKey { origin: String, reason: String },
    #[error("audit.checkpoints.file {}: cannot be appended to: {reason}", .path.display())]
    File { path: PathBuf, reason: String },
    #[error("audit.checkpoints.previous_public_keys: {0}")]
    PreviousKey(CheckpointError),
    #[error("audit.checkpoints.webhook_url: {0}")]
    Webhook(String),
    #[error(
        "audit.checkpoints.file {}: its last line is cut short at byte {offset} (a crash or a full disk while it \
         was written); nothing is appended to it: move it aside, keep it for verification (`audit verify \
         --checkpoints`), and start again",
        .path.display()
    )]
    Torn { path: PathBuf, offset: u64 },
    #[error("audit.checkpoints.file: {0}")]
    LastUnreadable(CheckpointError),
}

/// Why a checkpoint was not published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the checkpoint file {} could not be written: {reason}", .path.display())]
    File { path: PathBuf, reason: String },
    /// The audit key's token could not sign.
    #[error("the audit key could not sign: {0}")]
    Signing(String),
    /// The trail no longer holds what the last checkpoint signed: nothing
    /// is signed over it.
    #[error(
        "the audit trail contradicts the last checkpoint (record {seq}, signed by {server} at {signed_at}): the \
         trail was changed or cut; nothing is signed over it. Run `talos-sso-server audit verify` and investigate"
    )]
    Contradicted {
        seq: i64,
        server: String,
        signed_at: String,
    },
}

/// The audit signing key: Ed25519, PKCS#8 PEM (v1 as OpenSSL writes it,
/// or v2), in a file nobody else can read.
pub struct AuditKey {
    pair: Box<dyn Signer>,
    public: CheckpointKey,
    spki_der: Vec<u8>,
}

impl std::fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditKey")
            .field("key_id", &self.public.key_id)
            .finish()
    }
}

impl AuditKey {
    pub fn load(path: &Path) -> Result<Self, CheckpointSetupError> {
        let bad = |reason: String| CheckpointSetupError::Key {
            path: path.to_owned(),
            reason,
        };
        let text = crate::secret_file::read_secret(path).map_err(|e| bad(secret_reason(e)))?;
        let blocks = x509::pem_blocks(&text).map_err(|e| bad(format!("not PEM: {e}")))?;
        let Some((_, der)) = blocks.into_iter().find(|(label, _)| label == "PRIVATE KEY") else {
            return Err(bad(
                "no `PRIVATE KEY` block (PKCS#8 PEM, as `openssl genpkey -algorithm ed25519` writes)".into(),
            ));
        };
        let info = pkcs8::PrivateKeyInfoRef::from_der(&der).map_err(|e| bad(format!("not PKCS#8: {e}")))?;
        if info.algorithm.oid != oid::ED25519 {
            return Err(bad(format!(
                "the key is {}, not Ed25519: the audit key is an Ed25519 key of its own, never a CA key",
                info.algorithm.oid
            )));
        }
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| bad(e.to_string()))?;
        Self::from_signing_key(Box::new(SoftwareKey::Ed25519(pair))).map_err(bad)
    }

    /// The key named by `audit.checkpoints`: its file, or its token (the
    /// one place where the audit key's kind is chosen).
    pub fn configured(config: &CheckpointConfig) -> Result<Self, CheckpointSetupError> {
        match (&config.key_file, &config.pkcs11) {
            (Some(path), _) => Self::load(path),
            (None, Some(source)) => Self::load_pkcs11(source),
            (None, None) => Err(CheckpointSetupError::TokenKey {
                origin: "audit.checkpoints".into(),
                reason: "no key_file and no pkcs11".into(),
            }),
        }
    }

    /// An Ed25519 key inside a PKCS#11 token (its PIN from a file nobody
    /// else can read): the public key is read from the token, and a probe
    /// signature proves the private key is its pair.
    pub fn load_pkcs11(source: &crate::config::Pkcs11Source) -> Result<Self, CheckpointSetupError> {
        let bad = |reason: String| CheckpointSetupError::TokenKey {
            origin: source.describe(),
            reason,
        };
        let pin = crate::secret_file::read_secret(&source.pin_file).map_err(|e| bad(secret_reason(e)))?;
        let spki = pkcs11::token_public_key(source).map_err(|e| bad(e.to_string()))?;
        if key_kind(&spki) != KeyKind::Ed25519 {
            return Err(bad(
                "the key is not Ed25519: the audit key is an Ed25519 key".into()
            ));
        }
        let token_key =
            pkcs11::Pkcs11Key::open(source, pin.as_str(), &spki).map_err(|e| bad(e.to_string()))?;
        let key = Self::from_signing_key(Box::new(token_key)).map_err(&bad)?;
        let probe = key
            .sign(
                "probe",
                0,
                super::GENESIS_HASH,
                OffsetDateTime::UNIX_EPOCH,
                "probe",
            )
            .map_err(|e| bad(e.to_string()))?;
        if read_checkpoints(
            format!("{}\n", probe.to_line()).as_bytes(),
            "probe",
            std::slice::from_ref(&key.public),
        )
        .is_err()
        {
            return Err(bad(
                "a probe signed by the token does not verify with its public key".into(),
            ));
        }
        Ok(key)
    }

    fn from_signing_key(pair: Box<dyn Signer>) -> Result<Self, String> {
        let spki_der = pair
            .public_key_info()
            .and_then(|info| info.to_der())
            .map_err(|e| e.to_string())?;
        let public = CheckpointKey::from_spki_der(&spki_der, "the audit key").map_err(|e| e.to_string())?;
        Ok(Self {
            pair,
            public,
            spki_der,
        })
    }

    /// A new key, as `talos-sso-server audit new-key` writes it: the
    /// private key as PKCS#8 v1 PEM (which OpenSSL reads too) and the
    /// public key as SubjectPublicKeyInfo PEM.
    pub fn generate() -> Result<(Self, String, String), String> {
        let rng = ring::rand::SystemRandom::new();
        let seed: [u8; 32] = ring::rand::generate(&rng)
            .map_err(|_| "no randomness".to_owned())?
            .expose();
        let pkcs8 = software::ed25519_pkcs8_v1(&seed).map_err(|e| e.to_string())?;
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&pkcs8).map_err(|e| e.to_string())?;
        let key = Self::from_signing_key(Box::new(SoftwareKey::Ed25519(pair)))?;
        let private_pem = x509::pem_encode("PRIVATE KEY", &pkcs8);
        let public_pem = key.public_pem();
        Ok((key, private_pem, public_pem))
    }

    pub fn public(&self) -> &CheckpointKey {
        &self.public
    }

    pub fn public_pem(&self) -> String {
        x509::pem_encode("PUBLIC KEY", &self.spki_der)
    }

    /// Sign the head (`seq`, `hash`) as `server` at `at`.
    /// Fails only when the key is in a token that cannot sign now.
    pub fn sign(
        &self,
        server: &str,
        seq: i64,
        hash: &str,
        at: OffsetDateTime,
        trigger: &str,
    ) -> Result<Checkpoint, SignError> {
        let mut checkpoint = Checkpoint {
            kind: CHECKPOINT_TYPE.into(),
            server: server.to_owned(),
            seq,
            hash: hash.to_owned(),
            signed_at: super::truncate_to_micros(at),
            trigger: trigger.to_owned(),
            key_id: self.public.key_id.clone(),
            signature: String::new(),
        };
        let signature = self.pair.sign(&checkpoint.signed_bytes())?;
        checkpoint.signature = hex::encode(signature);
        Ok(checkpoint)
    }
}

/// A secret-file error without the "audit.checkpoints.key_file" twice.
fn secret_reason(error: crate::secret_file::SecretError) -> String {
    error.reason
}

/// This server's name in its checkpoints: the configured one, else the
/// host name.
fn server_name(config: &CheckpointConfig) -> String {
    let name = config.server_name.clone().or_else(|| {
        ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|p| std::fs::read_to_string(p).ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
    });
    super::text::clean(&name.unwrap_or_else(|| "talos-sso-server".into()), 253)
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct CheckpointStats {
    pub signed: AtomicU64,
    pub failures: AtomicU64,
    pub webhook_failures: AtomicU64,
    /// `seq` and Unix time of the last checkpoint published (0 before).
    pub last_seq: AtomicI64,
    pub last_signed_at: AtomicI64,
}

/// Checkpoints as a serving server makes them.
#[derive(Debug)]
pub struct Checkpoints {
    key: AuditKey,
    server: String,
    file: PathBuf,
    interval: Duration,
    previous_keys: Vec<CheckpointKey>,
    webhook: Option<(reqwest::Client, url::Url)>,
    /// The last checkpoint written (this process's, else the file's last
    /// line); held while a checkpoint is written, so that lines never
    /// interleave and come in order.
    last: tokio::sync::Mutex<Option<Checkpoint>>,
    pub stats: Arc<CheckpointStats>,
}

impl Checkpoints {
    /// Load the key and the previous public keys, and make sure the file
    /// can be appended to (it is created when missing).
    pub fn open(config: &CheckpointConfig) -> Result<Self, CheckpointSetupError> {
        let key = AuditKey::configured(config)?;
        let previous_keys = previous_keys(config)?;
        open_for_append(&config.file).map_err(|e| CheckpointSetupError::File {
            path: config.file.clone(),
            reason: e.to_string(),
        })?;
        let keys: Vec<CheckpointKey> = std::iter::once(key.public().clone())
            .chain(previous_keys.iter().cloned())
            .collect();
        let last = last_checkpoint(&config.file, &keys)?;
        let webhook = match &config.webhook_url {
            Some(url) => Some((
                reqwest::Client::builder()
                    .timeout(WEBHOOK_TIMEOUT)
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| CheckpointSetupError::Webhook(e.to_string()))?,
                url::Url::parse(url).map_err(|e| CheckpointSetupError::Webhook(e.to_string()))?,
            )),
            None => None,
        };
        Ok(Self {
            key,
            server: server_name(config),
            file: config.file.clone(),
            interval: config.interval,
            previous_keys,
            webhook,
            last: tokio::sync::Mutex::new(last),
            stats: Arc::default(),
        })
    }

    /// The last checkpoint written, if any (at start: the file's last).
    pub async fn last(&self) -> Option<Checkpoint> {
        self.last.lock().await.clone()
    }

    /// Hex SHA-256 of the audit key's SubjectPublicKeyInfo DER.
    pub fn key_id(&self) -> &str {
        &self.key.public().key_id
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Every key a checkpoint of this server may be signed with.
    pub fn keys(&self) -> Vec<CheckpointKey> {
        std::iter::once(self.key.public().clone())
            .chain(self.previous_keys.iter().cloned())
            .collect()
    }

    /// Sign the current head and publish it.
    pub async fn publish(
        &self,
        store: &AuditStore,
        trigger: &str,
        now: OffsetDateTime,
    ) -> Result<Checkpoint, PublishError> {
        let mut last = self.last.lock().await;
        self.counted(async {
            let head = store.head().await?;
            self.publish_locked(&mut last, store, head, trigger, now).await
        })
        .await
    }

    /// Sign and publish the head when it moved since the last checkpoint
    /// (the interval's: an idle trail gets no new lines).
    pub async fn publish_if_grown(
        &self,
        store: &AuditStore,
        trigger: &str,
        now: OffsetDateTime,
    ) -> Result<Option<Checkpoint>, PublishError> {
        let mut last = self.last.lock().await;
        self.counted(async {
            let head = store.head().await?;
            if last
                .as_ref()
                .is_some_and(|l| (l.seq, &l.hash) == (head.0, &head.1))
            {
                return Ok(None);
            }
            self.publish_locked(&mut last, store, head, trigger, now)
                .await
                .map(Some)
        })
        .await
    }

    /// `work`, with its failure counted (`talos_sso_audit_checkpoint_failures`).
    async fn counted<T>(
        &self,
        work: impl Future<Output = Result<T, PublishError>>,
    ) -> Result<T, PublishError> {
        let result = work.await;
        if result.is_err() {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn publish_locked(
        &self,
        last: &mut Option<Checkpoint>,
        store: &AuditStore,
        (seq, hash): (i64, String),
        trigger: &str,
        now: OffsetDateTime,
    ) -> Result<Checkpoint, PublishError> {
        // Never sign over a trail that no longer holds what was signed:
        // the new checkpoint would bless the change.
        if let Some(previous) = last.as_ref().filter(|p| p.seq > 0) {
            let held = store.hash_at(previous.seq).await?;
            if held.as_deref() != Some(previous.hash.as_str()) || seq < previous.seq {
                return Err(PublishError::Contradicted {
                    seq: previous.seq,
                    server: previous.server.clone(),
                    signed_at: super::format_micros(previous.signed_at),
                });
            }
        }
        let checkpoint = self
            .key
            .sign(&self.server, seq, &hash, now, trigger)
            .map_err(|e| PublishError::Signing(e.to_string()))?;
        let line = checkpoint.to_line();
        let path = self.file.clone();
        let written = tokio::task::spawn_blocking(move || append_line(&path, &line))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
        written.map_err(|e| PublishError::File {
            path: self.file.clone(),
            reason: e.to_string(),
        })?;
        *last = Some(checkpoint.clone());
        self.stats.signed.fetch_add(1, Ordering::Relaxed);
        self.stats.last_seq.store(seq, Ordering::Relaxed);
        self.stats
            .last_signed_at
            .store(checkpoint.signed_at.unix_timestamp(), Ordering::Relaxed);
        tracing::info!(
            target: "talos_sso::audit::checkpoint",
            seq = checkpoint.seq,
            hash = %checkpoint.hash,
            trigger = %checkpoint.trigger,
            checkpoint = %checkpoint.to_line(),
            "audit checkpoint signed"
        );
        if let Some((client, url)) = &self.webhook {
            let (client, url, body, stats) = (
                client.clone(),
                url.clone(),
                checkpoint.clone(),
                self.stats.clone(),
            );
            tokio::spawn(async move { post(&client, &url, &body, &stats).await });
        }
        Ok(checkpoint)
    }

    /// The checkpoints in the file, each signature checked.
    pub async fn read(&self) -> Result<Vec<Checkpoint>, CheckpointError> {
        let (path, keys) = (self.file.clone(), self.keys());
        tokio::task::spawn_blocking(move || read_file(&path, &keys))
            .await
            .unwrap_or_else(|e| {
                Err(CheckpointError::Unreadable {
                    origin: "the checkpoint file".into(),
                    reason: e.to_string(),
                })
            })
    }
}

fn previous_keys(config: &CheckpointConfig) -> Result<Vec<CheckpointKey>, CheckpointSetupError> {
    config
        .previous_public_keys
        .iter()
        .map(|path| {
            let origin = path.display().to_string();
            let text = crate::text_file::read(path).map_err(|e| CheckpointError::Unreadable {
                origin: origin.clone(),
                reason: e.to_string(),
            })?;
            CheckpointKey::from_pem(&text, &origin)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(CheckpointSetupError::PreviousKey)
}

/// The public keys checkpoints of this configuration may be signed with
/// (the audit key's, then the previous ones), touching no file but keys:
/// for verifying.
pub fn configured_keys(config: &CheckpointConfig) -> Result<Vec<CheckpointKey>, CheckpointSetupError> {
    let key = AuditKey::configured(config)?;
    Ok(std::iter::once(key.public().clone())
        .chain(previous_keys(config)?)
        .collect())
}

/// The chain recomputed from `store` and, with `signed` (the checkpoints as
/// read, their signatures checked), checked against them; checkpoints that
/// could not be read or did not verify fail the check, naming why. Shared by
/// `GET /v1/audit/verify` and `talos-sso-server audit verify`.
pub async fn verify_store(
    store: &AuditStore,
    signed: Option<Result<Vec<Checkpoint>, CheckpointError>>,
) -> Result<talos_sso_api::audit::ChainStatus, StoreError> {
    let (checkpoints, unreadable) = match signed {
        None => (None, None),
        Some(Ok(checkpoints)) => (Some(checkpoints), None),
        Some(Err(error)) => (Some(Vec::new()), Some(error)),
    };
    let mut check = store.verify_chain_against(checkpoints).await?;
    if let Some(error) = unreadable {
        check.fail_checkpoints(&error);
    }
    Ok(check.status())
}

/// POST one checkpoint; a failure is logged and counted (the next
/// checkpoint covers everything this one did).
async fn post(client: &reqwest::Client, url: &url::Url, checkpoint: &Checkpoint, stats: &CheckpointStats) {
    let answer = client.post(url.clone()).json(checkpoint).send().await;
    let failure = match answer {
        Ok(response) if response.status().is_success() => return,
        Ok(response) => format!("answered {}", response.status()),
        Err(error) => talos_sso_api::error::error_chain(&error.without_url()),
    };
    stats.webhook_failures.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        target: "talos_sso::audit::checkpoint",
        seq = checkpoint.seq,
        "the checkpoint webhook did not take the checkpoint: {failure}"
    );
}

/// The last checkpoint of the file (its signature checked), read from its
/// end; `None` for an empty file. A file whose last line has no newline was
/// cut short while written: appending would weld the next checkpoint to
/// it, so it is refused.
fn last_checkpoint(path: &Path, keys: &[CheckpointKey]) -> Result<Option<Checkpoint>, CheckpointSetupError> {
    use std::io::{Read, Seek, SeekFrom};
    let unreadable = |e: std::io::Error| CheckpointSetupError::File {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let len = file.metadata().map_err(unreadable)?.len();
    let tail_start = len.saturating_sub(2 * talos_sso_api::checkpoint::MAX_LINE as u64);
    file.seek(SeekFrom::Start(tail_start)).map_err(unreadable)?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).map_err(unreadable)?;
    if tail.is_empty() {
        return Ok(None);
    }
    if tail.last() != Some(&b'\n') {
        return Err(CheckpointSetupError::Torn {
            path: path.to_owned(),
            offset: len,
        });
    }
    let body = &tail[..tail.len() - 1];
    let last_line = body.rsplit(|b| *b == b'\n').next().unwrap_or(body);
    let origin = format!("{} (last line)", path.display());
    let mut read =
        read_checkpoints(last_line, &origin, keys).map_err(CheckpointSetupError::LastUnreadable)?;
    Ok(read.pop())
}

fn open_for_append(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o644);
    }
    options.open(path)
}

/// Append one line and make it durable before the checkpoint counts as
/// published.
fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = open_for_append(path)?;
    file.write_all(format!("{line}\n").as_bytes())?;
    file.sync_data()
}

/// The checkpoints of the file at `path`, each signed by one of `keys`.
pub fn read_file(path: &Path, keys: &[CheckpointKey]) -> Result<Vec<Checkpoint>, CheckpointError> {
    let origin = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| CheckpointError::Unreadable {
        origin: origin.clone(),
        reason: e.to_string(),
    })?;
    read_checkpoints(std::io::BufReader::new(file), &origin, keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_signs_checkpoints_its_public_pem_verifies() {
        let (key, private_pem, public_pem) = AuditKey::generate().unwrap();
        let dir = tempfile_dir();
        let key_path = dir.join("audit.key");
        std::fs::write(&key_path, &private_pem).unwrap();
        set_mode(&key_path, 0o600);
        let loaded = AuditKey::load(&key_path).unwrap();
        assert_eq!(loaded.public(), key.public());

        let checkpoint = loaded
            .sign("srv", 3, &"ab".repeat(32), OffsetDateTime::UNIX_EPOCH, "command")
            .unwrap();
        let public = CheckpointKey::from_pem(&public_pem, "pub").unwrap();
        let line = format!("{}\n", checkpoint.to_line());
        assert_eq!(
            read_checkpoints(line.as_bytes(), "f", &[public]).unwrap(),
            [checkpoint]
        );

        // A key others can read is refused, as every key is.
        set_mode(&key_path, 0o644);
        let error = AuditKey::load(&key_path).unwrap_err().to_string();
        assert!(error.contains("readable by group or others"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_file_that_cannot_be_appended_to_or_an_unreadable_previous_key_stop_the_start() {
        let dir = tempfile_dir();
        let (_, private_pem, _) = AuditKey::generate().unwrap();
        let key_file = dir.join("audit.key");
        std::fs::write(&key_file, private_pem).unwrap();
        set_mode(&key_file, 0o600);
        let config = |file: PathBuf, previous: Vec<PathBuf>| CheckpointConfig {
            key_file: Some(key_file.clone()),
            pkcs11: None,
            file,
            interval: Duration::from_secs(60),
            webhook_url: None,
            server_name: Some("t".into()),
            previous_public_keys: previous,
        };
        // A folder where the file should be.
        let error = Checkpoints::open(&config(dir.clone(), vec![]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("cannot be appended to"), "{error}");
        // A previous public key that is not one.
        let not_a_key = dir.join("old.pub");
        std::fs::write(&not_a_key, "hello").unwrap();
        let error = Checkpoints::open(&config(dir.join("c.jsonl"), vec![not_a_key]))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("previous_public_keys") && error.contains("not a PEM public key"),
            "{error}"
        );
        // A good configuration opens.
        let opened = Checkpoints::open(&config(dir.join("c.jsonl"), vec![])).unwrap();
        assert_eq!(opened.keys().len(), 1);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn only_an_ed25519_pkcs8_key_is_an_audit_key() {
        let dir = tempfile_dir();
        let path = dir.join("ca.key");
        let rng = ring::rand::SystemRandom::new();
        let p256 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &rng,
        )
        .unwrap();
        for (text, expected) in [
            (x509::pem_encode("PRIVATE KEY", p256.as_ref()), "not Ed25519"),
            (
                x509::pem_encode("ED25519 PRIVATE KEY", &[1, 2, 3]),
                "no `PRIVATE KEY` block",
            ),
            ("hello".to_owned(), "no `PRIVATE KEY` block"),
        ] {
            std::fs::write(&path, text).unwrap();
            set_mode(&path, 0o600);
            let error = AuditKey::load(&path).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-ckpt-{}",
            crate::random::random_hex(6).unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}
