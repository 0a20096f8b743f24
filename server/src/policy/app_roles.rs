//! App-role selectors (`<tenant id>/<role>` or the role alone): read and
//! checked against the issuers they judge at load, matched per token.

use std::collections::BTreeSet;
use std::fmt;

use crate::config::{Tenancy, home_tenant};

/// An app-role selector, read once: `<tenant id>/<role>`, or the role
/// alone. The tenant ends at the first `/`: the role may have one of its
/// own. Which of the two it is, and whether it may be either, depends on
/// the issuers it judges ([`check_app_roles`]).
///
/// The tenant is part of the role: an app role is the app registration's,
/// but each tenant's administrators assign it on their own copy of the app,
/// so `Talos.Admin` in a partner tenant is whatever that partner decided.
/// `<tenant id>/<role>` pins the tenant (compared case-insensitively, the
/// role exactly), as `users` pins people with `<tenant id>/<oid>`. Without
/// a tenant, the selector is the role as written (no tenant to pin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppRoleSelector {
    /// The tenant it names, if any (as written).
    pub tenant: Option<String>,
    /// The role, after the tenant.
    pub role: String,
}

impl AppRoleSelector {
    pub fn parse(selector: &str) -> Self {
        match selector.split_once('/') {
            Some((tenant, role)) => Self {
                tenant: Some(tenant.to_owned()),
                role: role.to_owned(),
            },
            None => Self {
                tenant: None,
                role: selector.to_owned(),
            },
        }
    }

    /// Whether it admits a token that carries `app_roles`, verified in
    /// `tenant` (`None`: its issuer has no tenants), `home` being the
    /// tenant a selector that names none stands for ([`Tenancy::home`] of
    /// the token's issuer).
    pub fn matches(&self, home: Option<&str>, tenant: Option<&str>, app_roles: &[String]) -> bool {
        let Some(tenant) = tenant else {
            return app_roles.iter().any(|r| self.is_written(r));
        };
        self.tenant
            .as_deref()
            .or(home)
            .is_some_and(|t| t.eq_ignore_ascii_case(tenant))
            && app_roles.contains(&self.role)
    }

    /// Whether `text` is this selector as written.
    fn is_written(&self, text: &str) -> bool {
        match &self.tenant {
            None => text == self.role,
            Some(tenant) => {
                text.strip_prefix(tenant.as_str())
                    .and_then(|rest| rest.strip_prefix('/'))
                    == Some(self.role.as_str())
            }
        }
    }

    /// How a denial or the console names it to a person, for tokens of an
    /// issuer that allows `tenants` (empty: none): with the tenant it
    /// counts in. `None` when it counts in none (it names no tenant, and
    /// several are allowed).
    pub fn describe(&self, tenants: &[String]) -> Option<String> {
        if tenants.is_empty() {
            return Some(format!("app role {self}"));
        }
        let tenant = self.tenant.as_deref().or(home_tenant(tenants))?;
        Some(format!("app role {} in tenant {tenant}", self.role))
    }
}

/// As written in the configuration.
impl fmt::Display for AppRoleSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tenant {
            Some(tenant) => write!(f, "{tenant}/{}", self.role),
            None => f.write_str(&self.role),
        }
    }
}

/// Check app-role selectors against the issuers whose tokens they judge
/// (by name), at load, and read them: the message says which selector and
/// why, without where it is (the caller knows).
///
/// - An issuer that allows several tenants: each selector names one of
///   them, `<tenant id>/<role>`. A role alone would let every allowed
///   tenant's administrators grant it.
/// - An issuer that allows one: the role alone stands for that tenant.
/// - Issuers without tenants only: a selector that starts with a tenant id
///   is refused as meaningless (their tokens carry no tenant to compare).
pub fn check_app_roles(
    selectors: &[String],
    issuers: &[&str],
    tenancy: &Tenancy,
) -> Result<Vec<AppRoleSelector>, String> {
    let with_tenants: Vec<(&str, &[String])> = issuers
        .iter()
        .filter_map(|issuer| tenancy.tenants(issuer).map(|tenants| (*issuer, tenants)))
        .collect();
    let mut read = Vec::with_capacity(selectors.len());
    for selector in selectors {
        let shown = talos_sso_text::clean(selector, 128);
        if selector.is_empty() {
            return Err("app_roles has an empty entry".into());
        }
        let parsed = AppRoleSelector::parse(selector);
        let (tenant, role) = (parsed.tenant.as_deref(), parsed.role.as_str());
        if with_tenants.is_empty() {
            // Tenantless issuers read the selector as written; one that
            // starts with a tenant id was meant for Entra.
            if let Some(prefix) = tenant
                && (crate::guid::is_guid(prefix)
                    || tenancy
                        .0
                        .values()
                        .flatten()
                        .any(|t| t.eq_ignore_ascii_case(prefix)))
            {
                return Err(format!(
                    "app role `{shown}` names tenant `{}`, but {} no tenants: \
                     write the role alone, `{}`",
                    talos_sso_text::clean(prefix, 64),
                    issuer_names(issuers, "has", "have"),
                    talos_sso_text::clean(role, 128)
                ));
            }
        } else if let Some(tenant) = tenant {
            if tenant.is_empty() || role.is_empty() {
                return Err(format!(
                    "app role `{shown}`: write `<tenant id>/<role>`, both parts"
                ));
            }
            let allowed = with_tenants
                .iter()
                .any(|(_, tenants)| tenants.iter().any(|t| t.eq_ignore_ascii_case(tenant)));
            if !allowed {
                let tenants: BTreeSet<&str> = with_tenants
                    .iter()
                    .flat_map(|(_, tenants)| tenants.iter().map(String::as_str))
                    .collect();
                return Err(format!(
                    "app role `{shown}` names tenant `{}`, which {} not allow (allowed: {}); \
                     an app role is written `<tenant id>/<role>`, with the tenant first even \
                     when the role has a `/` of its own",
                    talos_sso_text::clean(tenant, 64),
                    issuer_names(
                        &with_tenants.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
                        "does",
                        "do"
                    ),
                    tenants.into_iter().collect::<Vec<_>>().join(", ")
                ));
            }
        } else if let Some((issuer, tenants)) = with_tenants.iter().find(|(_, tenants)| tenants.len() > 1) {
            return Err(format!(
                "app role `{shown}` names no tenant, but issuer `{issuer}` allows several \
                 ({}), and each tenant's administrators assign app roles on their own copy \
                 of the app: any of them could grant it. Write one entry per tenant whose \
                 assignments you trust, as `{}/{shown}`",
                tenants.join(", "),
                tenants[0]
            ));
        }
        read.push(parsed);
    }
    Ok(read)
}

/// `issuer `a`` or `issuers `a`, `b``, with the verb in agreement.
fn issuer_names(issuers: &[&str], one: &str, several: &str) -> String {
    let quoted: Vec<String> = issuers.iter().map(|i| format!("`{i}`")).collect();
    if quoted.len() == 1 {
        format!("issuer {} {one}", quoted[0])
    } else {
        format!("issuers {} {several}", quoted.join(", "))
    }
}
