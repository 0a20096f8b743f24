//! `/v1/deny` (admins): identities blocked from new certificates at once.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// `POST /v1/deny` body; `DELETE /v1/deny` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenyRequest {
    /// Entra oid or OIDC sub: what an entry blocks (required when adding,
    /// unless the server can resolve `username` to one subject).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// Username, kept with the entry for people to read; it blocks nothing,
    /// because its owner can change it. Removing by username removes
    /// entries that were added with a username only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Why (required when adding; recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When an added entry stops blocking (adding only; none: until it is
    /// removed). In the future, at most ten years ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(with = "crate::audit::micros_option")]
    pub expires_at: Option<OffsetDateTime>,
}

/// One entry of the deny list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyEntry {
    pub subject: Option<String>,
    /// Lower-cased.
    pub username: Option<String>,
    pub reason: String,
    pub added_by: String,
    #[serde(with = "crate::audit::micros")]
    pub added_at: OffsetDateTime,
    /// When the entry stops blocking; none: until it is removed. The list
    /// holds only entries that block now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(with = "crate::audit::micros_option")]
    pub expires_at: Option<OffsetDateTime>,
}

/// `GET /v1/deny`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyList {
    pub entries: Vec<DenyEntry>,
}

/// `201` from `POST /v1/deny`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyAdded {
    pub entry: DenyEntry,
    pub audit_id: i64,
}

/// `200` from `DELETE /v1/deny`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyRemoved {
    /// Entries removed (0 when none matched).
    pub removed: u64,
    pub audit_id: i64,
}
