//! An ID token from the GitHub Actions runner, for `--github-actions`: a
//! job with `permissions: id-token: write` finds the endpoint and a
//! request token in `ACTIONS_ID_TOKEN_REQUEST_URL` and
//! `ACTIONS_ID_TOKEN_REQUEST_TOKEN`; `GET URL&audience=AUD` with that
//! request token as bearer answers `{"value": "<jwt>"}` (GitHub's
//! documented protocol, as `@actions/core`'s `getIDToken` speaks it).
//!
//! The answer is bounded in size and time, the request token and the ID
//! token are never shown (the `--debug` lines redact both), and redirects
//! are not followed, so the request token goes nowhere else.

use std::time::Duration;

use zeroize::Zeroizing;

use crate::debug::{Exchange, Peer};

/// The variable naming the runner's token endpoint.
pub const REQUEST_URL_VAR: &str = "ACTIONS_ID_TOKEN_REQUEST_URL";
/// The variable holding the bearer token for that endpoint.
pub const REQUEST_TOKEN_VAR: &str = "ACTIONS_ID_TOKEN_REQUEST_TOKEN";

/// How long the runner may take to answer.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer read: a JWT and a count.
pub const MAX_ANSWER: usize = 64 * 1024;

/// Longest part of a refusal's body shown.
const SNIPPET_CHARS: usize = 200;

/// Why GitHub Actions gave no token.
#[derive(Debug, thiserror::Error)]
pub enum GitHubActionsError {
    #[error(
        "no GitHub Actions ID token for this job: ${missing} is not set. The runner sets \
         ACTIONS_ID_TOKEN_REQUEST_URL and ACTIONS_ID_TOKEN_REQUEST_TOKEN only for a job with \
         `permissions: id-token: write` (in the workflow or the job)"
    )]
    NotAvailable { missing: &'static str },
    #[error("${REQUEST_URL_VAR} is not an https:// URL ({reason})")]
    BadUrl { reason: String },
    #[error("cannot reach GitHub's ID token endpoint: {reason}")]
    Unreachable { reason: String },
    #[error("GitHub's ID token endpoint did not answer within {}s", .0.as_secs())]
    Timeout(Duration),
    #[error("GitHub's ID token endpoint refused to issue a token (HTTP {status}): {snippet}")]
    Refused { status: u16, snippet: String },
    #[error("GitHub's ID token endpoint answered with more than {MAX_ANSWER} bytes")]
    TooLarge,
    #[error("GitHub's ID token endpoint answered without a token (`value`) in JSON")]
    NoToken,
}

/// The runner's token endpoint and the bearer token it wants.
pub struct RunnerEndpoint {
    pub url: String,
    pub request_token: Zeroizing<String>,
}

impl std::fmt::Debug for RunnerEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerEndpoint")
            .field("url", &crate::debug::url(&self.url))
            .finish_non_exhaustive()
    }
}

impl RunnerEndpoint {
    /// From the job's environment.
    pub fn from_env() -> Result<Self, GitHubActionsError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables looked up with `var` (an empty one is missing).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, GitHubActionsError> {
        let get = |name: &'static str| {
            var(name)
                .filter(|v| !v.trim().is_empty())
                .ok_or(GitHubActionsError::NotAvailable { missing: name })
        };
        Ok(Self {
            url: get(REQUEST_URL_VAR)?,
            request_token: Zeroizing::new(get(REQUEST_TOKEN_VAR)?),
        })
    }
}

/// The endpoint's URL with `audience` added to its query (it already has
/// one: `api-version`), encoded.
pub fn token_url(endpoint: &str, audience: &str) -> Result<url::Url, GitHubActionsError> {
    let mut url = url::Url::parse(endpoint).map_err(|e| GitHubActionsError::BadUrl {
        reason: e.to_string(),
    })?;
    // Plain HTTP only to this machine (a runner's stand-in in tests): the
    // request token must not cross a network in clear.
    let loopback = match url.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
        return Err(GitHubActionsError::BadUrl {
            reason: format!("scheme `{}`", talos_sso_text::escape(url.scheme())),
        });
    }
    url.query_pairs_mut().append_pair("audience", audience);
    Ok(url)
}

/// Ask the runner for an ID token with `audience`.
pub async fn fetch(
    runner: &RunnerEndpoint,
    audience: &str,
    timeout: Duration,
) -> Result<Zeroizing<String>, GitHubActionsError> {
    let url = token_url(&runner.url, audience)?;
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| GitHubActionsError::Unreachable {
            reason: talos_sso_api::error::error_chain(&e),
        })?;
    let exchange = Exchange::start(Peer::IdentityProvider, "GET", url.as_str(), None, &[]);
    let failed = |error: reqwest::Error| {
        if error.is_timeout() {
            GitHubActionsError::Timeout(timeout)
        } else {
            GitHubActionsError::Unreachable {
                reason: talos_sso_text::bounded(&talos_sso_api::error::error_chain(&error), 300),
            }
        }
    };
    let sent = client
        .get(url.clone())
        .header(
            reqwest::header::AUTHORIZATION,
            format!("bearer {}", runner.request_token.as_str()),
        )
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(error) => {
            if let Some(exchange) = exchange {
                exchange.failed(&error);
            }
            return Err(failed(error));
        }
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = Zeroizing::new(Vec::new());
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(GitHubActionsError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    if let Some(exchange) = exchange {
        exchange.answered(status, content_type.as_deref(), Some(&body));
    }
    if !(200..300).contains(&status) {
        let text = String::from_utf8_lossy(&body);
        return Err(GitHubActionsError::Refused {
            status,
            snippet: talos_sso_text::bounded(text.trim(), SNIPPET_CHARS),
        });
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        value: String,
    }
    let answer: Answer = serde_json::from_slice(&body).map_err(|_| GitHubActionsError::NoToken)?;
    let value = Zeroizing::new(answer.value);
    let token = value.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(GitHubActionsError::NoToken);
    }
    Ok(Zeroizing::new(token.to_owned()))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::connection::test_peers::silent_peer;

    /// A runner's token endpoint on this machine: it answers every request
    /// with `answer` (status line, headers, body), and hands each request's
    /// head to the test.
    async fn runner(answer: Vec<u8>) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (heads, received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let _ = heads.send(String::from_utf8_lossy(&head).into_owned());
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            }
        });
        (
            format!("http://127.0.0.1:{port}/_apis/distributedtask/token/idtoken?api-version=2.0"),
            received,
        )
    }

    fn http(status: &str, body: &[u8]) -> Vec<u8> {
        let mut answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(body);
        answer
    }

    fn endpoint(url: String) -> RunnerEndpoint {
        RunnerEndpoint {
            url,
            request_token: Zeroizing::new("runner-request-token".into()),
        }
    }

    #[tokio::test]
    async fn the_token_is_asked_for_with_the_audience_and_the_request_token() {
        let (url, mut heads) = runner(http("200 OK", br#"{"count":1,"value":"eyJ.the.jwt"}"#)).await;
        let token = fetch(&endpoint(url), "talos sso/prod&x", TIMEOUT).await.unwrap();
        assert_eq!(token.as_str(), "eyJ.the.jwt");
        let head = heads.recv().await.unwrap();
        let request_line = head.lines().next().unwrap();
        assert_eq!(
            request_line,
            "GET /_apis/distributedtask/token/idtoken?api-version=2.0&audience=talos+sso%2Fprod%26x HTTP/1.1"
        );
        assert!(
            head.lines()
                .any(|l| l.eq_ignore_ascii_case("authorization: bearer runner-request-token")),
            "{head}"
        );
    }

    #[test]
    fn the_audience_joins_a_url_with_or_without_a_query() {
        let with = token_url("https://runner.example/idtoken?api-version=2.0", "api://talos").unwrap();
        assert_eq!(
            with.as_str(),
            "https://runner.example/idtoken?api-version=2.0&audience=api%3A%2F%2Ftalos"
        );
        let without = token_url("https://runner.example/idtoken", "talos-sso").unwrap();
        assert_eq!(
            without.as_str(),
            "https://runner.example/idtoken?audience=talos-sso"
        );
        for bad in ["http://runner.example/idtoken", "not a url", "ftp://127.0.0.1/x"] {
            assert!(
                matches!(token_url(bad, "a"), Err(GitHubActionsError::BadUrl { .. })),
                "{bad}"
            );
        }
        assert!(token_url("http://localhost:8080/idtoken", "a").is_ok());
    }

    #[test]
    fn a_job_without_id_token_permission_is_told_what_to_add() {
        let none = RunnerEndpoint::from_vars(|_| None).unwrap_err().to_string();
        assert!(
            none.contains("$ACTIONS_ID_TOKEN_REQUEST_URL is not set")
                && none.contains("`permissions: id-token: write`"),
            "{none}"
        );
        let no_token = RunnerEndpoint::from_vars(|name| {
            (name == REQUEST_URL_VAR).then(|| "https://runner.example/idtoken".to_owned())
        })
        .unwrap_err()
        .to_string();
        assert!(
            no_token.contains("$ACTIONS_ID_TOKEN_REQUEST_TOKEN is not set"),
            "{no_token}"
        );
        let both = RunnerEndpoint::from_vars(|name| Some(format!("{name}-value"))).unwrap();
        assert!(!format!("{both:?}").contains("ACTIONS_ID_TOKEN_REQUEST_TOKEN-value"));
    }

    #[tokio::test]
    async fn a_large_answer_is_refused_unread() {
        let big = format!(r#"{{"value":"{}"}}"#, "a".repeat(MAX_ANSWER));
        let (url, _heads) = runner(http("200 OK", big.as_bytes())).await;
        let error = fetch(&endpoint(url), "talos-sso", TIMEOUT).await.unwrap_err();
        assert!(matches!(error, GitHubActionsError::TooLarge), "{error}");
    }

    #[tokio::test]
    async fn a_refusal_or_an_answer_without_a_token_is_said_so() {
        let (url, _heads) = runner(http("403 Forbidden", br#"{"message":"no id-token permission"}"#)).await;
        let error = fetch(&endpoint(url), "talos-sso", TIMEOUT)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("refused to issue a token (HTTP 403)") && error.contains("no id-token permission"),
            "{error}"
        );
        for body in [
            &br#"{"count":0}"#[..],
            b"<html>",
            br#"{"value":""}"#,
            br#"{"value":"a b"}"#,
        ] {
            let (url, _heads) = runner(http("200 OK", body)).await;
            let error = fetch(&endpoint(url), "talos-sso", TIMEOUT).await.unwrap_err();
            assert!(matches!(error, GitHubActionsError::NoToken), "{error}");
        }
    }

    #[tokio::test]
    async fn a_runner_that_does_not_answer_times_out() {
        let (port, held) = silent_peer().await;
        let url = format!("http://127.0.0.1:{port}/idtoken?api-version=2.0");
        let error = fetch(&endpoint(url), "talos-sso", Duration::from_millis(300))
            .await
            .unwrap_err();
        assert!(matches!(error, GitHubActionsError::Timeout(_)), "{error}");
        assert!(error.to_string().contains("did not answer within"), "{error}");
        held.abort();
    }
}
