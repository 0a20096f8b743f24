//! Policy examples from the configuration (`policy_examples`), checked at
//! start-up against the rules they name.

use super::decision::Applicant;
use super::rules::ClusterPolicy;
use crate::config::PolicyExample;
use crate::identity::issuer::workload::{Workload, schema};

impl ClusterPolicy {
    /// Check one example; the error says what was expected and what happened.
    pub fn check_example(&self, example: &PolicyExample) -> Result<(), String> {
        if let Some(issuer) = &example.issuer {
            return self.check_workload_example(issuer, example);
        }
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
        let claims = Applicant {
            issuer_name: login.into(),
            tenant,
            subject: example.subject.clone(),
            username: example.username.clone(),
            groups: example.groups.clone(),
            app_roles: example.app_roles.clone(),
            raw: example.claims.clone(),
            application: example.application,
            workload: false,
        };
        let got = self.decide(&claims, &example.request).map(|d| d.granted);
        let got = got.map_err(|denial| (denial.code(), denial.to_string()));
        compare(example, got)
    }

    /// An example of a workload token of `issuer`: its `claims` (the names
    /// workload rules use) judged by the workload rules.
    fn check_workload_example(&self, issuer: &str, example: &PolicyExample) -> Result<(), String> {
        let kind = self
            .config
            .workload_kinds
            .get(issuer)
            .and_then(|kind| schema(kind))
            .ok_or_else(|| {
                format!(
                    "policy example `{}`: `{issuer}` is not a workload issuer",
                    example.description
                )
            })?;
        let claims = example
            .claims
            .iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(s) => Ok((name.clone(), s.clone())),
                serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {
                    Ok((name.clone(), value.to_string()))
                }
                _ => Err(format!(
                    "policy example `{}`: claim `{name}` is not text, a number or a boolean",
                    example.description
                )),
            })
            .collect::<Result<_, _>>()?;
        let workload = Workload {
            kind: kind.kind,
            claims,
            token_uses: 1,
        };
        let got = self
            .workloads
            .decide(issuer, &workload, &example.request)
            .map(|grant| grant.granted)
            .map_err(|denial| (denial.error_code().code(), denial.to_string()));
        compare(example, got)
    }
}

/// Whether `example` expected `got` (the roles granted, or the denial's
/// code and text); the error says what was expected and what happened.
fn compare(example: &PolicyExample, got: Result<Vec<String>, (&'static str, String)>) -> Result<(), String> {
    {
        let mut expected_roles = example.expect_roles.clone();
        if let Some(roles) = expected_roles.as_mut() {
            roles.sort();
        }
        let ok = match (&expected_roles, &example.expect_denied, &got) {
            (Some(roles), None, Ok(granted)) => roles == granted,
            (None, Some(code), Err((denied, _))) => code == denied,
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
            Ok(granted) => format!("roles [{}]", granted.join(", ")),
            Err((code, text)) => format!("denial `{code}` ({text})"),
        };
        Err(format!(
            "policy example `{}` expected {expected} but got {actual}",
            example.description
        ))
    }
}
