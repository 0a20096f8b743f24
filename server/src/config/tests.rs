use std::time::Duration;

use super::*;
use crate::secret_file::read_secret;

/// The least configuration that loads (other modules' tests start
/// from it too).
pub(crate) const MINIMAL: &str = r#"
insecure_http: true
identity:
  issuer: "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0"
  client_id: "11111111-2222-3333-4444-555555555555"
  allowed_tenants: ["72f988bf-86f1-41af-91ab-2d7cd011db47"]
clusters:
  prod:
    ca: { secrets_bundle: /etc/talos-sso/prod-secrets.yaml }
    endpoints: [cp-01.example.internal]
    rules:
      - { groups: ["g-admins"], roles: [os:admin] }
"#;

#[test]
fn audit_checkpoints_take_one_key_a_sane_interval_and_an_encrypted_webhook() {
    let with =
        |section: &str| Config::from_yaml(&format!("{MINIMAL}\naudit:\n  checkpoints: {{ {section} }}\n"));
    let file = "file: /var/lib/talos-sso/checkpoints.jsonl";
    let token = "pkcs11: { module: /m.so, token_label: t, key_label: k, pin_file: /p }";
    let loaded = with(&format!("key_file: /k, {file}")).unwrap();
    let checkpoints = loaded.audit.checkpoints.unwrap();
    assert_eq!(
        (checkpoints.interval, checkpoints.key_file),
        (Duration::from_secs(60), Some(PathBuf::from("/k")))
    );
    assert!(
        with(&format!("{token}, {file}"))
            .unwrap()
            .audit
            .checkpoints
            .unwrap()
            .pkcs11
            .is_some()
    );
    assert!(
        with(&format!(
            "{token}, {file}, webhook_url: \"http://127.0.0.1:9/hook\""
        ))
        .is_ok()
    );
    for (section, refused) in [
        (file.to_owned(), "exactly one of key_file and pkcs11"),
        (
            format!("key_file: /k, {token}, {file}"),
            "exactly one of key_file and pkcs11",
        ),
        (format!("key_file: /k, {file}, interval: 500ms"), "at least 1s"),
        (
            format!("key_file: /k, {file}, webhook_url: \"http://siem.example.com/hook\""),
            "must be https://",
        ),
        (
            format!("key_file: /k, {file}, webhook_url: \"not a url\""),
            "webhook_url",
        ),
    ] {
        let error = with(&section).unwrap_err().to_string();
        assert!(error.contains(refused), "{section}: {error}");
    }
    // Off unless configured, and then said.
    assert!(
        Config::from_yaml(MINIMAL)
            .unwrap()
            .unsigned_trail_notice()
            .is_some()
    );
    assert!(
        with(&format!("key_file: /k, {file}"))
            .unwrap()
            .unsigned_trail_notice()
            .is_none()
    );
}

#[test]
fn a_rule_group_is_an_id_or_an_id_with_a_display_name() {
    let both = MINIMAL.replace(
        r#"groups: ["g-admins"]"#,
        r#"groups: ["g-admins", { id: "3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02", name: "Talos on-call" }]"#,
    );
    let config = Config::from_yaml(&both).unwrap();
    assert_eq!(
        config.clusters["prod"].rules[0].groups,
        [
            GroupRef::from("g-admins"),
            GroupRef {
                id: "3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02".into(),
                name: Some("Talos on-call".into()),
            },
        ]
    );
    // A name without an id, or an unknown key, is refused by name.
    let no_id = MINIMAL.replace(
        r#"groups: ["g-admins"]"#,
        r#"groups: [{ name: "Talos on-call" }]"#,
    );
    let error = Config::from_yaml(&no_id).unwrap_err().to_string();
    assert!(error.contains("missing field `id`"), "{error}");
    let typo = MINIMAL.replace(r#"groups: ["g-admins"]"#, r#"groups: [{ id: g, display: x }]"#);
    let error = Config::from_yaml(&typo).unwrap_err().to_string();
    assert!(error.contains("unknown field `display`"), "{error}");
}

#[test]
fn a_ca_key_in_a_pkcs11_token_is_a_source_of_its_own() {
    let pkcs11 = "cert_file: /etc/talos-sso/intermediate.crt, pkcs11: { module: /usr/lib/softhsm/libsofthsm2.so, \
                      token_label: talos-ca, key_label: talos-sso-intermediate, pin_file: /etc/talos-sso/talos-ca.pin }";
    let config =
        Config::from_yaml(&MINIMAL.replace("secrets_bundle: /etc/talos-sso/prod-secrets.yaml", pkcs11))
            .unwrap();
    let source = config.clusters["prod"].ca.source().unwrap();
    let CaSource::Pkcs11 { cert_file, pkcs11 } = source else {
        panic!("{source:?}");
    };
    assert_eq!(cert_file, PathBuf::from("/etc/talos-sso/intermediate.crt"));
    assert_eq!(
        (pkcs11.token_label.as_str(), pkcs11.key_label.as_str()),
        ("talos-ca", "talos-sso-intermediate")
    );
    assert_eq!(pkcs11.pin_file, PathBuf::from("/etc/talos-sso/talos-ca.pin"));
    // A key file and a token at once, a token without the certificate,
    // and an unknown key in `pkcs11` are refused.
    let both = pkcs11_yaml_with(&format!("key_file: /k, {}", pkcs11_text()));
    assert!(
        Config::from_yaml(&both)
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    let no_cert =
        pkcs11_yaml_with(&pkcs11_text().replace("cert_file: /etc/talos-sso/intermediate.crt, ", ""));
    assert!(
        Config::from_yaml(&no_cert)
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    let typo = pkcs11_yaml_with(&pkcs11_text().replace("pin_file", "pin"));
    assert!(Config::from_yaml(&typo).is_err());
}

fn pkcs11_text() -> String {
    "cert_file: /etc/talos-sso/intermediate.crt, pkcs11: { module: /m.so, token_label: t, key_label: k, pin_file: /p }"
            .into()
}

fn pkcs11_yaml_with(ca: &str) -> String {
    MINIMAL.replace("secrets_bundle: /etc/talos-sso/prod-secrets.yaml", ca)
}

#[test]
fn the_console_needs_a_public_url_browsers_reach_safely() {
    let with = |section: &str| Config::from_yaml(&format!("{MINIMAL}\nconsole: {{ {section} }}\n"));
    let off = Config::from_yaml(MINIMAL).unwrap().console;
    assert!(!off.enabled && off.redirect_uri().is_none());
    let on = with("enabled: true, public_url: \"https://sso.example.com/\"")
        .unwrap()
        .console;
    assert_eq!(
        on.redirect_uri().as_deref(),
        Some("https://sso.example.com/ui/callback")
    );
    assert_eq!(
        (on.session_idle, on.session_lifetime, on.max_sessions),
        (Duration::from_secs(900), Duration::from_secs(3600), 1000)
    );
    assert!(with("enabled: true, public_url: \"http://127.0.0.1:8443\"").is_ok());
    // A console client of its own is one the login issuer's ID tokens
    // may name (`azp`); only while the console is on.
    let cli = "11111111-2222-3333-4444-555555555555";
    let clients = |section: &str| with(section).unwrap().identity.login_issuer().clients;
    assert_eq!(
        clients("enabled: true, public_url: \"https://a.example\", client_id: console-web"),
        [cli, "console-web"]
    );
    assert_eq!(clients("enabled: true, public_url: \"https://a.example\""), [cli]);
    assert_eq!(clients("enabled: false, client_id: console-web"), [cli]);
    for (section, says) in [
        ("enabled: true", "console.public_url is required"),
        (
            "enabled: true, public_url: \"http://sso.example.com\"",
            "must be https://",
        ),
        (
            "enabled: true, public_url: \"https://sso.example.com/?x=1\"",
            "without query",
        ),
        ("enabled: true, public_url: \"not a url\"", "console.public_url"),
        (
            "enabled: true, public_url: \"https://a.example\", max_sessions: 0",
            "above zero",
        ),
    ] {
        let error = with(section).unwrap_err().to_string();
        assert!(error.contains(says), "{section}: {error}");
    }
}

#[test]
fn minimal_config_gets_defaults() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    let prod = &config.clusters["prod"];
    assert_eq!(prod.ttl, Duration::from_secs(300));
    assert_eq!(prod.max_ttl, Duration::from_secs(900));
    assert_eq!(prod.policy(&config.identity).rules.len(), 1);
    let login = config.identity.login_issuer();
    assert_eq!(login.audiences, ["11111111-2222-3333-4444-555555555555"]);
    assert_eq!(
        login.kind, "entra",
        "allowed_tenants makes it Entra, as before kinds"
    );
    assert_eq!(
        *config.database_url().unwrap(),
        "sqlite:///var/lib/talos-sso/audit.db"
    );
    assert_eq!(config.identity.token, talos_sso_api::BearerToken::IdToken);
    let access =
        Config::from_yaml(&MINIMAL.replace("identity:\n", "identity:\n  token: access_token\n")).unwrap();
    assert_eq!(access.identity.token, talos_sso_api::BearerToken::AccessToken);
}

#[test]
fn mistakes_are_refused_with_the_key_named() {
    let cases = [
        (
            MINIMAL.replace("insecure_http: true", "insecure_htp: true"),
            "insecure_htp",
        ),
        (
            MINIMAL.replace("insecure_http: true", "insecure_http: false"),
            "tls",
        ),
        (
            MINIMAL
                .replace("ttl_unused", "x")
                .replace("endpoints: [cp-01.example.internal]", "endpoints: []"),
            "no endpoints",
        ),
        (
            MINIMAL.replace(
                "{ groups: [\"g-admins\"], roles: [os:admin] }",
                "{ groupz: [x], roles: [os:admin] }",
            ),
            "groupz",
        ),
        (
            MINIMAL.replace(
                "secrets_bundle: /etc/talos-sso/prod-secrets.yaml",
                "secrets_bundle: a, machine_config: b",
            ),
            "exactly one",
        ),
        (
            MINIMAL.replace("    rules:", "    ttl: 20m\n    rules:"),
            "ttl must be",
        ),
        (
            MINIMAL.replace("    rules:", "    ttl: five minutes\n    rules:"),
            "five minutes",
        ),
        (
            MINIMAL.replace("identity:\n", "identity:\n  token: access\n"),
            "unknown variant `access`, expected `id_token` or `access_token`",
        ),
    ];
    for (text, expected) in cases {
        let error = Config::from_yaml(&text).unwrap_err().to_string();
        assert!(error.contains(expected), "expected {expected:?} in {error}");
    }
}

#[test]
fn a_missing_kind_is_inferred_and_the_line_to_add_is_named() {
    let config = Config::from_yaml(MINIMAL).unwrap();
    let warnings = config.warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("taken as `entra` because identity.allowed_tenants is set")
            && warnings[0].contains("add the line `kind: entra` to the `identity` section"),
        "{warnings:?}"
    );
    let explicit = Config::from_yaml(&MINIMAL.replace("identity:\n", "identity:\n  kind: entra\n")).unwrap();
    assert!(explicit.warnings().is_empty());
    let generic = MINIMAL
        .replace(
            "  allowed_tenants: [\"72f988bf-86f1-41af-91ab-2d7cd011db47\"]\n",
            "",
        )
        .replace(
            "login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0",
            "idp.example.com",
        );
    let generic = Config::from_yaml(&generic).unwrap();
    assert_eq!(generic.identity.login_issuer().kind, "oidc");
    assert!(generic.warnings()[0].contains("add the line `kind: oidc`"));
}

#[test]
fn audit_feeds_and_application_auditors_are_configured_and_checked() {
    let config = Config::from_yaml(&format!(
        "{MINIMAL}auditors: {{ app_roles: [Talos.Auditor], client_ids: [siem] }}\n{}",
        "audit: { feed: { max_streams: 2, heartbeat: 5s, poll_interval: 1s } }\n"
    ))
    .unwrap();
    assert_eq!(config.auditors.client_ids, ["siem"]);
    assert_eq!(config.audit.feed.max_streams, 2);
    assert_eq!(config.audit.feed.heartbeat, Duration::from_secs(5));
    let defaults = Config::from_yaml(MINIMAL).unwrap().audit.feed;
    assert_eq!(
        (defaults.max_streams, defaults.heartbeat, defaults.poll_interval),
        (16, Duration::from_secs(15), Duration::from_secs(5))
    );
    assert_eq!(
        (defaults.max_streams_per_identity, defaults.write_timeout),
        (2, Duration::from_secs(30))
    );
    for (feed, expected) in [
        (
            "max_streams: 0",
            "audit.feed.max_streams and audit.feed.max_streams_per_identity must be at least 1",
        ),
        (
            "max_streams_per_identity: 0",
            "max_streams_per_identity must be at least 1",
        ),
        ("heartbeat: 0s", "must be above zero"),
        ("write_timeout: 0s", "must be above zero"),
        ("poll_interval: 0s", "must be above zero"),
        ("streams: 3", "unknown field `streams`"),
    ] {
        let text = format!("{MINIMAL}audit: {{ feed: {{ {feed} }} }}\n");
        let error = Config::from_yaml(&text).unwrap_err().to_string();
        assert!(
            error.contains(expected),
            "{feed}: expected {expected:?} in {error}"
        );
    }
}

#[test]
fn environment_overrides_file_values_and_toml_works() {
    let dir = tempfile_dir();
    let yaml = dir.join("config.yaml");
    std::fs::write(&yaml, MINIMAL).unwrap();
    let env = [
        (
            "TALOS_SSO__DATABASE__URL".to_owned(),
            "postgres://talos_sso@db/talos_sso".to_owned(),
        ),
        ("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned()),
        ("TALOS_SSO__IDENTITY__AUDIENCES".to_owned(), "a,b".to_owned()),
        ("UNRELATED".to_owned(), "x".to_owned()),
    ];
    let config = Config::load_with_env(&yaml, env).unwrap();
    assert_eq!(
        config.database.url.as_deref(),
        Some("postgres://talos_sso@db/talos_sso")
    );
    assert_eq!(config.listen, "127.0.0.1:9443".parse().unwrap());
    assert_eq!(config.identity.login_issuer().audiences, ["a", "b"]);

    // A typo in an override is blamed on the variable, not the file.
    let unknown = [
        ("TALOS_SSO__DATABASE__URLL".to_owned(), "x".to_owned()),
        ("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned()),
    ];
    let error = Config::load_with_env(&yaml, unknown).unwrap_err();
    assert!(matches!(error, ConfigError::Environment { .. }), "{error:?}");
    let error = error.to_string();
    assert!(
        error.starts_with("invalid configuration from the environment (TALOS_SSO__DATABASE__URLL): "),
        "{error}"
    );
    assert!(error.contains("urll"), "{error}");
    let bad_value = [("TALOS_SSO__CLUSTERS__PROD__TTL".to_owned(), "soon".to_owned())];
    let error = Config::load_with_env(&yaml, bad_value).unwrap_err().to_string();
    assert!(
        error.contains("from the environment (TALOS_SSO__CLUSTERS__PROD__TTL)"),
        "{error}"
    );
    // A mistake in the file stays the file's, overrides or not.
    let broken = dir.join("broken.yaml");
    std::fs::write(
        &broken,
        MINIMAL.replace("    rules:", "    maxttl: 5m\n    rules:"),
    )
    .unwrap();
    let env = [("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:9443".to_owned())];
    let error = Config::load_with_env(&broken, env).unwrap_err();
    assert!(matches!(error, ConfigError::Invalid(_)), "{error:?}");

    let toml = dir.join("config.toml");
    std::fs::write(
        &toml,
        r#"
insecure_http = true
[identity]
issuer = "https://idp.example.com"
client_id = "cli"
[clusters.lab]
endpoints = ["10.0.0.2"]
ca = { cert_file = "/ca.crt", key_file = "/ca.key" }
rules = [ { users = ["alice"], roles = ["os:reader"] } ]
"#,
    )
    .unwrap();
    let config = Config::load_with_env(&toml, []).unwrap();
    assert_eq!(config.clusters["lab"].endpoints, ["10.0.0.2"]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn overrides_reach_capitalised_clusters_and_lists_and_cluster_files_join() {
    let dir = tempfile_dir();
    let yaml = dir.join("config.yaml");
    std::fs::write(
        &yaml,
        MINIMAL.replace("  prod:\n", "  Prod:\n").replace(
            "insecure_http: true\n",
            "insecure_http: true\nclusters_dir: clusters.d\nauditors: { groups: [a] }\n",
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.join("clusters.d")).unwrap();
    std::fs::write(
        dir.join("clusters.d/lab.toml"),
        "endpoints = [\"10.0.0.2\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
    )
    .unwrap();
    let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let config = Config::load_with_env(
        &yaml,
        env(&[
            ("TALOS_SSO__CLUSTERS__PROD__TTL", "10m"),
            ("TALOS_SSO__CLUSTERS__PROD__ENDPOINTS", "cp-1,cp-2"),
            ("TALOS_SSO__CLUSTERS__LAB__NODES", "[n-1, n-2]"),
            ("TALOS_SSO__AUDITORS__GROUPS", "g-1, g-2"),
            ("TALOS_SSO__ADMINS__GROUPS", "[g-3]"),
            ("TALOS_SSO__DATABASE__MAX_CONNECTIONS", "4"),
        ]),
    )
    .unwrap();
    let prod = &config.clusters["Prod"];
    assert_eq!(prod.ttl, Duration::from_secs(600));
    assert_eq!(prod.endpoints, ["cp-1", "cp-2"]);
    assert_eq!(config.clusters["lab"].nodes, ["n-1", "n-2"]);
    assert_eq!(config.auditors.groups, ["g-1", "g-2"]);
    assert_eq!(config.admins.groups, ["g-3"]);
    assert_eq!(config.database.max_connections, Some(4));
    assert_eq!(config.fingerprint.len(), 64);
    // A list key the file does not set takes the `[a, b]` form; a plain
    // value there is a mistake, named with its variable.
    let error = Config::load_with_env(
        &yaml,
        env(&[("TALOS_SSO__CLUSTERS__LAB__DEFAULT_ROLES", "os:reader")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with(
            "invalid configuration from the environment (TALOS_SSO__CLUSTERS__LAB__DEFAULT_ROLES)"
        ),
        "{error}"
    );
    // The folder moves with the environment too, and a change in it
    // changes the fingerprint a reload watches.
    let fingerprint = config.fingerprint.clone();
    std::fs::write(
        dir.join("clusters.d/lab.toml"),
        "endpoints = [\"10.0.0.3\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
    )
    .unwrap();
    let source = config.source.clone().unwrap();
    let snapshot = source.snapshot().unwrap();
    assert_ne!(snapshot.fingerprint(), fingerprint);
    assert_eq!(source.load().unwrap().clusters["lab"].endpoints, ["10.0.0.3"]);
    // A snapshot loads what it read, whatever the files hold since.
    std::fs::write(
        dir.join("clusters.d/lab.toml"),
        "endpoints = [\"10.0.0.4\"]\nca = { cert_file = \"/ca.crt\", key_file = \"/ca.key\" }\n",
    )
    .unwrap();
    let loaded = snapshot.load().unwrap();
    assert_eq!(loaded.clusters["lab"].endpoints, ["10.0.0.3"]);
    assert_ne!(loaded.fingerprint, source.snapshot().unwrap().fingerprint());
    std::fs::create_dir(dir.join("elsewhere")).unwrap();
    let moved = Config::load_with_env(&yaml, env(&[("TALOS_SSO__CLUSTERS_DIR", "elsewhere")])).unwrap();
    assert!(!moved.clusters.contains_key("lab"));
    // Text alone has no folder to read clusters from.
    let error = Config::from_yaml(&format!("{MINIMAL}clusters_dir: /etc\n"))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("clusters_dir is read next to a configuration file"),
        "{error}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn secrets_come_from_private_files_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile_dir();
    let secret = dir.join("db-password");
    std::fs::write(&secret, "s3cret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(
        read_secret(&secret)
            .unwrap_err()
            .to_string()
            .contains("chmod 600")
    );
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut config = Config::from_yaml(MINIMAL).unwrap();
    config.database.url = Some("postgres://talos_sso@db:5432/talos_sso".into());
    config.database.password_file = Some(secret);
    assert_eq!(
        *config.database_url().unwrap(),
        "postgres://talos_sso:s3cret@db:5432/talos_sso"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "talos-sso-config-test-{}",
        crate::random::random_hex(8).unwrap()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
