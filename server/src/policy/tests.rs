//! The policy's tests: decisions, denials, configuration mistakes,
//! examples.

use super::*;
use crate::config::{PolicyConfig, PolicyExample, Rule, Tenancy};

const ADMINS: &str = "0f2a7c3e-1111-4c5d-9e8f-000000000001";
const ONCALL: &str = "0f2a7c3e-2222-4c5d-9e8f-000000000002";

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// An Entra login issuer that allows one tenant, `t` (that of [`person`]s).
fn home_tenant() -> Tenancy {
    Tenancy::new([(crate::config::LOGIN_ISSUER.to_owned(), strings(&["t"]))])
}

fn rule(groups: &[&str], app_roles: &[&str], roles: &[&str]) -> Rule {
    Rule {
        groups: groups.iter().map(|&g| g.into()).collect(),
        app_roles: strings(app_roles),
        roles: strings(roles),
        ..Default::default()
    }
}

#[test]
fn a_rule_judges_the_login_issuer_unless_it_names_others() {
    let scoped = Rule {
        issuers: strings(&["ci"]),
        ..rule(&["deployers"], &[], &["os:operator"])
    };
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![rule(&[ADMINS], &[], &["os:reader"]), scoped],
        ..Default::default()
    })
    .unwrap();
    let from = |issuer: &str, groups: &[&str]| Applicant {
        issuer_name: issuer.into(),
        ..person("p", groups, &[], "t")
    };
    let granted = |claims: &Applicant| {
        policy
            .decide(claims, &[])
            .map(|d| d.granted)
            .map_err(|d| d.code())
    };
    assert_eq!(granted(&from("login", &[ADMINS])), Ok(strings(&["os:reader"])));
    assert_eq!(
        granted(&from("ci", &[ADMINS])),
        Err("no_matching_rule"),
        "a trusted issuer asserting the admins' group gets nothing"
    );
    assert_eq!(
        granted(&from("ci", &["deployers"])),
        Ok(strings(&["os:operator"]))
    );
    assert_eq!(granted(&from("login", &["deployers"])), Err("no_matching_rule"));
}

fn prod() -> ClusterPolicy {
    ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[ADMINS], &[], &["os:admin"]),
            rule(&[ONCALL], &[], &["os:operator"]),
            rule(&[], &["Talos.Reader"], &["os:reader"]),
            Rule {
                users: strings(&["oid-of-backup-robot@example.com", "tenant-b/oid-of-robot-2"]),
                roles: strings(&["os:etcd:backup"]),
                ..Default::default()
            },
            Rule {
                groups: vec![ONCALL.into()],
                claims: [("tid".to_owned(), "tenant-a".to_owned())].into(),
                roles: strings(&["os:etcd:backup"]),
                ..Default::default()
            },
        ],
        default_roles: strings(&["os:operator", "os:reader", "os:etcd:backup"]),
        allow_impersonator: false,
        tenancy: home_tenant(),
        ..Default::default()
    })
    .unwrap()
}

fn person(username: &str, groups: &[&str], app_roles: &[&str], tid: &str) -> Applicant {
    let mut raw = serde_json::Map::new();
    raw.insert("tid".into(), tid.into());
    Applicant {
        issuer_name: crate::config::LOGIN_ISSUER.into(),
        tenant: Some(tid.into()),
        subject: format!("oid-of-{username}"),
        username: username.into(),
        groups: strings(groups),
        app_roles: strings(app_roles),
        raw,
        application: false,
        workload: false,
    }
}

/// (who, groups, app roles, tid, requested, granted roles or denial code)
type Case<'a> = (
    &'a str,
    &'a [&'a str],
    &'a [&'a str],
    &'a str,
    &'a [&'a str],
    Result<&'a [&'a str], &'a str>,
);

#[test]
fn decisions_table() {
    let policy = prod();
    let cases: &[Case] = &[
        ("reader", &[], &["Talos.Reader"], "t", &[], Ok(&["os:reader"])),
        ("nobody", &[], &[], "t", &[], Err("no_matching_rule")),
        (
            "nobody",
            &["some-other-group"],
            &["Other.Role"],
            "t",
            &[],
            Err("no_matching_rule"),
        ),
        ("oncall", &[ONCALL], &[], "t", &[], Ok(&["os:operator"])),
        (
            "oncall-a",
            &[ONCALL],
            &[],
            "tenant-a",
            &[],
            Ok(&["os:etcd:backup", "os:operator"]),
        ),
        (
            "oncall-upper",
            &["0F2A7C3E-2222-4C5D-9E8F-000000000002"],
            &[],
            "t",
            &[],
            Ok(&["os:operator"]),
        ),
        ("admin", &[ADMINS], &[], "t", &[], Err("role_required")),
        ("admin", &[ADMINS], &[], "t", &["os:admin"], Ok(&["os:admin"])),
        (
            "admin+reader",
            &[ADMINS],
            &["Talos.Reader"],
            "t",
            &[],
            Ok(&["os:reader"]),
        ),
        (
            "admin+reader",
            &[ADMINS],
            &["Talos.Reader"],
            "t",
            &["os:admin", "os:reader"],
            Ok(&["os:admin", "os:reader"]),
        ),
        (
            "oncall",
            &[ONCALL],
            &[],
            "t",
            &["os:admin"],
            Err("role_not_permitted"),
        ),
        (
            "oncall",
            &[ONCALL],
            &[],
            "t",
            &["os:operator", "os:admin"],
            Err("role_not_permitted"),
        ),
        (
            "reader",
            &[],
            &["Talos.Reader"],
            "t",
            &["os:impersonator"],
            Err("role_not_permitted"),
        ),
        (
            "backup-robot@example.com",
            &[],
            &[],
            "t",
            &[],
            Ok(&["os:etcd:backup"]),
        ),
        // Pinned to a tenant: the same oid elsewhere is someone else.
        ("robot-2", &[], &[], "tenant-b", &[], Ok(&["os:etcd:backup"])),
        ("robot-2", &[], &[], "tenant-c", &[], Err("no_matching_rule")),
        // Subjects are compared exactly.
        (
            "BACKUP-ROBOT@example.com",
            &[],
            &[],
            "t",
            &[],
            Err("no_matching_rule"),
        ),
    ];
    for (who, groups, app_roles, tid, requested, expected) in cases {
        let claims = person(who, groups, app_roles, tid);
        let got = policy.decide(&claims, &strings(requested));
        match (expected, got) {
            (Ok(roles), Ok(decision)) => {
                assert_eq!(decision.granted, strings(roles), "{who} {requested:?}")
            }
            (Err(code), Err(denial)) => assert_eq!(denial.code(), *code, "{who} {requested:?}"),
            (expected, got) => panic!("{who} {requested:?}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn denials_say_what_would_help() {
    let policy = prod();
    let denial = policy.decide(&person("nobody", &[], &[], "t"), &[]).unwrap_err();
    let message = denial.to_string();
    assert!(
        message.contains(ADMINS) && message.contains(ONCALL) && message.contains("Talos.Reader"),
        "{message}"
    );
    let denial = policy
        .decide(&person("oncall", &[ONCALL], &[], "t"), &strings(&["os:admin"]))
        .unwrap_err();
    assert_eq!(
        denial,
        Denial::RoleNotPermitted {
            requested: strings(&["os:admin"]),
            entitled: strings(&["os:operator"])
        }
    );
}

#[test]
fn users_are_matched_by_subject_never_by_username() {
    let policy = prod();
    let mut claims = person("someone", &[], &[], "t");
    claims.subject = "oid-of-backup-robot@example.com".into();
    assert_eq!(policy.decide(&claims, &[]).unwrap().granted, ["os:etcd:backup"]);
    // A guest who names themselves like the rule's user gets nothing.
    let mut impostor = person("oid-of-backup-robot@example.com", &[], &[], "t");
    impostor.subject = "guest-oid".into();
    assert_eq!(
        policy.decide(&impostor, &[]).unwrap_err().code(),
        "no_matching_rule"
    );
    // `tid/oid` needs the tenant an issuer verified, not a `tid` claim
    // a tenantless issuer's token happens to carry.
    let pinned = person("robot-2", &[], &[], "tenant-b");
    assert_eq!(policy.decide(&pinned, &[]).unwrap().granted, ["os:etcd:backup"]);
    let tenantless = Applicant {
        tenant: None,
        ..pinned
    };
    assert_eq!(
        policy.decide(&tenantless, &[]).unwrap_err().code(),
        "no_matching_rule"
    );
    // A trusted issuer's token is judged only by rules that name it.
    let from_ci = Applicant {
        issuer_name: "ci".into(),
        ..person("robot-2", &[], &[], "tenant-b")
    };
    assert_eq!(
        policy.decide(&from_ci, &[]).unwrap_err().code(),
        "no_matching_rule"
    );
}

#[test]
fn no_default_roles_means_everything_entitled() {
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[ADMINS], &[], &["os:admin"]),
            rule(&[ADMINS], &[], &["os:reader"]),
        ],
        ..Default::default()
    })
    .unwrap();
    let decision = policy.decide(&person("a", &[ADMINS], &[], "t"), &[]).unwrap();
    assert_eq!(decision.granted, ["os:admin", "os:reader"]);
}

#[test]
fn configuration_mistakes_are_refused() {
    let check = |rules: Vec<Rule>, allow_impersonator: bool| {
        ClusterPolicy::new(PolicyConfig {
            rules,
            default_roles: vec![],
            allow_impersonator,
            tenancy: Tenancy::default(),
            ..Default::default()
        })
        .map(|_| ())
    };
    assert_eq!(
        check(vec![rule(&[ADMINS], &[], &["os:root"])], false),
        Err(PolicyConfigError::UnknownRole {
            role: "os:root".into()
        })
    );
    assert_eq!(
        check(vec![rule(&[], &[], &["os:admin"])], false),
        Err(PolicyConfigError::RuleWithoutSelector { index: 0 })
    );
    assert_eq!(
        check(vec![rule(&[ADMINS], &[], &[])], false),
        Err(PolicyConfigError::RuleWithoutRoles { index: 0 })
    );
    assert_eq!(
        check(
            vec![
                rule(&[ONCALL], &[], &["os:reader"]),
                rule(&[ADMINS], &[], &["os:impersonator"])
            ],
            false
        ),
        Err(PolicyConfigError::ImpersonatorNotAllowed { index: 1 })
    );
    assert_eq!(
        check(vec![rule(&[ADMINS], &[], &["os:impersonator"])], true),
        Ok(())
    );
    let bad_default = ClusterPolicy::new(PolicyConfig {
        rules: vec![rule(&[ADMINS], &[], &["os:admin"])],
        default_roles: strings(&["admin"]),
        allow_impersonator: false,
        tenancy: Tenancy::default(),
        ..Default::default()
    });
    assert!(matches!(bad_default, Err(PolicyConfigError::UnknownRole { .. })));
}

#[test]
fn impersonator_is_granted_only_when_named_and_allowed() {
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&["omni"], &[], &["os:impersonator"]),
            rule(&[ADMINS], &[], &["os:admin"]),
        ],
        default_roles: strings(&["os:admin"]),
        allow_impersonator: true,
        tenancy: Tenancy::default(),
        ..Default::default()
    })
    .unwrap();
    // An admin never gets impersonator by being an admin.
    assert_eq!(
        policy
            .decide(&person("a", &[ADMINS], &[], "t"), &[])
            .unwrap()
            .granted,
        ["os:admin"]
    );
    let denial = policy
        .decide(&person("a", &[ADMINS], &[], "t"), &strings(&["os:impersonator"]))
        .unwrap_err();
    assert_eq!(denial.code(), "role_not_permitted");
    // Named by a rule: only on explicit request, since it is not a default.
    let omni = person("omni", &["omni"], &[], "t");
    assert_eq!(policy.decide(&omni, &[]).unwrap_err().code(), "role_required");
    assert_eq!(
        policy
            .decide(&omni, &strings(&["os:impersonator"]))
            .unwrap()
            .granted,
        ["os:impersonator"]
    );
}

#[test]
fn rules_parse_from_yaml_and_unknown_keys_are_errors() {
    let yaml = r#"
rules:
  - { groups: ["g1"], roles: [os:admin] }
  - { app_roles: ["Talos.Reader"], roles: [os:reader] }
  - { users: ["alice@example.com"], claims: { department: platform }, roles: [os:operator] }
default_roles: [os:reader]
"#;
    let config: PolicyConfig = serde_yaml_ng::from_str(yaml).unwrap();
    assert_eq!(config.rules.len(), 3);
    ClusterPolicy::new(config).unwrap();
    let typo = "rules:\n  - { group: [g1], roles: [os:admin] }\n";
    let error = serde_yaml_ng::from_str::<PolicyConfig>(typo)
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown field `group`"), "{error}");
}

#[test]
fn array_and_scalar_claims_match() {
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![Rule {
            claims: [
                ("amr".to_owned(), "mfa".to_owned()),
                ("department".to_owned(), "platform".to_owned()),
            ]
            .into(),
            roles: strings(&["os:reader"]),
            ..Default::default()
        }],
        ..Default::default()
    })
    .unwrap();
    let mut claims = person("x", &[], &[], "t");
    claims.raw.insert("amr".into(), serde_json::json!(["pwd", "mfa"]));
    claims
        .raw
        .insert("department".into(), serde_json::json!("platform"));
    assert!(policy.decide(&claims, &[]).is_ok());
    claims.raw.insert("amr".into(), serde_json::json!(["pwd"]));
    assert_eq!(
        policy.decide(&claims, &[]).unwrap_err().code(),
        "no_matching_rule"
    );
}

#[test]
fn examples_catch_a_policy_that_drifted() {
    let policy = prod();
    let yaml = r#"
- { description: "on-call operates", groups: ["0f2a7c3e-2222-4c5d-9e8f-000000000002"], expect_roles: [os:operator] }
- { description: "strangers are denied", username: eve, expect_denied: no_matching_rule }
- { description: "admins must ask", groups: ["0f2a7c3e-1111-4c5d-9e8f-000000000001"], request: [os:admin], expect_roles: [os:admin] }
"#;
    let examples: Vec<PolicyExample> = serde_yaml_ng::from_str(yaml).unwrap();
    for example in &examples {
        policy.check_example(example).unwrap();
    }
    let wrong = PolicyExample {
        description: "readers operate".into(),
        app_roles: strings(&["Talos.Reader"]),
        expect_roles: Some(strings(&["os:operator"])),
        ..Default::default()
    };
    let error = policy.check_example(&wrong).unwrap_err();
    assert_eq!(
        error,
        "policy example `readers operate` expected roles [os:operator] but got roles [os:reader]"
    );
    let both = PolicyExample {
        expect_roles: Some(vec![]),
        expect_denied: Some("x".into()),
        ..Default::default()
    };
    assert!(policy.check_example(&both).unwrap_err().contains("exactly one"));
}

#[test]
fn an_application_is_granted_only_by_a_rule_that_names_it() {
    let app_oid = "5e000000-0000-4000-8000-0000000000a1";
    let named = Rule {
        users: vec![app_oid.into()],
        roles: vec!["os:etcd:backup".into()],
        ..Rule::default()
    };
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![
            rule(&[ADMINS], &[], &["os:admin"]),
            rule(&[], &["Talos.Reader"], &["os:reader"]),
            named,
        ],
        tenancy: home_tenant(),
        ..Default::default()
    })
    .unwrap();
    // The group and the app role match a person, never an application.
    let app = |subject: &str| Applicant {
        subject: subject.into(),
        application: true,
        ..person("siem-client-id", &[ADMINS], &["Talos.Reader"], "t")
    };
    let refused = policy.decide(&app("another-app"), &[]).unwrap_err();
    assert_eq!(refused.code(), "no_matching_rule");
    assert_eq!(
        refused,
        Denial::NoMatchingRule {
            would_grant: vec!["a rule naming application another-app in `users`".into()]
        }
    );
    assert_eq!(
        policy.decide(&app(app_oid), &[]).unwrap().granted,
        ["os:etcd:backup"]
    );
    let person = Applicant {
        subject: app_oid.into(),
        ..person("p", &[ADMINS], &["Talos.Reader"], "t")
    };
    assert_eq!(
        policy.decide(&person, &[]).unwrap().granted,
        ["os:admin", "os:etcd:backup", "os:reader"]
    );
    // An example may stand for an application.
    let example = |application: bool| PolicyExample {
        description: "the collector".into(),
        subject: "another-app".into(),
        app_roles: vec!["Talos.Reader".into()],
        application,
        expect_denied: Some("no_matching_rule".into()),
        ..PolicyExample::default()
    };
    assert_eq!(policy.check_example(&example(true)), Ok(()));
    assert!(policy.check_example(&example(false)).is_err());
}

mod app_roles;
mod workloads;

/// A refusal lists what would grant a role; a group the rule names is
/// shown with the name people know it by, next to the id tokens carry.
#[test]
fn a_refusal_names_a_group_by_its_display_name_too() {
    let mut named = rule(&[], &[], &["os:operator"]);
    named.groups = vec![crate::config::GroupRef {
        id: ONCALL.into(),
        name: Some("Talos on-call".into()),
    }];
    let policy = ClusterPolicy::new(PolicyConfig {
        rules: vec![named, rule(&[ADMINS], &[], &["os:admin"])],
        tenancy: home_tenant(),
        ..Default::default()
    })
    .unwrap();
    let denial = policy.decide(&person("nobody", &[], &[], "t"), &[]).unwrap_err();
    let Denial::NoMatchingRule { would_grant } = denial else {
        panic!("{denial:?}");
    };
    assert_eq!(
        would_grant,
        [
            format!("group {ADMINS}"),
            format!("group {ONCALL} (Talos on-call)")
        ]
    );
    // Membership is still by id.
    let granted = policy.decide(&person("bob", &[ONCALL], &[], "t"), &[]).unwrap();
    assert_eq!(granted.granted, ["os:operator"]);
}
