//! `status`: who each login is for, with which roles, for how long, read
//! from the certificate actually in the talosconfig.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use time::OffsetDateTime;

use super::format::{Format, print_data};
use super::human_duration;
use super::select::LoginSelection;
use crate::api::ApiClient;
use crate::state::{self, LoginRecord};
use crate::talosconfig;

/// What `status` reports for one login.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoginStatus {
    pub cluster: String,
    pub server: String,
    pub context: String,
    pub talosconfig: PathBuf,
    pub username: Option<String>,
    pub roles: Vec<String>,
    pub not_after: Option<String>,
    pub seconds_left: i64,
    pub valid: bool,
}

/// Read the certificate actually in the talosconfig (not what we remember).
pub fn login_status(cluster: &str, record: &LoginRecord) -> LoginStatus {
    let stored = talosconfig::read_context(&record.talosconfig, &record.context)
        .ok()
        .flatten();
    let leaf = stored
        .as_ref()
        .and_then(|s| crate::certinfo::leaf_info(&s.crt_pem));
    let now = OffsetDateTime::now_utc();
    let seconds_left = leaf
        .as_ref()
        .map(|l| (l.not_after - now).whole_seconds())
        .unwrap_or(0);
    LoginStatus {
        cluster: cluster.to_owned(),
        server: record.server.clone(),
        context: record.context.clone(),
        talosconfig: record.talosconfig.clone(),
        username: leaf.as_ref().and_then(|l| l.common_name.clone()),
        roles: leaf.as_ref().map(|l| l.roles.clone()).unwrap_or_default(),
        not_after: leaf.as_ref().map(|l| {
            l.not_after
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        }),
        seconds_left: seconds_left.max(0),
        valid: leaf.is_some() && seconds_left > 0,
    }
}

/// Print the selected logins; `Ok(true)` when at least one was found and
/// every one found holds a valid certificate (the exit code scripts test,
/// as with `gh auth status`).
pub(super) fn status(select: &LoginSelection, output: Format, out: &mut dyn Write) -> anyhow::Result<bool> {
    let saved = state::load();
    let statuses: Vec<LoginStatus> = select
        .select(&saved)
        .into_iter()
        .map(|(name, record)| login_status(name, record))
        .collect();
    let all_valid = !statuses.is_empty() && statuses.iter().all(|s| s.valid);
    if output != Format::Table {
        print_data(output, &statuses, out)?;
        return Ok(all_valid);
    }
    if statuses.is_empty() {
        if select.is_narrowed() {
            writeln!(out, "No login for {}. Run `talos-sso login`.", select.describe())?;
        } else {
            writeln!(out, "Not logged in anywhere. Run `talos-sso login`.")?;
        }
    }
    for s in statuses {
        writeln!(out, "{}", status_line(&s))?;
    }
    Ok(all_valid)
}

/// What `version` reports, as `--output json|yaml` writes it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VersionReport {
    pub client: ClientVersion,
    /// None when no server is known yet (no `--server`, no login).
    pub server: Option<ServerVersion>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientVersion {
    pub version: String,
    pub api_version: u32,
    /// The source revision it was built from.
    pub commit: String,
}

/// The server's part, named as in its `/v1/info` (`talos_sso_api::ServerInfo`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerVersion {
    pub url: String,
    pub server_version: String,
    pub api_version: u32,
}

/// `version`: this client's version and API version, the server's, and a
/// warning on stderr when the API versions differ (an older or newer
/// server may refuse or misread what this client sends).
pub(super) async fn version(
    server: Option<&str>,
    output: Format,
    out: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let client = ClientVersion {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        api_version: talos_sso_api::API_VERSION,
        commit: crate::REVISION.to_owned(),
    };
    let saved = state::load();
    let Some(server) = server.map(str::to_owned).or(saved.server.clone()) else {
        let report = VersionReport { client, server: None };
        print_version(&report, output, out)?;
        return Ok(ExitCode::SUCCESS);
    };
    let trust = super::login::trusted(&saved, &server, None, None)?;
    let info = ApiClient::trusting(&server, trust.server.as_ref())?
        .info()
        .await
        .map_err(super::explained)?;
    let report = VersionReport {
        client,
        server: Some(ServerVersion {
            url: server,
            server_version: info.server_version.clone(),
            api_version: info.api_version,
        }),
    };
    print_version(&report, output, out)?;
    if info.api_version != talos_sso_api::API_VERSION {
        eprintln!(
            "warning: the server speaks API {} and this client API {}: {}",
            info.api_version,
            talos_sso_api::API_VERSION,
            if info.api_version > talos_sso_api::API_VERSION {
                "update talos-sso"
            } else {
                "this client may ask for what the server does not know; use a client of the server's release"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `report` in `output`'s form; the table is the two lines people read.
fn print_version(report: &VersionReport, output: Format, out: &mut dyn Write) -> anyhow::Result<()> {
    if output != Format::Table {
        return print_data(output, report, out);
    }
    writeln!(
        out,
        "client: talos-sso {} (API {}, commit {})",
        report.client.version, report.client.api_version, report.client.commit
    )?;
    match &report.server {
        None => writeln!(out, "server: none yet (pass --server or log in once)")?,
        Some(server) => writeln!(
            out,
            "server: talos-sso-server {} (API {}) at {}",
            talos_sso_text::bounded(&server.server_version, 64),
            server.api_version,
            talos_sso_text::escape(&server.url)
        )?,
    }
    Ok(())
}

/// One login as `status` shows it; the names are the certificate's and the
/// server's, escaped.
pub(super) fn status_line(s: &LoginStatus) -> String {
    use talos_sso_text::escape;
    let state = if s.valid {
        human_duration(s.seconds_left) + " left"
    } else {
        "expired or missing; run `talos-sso login`".into()
    };
    format!(
        "{}: {} as {} with [{}], {} (context `{}` in {}, server {})",
        escape(&s.cluster),
        if s.valid { "logged in" } else { "not logged in" },
        escape(s.username.as_deref().unwrap_or("?")),
        escape(&s.roles.join(", ")),
        state,
        escape(&s.context),
        escape(&s.talosconfig.display().to_string()),
        escape(&s.server)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_a_person_would_say_them() {
        assert_eq!(human_duration(299), "4m59s");
        assert_eq!(human_duration(3725), "1h02m");
        assert_eq!(human_duration(0), "expired");
    }
}
