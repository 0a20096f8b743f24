//! The configuration as a document, before it is typed: the main file
//! (YAML or TOML), the clusters of `clusters_dir` (one file per cluster)
//! merged into its `clusters`, then the `TALOS_SSO__*` overrides, each
//! applied to the key it names.
//!
//! Keys keep their case. An override's path is matched against the keys
//! already there regardless of case, so `TALOS_SSO__CLUSTERS__PROD__TTL`
//! reaches a cluster named `Prod` (environment variables are upper case by
//! custom, and Kubernetes and systemd pass them as written). A list is
//! written `[a, b]` for any list key; a plain `a,b` is split at commas
//! where the key already holds a list, and for the identity lists that
//! were always read that way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_yaml_ng::{Mapping, Value};

use super::{ConfigError, ENV_PREFIX};

/// The formats a configuration file may be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Toml,
}

impl Format {
    /// By the file's extension: `.yaml`, `.yml` or `.toml`.
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Some(Self::Yaml),
            Some("toml") => Some(Self::Toml),
            _ => None,
        }
    }
}

/// Keys read as comma-separated lists even where the file does not set
/// them: the lists the environment could always set that way.
const COMMA_LISTS: [&str; 3] = [
    "identity.audiences",
    "identity.allowed_tenants",
    "identity.scopes",
];

/// The most cluster files `clusters_dir` may hold (each is bounded by
/// [`crate::text_file::read`]).
const MAX_CLUSTER_FILES: usize = 10_000;

/// Parse `text` into a document. YAML aliases are expanded with
/// serde_yaml_ng's bound, so a few lines of nested aliases cannot grow into
/// billions of nodes.
pub fn parse(text: &str, format: Format) -> Result<Value, String> {
    let document = match format {
        Format::Yaml => serde_yaml_ng::from_str::<Value>(text).map_err(|e| e.to_string())?,
        Format::Toml => {
            let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
            serde_yaml_ng::to_value(table).map_err(|e| e.to_string())?
        }
    };
    match document {
        // An empty file is an empty document; its missing keys are named
        // when it is typed.
        Value::Null => Ok(Value::Mapping(Mapping::new())),
        Value::Mapping(_) => Ok(document),
        _ => Err("the configuration must be a mapping of keys to values".into()),
    }
}

/// One file of `clusters_dir`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterFile {
    /// The cluster's name: the file name without its extension.
    pub name: String,
    pub path: PathBuf,
    pub text: String,
}

/// The cluster files of `dir`: every `*.yaml`, `*.yml` and `*.toml` file,
/// by name; names starting with `.` are skipped (a Kubernetes ConfigMap
/// volume keeps its versions in `..data` and friends).
pub fn read_cluster_dir(dir: &Path) -> Result<Vec<ClusterFile>, ConfigError> {
    let fail = |reason: String| ConfigError::Load(format!("clusters_dir {}: {reason}", dir.display()));
    let mut entries = std::fs::read_dir(dir)
        .and_then(|entries| {
            entries
                .map(|entry| entry.map(|e| e.path()))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| fail(e.to_string()))?;
    // By name, so that what is said about two files is said the same way
    // on every file system.
    entries.sort();
    let mut files: BTreeMap<String, ClusterFile> = BTreeMap::new();
    for path in entries {
        // Names are looked at as the file system has them: a stray file
        // with a name that is not UTF-8 (a hidden one, a README) is not a
        // cluster, and no reason to refuse the others.
        let os_name = path.file_name().unwrap_or_default();
        if os_name.as_encoded_bytes().starts_with(b".") || Format::of(&path).is_none() {
            continue;
        }
        let Some(file_name) = os_name.to_str() else {
            return Err(fail(format!("{path:?}: a cluster file's name must be UTF-8")));
        };
        // Followed: ConfigMap files are links into `..data`. A link that
        // leads nowhere, or to something that is not a file, is an error
        // rather than a cluster silently gone.
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => {}
            Ok(_) => return Err(fail(format!("{file_name} is not a regular file"))),
            Err(error) => return Err(fail(format!("{file_name}: {error}"))),
        }
        let name = Path::new(file_name)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_owned();
        if files.len() == MAX_CLUSTER_FILES {
            return Err(fail(format!("more than {MAX_CLUSTER_FILES} cluster files")));
        }
        let text = crate::text_file::read(&path).map_err(|e| fail(format!("{file_name}: {e}")))?;
        if let Some(other) = files.get(&name) {
            return Err(fail(format!(
                "{} and {file_name} both describe cluster `{name}`",
                other.path.file_name().unwrap_or_default().to_string_lossy()
            )));
        }
        files.insert(name.clone(), ClusterFile { name, path, text });
    }
    Ok(files.into_values().collect())
}

/// Add each cluster file to the document's `clusters`. A cluster named in
/// both the main file and a cluster file is refused: which one holds
/// would be a guess.
pub fn merge_clusters(document: &mut Value, files: &[ClusterFile]) -> Result<(), ConfigError> {
    if files.is_empty() {
        return Ok(());
    }
    let Value::Mapping(root) = document else {
        return Err(ConfigError::Load("the configuration must be a mapping".into()));
    };
    let clusters = root
        .entry(Value::String("clusters".into()))
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if clusters.is_null() {
        *clusters = Value::Mapping(Mapping::new());
    }
    let Value::Mapping(clusters) = clusters else {
        return Err(ConfigError::Invalid(
            "`clusters` must be a mapping of names to clusters".into(),
        ));
    };
    for file in files {
        let format = Format::of(&file.path).unwrap_or(Format::Yaml);
        let cluster = parse(&file.text, format)
            .map_err(|e| ConfigError::Load(format!("{}: {e}", file.path.display())))?;
        let key = Value::String(file.name.clone());
        if clusters.contains_key(&key) {
            return Err(ConfigError::Invalid(format!(
                "cluster `{}` is in the configuration file and in {}: keep one",
                file.name,
                file.path.display()
            )));
        }
        clusters.insert(key, cluster);
    }
    Ok(())
}

/// The `TALOS_SSO__*` variables among `env`, sorted by name so that the
/// outcome never depends on the order the environment lists them in.
pub fn overrides(env: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let prefix = format!("{ENV_PREFIX}__");
    let mut overrides: Vec<_> = env.into_iter().filter(|(k, _)| k.starts_with(&prefix)).collect();
    overrides.sort();
    overrides
}

/// Apply every override to the document; the first that cannot be applied
/// is named with the reason.
pub fn apply_overrides(document: &mut Value, overrides: &[(String, String)]) -> Result<(), ConfigError> {
    // The key each variable set: two that reach one key (`..__LISTEN` and
    // `..__listen`) are refused, rather than one silently winning.
    let mut placed: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in overrides {
        let fail = |reason: String| ConfigError::Environment {
            variables: name.clone(),
            reason,
        };
        let key = apply_override(document, name, value).map_err(fail)?;
        if let Some(other) = placed.insert(key.clone(), name) {
            return Err(ConfigError::Environment {
                variables: format!("{other}, {name}"),
                reason: format!("both set `{key}`: keep one"),
            });
        }
    }
    Ok(())
}

/// Set the key `name` names to `value`; the key's path, as placed.
fn apply_override(document: &mut Value, name: &str, value: &str) -> Result<String, String> {
    let path = name
        .strip_prefix(ENV_PREFIX)
        .and_then(|rest| rest.strip_prefix("__"))
        .unwrap_or(name);
    let segments: Vec<&str> = path.split("__").collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err("a key segment is empty (`__` separates keys, one at a time)".into());
    }
    let mut node = document;
    let mut walked: Vec<String> = Vec::with_capacity(segments.len());
    for (index, segment) in segments.iter().enumerate() {
        let last = index + 1 == segments.len();
        let at = if walked.is_empty() {
            "the configuration".to_owned()
        } else {
            format!("`{}`", walked.join("."))
        };
        if node.is_null() {
            *node = Value::Mapping(Mapping::new());
        }
        let Value::Mapping(map) = node else {
            return Err(if node.is_sequence() {
                format!("{at} is a list: set it whole, as `[a, b]`")
            } else {
                format!("{at} is a value, not a section")
            });
        };
        let key = matching_key(map, segment)?;
        walked.push(key.clone());
        let entry = map.entry(Value::String(key)).or_insert(Value::Null);
        if last {
            let key = walked.join(".");
            *entry = override_value(entry, &key, value)?;
            return Ok(key);
        }
        node = entry;
    }
    Ok(walked.join("."))
}

/// The key of `map` that `segment` names: the key written exactly so, else
/// the one key equal to it but for case, else `segment` in lower case (a
/// key the file does not set yet).
fn matching_key(map: &Mapping, segment: &str) -> Result<String, String> {
    if map.contains_key(segment) {
        return Ok(segment.to_owned());
    }
    let matches: Vec<&str> = map
        .keys()
        .filter_map(Value::as_str)
        .filter(|key| key.eq_ignore_ascii_case(segment))
        .collect();
    match matches.as_slice() {
        [] => Ok(segment.to_ascii_lowercase()),
        [one] => Ok((*one).to_owned()),
        several => Err(format!(
            "`{segment}` matches {} keys that differ only in case ({}): rename one",
            several.len(),
            several.join(", ")
        )),
    }
}

/// The value an override sets: a list where one is written or expected,
/// else the text itself (typed when the configuration is read: `8` becomes
/// a number where one is wanted).
fn override_value(current: &Value, key: &str, text: &str) -> Result<Value, String> {
    let list_key = current.is_sequence() || COMMA_LISTS.contains(&key);
    if text.trim_start().starts_with('[') {
        match serde_yaml_ng::from_str::<Value>(text) {
            Ok(list @ Value::Sequence(_)) => return Ok(list),
            // `[::]:8443` is an address, not a list gone wrong.
            _ if !list_key => return Ok(Value::String(text.to_owned())),
            Ok(_) | Err(_) => {
                return Err(format!(
                    "`{key}` is a list, and this value starts like one but is not: write `[a, b]`"
                ));
            }
        }
    }
    if list_key {
        // An unset variable expanded to nothing must not quietly empty a
        // list (of tenants, of auditors, of trusted proxies).
        if text.trim().is_empty() {
            return Err(format!(
                "`{key}` is a list and the value is empty: write `[]` for an empty list"
            ));
        }
        return Ok(Value::Sequence(
            text.split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| Value::String(item.to_owned()))
                .collect(),
        ));
    }
    Ok(Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Value {
        parse(text, Format::Yaml).unwrap()
    }

    fn set(document: &mut Value, name: &str, value: &str) -> Result<(), String> {
        apply_overrides(document, &[(name.to_owned(), value.to_owned())]).map_err(|e| e.to_string())
    }

    #[test]
    fn overrides_reach_keys_whatever_their_case_and_set_lists() {
        let mut document = doc("clusters:\n  Prod:\n    endpoints: [a]\n  lab: {}\nauditors: {}\n");
        set(&mut document, "TALOS_SSO__CLUSTERS__PROD__TTL", "10m").unwrap();
        set(
            &mut document,
            "TALOS_SSO__CLUSTERS__PROD__ENDPOINTS",
            "cp-1, cp-2",
        )
        .unwrap();
        set(&mut document, "TALOS_SSO__CLUSTERS__LAB__ENDPOINTS", "[x, y]").unwrap();
        set(&mut document, "TALOS_SSO__AUDITORS__GROUPS", "[g-1]").unwrap();
        set(&mut document, "TALOS_SSO__IDENTITY__SCOPES", "openid,groups").unwrap();
        set(&mut document, "TALOS_SSO__LISTEN", "[::]:8443").unwrap();
        assert_eq!(
            document,
            doc(
                "clusters:\n  Prod:\n    endpoints: [cp-1, cp-2]\n    ttl: 10m\n  lab:\n    endpoints: [x, y]\n\
                 auditors:\n  groups: [g-1]\nidentity:\n  scopes: [openid, groups]\nlisten: '[::]:8443'\n"
            )
        );
    }

    #[test]
    fn overrides_that_cannot_be_placed_are_refused_with_the_reason() {
        let mut document = doc("clusters:\n  prod:\n    rules: []\n    ttl: 5m\n  PROD: {}\n");
        for (name, reason) in [
            (
                "TALOS_SSO__CLUSTERS__Prod__TTL",
                "differ only in case (prod, PROD)",
            ),
            (
                "TALOS_SSO__CLUSTERS__prod__RULES__0",
                "`clusters.prod.rules` is a list",
            ),
            (
                "TALOS_SSO__CLUSTERS__prod__TTL__X",
                "`clusters.prod.ttl` is a value",
            ),
            ("TALOS_SSO__CLUSTERS____TTL", "a key segment is empty"),
        ] {
            let error = set(&mut document, name, "1").unwrap_err();
            assert!(
                error.starts_with(&format!("invalid configuration from the environment ({name}): ")),
                "{error}"
            );
            assert!(error.contains(reason), "{name}: {error}");
        }
    }

    #[test]
    fn overrides_that_would_quietly_change_a_list_or_two_that_meet_are_refused() {
        let mut document = doc("identity:\n  allowed_tenants: [t-1]\nauditors:\n  groups: [g]\n");
        for (name, value, reason) in [
            (
                "TALOS_SSO__IDENTITY__ALLOWED_TENANTS",
                "",
                "write `[]` for an empty list",
            ),
            (
                "TALOS_SSO__AUDITORS__GROUPS",
                "  ",
                "write `[]` for an empty list",
            ),
            (
                "TALOS_SSO__AUDITORS__GROUPS",
                "[adm-1, adm-2",
                "starts like one but is not",
            ),
            (
                "TALOS_SSO__IDENTITY__SCOPES",
                "[openid]x",
                "starts like one but is not",
            ),
        ] {
            let error = set(&mut document, name, value).unwrap_err();
            assert!(error.contains(reason), "{name}={value:?}: {error}");
        }
        // An explicit empty list is what it says.
        set(&mut document, "TALOS_SSO__AUDITORS__GROUPS", "[]").unwrap();
        assert_eq!(document["auditors"]["groups"], Value::Sequence(vec![]));
        let both = [
            ("TALOS_SSO__LISTEN".to_owned(), "127.0.0.1:1".to_owned()),
            ("TALOS_SSO__listen".to_owned(), "127.0.0.1:2".to_owned()),
        ];
        let error = apply_overrides(&mut document, &overrides(both))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("(TALOS_SSO__LISTEN, TALOS_SSO__listen): both set `listen`"),
            "{error}"
        );
    }

    #[test]
    fn cluster_files_join_the_clusters_and_may_not_repeat_one() {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-clusters-dir-{}",
            crate::random::random_hex(8).unwrap()
        ));
        std::fs::create_dir_all(dir.join("..data")).unwrap();
        std::fs::write(dir.join("prod.yaml"), "endpoints: [cp-1]\n").unwrap();
        std::fs::write(dir.join("lab.toml"), "endpoints = [\"10.0.0.2\"]\n").unwrap();
        std::fs::write(dir.join("..data/ignored.yaml"), "not: read\n").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), ": not yaml").unwrap();
        std::fs::write(dir.join("README.md"), "not a cluster").unwrap();
        let files = read_cluster_dir(&dir).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["lab", "prod"]);
        let mut document = doc("clusters:\n  staging: {endpoints: [s]}\n");
        merge_clusters(&mut document, &files).unwrap();
        assert_eq!(
            document,
            doc(
                "clusters:\n  staging: {endpoints: [s]}\n  lab: {endpoints: [10.0.0.2]}\n  prod: {endpoints: [cp-1]}\n"
            )
        );
        // The same cluster twice: in the file and the folder, or in two files.
        let mut twice = doc("clusters:\n  prod: {endpoints: [p]}\n");
        let error = merge_clusters(&mut twice, &files).unwrap_err().to_string();
        assert!(
            error.contains("cluster `prod` is in the configuration file and in"),
            "{error}"
        );
        std::fs::write(dir.join("prod.yml"), "endpoints: [cp-2]\n").unwrap();
        let error = read_cluster_dir(&dir).unwrap_err().to_string();
        assert!(
            error.contains("prod.yaml and prod.yml both describe cluster `prod`"),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A ConfigMap volume: each file a link to `..data/<file>`, `..data` a
    /// link to a timestamped folder, swapped whole on an update.
    #[test]
    fn cluster_files_are_read_through_configmap_links_and_a_broken_one_is_an_error() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::symlink;
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-configmap-{}",
            crate::random::random_hex(8).unwrap()
        ));
        std::fs::create_dir_all(dir.join("..2026_12_01_v1")).unwrap();
        std::fs::write(dir.join("..2026_12_01_v1/prod.yaml"), "endpoints: [cp-1]\n").unwrap();
        symlink("..2026_12_01_v1", dir.join("..data")).unwrap();
        symlink("..data/prod.yaml", dir.join("prod.yaml")).unwrap();
        // A stray file whose name is not UTF-8 is no cluster and no error.
        std::fs::write(dir.join(std::ffi::OsStr::from_bytes(b"notes-\xff.txt")), "x").unwrap();
        let files = read_cluster_dir(&dir).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(
            (files[0].name.as_str(), files[0].text.as_str()),
            ("prod", "endpoints: [cp-1]\n")
        );
        // The update: a new folder, `..data` swapped to it.
        std::fs::create_dir_all(dir.join("..2026_12_01_v2")).unwrap();
        std::fs::write(dir.join("..2026_12_01_v2/prod.yaml"), "endpoints: [cp-2]\n").unwrap();
        symlink("..2026_12_01_v2", dir.join("..data.tmp")).unwrap();
        std::fs::rename(dir.join("..data.tmp"), dir.join("..data")).unwrap();
        assert_eq!(read_cluster_dir(&dir).unwrap()[0].text, "endpoints: [cp-2]\n");
        // A link that leads nowhere is an error, not a cluster gone.
        symlink("..data/gone.yaml", dir.join("staging.yaml")).unwrap();
        let error = read_cluster_dir(&dir).unwrap_err().to_string();
        assert!(error.contains("staging.yaml: No such file"), "{error}");
        std::fs::remove_file(dir.join("staging.yaml")).unwrap();
        std::fs::create_dir(dir.join("lab.yaml")).unwrap();
        let error = read_cluster_dir(&dir).unwrap_err().to_string();
        assert!(error.contains("lab.yaml is not a regular file"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
