//! Microsoft Entra ID as an issuer.
//!
//! - `iss`: the configured issuer, which may be the multi-tenant template
//!   `https://login.microsoftonline.com/{tenantid}/v2.0` (filled in with the
//!   token's own `tid`, and only for an allowed tenant); the additional
//!   issuers; and for the public cloud the v1 form
//!   `https://sts.windows.net/<tenant>/` of each allowed tenant, which v1
//!   access tokens carry.
//! - `tid` is required and must be in `allowed_tenants`; the consumer tenant
//!   (personal Microsoft accounts) is no exception.
//! - The person is (`tid`, `oid`); the token id is `uti`.
//! - An application's own token (client credentials: no `scp`, and
//!   `idtyp: app`, or without `idtyp` an `oid` equal to `sub`, Microsoft's
//!   documented test) is about its service principal: `oid` is the service
//!   principal's object id, its name its client id (`azp`, v1 `appid`).
//! - Groups come from `groups`, or, when the token says they did not fit
//!   (`_claim_names.groups`, `hasgroups`: overage), from Microsoft Graph with
//!   the server's own credentials (`identity::graph`); the URL inside the
//!   token is never fetched. App roles come from `roles`.

use std::time::Duration;

use talos_sso_api::issuer::{for_tenant, is_template, matches};

use super::{
    BoxFuture, Kind, Principal, Registration, claim_text, claimed_token_id, claimed_username, principal,
};
use crate::config::{GraphConfig, IssuerConfig};
use crate::identity::auth_error::AuthError;
use crate::identity::graph::{GraphClient, GraphSettings};
use crate::identity::token::{ClaimSet, TokenError, string_claim};
use crate::identity::{ClaimedIdentity, VerifiedIdentity};
use crate::secret_file::read_secret;

pub(super) const KIND: Registration = Registration {
    name: "entra",
    accepted_issuers,
    build,
};

/// Entra's public cloud, whose v1 tokens name [`V1_ISSUER`].
const PUBLIC_CLOUD: &str = "https://login.microsoftonline.com/";

/// The issuer of the public cloud's v1 tokens, per tenant.
const V1_ISSUER: &str = "https://sts.windows.net/{tenantid}/";

/// How long a person's groups from Graph are reused.
const GRAPH_CACHE_TTL: Duration = Duration::from_secs(60);

/// Timeout of each request to Graph.
const GRAPH_HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `iss` forms `config` accepts, templates kept as templates.
fn issuer_forms(config: &IssuerConfig) -> Vec<String> {
    let mut forms = vec![config.issuer.clone()];
    forms.extend(config.additional_issuers.iter().cloned());
    if config.issuer.starts_with(PUBLIC_CLOUD) {
        forms.extend(config.allowed_tenants.iter().map(|t| for_tenant(V1_ISSUER, t)));
    }
    let mut unique = Vec::with_capacity(forms.len());
    for form in forms {
        if !unique.contains(&form) {
            unique.push(form);
        }
    }
    unique
}

fn accepted_issuers(config: &IssuerConfig) -> Result<Vec<String>, String> {
    if config.allowed_tenants.is_empty() {
        return Err("an Entra issuer needs `allowed_tenants`, the tenants whose tokens are accepted".into());
    }
    Ok(issuer_forms(config)
        .into_iter()
        .flat_map(|form| {
            if is_template(&form) {
                config
                    .allowed_tenants
                    .iter()
                    .map(|t| for_tenant(&form, t))
                    .collect()
            } else {
                vec![form]
            }
        })
        .collect())
}

fn build(config: &IssuerConfig) -> Result<Box<dyn Kind>, String> {
    let graph_key = format!("{}.entra_graph", config.section());
    let graph = config
        .entra_graph
        .as_ref()
        .map(|graph| graph_client(graph, config.ca_file.as_deref()).map_err(|e| format!("{graph_key}: {e}")))
        .transpose()?;
    Ok(Box::new(Entra {
        issuers: issuer_forms(config),
        allowed_tenants: config.allowed_tenants.clone(),
        username_claim: config.username_claim.clone(),
        graph,
        graph_key,
    }))
}

fn graph_client(config: &GraphConfig, ca_file: Option<&std::path::Path>) -> Result<GraphClient, String> {
    let extra_roots = ca_file
        .map(super::super::provider::extra_roots)
        .transpose()
        .map_err(|e| format!("identity.ca_file: {e}"))?
        .unwrap_or_default();
    GraphClient::new(GraphSettings {
        tenant_id: config.tenant_id.clone(),
        client_id: config.client_id.clone(),
        client_secret: read_secret(&config.client_secret_file).map_err(|e| e.to_string())?,
        authority: config.authority.clone(),
        graph_url: config.graph_url.clone(),
        cache_ttl: GRAPH_CACHE_TTL,
        http_timeout: GRAPH_HTTP_TIMEOUT,
        extra_roots,
    })
    .map_err(|e| e.to_string())
}

/// Whether the token says its groups did not fit and must come from Graph.
pub(super) fn groups_overage(claims: &ClaimSet) -> bool {
    claims.get("_claim_names").and_then(|c| c.get("groups")).is_some()
        || claims
            .get("hasgroups")
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
}

/// The client id of an application's own token (client credentials), or
/// `None` for a person's token. A delegated token always has `scp`; an
/// app-only one never does, and carries `idtyp: app` when the API asks for
/// that optional claim, else an `oid` equal to its `sub` (for people `sub`
/// is pairwise and never the `oid`). Without a client id it is no
/// application's token.
fn application_client(claims: &ClaimSet) -> Option<&str> {
    if claims.contains_key("scp") {
        return None;
    }
    let app_only = match claims.get("idtyp") {
        Some(idtyp) => idtyp.as_str() == Some("app"),
        None => string_claim(claims, "oid").is_some_and(|oid| string_claim(claims, "sub") == Some(oid)),
    };
    if !app_only {
        return None;
    }
    string_claim(claims, "azp").or_else(|| string_claim(claims, "appid"))
}

#[derive(Debug)]
struct Entra {
    /// Accepted `iss` forms; `{tenantid}` stands for an allowed `tid`.
    issuers: Vec<String>,
    allowed_tenants: Vec<String>,
    username_claim: Option<String>,
    /// For group overage; without it such people are refused.
    graph: Option<GraphClient>,
    /// Where the Graph settings are in the configuration, for messages.
    graph_key: String,
}

impl Entra {
    fn tenant_allowed(&self, tid: &str) -> bool {
        self.allowed_tenants.iter().any(|t| t.eq_ignore_ascii_case(tid))
    }
}

impl Kind for Entra {
    fn accepts(&self, iss: &str, claims: &ClaimSet) -> bool {
        // A template stands only for allowed tenants.
        let tenant = string_claim(claims, "tid").filter(|tid| self.tenant_allowed(tid));
        self.issuers.iter().any(|accepted| matches(accepted, iss, tenant))
    }

    fn identify(&self, claims: &ClaimSet) -> Result<Principal, TokenError> {
        let tid = string_claim(claims, "tid").ok_or(TokenError::TenantMissing)?;
        if !self.tenant_allowed(tid) {
            return Err(TokenError::TenantNotAllowed(tid.chars().take(64).collect()));
        }
        let subject = string_claim(claims, "oid").ok_or(TokenError::SubjectMissing("oid"))?;
        let application = application_client(claims);
        principal(
            claims,
            Some(tid),
            subject,
            self.username_claim.as_deref(),
            application,
        )
    }

    fn application_token(&self, claims: &ClaimSet) -> bool {
        application_client(claims).is_some()
    }

    fn claimed(&self, claims: &ClaimSet) -> ClaimedIdentity {
        ClaimedIdentity {
            issuer: claim_text(claims, "iss"),
            tenant: claim_text(claims, "tid"),
            subject: claim_text(claims, "oid").or_else(|| claim_text(claims, "sub")),
            username: claimed_username(claims),
            token_id: claimed_token_id(claims),
        }
    }

    fn complete<'a>(
        &'a self,
        mut verified: VerifiedIdentity,
    ) -> BoxFuture<'a, Result<VerifiedIdentity, AuthError>> {
        Box::pin(async move {
            if !groups_overage(&verified.claims) {
                return Ok(verified);
            }
            let Some(graph) = &self.graph else {
                return Err(AuthError::OverageUnresolved {
                    reason: "Graph is not configured".into(),
                    identity: Box::new(verified),
                });
            };
            match graph.member_groups(&verified.subject).await {
                Ok(groups) => {
                    verified.groups = groups;
                    Ok(verified)
                }
                Err(error) => Err(AuthError::OverageUnresolved {
                    reason: error.to_string(),
                    identity: Box::new(verified),
                }),
            }
        })
    }

    fn graph_stats(&self) -> Option<std::sync::Arc<crate::identity::graph::GraphStats>> {
        self.graph.as_ref().map(|graph| graph.stats().clone())
    }

    fn check(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let Some(graph) = &self.graph else {
                return Ok(Vec::new());
            };
            graph
                .check_credentials()
                .await
                .map_err(|e| format!("Microsoft Graph ({}): {e}", self.graph_key))?;
            Ok(vec![
                "Microsoft Graph: the server's credentials are accepted".to_owned(),
            ])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::issuer::IssuerRules;
    use crate::identity::testing::{
        NOW, TENANT, at, code, entra_claims, entra_config, patched, rules, sign, signers,
    };
    use crate::identity::token::unverified_claims;
    use serde_json::{Value, json};

    /// Entra's tenant for personal Microsoft accounts.
    const CONSUMER_TENANT: &str = "9188040d-6c67-4c5b-b112-36a304b66dad";

    #[test]
    fn a_good_entra_token_yields_its_identity() {
        let s = signers();
        for (alg, kid) in [("RS256", "rsa"), ("ES256", "ec"), ("EdDSA", "ed")] {
            let token = sign(&s, alg, kid, &entra_claims());
            let verified = rules(&entra_config()).verify(&token, &s.keys, at(NOW)).unwrap();
            assert_eq!(verified.subject, "00000000-0000-0000-0000-0000000000a1");
            assert_eq!(verified.tenant.as_deref(), Some(TENANT));
            assert_eq!(verified.username, "alice@example.com");
            assert_eq!(verified.groups, ["g1", "g2"]);
            assert_eq!(verified.app_roles, ["Talos.Reader"]);
            assert_eq!(verified.token_id.as_deref(), Some("uti-1"));
            assert!(!groups_overage(&verified.claims));
        }
    }

    #[test]
    fn issuers_and_tenants_each_get_their_code() {
        let s = signers();
        let r = rules(&entra_config());
        let with = |patch: Value| sign(&s, "RS256", "rsa", &patched(entra_claims(), patch));
        // Issuer: exact, v1 and v2 forms, template only for an allowed tenant.
        assert_eq!(code(&s, &with(json!({})), &r, NOW), "ok");
        assert_eq!(
            code(
                &s,
                &with(json!({"iss": format!("https://sts.windows.net/{TENANT}/"), "ver": "1.0"})),
                &r,
                NOW
            ),
            "ok"
        );
        for iss in [
            format!("https://sts.windows.net/{TENANT}"),
            format!("https://login.microsoftonline.com/{TENANT}/v2.0/"),
            format!("https://login.microsoftonline.com/{TENANT}/"),
        ] {
            assert_eq!(
                code(&s, &with(json!({ "iss": iss })), &r, NOW),
                "token_issuer_invalid",
                "{iss}"
            );
        }
        let other_tenant = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{other_tenant}/v2.0"), "tid": other_tenant})
                ),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0"), "tid": other_tenant})
                ),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        // Tenant: missing (the v1 issuer needs no template), foreign, consumer.
        let v1 = format!("https://sts.windows.net/{TENANT}/");
        assert_eq!(
            code(&s, &with(json!({"iss": v1, "tid": null})), &r, NOW),
            "token_tenant_missing"
        );
        let mut single = entra_config();
        single.issuer = format!("https://login.microsoftonline.com/{TENANT}/v2.0");
        single.additional_issuers = vec![format!("https://login.microsoftonline.com/{other_tenant}/v2.0")];
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{other_tenant}/v2.0"), "tid": other_tenant})
                ),
                &rules(&single),
                NOW
            ),
            "token_tenant_not_allowed"
        );
        let mut consumer = entra_config();
        consumer.additional_issuers = vec![format!(
            "https://login.microsoftonline.com/{CONSUMER_TENANT}/v2.0"
        )];
        assert_eq!(
            code(
                &s,
                &with(
                    json!({"iss": format!("https://login.microsoftonline.com/{CONSUMER_TENANT}/v2.0"), "tid": CONSUMER_TENANT})
                ),
                &rules(&consumer),
                NOW
            ),
            "token_tenant_not_allowed"
        );
        assert_eq!(
            code(&s, &with(json!({"oid": null})), &r, NOW),
            "token_subject_missing"
        );
    }

    #[test]
    fn the_accepted_issuers_are_every_form_for_every_allowed_tenant() {
        let mut config = entra_config();
        config.issuer = format!("https://login.microsoftonline.com/{TENANT}/v2.0");
        assert_eq!(
            accepted_issuers(&config).unwrap(),
            [
                format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
                format!("https://sts.windows.net/{TENANT}/"),
            ]
        );
        let mut template = entra_config();
        template.allowed_tenants.push("t2".into());
        assert_eq!(
            accepted_issuers(&template).unwrap(),
            [
                format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
                "https://login.microsoftonline.com/t2/v2.0".to_owned(),
                format!("https://sts.windows.net/{TENANT}/"),
                "https://sts.windows.net/t2/".to_owned(),
            ]
        );
        // Only Entra's public cloud has the `sts.windows.net` form.
        let mut elsewhere = entra_config();
        elsewhere.issuer = "http://127.0.0.1:8400/{tenantid}/v2.0".into();
        assert_eq!(
            accepted_issuers(&elsewhere).unwrap(),
            [format!("http://127.0.0.1:8400/{TENANT}/v2.0")]
        );
        elsewhere.allowed_tenants.clear();
        assert!(
            accepted_issuers(&elsewhere)
                .unwrap_err()
                .contains("allowed_tenants")
        );
    }

    fn overage_claims() -> Value {
        let mut overage = entra_claims();
        overage.as_object_mut().unwrap().remove("groups");
        overage["_claim_names"] = json!({"groups": "src1"});
        overage["_claim_sources"] =
            json!({"src1": {"endpoint": "https://graph.windows.net/x/users/y/getMemberObjects"}});
        overage
    }

    #[tokio::test]
    async fn overage_is_detected_and_refused_without_graph() {
        let s = signers();
        let rules: IssuerRules = rules(&entra_config());
        let token = sign(&s, "RS256", "rsa", &overage_claims());
        let verified = rules.verify(&token, &s.keys, at(NOW)).unwrap();
        assert!(groups_overage(&verified.claims) && verified.groups.is_empty());
        let error = rules.complete(verified).await.unwrap_err();
        assert_eq!(error.code(), "groups_overage_unresolved");
        assert!(error.to_string().contains("Graph is not configured"), "{error}");
        let has_groups = patched(entra_claims(), json!({"groups": null, "hasgroups": true}));
        assert!(groups_overage(&has_groups.as_object().unwrap().clone()));
        // Without overage, the token's groups are the groups.
        let plain = rules
            .verify(&sign(&s, "RS256", "rsa", &entra_claims()), &s.keys, at(NOW))
            .unwrap();
        assert_eq!(rules.complete(plain).await.unwrap().groups, ["g1", "g2"]);
        let unverified = unverified_claims(&token).unwrap();
        assert_eq!(unverified["oid"], "00000000-0000-0000-0000-0000000000a1");
    }

    #[test]
    fn a_refused_token_is_recorded_as_what_it_claims_cleaned() {
        let claims = patched(
            entra_claims(),
            json!({"oid": "\u{0}oid", "preferred_username": null, "upn": "bob\u{1b}[2J", "uti": null, "jti": "j-1"}),
        );
        let claimed = rules(&entra_config()).claimed(claims.as_object().unwrap());
        assert_eq!(
            claimed,
            ClaimedIdentity {
                issuer: Some(format!("https://login.microsoftonline.com/{TENANT}/v2.0")),
                tenant: Some(TENANT.into()),
                subject: Some("\\u{0}oid".into()),
                username: Some("bob\\u{1b}[2J".into()),
                token_id: Some("j-1".into()),
            }
        );
    }

    /// A client-credentials token as Entra writes it for a service
    /// principal: no `scp`, no username claims, `oid` and `sub` the service
    /// principal's object id, `azp` its client id.
    fn app_claims() -> Value {
        json!({
            "aud": "11111111-1111-1111-1111-111111111111",
            "iss": format!("https://login.microsoftonline.com/{TENANT}/v2.0"),
            "iat": NOW - 300, "nbf": NOW - 300, "exp": NOW - 300 + 3900,
            "tid": TENANT, "oid": "5e000000-0000-4000-8000-0000000000a1",
            "sub": "5e000000-0000-4000-8000-0000000000a1", "azp": "siem-client-id", "azpacr": "1",
            "idtyp": "app", "roles": ["Talos.Auditor"], "uti": "uti-app", "ver": "2.0"
        })
    }

    #[test]
    fn an_application_token_is_told_from_a_persons_and_named_by_its_client_id() {
        let s = signers();
        let mut config = entra_config();
        config.clients = vec!["the-cli".into()];
        config.audiences = vec!["11111111-1111-1111-1111-111111111111".into()];
        config.username_claim = Some("preferred_username".into());
        let r = rules(&config);
        let with = |patch: Value| sign(&s, "RS256", "rsa", &patched(app_claims(), patch));
        // With `idtyp`, without it (oid = sub), and v1 (`appid`).
        for token in [
            with(json!({})),
            with(json!({"idtyp": null})),
            with(
                json!({"azp": null, "azpacr": null, "appid": "siem-client-id", "ver": "1.0",
                        "iss": format!("https://sts.windows.net/{TENANT}/")}),
            ),
        ] {
            let verified = r.verify(&token, &s.keys, at(NOW)).unwrap();
            assert_eq!(verified.application.as_deref(), Some("siem-client-id"));
            assert_eq!(verified.subject, "5e000000-0000-4000-8000-0000000000a1");
            assert_eq!(verified.username, "siem-client-id", "no username claim is needed");
            assert_eq!(verified.app_roles, ["Talos.Auditor"]);
        }
        // Anything with a person behind it keeps the CLI's client check.
        for (patch, why) in [
            (json!({"scp": "access"}), "delegated: scp"),
            (json!({"idtyp": "user"}), "idtyp user"),
            (json!({"idtyp": null, "sub": "pairwise"}), "oid is not sub"),
        ] {
            assert_eq!(code(&s, &with(patch), &r, NOW), "token_client_invalid", "{why}");
        }
        // The shared checks apply to applications exactly as to people.
        assert_eq!(
            code(&s, &with(json!({"aud": "api://another"})), &r, NOW),
            "token_audience_invalid"
        );
        assert_eq!(
            code(
                &s,
                &with(json!({"tid": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"})),
                &r,
                NOW
            ),
            "token_issuer_invalid"
        );
        assert_eq!(
            code(&s, &with(json!({})), &r, NOW - 300 + 3900 + 301),
            "token_expired"
        );
        let person = sign(
            &s,
            "RS256",
            "rsa",
            &patched(
                entra_claims(),
                json!({"aud": "11111111-1111-1111-1111-111111111111"}),
            ),
        );
        assert_eq!(r.verify(&person, &s.keys, at(NOW)).unwrap().application, None);
    }
}
