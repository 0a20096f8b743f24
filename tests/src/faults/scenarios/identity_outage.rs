//! The identity provider unreachable or slow: what the server answers,
//! what it records, and that it recovers.

use std::time::{Duration, Instant};

use super::{CLIENT_TIMEOUT, blocking, readyz};
use crate::emulator::{EmulatorConfig, EmulatorHandle};
use crate::faults::{Report, ServerProcess, audit_verify, server_binary, write_server_config};
use crate::harness::Workdir;

/// One request's answer and how long it took.
#[derive(Debug)]
struct Answer {
    status: u16,
    code: Option<String>,
    serial: Option<String>,
    took: Duration,
}

impl Answer {
    fn label(&self) -> String {
        match &self.code {
            Some(code) => format!("{} {code}", self.status),
            None => self.status.to_string(),
        }
    }
}

async fn ask(http: &reqwest::Client, url: &str, token: &str) -> Answer {
    let csr = talos_sso::key::ClientKey::generate()
        .and_then(|k| k.csr_pem())
        .expect("csr");
    let started = Instant::now();
    let response = http
        .post(format!("{url}/v1/certificates"))
        .bearer_auth(token)
        .json(&serde_json::json!({"cluster": "prod", "csr": csr}))
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            Answer {
                status,
                code: body["code"].as_str().map(str::to_owned),
                serial: body["serial"].as_str().map(str::to_owned),
                took: started.elapsed(),
            }
        }
        Err(error) => Answer {
            status: 0,
            code: Some(format!("no answer: {error}")),
            serial: None,
            took: started.elapsed(),
        },
    }
}

/// `token` with its header's `kid` replaced: a key the server has never
/// seen (the server looks the key up before it checks the signature).
fn with_unknown_kid(token: &str, kid: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (header, rest) = token.split_once('.').expect("JWT");
    let mut header: serde_json::Value =
        serde_json::from_slice(&b64.decode(header).expect("header")).expect("header JSON");
    header["kid"] = serde_json::json!(kid);
    format!("{}.{rest}", b64.encode(header.to_string()))
}

/// The trail's records after `after`.
async fn records_since(
    database_url: &str,
    after: i64,
) -> Result<Vec<talos_sso_server::audit::StoredRecord>, String> {
    let store = talos_sso_server::audit::store::AuditStore::connect(database_url, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let records = store.page(after, 10_000).await.map_err(|e| e.to_string());
    store.close().await;
    records
}

/// The server's outbound timeout to the identity provider and to Graph
/// (`identity::provider`, `identity::issuer::entra`): fixed at 10 s.
pub const OUTBOUND_TIMEOUT: Duration = Duration::from_secs(10);

/// Scenarios 4 and 5: the identity provider (keys, token endpoint, Graph)
/// answering 503, refusing connections, and answering only after `slow`;
/// for a person whose keys are cached, for a token naming an unknown key,
/// and for a person whose groups must come from Graph (overage).
pub async fn identity_outage(slow: Duration) -> Result<Report, String> {
    use crate::emulator::{Faults, TokenKind};
    let mut report = Report::new("identity-provider-outage");
    let binary = server_binary()?;
    let port = crate::faults::free_port()?;
    // One overage user per phase: Graph answers are cached for a minute,
    // so a person resolved before the outage would still get through.
    let mut users = crate::emulator::demo_users();
    for n in 0..3 {
        let mut user = crate::emulator::TestUser::new(
            &format!("c3000000-0000-4000-8000-00000000000{n}"),
            &format!("overage-{n}@example.com"),
            "Overage User",
            &[crate::emulator::GROUP_ONCALL],
            &[],
        );
        user.overage = true;
        users.push(user);
    }
    let emulator = EmulatorHandle::start(EmulatorConfig {
        public_url: Some(format!("http://127.0.0.1:{port}")),
        users,
        ..Default::default()
    })
    .await
    .map_err(|e| e.to_string())?;
    let proxy = crate::faults::TcpProxy::start_on(port, emulator.address).await?;
    let work = Workdir::new();
    let database_url = format!("sqlite://{}", work.path().join("audit.db").display());
    let (config, url) = write_server_config(&emulator, &work, &database_url, "server.yaml", |t| {
        // Every unknown-kid probe below may refresh (the default is 5 min).
        t.replacen("identity:\n", "identity:\n  jwks_min_refresh_interval: 1s\n", 1)
    })?;
    let mut server = ServerProcess::spawn(&binary, &config, &url, Duration::from_secs(30)).await?;
    let http = reqwest::Client::builder()
        .timeout(CLIENT_TIMEOUT * 2)
        .build()
        .map_err(|e| e.to_string())?;
    let token = |user: &str| emulator.token_for(user, TokenKind::id()).expect("token");
    let bound = OUTBOUND_TIMEOUT + Duration::from_secs(1);
    let mut longest = Duration::ZERO;

    let bob = ask(&http, &url, &token("bob@example.com")).await;
    let erin = ask(&http, &url, &token("erin@example.com")).await;
    report.expect(
        bob.status == 201 && erin.status == 201,
        format!(
            "provider up: bob {}, erin (overage, groups from Graph) {}",
            bob.label(),
            erin.label()
        ),
    );

    let phases: [(&str, Faults, bool); 3] = [
        (
            "keys and Graph answer 503",
            Faults {
                jwks_unavailable: true,
                graph_unavailable: true,
                ..Default::default()
            },
            false,
        ),
        ("connections refused", Faults::default(), true),
        (
            "every answer after the delay",
            Faults {
                delay: slow,
                ..Default::default()
            },
            false,
        ),
    ];
    for (n, (name, faults, refuse)) in phases.into_iter().enumerate() {
        let name = if faults.delay.is_zero() {
            name.to_owned()
        } else {
            format!("{name} ({:.0} s)", slow.as_secs_f64())
        };
        // Let the previous phase's refresh attempt age past the interval.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let seq_before = records_since(&database_url, 0).await?.last().map_or(0, |r| r.seq);
        emulator.set_faults(faults);
        if refuse {
            proxy.down();
        }
        // At once and together: a cached key, two unknown kids, an overage user.
        let tokens = [
            token("bob@example.com"),
            with_unknown_kid(&token("carol@example.com"), &format!("unknown-{n}-a")),
            with_unknown_kid(&token("carol@example.com"), &format!("unknown-{n}-b")),
            token(&format!("overage-{n}@example.com")),
        ];
        let (cached, unknown_a, unknown_b, overage) = tokio::join!(
            ask(&http, &url, &tokens[0]),
            ask(&http, &url, &tokens[1]),
            ask(&http, &url, &tokens[2]),
            ask(&http, &url, &tokens[3]),
        );
        let (ready_status, ready_body) = readyz(&url).await;
        report.expect(
            ready_body.contains("\"identity_provider_reachable\":false"),
            format!("{name}: /readyz says the provider is unreachable"),
        );
        emulator.set_faults(Faults::default());
        if refuse {
            proxy.up().await?;
        }
        report.say(format!(
            "{name}: cached key {} in {:.2} s; unknown kids {} in {:.2} s and {} in {:.2} s; \
             overage user {} in {:.2} s; /readyz {ready_status} {ready_body}",
            cached.label(),
            cached.took.as_secs_f64(),
            unknown_a.label(),
            unknown_a.took.as_secs_f64(),
            unknown_b.label(),
            unknown_b.took.as_secs_f64(),
            overage.label(),
            overage.took.as_secs_f64(),
        ));
        report.expect(
            cached.status == 201,
            format!("{name}: the cached key keeps working"),
        );
        report.expect(
            [&unknown_a, &unknown_b]
                .iter()
                .all(|a| a.label() == "401 token_key_unknown"),
            format!("{name}: unknown kids are refused with 401 token_key_unknown"),
        );
        report.expect(
            overage.label() == "403 groups_overage_unresolved",
            format!("{name}: the overage user is refused with 403 groups_overage_unresolved"),
        );
        for answer in [&cached, &unknown_a, &unknown_b, &overage] {
            longest = longest.max(answer.took);
        }
        report.expect(
            [&cached, &unknown_a, &unknown_b, &overage]
                .iter()
                .all(|a| a.took <= bound),
            format!("{name}: every answer within the outbound timeout (+1 s): {bound:?}"),
        );
        let records = records_since(&database_url, seq_before).await?;
        let issued: Vec<_> = records
            .iter()
            .filter(|r| r.record.event == "certificate.issued")
            .collect();
        let overage_rows: Vec<_> = records
            .iter()
            .filter(|r| r.record.username.as_deref() == Some(format!("overage-{n}@example.com").as_str()))
            .collect();
        report.expect(
            issued.len() == 1 && issued[0].record.serial == cached.serial,
            format!(
                "{name}: one certificate issued (the cached key's), {} records",
                records.len()
            ),
        );
        report.expect(
            overage_rows.len() == 1
                && overage_rows[0].record.event == "certificate.denied"
                && overage_rows[0].record.reason_code.as_deref() == Some("groups_overage_unresolved"),
            format!(
                "{name}: one audit record for the overage user, a denial: {:?}",
                records
                    .iter()
                    .map(|r| (r.seq, &r.record.event, &r.record.reason_code, &r.record.username))
                    .collect::<Vec<_>>()
            ),
        );
    }
    report.say(format!(
        "longest answer during the outages: {:.2} s (outbound timeout {:?})",
        longest.as_secs_f64(),
        OUTBOUND_TIMEOUT
    ));

    // Back: a rotated key is fetched, Graph answers again.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let rotated = emulator.rotate_keys().ok_or("no spare key")?;
    let bob = ask(&http, &url, &token("bob@example.com")).await;
    let erin = ask(&http, &url, &token("overage-0@example.com")).await;
    report.expect(
        bob.status == 201 && erin.status == 201,
        format!(
            "provider back: a token under the new key {rotated} {}, erin {}",
            bob.label(),
            erin.label()
        ),
    );
    let (ready_status, _) = readyz(&url).await;
    report.expect(
        ready_status == 200,
        format!("/readyz after recovery: {ready_status}"),
    );
    report.expect(server.still_running(), "the same server process throughout");
    let verify = {
        let (binary, config) = (binary.clone(), config.clone());
        blocking(move || audit_verify(&binary, &config)).await
    };
    match verify {
        Ok(text) => report.expect(
            text.contains("audit chain intact"),
            format!("`audit verify`: {}", text.trim()),
        ),
        Err(error) => report.expect(false, format!("`audit verify`: {error}")),
    }
    server.kill();
    Ok(report)
}
