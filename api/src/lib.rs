//! The talos-sso HTTP API, shared by the server and the CLI: the request and
//! response body of every endpoint, the error codes with their typed extra
//! fields, the header names, the audit filter, and the audit trail's
//! proofs (`chain`, `checkpoint`), which the CLI checks without a server. A change here is a change of
//! the contract between them; `API_VERSION` names it.

pub mod audit;
mod canonical;
pub mod certificates;
pub mod chain;
pub mod checkpoint;
pub mod deny;
pub mod error;
mod exact_line;
pub mod feed;
pub mod info;
pub mod issuer;
mod time_text;

pub use audit::{AuditPage, AuditQuery, AuditRecord, ChainStatus, StoredRecord};
pub use certificates::{CertificateRequest, Identity, IssuedCertificate};
pub use deny::{DenyAdded, DenyEntry, DenyList, DenyRemoved, DenyRequest};
pub use error::{ErrorCode, Problem};
pub use info::{BearerToken, ClusterInfo, Readiness, ServerInfo};

/// The version of this API: the `/v1` of every path.
pub const API_VERSION: u32 = 1;

/// Header the CLI sends with its version; recorded in the audit trail.
pub const CLIENT_VERSION_HEADER: &str = "x-talos-sso-client-version";

/// Header carrying the request id, in both directions: a well-formed id
/// from the caller is kept, otherwise the server makes one.
pub const REQUEST_ID_HEADER: &str = "x-request-id";
