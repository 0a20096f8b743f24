//! `status`: who each login is for, with which roles, for how long, read
//! from the certificate actually in the talosconfig.

use std::io::Write;
use std::path::PathBuf;

use clap::ValueEnum;
use serde_json::json;
use time::OffsetDateTime;

use crate::state::{self, LoginRecord};
use crate::talosconfig;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

pub(super) fn human_duration(seconds: i64) -> String {
    if seconds <= 0 {
        return "expired".into();
    }
    let (m, s) = (seconds / 60, seconds % 60);
    if m >= 60 {
        format!("{}h{:02}m", m / 60, m % 60)
    } else {
        format!("{m}m{s:02}s")
    }
}

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

pub(super) fn status(cluster: Option<&str>, output: Output, out: &mut dyn Write) -> anyhow::Result<()> {
    let saved = state::load();
    let statuses: Vec<LoginStatus> = saved
        .logins
        .iter()
        .filter(|(name, _)| cluster.is_none_or(|c| c == name.as_str()))
        .map(|(name, record)| login_status(name, record))
        .collect();
    if output == Output::Json {
        let text = serde_json::to_string_pretty(&json!(statuses))?;
        writeln!(out, "{}", crate::display::json(&text))?;
        return Ok(());
    }
    if statuses.is_empty() {
        writeln!(out, "Not logged in anywhere. Run `talos-sso login`.")?;
        return Ok(());
    }
    for s in statuses {
        writeln!(out, "{}", status_line(&s))?;
    }
    Ok(())
}

/// One login as `status` shows it; the names are the certificate's and the
/// server's, escaped.
pub(super) fn status_line(s: &LoginStatus) -> String {
    use crate::display::escape;
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
