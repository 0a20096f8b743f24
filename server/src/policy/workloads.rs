//! Workload rules: which CI jobs and service accounts get which Talos
//! roles on a cluster, from the claims of their tokens.
//!
//! Workloads and people never share rules: a workload token is judged by
//! the cluster's `workloads` only, and a person's never is. A rule names
//! one workload issuer and claims of its kind's schema
//! (`identity::issuer::workload`), all of which must match: exactly, or as
//! a glob (`*` any run of characters, `?` one). Every rule names at least
//! one of its kind's anchors exactly (a repository, a project, a
//! namespace), so that no rule admits every repository on GitHub. Deny by
//! default: a token no rule admits gets nothing, and what it missed goes to
//! the audit record and the log, never to the answer.

use std::collections::BTreeSet;
use std::time::Duration;

use wildmatch::WildMatch;

use super::rules::check_role_name;
use super::{IMPERSONATOR, PolicyConfigError};
use crate::config::WorkloadRule;
use crate::identity::issuer::workload::{Workload, schema};

/// How a rule compares one claim.
#[derive(Debug, Clone)]
enum Pattern {
    Exact(String),
    Glob(WildMatch),
}

impl Pattern {
    fn new(text: &str) -> Self {
        if text.contains(['*', '?']) {
            Pattern::Glob(WildMatch::new(text))
        } else {
            Pattern::Exact(text.to_owned())
        }
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Exact(expected) => expected == value,
            Pattern::Glob(glob) => glob.matches(value),
        }
    }
}

/// One workload rule, checked.
#[derive(Debug, Clone)]
struct Checked {
    rule: WorkloadRule,
    claims: Vec<(String, Pattern)>,
}

/// A cluster's workload rules, checked at load.
#[derive(Debug, Clone, Default)]
pub struct WorkloadRules {
    rules: Vec<Checked>,
}

/// What the workload rules grant a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadGrant {
    /// Roles to put in the certificate (sorted).
    pub granted: Vec<String>,
    /// The rules that admitted the token.
    pub rules: Vec<String>,
    /// The shortest `ttl` of those rules that set one.
    pub ttl: Option<Duration>,
}

/// A rule of the token's issuer that did not admit it, and the claims it
/// missed (by name: the values are in the record's `claims`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadMiss {
    pub rule: String,
    pub claims: Vec<String>,
}

/// Why the workload rules grant nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadDenial {
    /// No rule admits the token; each rule of its issuer and what it missed.
    NotAdmitted { misses: Vec<WorkloadMiss> },
    /// Admitted, but not to every role asked for.
    RoleNotPermitted {
        requested: Vec<String>,
        entitled: Vec<String>,
    },
}

impl WorkloadDenial {
    /// The API code of this denial: the answer and the record take their
    /// code from it. A token no rule admits learns nothing of the rules.
    pub fn error_code(&self) -> talos_sso_api::ErrorCode {
        match self {
            WorkloadDenial::NotAdmitted { .. } => talos_sso_api::ErrorCode::WorkloadNotAdmitted,
            WorkloadDenial::RoleNotPermitted { requested, entitled } => {
                talos_sso_api::ErrorCode::RoleNotPermitted {
                    refused: talos_sso_text::clean_list(requested),
                    entitled: entitled.clone(),
                }
            }
        }
    }
}

impl std::fmt::Display for WorkloadDenial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkloadDenial::NotAdmitted { .. } => {
                f.write_str("no workload rule of this cluster admits this token")
            }
            WorkloadDenial::RoleNotPermitted { requested, entitled } => write!(
                f,
                "this workload may not have {}; it is entitled to: {}",
                requested.join(", "),
                entitled.join(", ")
            ),
        }
    }
}

impl WorkloadRules {
    /// Check `rules`: each names a workload issuer of `kinds` (issuer name
    /// to kind), only claims of its kind, one anchor exactly, and Talos
    /// roles (`os:impersonator` only when the cluster allows it).
    pub fn new(
        rules: &[WorkloadRule],
        kinds: &std::collections::BTreeMap<String, String>,
        allow_impersonator: bool,
    ) -> Result<Self, PolicyConfigError> {
        let mut checked = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            let fail = |message: String| PolicyConfigError::Workload { index, message };
            let schema = kinds
                .get(&rule.issuer)
                .and_then(|kind| schema(kind))
                .ok_or_else(|| fail(format!("`{}` is not a workload issuer", rule.issuer)))?;
            if rule.roles.is_empty() {
                return Err(fail("grants no roles".into()));
            }
            for role in &rule.roles {
                check_role_name(role)?;
                if role == IMPERSONATOR && !allow_impersonator {
                    return Err(fail(
                        "grants os:impersonator; set allow_impersonator: true on the cluster if that is really intended"
                            .into(),
                    ));
                }
            }
            if let Some(unknown) = rule
                .claims
                .keys()
                .find(|name| !schema.claims.contains(&name.as_str()))
            {
                return Err(fail(format!(
                    "`{}` is not a claim of {} tokens; they offer: {}",
                    talos_sso_text::clean(unknown, 64),
                    schema.kind,
                    schema.claims.join(", ")
                )));
            }
            let anchored = schema.anchors.iter().any(|anchor| {
                rule.claims.get(*anchor).is_some_and(|value| {
                    matches!(Pattern::new(value), Pattern::Exact(_)) && !value.is_empty()
                })
            });
            if !anchored {
                return Err(fail(format!(
                    "name one of {} exactly (no `*` or `?`): without it the rule would admit every {} workload",
                    schema.anchors.join(", "),
                    schema.kind
                )));
            }
            checked.push(Checked {
                rule: rule.clone(),
                claims: rule
                    .claims
                    .iter()
                    .map(|(name, value)| (name.clone(), Pattern::new(value)))
                    .collect(),
            });
        }
        Ok(Self { rules: checked })
    }

    /// The rules' roles a token of issuer `issuer_name` with `workload`'s
    /// claims is granted for `requested` (empty: every role it is entitled
    /// to), or why not.
    pub fn decide(
        &self,
        issuer_name: &str,
        workload: &Workload,
        requested: &[String],
    ) -> Result<WorkloadGrant, WorkloadDenial> {
        let mut misses = Vec::new();
        let mut admitted = Vec::new();
        for checked in self.rules.iter().filter(|c| c.rule.issuer == issuer_name) {
            let missed: Vec<String> = checked
                .claims
                .iter()
                .filter(|(name, pattern)| {
                    !workload
                        .claims
                        .get(name)
                        .is_some_and(|value| pattern.matches(value))
                })
                .map(|(name, _)| name.clone())
                .collect();
            if missed.is_empty() {
                admitted.push(&checked.rule);
            } else {
                misses.push(WorkloadMiss {
                    rule: checked.rule.name.clone(),
                    claims: missed,
                });
            }
        }
        if admitted.is_empty() {
            return Err(WorkloadDenial::NotAdmitted { misses });
        }
        let entitled: BTreeSet<&str> = admitted
            .iter()
            .flat_map(|rule| rule.roles.iter().map(String::as_str))
            .collect();
        let refused: Vec<String> = requested
            .iter()
            .filter(|role| !entitled.contains(role.as_str()))
            .cloned()
            .collect();
        if !refused.is_empty() {
            return Err(WorkloadDenial::RoleNotPermitted {
                requested: refused,
                entitled: entitled.iter().map(|r| (*r).to_owned()).collect(),
            });
        }
        let granted: BTreeSet<String> = if requested.is_empty() {
            entitled.iter().map(|r| (*r).to_owned()).collect()
        } else {
            requested.iter().cloned().collect()
        };
        Ok(WorkloadGrant {
            granted: granted.into_iter().collect(),
            rules: admitted.iter().map(|rule| rule.name.clone()).collect(),
            ttl: admitted.iter().filter_map(|rule| rule.ttl).min(),
        })
    }

    /// What `check` prints of each rule: its name, issuer, claims, roles
    /// and lifetime.
    pub fn describe(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|Checked { rule, .. }| {
                let claims: Vec<String> = rule
                    .claims
                    .iter()
                    .map(|(name, value)| format!("{name}={value}"))
                    .collect();
                let ttl = rule
                    .ttl
                    .map(|ttl| format!(" for {}s", ttl.as_secs()))
                    .unwrap_or_default();
                format!(
                    "workload rule {}: {} tokens with {} get {}{ttl}",
                    rule.name,
                    rule.issuer,
                    claims.join(", "),
                    rule.roles.join(", ")
                )
            })
            .collect()
    }
}
