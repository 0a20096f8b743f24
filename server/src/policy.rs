//! Who gets which Talos roles on which cluster: claims in, roles out.
//!
//! Pure and deterministic: no I/O, no clock. The rules of a cluster are
//! checked once when the configuration loads ([`ClusterPolicy::new`]), and
//! [`ClusterPolicy::decide`] then maps verified claims (and the roles the
//! person asked for) to the roles to grant, or to a denial with a stable code
//! and enough detail for the client to tell the person what to do.
//!
//! Semantics, least privilege first:
//! - A rule matches when *every* kind of selector it has matches (groups AND
//!   app roles AND users AND claims), each kind matching when *any* listed
//!   value is present. A rule with no selector is refused at load.
//! - Entitled roles are the union of the roles of all matching rules.
//! - Asked-for roles must each be entitled. Without a request, the cluster's
//!   `default_roles` that are entitled are granted (so `os:admin` can require
//!   asking for it), else every entitled role.
//! - An application's own token (client credentials) is matched only by
//!   rules that name it in `users`: deny by default, whatever app roles or
//!   groups it carries.
//! - An app role counts only in the tenant that assigned it: each tenant's
//!   administrators assign the app's roles on their own copy of it, so an
//!   issuer that allows several tenants needs `<tenant id>/<role>`
//!   ([`check_app_roles`], [`AppRoleSelector::matches`]).
//! - `os:impersonator` is effectively admin on Talos (it can claim any role
//!   per request); a rule may only grant it when the cluster sets
//!   `allow_impersonator`.

use std::collections::BTreeSet;
use std::fmt;

/// Every role Talos knows (`role.All`, Talos 1.13). Older nodes ignore the
/// newer ones (`os:image:verifier`, `os:meta:writer`).
pub const TALOS_ROLES: [&str; 7] = [
    "os:admin",
    "os:operator",
    "os:reader",
    "os:etcd:backup",
    "os:image:verifier",
    "os:meta:writer",
    "os:impersonator",
];

pub const IMPERSONATOR: &str = "os:impersonator";

/// The configuration-data types of the rules and the examples (`config`).
pub use crate::config::{PolicyConfig, PolicyExample, Rule, Tenancy, home_tenant};

/// What policy reads from a verified token.
#[derive(Debug, Clone, Default)]
pub struct Claims {
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
}

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
}

/// Why no certificate: the stable code and what the person can do about it.
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
    pub fn code(&self) -> &'static str {
        match self {
            Denial::NoMatchingRule { .. } => "no_matching_rule",
            Denial::RoleNotPermitted { .. } => "role_not_permitted",
            Denial::RoleRequired { .. } => "role_required",
        }
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

/// A cluster's checked rules.
#[derive(Debug, Clone)]
pub struct ClusterPolicy {
    config: PolicyConfig,
    /// Each rule's app-role selectors, read once at load (by rule index).
    app_roles: Vec<Vec<AppRoleSelector>>,
}

impl ClusterPolicy {
    pub fn new(config: PolicyConfig) -> Result<Self, PolicyConfigError> {
        let mut app_roles = Vec::with_capacity(config.rules.len());
        for (index, rule) in config.rules.iter().enumerate() {
            if rule.roles.is_empty() {
                return Err(PolicyConfigError::RuleWithoutRoles { index });
            }
            if rule.groups.is_empty()
                && rule.app_roles.is_empty()
                && rule.users.is_empty()
                && rule.claims.is_empty()
            {
                return Err(PolicyConfigError::RuleWithoutSelector { index });
            }
            for role in &rule.roles {
                check_role_name(role)?;
                if role == IMPERSONATOR && !config.allow_impersonator {
                    return Err(PolicyConfigError::ImpersonatorNotAllowed { index });
                }
            }
            app_roles.push(
                check_app_roles(&rule.app_roles, &rule_issuers(rule), &config.tenancy)
                    .map_err(|message| PolicyConfigError::AppRole { index, message })?,
            );
        }
        for role in &config.default_roles {
            check_role_name(role)?;
        }
        Ok(Self { config, app_roles })
    }

    /// The group ids this cluster's rules mention: the only ones worth
    /// fetching from Graph when a token has group overage.
    pub fn referenced_groups(&self) -> impl Iterator<Item = &str> {
        self.config
            .rules
            .iter()
            .flat_map(|r| r.groups.iter().map(String::as_str))
    }

    /// Every role some rule of this cluster grants, to anyone (sorted).
    pub fn grantable_roles(&self) -> Vec<String> {
        let roles: BTreeSet<&str> = self
            .config
            .rules
            .iter()
            .flat_map(|r| r.roles.iter().map(String::as_str))
            .collect();
        roles.into_iter().map(str::to_owned).collect()
    }

    /// Every role some rule could grant here.
    pub fn entitled(&self, claims: &Claims) -> Vec<String> {
        // The tenant an app role that names none stands for: the only one
        // of the token's issuer, found once for all the rules.
        let home = self.config.tenancy.home(&claims.issuer_name);
        let roles: BTreeSet<&str> = self
            .config
            .rules
            .iter()
            .zip(&self.app_roles)
            .filter(|(rule, app_roles)| rule_matches(rule, app_roles, claims, home))
            .flat_map(|(rule, _)| rule.roles.iter().map(String::as_str))
            .collect();
        roles.into_iter().map(str::to_owned).collect()
    }

    /// Decide which roles to grant. `requested` empty means "the defaults".
    pub fn decide(&self, claims: &Claims, requested: &[String]) -> Result<Decision, Denial> {
        let entitled = self.entitled(claims);
        if entitled.is_empty() {
            let would_grant = if claims.application {
                vec![format!("a rule naming application {} in `users`", claims.subject)]
            } else {
                self.selectors()
            };
            return Err(Denial::NoMatchingRule { would_grant });
        }
        let granted: BTreeSet<String> = if requested.is_empty() {
            if self.config.default_roles.is_empty() {
                entitled.iter().cloned().collect()
            } else {
                let defaults: BTreeSet<String> = self
                    .config
                    .default_roles
                    .iter()
                    .filter(|r| entitled.contains(r))
                    .cloned()
                    .collect();
                if defaults.is_empty() {
                    return Err(Denial::RoleRequired { entitled });
                }
                defaults
            }
        } else {
            let refused: Vec<String> = requested
                .iter()
                .filter(|r| !entitled.contains(r))
                .cloned()
                .collect();
            if !refused.is_empty() {
                return Err(Denial::RoleNotPermitted {
                    requested: refused,
                    entitled,
                });
            }
            requested.iter().cloned().collect()
        };
        Ok(Decision {
            granted: granted.into_iter().collect(),
        })
    }

    fn selectors(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (rule, app_roles) in self.config.rules.iter().zip(&self.app_roles) {
            out.extend(rule.groups.iter().map(|g| format!("group {g}")));
            for issuer in rule_issuers(rule) {
                let tenants = self.config.tenancy.tenants(issuer).unwrap_or_default();
                out.extend(app_roles.iter().filter_map(|r| r.describe(tenants)));
            }
        }
        out.into_iter().collect()
    }
}

impl ClusterPolicy {
    /// Check one example; the error says what was expected and what happened.
    pub fn check_example(&self, example: &PolicyExample) -> Result<(), String> {
        // An example stands for a token of the login issuer, of the tenant
        // it names (`claims: { tid: ... }`), else of the login issuer's only
        // tenant; an issuer without tenants verifies none, whatever `tid`.
        let login = crate::config::LOGIN_ISSUER;
        let tenancy = &self.config.tenancy;
        let with_tenants = tenancy.tenants(login).is_some();
        let named = example.claims.get("tid").and_then(serde_json::Value::as_str);
        let tenant = named
            .or(tenancy.home(login))
            .filter(|_| with_tenants)
            .map(str::to_owned);
        if with_tenants && tenant.is_none() && !example.app_roles.is_empty() {
            return Err(format!(
                "policy example `{}` has app roles but names no tenant, and the login issuer \
                 allows several: say which, `claims: {{ tid: <tenant id> }}`",
                example.description
            ));
        }
        let claims = Claims {
            issuer_name: login.into(),
            tenant,
            subject: example.subject.clone(),
            username: example.username.clone(),
            groups: example.groups.clone(),
            app_roles: example.app_roles.clone(),
            raw: example.claims.clone(),
            application: example.application,
        };
        let mut expected_roles = example.expect_roles.clone();
        if let Some(roles) = expected_roles.as_mut() {
            roles.sort();
        }
        let got = self.decide(&claims, &example.request);
        let ok = match (&expected_roles, &example.expect_denied, &got) {
            (Some(roles), None, Ok(decision)) => *roles == decision.granted,
            (None, Some(code), Err(denial)) => code == denial.code(),
            (Some(_), None, Err(_)) | (None, Some(_), Ok(_)) => false,
            _ => {
                return Err(format!(
                    "example `{}` needs exactly one of expect_roles and expect_denied",
                    example.description
                ));
            }
        };
        if ok {
            return Ok(());
        }
        let expected = match (&expected_roles, &example.expect_denied) {
            (Some(roles), _) => format!("roles [{}]", roles.join(", ")),
            (_, Some(code)) => format!("denial `{code}`"),
            _ => String::new(),
        };
        let actual = match got {
            Ok(decision) => format!("roles [{}]", decision.granted.join(", ")),
            Err(denial) => format!("denial `{}` ({denial})", denial.code()),
        };
        Err(format!(
            "policy example `{}` expected {expected} but got {actual}",
            example.description
        ))
    }
}

fn check_role_name(role: &str) -> Result<(), PolicyConfigError> {
    if TALOS_ROLES.contains(&role) {
        Ok(())
    } else {
        Err(PolicyConfigError::UnknownRole {
            role: role.to_owned(),
        })
    }
}

/// The issuers whose tokens `rule` judges: those it names, else the login
/// issuer.
fn rule_issuers(rule: &Rule) -> Vec<&str> {
    if rule.issuers.is_empty() {
        vec![crate::config::LOGIN_ISSUER]
    } else {
        rule.issuers.iter().map(String::as_str).collect()
    }
}

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
        let shown = crate::audit::text::clean(selector, 128);
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
                    crate::audit::text::clean(prefix, 64),
                    issuer_names(issuers, "has", "have"),
                    crate::audit::text::clean(role, 128)
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
                    crate::audit::text::clean(tenant, 64),
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

/// Whether `rule`, whose app-role selectors are `app_roles`, matches
/// `claims`; `home` is the tenant of the token's issuer that a selector
/// naming none stands for.
fn rule_matches(rule: &Rule, app_roles: &[AppRoleSelector], claims: &Claims, home: Option<&str>) -> bool {
    let issuer = if rule.issuers.is_empty() {
        claims.issuer_name == crate::config::LOGIN_ISSUER
    } else {
        rule.issuers.contains(&claims.issuer_name)
    };
    if !issuer || (claims.application && rule.users.is_empty()) {
        return false;
    }
    let groups = rule.groups.is_empty()
        || rule
            .groups
            .iter()
            .any(|g| claims.groups.iter().any(|have| have.eq_ignore_ascii_case(g)));
    // The tenant the token's issuer verified, as for `users`: an issuer
    // without tenants gives none, whatever `tid` its tokens carry.
    let app_roles = app_roles.is_empty()
        || app_roles
            .iter()
            .any(|r| r.matches(home, claims.tenant.as_deref(), &claims.app_roles));
    // People are named by what they cannot change: the subject (`oid` on
    // Entra, else `sub`), optionally pinned to a tenant as `tid/oid`. Never
    // the username: `preferred_username` and `email` are editable, and
    // guests bring their own.
    let tenant = claims.tenant.as_deref();
    let users = rule.users.is_empty()
        || rule.users.iter().any(|u| {
            *u == claims.subject
                || tenant.is_some_and(|tid| {
                    u.split_once('/')
                        .is_some_and(|(t, s)| t.eq_ignore_ascii_case(tid) && s == claims.subject)
                })
        });
    let claim_values = rule
        .claims
        .iter()
        .all(|(name, expected)| match claims.raw.get(name) {
            Some(serde_json::Value::String(s)) => s == expected,
            Some(serde_json::Value::Array(items)) => {
                items.iter().any(|v| v.as_str() == Some(expected.as_str()))
            }
            Some(serde_json::Value::Bool(b)) => b.to_string() == *expected,
            Some(serde_json::Value::Number(n)) => n.to_string() == *expected,
            _ => false,
        });
    groups && app_roles && users && claim_values
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMINS: &str = "0f2a7c3e-1111-4c5d-9e8f-000000000001";
    const ONCALL: &str = "0f2a7c3e-2222-4c5d-9e8f-000000000002";

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    /// An Entra login issuer that allows one tenant, `t` (that of [`person`]s).
    fn home_tenant() -> Tenancy {
        Tenancy::new([(crate::config::LOGIN_ISSUER.to_owned(), strings(&["t"]))])
    }

    fn rule(groups: &[&str], app_roles: &[&str], roles: &[&str]) -> Rule {
        Rule {
            groups: strings(groups),
            app_roles: strings(app_roles),
            roles: strings(roles),
            ..Default::default()
        }
    }

    #[test]
    fn a_rule_judges_the_login_issuer_unless_it_names_others() {
        let scoped = Rule {
            issuers: strings(&["ci"]),
            ..rule(&["deployers"], &[], &["os:operator"])
        };
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![rule(&[ADMINS], &[], &["os:reader"]), scoped],
            ..Default::default()
        })
        .unwrap();
        let from = |issuer: &str, groups: &[&str]| Claims {
            issuer_name: issuer.into(),
            ..person("p", groups, &[], "t")
        };
        let granted = |claims: &Claims| {
            policy
                .decide(claims, &[])
                .map(|d| d.granted)
                .map_err(|d| d.code())
        };
        assert_eq!(granted(&from("login", &[ADMINS])), Ok(strings(&["os:reader"])));
        assert_eq!(
            granted(&from("ci", &[ADMINS])),
            Err("no_matching_rule"),
            "a trusted issuer asserting the admins' group gets nothing"
        );
        assert_eq!(
            granted(&from("ci", &["deployers"])),
            Ok(strings(&["os:operator"]))
        );
        assert_eq!(granted(&from("login", &["deployers"])), Err("no_matching_rule"));
    }

    fn prod() -> ClusterPolicy {
        ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[ADMINS], &[], &["os:admin"]),
                rule(&[ONCALL], &[], &["os:operator"]),
                rule(&[], &["Talos.Reader"], &["os:reader"]),
                Rule {
                    users: strings(&["oid-of-backup-robot@example.com", "tenant-b/oid-of-robot-2"]),
                    roles: strings(&["os:etcd:backup"]),
                    ..Default::default()
                },
                Rule {
                    groups: strings(&[ONCALL]),
                    claims: [("tid".to_owned(), "tenant-a".to_owned())].into(),
                    roles: strings(&["os:etcd:backup"]),
                    ..Default::default()
                },
            ],
            default_roles: strings(&["os:operator", "os:reader", "os:etcd:backup"]),
            allow_impersonator: false,
            tenancy: home_tenant(),
        })
        .unwrap()
    }

    fn person(username: &str, groups: &[&str], app_roles: &[&str], tid: &str) -> Claims {
        let mut raw = serde_json::Map::new();
        raw.insert("tid".into(), tid.into());
        Claims {
            issuer_name: crate::config::LOGIN_ISSUER.into(),
            tenant: Some(tid.into()),
            subject: format!("oid-of-{username}"),
            username: username.into(),
            groups: strings(groups),
            app_roles: strings(app_roles),
            raw,
            application: false,
        }
    }

    /// (who, groups, app roles, tid, requested, granted roles or denial code)
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [&'a str],
        &'a str,
        &'a [&'a str],
        Result<&'a [&'a str], &'a str>,
    );

    #[test]
    fn decisions_table() {
        let policy = prod();
        let cases: &[Case] = &[
            ("reader", &[], &["Talos.Reader"], "t", &[], Ok(&["os:reader"])),
            ("nobody", &[], &[], "t", &[], Err("no_matching_rule")),
            (
                "nobody",
                &["some-other-group"],
                &["Other.Role"],
                "t",
                &[],
                Err("no_matching_rule"),
            ),
            ("oncall", &[ONCALL], &[], "t", &[], Ok(&["os:operator"])),
            (
                "oncall-a",
                &[ONCALL],
                &[],
                "tenant-a",
                &[],
                Ok(&["os:etcd:backup", "os:operator"]),
            ),
            (
                "oncall-upper",
                &["0F2A7C3E-2222-4C5D-9E8F-000000000002"],
                &[],
                "t",
                &[],
                Ok(&["os:operator"]),
            ),
            ("admin", &[ADMINS], &[], "t", &[], Err("role_required")),
            ("admin", &[ADMINS], &[], "t", &["os:admin"], Ok(&["os:admin"])),
            (
                "admin+reader",
                &[ADMINS],
                &["Talos.Reader"],
                "t",
                &[],
                Ok(&["os:reader"]),
            ),
            (
                "admin+reader",
                &[ADMINS],
                &["Talos.Reader"],
                "t",
                &["os:admin", "os:reader"],
                Ok(&["os:admin", "os:reader"]),
            ),
            (
                "oncall",
                &[ONCALL],
                &[],
                "t",
                &["os:admin"],
                Err("role_not_permitted"),
            ),
            (
                "oncall",
                &[ONCALL],
                &[],
                "t",
                &["os:operator", "os:admin"],
                Err("role_not_permitted"),
            ),
            (
                "reader",
                &[],
                &["Talos.Reader"],
                "t",
                &["os:impersonator"],
                Err("role_not_permitted"),
            ),
            (
                "backup-robot@example.com",
                &[],
                &[],
                "t",
                &[],
                Ok(&["os:etcd:backup"]),
            ),
            // Pinned to a tenant: the same oid elsewhere is someone else.
            ("robot-2", &[], &[], "tenant-b", &[], Ok(&["os:etcd:backup"])),
            ("robot-2", &[], &[], "tenant-c", &[], Err("no_matching_rule")),
            // Subjects are compared exactly.
            (
                "BACKUP-ROBOT@example.com",
                &[],
                &[],
                "t",
                &[],
                Err("no_matching_rule"),
            ),
        ];
        for (who, groups, app_roles, tid, requested, expected) in cases {
            let claims = person(who, groups, app_roles, tid);
            let got = policy.decide(&claims, &strings(requested));
            match (expected, got) {
                (Ok(roles), Ok(decision)) => {
                    assert_eq!(decision.granted, strings(roles), "{who} {requested:?}")
                }
                (Err(code), Err(denial)) => assert_eq!(denial.code(), *code, "{who} {requested:?}"),
                (expected, got) => panic!("{who} {requested:?}: expected {expected:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn denials_say_what_would_help() {
        let policy = prod();
        let denial = policy.decide(&person("nobody", &[], &[], "t"), &[]).unwrap_err();
        let message = denial.to_string();
        assert!(
            message.contains(ADMINS) && message.contains(ONCALL) && message.contains("Talos.Reader"),
            "{message}"
        );
        let denial = policy
            .decide(&person("oncall", &[ONCALL], &[], "t"), &strings(&["os:admin"]))
            .unwrap_err();
        assert_eq!(
            denial,
            Denial::RoleNotPermitted {
                requested: strings(&["os:admin"]),
                entitled: strings(&["os:operator"])
            }
        );
    }

    #[test]
    fn users_are_matched_by_subject_never_by_username() {
        let policy = prod();
        let mut claims = person("someone", &[], &[], "t");
        claims.subject = "oid-of-backup-robot@example.com".into();
        assert_eq!(policy.decide(&claims, &[]).unwrap().granted, ["os:etcd:backup"]);
        // A guest who names themselves like the rule's user gets nothing.
        let mut impostor = person("oid-of-backup-robot@example.com", &[], &[], "t");
        impostor.subject = "guest-oid".into();
        assert_eq!(
            policy.decide(&impostor, &[]).unwrap_err().code(),
            "no_matching_rule"
        );
        // `tid/oid` needs the tenant an issuer verified, not a `tid` claim
        // a tenantless issuer's token happens to carry.
        let pinned = person("robot-2", &[], &[], "tenant-b");
        assert_eq!(policy.decide(&pinned, &[]).unwrap().granted, ["os:etcd:backup"]);
        let tenantless = Claims {
            tenant: None,
            ..pinned
        };
        assert_eq!(
            policy.decide(&tenantless, &[]).unwrap_err().code(),
            "no_matching_rule"
        );
        // A trusted issuer's token is judged only by rules that name it.
        let from_ci = Claims {
            issuer_name: "ci".into(),
            ..person("robot-2", &[], &[], "tenant-b")
        };
        assert_eq!(
            policy.decide(&from_ci, &[]).unwrap_err().code(),
            "no_matching_rule"
        );
    }

    #[test]
    fn no_default_roles_means_everything_entitled() {
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[ADMINS], &[], &["os:admin"]),
                rule(&[ADMINS], &[], &["os:reader"]),
            ],
            ..Default::default()
        })
        .unwrap();
        let decision = policy.decide(&person("a", &[ADMINS], &[], "t"), &[]).unwrap();
        assert_eq!(decision.granted, ["os:admin", "os:reader"]);
    }

    #[test]
    fn configuration_mistakes_are_refused() {
        let check = |rules: Vec<Rule>, allow_impersonator: bool| {
            ClusterPolicy::new(PolicyConfig {
                rules,
                default_roles: vec![],
                allow_impersonator,
                tenancy: Tenancy::default(),
            })
            .map(|_| ())
        };
        assert_eq!(
            check(vec![rule(&[ADMINS], &[], &["os:root"])], false),
            Err(PolicyConfigError::UnknownRole {
                role: "os:root".into()
            })
        );
        assert_eq!(
            check(vec![rule(&[], &[], &["os:admin"])], false),
            Err(PolicyConfigError::RuleWithoutSelector { index: 0 })
        );
        assert_eq!(
            check(vec![rule(&[ADMINS], &[], &[])], false),
            Err(PolicyConfigError::RuleWithoutRoles { index: 0 })
        );
        assert_eq!(
            check(
                vec![
                    rule(&[ONCALL], &[], &["os:reader"]),
                    rule(&[ADMINS], &[], &["os:impersonator"])
                ],
                false
            ),
            Err(PolicyConfigError::ImpersonatorNotAllowed { index: 1 })
        );
        assert_eq!(
            check(vec![rule(&[ADMINS], &[], &["os:impersonator"])], true),
            Ok(())
        );
        let bad_default = ClusterPolicy::new(PolicyConfig {
            rules: vec![rule(&[ADMINS], &[], &["os:admin"])],
            default_roles: strings(&["admin"]),
            allow_impersonator: false,
            tenancy: Tenancy::default(),
        });
        assert!(matches!(bad_default, Err(PolicyConfigError::UnknownRole { .. })));
    }

    #[test]
    fn impersonator_is_granted_only_when_named_and_allowed() {
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&["omni"], &[], &["os:impersonator"]),
                rule(&[ADMINS], &[], &["os:admin"]),
            ],
            default_roles: strings(&["os:admin"]),
            allow_impersonator: true,
            tenancy: Tenancy::default(),
        })
        .unwrap();
        // An admin never gets impersonator by being an admin.
        assert_eq!(
            policy
                .decide(&person("a", &[ADMINS], &[], "t"), &[])
                .unwrap()
                .granted,
            ["os:admin"]
        );
        let denial = policy
            .decide(&person("a", &[ADMINS], &[], "t"), &strings(&["os:impersonator"]))
            .unwrap_err();
        assert_eq!(denial.code(), "role_not_permitted");
        // Named by a rule: only on explicit request, since it is not a default.
        let omni = person("omni", &["omni"], &[], "t");
        assert_eq!(policy.decide(&omni, &[]).unwrap_err().code(), "role_required");
        assert_eq!(
            policy
                .decide(&omni, &strings(&["os:impersonator"]))
                .unwrap()
                .granted,
            ["os:impersonator"]
        );
    }

    #[test]
    fn rules_parse_from_yaml_and_unknown_keys_are_errors() {
        let yaml = r#"
rules:
  - { groups: ["g1"], roles: [os:admin] }
  - { app_roles: ["Talos.Reader"], roles: [os:reader] }
  - { users: ["alice@example.com"], claims: { department: platform }, roles: [os:operator] }
default_roles: [os:reader]
"#;
        let config: PolicyConfig = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(config.rules.len(), 3);
        ClusterPolicy::new(config).unwrap();
        let typo = "rules:\n  - { group: [g1], roles: [os:admin] }\n";
        let error = serde_yaml_ng::from_str::<PolicyConfig>(typo)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `group`"), "{error}");
    }

    #[test]
    fn array_and_scalar_claims_match() {
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![Rule {
                claims: [
                    ("amr".to_owned(), "mfa".to_owned()),
                    ("department".to_owned(), "platform".to_owned()),
                ]
                .into(),
                roles: strings(&["os:reader"]),
                ..Default::default()
            }],
            ..Default::default()
        })
        .unwrap();
        let mut claims = person("x", &[], &[], "t");
        claims.raw.insert("amr".into(), serde_json::json!(["pwd", "mfa"]));
        claims
            .raw
            .insert("department".into(), serde_json::json!("platform"));
        assert!(policy.decide(&claims, &[]).is_ok());
        claims.raw.insert("amr".into(), serde_json::json!(["pwd"]));
        assert_eq!(
            policy.decide(&claims, &[]).unwrap_err().code(),
            "no_matching_rule"
        );
    }

    #[test]
    fn examples_catch_a_policy_that_drifted() {
        let policy = prod();
        let yaml = r#"
- { description: "on-call operates", groups: ["0f2a7c3e-2222-4c5d-9e8f-000000000002"], expect_roles: [os:operator] }
- { description: "strangers are denied", username: eve, expect_denied: no_matching_rule }
- { description: "admins must ask", groups: ["0f2a7c3e-1111-4c5d-9e8f-000000000001"], request: [os:admin], expect_roles: [os:admin] }
"#;
        let examples: Vec<PolicyExample> = serde_yaml_ng::from_str(yaml).unwrap();
        for example in &examples {
            policy.check_example(example).unwrap();
        }
        let wrong = PolicyExample {
            description: "readers operate".into(),
            app_roles: strings(&["Talos.Reader"]),
            expect_roles: Some(strings(&["os:operator"])),
            ..Default::default()
        };
        let error = policy.check_example(&wrong).unwrap_err();
        assert_eq!(
            error,
            "policy example `readers operate` expected roles [os:operator] but got roles [os:reader]"
        );
        let both = PolicyExample {
            expect_roles: Some(vec![]),
            expect_denied: Some("x".into()),
            ..Default::default()
        };
        assert!(policy.check_example(&both).unwrap_err().contains("exactly one"));
    }

    #[test]
    fn an_application_is_granted_only_by_a_rule_that_names_it() {
        let app_oid = "5e000000-0000-4000-8000-0000000000a1";
        let named = Rule {
            users: vec![app_oid.into()],
            roles: vec!["os:etcd:backup".into()],
            ..Rule::default()
        };
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[ADMINS], &[], &["os:admin"]),
                rule(&[], &["Talos.Reader"], &["os:reader"]),
                named,
            ],
            tenancy: home_tenant(),
            ..Default::default()
        })
        .unwrap();
        // The group and the app role match a person, never an application.
        let app = |subject: &str| Claims {
            subject: subject.into(),
            application: true,
            ..person("siem-client-id", &[ADMINS], &["Talos.Reader"], "t")
        };
        let refused = policy.decide(&app("another-app"), &[]).unwrap_err();
        assert_eq!(refused.code(), "no_matching_rule");
        assert_eq!(
            refused,
            Denial::NoMatchingRule {
                would_grant: vec!["a rule naming application another-app in `users`".into()]
            }
        );
        assert_eq!(
            policy.decide(&app(app_oid), &[]).unwrap().granted,
            ["os:etcd:backup"]
        );
        let person = Claims {
            subject: app_oid.into(),
            ..person("p", &[ADMINS], &["Talos.Reader"], "t")
        };
        assert_eq!(
            policy.decide(&person, &[]).unwrap().granted,
            ["os:admin", "os:etcd:backup", "os:reader"]
        );
        // An example may stand for an application.
        let example = |application: bool| PolicyExample {
            description: "the collector".into(),
            subject: "another-app".into(),
            app_roles: vec!["Talos.Reader".into()],
            application,
            expect_denied: Some("no_matching_rule".into()),
            ..PolicyExample::default()
        };
        assert_eq!(policy.check_example(&example(true)), Ok(()));
        assert!(policy.check_example(&example(false)).is_err());
    }

    const TENANT_A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
    const TENANT_B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";

    /// The login issuer allows tenants A and B; `partner` (Entra) allows
    /// C; `ci` has no tenants.
    fn two_tenants() -> Tenancy {
        Tenancy::new([
            (
                crate::config::LOGIN_ISSUER.to_owned(),
                strings(&[TENANT_A, TENANT_B]),
            ),
            (
                "partner".to_owned(),
                strings(&["cccccccc-0000-4000-8000-00000000000c"]),
            ),
            ("ci".to_owned(), vec![]),
        ])
    }

    #[test]
    fn app_roles_count_only_in_the_tenant_that_assigned_them() {
        let pinned_a = format!("{TENANT_A}/Talos.Admin");
        let pinned_b = format!("{}/Talos.Reader", TENANT_B.to_uppercase());
        let pinned_slash = format!("{TENANT_A}/Ops/Backup");
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[], &[&pinned_a], &["os:admin"]),
                rule(&[], &[&pinned_b], &["os:reader"]),
                rule(&[], &[&pinned_slash], &["os:etcd:backup"]),
            ],
            tenancy: two_tenants(),
            ..Default::default()
        })
        .unwrap();
        let granted = |app_roles: &[&str], tid: &str| {
            policy
                .decide(&person("p", &[], app_roles, tid), &[])
                .map(|d| d.granted)
                .map_err(|d| d.code())
        };
        assert_eq!(granted(&["Talos.Admin"], TENANT_A), Ok(strings(&["os:admin"])));
        // The same role value, assigned by tenant B's administrators.
        assert_eq!(granted(&["Talos.Admin"], TENANT_B), Err("no_matching_rule"));
        // Tenants compare case-insensitively, role values exactly.
        assert_eq!(granted(&["Talos.Reader"], TENANT_B), Ok(strings(&["os:reader"])));
        assert_eq!(granted(&["Talos.Reader"], TENANT_A), Err("no_matching_rule"));
        assert_eq!(granted(&["talos.admin"], TENANT_A), Err("no_matching_rule"));
        // The tenant ends at the first `/`: the role may have one of its own.
        assert_eq!(
            granted(&["Ops/Backup"], TENANT_A),
            Ok(strings(&["os:etcd:backup"]))
        );
        assert_eq!(granted(&[&pinned_a], TENANT_A), Err("no_matching_rule"));
        // What would help names the tenant.
        let Err(Denial::NoMatchingRule { would_grant }) =
            policy.decide(&person("p", &[], &[], TENANT_A), &[])
        else {
            panic!("denied");
        };
        assert!(
            would_grant.contains(&format!("app role Talos.Admin in tenant {TENANT_A}"))
                && would_grant.contains(&format!(
                    "app role Talos.Reader in tenant {}",
                    TENANT_B.to_uppercase()
                )),
            "{would_grant:?}"
        );
    }

    #[test]
    fn an_app_role_alone_stands_for_the_only_tenant_or_for_none() {
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[], &["Talos.Reader"], &["os:reader"]),
                Rule {
                    issuers: strings(&["ci"]),
                    ..rule(&[], &["deploy/prod"], &["os:operator"])
                },
            ],
            tenancy: home_tenant(),
            ..Default::default()
        })
        .unwrap();
        let decide = |claims: &Claims| {
            policy
                .decide(claims, &[])
                .map(|d| d.granted)
                .map_err(|d| d.code())
        };
        assert_eq!(
            decide(&person("p", &[], &["Talos.Reader"], "T")),
            Ok(strings(&["os:reader"]))
        );
        // Another tenant's token (which the issuer would refuse) gets nothing.
        assert_eq!(
            decide(&person("p", &[], &["Talos.Reader"], "u")),
            Err("no_matching_rule")
        );
        // An issuer without tenants: the selector is the role as written.
        let from_ci = |roles: &[&str]| Claims {
            issuer_name: "ci".into(),
            tenant: None,
            ..person("p", &[], roles, "t")
        };
        assert_eq!(decide(&from_ci(&["deploy/prod"])), Ok(strings(&["os:operator"])));
        assert_eq!(decide(&from_ci(&["prod"])), Err("no_matching_rule"));
        let Err(Denial::NoMatchingRule { would_grant }) = policy.decide(&person("p", &[], &[], "t"), &[])
        else {
            panic!("denied");
        };
        assert_eq!(
            would_grant,
            strings(&["app role Talos.Reader in tenant t", "app role deploy/prod"])
        );
        // A rule that names no tenant matches no tenant's token when the
        // issuer allows several (such a rule is refused at load; this is
        // what a rule that got through would do).
        for tid in [TENANT_A, TENANT_B] {
            assert!(!AppRoleSelector::parse("Talos.Reader").matches(
                two_tenants().home("login"),
                Some(tid),
                &strings(&["Talos.Reader"])
            ));
        }
    }

    #[test]
    fn an_app_role_selector_is_read_once_and_named_as_it_counts() {
        let pinned = AppRoleSelector::parse(&format!("{TENANT_A}/Ops/Backup"));
        assert_eq!(
            pinned,
            AppRoleSelector {
                tenant: Some(TENANT_A.to_owned()),
                role: "Ops/Backup".to_owned()
            }
        );
        let alone = AppRoleSelector::parse("Talos.Reader");
        assert_eq!(
            (alone.tenant.as_deref(), alone.role.as_str()),
            (None, "Talos.Reader")
        );
        // Written back as it was read.
        for written in [
            format!("{TENANT_A}/Ops/Backup"),
            "Talos.Reader".into(),
            "/x".into(),
            "t/".into(),
        ] {
            assert_eq!(AppRoleSelector::parse(&written).to_string(), written);
        }
        // Without a tenant to compare, the selector is the role as written.
        assert!(pinned.matches(None, None, &[format!("{TENANT_A}/Ops/Backup")]));
        assert!(!pinned.matches(None, None, &strings(&["Ops/Backup", TENANT_A])));
        // Named with the tenant it counts in, or as written when there is none.
        let home = strings(&[TENANT_A]);
        let both = strings(&[TENANT_A, TENANT_B]);
        assert_eq!(
            pinned.describe(&both),
            Some(format!("app role Ops/Backup in tenant {TENANT_A}"))
        );
        assert_eq!(
            alone.describe(&home),
            Some(format!("app role Talos.Reader in tenant {TENANT_A}"))
        );
        assert_eq!(alone.describe(&both), None);
        assert_eq!(
            pinned.describe(&[]),
            Some(format!("app role {TENANT_A}/Ops/Backup"))
        );
    }

    #[test]
    fn app_role_selectors_are_checked_against_the_tenants_of_their_issuers() {
        let tenancy = two_tenants();
        let check = |selector: &str, issuers: &[&str]| {
            check_app_roles(&strings(&[selector]), issuers, &tenancy).map(|_| ())
        };
        let login = &[crate::config::LOGIN_ISSUER][..];
        let error = check("Talos.Admin", login).unwrap_err();
        assert!(
            error.contains("app role `Talos.Admin` names no tenant, but issuer `login` allows several")
                && error.contains(&format!("`{TENANT_A}/Talos.Admin`")),
            "{error}"
        );
        assert_eq!(check(&format!("{TENANT_A}/Talos.Admin"), login), Ok(()));
        assert_eq!(
            check(&format!("{}/Talos.Admin", TENANT_B.to_uppercase()), login),
            Ok(())
        );
        let error = check("cccccccc-0000-4000-8000-00000000000c/Talos.Admin", login).unwrap_err();
        assert!(error.contains("which issuer `login` does not allow"), "{error}");
        let error = check("Ops/Backup", login).unwrap_err();
        assert!(
            error.contains("names tenant `Ops`") && error.contains("the tenant first"),
            "{error}"
        );
        assert!(
            check(&format!("{TENANT_A}/"), login)
                .unwrap_err()
                .contains("both parts")
        );
        assert!(check("", login).is_err());
        // Per issuer of the rule: each pinned tenant is one of them.
        let both = &["login", "partner"][..];
        assert_eq!(
            check("cccccccc-0000-4000-8000-00000000000c/Talos.Admin", both),
            Ok(())
        );
        assert!(
            check("Talos.Admin", both)
                .unwrap_err()
                .contains("issuer `login` allows several")
        );
        // One tenant: the role alone is that tenant's.
        assert_eq!(check("Talos.Admin", &["partner"]), Ok(()));
        assert_eq!(check("Talos.Admin", &["ci", "partner"]), Ok(()));
        // No tenants: a tenant is meaningless, a `/` of the role's own is fine.
        let error = check(&format!("{TENANT_A}/Talos.Admin"), &["ci"]).unwrap_err();
        assert!(
            error.contains("but issuer `ci` has no tenants: write the role alone, `Talos.Admin`"),
            "{error}"
        );
        assert!(check("00000000-1111-2222-3333-444444444444/Talos.Admin", &["ci"]).is_err());
        assert_eq!(check("deploy/prod", &["ci"]), Ok(()));
        // The refusal stops the cluster's policy too.
        let refused = ClusterPolicy::new(PolicyConfig {
            rules: vec![
                rule(&[ADMINS], &[], &["os:reader"]),
                rule(&[], &["Talos.Admin"], &["os:admin"]),
            ],
            tenancy: tenancy.clone(),
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            matches!(refused, PolicyConfigError::AppRole { index: 1, .. }),
            "{refused}"
        );
        assert!(
            refused
                .to_string()
                .starts_with("rule 1: app role `Talos.Admin` names no tenant")
        );
    }

    #[test]
    fn a_tenant_is_refused_in_a_selector_whose_issuers_have_none() {
        // `contoso` is no GUID, but a tenant this server allows (for
        // `partner`): in front of a role for `ci`, which has no tenants, it
        // is refused as a tenant all the same.
        let tenancy = Tenancy::new([
            (crate::config::LOGIN_ISSUER.to_owned(), strings(&[TENANT_A])),
            ("partner".to_owned(), strings(&["contoso"])),
        ]);
        let check = |selector: &str, issuers: &[&str]| {
            check_app_roles(&strings(&[selector]), issuers, &tenancy).map(|_| ())
        };
        for selector in ["contoso/Talos.Admin", "CONTOSO/Talos.Admin"] {
            let error = check(selector, &["ci"]).unwrap_err();
            assert!(
                error.starts_with(&format!(
                    "app role `{selector}` names tenant `{}`",
                    &selector[..7]
                )) && error.ends_with("but issuer `ci` has no tenants: write the role alone, `Talos.Admin`"),
                "{error}"
            );
        }
        // Any other prefix is the role's own.
        assert_eq!(check("contosa/Talos.Admin", &["ci"]), Ok(()));
        // A rule of several issuers names them all, the verb agreeing.
        let error = check(&format!("{TENANT_A}/Talos.Admin"), &["ci", "cd"]).unwrap_err();
        assert!(
            error.contains("but issuers `ci`, `cd` have no tenants: write the role alone"),
            "{error}"
        );
        let error = check(
            &format!("{TENANT_B}/Talos.Admin"),
            &[crate::config::LOGIN_ISSUER, "partner"],
        )
        .unwrap_err();
        assert!(
            error.contains(&format!(
                "which issuers `login`, `partner` do not allow (allowed: {TENANT_A}, contoso)"
            )),
            "{error}"
        );
    }

    #[test]
    fn an_example_is_of_the_tenant_it_names_or_of_the_only_one() {
        let pinned = format!("{TENANT_A}/Talos.Reader");
        let policy = ClusterPolicy::new(PolicyConfig {
            rules: vec![rule(&[], &[&pinned], &["os:reader"])],
            tenancy: two_tenants(),
            ..Default::default()
        })
        .unwrap();
        let example = |tid: Option<&str>, expect: &str| PolicyExample {
            description: "readers".into(),
            app_roles: strings(&["Talos.Reader"]),
            claims: tid
                .map(|t| ("tid".to_owned(), serde_json::json!(t)))
                .into_iter()
                .collect(),
            expect_roles: (expect == "reader").then(|| strings(&["os:reader"])),
            expect_denied: (expect != "reader").then(|| expect.to_owned()),
            ..Default::default()
        };
        assert_eq!(policy.check_example(&example(Some(TENANT_A), "reader")), Ok(()));
        assert_eq!(
            policy.check_example(&example(Some(TENANT_B), "no_matching_rule")),
            Ok(())
        );
        let error = policy.check_example(&example(None, "reader")).unwrap_err();
        assert!(
            error.contains("names no tenant") && error.contains("claims: { tid: <tenant id> }"),
            "{error}"
        );
        // With one tenant, the example is of it.
        let single = ClusterPolicy::new(PolicyConfig {
            rules: vec![rule(&[], &["Talos.Reader"], &["os:reader"])],
            tenancy: home_tenant(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(single.check_example(&example(None, "reader")), Ok(()));
    }
}
