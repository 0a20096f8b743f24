//! Where a configuration comes from and how it is read: the file, its
//! cluster files and the environment overrides, typed into a [`Config`];
//! and the snapshot a reload compares and loads.

use std::path::{Path, PathBuf};

use super::document::{self, ClusterFile, Format};
use super::{Check, Config, ConfigError, Document, ENV_PREFIX, invalid};

/// A configuration file and the environment overrides it was read with.
#[derive(Clone)]
pub struct ConfigSource {
    path: PathBuf,
    overrides: Vec<(String, String)>,
    /// The check it was loaded with, run again at each load.
    check: Check,
}

/// Names the variables, never their values.
impl std::fmt::Debug for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.overrides.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ConfigSource")
            .field("path", &self.path)
            .field("overrides", &names)
            .finish()
    }
}

impl ConfigSource {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Read the file again, with the same overrides.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.snapshot()?.load()
    }

    /// The configuration's files as they are now, read once: what is
    /// compared and what is loaded are the same text.
    pub fn snapshot(&self) -> Result<Snapshot, ConfigError> {
        Ok(Snapshot {
            files: Files::read(&self.path, &self.overrides)?,
            source: self.clone(),
        })
    }
}

/// The configuration's files as read at one moment (see
/// [`ConfigSource::snapshot`]).
pub struct Snapshot {
    files: Files,
    source: ConfigSource,
}

/// Names the files by their digest, never their text.
impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("source", &self.source)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl Snapshot {
    /// The digest of these files (see [`Config::fingerprint`]).
    pub fn fingerprint(&self) -> String {
        self.files.fingerprint()
    }

    /// The configuration these files hold.
    pub fn load(self) -> Result<Config, ConfigError> {
        Config::from_files(
            &self.source.path,
            self.files,
            self.source.overrides,
            self.source.check,
        )
    }
}

/// What a configuration is read from: the file's text and its cluster files.
struct Files {
    text: String,
    document: serde_yaml_ng::Value,
    clusters: Vec<ClusterFile>,
}

impl Files {
    fn read(path: &Path, overrides: &[(String, String)]) -> Result<Self, ConfigError> {
        let format = Format::of(path).ok_or_else(|| {
            ConfigError::Load(format!("{}: use a .yaml, .yml or .toml file", path.display()))
        })?;
        let text = crate::text_file::read(path)
            .map_err(|e| ConfigError::Load(format!("{}: {e}", path.display())))?;
        let document = document::parse(&text, format)
            .map_err(|e| ConfigError::Load(format!("{}: {e}", path.display())))?;
        let clusters = match clusters_dir(&document, overrides) {
            Some(dir) => {
                let base = path.parent().unwrap_or(Path::new("."));
                document::read_cluster_dir(&base.join(dir))?
            }
            None => Vec::new(),
        };
        Ok(Self {
            text,
            document,
            clusters,
        })
    }

    fn fingerprint(&self) -> String {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for (name, text) in std::iter::once(("", self.text.as_str()))
            .chain(self.clusters.iter().map(|f| (f.name.as_str(), f.text.as_str())))
        {
            // Lengths first: no two different lists of files share a digest.
            for part in [name, text] {
                digest.update(&(part.len() as u64).to_be_bytes());
                digest.update(part.as_bytes());
            }
        }
        hex::encode(digest.finish())
    }
}

/// `clusters_dir` as the environment or the document sets it.
fn clusters_dir(document: &serde_yaml_ng::Value, overrides: &[(String, String)]) -> Option<PathBuf> {
    let from_env = overrides
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(&format!("{ENV_PREFIX}__CLUSTERS_DIR")))
        .map(|(_, value)| value.clone());
    from_env
        .or_else(|| {
            document
                .get("clusters_dir")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
}

/// The override variables an error message points at: those whose last
/// key segment the message names, else all of them (sorted).
fn culprits(names: &[String], message: &str) -> String {
    let mut named: Vec<&String> = names
        .iter()
        .filter(|name| {
            name.rsplit("__")
                .next()
                .is_some_and(|key| message.contains(&format!("`{}`", key.to_lowercase())))
        })
        .collect();
    if named.is_empty() {
        named = names.iter().collect();
    }
    named.sort();
    named.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
}

impl Config {
    /// Read `path` (YAML or TOML by extension), the cluster files of its
    /// `clusters_dir`, and apply environment overrides.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_with_env(path, std::env::vars())
    }

    /// As [`Config::load`], with the environment given (tests).
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::load_with_env_checked(path, env, super::no_check)
    }

    /// As [`Config::load`], with `check` run as the file's own checks are
    /// (and again by every reload of this configuration).
    pub fn load_checked(path: &Path, check: Check) -> Result<Self, ConfigError> {
        Self::load_with_env_checked(path, std::env::vars(), check)
    }

    /// As [`Config::load_checked`], with the environment given (tests).
    pub fn load_with_env_checked(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
        check: Check,
    ) -> Result<Self, ConfigError> {
        let overrides = document::overrides(env);
        let files = Files::read(path, &overrides)?;
        Self::from_files(path, files, overrides, check)
    }

    fn from_files(
        path: &Path,
        files: Files,
        overrides: Vec<(String, String)>,
        check: Check,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::typed(files.document.clone(), &files.clusters, &overrides, check)?;
        config.fingerprint = files.fingerprint();
        config.source = Some(ConfigSource {
            path: std::path::absolute(path).unwrap_or_else(|_| path.to_owned()),
            overrides,
            check,
        });
        Ok(config)
    }

    /// As [`Config::load_with_env`], for the text of a file in `format`
    /// (YAML or TOML) already read: the whole loader but the file system,
    /// so `clusters_dir` is refused here.
    pub fn from_text_with_env(
        text: &str,
        format: config::FileFormat,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        let format = match format {
            config::FileFormat::Toml => Format::Toml,
            _ => Format::Yaml,
        };
        let overrides = document::overrides(env);
        let parsed = document::parse(text, format).map_err(ConfigError::Load)?;
        if clusters_dir(&parsed, &overrides).is_some() {
            return Err(invalid(
                "clusters_dir is read next to a configuration file: load the file instead of its text",
            ));
        }
        Self::typed(parsed, &[], &overrides, super::no_check)
    }

    /// The document (with its cluster files) typed and checked, the
    /// overrides applied; a mistake the overrides make is blamed on them.
    fn typed(
        mut document: serde_yaml_ng::Value,
        cluster_files: &[ClusterFile],
        overrides: &[(String, String)],
        check: Check,
    ) -> Result<Self, ConfigError> {
        document::merge_clusters(&mut document, cluster_files)?;
        let parse = |document: serde_yaml_ng::Value| {
            let mut config: Config = config::Config::try_from(&document)
                .map_err(|e| ConfigError::Load(e.to_string()))?
                .try_deserialize()
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
            config.validate()?;
            check(&config)?;
            config.link_sections();
            config.document = Document(document);
            Ok::<_, ConfigError>(config)
        };
        if overrides.is_empty() {
            return parse(document);
        }
        let from_file = document.clone();
        document::apply_overrides(&mut document, overrides)?;
        let names = overrides.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        match parse(document) {
            Ok(config) => Ok(config),
            // Blame the environment when the file alone is fine, or fails
            // for another reason than the combination does.
            Err(error) => match parse(from_file) {
                Err(file_error) if file_error.to_string() == error.to_string() => Err(error),
                _ => Err(ConfigError::Environment {
                    variables: culprits(&names, &error.to_string()),
                    reason: match error {
                        ConfigError::Invalid(reason) | ConfigError::Load(reason) => reason,
                        other => other.to_string(),
                    },
                }),
            },
        }
    }

    /// Parse from a string (tests and `check`).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let mut config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        if config.clusters_dir.is_some() {
            return Err(invalid(
                "clusters_dir is read next to a configuration file: load the file instead of its text",
            ));
        }
        config.validate()?;
        config.link_sections();
        config.document = Document(document::parse(text, Format::Yaml).map_err(ConfigError::Invalid)?);
        Ok(config)
    }

    /// What one section tells another, once both are read: a console with
    /// a client of its own logs in through the login issuer, so the ID
    /// tokens it redeems may name that client.
    fn link_sections(&mut self) {
        self.identity.console_client_id = self
            .console
            .enabled
            .then(|| self.console.client_id.clone())
            .flatten();
    }
}
