//! A cluster's rules, checked once when the configuration loads
//! ([`ClusterPolicy::new`]), and which of them match a token.

use std::collections::BTreeSet;

use super::app_roles::{AppRoleSelector, check_app_roles};
use super::decision::Applicant;
use super::workloads::WorkloadRules;
use super::{IMPERSONATOR, TALOS_ROLES};
use crate::config::{PolicyConfig, Rule};

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

/// A cluster's checked rules.
#[derive(Debug, Clone)]
pub struct ClusterPolicy {
    pub(super) config: PolicyConfig,
    /// Each rule's app-role selectors, read once at load (by rule index).
    pub(super) app_roles: Vec<Vec<AppRoleSelector>>,
    /// The workload rules: the only rules workload tokens are judged by.
    pub workloads: WorkloadRules,
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
        let workloads = WorkloadRules::new(
            &config.workloads,
            &config.workload_kinds,
            config.allow_impersonator,
        )?;
        Ok(Self {
            config,
            app_roles,
            workloads,
        })
    }

    /// The group ids this cluster's rules mention: the only ones worth
    /// fetching from Graph when a token has group overage.
    pub fn referenced_groups(&self) -> impl Iterator<Item = &str> {
        self.config
            .rules
            .iter()
            .flat_map(|r| r.groups.iter().map(|g| g.id.as_str()))
    }

    /// Every role some rule of this cluster grants, to anyone (sorted).
    pub fn grantable_roles(&self) -> Vec<String> {
        let roles: BTreeSet<&str> = self
            .config
            .rules
            .iter()
            .flat_map(|r| r.roles.iter().map(String::as_str))
            .chain(
                self.config
                    .workloads
                    .iter()
                    .flat_map(|r| r.roles.iter().map(String::as_str)),
            )
            .collect();
        roles.into_iter().map(str::to_owned).collect()
    }

    /// What membership would grant a role here, as a denial names it.
    pub(super) fn selectors(&self) -> Vec<String> {
        let mut out = BTreeSet::new();
        for (rule, app_roles) in self.config.rules.iter().zip(&self.app_roles) {
            out.extend(rule.groups.iter().map(|g| match &g.name {
                Some(name) => format!("group {} ({name})", g.id),
                None => format!("group {}", g.id),
            }));
            for issuer in rule_issuers(rule) {
                let tenants = self.config.tenancy.tenants(issuer).unwrap_or_default();
                out.extend(app_roles.iter().filter_map(|r| r.describe(tenants)));
            }
        }
        out.into_iter().collect()
    }
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

/// The issuers whose tokens `rule` judges: those it names, else the login
/// issuer.
pub(super) fn rule_issuers(rule: &Rule) -> Vec<&str> {
    if rule.issuers.is_empty() {
        vec![crate::config::LOGIN_ISSUER]
    } else {
        rule.issuers.iter().map(String::as_str).collect()
    }
}

/// Whether `rule`, whose app-role selectors are `app_roles`, matches
/// `claims`; `home` is the tenant of the token's issuer that a selector
/// naming none stands for.
pub(super) fn rule_matches(
    rule: &Rule,
    app_roles: &[AppRoleSelector],
    claims: &Applicant,
    home: Option<&str>,
) -> bool {
    let issuer = if rule.issuers.is_empty() {
        claims.issuer_name == crate::config::LOGIN_ISSUER
    } else {
        rule.issuers.contains(&claims.issuer_name)
    };
    // A workload is judged by workload rules only, whatever its issuer.
    if !issuer || claims.workload || (claims.application && rule.users.is_empty()) {
        return false;
    }
    let groups = rule.groups.is_empty()
        || rule
            .groups
            .iter()
            .any(|g| claims.groups.iter().any(|have| have.eq_ignore_ascii_case(&g.id)));
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
