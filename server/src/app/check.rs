//! The checks of a configuration that need the domains' knowledge, run
//! wherever a configuration is taken: at start (`App::build`), by a reload,
//! and by the command line when it loads the file (given to the loader, so
//! that a mistake an environment override makes is blamed on it). The file's
//! own rules are `config`'s; each check here is the owning domain's.

use crate::config::{Config, ConfigError, LOGIN_ISSUER};

/// Refuse `config` when a domain would: the issuers (each kind's rules, no
/// `iss` accepted twice: `identity::issuer::validate`), and the app roles
/// of `auditors` and `admins` (`policy::check_app_roles`). A rule's app
/// roles are checked with the rest of the rule, when its cluster's policy
/// is built (`cluster::load_clusters`).
pub fn check(config: &Config) -> Result<(), ConfigError> {
    crate::identity::issuer::validate(&config.identity.issuers()).map_err(ConfigError::Invalid)?;
    // App roles count only in the tenant that assigned them: with several
    // allowed tenants, each app-role selector names its tenant.
    // `auditors` and `admins` are of the login issuer.
    let tenancy = config.identity.tenancy();
    for (section, list) in [("auditors", &config.auditors), ("admins", &config.admins)] {
        crate::policy::check_app_roles(&list.app_roles, &[LOGIN_ISSUER], &tenancy)
            .map_err(|e| ConfigError::Invalid(format!("{section}.app_roles: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::MINIMAL;

    /// `text` loaded and checked, as the command line and the start do.
    fn loaded(text: &str) -> Result<Config, ConfigError> {
        let config = Config::from_yaml(text)?;
        check(&config)?;
        Ok(config)
    }

    #[test]
    fn app_roles_name_their_tenant_when_several_are_allowed() {
        const HOME: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
        const PARTNER: &str = "0b0b0b0b-1111-4222-8333-444444444444";
        let two = MINIMAL
            .replace(
                &format!("login.microsoftonline.com/{HOME}/v2.0"),
                "login.microsoftonline.com/{tenantid}/v2.0",
            )
            .replace(
                &format!("allowed_tenants: [\"{HOME}\"]"),
                &format!("allowed_tenants: [\"{HOME}\", \"{PARTNER}\"]"),
            );
        let with = |base: &str, extra: &str| loaded(&format!("{base}{extra}"));
        let refused = |extra: &str| with(&two, extra).unwrap_err().to_string();
        // A rule's are checked with the rest of the rule, when its
        // cluster's policy is built (`cluster::load_clusters` says where).
        let rule_refused = |config: Config| {
            crate::policy::ClusterPolicy::new(config.clusters["prod"].policy(&config.identity))
                .unwrap_err()
                .to_string()
        };
        let error = refused("auditors: { app_roles: [Talos.Auditor] }\n");
        assert!(
            error.starts_with(
                "invalid configuration: auditors.app_roles: app role `Talos.Auditor` names no tenant, \
                 but issuer `login` allows several"
            ) && error.contains(&format!("`{HOME}/Talos.Auditor`")),
            "{error}"
        );
        assert!(
            refused("admins: { app_roles: [Talos.Admin] }\n")
                .starts_with("invalid configuration: admins.app_roles: ")
        );
        let error = rule_refused(
            with(
                &two,
                "      - { app_roles: [Talos.Reader], roles: [os:reader] }\n",
            )
            .unwrap(),
        );
        assert!(
            error.starts_with("rule 1: app role `Talos.Reader` names no tenant"),
            "{error}"
        );
        let error = rule_refused(
            with(
                &two,
                &format!("      - {{ app_roles: [\"{PARTNER}x/Talos.Reader\"], roles: [os:reader] }}\n"),
            )
            .unwrap(),
        );
        assert!(error.contains("which issuer `login` does not allow"), "{error}");
        // Pinned, it loads, and the rules are read against both tenants.
        let pinned = with(
            &two,
            &format!(
                "      - {{ app_roles: [\"{PARTNER}/Talos.Reader\"], roles: [os:reader] }}\n\
                 auditors: {{ app_roles: [\"{HOME}/Talos.Auditor\"], client_ids: [siem] }}\n\
                 admins: {{ app_roles: [\"{}/Talos.Admin\"] }}\n",
                HOME.to_uppercase()
            ),
        )
        .unwrap();
        let tenancy = pinned.identity.tenancy();
        let both = [HOME.to_owned(), PARTNER.to_owned()];
        assert_eq!(tenancy.tenants(LOGIN_ISSUER), Some(&both[..]));
        assert_eq!(pinned.clusters["prod"].policy(&pinned.identity).tenancy, tenancy);
        crate::policy::ClusterPolicy::new(pinned.clusters["prod"].policy(&pinned.identity)).unwrap();
        // One tenant: the role alone is that tenant's.
        let single = with(MINIMAL, "auditors: { app_roles: [Talos.Auditor] }\n").unwrap();
        assert_eq!(single.identity.tenancy().home(LOGIN_ISSUER), Some(HOME));
        // A trusted issuer without tenants: a tenant in its rule is refused.
        let ci = format!(
            "{}      - {{ app_roles: [\"{HOME}/Talos.Reader\"], roles: [os:reader], issuers: [ci] }}\n",
            MINIMAL.replace(
                "identity:\n",
                "identity:\n  trusted_issuers:\n    - { name: ci, kind: oidc, issuer: \"https://ci.example.com\", audiences: [talos-sso] }\n"
            )
        );
        let error = rule_refused(loaded(&ci).unwrap());
        assert!(
            error.starts_with("rule 1: app role")
                && error.contains("but issuer `ci` has no tenants: write the role alone, `Talos.Reader`"),
            "{error}"
        );
    }

    /// `MINIMAL` with one trusted issuer, written as `entry` (YAML flow map).
    fn with_trusted(entry: &str) -> String {
        MINIMAL.replace(
            "identity:\n",
            &format!("identity:\n  trusted_issuers:\n    - {entry}\n"),
        )
    }

    #[test]
    fn trusted_issuers_are_checked_at_load() {
        let config = loaded(&with_trusted(
            r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [talos-sso], username_claim: sub }"#,
        ))
        .unwrap();
        let issuers = config.identity.issuers();
        assert_eq!(
            issuers.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["login", "ci"]
        );
        assert_eq!(
            issuers[1].clients,
            Vec::<String>::new(),
            "only the login issuer checks azp/appid"
        );
        assert_eq!(issuers[1].section(), "identity.trusted_issuers[ci]");

        let cases = [
            (
                r#"{ name: login, kind: oidc, issuer: "https://ci.example.com", audiences: [a] }"#,
                "two issuers are named `login`",
            ),
            (
                r#"{ name: "c i", kind: oidc, issuer: "https://ci.example.com", audiences: [a] }"#,
                "identity.trusted_issuers[c i].name",
            ),
            (
                r#"{ name: ci, kind: saml, issuer: "https://ci.example.com", audiences: [a] }"#,
                "identity.trusted_issuers[ci].kind: unknown kind `saml`; the kinds are oidc, entra",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [] }"#,
                "identity.trusted_issuers[ci].audiences",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com" }"#,
                "audiences",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], client_id: x }"#,
                "client_id",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], allowed_tenants: [t] }"#,
                "`allowed_tenants` is for Entra issuers",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://login.microsoftonline.com/{tenantid}/v2.0", audiences: [a] }"#,
                "is an Entra multi-tenant issuer",
            ),
            (
                r#"{ name: ci, kind: entra, issuer: "https://login.microsoftonline.com/t2/v2.0", audiences: [a] }"#,
                "identity.trusted_issuers[ci]: an Entra issuer needs `allowed_tenants`",
            ),
            // The same issuer twice, whatever the kind or the form.
            (
                r#"{ name: ci, kind: oidc, issuer: "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0", audiences: [a] }"#,
                "identity and identity.trusted_issuers[ci] both accept tokens of issuer \
                 `https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0`",
            ),
            (
                r#"{ name: ci, kind: entra, issuer: "https://login.microsoftonline.com/{tenantid}/v2.0", audiences: [a], allowed_tenants: ["72F988BF-86F1-41AF-91AB-2D7CD011DB47"] }"#,
                "both accept tokens of issuer",
            ),
            (
                r#"{ name: ci, kind: oidc, issuer: "https://ci.example.com", audiences: [a], additional_issuers: ["https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/"] }"#,
                "both accept tokens of issuer `https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/`",
            ),
        ];
        for (entry, expected) in cases {
            let error = loaded(&with_trusted(entry)).unwrap_err().to_string();
            assert!(error.contains(expected), "expected {expected:?} in {error}");
        }
        // A template needs tenants, as it always did.
        let template = MINIMAL
            .replace(
                "  allowed_tenants: [\"72f988bf-86f1-41af-91ab-2d7cd011db47\"]\n",
                "",
            )
            .replace("72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0", "{tenantid}/v2.0");
        let error = loaded(&template).unwrap_err().to_string();
        assert!(error.contains("`allowed_tenants`"), "{error}");
    }

    /// The check given to the loader runs with and without the overrides,
    /// so that a domain's refusal an override causes is blamed on it, and a
    /// reload of that configuration runs it again.
    #[test]
    fn a_domain_refusal_an_override_causes_names_the_variable() {
        const HOME: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
        let two_tenants = MINIMAL
            .replace(
                &format!("login.microsoftonline.com/{HOME}/v2.0"),
                "login.microsoftonline.com/{tenantid}/v2.0",
            )
            .replace(
                &format!("allowed_tenants: [\"{HOME}\"]"),
                &format!("allowed_tenants: [\"{HOME}\", \"0b0b0b0b-1111-4222-8333-444444444444\"]"),
            );
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-check-test-{}",
            crate::random::random_hex(8).unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, &two_tenants).unwrap();
        let variable = "TALOS_SSO__AUDITORS__APP_ROLES";
        let env = || [(variable.to_owned(), "[Talos.Auditor]".to_owned())];
        let error = Config::load_with_env_checked(&path, env(), check).unwrap_err();
        assert!(
            matches!(&error, ConfigError::Environment { variables, .. } if variables == variable),
            "{error:?}"
        );
        assert!(error.to_string().contains("auditors.app_roles: "), "{error}");
        // Loaded without the check, it loads; the check refuses it then,
        // without knowing whom to blame.
        let unchecked = Config::load_with_env(&path, env()).unwrap();
        assert!(matches!(check(&unchecked), Err(ConfigError::Invalid(_))));
        // A reload of a checked configuration checks again: the file's own
        // mistake is the file's.
        let checked = Config::load_with_env_checked(&path, [], check).unwrap();
        std::fs::write(
            &path,
            format!("{two_tenants}auditors: {{ app_roles: [Talos.Auditor] }}\n"),
        )
        .unwrap();
        let error = checked.source.unwrap().load().unwrap_err();
        assert!(
            matches!(&error, ConfigError::Invalid(reason) if reason.starts_with("auditors.app_roles: ")),
            "{error:?}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn workload_issuers_and_rules_are_kept_apart_from_peoples() {
        const LOGIN: &str = "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0";
        let with_issuer = |issuer: &str| {
            MINIMAL.replace(
                "  allowed_tenants:",
                &format!("  trusted_issuers:\n    - {issuer}\n  allowed_tenants:"),
            )
        };
        let refused = |text: String| loaded(&text).unwrap_err().to_string();
        // GitLab signs people's and jobs' tokens with one `iss`: allowed
        // only when the audiences tell them apart.
        let gitlab = |audience: &str| {
            with_issuer(&format!(
                "{{ name: gitlab, kind: gitlab-ci, issuer: \"{LOGIN}\", jwks_file: /j.json, audiences: [\"{audience}\"] }}"
            ))
        };
        let error = refused(gitlab("11111111-2222-3333-4444-555555555555"));
        assert!(
            error.contains("both accept tokens of issuer") && error.contains("give each its own audiences"),
            "{error}"
        );
        loaded(&gitlab("talos-sso-ci")).unwrap();
        // Two workload issuers of one `iss` are one issuer twice.
        let twice = with_issuer(
            "{ name: a, kind: kubernetes, issuer: \"https://k8s\", audiences: [x] }\n    \
             - { name: b, kind: kubernetes, issuer: \"https://k8s\", audiences: [y] }",
        );
        assert!(refused(twice).contains("configure each issuer once"));
        // People's rules never name a workload issuer; workload rules name
        // nothing else; examples too.
        let k8s = with_issuer(
            "{ name: k8s, kind: kubernetes, issuer: \"https://k8s\", jwks_file: /j.json, audiences: [x] }",
        );
        let people = k8s.replace(
            "roles: [os:admin] }",
            "roles: [os:admin], issuers: [login, k8s] }",
        );
        assert!(refused(people).contains("rules[0] names workload issuer `k8s`"));
        let workload = |issuer: &str| {
            format!(
                "{k8s}    workloads:\n      - {{ name: w, issuer: {issuer}, claims: {{ namespace: b }}, roles: [os:reader] }}\n"
            )
        };
        loaded(&workload("k8s")).unwrap();
        assert!(
            refused(workload("login"))
                .contains("workloads[0].issuer: `login` is not a workload issuer; workload issuers: k8s")
        );
        let example = |issuer: &str| {
            format!(
                "{k8s}policy_examples:\n  - {{ description: d, cluster: prod, issuer: {issuer}, expect_roles: [] }}\n"
            )
        };
        assert!(refused(example("login")).contains("names `login`, which is not a workload issuer"));
        // Key files, caps and lifetimes.
        let oidc_file =
            with_issuer("{ name: o, kind: oidc, issuer: \"https://o\", jwks_file: /j.json, audiences: [x] }");
        assert!(refused(oidc_file).contains("are for workload issuers"));
        let cap = with_issuer(
            "{ name: k, kind: kubernetes, issuer: \"https://k\", audiences: [x], certificates_per_token: 101 }",
        );
        assert!(refused(cap).contains("certificates_per_token: from 1 to 100"));
        let long = workload("k8s").replace("roles: [os:reader] }", "roles: [os:reader], ttl: 16m }");
        assert!(refused(long).contains("ttl must be above zero and at most the cluster's max_ttl (900s)"));
        let named = with_issuer(
            "{ name: k, kind: kubernetes, issuer: \"https://k\", audiences: [x], username_claim: sub }",
        );
        assert!(refused(named).contains("`username_claim` is for people's issuers"));
    }
}
