//! What a cluster's rules may grant: Talos's role names, and the mistakes
//! a cluster's rules (people's and workloads') are refused for at load.

use super::TALOS_ROLES;

/// A configuration mistake in a cluster's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyConfigError {
    #[error("rule {index} grants no roles")]
    RuleWithoutRoles { index: usize },
    #[error("rule {index} has no selector (groups, app_roles, users or claims): it would match everyone")]
    RuleWithoutSelector { index: usize },
    #[error("`{role}` is not a Talos role; known roles: {}", TALOS_ROLES.join(", "))]
    UnknownRole { role: String },
    #[error(
        "rule {index} grants os:impersonator, which lets its holder act with any role; \
         set allow_impersonator: true on the cluster if that is really intended"
    )]
    ImpersonatorNotAllowed { index: usize },
    #[error("rule {index}: {message}")]
    AppRole { index: usize, message: String },
    #[error("workloads[{index}]: {message}")]
    Workload { index: usize, message: String },
}

pub(super) fn check_role_name(role: &str) -> Result<(), PolicyConfigError> {
    if TALOS_ROLES.contains(&role) {
        Ok(())
    } else {
        Err(PolicyConfigError::UnknownRole {
            role: role.to_owned(),
        })
    }
}
