//! The hostile-input matrix (docs/evidence/reliability.md, section 4): the inputs an
//! attacker (or a broken client, proxy or operator) would send, one group
//! per test, each case named by its label in the table and in every
//! assertion message. For each case the exact answer is asserted: the HTTP
//! status and problem `code` (or, for files, the error and its code), and
//! that nothing was issued: no certificate in the body and no
//! `certificate.issued` record. The few inputs that must succeed (claims a
//! CSR makes that the server ignores, an unusual but valid request) are
//! cases too, with what makes them harmless asserted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use talos_sso::key::ClientKey;
use talos_sso::talosconfig::{self, ContextEntry, TalosconfigError};
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::cli::{Cli, run};
use talos_sso_server::x509::{self, ParsedCertificate, oid};
use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle, TokenKind};
use talos_sso_tests::harness::{Answer, Backend, TestEnv, Workdir, config_yaml};
use talos_sso_tests::material::{fixture, read_fixture, write_file};
use time::OffsetDateTime;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use clap::Parser;

const BOB: &str = "bob@example.com";
const BOB_OID: &str = "b2000000-0000-4000-8000-000000000002";

/// The certificates issued so far, as the trail records them.
async fn issued(env: &TestEnv) -> usize {
    env.server
        .app
        .audit
        .store()
        .page(0, 100_000)
        .await
        .unwrap()
        .iter()
        .filter(|r| r.record.event == "certificate.issued")
        .count()
}

/// Assert that `answer` is the refusal `(status, code)` as a problem body
/// without a certificate; `label` names the case.
fn assert_refused(label: &str, answer: &Answer, status: u16, code: &str) {
    assert_eq!(
        (answer.status, answer.code()),
        (status, Some(code)),
        "{label}: {}",
        answer.body
    );
    assert_eq!(
        answer.content_type, "application/problem+json",
        "{label}: every refusal is a problem"
    );
    assert!(
        answer.body.get("certificate").is_none(),
        "{label}: a certificate in a refusal"
    );
}

/// POST `body` to `/v1/certificates` with an `Authorization` header of
/// exactly these bytes (none when `None`) and the extra headers.
async fn post_raw(
    env: &TestEnv,
    authorization: Option<&[u8]>,
    headers: &[(&str, &[u8])],
    body: Vec<u8>,
) -> Answer {
    let mut request = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .body(body);
    if let Some(value) = authorization {
        request = request.header(
            "authorization",
            reqwest::header::HeaderValue::from_bytes(value).unwrap(),
        );
    }
    for (name, value) in headers {
        request = request.header(*name, reqwest::header::HeaderValue::from_bytes(value).unwrap());
    }
    Answer::read(request.send().await.unwrap()).await
}

fn b64(text: &str) -> String {
    URL_SAFE_NO_PAD.encode(text)
}

fn bearer(token: &str) -> Vec<u8> {
    format!("Bearer {token}").into_bytes()
}

fn certificate_body(csr: &str) -> Vec<u8> {
    json!({"cluster": "prod", "csr": csr}).to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_refused_each_with_its_code() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let emulator = &env.emulator;
    let claims = |patch: Value| emulator.claims_with(BOB, TokenKind::id(), patch).unwrap();
    let token = |patch: Value| emulator.token_with(BOB, TokenKind::id(), patch).unwrap();
    let kid = emulator.current_kid().unwrap();
    let signed_under = |header: Value, body: &Value| emulator.sign_with_header(header, body).unwrap();
    let good = token(json!({}));
    let parts: Vec<&str> = good.split('.').collect();
    let (head, payload) = (parts[0], parts[1]);
    let other_signature = token(json!({})).rsplit('.').next().unwrap().to_owned();
    let hs256 = {
        // HS256 "signed" with the provider's public key as the secret: the
        // classic confusion of a verifier that takes the algorithm from the
        // token.
        let header = b64(&json!({"alg": "HS256", "typ": "JWT", "kid": kid}).to_string());
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &emulator.current_public_key().unwrap());
        let input = format!("{header}.{payload}");
        let tag = ring::hmac::sign(&key, input.as_bytes());
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    };
    let forged_payload = b64(&claims(json!({"oid": "a1000000-0000-4000-8000-000000000001"})).to_string());

    // (label, Authorization header or none, status, code)
    let cases: Vec<(&str, Option<Vec<u8>>, u16, &str)> = vec![
        ("no Authorization header", None, 401, "token_missing"),
        (
            "empty bearer token",
            Some(b"Bearer ".to_vec()),
            401,
            "token_missing",
        ),
        (
            "Basic credentials",
            Some(b"Basic Ym9iOmh1bnRlcjI=".to_vec()),
            401,
            "token_missing",
        ),
        (
            "scheme without a token",
            Some(b"Bearer".to_vec()),
            401,
            "token_missing",
        ),
        ("not a JWT", Some(bearer("not-a-jwt")), 401, "token_malformed"),
        (
            "two parts",
            Some(bearer(&format!("{head}.{payload}"))),
            401,
            "token_malformed",
        ),
        (
            "10,000 segments",
            Some(bearer(&".".repeat(9999))),
            401,
            "token_malformed",
        ),
        (
            "20 KiB token",
            Some(bearer(&format!("{head}.{}.x", "A".repeat(20 * 1024)))),
            401,
            "token_malformed",
        ),
        (
            "header not base64url",
            Some(bearer(&format!("!!!.{payload}.sig"))),
            401,
            "token_malformed",
        ),
        (
            "header not JSON",
            Some(bearer(&format!("{}.{payload}.sig", b64("hello")))),
            401,
            "token_malformed",
        ),
        (
            "header JSON an array",
            Some(bearer(&format!("{}.{payload}.sig", b64("[1,2]")))),
            401,
            "token_malformed",
        ),
        (
            "header JSON a string",
            Some(bearer(&format!("{}.{payload}.sig", b64("\"RS256\"")))),
            401,
            "token_malformed",
        ),
        (
            "alg none",
            Some(bearer(&format!(
                "{}.{payload}.",
                b64(&json!({"alg": "none", "typ": "JWT", "kid": kid}).to_string())
            ))),
            401,
            "token_algorithm_not_allowed",
        ),
        (
            "no alg",
            Some(bearer(&format!(
                "{}.{payload}.{other_signature}",
                b64(&json!({"kid": kid}).to_string())
            ))),
            401,
            "token_algorithm_not_allowed",
        ),
        (
            "alg HS256 keyed with the provider's public key",
            Some(bearer(&hs256)),
            401,
            "token_algorithm_not_allowed",
        ),
        (
            "alg RS512",
            Some(bearer(&format!(
                "{}.{payload}.{other_signature}",
                b64(&json!({"alg": "RS512", "kid": kid}).to_string())
            ))),
            401,
            "token_algorithm_not_allowed",
        ),
        (
            "alg ES256 on the provider's RSA key",
            Some(bearer(&signed_under(
                json!({"alg": "ES256", "kid": kid}),
                &claims(json!({})),
            ))),
            401,
            "token_algorithm_not_allowed",
        ),
        (
            "crit header",
            Some(bearer(&signed_under(
                json!({"alg": "RS256", "kid": kid, "crit": ["exp"]}),
                &claims(json!({})),
            ))),
            401,
            "token_malformed",
        ),
        (
            "no kid",
            Some(bearer(&signed_under(json!({"alg": "RS256"}), &claims(json!({}))))),
            401,
            "token_malformed",
        ),
        (
            "kid a number",
            Some(bearer(&signed_under(
                json!({"alg": "RS256", "kid": 5}),
                &claims(json!({})),
            ))),
            401,
            "token_malformed",
        ),
        (
            "unknown kid",
            Some(bearer(&signed_under(
                json!({"alg": "RS256", "kid": "rotated-away-long-ago"}),
                &claims(json!({})),
            ))),
            401,
            "token_key_unknown",
        ),
        (
            "payload changed after signing",
            Some(bearer(&format!("{head}.{forged_payload}.{}", parts[2]))),
            401,
            "token_signature_invalid",
        ),
        (
            "signature of another token",
            Some(bearer(&format!("{head}.{payload}.{other_signature}"))),
            401,
            "token_signature_invalid",
        ),
        (
            "empty signature",
            Some(bearer(&format!("{head}.{payload}."))),
            401,
            "token_signature_invalid",
        ),
        (
            "signature not base64url",
            Some(bearer(&format!("{head}.{payload}.!!!"))),
            401,
            "token_malformed",
        ),
        (
            "payload JSON an array, signed",
            Some(bearer(&signed_under(
                json!({"alg": "RS256", "kid": kid}),
                &json!([1, 2]),
            ))),
            401,
            "token_malformed",
        ),
        (
            "expired an hour ago",
            Some(bearer(&token(
                json!({"iat": now - 7200, "nbf": now - 7200, "exp": now - 3600}),
            ))),
            401,
            "token_expired",
        ),
        (
            "nbf an hour ahead",
            Some(bearer(&token(json!({"nbf": now + 3600})))),
            401,
            "token_not_yet_valid",
        ),
        (
            "iat an hour ahead",
            Some(bearer(&token(json!({"iat": now + 3600, "nbf": now})))),
            401,
            "token_issued_in_future",
        ),
        (
            "no exp",
            Some(bearer(&token(json!({"exp": null})))),
            401,
            "token_malformed",
        ),
        (
            "exp a string",
            Some(bearer(&token(json!({"exp": "never"})))),
            401,
            "token_malformed",
        ),
        (
            "exp after the year 9999",
            Some(bearer(&token(json!({"exp": 300_000_000_000i64})))),
            401,
            "token_malformed",
        ),
        (
            "wrong aud",
            Some(bearer(&token(json!({"aud": "api://someone-else"})))),
            401,
            "token_audience_invalid",
        ),
        (
            "aud a list without ours",
            Some(bearer(&token(json!({"aud": ["a", "b"]})))),
            401,
            "token_audience_invalid",
        ),
        (
            "wrong iss",
            Some(bearer(&token(json!({"iss": "https://evil.example/v2.0"})))),
            401,
            "token_issuer_untrusted",
        ),
        (
            "iss of another tenant at the same provider",
            Some(bearer(&token(json!({
                "iss": format!("{}/00000000-0000-0000-0000-000000000000/v2.0", emulator.base_url)
            })))),
            401,
            "token_issuer_untrusted",
        ),
        (
            "no iss",
            Some(bearer(&token(json!({"iss": null})))),
            401,
            "token_malformed",
        ),
        (
            "tid of another tenant",
            Some(bearer(&token(
                json!({"tid": "00000000-0000-0000-0000-000000000000"}),
            ))),
            401,
            "token_tenant_not_allowed",
        ),
        (
            "no tid",
            Some(bearer(&token(json!({"tid": null})))),
            401,
            "token_tenant_missing",
        ),
        (
            "no oid",
            Some(bearer(&token(json!({"oid": null})))),
            401,
            "token_subject_missing",
        ),
        (
            "empty oid",
            Some(bearer(&token(json!({"oid": ""})))),
            401,
            "token_subject_missing",
        ),
        (
            "azp of another app",
            Some(bearer(&token(json!({"azp": "another-app"})))),
            401,
            "token_client_invalid",
        ),
    ];
    for (label, authorization, status, code) in &cases {
        let before = issued(&env).await;
        let answer = post_raw(&env, authorization.as_deref(), &[], certificate_body(&csr)).await;
        assert_refused(label, &answer, *status, code);
        assert_eq!(issued(&env).await, before, "{label}: nothing issued");
    }

    // "token used twice": the second use is refused, and nothing more is issued.
    let once = token(json!({}));
    let first = post_raw(&env, Some(&bearer(&once)), &[], certificate_body(&csr)).await;
    assert_eq!(first.status, 201, "token used twice (first use): {}", first.body);
    let second = post_raw(&env, Some(&bearer(&once)), &[], certificate_body(&csr)).await;
    assert_refused("token used twice", &second, 401, "token_replayed");
    assert_eq!(issued(&env).await, 1, "token used twice: one certificate");

    // Claims Entra tokens carry that this server does not rely on: without
    // `sub` the subject is still `oid`; without `preferred_username` the
    // username falls back to the subject (no configured username claim).
    let no_sub = post_raw(
        &env,
        Some(&bearer(&token(json!({"sub": null})))),
        &[],
        certificate_body(&csr),
    )
    .await;
    assert_eq!(no_sub.status, 201, "no sub: {}", no_sub.body);
    assert_eq!(no_sub.body["identity"]["subject"], BOB_OID, "no sub");
    let no_name = post_raw(
        &env,
        Some(&bearer(&token(json!({"preferred_username": null})))),
        &[],
        certificate_body(&csr),
    )
    .await;
    assert_eq!(no_name.status, 201, "no preferred_username: {}", no_name.body);
    assert_eq!(
        no_name.body["identity"]["username"], BOB_OID,
        "no preferred_username"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_and_other_headers() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let token = || env.emulator.token_for(BOB, TokenKind::id()).unwrap();

    // Two Authorization headers: a proxy in front may read the other one.
    for (label, first, second) in [
        (
            "two Authorization headers, the good one first",
            token(),
            "junk".to_owned(),
        ),
        (
            "two Authorization headers, the good one last",
            "junk".to_owned(),
            token(),
        ),
        ("two Authorization headers, both good", token(), token()),
    ] {
        let response = env
            .http
            .post(format!("{}/v1/certificates", env.server.base_url))
            .header("authorization", format!("Bearer {first}"))
            .header("authorization", format!("Bearer {second}"))
            .body(certificate_body(&csr))
            .send()
            .await
            .unwrap();
        assert_refused(label, &Answer::read(response).await, 401, "token_malformed");
    }
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "bearer token of non-ASCII bytes",
            b"Bearer \xff\xfe\x80".to_vec(),
            401,
            "token_malformed",
        ),
        (
            "bearer token with non-ASCII in a good token",
            format!("Bearer {}\u{e9}", token()).into_bytes(),
            401,
            "token_malformed",
        ),
        (
            "64 KiB Authorization header",
            bearer(&"A".repeat(64 * 1024)),
            401,
            "token_malformed",
        ),
    ];
    for (label, authorization, status, code) in &cases {
        let answer = post_raw(&env, Some(authorization), &[], certificate_body(&csr)).await;
        assert_refused(label, &answer, *status, code);
    }
    // A request id that is not well-formed is replaced by one of ours.
    let response = env
        .http
        .post(format!("{}/v1/certificates", env.server.base_url))
        .header("x-request-id", format!("bad id {}", "x".repeat(300)))
        .body(certificate_body(&csr))
        .send()
        .await
        .unwrap();
    let sent_id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    let refused = Answer::read(response).await;
    assert_refused("X-Request-Id not well-formed", &refused, 401, "token_missing");
    assert!(
        sent_id.len() == 32 && sent_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "X-Request-Id not well-formed: {sent_id}"
    );
    assert_eq!(
        refused.body["request_id"],
        json!(sent_id),
        "X-Request-Id not well-formed"
    );
    assert_eq!(issued(&env).await, 0, "no header above issued anything");

    // X-Forwarded-For from a peer that is no trusted proxy is ignored.
    let spoofed = post_raw(
        &env,
        Some(&bearer(&token())),
        &[("x-forwarded-for", b"6.6.6.6, 10.0.0.1")],
        certificate_body(&csr),
    )
    .await;
    assert_eq!(
        spoofed.status, 201,
        "X-Forwarded-For from an untrusted peer: {}",
        spoofed.body
    );
    let rows = env.server.app.audit.store().page(0, 1000).await.unwrap();
    let record = &rows.last().unwrap().record;
    assert_eq!(
        record.client_ip.as_deref(),
        Some("127.0.0.1"),
        "X-Forwarded-For from an untrusted peer"
    );

    // What hyper refuses before the router: no body, the connection closed.
    let addr = address(&env.server.base_url);
    let many_headers: String = (0..200).map(|i| format!("X-H{i}: v\r\n")).collect();
    for (label, request, status) in [
        (
            "1 MiB Authorization header",
            format!(
                "GET /v1/info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
                "a".repeat(1024 * 1024)
            )
            .into_bytes(),
            431,
        ),
        (
            "200 header fields",
            format!("GET /v1/info HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(),
            431,
        ),
        (
            "NUL in a header value",
            b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n".to_vec(),
            400,
        ),
        (
            "folded header line",
            b"GET /v1/info HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n".to_vec(),
            400,
        ),
        (
            "space before the colon",
            b"GET /v1/info HTTP/1.1\r\nHost : x\r\n\r\n".to_vec(),
            400,
        ),
    ] {
        exchange(&addr, &request).await.assert(label, status, None);
    }
    env.finish().await;
}

/// The test server's `host:port`.
fn address(base_url: &str) -> String {
    base_url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .to_owned()
}

/// An answer read off the socket.
struct Reply {
    status: Option<u16>,
    head: String,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// Assert the status and, when `code` is given, that the body is the
    /// problem with that code. Without a code: an error hyper answered
    /// itself (no body), or for 200 the `/v1/info` every success here asks
    /// for.
    fn assert(&self, label: &str, status: u16, code: Option<&str>) {
        assert_eq!(self.status, Some(status), "{label}: {}", self.head);
        match code {
            Some(code) => {
                assert_eq!(self.json()["code"], code, "{label}: {}", self.head);
                assert_eq!(
                    self.header("content-type").as_deref(),
                    Some("application/problem+json"),
                    "{label}"
                );
            }
            None if status >= 400 => assert!(self.body.is_empty(), "{label}"),
            None => assert_eq!(self.json()["api_version"], 1, "{label}"),
        }
    }

    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim().to_owned())
        })
    }
}

/// Send `bytes` on a new connection and read until the server closes it
/// (every request here asks for that, or is one hyper refuses), for at
/// most 10 seconds.
async fn exchange(addr: &str, bytes: &[u8]) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything.
    let _ = stream.write_all(bytes).await;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server closed the connection within 10 s");
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .unwrap_or(out.len());
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|_| head.starts_with("HTTP/"));
    Reply {
        status,
        head,
        body: out[split..].to_vec(),
    }
}

/// A PEM CSR from the OpenSSL fixtures.
fn fixture_csr(name: &str) -> String {
    read_fixture(&format!("openssl/{name}.csr"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csrs_are_refused_with_their_reason_or_their_claims_ignored() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let key = ClientKey::generate().unwrap();
    let good = key.csr_pem().unwrap();
    let der = key.csr_der().unwrap();
    let pem = |der: &[u8]| x509::pem_encode("CERTIFICATE REQUEST", der);
    let mut flipped = der.clone();
    *flipped.last_mut().unwrap() ^= 1;
    let mut altered = der.clone();
    let cn = altered.windows(9).position(|w| w == b"talos-sso").unwrap();
    altered[cn + 8] = b'x';
    let other = ClientKey::generate().unwrap().csr_pem().unwrap();
    let ca_cert = std::fs::read_to_string(&env.work.ca_cert).unwrap();
    let ca_key = std::fs::read_to_string(&env.work.ca_key).unwrap();
    let body_lines: Vec<&str> = good.lines().filter(|l| !l.starts_with("-----")).collect();
    let with_headers = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\nProc-Type: 4,ENCRYPTED\n\n{}\n-----END CERTIFICATE REQUEST-----\n",
        body_lines.join("\n")
    );
    let huge = pem(&vec![0x30; 17 * 1024]);

    // (label, CSR text, reason)
    let cases: Vec<(&str, String, &str)> = vec![
        ("not PEM: plain text", "hello".into(), "csr_malformed"),
        ("empty", String::new(), "csr_malformed"),
        ("PEM of a certificate", ca_cert.clone(), "csr_malformed"),
        ("PEM of a private key", ca_key, "csr_malformed"),
        (
            "PEM with a body that is not base64",
            "-----BEGIN CERTIFICATE REQUEST-----\n!!!\n-----END CERTIFICATE REQUEST-----\n".into(),
            "csr_malformed",
        ),
        (
            "BEGIN line without END",
            good.lines().take(3).collect::<Vec<_>>().join("\n"),
            "csr_malformed",
        ),
        ("PEM with headers", with_headers, "csr_malformed"),
        (
            "two requests in one PEM",
            format!("{good}{other}"),
            "csr_malformed",
        ),
        (
            "a certificate, then the request",
            format!("{ca_cert}{good}"),
            "csr_malformed",
        ),
        (
            "text before the BEGIN line",
            format!("hello\n{good}"),
            "csr_malformed",
        ),
        (
            "DER as base64 without armor",
            base64::engine::general_purpose::STANDARD.encode(&der),
            "csr_malformed",
        ),
        ("truncated DER", pem(&der[..der.len() - 3]), "csr_malformed"),
        (
            "NUL inside the PEM",
            good.replacen('\n', "\n\u{0}", 2),
            "csr_malformed",
        ),
        (
            "one signature bit flipped",
            pem(&flipped),
            "csr_signature_invalid",
        ),
        (
            "subject changed after signing",
            pem(&altered),
            "csr_signature_invalid",
        ),
        ("RSA 512", fixture_csr("rsa512"), "csr_key_too_small"),
        ("RSA 1024", fixture_csr("rsa1024"), "csr_key_too_small"),
        ("ECDSA P-384", fixture_csr("p384"), "csr_key_type_unsupported"),
        (
            "ECDSA secp256k1",
            fixture_csr("secp256k1"),
            "csr_key_type_unsupported",
        ),
        ("Ed448", fixture_csr("ed448"), "csr_key_type_unsupported"),
        (
            "ECDSA P-256 signed with SHA-1",
            fixture_csr("p256-sha1"),
            "csr_signature_algorithm_unsupported",
        ),
        ("17 KiB CSR", huge, "csr_too_large"),
    ];
    for (label, csr, reason) in &cases {
        let token = env.emulator.token_for(BOB, TokenKind::id()).unwrap();
        let answer = post_raw(&env, Some(&bearer(&token)), &[], certificate_body(csr)).await;
        assert_refused(label, &answer, 400, "csr_invalid");
        assert_eq!(answer.body["reason"], *reason, "{label}: {}", answer.body);
        assert_eq!(issued(&env).await, 0, "{label}: nothing issued");
    }

    // A CSR that asks for everything: its own CN and O values, SANs,
    // CA:TRUE, keyCertSign, serverAuth. Only its key is used.
    let token = env.emulator.token_for(BOB, TokenKind::id()).unwrap();
    let answer = post_raw(
        &env,
        Some(&bearer(&token)),
        &[],
        certificate_body(&fixture_csr("claims")),
    )
    .await;
    let label = "CSR with CN, O, SANs, CA:TRUE, serverAuth";
    assert_eq!(answer.status, 201, "{label}: {}", answer.body);
    let leaf_pem = answer.body["certificate"].as_str().unwrap();
    let leaf = ParsedCertificate::from_der(&x509::pem_blocks(leaf_pem).unwrap()[0].1).unwrap();
    assert_eq!(leaf.subject_common_name().as_deref(), Some(BOB), "{label}");
    assert_eq!(leaf.subject_organizations(), ["os:operator"], "{label}");
    assert!(leaf.extension(oid::SUBJECT_ALT_NAME).is_none(), "{label}: no SAN");
    assert!(!leaf.basic_constraints().unwrap().ca, "{label}: not a CA");
    assert_eq!(leaf.ext_key_usage().unwrap(), [oid::KP_CLIENT_AUTH], "{label}");
    let usage = leaf.key_usage().unwrap();
    assert!(
        usage.digital_signature() && !usage.key_cert_sign() && !usage.crl_sign(),
        "{label}: {usage:?}"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_bodies_of_the_wrong_shape() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let csr = ClientKey::generate().unwrap().csr_pem().unwrap();
    let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let with_csr = |fields: &str| format!(r#"{{"cluster":"prod","csr":{},{fields}}}"#, json!(csr));
    let roles: Vec<String> = (0..1000).map(|i| format!("os:role{i}")).collect();
    let mut not_utf8 = br#"{"cluster":"pr"#.to_vec();
    not_utf8.extend(b"\xff\xfe");
    not_utf8.extend(format!(r#"od","csr":{}}}"#, json!(csr)).into_bytes());

    // Bodies that are no certificate request: 400 `request_invalid` each.
    let not_requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "cluster a number",
            json!({"cluster": 5, "csr": csr}).to_string().into(),
        ),
        (
            "cluster null",
            json!({"cluster": null, "csr": csr}).to_string().into(),
        ),
        ("no cluster", json!({"csr": csr}).to_string().into()),
        (
            "csr a number",
            json!({"cluster": "prod", "csr": 5}).to_string().into(),
        ),
        (
            "csr a list",
            json!({"cluster": "prod", "csr": [csr]}).to_string().into(),
        ),
        ("no csr", json!({"cluster": "prod"}).to_string().into()),
        ("roles a string", with_csr(r#""roles":"os:operator""#).into()),
        ("roles of numbers", with_csr(r#""roles":[1,2]"#).into()),
        ("roles an object", with_csr(r#""roles":{"os:admin":true}"#).into()),
        ("ttl_seconds a string", with_csr(r#""ttl_seconds":"300""#).into()),
        ("ttl_seconds a fraction", with_csr(r#""ttl_seconds":1.5"#).into()),
        ("ttl_seconds true", with_csr(r#""ttl_seconds":true"#).into()),
        ("ttl_seconds negative", with_csr(r#""ttl_seconds":-1"#).into()),
        (
            "ttl_seconds 2^64",
            with_csr(r#""ttl_seconds":18446744073709551616"#).into(),
        ),
        ("unknown field", with_csr(r#""is_admin":true"#).into()),
        (
            "roles nested 10,000 deep",
            with_csr(&format!(r#""roles":{}"#, deep(10_000))).into(),
        ),
        ("body a list", b"[]".to_vec()),
        ("body a string", b"\"prod\"".to_vec()),
        ("body null", b"null".to_vec()),
        ("empty body", Vec::new()),
        (
            "duplicated key",
            format!(r#"{{"cluster":"prod","cluster":"prod","csr":{}}}"#, json!(csr)).into(),
        ),
        ("not UTF-8", not_utf8),
        (
            "UTF-8 byte order mark first",
            [b"\xef\xbb\xbf".as_slice(), &certificate_body(&csr)].concat(),
        ),
        (
            "trailing garbage",
            [certificate_body(&csr), b" x".to_vec()].concat(),
        ),
        (
            "two objects",
            [certificate_body(&csr), certificate_body(&csr)].concat(),
        ),
        ("form-encoded body", b"cluster=prod&csr=x".to_vec()),
    ];
    // (label, body, status, code) for `POST /v1/certificates` with a good token.
    let cases = not_requests
        .into_iter()
        .map(|(label, body)| (label, body, 400, "request_invalid"))
        .chain([
            (
                "ttl_seconds 2^64-1",
                with_csr(r#""ttl_seconds":18446744073709551615"#).into(),
                400,
                "ttl_too_long",
            ),
            (
                "ttl_seconds 0",
                with_csr(r#""ttl_seconds":0"#).into(),
                400,
                "ttl_invalid",
            ),
            (
                "cluster name of 60 KiB",
                json!({"cluster": "p".repeat(60 * 1024), "csr": csr})
                    .to_string()
                    .into(),
                404,
                "cluster_unknown",
            ),
            (
                "1,000 roles",
                json!({"cluster": "prod", "csr": csr, "roles": roles})
                    .to_string()
                    .into(),
                403,
                "role_not_permitted",
            ),
            // Over the 64 KiB limit, and small enough to be written whole
            // before the server, which refuses it from its length, answers
            // and closes: a client still writing a larger body can meet a
            // broken pipe instead of the answer. The limit on bodies of any
            // length, announced or chunked, is checked over a raw connection
            // (`http_protocol_abuse`, below).
            ("body of 80 KiB", vec![b' '; 80 * 1024], 413, "body_too_large"),
        ]);
    for (label, body, status, code) in cases {
        let token = env.emulator.token_for(BOB, TokenKind::id()).unwrap();
        let answer = post_raw(&env, Some(&bearer(&token)), &[], body).await;
        assert_refused(label, &answer, status, code);
        assert_eq!(issued(&env).await, 0, "{label}: nothing issued");
    }
    // The media type is not consulted: the body decides.
    let token = env.emulator.token_for(BOB, TokenKind::id()).unwrap();
    let typed = post_raw(
        &env,
        Some(&bearer(&token)),
        &[("content-type", b"text/plain")],
        certificate_body(&csr),
    )
    .await;
    assert_eq!(
        typed.status, 201,
        "Content-Type text/plain, JSON body: {}",
        typed.body
    );

    // `POST /v1/deny` as an admin, then as nobody: nothing is added.
    let deny_cases: Vec<(&str, bool, &str, u16, &str)> = vec![
        (
            "deny: reason a number",
            true,
            r#"{"subject":"x","reason":5}"#,
            400,
            "request_invalid",
        ),
        (
            "deny: subject a list",
            true,
            r#"{"subject":["x"],"reason":"r"}"#,
            400,
            "request_invalid",
        ),
        (
            "deny: unknown field",
            true,
            r#"{"subject":"x","reason":"r","forever":true}"#,
            400,
            "request_invalid",
        ),
        (
            "deny: no subject or username",
            true,
            r#"{"reason":"r"}"#,
            400,
            "request_invalid",
        ),
        (
            "deny: no reason",
            true,
            r#"{"subject":"x"}"#,
            400,
            "request_invalid",
        ),
        (
            "deny: blank reason",
            true,
            r#"{"subject":"x","reason":"   "}"#,
            400,
            "request_invalid",
        ),
        ("deny: not JSON", true, "subject=x", 400, "request_invalid"),
        ("deny: body a list", true, "[]", 400, "request_invalid"),
        (
            "deny: anonymous, body not a deny request",
            false,
            "[]",
            400,
            "request_invalid",
        ),
        (
            "deny: anonymous, good body",
            false,
            r#"{"subject":"x","reason":"r"}"#,
            401,
            "token_missing",
        ),
    ];
    let nested = format!(r#"{{"subject":"x","reason":"r","username":{}}}"#, deep(10_000));
    let deny_cases = deny_cases
        .into_iter()
        .map(|(l, a, b, s, c)| (l, a, b.to_owned(), s, c))
        .chain([("deny: nested 10,000 deep", true, nested, 400, "request_invalid")]);
    for (label, as_admin, body, status, code) in deny_cases {
        let mut request = env
            .http
            .post(format!("{}/v1/deny", env.server.base_url))
            .body(body);
        if as_admin {
            request = request.bearer_auth(
                env.emulator
                    .token_for("alice@example.com", TokenKind::id())
                    .unwrap(),
            );
        }
        let answer = Answer::read(request.send().await.unwrap()).await;
        assert_refused(label, &answer, status, code);
    }
    assert!(
        env.server.app.audit.store().deny_list().await.unwrap().is_empty(),
        "no deny entry was added"
    );
    env.finish().await;
}

/// (label, method, path and query, token, status, code or none for a success)
type QueryCase<'a> = (
    &'a str,
    reqwest::Method,
    String,
    Option<&'a str>,
    u16,
    Option<&'a str>,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters_of_the_wrong_shape() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let sam_token = env
        .emulator
        .token_for("sam@example.com", TokenKind::id())
        .unwrap();
    let alice_token = env
        .emulator
        .token_for("alice@example.com", TokenKind::id())
        .unwrap();
    let (sam, alice) = (sam_token.as_str(), alice_token.as_str());
    let thousand: String = (0..1000).map(|i| format!("p{i}=1&")).collect();
    let cases: Vec<QueryCase> = vec![
        (
            "audit: unknown parameter",
            reqwest::Method::GET,
            "/v1/audit?bogus=1".into(),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: unknown parameter, anonymous",
            reqwest::Method::GET,
            "/v1/audit?bogus=1".into(),
            None,
            400,
            Some("request_invalid"),
        ),
        (
            "audit: parameter twice",
            reqwest::Method::GET,
            "/v1/audit?limit=1&limit=2".into(),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: empty limit",
            reqwest::Method::GET,
            "/v1/audit?limit=".into(),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: cursor in hex",
            reqwest::Method::GET,
            "/v1/audit?cursor=0x10".into(),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: outcome in capitals",
            reqwest::Method::GET,
            "/v1/audit?outcome=DENIED".into(),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: 1,000 parameters",
            reqwest::Method::GET,
            format!("/v1/audit?{thousand}"),
            Some(sam),
            400,
            Some("request_invalid"),
        ),
        (
            "audit: broken percent escape",
            reqwest::Method::GET,
            "/v1/audit?username=%zz".into(),
            Some(sam),
            200,
            None,
        ),
        (
            "audit: escape of a non-UTF-8 byte",
            reqwest::Method::GET,
            "/v1/audit?username=%ff".into(),
            Some(sam),
            200,
            None,
        ),
        (
            "audit: escaped NUL",
            reqwest::Method::GET,
            "/v1/audit?username=%00&role=%1b%5b2J".into(),
            Some(sam),
            200,
            None,
        ),
        (
            "audit/verify: parameters it does not take",
            reqwest::Method::GET,
            "/v1/audit/verify?x=1".into(),
            Some(sam),
            200,
            None,
        ),
        (
            "deny remove: no parameter",
            reqwest::Method::DELETE,
            "/v1/deny".into(),
            Some(alice),
            400,
            Some("request_invalid"),
        ),
        (
            "deny remove: empty subject",
            reqwest::Method::DELETE,
            "/v1/deny?subject=".into(),
            Some(alice),
            400,
            Some("request_invalid"),
        ),
        (
            "deny remove: unknown parameter",
            reqwest::Method::DELETE,
            "/v1/deny?bogus=1".into(),
            Some(alice),
            400,
            Some("request_invalid"),
        ),
        (
            "deny remove: unknown parameter, anonymous",
            reqwest::Method::DELETE,
            "/v1/deny?bogus=1".into(),
            None,
            400,
            Some("request_invalid"),
        ),
        (
            "deny remove: good parameter, anonymous",
            reqwest::Method::DELETE,
            "/v1/deny?subject=x".into(),
            None,
            401,
            Some("token_missing"),
        ),
    ];
    for (label, method, path, token, status, code) in cases {
        let mut request = env.http.request(method, format!("{}{path}", env.server.base_url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let answer = Answer::read(request.send().await.unwrap()).await;
        match code {
            Some(code) => assert_refused(label, &answer, status, code),
            None => assert_eq!(answer.status, status, "{label}: {}", answer.body),
        }
    }
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_and_methods() {
    let env = TestEnv::start(Backend::Sqlite).await;
    let addr = address(&env.server.base_url);
    let get =
        |target: &str| format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes();
    let long = format!("/{}", "a".repeat(8000));
    let longest = format!("/{}", "a".repeat(70_000));
    // (label, request, status, code; `None` when hyper answers without a body)
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        ("unknown path", get("/v2/certificates"), 404, Some("not_found")),
        ("root", get("/"), 404, Some("not_found")),
        ("trailing slash", get("/v1/certificates/"), 404, Some("not_found")),
        ("dot-dot segments", get("/v1/../v1/info"), 404, Some("not_found")),
        (
            "encoded dot-dot",
            get("/v1/%2e%2e/v1/info"),
            404,
            Some("not_found"),
        ),
        ("encoded NUL", get("/v1/info%00"), 404, Some("not_found")),
        ("encoded slash", get("/v1%2finfo"), 404, Some("not_found")),
        ("double slash", get("//v1/info"), 404, Some("not_found")),
        ("capitals", get("/V1/INFO"), 404, Some("not_found")),
        ("path parameter", get("/v1/info;x=1"), 404, Some("not_found")),
        ("8,000-character path", get(&long), 404, Some("not_found")),
        ("70,000-character path", get(&longest), 414, None),
        (
            "asterisk form",
            b"OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            404,
            Some("not_found"),
        ),
        (
            "CONNECT",
            b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\nConnection: close\r\n\r\n"
                .to_vec(),
            404,
            Some("not_found"),
        ),
        (
            "GET on a POST endpoint",
            get("/v1/certificates"),
            405,
            Some("method_not_allowed"),
        ),
        (
            "PUT on the deny list",
            b"PUT /v1/deny HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n".to_vec(),
            405,
            Some("method_not_allowed"),
        ),
        (
            "OPTIONS on an endpoint",
            b"OPTIONS /v1/certificates HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            405,
            Some("method_not_allowed"),
        ),
        (
            "made-up method",
            b"BREW /v1/info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            405,
            Some("method_not_allowed"),
        ),
    ];
    for (label, request, status, code) in cases {
        let reply = exchange(&addr, &request).await;
        reply.assert(label, status, code);
    }
    let reply = exchange(&addr, &get("/v1/certificates")).await;
    assert_eq!(
        reply.header("allow").as_deref(),
        Some("POST"),
        "GET on a POST endpoint: Allow kept"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_protocol_abuse() {
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        format!("{yaml}http: {{ request_timeout: 2s, header_read_timeout: 2s }}\n")
    })
    .await;
    let addr = address(&env.server.base_url);
    let post = |headers: &str, body: &[u8]| {
        [
            format!("POST /v1/certificates HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n")
                .into_bytes(),
            body.to_vec(),
        ]
        .concat()
    };
    let mut big_chunked = Vec::new();
    for _ in 0..20 {
        big_chunked.extend(b"1000\r\n");
        big_chunked.extend(vec![b' '; 4096]);
        big_chunked.extend(b"\r\n");
    }
    big_chunked.extend(b"0\r\n\r\n");
    // (label, bytes, status, code; `None`: hyper's own answer, no body)
    let cases: Vec<(&str, Vec<u8>, u16, Option<&str>)> = vec![
        (
            "HTTP/1.0 request",
            b"GET /v1/info HTTP/1.0\r\n\r\n".to_vec(),
            200,
            None,
        ),
        (
            "no Host header",
            b"GET /v1/info HTTP/1.1\r\nConnection: close\r\n\r\n".to_vec(),
            200,
            None,
        ),
        (
            "LF-only line ends",
            b"GET /v1/info HTTP/1.1\nHost: x\nConnection: close\n\n".to_vec(),
            200,
            None,
        ),
        (
            "absolute-form target",
            b"GET http://evil.example/v1/info HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
                .to_vec(),
            200,
            None,
        ),
        (
            "HTTP/0.9 request line",
            b"GET /v1/info\r\n\r\n".to_vec(),
            400,
            None,
        ),
        (
            "TLS ClientHello to the plain port",
            b"\x16\x03\x01\x00\x05hello\r\n\r\n".to_vec(),
            400,
            None,
        ),
        (
            "Content-Length 99999999999999999999",
            post("Content-Length: 99999999999999999999\r\n", b""),
            400,
            None,
        ),
        (
            "Content-Length -1",
            post("Content-Length: -1\r\n", b""),
            400,
            None,
        ),
        (
            "two different Content-Length",
            post("Content-Length: 2\r\nContent-Length: 3\r\n", b"{}"),
            400,
            None,
        ),
        (
            "Transfer-Encoding gzip",
            post("Transfer-Encoding: gzip\r\n", b"{}"),
            400,
            None,
        ),
        (
            "Content-Length and chunked",
            post(
                "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
                b"2\r\n{}\r\n0\r\n\r\n",
            ),
            401,
            Some("token_missing"),
        ),
        (
            "chunk size not hex",
            post("Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n"),
            400,
            Some("request_invalid"),
        ),
        (
            "chunk shorter than announced",
            post("Transfer-Encoding: chunked\r\n", b"10\r\n{}"),
            408,
            Some("request_timeout"),
        ),
        (
            "Content-Length 100, one byte sent",
            post("Content-Length: 100\r\n", b"{"),
            408,
            Some("request_timeout"),
        ),
        (
            "Content-Length over the body limit",
            post("Content-Length: 2000000\r\n", b""),
            413,
            Some("body_too_large"),
        ),
        (
            "80 KiB chunked body",
            post("Transfer-Encoding: chunked\r\n", &big_chunked),
            413,
            Some("body_too_large"),
        ),
    ];
    for (label, request, status, code) in cases {
        let reply = exchange(&addr, &request).await;
        reply.assert(label, status, code);
    }

    // HTTP/2 without TLS (prior knowledge) is served; garbage after the
    // preface ends the connection with GOAWAY.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    // HEADERS, stream 1, END_STREAM | END_HEADERS: GET http /healthz, authority x
    // (static table entries and literals without Huffman coding).
    let block = [&[0x82u8, 0x86, 0x04, 8][..], b"/healthz", &[0x01, 1, b'x']].concat();
    let headers = [&[0, 0, block.len() as u8, 0x01, 0x05, 0, 0, 0, 1][..], &block].concat();
    let frames = h2_frames(&addr, &[preface.as_slice(), &headers].concat(), |frames| {
        frames.iter().any(|f| f.kind == 0x01 && f.stream == 1)
    })
    .await;
    let response = frames.iter().find(|f| f.kind == 0x01 && f.stream == 1);
    assert_eq!(
        response.map(|f| f.payload.first().copied()),
        Some(Some(0x88)),
        "HTTP/2 without TLS: `:status 200` (static entry 8): {frames:?}"
    );
    let garbage = [preface.as_slice(), &[0xff; 64]].concat();
    let frames = h2_frames(&addr, &garbage, |frames| frames.iter().any(|f| f.kind == 0x07)).await;
    assert!(
        frames.iter().any(|f| f.kind == 0x07),
        "HTTP/2 garbage after the preface: GOAWAY: {frames:?}"
    );
    assert_eq!(issued(&env).await, 0, "nothing above issued anything");
    env.finish().await;
}

/// One HTTP/2 frame as received.
#[derive(Debug)]
struct Frame {
    kind: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// Send `bytes`, then read frames until `enough` says so, the server
/// closes, or 10 seconds pass.
async fn h2_frames(addr: &str, bytes: &[u8], enough: impl Fn(&[Frame]) -> bool) -> Vec<Frame> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let mut frames = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !enough(&frames) {
        let mut head = [0u8; 9];
        match tokio::time::timeout_at(deadline, stream.read_exact(&mut head)).await {
            Ok(Ok(_)) => {}
            _ => break,
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if !matches!(
            tokio::time::timeout_at(deadline, stream.read_exact(&mut payload)).await,
            Ok(Ok(_))
        ) {
            break;
        }
        frames.push(Frame {
            kind: head[3],
            stream: u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]),
            payload,
        });
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_protocol_abuse() {
    let scratch = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        yaml.replace(
            "insecure_http: true",
            &format!(
                "tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
                cert.display(),
                key.display()
            ),
        )
    })
    .await;
    let addr = address(&env.server.base_url);
    let handshake = |alpn: Vec<Vec<u8>>| {
        let (ca_pem, addr) = (ca_pem.clone(), addr.clone());
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Write};
            let mut roots = rustls::RootCertStore::empty();
            for cert in talos_sso_tests::talos_checker::certificates_from_pem(&ca_pem).unwrap() {
                roots.add(cert).unwrap();
            }
            let mut config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = alpn;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let connection = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
            let socket = std::net::TcpStream::connect(&addr).unwrap();
            socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut tls = rustls::StreamOwned::new(connection, socket);
            tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            let mut out = Vec::new();
            tls.read_to_end(&mut out)?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
        })
    };
    // Control: the same client with an ALPN the server speaks.
    let served = handshake(vec![b"http/1.1".to_vec()]).await.unwrap().unwrap();
    assert!(served.starts_with("HTTP/1.1 200"), "ALPN http/1.1: {served}");
    let refused = handshake(vec![b"spdy/3".to_vec()]).await.unwrap().unwrap_err();
    assert!(
        refused.to_string().contains("NoApplicationProtocol"),
        "ALPN offering only spdy/3: {refused}"
    );

    // (label, first bytes, the TLS alert the server must answer with)
    let hello = |version: [u8; 2]| {
        let mut body = vec![version[0], version[1]];
        body.extend([7u8; 32]);
        body.extend([0, 0, 4, 0x00, 0x2f, 0x00, 0x35, 1, 0]);
        let mut handshake = vec![1, 0, 0, body.len() as u8];
        handshake.extend(body);
        let mut record = vec![0x16, 0x03, 0x01, 0, handshake.len() as u8];
        record.extend(handshake);
        record
    };
    for (label, bytes, alert) in [
        // handshake_failure (40): rustls offers nothing below TLS 1.2.
        ("TLS 1.0 ClientHello", hello([3, 1]), Some(40u8)),
        ("TLS 1.1 ClientHello", hello([3, 2]), Some(40)),
        ("SSL 3.0 ClientHello", hello([3, 0]), Some(40)),
        (
            "SSLv2-format ClientHello",
            vec![0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10],
            None,
        ),
        (
            "plain HTTP to the TLS port",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
            None,
        ),
    ] {
        let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let _ = stream.write_all(&bytes).await;
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "{label}: closed within 10 s");
        assert!(!out.starts_with(b"HTTP/"), "{label}: no HTTP answer");
        match alert {
            // An alert record: fatal (2), then the description.
            Some(description) => assert_eq!(
                (out.first(), out.get(5), out.get(6)),
                (Some(&0x15), Some(&2), Some(&description)),
                "{label}: {out:02x?}"
            ),
            None => assert!(out.is_empty() || out[0] == 0x15, "{label}: {out:02x?}"),
        }
    }
    assert_eq!(issued(&env).await, 0);
    env.finish().await;
}

fn entry() -> ContextEntry {
    ContextEntry {
        endpoints: vec!["10.0.0.1".into()],
        nodes: vec![],
        ca_pem: "ca".into(),
        crt_pem: "crt".into(),
        key_pem: "key".into(),
    }
}

/// What `upsert_context` made of a talosconfig of these bytes, and whether
/// the file stayed as it was.
fn upsert_into(dir: &Path, name: &str, contents: &[u8]) -> (Result<(), TalosconfigError>, bool) {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    let result = talosconfig::upsert_context(&path, "prod", &entry(), None, false).map(|_| ());
    let untouched = std::fs::read(&path).unwrap() == contents;
    (result, untouched)
}

#[test]
fn talosconfig_files_that_are_not_talosconfigs() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = {
        let mut text = String::from("a: &a [\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]\n");
        for level in b'b'..=b'i' {
            let previous = (level - 1) as char;
            let list = vec![format!("*{previous}"); 9].join(",");
            text.push_str(&format!("{}: &{} [{list}]\n", level as char, level as char));
        }
        text.push_str("contexts: {prod: {endpoints: *i}}\n");
        text
    };
    let deep = format!("contexts: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    let mut huge = b"contexts: {}\n".to_vec();
    huge.resize(talosconfig::MAX_FILE_LEN as usize + 1, b'#');
    // (label, contents, reason the error must give)
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not YAML", b"{{{ not yaml".to_vec(), ""),
        (
            "top level a list",
            b"- a\n- b\n".to_vec(),
            "the top level is not a mapping",
        ),
        (
            "top level a string",
            b"hello\n".to_vec(),
            "the top level is not a mapping",
        ),
        (
            "contexts a list",
            b"contexts: [a, b]\n".to_vec(),
            "`contexts` is not a mapping",
        ),
        (
            "contexts a string",
            b"contexts: prod\n".to_vec(),
            "`contexts` is not a mapping",
        ),
        (
            "a context that is a number",
            b"contexts:\n  a: 5\n".to_vec(),
            "context",
        ),
        (
            "current context a list",
            b"context: [x]\ncontexts: {}\n".to_vec(),
            "`context` is not a string",
        ),
        (
            "duplicated key",
            b"contexts:\n  prod: {}\n  prod: {}\n".to_vec(),
            "duplicate",
        ),
        (
            "alias bomb (billion laughs)",
            bomb.into_bytes(),
            "repetition limit exceeded",
        ),
        (
            "nested 10,000 deep",
            deep.into_bytes(),
            "recursion limit exceeded",
        ),
        (
            "not UTF-8",
            b"contexts:\n  pr\xffod: {}\n".to_vec(),
            "not UTF-8 text",
        ),
        (
            "NUL byte",
            b"contexts:\n  pr\x00od: {}\n".to_vec(),
            "control characters",
        ),
        ("larger than 16 MiB", huge, "larger than 16 MiB"),
    ];
    for (label, contents, reason) in &cases {
        let started = std::time::Instant::now();
        let (result, untouched) = upsert_into(dir.path(), "config", contents);
        match result {
            Err(TalosconfigError::Malformed { reason: got, .. }) => {
                assert!(got.contains(reason), "{label}: {got}")
            }
            other => panic!("{label}: {other:?}"),
        }
        assert!(untouched, "{label}: the file was changed");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{label}: took {:?}",
            started.elapsed()
        );
    }

    // A link to an endless file: refused after a bounded read.
    #[cfg(unix)]
    {
        let path = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        let error = talosconfig::upsert_context(&path, "prod", &entry(), None, false).unwrap_err();
        assert!(
            error.to_string().contains("larger than 16 MiB"),
            "link to /dev/zero: {error}"
        );
        // A link to a file: the file is read, the link replaced by the new
        // file, and what it pointed to stays as it was.
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "contexts:\n  other: {endpoints: [1.2.3.4]}\n").unwrap();
        let link = dir.path().join("linked");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        talosconfig::upsert_context(&link, "prod", &entry(), None, false).unwrap();
        assert!(
            !std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(),
            "link to another file: replaced by a file"
        );
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "contexts:\n  other: {endpoints: [1.2.3.4]}\n",
            "link to another file: its target untouched"
        );
        let written: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(&std::fs::read_to_string(&link).unwrap()).unwrap();
        assert_eq!(
            written["contexts"]["other"]["endpoints"][0], "1.2.3.4",
            "link to another file"
        );
    }

    // A directory where the file should be.
    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let error = talosconfig::upsert_context(&directory, "prod", &entry(), None, false).unwrap_err();
    assert!(
        matches!(error, TalosconfigError::Io { action: "read", .. }),
        "a directory at the path: {error}"
    );

    // The same context name again: its certificate and key are ours now;
    // the endpoints a person set there (this client never wrote them),
    // what it had beyond ours, and every other context stay.
    let (result, _) = upsert_into(
        dir.path(),
        "same",
        b"contexts:\n  prod: {endpoints: [old], crt: {not: base64}, proxy-url: http://proxy:3128}\n  other: {endpoints: [x]}\n",
    );
    result.unwrap();
    let written: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(dir.path().join("same")).unwrap()).unwrap();
    let stored = talosconfig::read_context(&dir.path().join("same"), "prod")
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.crt_pem.as_str(), stored.key_pem.as_str()),
        ("crt", "key"),
        "a context with the same name"
    );
    assert_eq!(
        written["contexts"]["prod"]["endpoints"][0], "old",
        "a context with the same name"
    );
    assert_eq!(
        written["contexts"]["prod"]["proxy-url"], "http://proxy:3128",
        "a context with the same name"
    );
    assert_eq!(
        written["contexts"]["other"]["endpoints"][0], "x",
        "a context with the same name"
    );
    let (result, _) = upsert_into(dir.path(), "empty", b"");
    result.unwrap();
}

/// `talos-sso-server check --config <file>`: its output, or the message
/// `main` prints before it exits 1.
async fn check(config: &Path) -> Result<String, String> {
    let args = ["talos-sso-server", "check", "--config", config.to_str().unwrap()];
    let cli = Cli::try_parse_from(args).unwrap();
    let mut out = Vec::new();
    let result = run(cli, &mut out).await;
    let text = String::from_utf8(out).unwrap();
    result.map(|_| text.clone()).map_err(|e| format!("{text}{e:#}"))
}

/// A configuration `check` would pass (given a running emulator), and what
/// the cases change in it.
struct ConfigScene {
    emulator: EmulatorHandle,
    work: Workdir,
    text: String,
    ca_line: String,
}

impl ConfigScene {
    async fn new() -> Self {
        let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
        let work = Workdir::new();
        let url = format!("sqlite://{}", work.path().join("audit.db").display());
        let text = config_yaml(&emulator, &work, &url);
        let ca_line = format!(
            "ca: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            work.ca_cert.display(),
            work.ca_key.display()
        );
        assert!(text.contains(&ca_line));
        // `check` reads the audit database as `serve` would: make it.
        let path = write_file(work.path(), "server.yaml", &text, 0o600);
        let args = ["talos-sso-server", "migrate", "--config", path.to_str().unwrap()];
        run(Cli::try_parse_from(args).unwrap(), &mut Vec::new())
            .await
            .unwrap();
        Self {
            emulator,
            work,
            text,
            ca_line,
        }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        write_file(self.work.path(), name, text, 0o600)
    }

    /// The configuration with the cluster's CA given as `source`.
    fn with_ca(&self, source: &str) -> String {
        self.text.replace(&self.ca_line, &format!("ca: {source}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_configuration_files() {
    let scene = ConfigScene::new().await;
    let text = &scene.text;
    // Six levels of nine: small enough that a loader which copies every
    // alias still finishes (with half a million nodes), so that the test
    // shows which loader ran rather than exhausting the machine.
    let bomb = {
        let mut text = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
        for level in b'b'..=b'f' {
            let previous = (level - 1) as char;
            let list = vec![format!("*{previous}"); 9].join(",");
            text.push_str(&format!("{}: &{} [{list}]\n", level as char, level as char));
        }
        text
    };
    let open_secret = write_file(scene.work.path(), "open-secret", "s", 0o644);
    let graph_secret = scene.work.graph_secret.display().to_string();
    let open_secret = open_secret.display().to_string();
    // (label, text replaced, replacement, what the error must say)
    let edits: Vec<(&str, &str, &str, &str)> = vec![
        (
            "unknown key in a cluster",
            "    ttl: 5m\n",
            "    ttl: 5m\n    maxttl: 1h\n",
            "unknown field `maxttl`",
        ),
        (
            "unknown key in a rule",
            "{ app_roles:",
            "{ app_role: [x], app_roles:",
            "unknown field `app_role`",
        ),
        (
            "listen a number",
            "listen: \"127.0.0.1:0\"",
            "listen: 5",
            "listen",
        ),
        (
            "listen not an address",
            "listen: \"127.0.0.1:0\"",
            "listen: \"here\"",
            "listen",
        ),
        (
            "clusters a list",
            "clusters:\n  prod:",
            "clusters:\n  - prod:",
            "clusters",
        ),
        ("ttl a number", "    ttl: 5m\n", "    ttl: 5\n", "ttl"),
        (
            "ttl in words",
            "    ttl: 5m\n",
            "    ttl: five minutes\n",
            "five minutes",
        ),
        ("ttl negative", "    ttl: 5m\n", "    ttl: -5m\n", "-5m"),
        (
            "ttl above max_ttl",
            "    ttl: 5m\n",
            "    ttl: 20m\n",
            "ttl must be",
        ),
        (
            "Graph secret readable by others",
            &graph_secret,
            &open_secret,
            "chmod 600",
        ),
        (
            "Graph secret file missing",
            &graph_secret,
            "/nonexistent/secret",
            "/nonexistent/secret",
        ),
    ];
    let rules_a_string = text
        .lines()
        .filter(|l| !l.starts_with("      - {"))
        .map(|l| if l == "    rules:" { "    rules: all" } else { l })
        .collect::<Vec<_>>()
        .join("\n");
    // (label, configuration text, what the error must say)
    let cases = edits
        .into_iter()
        .map(|(label, from, to, expected)| {
            assert!(text.contains(from), "{label}");
            (label, text.replace(from, to), expected)
        })
        .chain([
            (
                "unknown top-level key",
                format!("{text}listn: x\n"),
                "unknown field `listn`",
            ),
            ("rules a string", rules_a_string, "rules"),
            (
                "body_limit a string",
                format!("{text}http: {{ body_limit: lots }}\n"),
                "body_limit",
            ),
            (
                "duplicated key",
                format!("{text}listen: \"127.0.0.1:0\"\n"),
                "duplicate",
            ),
            (
                "YAML alias bomb",
                format!("{text}{bomb}"),
                "repetition limit exceeded",
            ),
            ("not YAML", "{{{ not yaml".into(), "cannot read the configuration"),
            ("empty file", String::new(), "invalid configuration"),
        ])
        .collect::<Vec<_>>();
    for (label, contents, expected) in &cases {
        let path = scene.write("server.yaml", contents);
        let error = check(&path).await.expect_err(label);
        assert!(
            error.contains(expected),
            "{label}: expected {expected:?} in {error}"
        );
    }
    let missing = check(&scene.work.path().join("absent.yaml")).await.unwrap_err();
    assert!(
        missing.contains("cannot read the configuration"),
        "missing file: {missing}"
    );
    let directory = scene.work.path().join("dir.yaml");
    std::fs::create_dir(&directory).unwrap();
    let error = check(&directory).await.unwrap_err();
    assert!(
        error.contains("cannot read the configuration"),
        "a directory: {error}"
    );
    #[cfg(unix)]
    {
        let endless = scene.work.path().join("endless.yaml");
        std::os::unix::fs::symlink("/dev/zero", &endless).unwrap();
        let error = check(&endless).await.unwrap_err();
        assert!(error.contains("larger than 16 MiB"), "link to /dev/zero: {error}");
    }
    // Control: the configuration itself passes.
    let path = scene.write("server.yaml", text);
    check(&path).await.unwrap();
    drop(scene.emulator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_material_that_must_not_load() {
    let scene = ConfigScene::new().await;
    let dir = scene.work.path();
    let files = |cert: &Path, key: &Path| {
        format!(
            "{{ cert_file: \"{}\", key_file: \"{}\" }}",
            cert.display(),
            key.display()
        )
    };
    let new_ca = |not_before_days_ago: i64, valid_days: u64| {
        generate::new_root(
            NewKeyType::Ed25519,
            "talos",
            Duration::from_secs(valid_days * 86400),
            OffsetDateTime::now_utc() - time::Duration::days(not_before_days_ago),
        )
        .unwrap()
    };
    let other = new_ca(0, 3650);
    let other_key = write_file(dir, "other.key", &other.key_pem, 0o600);
    let expired = new_ca(400, 30);
    let expired_cert = write_file(dir, "expired.crt", &expired.cert_pem, 0o644);
    let expired_key = write_file(dir, "expired.key", &expired.key_pem, 0o600);
    let future = new_ca(-30, 3650);
    let future_cert = write_file(dir, "future.crt", &future.cert_pem, 0o644);
    let future_key = write_file(dir, "future.key", &future.key_pem, 0o600);
    let talosconfig = read_fixture("talos/talosconfig-2021-admin.yaml");
    let decode = |field: &str| {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&talosconfig).unwrap();
        let text = value["contexts"]["no-roles"][field].as_str().unwrap();
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(text).unwrap()).unwrap()
    };
    let leaf_cert = write_file(dir, "leaf.crt", &decode("crt"), 0o644);
    let leaf_key = write_file(dir, "leaf.key", &decode("key"), 0o600);
    let rsa1024_key = write_file(dir, "rsa1024.key", &read_fixture("openssl/rsa1024-ca.key"), 0o600);
    let rsa2048_key = write_file(dir, "rsa2048.key", &read_fixture("openssl/rsa-ca.key"), 0o600);
    let garbage = write_file(dir, "garbage.pem", "not pem at all", 0o600);
    let empty = write_file(dir, "empty.key", "", 0o600);
    let redacted = write_file(dir, "redacted.key", "******", 0o600);
    let public = write_file(
        dir,
        "public.key",
        "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
        0o600,
    );
    let readable = write_file(
        dir,
        "readable.key",
        &std::fs::read_to_string(&scene.work.ca_key).unwrap(),
        0o644,
    );
    let bundle = read_fixture("talos/secrets-bundle.yaml");
    let truncated = write_file(dir, "truncated.yaml", &bundle[..bundle.len() / 2], 0o600);
    let cut_base64 = {
        let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&bundle).unwrap();
        let key = value["certs"]["os"]["key"].as_str().unwrap();
        write_file(
            dir,
            "cut-key.yaml",
            &bundle.replace(key, &key[..key.len() / 2]),
            0o600,
        )
    };
    let worker = write_file(
        dir,
        "worker.yaml",
        &read_fixture("talos/worker-v1.12.yaml"),
        0o600,
    );
    let ca_cert = &scene.work.ca_cert;
    // (label, CA source, code in the refusal)
    let cases: Vec<(&str, String, &str)> = vec![
        ("key of another CA", files(ca_cert, &other_key), "ca_key_mismatch"),
        (
            "leaf certificate, not a CA",
            files(&leaf_cert, &leaf_key),
            "ca_not_a_ca",
        ),
        ("expired CA", files(&expired_cert, &expired_key), "ca_expired"),
        (
            "CA valid only from next month",
            files(&future_cert, &future_key),
            "ca_not_yet_valid",
        ),
        (
            "RSA-1024 CA",
            files(&fixture("openssl/rsa1024-ca.crt"), &rsa1024_key),
            "ca_key_type_unsupported",
        ),
        (
            "certificate file of garbage",
            files(&garbage, &scene.work.ca_key),
            "ca_not_pem",
        ),
        ("key file of garbage", files(ca_cert, &garbage), "ca_not_pem"),
        ("empty key file", files(ca_cert, &empty), "ca_key_empty"),
        ("redacted key", files(ca_cert, &redacted), "ca_key_redacted"),
        (
            "public key as the key",
            files(ca_cert, &public),
            "ca_key_label_unsupported",
        ),
        (
            "key readable by others",
            files(ca_cert, &readable),
            "ca_key_permissions",
        ),
        (
            "key file missing",
            files(ca_cert, Path::new("/nonexistent/ca.key")),
            "ca_unreadable",
        ),
        (
            "certificate file endless (/dev/zero)",
            files(Path::new("/dev/zero"), &scene.work.ca_key),
            "ca_unreadable",
        ),
        (
            "secrets bundle cut in half",
            format!("{{ secrets_bundle: \"{}\" }}", truncated.display()),
            "ca_field_missing",
        ),
        (
            "secrets bundle with its key's base64 cut",
            format!("{{ secrets_bundle: \"{}\" }}", cut_base64.display()),
            "ca_base64_invalid",
        ),
        (
            "worker machine config (no CA key)",
            format!("{{ machine_config: \"{}\" }}", worker.display()),
            "ca_key_empty",
        ),
    ];
    for (label, source, code) in &cases {
        let path = scene.write("server.yaml", &scene.with_ca(source));
        let error = check(&path).await.expect_err(label);
        assert!(
            error.contains(&format!("CA refused [{code}]")),
            "{label}: expected [{code}] in {error}"
        );
    }
    // The endless file is refused for its size, after a bounded read (not
    // when the memory runs out).
    let endless = scene.with_ca(&files(Path::new("/dev/zero"), &scene.work.ca_key));
    let error = check(&scene.write("server.yaml", &endless)).await.unwrap_err();
    assert!(
        error.contains("larger than 16 MiB"),
        "certificate file endless (/dev/zero): {error}"
    );
    // RSA-2048 is a CA Talos can have: it loads.
    let path = scene.write(
        "server.yaml",
        &scene.with_ca(&files(&fixture("openssl/rsa-ca.crt"), &rsa2048_key)),
    );
    let passed = check(&path).await.unwrap();
    assert!(
        passed.contains("cluster prod: cluster-ca mode, CA O=talos ("),
        "RSA-2048 CA: {passed}"
    );
}
