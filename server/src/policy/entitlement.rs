//! The decision: the roles a verified token entitles its bearer to on a
//! cluster, and the ones granted for what they asked (or the denial).

use std::collections::BTreeSet;

use super::decision::{Applicant, Decision, Denial};
use super::defaults::default_grant;
use super::rules::{ClusterPolicy, rule_matches};

impl ClusterPolicy {
    /// Every role some rule could grant here.
    pub fn entitled(&self, claims: &Applicant) -> Vec<String> {
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
    pub fn decide(&self, claims: &Applicant, requested: &[String]) -> Result<Decision, Denial> {
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
            default_grant(&self.config.default_roles, entitled)?
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
}
