//! Issuer templates. Entra ID's multi-tenant issuer is not one URL but a
//! template, `https://login.microsoftonline.com/{tenantid}/v2.0`: each
//! token names its tenant (`tid`) and its `iss` is the template with that
//! tenant filled in. `/v1/info` serves the template as configured; server
//! and CLI read it with these functions.

/// What stands for the token's tenant in a templated issuer.
pub const TENANT_PLACEHOLDER: &str = "{tenantid}";

/// Where a templated issuer's discovery document lives: under Entra's
/// `organizations` pseudo-tenant.
const DISCOVERY_TENANT: &str = "organizations";

/// Whether `issuer` is a template rather than one issuer.
pub fn is_template(issuer: &str) -> bool {
    issuer.contains(TENANT_PLACEHOLDER)
}

/// The issuer of tokens from `tenant`.
pub fn for_tenant(issuer: &str, tenant: &str) -> String {
    issuer.replace(TENANT_PLACEHOLDER, tenant)
}

/// Whether a token's `iss` is `accepted`: equal to it, or for a template,
/// equal to it with the token's own tenant filled in (no tenant, no match).
pub fn matches(accepted: &str, iss: &str, tenant: Option<&str>) -> bool {
    if is_template(accepted) {
        tenant.is_some_and(|tid| for_tenant(accepted, tid) == iss)
    } else {
        accepted == iss
    }
}

/// Whether `iss` is `accepted`, or for a template, the template with some
/// tenant filled in (one path segment): what can be checked of an issuer
/// named where no token says which tenant it is (RFC 9207's `iss` in an
/// authorization response).
pub fn matches_any_tenant(accepted: &str, iss: &str) -> bool {
    match accepted.split_once(TENANT_PLACEHOLDER) {
        Some((before, after)) => iss
            .strip_prefix(before)
            .and_then(|rest| rest.strip_suffix(after))
            .is_some_and(|tenant| !tenant.is_empty() && !tenant.contains(['/', '?', '#', '{', '}'])),
        None => accepted == iss,
    }
}

/// The discovery document URL of `issuer` (OpenID Connect Discovery 1.0,
/// section 4), a template read as its `organizations` form.
pub fn discovery_url(issuer: &str) -> String {
    format!(
        "{}/.well-known/openid-configuration",
        for_tenant(issuer, DISCOVERY_TENANT).trim_end_matches('/')
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = "https://login.microsoftonline.com/{tenantid}/v2.0";

    #[test]
    fn a_template_matches_only_its_own_tenant() {
        let iss = "https://login.microsoftonline.com/t1/v2.0";
        assert!(matches(TEMPLATE, iss, Some("t1")));
        assert!(!matches(TEMPLATE, iss, Some("t2")), "another tenant's token");
        assert!(!matches(TEMPLATE, iss, None), "no tenant, no match");
        assert!(matches("https://idp.example", "https://idp.example", None));
        assert!(!matches("https://idp.example", "https://idp.example/", None));
    }

    #[test]
    fn any_tenant_fills_a_template_with_one_path_segment() {
        assert!(matches_any_tenant(
            TEMPLATE,
            "https://login.microsoftonline.com/t1/v2.0"
        ));
        for other in [
            "https://login.microsoftonline.com//v2.0",
            "https://login.microsoftonline.com/t1/x/v2.0",
            "https://login.microsoftonline.com/t1?/v2.0",
            "https://login.microsoftonline.com/t1/v2.0/",
            "https://evil.example/t1/v2.0",
            "https://login.microsoftonline.com.evil.example/t1/v2.0",
            TEMPLATE,
        ] {
            assert!(!matches_any_tenant(TEMPLATE, other), "{other}");
        }
        assert!(matches_any_tenant("https://idp.example", "https://idp.example"));
        assert!(!matches_any_tenant("https://idp.example", "https://idp.example/"));
    }

    #[test]
    fn discovery_of_a_template_is_under_organizations() {
        assert_eq!(
            discovery_url(TEMPLATE),
            "https://login.microsoftonline.com/organizations/v2.0/.well-known/openid-configuration"
        );
        assert_eq!(
            discovery_url("https://idp.example/realms/corp/"),
            "https://idp.example/realms/corp/.well-known/openid-configuration"
        );
        assert!(is_template(TEMPLATE) && !is_template("https://idp.example"));
    }
}
