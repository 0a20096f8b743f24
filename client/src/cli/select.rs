//! Which of the saved logins a command means: `--cluster`, and as in
//! talosctl, `--talosconfig` and `--context`, for `status`, `exec` and
//! `logout`. Each flag narrows the choice; none given means every login
//! (`status`) or the default cluster's (`exec`, `logout`).

use std::path::{Path, PathBuf};

use clap::Args;

use crate::state::{ClientState, LoginRecord};

#[derive(Debug, Clone, Default, Args)]
pub struct LoginSelection {
    /// Only this cluster's login.
    #[arg(short, long)]
    pub cluster: Option<String>,
    /// Only logins written into this talosconfig file.
    #[arg(long)]
    pub talosconfig: Option<PathBuf>,
    /// Only the login written as this talosconfig context.
    #[arg(long)]
    pub context: Option<String>,
}

impl LoginSelection {
    /// Whether any flag was given.
    pub fn is_narrowed(&self) -> bool {
        self.cluster.is_some() || self.talosconfig.is_some() || self.context.is_some()
    }

    /// Whether the login of `cluster` recorded as `record` is selected.
    pub fn matches(&self, cluster: &str, record: &LoginRecord) -> bool {
        self.cluster.as_deref().is_none_or(|c| c == cluster)
            && self.context.as_deref().is_none_or(|c| c == record.context)
            && self
                .talosconfig
                .as_deref()
                .is_none_or(|path| same_file(path, &record.talosconfig))
    }

    /// The selected logins, by cluster name.
    pub fn select<'a>(&self, saved: &'a ClientState) -> Vec<(&'a String, &'a LoginRecord)> {
        saved
            .logins
            .iter()
            .filter(|(name, record)| self.matches(name, record))
            .collect()
    }

    /// The one login a command that acts on a single login means (`exec`):
    /// the one the flags select, else the default cluster's. `None` for the
    /// record when there is no such login yet: a cluster named but never
    /// logged in to is logged in to then, into the talosconfig and context
    /// asked for.
    pub fn one(&self, saved: &ClientState) -> anyhow::Result<(String, Option<LoginRecord>)> {
        match self.select(saved).as_slice() {
            [(name, record)] if self.is_narrowed() => Ok(((*name).clone(), Some((*record).clone()))),
            [_, _, ..] if self.is_narrowed() => anyhow::bail!(
                "several logins match {}; name one with --cluster",
                self.describe()
            ),
            _ => {
                let cluster = self
                    .cluster
                    .clone()
                    .or(saved.default_cluster.clone())
                    .ok_or_else(|| anyhow::anyhow!("{}", not_logged_in(saved)))?;
                let record = saved
                    .logins
                    .get(&cluster)
                    .filter(|r| self.matches(&cluster, r))
                    .cloned();
                Ok((cluster, record))
            }
        }
    }

    /// The selection as the person wrote it, for "nothing matches" messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(cluster) = &self.cluster {
            parts.push(format!("cluster `{cluster}`"));
        }
        if let Some(context) = &self.context {
            parts.push(format!("context `{context}`"));
        }
        if let Some(path) = &self.talosconfig {
            parts.push(format!("talosconfig {}", path.display()));
        }
        talos_sso_text::escape(&parts.join(", "))
    }
}

/// Two names of one file: equal after resolving both, or as written when
/// either cannot be resolved (a file that was deleted since).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// What to run when there is no login to act on: the first login needs the
/// server's address, a later one only the cluster.
fn not_logged_in(saved: &ClientState) -> &'static str {
    if saved.server.is_none() {
        "not logged in yet: run `talos-sso login --server https://talos-sso.example.com` once, \
         with the address your platform team gives"
    } else {
        "no cluster yet: run `talos-sso login` (with --cluster NAME when the server has several)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(context: &str, talosconfig: &Path) -> LoginRecord {
        LoginRecord {
            server: "https://sso".into(),
            context: context.into(),
            talosconfig: talosconfig.to_owned(),
            username: "bob".into(),
            roles: vec![],
            not_after: String::new(),
            targets_written: None,
            workload: false,
        }
    }

    #[test]
    fn each_flag_narrows_and_paths_compare_as_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, "contexts: {}\n").unwrap();
        let other = dir.path().join("other");
        let mut saved = ClientState::default();
        saved.logins.insert("prod".into(), record("prod", &file));
        saved.logins.insert("lab".into(), record("lab-ctx", &other));
        let names = |selection: &LoginSelection| -> Vec<String> {
            selection
                .select(&saved)
                .into_iter()
                .map(|(n, _)| n.clone())
                .collect()
        };
        assert_eq!(names(&LoginSelection::default()), ["lab", "prod"]);
        let by_context = LoginSelection {
            context: Some("lab-ctx".into()),
            ..Default::default()
        };
        assert_eq!(names(&by_context), ["lab"]);
        // The same file through another path (`dir/./config`).
        let by_file = LoginSelection {
            talosconfig: Some(dir.path().join(".").join("config")),
            ..Default::default()
        };
        assert_eq!(names(&by_file), ["prod"]);
        let nothing = LoginSelection {
            cluster: Some("prod".into()),
            context: Some("lab-ctx".into()),
            ..Default::default()
        };
        assert!(names(&nothing).is_empty());
        assert_eq!(nothing.describe(), "cluster `prod`, context `lab-ctx`");
    }

    #[test]
    fn one_login_is_the_selected_or_the_default_clusters_and_never_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        let mut saved = ClientState::default();
        let error = LoginSelection::default().one(&saved).unwrap_err().to_string();
        assert_eq!(
            error,
            "not logged in yet: run `talos-sso login --server https://talos-sso.example.com` once, \
             with the address your platform team gives"
        );
        saved.server = Some("https://sso.example".into());
        let error = LoginSelection::default().one(&saved).unwrap_err().to_string();
        assert_eq!(
            error,
            "no cluster yet: run `talos-sso login` (with --cluster NAME when the server has several)"
        );
        saved.default_cluster = Some("prod".into());
        saved.logins.insert("prod".into(), record("ops", &file));
        saved.logins.insert("lab".into(), record("ops", &file));
        let (cluster, found) = LoginSelection::default().one(&saved).unwrap();
        assert_eq!((cluster.as_str(), found.is_some()), ("prod", true));
        // Both logins are written as context `ops` in one file.
        let by_context = LoginSelection {
            context: Some("ops".into()),
            ..Default::default()
        };
        assert_eq!(
            by_context.one(&saved).unwrap_err().to_string(),
            "several logins match context `ops`; name one with --cluster"
        );
        // A cluster never logged in to: no record, to be logged in to.
        let staging = LoginSelection {
            cluster: Some("staging".into()),
            ..Default::default()
        };
        assert_eq!(staging.one(&saved).unwrap(), ("staging".into(), None));
        // The default cluster's login in another context than the one asked for.
        let other_context = LoginSelection {
            context: Some("elsewhere".into()),
            ..Default::default()
        };
        assert_eq!(other_context.one(&saved).unwrap(), ("prod".into(), None));
    }
}
