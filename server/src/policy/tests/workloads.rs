//! Workload rules: checked at load, matched by claims (exactly or by
//! glob), kept apart from people's rules, and their examples.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::config::WorkloadRule;
use crate::identity::issuer::workload::Workload;

fn kinds() -> BTreeMap<String, String> {
    [
        ("github".to_owned(), "github-actions".to_owned()),
        ("k8s".to_owned(), "kubernetes".to_owned()),
    ]
    .into()
}

fn workload_rule(name: &str, issuer: &str, claims: &[(&str, &str)], roles: &[&str]) -> WorkloadRule {
    WorkloadRule {
        name: name.into(),
        issuer: issuer.into(),
        claims: claims
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        roles: strings(roles),
        ttl: None,
    }
}

fn policy(workloads: Vec<WorkloadRule>, people: Vec<Rule>) -> Result<ClusterPolicy, PolicyConfigError> {
    ClusterPolicy::new(PolicyConfig {
        rules: people,
        workloads,
        workload_kinds: kinds(),
        ..Default::default()
    })
}

fn github(claims: &[(&str, &str)]) -> Workload {
    Workload {
        kind: "github-actions",
        claims: claims
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        token_uses: 20,
    }
}

#[test]
fn a_workload_rule_names_known_claims_an_anchor_exactly_and_real_roles() {
    let refused = |rule: WorkloadRule| policy(vec![rule], vec![]).unwrap_err().to_string();
    assert!(
        refused(workload_rule(
            "r",
            "github",
            &[("repo", "org/infra")],
            &["os:admin"]
        ))
        .contains("`repo` is not a claim of github-actions tokens; they offer: repository,"),
    );
    // Without an anchor, a rule would admit any repository on GitHub.
    for claims in [
        &[("environment", "production")][..],
        &[("repository", "org/*"), ("environment", "production")][..],
        &[("repository_owner", "or?")][..],
        &[("repository", "")][..],
        // A repository's admin chooses what makes up its `sub`: no anchor.
        &[("sub", "repo:org/infra:environment:production")][..],
    ] {
        let error = refused(workload_rule("r", "github", claims, &["os:admin"]));
        assert!(
            error.contains("workloads[0]: name one of repository, repository_id, repository_owner"),
            "{claims:?}: {error}"
        );
    }
    assert!(
        refused(workload_rule("r", "k8s", &[("namespace", "b")], &["admin"])).contains("not a Talos role")
    );
    assert!(refused(workload_rule("r", "k8s", &[("namespace", "b")], &[])).contains("grants no roles"));
    assert!(
        refused(workload_rule(
            "r",
            "k8s",
            &[("namespace", "b")],
            &["os:impersonator"]
        ))
        .contains("allow_impersonator")
    );
    assert!(
        refused(workload_rule("r", "login", &[("sub", "x")], &["os:admin"]))
            .contains("not a workload issuer")
    );
    policy(
        vec![workload_rule(
            "r",
            "github",
            &[("repository_owner", "org"), ("ref", "refs/tags/v*")],
            &["os:admin"],
        )],
        vec![],
    )
    .unwrap();
}

#[test]
fn every_claim_must_match_exactly_or_by_glob_and_only_the_rules_issuer() {
    let mut release = workload_rule(
        "release",
        "github",
        &[
            ("repository", "org/infra"),
            ("ref", "refs/tags/v*"),
            ("environment", "production"),
        ],
        &["os:admin"],
    );
    release.ttl = Some(Duration::from_secs(600));
    let mut read = workload_rule("read", "github", &[("repository_owner", "org")], &["os:reader"]);
    read.ttl = Some(Duration::from_secs(120));
    let backup = workload_rule(
        "backup",
        "k8s",
        &[("namespace", "org/infra")],
        &["os:etcd:backup"],
    );
    let policy = policy(vec![release, read, backup], vec![]).unwrap();
    let decide = |claims: &[(&str, &str)], roles: &[&str]| {
        policy
            .workloads
            .decide("github", &github(claims), &strings(roles))
    };
    let tag = [
        ("repository", "org/infra"),
        ("repository_owner", "org"),
        ("ref", "refs/tags/v1.2.0"),
        ("environment", "production"),
    ];
    // Both rules admit: their roles together, the shorter lifetime.
    assert_eq!(
        decide(&tag, &[]).unwrap(),
        WorkloadGrant {
            granted: strings(&["os:admin", "os:reader"]),
            rules: strings(&["release", "read"]),
            ttl: Some(Duration::from_secs(120)),
        }
    );
    assert_eq!(decide(&tag, &["os:reader"]).unwrap().granted, ["os:reader"]);
    assert!(matches!(
        decide(&tag, &["os:operator"]),
        Err(WorkloadDenial::RoleNotPermitted { .. })
    ));
    // The glob covers tags starting with `v`, not branches, not `v` alone
    // with another prefix.
    let branch = [
        ("repository", "org/infra"),
        ("ref", "refs/heads/v1"),
        ("environment", "production"),
    ];
    assert_eq!(
        decide(&branch, &[]).unwrap_err(),
        WorkloadDenial::NotAdmitted {
            misses: vec![
                WorkloadMiss {
                    rule: "release".into(),
                    claims: strings(&["ref"])
                },
                WorkloadMiss {
                    rule: "read".into(),
                    claims: strings(&["repository_owner"])
                },
            ]
        }
    );
    // Exact values are exact: no prefix, no case folding; a missing claim
    // misses.
    for claims in [
        &[
            ("repository", "org/infra-old"),
            ("ref", "refs/tags/v1"),
            ("environment", "production"),
        ][..],
        &[
            ("repository", "Org/Infra"),
            ("ref", "refs/tags/v1"),
            ("environment", "production"),
        ][..],
        &[("repository", "org/infra"), ("ref", "refs/tags/v1")][..],
    ] {
        assert!(
            matches!(decide(claims, &[]), Err(WorkloadDenial::NotAdmitted { .. })),
            "{claims:?}"
        );
    }
    // The Kubernetes rule naming the same value judges only its issuer's
    // tokens.
    assert!(matches!(
        policy
            .workloads
            .decide("github", &github(&[("namespace", "org/infra")]), &[]),
        Err(WorkloadDenial::NotAdmitted { .. })
    ));
}

#[test]
fn people_and_workloads_never_share_rules() {
    // A people's rule that names the workload issuer and claims the token
    // has (refused at load by `config`, and inert here if it got through).
    let people = vec![Rule {
        claims: [("repository".to_owned(), "org/infra".to_owned())].into(),
        issuers: strings(&["github", "login"]),
        roles: strings(&["os:admin"]),
        ..Default::default()
    }];
    let policy = policy(
        vec![workload_rule(
            "w",
            "github",
            &[("repository", "org/infra")],
            &["os:reader"],
        )],
        people,
    )
    .unwrap();
    let mut raw = serde_json::Map::new();
    raw.insert("repository".into(), "org/infra".into());
    let as_workload = Applicant {
        issuer_name: "github".into(),
        subject: "org/infra".into(),
        raw: raw.clone(),
        workload: true,
        ..Default::default()
    };
    assert!(policy.entitled(&as_workload).is_empty());
    // A person with the same claims gets the people's rule, never the
    // workload rule's role.
    let person = Applicant {
        issuer_name: crate::config::LOGIN_ISSUER.into(),
        subject: "oid-1".into(),
        raw,
        ..Default::default()
    };
    assert_eq!(policy.entitled(&person), ["os:admin"]);
}

#[test]
fn workload_examples_are_judged_by_the_workload_rules() {
    let mut people = rule(&[ADMINS], &[], &["os:admin"]);
    people.issuers = vec![];
    let policy = policy(
        vec![workload_rule(
            "w",
            "github",
            &[("repository", "org/infra"), ("ref", "refs/tags/*")],
            &["os:reader"],
        )],
        vec![people],
    )
    .unwrap();
    let example =
        |claims: serde_json::Value, expect_roles: Option<&[&str]>, denied: Option<&str>| PolicyExample {
            description: "ci".into(),
            cluster: "prod".into(),
            issuer: Some("github".into()),
            claims: serde_json::from_value(claims).unwrap(),
            groups: strings(&[ADMINS]),
            expect_roles: expect_roles.map(strings),
            expect_denied: denied.map(str::to_owned),
            ..Default::default()
        };
    let tag = serde_json::json!({"repository": "org/infra", "ref": "refs/tags/v1"});
    policy
        .check_example(&example(tag.clone(), Some(&["os:reader"]), None))
        .unwrap();
    let error = policy
        .check_example(&example(tag, Some(&["os:admin"]), None))
        .unwrap_err();
    assert!(
        error.contains("expected roles [os:admin] but got roles [os:reader]"),
        "{error}"
    );
    let branch = serde_json::json!({"repository": "org/infra", "ref": "refs/heads/main"});
    policy
        .check_example(&example(branch.clone(), None, Some("workload_not_admitted")))
        .unwrap();
    let error = policy
        .check_example(&example(branch, Some(&["os:reader"]), None))
        .unwrap_err();
    assert!(
        error.contains("but got denial `workload_not_admitted`"),
        "{error}"
    );
    let error = policy
        .check_example(&example(
            serde_json::json!({"repository": ["a"]}),
            None,
            Some("x"),
        ))
        .unwrap_err();
    assert!(error.contains("claim `repository` is not text"), "{error}");
}
