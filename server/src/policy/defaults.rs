//! What is granted when the request names no role: the cluster's
//! `default_roles` the person is entitled to (so that `os:admin` can
//! require asking for it), else every entitled role.

use std::collections::BTreeSet;

use super::decision::Denial;

/// The roles granted by default to someone `entitled` (not empty) to
/// roles, or `role_required` when none of the defaults is theirs.
pub(super) fn default_grant(
    default_roles: &[String],
    entitled: Vec<String>,
) -> Result<BTreeSet<String>, Denial> {
    if default_roles.is_empty() {
        return Ok(entitled.into_iter().collect());
    }
    let defaults: BTreeSet<String> = default_roles
        .iter()
        .filter(|r| entitled.contains(r))
        .cloned()
        .collect();
    if defaults.is_empty() {
        return Err(Denial::RoleRequired { entitled });
    }
    Ok(defaults)
}
