//! Tokens a workload brings instead of a person's login: the bearer token
//! in a file (a Kubernetes projected service-account token, a CI job's ID
//! token written out, a service principal's own token), or one asked for
//! from the GitHub Actions runner ([`super::github_actions`]).
//!
//! A workload token is read or fetched anew for every certificate, and
//! never saved: projected tokens rotate (the kubelet replaces the file),
//! and a workload must not leave a token behind. Nothing here shows a
//! token, in an error or in debug output.

use std::io::Read;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use super::github_actions::{self, GitHubActionsError, RunnerEndpoint};

/// Largest token file read: JWTs are a few KiB, even with many claims.
pub const MAX_TOKEN_FILE: u64 = 16 * 1024;

/// Why no token could be had from a workload's token source.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot read the token file {path}: {source}")]
    Unreadable { path: String, source: std::io::Error },
    #[error("the token file {path} is larger than {MAX_TOKEN_FILE} bytes: it holds no token")]
    TooLarge { path: String },
    #[error("the token file {path} is empty; write the bearer token into it")]
    Empty { path: String },
    #[error("the token file {path} holds more than one token, or text that is no token")]
    NotAToken { path: String },
    #[error(transparent)]
    GitHubActions(#[from] GitHubActionsError),
}

/// A path as an error shows it: escaped, since it may come from the
/// environment.
fn shown(path: &Path) -> String {
    talos_sso_text::escape(&path.display().to_string())
}

/// The bearer token in `path`: one line of printable ASCII (a JWT), the
/// surrounding whitespace ignored.
pub fn read_token_file(path: &Path) -> Result<Zeroizing<String>, WorkloadError> {
    let unreadable = |source| WorkloadError::Unreadable {
        path: shown(path),
        source,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    // Read as bytes: a file that is not UTF-8 is refused as no token,
    // without its bytes in the error.
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(MAX_TOKEN_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_TOKEN_FILE {
        return Err(WorkloadError::TooLarge { path: shown(path) });
    }
    let token = bytes.trim_ascii();
    if token.is_empty() {
        return Err(WorkloadError::Empty { path: shown(path) });
    }
    if !token.iter().all(u8::is_ascii_graphic) {
        return Err(WorkloadError::NotAToken { path: shown(path) });
    }
    Ok(Zeroizing::new(String::from_utf8_lossy(token).into_owned()))
}

/// Where a workload's token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkloadSource {
    /// A file, read again for each certificate.
    File(PathBuf),
    /// The GitHub Actions runner, asked for a token with this audience for
    /// each certificate.
    GitHubActions { audience: String },
}

impl WorkloadSource {
    /// The source chosen on the command line, if any: a token file, or
    /// `--github-actions` with its audience. Both at once is a mistake.
    pub fn chosen(
        token_file: Option<&Path>,
        github_actions: bool,
        audience: Option<&str>,
    ) -> Result<Option<Self>, SourceError> {
        match (token_file, github_actions) {
            (Some(_), true) => Err(SourceError::Both),
            (Some(path), false) => Ok(Some(Self::File(path.to_owned()))),
            (None, true) => {
                let audience = audience
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .ok_or(SourceError::NoAudience)?;
                Ok(Some(Self::GitHubActions {
                    audience: audience.to_owned(),
                }))
            }
            (None, false) => Ok(None),
        }
    }

    /// A token, read or fetched now.
    pub async fn token(&self) -> Result<Zeroizing<String>, WorkloadError> {
        match self {
            Self::File(path) => read_token_file(path),
            Self::GitHubActions { audience } => {
                let runner = RunnerEndpoint::from_env()?;
                Ok(github_actions::fetch(&runner, audience, github_actions::TIMEOUT).await?)
            }
        }
    }

    /// What the source is, for messages: `the token file F`, `GitHub Actions`.
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => format!("the token file {}", shown(path)),
            Self::GitHubActions { audience } => {
                format!("GitHub Actions (audience {})", talos_sso_text::escape(audience))
            }
        }
    }
}

/// A workload token source asked for in a way that cannot work.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("choose one token source: --token-file (or TALOS_SSO_TOKEN_FILE) or --github-actions, not both")]
    Both,
    #[error(
        "--github-actions needs the audience the server expects of GitHub's tokens: pass --audience \
         (or set TALOS_SSO_AUDIENCE), as configured in the server's `github-actions` issuer"
    )]
    NoAudience,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn a_token_file_is_read_trimmed() {
        let (_dir, path) = file_with(b"\n  eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln \r\n");
        assert_eq!(
            read_token_file(&path).unwrap().as_str(),
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
        );
        // The largest file read is still read.
        let (_dir, path) = file_with(&vec![b'a'; MAX_TOKEN_FILE as usize]);
        assert_eq!(read_token_file(&path).unwrap().len(), MAX_TOKEN_FILE as usize);
    }

    #[test]
    fn a_bad_token_file_is_named_and_its_content_never_shown() {
        let secret = "eyJzZWNyZXQiOiJ5ZXMifQ";
        let (_dir, big) = file_with(format!("{secret}{}", "a".repeat(MAX_TOKEN_FILE as usize)).as_bytes());
        let (_dir2, two) = file_with(format!("{secret}\n{secret}\n").as_bytes());
        let (_dir3, binary) = file_with(&[0xff, 0xfe, b'x']);
        let (_dir4, empty) = file_with(b" \n\t\n");
        let missing = empty.with_file_name("nowhere");
        let cases = [
            (big, "is larger than 16384 bytes: it holds no token"),
            (two, "holds more than one token, or text that is no token"),
            (binary, "holds more than one token, or text that is no token"),
            (empty, "is empty; write the bearer token into it"),
            (missing, "cannot read the token file"),
        ];
        for (path, expected) in cases {
            let error = read_token_file(&path).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(
                error.contains(&path.display().to_string()),
                "the file is named: {error}"
            );
            assert!(!error.contains(secret), "{error}");
        }
    }

    #[test]
    fn a_path_with_control_characters_is_shown_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tok\u{1b}[2Jen");
        let error = read_token_file(&path).unwrap_err().to_string();
        assert!(error.contains("tok\\u{1b}[2Jen"), "{error}");
    }

    #[test]
    fn one_source_at_a_time_and_github_needs_an_audience() {
        let file = Path::new("/run/token");
        assert_eq!(
            WorkloadSource::chosen(Some(file), false, None),
            Ok(Some(WorkloadSource::File(file.to_owned())))
        );
        assert_eq!(WorkloadSource::chosen(None, false, Some("x")), Ok(None));
        assert_eq!(
            WorkloadSource::chosen(Some(file), true, Some("talos-sso")),
            Err(SourceError::Both)
        );
        for missing in [None, Some(""), Some("  ")] {
            assert_eq!(
                WorkloadSource::chosen(None, true, missing),
                Err(SourceError::NoAudience)
            );
        }
        assert_eq!(
            WorkloadSource::chosen(None, true, Some("talos-sso")),
            Ok(Some(WorkloadSource::GitHubActions {
                audience: "talos-sso".into()
            }))
        );
        assert!(
            SourceError::NoAudience.to_string().contains("--audience"),
            "{}",
            SourceError::NoAudience
        );
    }

    #[tokio::test]
    async fn a_replaced_file_is_read_anew() {
        let (_dir, path) = file_with(b"first.token.a");
        let source = WorkloadSource::File(path.clone());
        assert_eq!(source.token().await.unwrap().as_str(), "first.token.a");
        // As the kubelet rotates a projected token: a new file renamed over.
        let next = path.with_file_name("token.new");
        std::fs::write(&next, "second.token.b").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(source.token().await.unwrap().as_str(), "second.token.b");
    }
}
