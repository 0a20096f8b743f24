//! `audit export --follow`: the trail as it grows, through
//! `GET /v1/audit/stream`, for a SIEM's collector or a person watching.
//!
//! Each connection starts with a fresh token (the login refreshed, or the
//! token file read again) and the seq of the last record printed, so that
//! nothing is missed or printed twice. The server ends a stream when its
//! token expires (and at shutdown): then the next connection follows at
//! once. A connection that breaks, or a server that is down or busy, is
//! tried again after a pause that grows to [`LONGEST_PAUSE`]. A refusal
//! (not an auditor, a bad filter) ends the command; so does any failure
//! before the first stream, so that a mistake shows at once.

use std::io::Write;
use std::time::Duration;

use talos_sso_api::AuditQuery;
use talos_sso_api::feed::StreamLine;

use super::login::{LoginMethod, authenticated};
use super::output::{AuditOutput, print_records};
use super::{error_text, explained};
use crate::api::{ApiError, AuditStream};

/// The first pause before trying again after a failure.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause between attempts.
const LONGEST_PAUSE: Duration = Duration::from_secs(30);

/// Why a connection ended.
enum Ended {
    /// The server ended the stream (token expiry, shutdown): follow again.
    ByServer,
    /// The connection broke or could not be made: try again after a pause.
    Failed(anyhow::Error),
    /// The server refused the stream for a reason that stays: stop.
    Refused(anyhow::Error),
}

/// Whether a refusal may go away by itself: the server busy or failing, or
/// a token that a token file's keeper has not renewed yet.
fn passing(error: &ApiError) -> bool {
    match error {
        ApiError::Unreachable(_) => true,
        ApiError::Unexpected { status, .. } => *status >= 500,
        ApiError::Problem { status, code, .. } => {
            *status >= 500
                || matches!(
                    code.as_str(),
                    "rate_limited" | "token_expired" | "token_not_yet_valid"
                )
        }
    }
}

/// Follow the records `query` matches after `cursor`, printing each in
/// `output`'s form (for a terminal or not), until stopped or refused.
pub(super) async fn follow(
    server: Option<&str>,
    login: &LoginMethod,
    query: &AuditQuery,
    mut cursor: i64,
    printing: (AuditOutput, bool),
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let mut followed = false;
    let mut heading = true;
    let mut pause = FIRST_PAUSE;
    loop {
        let stream = match open(server, login, query, cursor).await {
            Ok(stream) => stream,
            Err(Ended::Failed(error)) if followed => {
                eprintln!(
                    "warning: {}; trying again in {}s",
                    error_text(&error),
                    pause.as_secs()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
                continue;
            }
            Err(Ended::Failed(error) | Ended::Refused(error)) => return Err(error),
            Err(Ended::ByServer) => continue,
        };
        followed = true;
        match print_stream(stream, &mut cursor, &mut heading, printing, out).await? {
            Ended::ByServer => pause = FIRST_PAUSE,
            Ended::Refused(error) => return Err(error),
            Ended::Failed(error) => {
                eprintln!(
                    "warning: the stream broke ({}); following again in {}s",
                    error_text(&error),
                    pause.as_secs()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
            }
        }
    }
}

/// A stream after `cursor`, with a fresh token; a refusal that will not go
/// away by itself is [`Ended::Refused`].
async fn open(
    server: Option<&str>,
    login: &LoginMethod,
    query: &AuditQuery,
    cursor: i64,
) -> Result<AuditStream, Ended> {
    let (api, tokens) = authenticated(server, login).await.map_err(Ended::Failed)?;
    let query = AuditQuery {
        cursor: Some(cursor.to_string()),
        ..query.clone()
    };
    match api.audit_stream(&tokens.bearer, &query).await {
        Ok(stream) => Ok(stream),
        Err(error) if passing(&error) => Err(Ended::Failed(explained(error))),
        Err(error) => Err(Ended::Refused(explained(error))),
    }
}

/// Print the records of `stream` as they come, moving `cursor` past each
/// one and past what heartbeats say was read; how the stream ended. Only
/// failing to print is an error.
async fn print_stream(
    mut stream: AuditStream,
    cursor: &mut i64,
    heading: &mut bool,
    (output, terminal): (AuditOutput, bool),
    out: &mut dyn Write,
) -> anyhow::Result<Ended> {
    loop {
        let line = match stream.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => return Ok(Ended::Failed(anyhow::anyhow!("the server closed the connection"))),
            Err(error) => return Ok(Ended::Failed(explained(error))),
        };
        match line {
            StreamLine::Record(record) => {
                *cursor = (*cursor).max(record.seq);
                print_records(std::slice::from_ref(&*record), output, *heading, terminal, out)?;
                *heading = false;
                out.flush()?;
            }
            StreamLine::Heartbeat(beat) => *cursor = (*cursor).max(beat.cursor),
            StreamLine::End(end) => {
                *cursor = (*cursor).max(end.cursor);
                return Ok(Ended::ByServer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use talos_sso_api::ErrorCode;

    fn problem(status: u16, code: &str) -> ApiError {
        ApiError::Problem {
            status,
            code: code.into(),
            error: ErrorCode::Unknown,
            detail: String::new(),
            request_id: String::new(),
        }
    }

    #[test]
    fn only_refusals_that_can_pass_are_tried_again() {
        for (error, again) in [
            (problem(503, "audit_unavailable"), true),
            (problem(429, "rate_limited"), true),
            (problem(401, "token_expired"), true),
            (problem(403, "not_an_auditor"), false),
            (problem(403, "identity_denied"), false),
            (problem(400, "request_invalid"), false),
            (problem(401, "token_audience_invalid"), false),
            (
                ApiError::Unexpected {
                    status: 502,
                    snippet: "bad gateway".into(),
                },
                true,
            ),
            (
                ApiError::Unexpected {
                    status: 404,
                    snippet: "not found".into(),
                },
                false,
            ),
        ] {
            assert_eq!(passing(&error), again, "{error:?}");
        }
    }
}
