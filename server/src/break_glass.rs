//! Break-glass: a certificate when the identity provider is down. Run on the
//! server host with the server's configuration and CA material; it writes a
//! talosconfig directly and records the operator (OS user and host), the
//! reason and the certificate in the audit trail under its own event type,
//! before the file is written. No reason, no certificate; the TTL is capped
//! by the cluster's `max_ttl`.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::rand::SystemRandom;
use serde_json::json;
use time::OffsetDateTime;

use crate::app::{Cluster, StartError, load_clusters, open_store};
use crate::audit::store::{Append, Appended};
use crate::audit::{AuditRecord, event, outcome, random_hex};
use crate::ca::generate::{NewKeyType, generate_key};
use crate::certificate::{self, LeafRequest};
use crate::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum BreakGlassError {
    #[error("a reason is required: say why the identity provider cannot be used")]
    NoReason,
    #[error("no cluster `{0}` in the configuration")]
    UnknownCluster(String),
    #[error("the TTL {requested:?} is above the cluster's max_ttl {max:?}")]
    TtlTooLong { requested: Duration, max: Duration },
    #[error("{0} already exists; refusing to overwrite it")]
    OutputExists(String),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("cannot issue: {0}")]
    Issue(String),
    #[error("the audit trail is unavailable, so nothing was issued: {0}")]
    Audit(String),
    #[error("cannot write {path}: {reason}")]
    Write { path: String, reason: String },
}

/// Who is at the keyboard, as the OS says.
pub fn operator() -> (String, String) {
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".into());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    (user, host)
}

#[derive(Debug)]
pub struct BreakGlassRequest<'a> {
    pub cluster: &'a str,
    pub roles: &'a [String],
    pub ttl: Duration,
    pub reason: &'a str,
    pub out: &'a Path,
}

/// What was issued, for the operator's terminal.
#[derive(Debug)]
pub struct BreakGlassResult {
    pub context: String,
    pub serial: String,
    pub not_after: OffsetDateTime,
    pub audit_seq: i64,
}

pub async fn run(
    config: &Config,
    request: &BreakGlassRequest<'_>,
) -> Result<BreakGlassResult, BreakGlassError> {
    let reason = request.reason.trim();
    if reason.is_empty() {
        return Err(BreakGlassError::NoReason);
    }
    if request.out.exists() {
        return Err(BreakGlassError::OutputExists(request.out.display().to_string()));
    }
    let now = OffsetDateTime::now_utc();
    let (clusters, _) = load_clusters(config, now)?;
    let cluster: &Cluster = clusters
        .get(request.cluster)
        .ok_or_else(|| BreakGlassError::UnknownCluster(request.cluster.to_owned()))?;
    if request.ttl > cluster.config.max_ttl {
        return Err(BreakGlassError::TtlTooLong {
            requested: request.ttl,
            max: cluster.config.max_ttl,
        });
    }
    let (user, host) = operator();
    let key = generate_key(NewKeyType::Ed25519, &SystemRandom::new())
        .map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    let spki = key
        .key
        .public_key_info()
        .map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    let username = format!("break-glass:{user}@{host}");
    let leaf = LeafRequest {
        csr: &[],
        username: &username,
        roles: request.roles,
        ttl: request.ttl,
        clock_skew: cluster.config.clock_skew,
    };
    let issued = certificate::sign_leaf(&cluster.ca, &spki, &leaf, now)
        .map_err(|e| BreakGlassError::Issue(e.to_string()))?;

    let mut record = AuditRecord::new(event::BREAK_GLASS_ISSUED, outcome::SUCCESS, &random_hex(16), now);
    record.cluster = Some(cluster.name.clone());
    record.username = Some(username.clone());
    record.roles_requested = request.roles.to_vec();
    record.set_certificate(&issued);
    record.details =
        json!({"operator": user, "host": host, "reason": reason, "ttl_seconds": request.ttl.as_secs()});
    let store = open_store(config, config.database.migrate_on_start.unwrap_or(true)).await?;
    let appended = store
        .append_batch(&[Append {
            record,
            ..Default::default()
        }])
        .await;
    store.close().await;
    let audit_seq = match appended.map_err(|e| BreakGlassError::Audit(e.to_string()))?.pop() {
        Some(Appended::Recorded(stored)) => stored.seq,
        _ => return Err(BreakGlassError::Audit("the record was not written".into())),
    };

    let context = format!("{}-break-glass", cluster.context_name());
    let talosconfig = json!({
        "context": context,
        "contexts": {
            context.clone(): {
                "endpoints": cluster.config.endpoints,
                "nodes": cluster.config.nodes,
                "ca": STANDARD.encode(cluster.ca.trust_bundle_pem()),
                "crt": STANDARD.encode(&issued.chain_pem),
                "key": STANDARD.encode(key.pem.as_bytes()),
            }
        }
    });
    let yaml = serde_yaml_ng::to_string(&talosconfig).map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    write_private(request.out, &yaml).map_err(|e| BreakGlassError::Write {
        path: request.out.display().to_string(),
        reason: e.to_string(),
    })?;
    tracing::warn!(cluster = %cluster.name, operator = %user, host = %host, serial = %issued.serial_hex, audit_seq,
        "break-glass certificate issued");
    Ok(BreakGlassResult {
        context,
        serial: issued.serial_hex,
        not_after: issued.not_after,
        audit_seq,
    })
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}
