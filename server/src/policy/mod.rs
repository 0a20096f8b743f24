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
//!
//! - `rules`: a cluster's rules, checked at load, and which match a token.
//! - `app_roles`: app-role selectors and the tenant they count in.
//! - `decision`: who applies, what a decision grants, and denials.
//! - `entitlement`: the roles a token entitles to, and the decision.
//! - `defaults`: what is granted when nothing is asked for.
//! - `examples`: the configured examples, checked at start.
//! - `workloads`: workload rules, by claims, for CI jobs and service
//!   accounts (never for people, as people's rules are never for them).

mod app_roles;
mod decision;
mod defaults;
mod entitlement;
mod examples;
mod rules;
mod workloads;

pub use app_roles::{AppRoleSelector, check_app_roles};
pub use decision::{Applicant, Decision, Denial};
pub use rules::{ClusterPolicy, PolicyConfigError};
pub use workloads::{WorkloadDenial, WorkloadGrant, WorkloadMiss, WorkloadRules};

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

#[cfg(test)]
mod tests;
