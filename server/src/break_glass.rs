//! Break-glass: a certificate when the identity provider is down. Run on the
//! server host with the server's configuration and CA material; it writes a
//! talosconfig directly and records the operator (as the kernel knows them:
//! uid and login uid, not `$USER`), the host, the reason and the
//! certificate in the audit trail under its own event type, before the file
//! is written. No reason, no certificate; only roles some rule of the
//! cluster grants; the TTL is capped by the cluster's `max_ttl`.
//!
//! `--out -` hands the talosconfig back instead of writing a file, for the
//! command line to print on standard output: in a container with a
//! read-only root file system and no shell, `kubectl exec ... --out - >
//! file` is the way out.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::rand::SystemRandom;
use serde_json::json;
use time::OffsetDateTime;

use crate::app::{StartError, open_serving_store};
use crate::audit::{AuditRecord, event, outcome};
use crate::ca::generate::{NewKeyType, generate_key};
use crate::cluster::{Cluster, load_clusters};
use crate::config::Config;
use crate::issuance::{BreakGlassGrant, Issuance, IssuanceError};
use crate::keys::Signer;
use crate::metrics::Metrics;
use crate::random::random_hex;

#[derive(Debug, thiserror::Error)]
pub enum BreakGlassError {
    #[error("a reason is required: say why the identity provider cannot be used")]
    NoReason,
    #[error("no cluster `{0}` in the configuration")]
    UnknownCluster(String),
    #[error(
        "no rule of cluster `{cluster}` grants `{role}`, so break-glass cannot either; roles its rules grant: {}",
        grantable.join(", ")
    )]
    RoleNotGrantable {
        cluster: String,
        role: String,
        grantable: Vec<String>,
    },
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

/// Who is at the keyboard, from what the kernel says, not from the
/// environment (`$USER` and `$SUDO_USER` are whatever the caller set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator {
    /// The real uid of this process.
    pub uid: Option<u32>,
    /// The audit login uid: who logged in to the host, kept across `sudo`
    /// and `su` (Linux, when the kernel tracks it).
    pub login_uid: Option<u32>,
    /// The account name of the login uid, else of the uid, from /etc/passwd.
    pub name: String,
    /// `$SUDO_USER` / `$USER` as set: recorded, never believed.
    pub claimed_user: Option<String>,
    pub host: String,
}

/// The real uid from `/proc/self/status` (`Uid: real effective saved fs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
}

/// `/proc/self/loginuid`; `4294967295` means no login uid was set.
fn login_uid(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|uid| *uid != u32::MAX)
}

/// The account name of `uid` in an /etc/passwd text.
fn passwd_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let id: u32 = fields.nth(1)?.parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_owned())
    })
}

impl Operator {
    pub fn of_this_process() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let uid = read("/proc/self/status").as_deref().and_then(real_uid);
        let login_uid = read("/proc/self/loginuid").as_deref().and_then(login_uid);
        let passwd = read("/etc/passwd").unwrap_or_default();
        let name = login_uid
            .or(uid)
            .map(|id| passwd_name(&passwd, id).unwrap_or_else(|| format!("uid-{id}")))
            .unwrap_or_else(|| "uid-unknown".into());
        let claimed_user = std::env::var("SUDO_USER")
            .or_else(|_| std::env::var("USER"))
            .ok()
            .map(|u| talos_sso_text::clean_field(&u));
        let host = read("/proc/sys/kernel/hostname")
            .or_else(|| read("/etc/hostname"))
            .map(|h| talos_sso_text::clean_field(h.trim()))
            .unwrap_or_else(|| "unknown".into());
        Self {
            uid,
            login_uid,
            name,
            claimed_user,
            host,
        }
    }
}

/// The `--out` that means standard output.
pub const STDOUT: &str = "-";

#[derive(Debug)]
pub struct BreakGlassRequest<'a> {
    pub cluster: &'a str,
    pub roles: &'a [String],
    pub ttl: Duration,
    pub reason: &'a str,
    /// A new file, or [`STDOUT`] (`./-` is a file named `-`).
    pub out: &'a Path,
}

impl BreakGlassRequest<'_> {
    /// Whether the talosconfig goes to standard output.
    pub fn to_stdout(&self) -> bool {
        self.out == Path::new(STDOUT)
    }
}

/// What was issued, for the operator's terminal.
pub struct BreakGlassResult {
    pub context: String,
    pub serial: String,
    pub not_after: OffsetDateTime,
    pub audit_seq: i64,
    /// The CA that signed: its subject and SHA-256, and how Talos trusts it.
    pub signed_by: String,
    pub mode: crate::ca::TrustMode,
    /// The talosconfig (with the private key) when it goes to standard
    /// output; `None` when it was written to the file.
    pub talosconfig: Option<zeroize::Zeroizing<String>>,
}

/// Never the talosconfig: it holds the private key.
impl std::fmt::Debug for BreakGlassResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakGlassResult")
            .field("context", &self.context)
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .field("audit_seq", &self.audit_seq)
            .field("signed_by", &self.signed_by)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

pub async fn run(
    config: &Config,
    request: &BreakGlassRequest<'_>,
) -> Result<BreakGlassResult, BreakGlassError> {
    let reason = request.reason.trim();
    if reason.is_empty() {
        return Err(BreakGlassError::NoReason);
    }
    if !request.to_stdout() && request.out.exists() {
        return Err(BreakGlassError::OutputExists(request.out.display().to_string()));
    }
    let now = OffsetDateTime::now_utc();
    let (clusters, _) = load_clusters(config, now).map_err(StartError::from)?;
    let cluster: &Cluster = clusters
        .get(request.cluster)
        .ok_or_else(|| BreakGlassError::UnknownCluster(request.cluster.to_owned()))?;
    let grantable = cluster.policy.grantable_roles();
    if let Some(role) = request.roles.iter().find(|r| !grantable.contains(r)) {
        return Err(BreakGlassError::RoleNotGrantable {
            cluster: cluster.name.clone(),
            role: talos_sso_text::clean_field(role),
            grantable,
        });
    }
    // Checked again by the issuance; here so that nothing is made for a
    // request that cannot be granted.
    if request.ttl > cluster.config.max_ttl {
        return Err(BreakGlassError::TtlTooLong {
            requested: request.ttl,
            max: cluster.config.max_ttl,
        });
    }
    let operator = Operator::of_this_process();
    let key = generate_key(NewKeyType::Ed25519, &SystemRandom::new())
        .map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    let public_key = key
        .key
        .public_key_info()
        .map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    let username = format!("break-glass:{}@{}", operator.name, operator.host);
    let request_id = random_hex(16).map_err(|e| BreakGlassError::Issue(e.to_string()))?;
    // Which CA signs, in the record and on the operator's terminal: during
    // a rotation or a cut-off, what matters is which CA Talos must accept.
    let signer = cluster.signing_ca(now).signer();
    let signed_by = format!(
        "{} (sha256 {})",
        crate::ca::describe_name(&signer.raw_subject),
        signer.sha256_fingerprint()
    );
    let mut record = AuditRecord::new(event::BREAK_GLASS_ISSUED, outcome::DENIED, &request_id, now);
    record.details = json!({
        "signed_by": signed_by,
        "trust_mode": cluster.mode().as_str(),
        "operator": operator.name,
        "uid": operator.uid,
        "login_uid": operator.login_uid,
        "claimed_user": operator.claimed_user,
        "host": operator.host,
        "reason": reason,
        "ttl_seconds": request.ttl.as_secs(),
    });
    let grant = BreakGlassGrant {
        cluster: &cluster.name,
        username: &username,
        roles: request.roles,
        ttl: request.ttl,
        public_key: &public_key,
    };
    let store = open_serving_store(config).await?;
    let metrics = Metrics::new();
    let issuance = Issuance {
        clusters: &clusters,
        recorder: &store,
        metrics: &metrics,
    };
    let issued = issuance.issue_break_glass(&grant, record, now).await;
    store.close().await;
    let issued = issued.map_err(|error| match error {
        IssuanceError::AuditUnavailable => BreakGlassError::Audit(error.to_string()),
        other => BreakGlassError::Issue(other.to_string()),
    })?;
    let audit_seq = issued.record.seq;
    let issued = issued.certificate;

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
    let yaml = zeroize::Zeroizing::new(
        serde_yaml_ng::to_string(&talosconfig).map_err(|e| BreakGlassError::Issue(e.to_string()))?,
    );
    let talosconfig = if request.to_stdout() {
        Some(yaml)
    } else {
        write_private(request.out, &yaml).map_err(|e| BreakGlassError::Write {
            path: request.out.display().to_string(),
            reason: e.to_string(),
        })?;
        None
    };
    tracing::warn!(cluster = %cluster.name, operator = %operator.name, host = %operator.host,
        serial = %issued.serial_hex, audit_seq, signed_by = %signed_by, "break-glass certificate issued");
    Ok(BreakGlassResult {
        context,
        serial: issued.serial_hex,
        not_after: issued.not_after,
        audit_seq,
        signed_by,
        mode: cluster.mode(),
        talosconfig,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_comes_from_the_kernel_and_passwd() {
        let status = "Name:\tcat\nUid:\t1000\t0\t0\t0\nGid:\t1000\t0\t0\t0\n";
        assert_eq!(real_uid(status), Some(1000));
        assert_eq!(real_uid("Name: x\n"), None);
        assert_eq!(login_uid("1001\n"), Some(1001));
        assert_eq!(login_uid("4294967295"), None, "no login uid set");
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        assert_eq!(passwd_name(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(passwd_name(passwd, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(passwd, 4242), None);
    }
}
