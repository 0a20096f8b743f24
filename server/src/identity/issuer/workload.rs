//! What the workload kinds (`kubernetes`, `github-actions`, `gitlab-ci`)
//! share: a token names a workload, never a person, and offers a fixed set
//! of claims that workload rules may name ([`Schema`]).
//!
//! A workload's subject is what a deny-list entry names, and what its
//! owner cannot change: `ISSUER:system:serviceaccount:NS:NAME` for a
//! service account, `ISSUER:repository_id:74` for a GitHub repository,
//! `ISSUER:project_id:20` for a GitLab project (a renamed repository is the
//! same subject; `ISSUER` is the configured issuer's name, so that two
//! clusters or two GitLabs never share one). Its username, the
//! certificate's CN, is `KIND:NAME` (the service account, the repository's
//! or project's path), shortened with a hash to fit RFC 5280's 64
//! characters. Its token may mint several
//! certificates (`certificates_per_token`), so that a job longer than one
//! certificate renews from the same token.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Kind, Principal, Registration, claim_text, claimed_token_id};
use crate::config::IssuerConfig;
use crate::identity::ClaimedIdentity;
use crate::identity::token::{ClaimSet, TokenError, string_claim};
use talos_sso_api::issuer::is_template;

/// The claims a workload kind offers to rules.
pub struct Schema {
    pub kind: &'static str,
    /// Every claim a rule may name, as rules name them.
    pub claims: &'static [&'static str],
    /// Every rule names at least one of these exactly (no wildcard): what
    /// keeps a rule from admitting every repository on GitHub, or every
    /// service account of a cluster.
    pub anchors: &'static [&'static str],
    /// The claim whose value names the workload for good: its owner cannot
    /// change it (`repository_id`, `project_id`, `sub`).
    pub subject: &'static str,
    /// The claim that names it for people (the CN): `repository`,
    /// `project_path`, `sub`.
    pub name: &'static str,
    /// Claims only this kind's tokens carry (any of them): a token with one
    /// of them is never a person's, whatever audience it names (GitLab lets
    /// a job ask for any audience, the people's client id included).
    pub markers: &'static [&'static str],
    /// The subject, name and claims rules match of a verified token.
    pub identify: fn(&Schema, &ClaimSet) -> Result<Identified, TokenError>,
}

/// How most kinds read a token: the subject `CLAIM:VALUE` of
/// [`Schema::subject`], the name of [`Schema::name`], the claims rules
/// match from the top level.
pub(super) fn identify_top_level(schema: &Schema, claims: &ClaimSet) -> Result<Identified, TokenError> {
    let id = claims
        .get(schema.subject)
        .and_then(claim_value)
        .ok_or(TokenError::SubjectMissing(schema.subject))?;
    Ok(Identified {
        subject: format!("{}:{id}", schema.subject),
        name: required(claims, schema.name)?.to_owned(),
        claims: top_level(claims, schema.claims),
    })
}

/// Who a workload token names, and the claims rules may match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Its issuer's kind.
    pub kind: &'static str,
    /// The claims of the kind's [`Schema`] the token carries, as text
    /// (`true`, `42` for booleans and numbers), each at most
    /// [`MAX_CLAIM_LEN`] bytes.
    pub claims: BTreeMap<String, String>,
    /// How many certificates its token may mint (its issuer's
    /// `certificates_per_token`).
    pub token_uses: u32,
}

/// Longest claim value kept for rules; a longer one matches no rule.
pub const MAX_CLAIM_LEN: usize = 1024;

/// Longest certificate CN (RFC 5280's `ub-common-name`).
pub const MAX_CN: usize = 64;

/// A claim as a rule compares it: strings as they are, booleans and
/// numbers as JSON writes them (GitLab sends `ref_protected: "true"`,
/// others may send `true`).
fn claim_value(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    (!text.is_empty() && text.len() <= MAX_CLAIM_LEN).then_some(text)
}

/// The top-level claims of `names` that `claims` carries, as text.
pub(super) fn top_level(claims: &ClaimSet, names: &[&str]) -> BTreeMap<String, String> {
    names
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), claim_value(claims.get(*name)?)?)))
        .collect()
}

/// The certificate CN of a workload: `KIND:SUBJECT`, or when that is
/// longer than 64 bytes, as much of it as fits before `~` and 16 hex
/// digits of its SHA-256, so that two long names never share a CN.
pub fn common_name(kind: &str, subject: &str) -> String {
    let full = format!("{kind}:{subject}");
    if full.len() <= MAX_CN {
        return full;
    }
    let digest = hex::encode(ring::digest::digest(&ring::digest::SHA256, full.as_bytes()));
    let mut keep = MAX_CN - 17;
    while !full.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{}~{}", &full[..keep], &digest[..16])
}

/// A workload's principal: its subject (qualified by its issuer's name),
/// its CN, its token id, no groups.
pub(super) fn principal(kind: &WorkloadKind, claims: &ClaimSet, identified: Identified) -> Principal {
    let kind_name = kind.schema.kind;
    let offered = identified.claims;
    Principal {
        tenant: None,
        subject: format!("{}:{}", kind.issuer_name, identified.subject),
        username: common_name(kind_name, &identified.name),
        token_id: string_claim(claims, "jti").map(str::to_owned),
        groups: Vec::new(),
        app_roles: Vec::new(),
        application: None,
        workload: Some(Workload {
            kind: kind_name,
            claims: offered,
            token_uses: kind.token_uses,
        }),
    }
}

/// Who a refused workload token claims to be, for its record: its name
/// (nobody vouched for it, so it is no subject a deny entry could match).
pub(super) fn claimed(claims: &ClaimSet, name_claim: &str) -> ClaimedIdentity {
    ClaimedIdentity {
        issuer: claim_text(claims, "iss"),
        tenant: None,
        subject: None,
        username: claim_text(claims, name_claim),
        token_id: claimed_token_id(claims),
    }
}

/// The `iss` values a workload issuer accepts: its `issuer` and
/// `additional_issuers`; what belongs to people's issuers is refused.
pub(super) fn accepted_issuers(config: &IssuerConfig) -> Result<Vec<String>, String> {
    if !config.allowed_tenants.is_empty() || config.entra_graph.is_some() {
        return Err("`allowed_tenants` and `entra_graph` are for Entra issuers".into());
    }
    if config.username_claim.is_some() {
        return Err(
            "`username_claim` is for people's issuers: a workload's certificate is named after it".into(),
        );
    }
    let mut issuers = vec![config.issuer.clone()];
    issuers.extend(config.additional_issuers.iter().cloned());
    if let Some(template) = issuers.iter().find(|iss| is_template(iss)) {
        return Err(format!(
            "`{template}` is a template; a workload issuer is one URL"
        ));
    }
    Ok(issuers)
}

/// What a workload kind reads of a verified token.
#[derive(Debug)]
pub struct Identified {
    /// `CLAIM:VALUE` (`repository_id:74`), or the service account; the
    /// issuer's name is put before it.
    pub subject: String,
    /// What the CN names.
    pub name: String,
    /// The claims rules match.
    pub claims: BTreeMap<String, String>,
}

/// A workload kind: its name, the issuers it accepts, how it finds the
/// subject and the claims rules match.
#[derive(Debug)]
pub(super) struct WorkloadKind {
    schema: &'static Schema,
    /// The configured issuer's name, before each subject.
    issuer_name: String,
    issuers: Vec<String>,
    /// How many certificates one token may mint.
    token_uses: u32,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind)
    }
}

/// The kind `config` names, ready to read its tokens.
fn build(config: &IssuerConfig) -> Result<Box<dyn Kind>, String> {
    let schema = super::workload_schema(&config.kind)
        .ok_or_else(|| format!("`{}` is not a workload kind", config.kind))?;
    Ok(Box::new(WorkloadKind {
        schema,
        issuer_name: config.name.clone(),
        issuers: accepted_issuers(config)?,
        token_uses: config.token_uses(),
    }))
}

impl Kind for WorkloadKind {
    fn accepts(&self, iss: &str, _claims: &ClaimSet) -> bool {
        self.issuers.iter().any(|accepted| accepted == iss)
    }

    fn identify(&self, claims: &ClaimSet) -> Result<Principal, TokenError> {
        let identified = (self.schema.identify)(self.schema, claims)?;
        Ok(principal(self, claims, identified))
    }

    fn claimed(&self, claims: &ClaimSet) -> ClaimedIdentity {
        claimed(claims, self.schema.name)
    }

    fn workload_schema(&self) -> Option<&'static Schema> {
        Some(self.schema)
    }
}

impl Schema {
    /// Whether `claims` (not verified) carry a claim only this kind's
    /// tokens carry.
    pub fn marks(&self, claims: &ClaimSet) -> bool {
        self.markers.iter().any(|marker| claims.contains_key(*marker))
    }
}

/// The registration of a workload kind: one `build` for every kind, which
/// finds the kind's schema by name.
pub(super) const fn registration(schema: &'static Schema) -> Registration {
    Registration {
        name: schema.kind,
        accepted_issuers,
        build,
    }
}

/// A required string claim, or a refusal naming it.
pub(super) fn required<'a>(claims: &'a ClaimSet, name: &'static str) -> Result<&'a str, TokenError> {
    string_claim(claims, name).ok_or(TokenError::SubjectMissing(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_workload_name_is_shortened_with_a_hash_within_64_bytes() {
        assert_eq!(
            common_name("github-actions", "org/infra"),
            "github-actions:org/infra"
        );
        let long = "org/".to_owned() + &"é".repeat(40);
        let one = common_name("github-actions", &long);
        let other = common_name("github-actions", &(long.clone() + "x"));
        assert!(one.len() <= MAX_CN && other.len() <= MAX_CN, "{one}");
        assert_ne!(one, other, "the hash tells long names apart");
        assert!(one.starts_with("github-actions:org/é") && one.contains('~'));
        assert_eq!(common_name("github-actions", &long), one, "stable");
        let exactly = "k".repeat(MAX_CN - "kubernetes:".len());
        assert_eq!(common_name("kubernetes", &exactly).len(), MAX_CN);
        assert!(!common_name("kubernetes", &exactly).contains('~'));
    }

    #[test]
    fn claims_are_text_bounded_and_only_those_offered() {
        let claims: ClaimSet = serde_json::from_value(serde_json::json!({
            "ref": "refs/heads/main", "ref_protected": true, "project_id": 42,
            "environment": "", "other": "x", "ref_type": "b".repeat(MAX_CLAIM_LEN + 1),
            "namespace_path": ["not", "text"]
        }))
        .unwrap();
        let offered = top_level(
            &claims,
            &[
                "ref",
                "ref_protected",
                "project_id",
                "environment",
                "ref_type",
                "namespace_path",
            ],
        );
        assert_eq!(
            offered.into_iter().collect::<Vec<_>>(),
            [
                ("project_id".to_owned(), "42".to_owned()),
                ("ref".into(), "refs/heads/main".into()),
                ("ref_protected".into(), "true".into()),
            ]
        );
    }
}
