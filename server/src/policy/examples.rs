//! Policy examples from the configuration (`policy_examples`), checked at
//! start-up against the rules they name.

use super::decision::Applicant;
use super::rules::ClusterPolicy;
use crate::config::PolicyExample;

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
        let claims = Applicant {
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
