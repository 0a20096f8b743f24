//! A cluster's `next_ca`, which signs instead of `ca` from its
//! `signs_from` on: through `load_clusters` as the server, `check` and
//! reloads build clusters, and through a running server, which switches
//! without a reload. The refusals, the warning once it signs, what `check`
//! prints, what `/readyz` says of each cluster's trust mode, and which CA a
//! break-glass certificate says signed it.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use talos_sso_server::app::Clock;
use talos_sso_server::ca::generate::{self, NewCa, NewKeyType};
use talos_sso_server::ca::{CaWarning, CertificateAuthority, describe_name, format_time, parse_certificates};
use talos_sso_server::cluster::{ClusterError, ClusterWarnings, Clusters, load_clusters};
use talos_sso_server::config::Config;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Backend, TestEnv, TestServer, server_cli};
use talos_sso_tests::material::write_file;
use talos_sso_tests::{openssl, talos_checker};
use time::OffsetDateTime;

const DAY: Duration = Duration::from_secs(86400);

/// The least configuration, with `ca_lines` for cluster `prod` (indented
/// to sit under it), parsed and checked as the server reads its file.
fn parse(ca_lines: &str) -> Result<Config, String> {
    Config::from_yaml(&format!(
        r#"
insecure_http: true
identity:
  issuer: "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0"
  client_id: "11111111-2222-3333-4444-555555555555"
  allowed_tenants: ["72f988bf-86f1-41af-91ab-2d7cd011db47"]
clusters:
  prod:
{ca_lines}
    endpoints: [cp-01.example.internal]
    rules:
      - {{ groups: ["g-admins"], roles: [os:admin] }}
"#
    ))
    .map_err(|e| e.to_string())
}

fn config(ca_lines: &str) -> Config {
    parse(ca_lines).unwrap()
}

/// A CA's files in `dir`: (cert, key).
fn files(dir: &Path, name: &str, ca: &NewCa) -> (String, String) {
    let cert = write_file(dir, &format!("{name}.crt"), &ca.cert_pem, 0o644);
    let key = write_file(dir, &format!("{name}.key"), &ca.key_pem, 0o600);
    (cert.display().to_string(), key.display().to_string())
}

fn client_ca(validity: Duration) -> NewCa {
    generate::new_client_ca(NewKeyType::Ed25519, "prod", validity, OffsetDateTime::now_utc()).unwrap()
}

/// Valid from an hour ago: a test's `now`, taken before it is made, must
/// not fall before its not_before (whole seconds in the certificate).
fn talos_root() -> NewCa {
    generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        3650 * DAY,
        OffsetDateTime::now_utc() - time::Duration::hours(1),
    )
    .unwrap()
}

/// Whole seconds, as RFC 3339 says them in a configuration file.
fn rfc3339(t: OffsetDateTime) -> String {
    format_time(t.replace_nanosecond(0).unwrap())
}

/// `ca`, `next_ca` (from `signs_from`) and, when given, `talos_ca` lines.
fn rotation(
    ca: &(String, String),
    next: &(String, String),
    signs_from: OffsetDateTime,
    talos_ca: Option<&str>,
) -> String {
    let mut lines = format!(
        "    ca: {{ cert_file: \"{}\", key_file: \"{}\" }}\n    next_ca: {{ cert_file: \"{}\", key_file: \"{}\", signs_from: \"{}\" }}\n",
        ca.0,
        ca.1,
        next.0,
        next.1,
        rfc3339(signs_from)
    );
    if let Some(talos_ca) = talos_ca {
        lines.push_str(&format!("    talos_ca: {{ cert_file: \"{talos_ca}\" }}\n"));
    }
    lines
}

fn load(lines: &str, now: OffsetDateTime) -> Result<(Clusters, ClusterWarnings), ClusterError> {
    load_clusters(&config(lines), now)
}

fn refusal(lines: &str) -> String {
    load(lines, OffsetDateTime::now_utc()).unwrap_err().to_string()
}

fn signs_at(clusters: &Clusters, at: OffsetDateTime) -> &CertificateAuthority {
    clusters["prod"].signing_ca(at)
}

#[test]
fn next_ca_signs_from_its_date_and_is_warned_of_once_it_does() {
    let dir = tempfile::tempdir().unwrap();
    let talos = talos_root();
    let talos_file = write_file(dir.path(), "talos.crt", &talos.cert_pem, 0o644);
    let (old, new) = (client_ca(30 * DAY), client_ca(60 * DAY));
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let signs_from = now + 10 * DAY;
    let lines = rotation(
        &files(dir.path(), "old", &old),
        &files(dir.path(), "new", &new),
        signs_from,
        talos_file.to_str(),
    );
    let (clusters, warnings) = load(&lines, now).unwrap();
    let second = time::Duration::seconds(1);
    assert_eq!(signs_at(&clusters, now).signer().der, old.cert.der);
    assert_eq!(
        signs_at(&clusters, signs_from - second).signer().der,
        old.cert.der
    );
    assert_eq!(signs_at(&clusters, signs_from).signer().der, new.cert.der);
    assert_eq!(
        signs_at(&clusters, signs_from + 5 * DAY).signer().der,
        new.cert.der
    );
    // Both talosconfigs trust apid through the same Talos CA.
    let next = &clusters["prod"].next_ca.as_ref().unwrap().ca;
    assert_eq!(next.trust_bundle_pem(), clusters["prod"].ca.trust_bundle_pem());
    let signing = |warnings: &ClusterWarnings| {
        warnings
            .iter()
            .filter(|(_, w)| matches!(w, CaWarning::NextCaSigning { .. }))
            .count()
    };
    assert_eq!(signing(&warnings), 0, "{warnings:?}");
    // Loaded again (a restart, a reload) once the date has passed.
    let (_, warnings) = load(&lines, signs_from + second).unwrap();
    assert_eq!(signing(&warnings), 1, "{warnings:?}");
    assert!(
        warnings.iter().any(|(cluster, w)| cluster == "prod"
            && *w
                == CaWarning::NextCaSigning {
                    since: rfc3339(signs_from)
                }),
        "{warnings:?}"
    );
}

#[test]
fn an_expired_ca_stops_nothing_once_next_ca_signs() {
    let dir = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let talos = talos_root();
    let talos_file = write_file(dir.path(), "talos.crt", &talos.cert_pem, 0o644);
    // ca expired five days ago; next_ca took over seven days ago.
    let made = |days_ago: u32, validity: Duration| {
        generate::new_client_ca(NewKeyType::Ed25519, "prod", validity, now - days_ago * DAY).unwrap()
    };
    let (old, new) = (made(10, 5 * DAY), made(8, 100 * DAY));
    let old_files = files(dir.path(), "old", &old);
    let new_files = files(dir.path(), "new", &new);
    let since = now - 7 * DAY;
    let (clusters, warnings) =
        load(&rotation(&old_files, &new_files, since, talos_file.to_str()), now).unwrap();
    assert_eq!(signs_at(&clusters, now).signer().der, new.cert.der);
    // The old CA's expiry is no news: the warning is to retire it.
    assert_eq!(
        warnings,
        [(
            "prod".to_owned(),
            CaWarning::NextCaSigning {
                since: rfc3339(since)
            }
        )]
    );
    // While it still has to sign, an expired ca is refused.
    let needed = refusal(&rotation(&old_files, &new_files, now + DAY, talos_file.to_str()));
    assert!(needed.contains("CA refused [ca_expired]"), "{needed}");
}

#[test]
fn next_ca_refusals_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let now = OffsetDateTime::now_utc();
    let talos = talos_root();
    let talos_file = write_file(dir.path(), "talos.crt", &talos.cert_pem, 0o644);
    let talos_ca = talos_file.to_str();
    let old = files(dir.path(), "old", &client_ca(30 * DAY));
    let new = files(dir.path(), "new", &client_ca(60 * DAY));

    // The same key again is no rotation.
    let same = refusal(&rotation(&old, &old, now + DAY, talos_ca));
    assert!(same.contains("next_ca has the same key as ca"), "{same}");
    // signs_from outside the next CA's validity, either side.
    for at in [now - DAY, now + 61 * DAY] {
        let outside = refusal(&rotation(&old, &new, at, talos_ca));
        assert!(outside.contains("is outside the next CA's validity"), "{outside}");
    }
    // signs_from after ca expires: nothing would sign in between.
    let late = refusal(&rotation(&old, &new, now + 40 * DAY, talos_ca));
    assert!(late.contains("is after ca expires"), "{late}");
    assert!(load(&rotation(&old, &new, now + 29 * DAY, talos_ca), now).is_ok());

    // Cluster-CA mode: another Talos root is trusted through another CA.
    let (root, other_root) = (talos_root(), talos_root());
    let root_files = files(dir.path(), "root", &root);
    let other = refusal(&rotation(
        &root_files,
        &files(dir.path(), "other-root", &other_root),
        now + DAY,
        None,
    ));
    assert!(
        other.contains("next_ca is not trusted through the same Talos CA as ca"),
        "{other}"
    );
    assert!(other.starts_with("cluster `prod`: "), "{other}");
    // The same root, now through an intermediate: another mode.
    let loaded_root =
        CertificateAuthority::from_pem(&root.cert_pem, &root.key_pem, "root", Vec::new(), now).unwrap();
    let intermediate =
        generate::new_intermediate(&loaded_root, NewKeyType::Ed25519, "talos-sso", 30 * DAY, now).unwrap();
    let mode = refusal(&rotation(
        &root_files,
        &files(dir.path(), "intermediate", &intermediate),
        now + DAY,
        None,
    ));
    assert!(
        mode.contains("next_ca is in intermediate mode, ca in cluster-ca"),
        "{mode}"
    );
    // From one intermediate to another under the same root: a rotation.
    let second =
        generate::new_intermediate(&loaded_root, NewKeyType::Ed25519, "talos-sso 2", 60 * DAY, now).unwrap();
    let intermediates = rotation(
        &files(dir.path(), "intermediate", &intermediate),
        &files(dir.path(), "second", &second),
        now + DAY,
        None,
    );
    let (clusters, _) = load(&intermediates, now).unwrap();
    assert_eq!(signs_at(&clusters, now + DAY).signer().der, second.cert.der);
    // A next_ca that is refused as a CA says so under its own name.
    let root_as_next = refusal(&rotation(&old, &root_files, now + DAY, talos_ca));
    assert!(
        root_as_next.contains("next_ca refused [ca_not_client_only]"),
        "{root_as_next}"
    );
}

#[test]
fn the_sections_of_a_rotation_are_checked_when_the_file_is_read() {
    let ca = "    ca: { cert_file: /c.crt, key_file: /c.key }\n    talos_ca: { cert_file: /t.crt }\n";
    let refused = |extra: &str| parse(&format!("{ca}{extra}")).unwrap_err();
    let keyless = refused("    next_ca: { cert_file: /n.crt, signs_from: \"2027-03-01T09:00:00Z\" }\n");
    assert!(
        keyless.contains("`next_ca` needs cert_file with either key_file or pkcs11"),
        "{keyless}"
    );
    let when = refused("    next_ca: { cert_file: /n.crt, key_file: /n.key, signs_from: \"next monday\" }\n");
    assert!(when.contains("is not an RFC 3339 time"), "{when}");
    let two = parse(
        "    ca: { cert_file: /c.crt, key_file: /c.key }\n    talos_ca: { cert_file: /t.crt, talosconfig: /tc }\n",
    )
    .unwrap_err();
    assert!(two.contains("`talos_ca` needs exactly one of"), "{two}");
    let context = parse(
        "    ca: { cert_file: /c.crt, key_file: /c.key }\n    talos_ca: { cert_file: /t.crt, context: prod }\n",
    )
    .unwrap_err();
    assert!(
        context.contains("`talos_ca.context` goes with `talos_ca.talosconfig`"),
        "{context}"
    );
    let config = parse(&format!(
        "{ca}    next_ca: {{ cert_file: /n.crt, key_file: /n.key, signs_from: \"2027-03-01T09:00:00+01:00\" }}\n"
    ))
    .unwrap();
    let next = config.clusters["prod"].next_ca.as_ref().unwrap();
    assert_eq!(next.signs_from, time::macros::datetime!(2027-03-01 08:00:00 UTC));
}

/// Ask `server` for a certificate on `prod` as [`TestEnv::issue`] does,
/// keeping the key: the status, the JSON body and the key's PEM.
async fn issue_keeping_the_key(
    env: &TestEnv,
    server: &TestServer,
    token: &str,
) -> (u16, serde_json::Value, String) {
    let key = talos_sso::key::ClientKey::generate().unwrap();
    let response = env
        .http
        .post(format!("{}/v1/certificates", server.base_url))
        .bearer_auth(token)
        .json(&serde_json::json!({"cluster": "prod", "csr": key.csr_pem().unwrap()}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.json().await.unwrap(),
        key.private_key_pem().as_str().to_owned(),
    )
}

/// The cluster `prod` of the test server, in accepted-CA mode: signed by
/// `old` until `signs_from`, by `new` from then on; the Talos CA is the
/// work folder's root.
fn accepted_mode(
    yaml: &str,
    old: &(String, String),
    new: &(String, String),
    signs_from: OffsetDateTime,
) -> String {
    let start = yaml.find("    ca: { cert_file:").unwrap();
    let end = start + yaml[start..].find('\n').unwrap() + 1;
    let ca_line = &yaml[start..end];
    let talos_ca = ca_line.split('"').nth(1).unwrap().to_owned();
    yaml.replacen(ca_line, &rotation(old, new, signs_from, Some(&talos_ca)), 1)
}

/// The wall clock, moved ahead by a number of seconds.
#[derive(Debug, Default)]
struct SteppedClock {
    ahead: AtomicI64,
}

impl Clock for SteppedClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + time::Duration::seconds(self.ahead.load(Ordering::SeqCst))
    }
}

#[tokio::test]
async fn a_running_server_switches_to_next_ca_at_signs_from() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (client_ca(30 * DAY), client_ca(60 * DAY));
    let (old_files, new_files) = (files(dir.path(), "old", &old), files(dir.path(), "new", &new));
    let config_file = dir.path().join("config.yaml");
    // Two minutes on: ahead of the start, however slow, and near enough
    // that the server's clock moved past it stays within the five minutes
    // leaves are backdated by, so that the handshake (at the real time)
    // takes them.
    let signs_from = (OffsetDateTime::now_utc() + Duration::from_secs(120))
        .replace_nanosecond(0)
        .unwrap();
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let yaml = accepted_mode(&yaml, &old_files, &new_files, signs_from);
        std::fs::write(&config_file, &yaml).unwrap();
        yaml
    })
    .await;
    // The same configuration served with a clock that can be moved on.
    let clock = Arc::new(SteppedClock::default());
    let server = TestServer::start_with_clock(env.config(), clock.clone()).await;
    let talos_ca = std::fs::read_to_string(&env.work.ca_cert).unwrap();
    let issued_by = |body: &serde_json::Value| {
        let leaf = parse_certificates(body["certificate"].as_str().unwrap(), "leaf")
            .unwrap()
            .remove(0);
        let signer = [&old, &new].iter().position(|ca| {
            leaf.verify_signed_by(ca.cert.spki()).is_ok() && leaf.raw_issuer == ca.cert.raw_subject
        });
        (signer, body["ca"].as_str().unwrap().to_owned())
    };
    let token = || {
        env.emulator
            .token_for("bob@example.com", TokenKind::id())
            .unwrap()
    };
    // Talos's client CA pool: machine.ca, then machine.acceptedCAs.
    let apid_accepting = |listed: &[&NewCa]| {
        let pems: Vec<&str> = listed.iter().map(|ca| ca.cert_pem.as_str()).collect();
        format!("{talos_ca}{}", pems.concat())
    };

    let (status, before, key) = issue_keeping_the_key(&env, &server, &token()).await;
    assert_eq!(status, 201, "{before}");
    // The talosconfig `ca` is the Talos CA, whichever client CA signs.
    assert_eq!(issued_by(&before), (Some(0), talos_ca.clone()));
    let certificate = before["certificate"].as_str().unwrap();
    assert!(talos_checker::handshake(&apid_accepting(&[&old]), certificate, &key).is_ok());

    // `check` says the mode and when the next CA takes over.
    let checked = server_cli(&["check", "--config", config_file.to_str().unwrap()])
        .await
        .unwrap();
    for expected in [
        format!(
            "cluster prod: accepted-ca mode, CA {} (",
            describe_name(&old.cert.raw_subject)
        ),
        "cluster prod: talosconfigs verify apid with O=talos; Talos must list the CA in machine.acceptedCAs"
            .to_owned(),
        format!(
            "cluster prod: next CA {} (59 days left) signs from {}\n",
            describe_name(&new.cert.raw_subject),
            rfc3339(signs_from)
        ),
    ] {
        assert!(checked.contains(&expected), "missing {expected:?} in\n{checked}");
    }
    assert!(!checked.contains("next_ca signs since"), "{checked}");
    let readyz: serde_json::Value = env
        .http
        .get(format!("{}/readyz", server.base_url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        readyz["trust_modes"],
        serde_json::json!({"prod": "accepted-ca"}),
        "{readyz}"
    );

    // Past signs_from, the next CA signs, with nothing reloaded.
    clock.ahead.store(180, Ordering::SeqCst);
    let (status, after, key) = issue_keeping_the_key(&env, &server, &token()).await;
    assert_eq!(status, 201, "{after}");
    assert_eq!(issued_by(&after), (Some(1), talos_ca.clone()));
    // A Talos node that lists both accepts it; one still listing only the
    // old CA does not (the overlap a rotation needs).
    let certificate = after["certificate"].as_str().unwrap();
    let accepted = talos_checker::handshake(&apid_accepting(&[&old, &new]), certificate, &key).unwrap();
    assert_eq!(accepted.roles, ["os:operator"]);
    assert!(talos_checker::handshake(&apid_accepting(&[&old]), certificate, &key).is_err());
    // OpenSSL's opinion: a client certificate of the new CA, not of the old.
    openssl::verify_client_certificate(&new.cert_pem, certificate, "").unwrap();
    assert!(openssl::verify_client_certificate(&old.cert_pem, certificate, "").is_err());

    // `check` once the date has passed (a configuration saying so).
    let passed = (OffsetDateTime::now_utc() - Duration::from_secs(60))
        .replace_nanosecond(0)
        .unwrap();
    let text = std::fs::read_to_string(&config_file)
        .unwrap()
        .replace(&rfc3339(signs_from), &rfc3339(passed));
    let passed_file = write_file(dir.path(), "passed.yaml", &text, 0o600);
    let checked = server_cli(&["check", "--config", passed_file.to_str().unwrap()])
        .await
        .unwrap();
    // The CA that signs now leads the cluster's line (the new one lives 60
    // days, the old 30; their subjects name the same day).
    assert!(
        checked.contains(&format!(
            "cluster prod: accepted-ca mode, CA {} (59 days left)",
            describe_name(&new.cert.raw_subject)
        )),
        "{checked}"
    );
    assert!(
        checked.contains(&format!("signs from {} (now)", rfc3339(passed)))
            && checked.contains(&format!(
                "warning: cluster prod: next_ca signs since {}",
                rfc3339(passed)
            )),
        "{checked}"
    );
    server.stop().await;
    env.finish().await;
}

#[tokio::test]
async fn break_glass_during_a_rotation_says_which_ca_signed() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (client_ca(30 * DAY), client_ca(60 * DAY));
    let (old_files, new_files) = (files(dir.path(), "old", &old), files(dir.path(), "new", &new));
    let config_file = dir.path().join("config.yaml");
    // The next CA took over a minute ago.
    let signs_from = (OffsetDateTime::now_utc() - Duration::from_secs(60))
        .replace_nanosecond(0)
        .unwrap();
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let yaml = accepted_mode(&yaml, &old_files, &new_files, signs_from);
        std::fs::write(&config_file, &yaml).unwrap();
        yaml
    })
    .await;
    let out = dir.path().join("break-glass.yaml");
    let done = talos_sso_tests::harness::break_glass_admin(
        config_file.to_str().unwrap(),
        "Entra outage INC-4712",
        &out,
    )
    .await
    .unwrap();
    let signed_by = format!(
        "{} (sha256 {})",
        describe_name(&new.cert.raw_subject),
        new.cert.sha256_fingerprint()
    );
    assert!(
        done.contains(&format!("signed by {signed_by}, accepted-ca mode")),
        "{done}"
    );

    // The talosconfig: apid verified with the Talos CA, the certificate
    // the next CA's, taken by a node that lists it.
    let talosconfig: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let field = |name: &str| {
        use base64::Engine;
        let text = talosconfig["contexts"]["prod-break-glass"][name]
            .as_str()
            .unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(text).unwrap()).unwrap()
    };
    let talos_ca = std::fs::read_to_string(&env.work.ca_cert).unwrap();
    assert_eq!(field("ca"), talos_ca);
    let leaf = parse_certificates(&field("crt"), "crt").unwrap().remove(0);
    leaf.verify_signed_by(new.cert.spki()).unwrap();
    let apid = format!("{talos_ca}{}{}", old.cert_pem, new.cert_pem);
    let accepted = talos_checker::handshake(&apid, &field("crt"), &field("key")).unwrap();
    assert_eq!(accepted.roles, ["os:admin"]);

    // The audit record says the same.
    let rows = env.server.app.audit.store().page(0, 10_000).await.unwrap();
    let record = &rows.last().unwrap().record;
    assert_eq!(record.event, "break_glass.issued");
    assert_eq!(record.details["signed_by"], signed_by.as_str());
    assert_eq!(record.details["trust_mode"], "accepted-ca");
    env.finish().await;
}
