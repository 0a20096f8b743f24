//! App-role selectors and the tenants they count in, end to end through
//! the policy.

use super::*;

const TENANT_A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const TENANT_B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";

/// The login issuer allows tenants A and B; `partner` (Entra) allows
/// C; `ci` has no tenants.
fn two_tenants() -> Tenancy {
    Tenancy::new([
        (
            crate::config::LOGIN_ISSUER.to_owned(),
            strings(&[TENANT_A, TENANT_B]),
        ),
        (
            "partner".to_owned(),
            strings(&["cccccccc-0000-4000-8000-00000000000c"]),
        ),
        ("ci".to_owned(), vec![]),
    ])
}

#[test]
fn app_roles_count_only_in_the_tenant_that_assigned_them() {
    let pinned_a = format!("{TENANT_A}/Talos.Admin");
    let pinned_b = format!("{}/Talos.Reader", TENANT_B.to_uppercase());
    let pinned_slash = format!("{TENANT_A}/Ops/Backup");
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[], &[&pinned_a], &["os:admin"]),
            rule(&[], &[&pinned_b], &["os:reader"]),
            rule(&[], &[&pinned_slash], &["os:etcd:backup"]),
        ],
        tenancy: two_tenants(),
        ..Default::default()
    })
    .unwrap();
    let granted = |app_roles: &[&str], tid: &str| {
        policy
            .decide(&person("p", &[], app_roles, tid), &[])
            .map(|d| d.granted)
            .map_err(|d| d.code())
    };
    assert_eq!(granted(&["Talos.Admin"], TENANT_A), Ok(strings(&["os:admin"])));
    // The same role value, assigned by tenant B's administrators.
    assert_eq!(granted(&["Talos.Admin"], TENANT_B), Err("no_matching_rule"));
    // Tenants compare case-insensitively, role values exactly.
    assert_eq!(granted(&["Talos.Reader"], TENANT_B), Ok(strings(&["os:reader"])));
    assert_eq!(granted(&["Talos.Reader"], TENANT_A), Err("no_matching_rule"));
    assert_eq!(granted(&["talos.admin"], TENANT_A), Err("no_matching_rule"));
    // The tenant ends at the first `/`: the role may have one of its own.
    assert_eq!(
        granted(&["Ops/Backup"], TENANT_A),
        Ok(strings(&["os:etcd:backup"]))
    );
    assert_eq!(granted(&[&pinned_a], TENANT_A), Err("no_matching_rule"));
    // What would help names the tenant.
    let Err(Denial::NoMatchingRule { would_grant }) = policy.decide(&person("p", &[], &[], TENANT_A), &[])
    else {
        panic!("denied");
    };
    assert!(
        would_grant.contains(&format!("app role Talos.Admin in tenant {TENANT_A}"))
            && would_grant.contains(&format!(
                "app role Talos.Reader in tenant {}",
                TENANT_B.to_uppercase()
            )),
        "{would_grant:?}"
    );
}

#[test]
fn an_app_role_alone_stands_for_the_only_tenant_or_for_none() {
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[], &["Talos.Reader"], &["os:reader"]),
            Rule {
                issuers: strings(&["ci"]),
                ..rule(&[], &["deploy/prod"], &["os:operator"])
            },
        ],
        tenancy: home_tenant(),
        ..Default::default()
    })
    .unwrap();
    let decide = |claims: &Applicant| {
        policy
            .decide(claims, &[])
            .map(|d| d.granted)
            .map_err(|d| d.code())
    };
    assert_eq!(
        decide(&person("p", &[], &["Talos.Reader"], "T")),
        Ok(strings(&["os:reader"]))
    );
    // Another tenant's token (which the issuer would refuse) gets nothing.
    assert_eq!(
        decide(&person("p", &[], &["Talos.Reader"], "u")),
        Err("no_matching_rule")
    );
    // An issuer without tenants: the selector is the role as written.
    let from_ci = |roles: &[&str]| Applicant {
        issuer_name: "ci".into(),
        tenant: None,
        ..person("p", &[], roles, "t")
    };
    assert_eq!(decide(&from_ci(&["deploy/prod"])), Ok(strings(&["os:operator"])));
    assert_eq!(decide(&from_ci(&["prod"])), Err("no_matching_rule"));
    let Err(Denial::NoMatchingRule { would_grant }) = policy.decide(&person("p", &[], &[], "t"), &[]) else {
        panic!("denied");
    };
    assert_eq!(
        would_grant,
        strings(&["app role Talos.Reader in tenant t", "app role deploy/prod"])
    );
    // A rule that names no tenant matches no tenant's token when the
    // issuer allows several (such a rule is refused at load; this is
    // what a rule that got through would do).
    for tid in [TENANT_A, TENANT_B] {
        assert!(!AppRoleSelector::parse("Talos.Reader").matches(
            two_tenants().home("login"),
            Some(tid),
            &strings(&["Talos.Reader"])
        ));
    }
}

#[test]
fn an_app_role_selector_is_read_once_and_named_as_it_counts() {
    let pinned = AppRoleSelector::parse(&format!("{TENANT_A}/Ops/Backup"));
    assert_eq!(
        pinned,
        AppRoleSelector {
            tenant: Some(TENANT_A.to_owned()),
            role: "Ops/Backup".to_owned()
        }
    );
    let alone = AppRoleSelector::parse("Talos.Reader");
    assert_eq!(
        (alone.tenant.as_deref(), alone.role.as_str()),
        (None, "Talos.Reader")
    );
    // Written back as it was read.
    for written in [
        format!("{TENANT_A}/Ops/Backup"),
        "Talos.Reader".into(),
        "/x".into(),
        "t/".into(),
    ] {
        assert_eq!(AppRoleSelector::parse(&written).to_string(), written);
    }
    // Without a tenant to compare, the selector is the role as written.
    assert!(pinned.matches(None, None, &[format!("{TENANT_A}/Ops/Backup")]));
    assert!(!pinned.matches(None, None, &strings(&["Ops/Backup", TENANT_A])));
    // Named with the tenant it counts in, or as written when there is none.
    let home = strings(&[TENANT_A]);
    let both = strings(&[TENANT_A, TENANT_B]);
    assert_eq!(
        pinned.describe(&both),
        Some(format!("app role Ops/Backup in tenant {TENANT_A}"))
    );
    assert_eq!(
        alone.describe(&home),
        Some(format!("app role Talos.Reader in tenant {TENANT_A}"))
    );
    assert_eq!(alone.describe(&both), None);
    assert_eq!(
        pinned.describe(&[]),
        Some(format!("app role {TENANT_A}/Ops/Backup"))
    );
}

#[test]
fn app_role_selectors_are_checked_against_the_tenants_of_their_issuers() {
    let tenancy = two_tenants();
    let check = |selector: &str, issuers: &[&str]| {
        check_app_roles(&strings(&[selector]), issuers, &tenancy).map(|_| ())
    };
    let login = &[crate::config::LOGIN_ISSUER][..];
    let error = check("Talos.Admin", login).unwrap_err();
    assert!(
        error.contains("app role `Talos.Admin` names no tenant, but issuer `login` allows several")
            && error.contains(&format!("`{TENANT_A}/Talos.Admin`")),
        "{error}"
    );
    assert_eq!(check(&format!("{TENANT_A}/Talos.Admin"), login), Ok(()));
    assert_eq!(
        check(&format!("{}/Talos.Admin", TENANT_B.to_uppercase()), login),
        Ok(())
    );
    let error = check("cccccccc-0000-4000-8000-00000000000c/Talos.Admin", login).unwrap_err();
    assert!(error.contains("which issuer `login` does not allow"), "{error}");
    let error = check("Ops/Backup", login).unwrap_err();
    assert!(
        error.contains("names tenant `Ops`") && error.contains("the tenant first"),
        "{error}"
    );
    assert!(
        check(&format!("{TENANT_A}/"), login)
            .unwrap_err()
            .contains("both parts")
    );
    assert!(check("", login).is_err());
    // Per issuer of the rule: each pinned tenant is one of them.
    let both = &["login", "partner"][..];
    assert_eq!(
        check("cccccccc-0000-4000-8000-00000000000c/Talos.Admin", both),
        Ok(())
    );
    assert!(
        check("Talos.Admin", both)
            .unwrap_err()
            .contains("issuer `login` allows several")
    );
    // One tenant: the role alone is that tenant's.
    assert_eq!(check("Talos.Admin", &["partner"]), Ok(()));
    assert_eq!(check("Talos.Admin", &["ci", "partner"]), Ok(()));
    // No tenants: a tenant is meaningless, a `/` of the role's own is fine.
    let error = check(&format!("{TENANT_A}/Talos.Admin"), &["ci"]).unwrap_err();
    assert!(
        error.contains("but issuer `ci` has no tenants: write the role alone, `Talos.Admin`"),
        "{error}"
    );
    assert!(check("00000000-1111-2222-3333-444444444444/Talos.Admin", &["ci"]).is_err());
    assert_eq!(check("deploy/prod", &["ci"]), Ok(()));
    // The refusal stops the cluster's policy too.
    let refused = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[ADMINS], &[], &["os:reader"]),
            rule(&[], &["Talos.Admin"], &["os:admin"]),
        ],
        tenancy: tenancy.clone(),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(refused, PolicyConfigError::AppRole { index: 1, .. }),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .starts_with("rule 1: app role `Talos.Admin` names no tenant")
    );
}

#[test]
fn a_tenant_is_refused_in_a_selector_whose_issuers_have_none() {
    // `contoso` is no GUID, but a tenant this server allows (for
    // `partner`): in front of a role for `ci`, which has no tenants, it
    // is refused as a tenant all the same.
    let tenancy = Tenancy::new([
        (crate::config::LOGIN_ISSUER.to_owned(), strings(&[TENANT_A])),
        ("partner".to_owned(), strings(&["contoso"])),
    ]);
    let check = |selector: &str, issuers: &[&str]| {
        check_app_roles(&strings(&[selector]), issuers, &tenancy).map(|_| ())
    };
    for selector in ["contoso/Talos.Admin", "CONTOSO/Talos.Admin"] {
        let error = check(selector, &["ci"]).unwrap_err();
        assert!(
            error.starts_with(&format!(
                "app role `{selector}` names tenant `{}`",
                &selector[..7]
            )) && error.ends_with("but issuer `ci` has no tenants: write the role alone, `Talos.Admin`"),
            "{error}"
        );
    }
    // Any other prefix is the role's own.
    assert_eq!(check("contosa/Talos.Admin", &["ci"]), Ok(()));
    // A rule of several issuers names them all, the verb agreeing.
    let error = check(&format!("{TENANT_A}/Talos.Admin"), &["ci", "cd"]).unwrap_err();
    assert!(
        error.contains("but issuers `ci`, `cd` have no tenants: write the role alone"),
        "{error}"
    );
    let error = check(
        &format!("{TENANT_B}/Talos.Admin"),
        &[crate::config::LOGIN_ISSUER, "partner"],
    )
    .unwrap_err();
    assert!(
        error.contains(&format!(
            "which issuers `login`, `partner` do not allow (allowed: {TENANT_A}, contoso)"
        )),
        "{error}"
    );
}

#[test]
fn an_example_is_of_the_tenant_it_names_or_of_the_only_one() {
    let pinned = format!("{TENANT_A}/Talos.Reader");
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![rule(&[], &[&pinned], &["os:reader"])],
        tenancy: two_tenants(),
        ..Default::default()
    })
    .unwrap();
    let example = |tid: Option<&str>, expect: &str| PolicyExample {
        description: "readers".into(),
        app_roles: strings(&["Talos.Reader"]),
        claims: tid
            .map(|t| ("tid".to_owned(), serde_json::json!(t)))
            .into_iter()
            .collect(),
        expect_roles: (expect == "reader").then(|| strings(&["os:reader"])),
        expect_denied: (expect != "reader").then(|| expect.to_owned()),
        ..Default::default()
    };
    assert_eq!(policy.check_example(&example(Some(TENANT_A), "reader")), Ok(()));
    assert_eq!(
        policy.check_example(&example(Some(TENANT_B), "no_matching_rule")),
        Ok(())
    );
    let error = policy.check_example(&example(None, "reader")).unwrap_err();
    assert!(
        error.contains("names no tenant") && error.contains("claims: { tid: <tenant id> }"),
        "{error}"
    );
    // With one tenant, the example is of it.
    let single = ClusterPolicy::new(PolicyConfig {
        rules: vec![rule(&[], &["Talos.Reader"], &["os:reader"])],
        tenancy: home_tenant(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(single.check_example(&example(None, "reader")), Ok(()));
}
