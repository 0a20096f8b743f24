//! Why a token was not accepted, and the API code that says so: the one
//! typed value both the answer and the audit record take their `code` from.

use talos_sso_api::ErrorCode;
use time::OffsetDateTime;

use super::VerifiedIdentity;
use super::token::TokenError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(
        "you are in too many groups for them to fit in the token, and the server could not look them up \
         in Microsoft Graph ({reason}); ask an administrator to configure identity.entra_graph, or to use app roles"
    )]
    OverageUnresolved {
        reason: String,
        /// The token itself passed every check: the refusal is recorded
        /// with who it is about, as an authenticated decision.
        identity: Box<VerifiedIdentity>,
    },
}

impl AuthError {
    /// The API code of this refusal; times are the server's clock at `now`,
    /// so that the client can tell a clock problem from a stale token.
    pub fn error_code(&self, now: OffsetDateTime) -> ErrorCode {
        match self {
            AuthError::Token(token) => token.error_code(now),
            AuthError::OverageUnresolved { .. } => ErrorCode::GroupsOverageUnresolved,
        }
    }

    /// The stable code, as recorded and logged.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Token(token) => token.code(),
            AuthError::OverageUnresolved { .. } => ErrorCode::GroupsOverageUnresolved.code(),
        }
    }

    /// Who the refused token is about, when the token itself was valid.
    pub fn verified_identity(&self) -> Option<&VerifiedIdentity> {
        match self {
            AuthError::OverageUnresolved { identity, .. } => Some(identity),
            AuthError::Token(_) => None,
        }
    }
}
