//! What policy decides about: who applies (what it reads from a verified
//! token), what a decision grants, and why it refuses (a denial).

use std::fmt;

use talos_sso_api::ErrorCode;

use talos_sso_text::clean_list;

/// Who asks for a certificate, as policy sees them: what it reads from
/// their verified token.
#[derive(Debug, Clone, Default)]
pub struct Applicant {
    /// The configured name of the issuer that verified the token (`login`
    /// for the login issuer).
    pub issuer_name: String,
    /// The tenant the token's issuer verified (Entra `tid`), for `users`
    /// entries `tid/oid`; `None` for issuers without tenants, whatever
    /// claims their tokens carry.
    pub tenant: Option<String>,
    /// Stable subject: Entra `oid`, else `sub`.
    pub subject: String,
    pub username: String,
    /// Group ids, already resolved through Graph when the token had overage.
    pub groups: Vec<String>,
    /// App roles (`roles` claim).
    pub app_roles: Vec<String>,
    /// Every claim of the token, for `claims` selectors.
    pub raw: serde_json::Map<String, serde_json::Value>,
    /// The token is an application's own (client credentials), not a
    /// person's: only a rule that names it in `users` judges it, so that
    /// an app role or a group shared with people grants it nothing.
    pub application: bool,
    /// The token is a workload's (CI job, service account): no people's
    /// rule judges it, whatever its issuer and claims.
    pub workload: bool,
}

/// A denial: the policy refusing the roles asked for (or any role), with
/// what the person can do about it. The issuance answers it as a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// No rule matched. `would_grant` lists the selectors that would.
    NoMatchingRule { would_grant: Vec<String> },
    /// Asked for roles the person is not entitled to.
    RoleNotPermitted {
        requested: Vec<String>,
        entitled: Vec<String>,
    },
    /// Entitled, but to none of the default roles: ask explicitly.
    RoleRequired { entitled: Vec<String> },
}

impl Denial {
    /// The API code of this denial, with what the person may have: the
    /// one value the answer and the audit record take their code from.
    pub fn error_code(&self) -> ErrorCode {
        match self {
            Denial::NoMatchingRule { would_grant } => ErrorCode::NoMatchingRule {
                would_grant: would_grant.clone(),
            },
            // The roles asked for are the caller's text.
            Denial::RoleNotPermitted { requested, entitled } => ErrorCode::RoleNotPermitted {
                refused: clean_list(requested),
                entitled: entitled.clone(),
            },
            Denial::RoleRequired { entitled } => ErrorCode::RoleRequired {
                entitled: entitled.clone(),
            },
        }
    }

    /// The stable code, as recorded and counted.
    pub fn code(&self) -> &'static str {
        self.error_code().code()
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NoMatchingRule { would_grant } => write!(
                f,
                "no rule of this cluster matches you; membership in one of these would grant a role: {}",
                would_grant.join(", ")
            ),
            Denial::RoleNotPermitted { requested, entitled } => write!(
                f,
                "you may not have {}; you are entitled to: {}",
                requested.join(", "),
                if entitled.is_empty() {
                    "nothing".to_owned()
                } else {
                    entitled.join(", ")
                }
            ),
            Denial::RoleRequired { entitled } => write!(
                f,
                "none of this cluster's default roles applies to you; ask for one of {} with --role",
                entitled.join(", ")
            ),
        }
    }
}

/// What a decision grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Roles to put in the certificate (sorted, like Talos's `role.Set`).
    pub granted: Vec<String>,
}
