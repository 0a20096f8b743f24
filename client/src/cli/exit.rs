//! The process status of talos-sso's own outcomes, in one place: 0 done,
//! 1 an error, 2 a command line clap did not understand, 4 a login is
//! needed, 5 refused by the server's policy or deny list (`docs/cli.md`,
//! "Exit codes"). Scripts and shell prompts test these, as they do `gh`'s.
//! `exec` passes its child's own status instead once the child ran.

use std::process::ExitCode;

use talos_sso_api::ErrorCode;

use crate::api::ApiError;
use crate::login::LoginError;

/// An outcome of talos-sso itself, as its process status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 0: done.
    Success,
    /// 1: anything not below (unreachable server, bad file, rate limit, ...).
    Error,
    /// 2: the command line was not understood; clap itself exits with it.
    Usage,
    /// 4: a login is needed: none yet, expired, the refresh token refused
    /// or revoked by the identity provider, logged out, or the login that
    /// would have replaced it did not finish.
    LoginNeeded,
    /// 5: the server refused by policy (no rule, role not permitted or
    /// required, not an auditor or administrator, organisation not
    /// allowed) or because the identity is on the deny list.
    Refused,
}

impl Outcome {
    /// The process status.
    pub const fn status(self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::Error => 1,
            Outcome::Usage => 2,
            Outcome::LoginNeeded => 4,
            Outcome::Refused => 5,
        }
    }

    /// The class of a server `code`. Exhaustive on purpose: a new code does
    /// not compile until someone decides what scripts should see for it.
    pub const fn of_code(code: &ErrorCode) -> Outcome {
        match code {
            // The login is stale: a fresh one fixes it.
            ErrorCode::TokenMissing | ErrorCode::TokenExpired { .. } | ErrorCode::TokenReplayed => {
                Outcome::LoginNeeded
            }
            // Who you are is not allowed what you asked: policy or deny list.
            ErrorCode::NoMatchingRule { .. }
            | ErrorCode::WorkloadNotAdmitted
            | ErrorCode::RoleNotPermitted { .. }
            | ErrorCode::RoleRequired { .. }
            | ErrorCode::IdentityDenied
            | ErrorCode::NotAnAuditor
            | ErrorCode::NotAnAdmin
            | ErrorCode::TokenTenantMissing
            | ErrorCode::TokenTenantNotAllowed => Outcome::Refused,
            // A clock, a misconfiguration, the request itself or the server:
            // neither a new login nor someone's permission changes them.
            ErrorCode::TokenNotYetValid { .. }
            | ErrorCode::TokenIssuedInFuture { .. }
            | ErrorCode::TokenMalformed
            | ErrorCode::TokenAlgorithmNotAllowed
            | ErrorCode::TokenKeyUnknown
            | ErrorCode::TokenSignatureInvalid
            | ErrorCode::TokenIssuerInvalid
            | ErrorCode::TokenIssuerUntrusted
            | ErrorCode::TokenAudienceInvalid
            | ErrorCode::TokenClientInvalid
            | ErrorCode::TokenSubjectMissing
            | ErrorCode::TokenUsernameMissing
            | ErrorCode::GroupsOverageUnresolved
            | ErrorCode::RateLimited { .. }
            | ErrorCode::ClusterUnknown { .. }
            | ErrorCode::TtlInvalid
            | ErrorCode::TtlTooLong { .. }
            | ErrorCode::CsrInvalid { .. }
            | ErrorCode::SubjectRequired
            | ErrorCode::SubjectAmbiguous { .. }
            | ErrorCode::AlreadyDenied { .. }
            | ErrorCode::CheckpointsNotConfigured
            | ErrorCode::AuditUnavailable
            | ErrorCode::SigningUnavailable
            | ErrorCode::NotFound
            | ErrorCode::MethodNotAllowed
            | ErrorCode::BodyTooLarge
            | ErrorCode::RequestTimeout
            | ErrorCode::RequestInvalid { .. }
            | ErrorCode::InternalError
            | ErrorCode::Unknown => Outcome::Error,
        }
    }

    /// The class of a failed login with the identity provider: one that
    /// did not finish leaves the login still needed; one that could not
    /// start (provider unreachable, misconfigured) is an error.
    pub const fn of_login(error: &LoginError) -> Outcome {
        match error {
            LoginError::Timeout(_)
            | LoginError::Refused(_)
            | LoginError::DeviceExpired
            | LoginError::DeviceDeclined => Outcome::LoginNeeded,
            LoginError::Discovery { .. }
            | LoginError::Unreachable(_)
            | LoginError::Invalid(_)
            | LoginError::NoDeviceEndpoint
            | LoginError::Callback(_) => Outcome::Error,
        }
    }

    /// The outcome of a command that failed with `error`: the first cause
    /// in its chain that has a class, else [`Outcome::Error`].
    pub fn of_error(error: &anyhow::Error) -> Outcome {
        error
            .chain()
            .find_map(|cause| {
                if let Some(classed) = cause.downcast_ref::<Classed>() {
                    Some(classed.outcome)
                } else if let Some(ApiError::Problem { error, .. }) = cause.downcast_ref::<ApiError>() {
                    Some(Outcome::of_code(error))
                } else {
                    cause.downcast_ref::<LoginError>().map(Outcome::of_login)
                }
            })
            .unwrap_or(Outcome::Error)
    }
}

impl From<Outcome> for ExitCode {
    fn from(outcome: Outcome) -> Self {
        ExitCode::from(outcome.status())
    }
}

/// An error that carries its outcome; it reads as the error it wraps.
#[derive(Debug)]
pub struct Classed {
    outcome: Outcome,
    error: anyhow::Error,
}

impl std::fmt::Display for Classed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The whole chain of the wrapped error, as `{:#}` shows it: the
        // wrapper adds no sentence and hides no cause.
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Classed {}

/// `error`, with `outcome` as the process status it ends with.
pub fn classed(outcome: Outcome, error: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(Classed { outcome, error })
}

/// A server error as the sentence [`crate::messages`] makes of it (for a
/// certificate on `cluster`, or `""`), keeping the class of its code.
pub fn explained(error: &ApiError, cluster: &str) -> anyhow::Error {
    let outcome = match error {
        ApiError::Problem { error, .. } => Outcome::of_code(error),
        ApiError::Unreachable(_) | ApiError::Unexpected { .. } => Outcome::Error,
    };
    classed(outcome, anyhow::anyhow!(crate::messages::explain(error, cluster)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(code: ErrorCode) -> ApiError {
        ApiError::Problem {
            status: 403,
            code: code.code().into(),
            error: code,
            detail: "detail".into(),
            request_id: "req-1".into(),
        }
    }

    #[test]
    fn policy_and_deny_list_refusals_are_five_stale_logins_four() {
        for code in [
            ErrorCode::NoMatchingRule { would_grant: vec![] },
            ErrorCode::RoleNotPermitted {
                refused: vec![],
                entitled: vec![],
            },
            ErrorCode::RoleRequired { entitled: vec![] },
            ErrorCode::IdentityDenied,
            ErrorCode::NotAnAuditor,
            ErrorCode::NotAnAdmin,
            ErrorCode::TokenTenantMissing,
            ErrorCode::TokenTenantNotAllowed,
        ] {
            let error = explained(&refusal(code.clone()), "prod").context("logging in");
            assert_eq!(Outcome::of_error(&error).status(), 5, "{code:?}");
        }
        let expired = ErrorCode::TokenExpired {
            server_time: String::new(),
        };
        assert_eq!(Outcome::of_error(&explained(&refusal(expired), "")).status(), 4);
        for code in [ErrorCode::TokenMissing, ErrorCode::TokenReplayed] {
            assert_eq!(
                Outcome::of_error(&explained(&refusal(code.clone()), "")).status(),
                4,
                "{code:?}"
            );
        }
        let limited = ErrorCode::RateLimited {
            retry_after_seconds: 1,
        };
        assert_eq!(Outcome::of_error(&explained(&refusal(limited), "")).status(), 1);
    }

    #[test]
    fn a_classed_error_reads_as_before_and_unclassed_ones_are_one() {
        let inner = anyhow::anyhow!("problem").context("while");
        let error = classed(Outcome::LoginNeeded, inner);
        assert_eq!(format!("{error:#}"), "while: problem");
        assert_eq!(crate::cli::error_text(&error), "while: problem");
        assert_eq!(Outcome::of_error(&error), Outcome::LoginNeeded);
        assert_eq!(Outcome::of_error(&anyhow::anyhow!("other")), Outcome::Error);
        let timeout = anyhow::Error::from(LoginError::Timeout(std::time::Duration::from_secs(1)));
        assert_eq!(Outcome::of_error(&timeout.context("logging in")).status(), 4);
    }

    #[test]
    fn a_login_that_did_not_finish_is_four_one_that_could_not_start_is_one() {
        for (error, status) in [
            (LoginError::Timeout(std::time::Duration::from_secs(1)), 4),
            (LoginError::Refused("invalid_grant".into()), 4),
            (LoginError::DeviceExpired, 4),
            (LoginError::DeviceDeclined, 4),
            (
                LoginError::Discovery {
                    issuer: "https://idp".into(),
                    reason: "down".into(),
                },
                1,
            ),
            (LoginError::Invalid("nonce".into()), 1),
            (LoginError::NoDeviceEndpoint, 1),
            (LoginError::Callback("closed".into()), 1),
        ] {
            let shown = error.to_string();
            let error = anyhow::Error::from(error).context("logging in");
            assert_eq!(Outcome::of_error(&error).status(), status, "{shown}");
        }
    }

    #[test]
    fn a_server_error_keeps_its_class_unexplained_and_a_malformed_answer_is_one() {
        let raw = anyhow::Error::from(refusal(ErrorCode::NotAnAdmin)).context("listing");
        assert_eq!(Outcome::of_error(&raw), Outcome::Refused);
        let unexpected = ApiError::Unexpected {
            status: 502,
            snippet: String::new(),
        };
        assert_eq!(Outcome::of_error(&explained(&unexpected, "")), Outcome::Error);
        assert_eq!(
            Outcome::of_error(&anyhow::Error::from(unexpected)),
            Outcome::Error
        );
    }
}
