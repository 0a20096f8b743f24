//! What the clusters' rules, the policy examples, the auditors and the
//! admins are, as written; what they mean is `policy`'s business.

use serde::Deserialize;

/// One rule of a cluster, as written in the configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Group object ids (Entra) or group names (other providers); matches
    /// when the person is in any of them. Compared case-insensitively.
    /// Each is the id alone, or `{id, name}` with a name people know the
    /// group by, shown next to the id when a refusal says what grants a role.
    #[serde(default)]
    pub groups: Vec<GroupRef>,
    /// App roles (the token's `roles` claim); any of them. `<tenant
    /// id>/<role>` counts the role only as that tenant assigned it; the
    /// role alone stands for the only tenant of an issuer that allows one
    /// (refused when an issuer of the rule allows several).
    #[serde(default)]
    pub app_roles: Vec<String>,
    /// Specific people by subject (`oid` for Entra, else `sub`), or
    /// `tid/oid` to pin the tenant; any of them. Usernames never match:
    /// their owners can change them.
    #[serde(default)]
    pub users: Vec<String>,
    /// Claim values that must all be present: a string claim equal to the
    /// value, or an array claim containing it.
    #[serde(default)]
    pub claims: std::collections::BTreeMap<String, String>,
    /// Talos roles this rule grants.
    pub roles: Vec<String>,
    /// The issuers whose tokens this rule judges, by configured name
    /// (`login` is the one people log in with, the others are
    /// `identity.trusted_issuers` names). Empty: the login issuer only, so
    /// that a newly trusted issuer is granted nothing until a rule names it.
    #[serde(default)]
    pub issuers: Vec<String>,
}

/// A group a rule names: its id, and the name people know it by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupRef {
    /// What tokens carry: an Entra object id, or the group's name.
    pub id: String,
    /// For people: an Entra object id says nothing to whoever is refused.
    pub name: Option<String>,
}

impl From<&str> for GroupRef {
    fn from(id: &str) -> Self {
        Self {
            id: id.to_owned(),
            name: None,
        }
    }
}

impl<'de> Deserialize<'de> for GroupRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The `{id, name}` form; unknown keys are refused as everywhere.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Named {
            id: String,
            name: String,
        }

        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = GroupRef;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a group id, or `{id, name}`")
            }

            fn visit_str<E: serde::de::Error>(self, id: &str) -> Result<GroupRef, E> {
                Ok(GroupRef::from(id))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<GroupRef, A::Error> {
                let named = Named::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(GroupRef {
                    id: named.id,
                    name: Some(named.name),
                })
            }
        }

        deserializer.deserialize_any(Visitor)
    }
}

/// A workload rule of a cluster: which tokens of one workload issuer it
/// admits, by their claims, and what it grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadRule {
    /// Names the rule in `check`, the audit trail and the server log;
    /// unique in the cluster.
    pub name: String,
    /// The workload issuer (an `identity.trusted_issuers` name) whose
    /// tokens it judges.
    pub issuer: String,
    /// Claim values that must all match (the claims the issuer's kind
    /// offers): exact, or a glob where `*` matches any run of characters
    /// and `?` one (`refs/tags/v*`).
    pub claims: std::collections::BTreeMap<String, String>,
    /// Talos roles it grants.
    pub roles: Vec<String>,
    /// Certificate lifetime when the client asks for none (default: the
    /// cluster's `ttl`; at most its `max_ttl`).
    #[serde(default, deserialize_with = "crate::config::de::optional_duration")]
    pub ttl: Option<std::time::Duration>,
}

/// The policy part of a cluster's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    pub rules: Vec<Rule>,
    /// Roles granted when the request names none (intersected with what the
    /// person is entitled to). Empty: every entitled role.
    pub default_roles: Vec<String>,
    /// Allow rules to grant `os:impersonator`.
    pub allow_impersonator: bool,
    /// The tenants of the issuers, what app roles are read against (from
    /// `identity`, not from the cluster).
    #[serde(skip)]
    pub tenancy: Tenancy,
    /// Workload rules: the only rules workload tokens are judged by.
    pub workloads: Vec<WorkloadRule>,
    /// The workload issuers by name, with their kind (from `identity`).
    #[serde(skip)]
    pub workload_kinds: std::collections::BTreeMap<String, String>,
}

/// The tenants each issuer allows, by configured name: what app-role
/// selectors are read against. An issuer missing here has no tenants
/// (kind `oidc`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenancy(pub(crate) std::collections::BTreeMap<String, Vec<String>>);

impl Tenancy {
    /// From (issuer name, allowed tenants) of the issuers that have
    /// tenants (Entra's `allowed_tenants`).
    pub fn new(issuers: impl IntoIterator<Item = (String, Vec<String>)>) -> Self {
        Self(
            issuers
                .into_iter()
                .filter(|(_, tenants)| !tenants.is_empty())
                .collect(),
        )
    }

    /// The tenants `issuer` allows; `None` when it has none.
    pub fn tenants(&self, issuer: &str) -> Option<&[String]> {
        self.0.get(issuer).map(Vec::as_slice)
    }

    /// The tenant an app role that names none is read in for `issuer`:
    /// its only allowed tenant. `None` when it allows several (such a
    /// selector is refused at load, and matches nothing if one got
    /// through) or has none.
    pub fn home(&self, issuer: &str) -> Option<&str> {
        self.tenants(issuer).and_then(home_tenant)
    }
}

/// The tenant an app role that names none is read in, for an issuer that
/// allows `tenants`: the only one, else none.
pub fn home_tenant(tenants: &[String]) -> Option<&str> {
    match tenants {
        [only] => Some(only.as_str()),
        _ => None,
    }
}

/// A claims -> roles example from the configuration, checked at start-up so
/// a rule change that breaks an intended outcome stops the server instead of
/// silently granting or denying.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyExample {
    /// What the example is about, shown when it fails.
    pub description: String,
    /// The cluster whose rules it checks (in the server configuration).
    pub cluster: String,
    /// A workload issuer's name: the example stands for a token of that
    /// workload, whose `claims` the cluster's workload rules judge.
    /// Without it, a person of the login issuer.
    pub issuer: Option<String>,
    pub username: String,
    pub subject: String,
    pub groups: Vec<String>,
    pub app_roles: Vec<String>,
    /// Other claims, for `claims` selectors.
    pub claims: serde_json::Map<String, serde_json::Value>,
    /// The example stands for an application's own token (client
    /// credentials) rather than a person's.
    pub application: bool,
    /// Roles asked for (`--role`); empty means the defaults.
    pub request: Vec<String>,
    /// The roles that must be granted...
    pub expect_roles: Option<Vec<String>>,
    /// ...or the denial code that must come back.
    pub expect_denied: Option<String>,
}

/// Who `auditors` or `admins` are: people (groups, app roles) and
/// applications (app roles, client ids), all of the login issuer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupList {
    /// Group object ids (Entra) or names; compared case-insensitively.
    pub groups: Vec<String>,
    /// App roles (`roles`), of a person or of an application's own token.
    /// `<tenant id>/<role>` counts the role only as that tenant assigned
    /// it; the role alone stands for the login issuer's only tenant, and is
    /// refused when it allows several (`policy::check_app_roles`).
    pub app_roles: Vec<String>,
    /// Client ids (`azp`/`appid`) of applications whose own tokens (client
    /// credentials) are let in, whatever their app roles; never a person.
    /// Not tied to a tenant: an application's client id is the same in
    /// every tenant that has a copy of it (docs/entra-id.md).
    pub client_ids: Vec<String>,
}
