//! The talosconfig file: read, change one context, write back, keeping every
//! other context and every field this client does not model (`auth`,
//! `cluster`, `proxy-url`, keys from future Talos versions) unchanged in
//! meaning.
//!
//! Writes are atomic (a temporary file in the same directory, fsync, rename,
//! fsync of the directory), the file is mode 0600 and its directory 0700 when
//! created, and every read-modify-write holds an exclusive lock on a sidecar
//! `<file>.lock`, so parallel logins cannot lose each other's contexts. A file
//! that does not parse is never overwritten.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_yaml_ng::{Mapping, Value};

use crate::files::{self, FileLock};

#[derive(Debug, thiserror::Error)]
pub enum TalosconfigError {
    #[error(
        "{path} is not a valid talosconfig ({reason}); it was left untouched: fix or move it, or use --talosconfig"
    )]
    Malformed { path: PathBuf, reason: String },
    #[error("cannot {action} {path}: {reason}")]
    Io {
        action: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("no home directory to put ~/.talos/config in; use --talosconfig or TALOSCONFIG")]
    NoHome,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TalosconfigError {
    let path = path.to_owned();
    move |e| TalosconfigError::Io {
        action,
        path,
        reason: e.to_string(),
    }
}

/// `--talosconfig`, else `$TALOSCONFIG`, else `~/.talos/config`.
pub fn resolve_path(explicit: Option<&Path>) -> Result<PathBuf, TalosconfigError> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    if let Some(path) = std::env::var_os("TALOSCONFIG").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    dirs::home_dir()
        .map(|home| home.join(".talos").join("config"))
        .ok_or(TalosconfigError::NoHome)
}

/// What a login writes into its context. PEM text; base64 is applied here.
#[derive(Debug, Clone)]
pub struct ContextEntry {
    pub endpoints: Vec<String>,
    pub nodes: Vec<String>,
    pub ca_pem: String,
    pub crt_pem: String,
    pub key_pem: String,
}

/// The `endpoints` and `nodes` this client last wrote into a context (the
/// server's values then). A value in the file that differs from them was
/// set by the person (`talosctl config endpoint`, `config node`) and is
/// kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Targets {
    pub endpoints: Vec<String>,
    pub nodes: Vec<String>,
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    pub created_file: bool,
    pub replaced_context: bool,
    pub current_context: Option<String>,
    /// The context's own `endpoints` were kept (set by the person).
    pub kept_endpoints: bool,
    /// The context's own `nodes` were kept (set by the person).
    pub kept_nodes: bool,
}

fn lock(path: &Path) -> Result<FileLock, TalosconfigError> {
    files::lock(path).map_err(io("lock", path))
}

fn ensure_directory(path: &Path) -> Result<(), TalosconfigError> {
    files::ensure_parent(path).map_err(io("create the directory of", path))
}

/// Largest talosconfig read. A context is a few KiB, so thousands fit; a
/// larger file (or a path that leads to an endless one, `/dev/zero`) is
/// refused before it fills the memory.
pub const MAX_FILE_LEN: u64 = 16 * 1024 * 1024;

/// Read and check the file; `None` when it does not exist.
fn read(path: &Path) -> Result<Option<Mapping>, TalosconfigError> {
    use std::io::Read;
    let malformed = |reason: String| TalosconfigError::Malformed {
        path: path.to_owned(),
        reason,
    };
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read", path)(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read", path))?;
    if bytes.len() as u64 > MAX_FILE_LEN {
        return Err(malformed(format!(
            "larger than {} MiB",
            MAX_FILE_LEN / (1024 * 1024)
        )));
    }
    let text = String::from_utf8(bytes).map_err(|_| malformed("not UTF-8 text".into()))?;
    parse(&text).map(Some).map_err(malformed)
}

/// The talosconfig in `text`, checked as far as this client relies on it
/// (a mapping, `contexts` a mapping of mappings, `context` a string), or
/// why it is not one. Public so that the merge can be exercised without a
/// file (the fuzz targets).
pub fn parse(text: &str) -> Result<Mapping, String> {
    if text.trim().is_empty() {
        return Ok(Mapping::new());
    }
    let value: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let Value::Mapping(root) = value else {
        return Err("the top level is not a mapping".into());
    };
    match root.get("contexts") {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(contexts)) => {
            if let Some((name, _)) = contexts
                .iter()
                .find(|(_, v)| !matches!(v, Value::Mapping(_) | Value::Null))
            {
                return Err(format!("context {name:?} is not a mapping"));
            }
        }
        Some(_) => return Err("`contexts` is not a mapping".into()),
    }
    if root
        .get("context")
        .is_some_and(|c| !matches!(c, Value::String(_) | Value::Null))
    {
        return Err("`context` is not a string".into());
    }
    Ok(root)
}

/// The text written for `root`.
pub fn encode(root: &Mapping) -> Result<String, serde_yaml_ng::Error> {
    serde_yaml_ng::to_string(root)
}

fn write(path: &Path, root: &Mapping) -> Result<(), TalosconfigError> {
    // What is written comes from a file that was read: if it cannot be
    // encoded (a YAML tag on a mapping key), that file is one this client
    // cannot keep unchanged in meaning.
    let text = encode(root).map_err(|e| TalosconfigError::Malformed {
        path: path.to_owned(),
        reason: format!("it holds YAML this client cannot write back: {e}"),
    })?;
    files::write_atomic(path, text.as_bytes()).map_err(io("write", path))
}

fn strings(items: &[String]) -> Value {
    Value::Sequence(items.iter().map(|s| Value::String(s.clone())).collect())
}

/// Whether the context's `field` holds a value the person set: present,
/// not empty, and not what this client wrote there last (`last`; `None`
/// when it never wrote this context, so any value there is theirs).
fn set_by_person(context: &Mapping, field: &str, last: Option<&[String]>) -> bool {
    match context.get(field) {
        None | Some(Value::Null) => false,
        Some(Value::Sequence(items)) if items.is_empty() => false,
        Some(value) => last.is_none_or(|last| *value != strings(last)),
    }
}

/// Create or replace context `name`. Other contexts and unknown fields stay;
/// inside our own context, fields we do not write (e.g. `proxy-url`) stay
/// too. `endpoints` and `nodes` come from the server for a new context; in
/// an existing one, a value the person set (one that differs from
/// `last_written`) is kept. The current context changes only when
/// `set_current` or when the file had none.
pub fn upsert_context(
    path: &Path,
    name: &str,
    entry: &ContextEntry,
    last_written: Option<&Targets>,
    set_current: bool,
) -> Result<WriteOutcome, TalosconfigError> {
    ensure_directory(path)?;
    let _lock = lock(path)?;
    let existing = read(path)?;
    let created_file = existing.is_none();
    let (root, merged) = merge(
        existing.unwrap_or_default(),
        name,
        entry,
        last_written,
        set_current,
    );
    write(path, &root)?;
    Ok(WriteOutcome {
        created_file,
        replaced_context: merged.replaced_context,
        current_context: merged.current_context,
        kept_endpoints: merged.kept_endpoints,
        kept_nodes: merged.kept_nodes,
    })
}

/// What [`merge`] did to the talosconfig.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    pub replaced_context: bool,
    pub current_context: Option<String>,
    /// See [`WriteOutcome`].
    pub kept_endpoints: bool,
    pub kept_nodes: bool,
}

/// `root` (a talosconfig that passed [`parse`]) with context `name`
/// created or replaced as [`upsert_context`] describes: the pure part of a
/// login's write, public so that it can be exercised without a file.
pub fn merge(
    mut root: Mapping,
    name: &str,
    entry: &ContextEntry,
    last_written: Option<&Targets>,
    set_current: bool,
) -> (Mapping, Merged) {
    // Replaced in place below: inserting an existing key keeps its position.
    let mut contexts = match root.get("contexts") {
        Some(Value::Mapping(map)) => map.clone(),
        _ => Mapping::new(),
    };
    let replaced_context = contexts.contains_key(name);
    let mut context = match contexts.remove(name) {
        Some(Value::Mapping(map)) => map,
        _ => Mapping::new(),
    };
    let kept_endpoints = set_by_person(
        &context,
        "endpoints",
        last_written.map(|t| t.endpoints.as_slice()),
    );
    let kept_nodes = set_by_person(&context, "nodes", last_written.map(|t| t.nodes.as_slice()));
    if !kept_endpoints {
        context.insert("endpoints".into(), strings(&entry.endpoints));
    }
    if !kept_nodes {
        if entry.nodes.is_empty() {
            context.remove("nodes");
        } else {
            context.insert("nodes".into(), strings(&entry.nodes));
        }
    }
    context.insert("ca".into(), Value::String(STANDARD.encode(&entry.ca_pem)));
    context.insert("crt".into(), Value::String(STANDARD.encode(&entry.crt_pem)));
    context.insert("key".into(), Value::String(STANDARD.encode(&entry.key_pem)));
    contexts.insert(name.into(), Value::Mapping(context));
    root.insert("contexts".into(), Value::Mapping(contexts));
    let has_current = root
        .get("context")
        .and_then(Value::as_str)
        .is_some_and(|c| !c.is_empty());
    if set_current || !has_current {
        root.insert("context".into(), Value::String(name.to_owned()));
    }
    let current_context = root.get("context").and_then(Value::as_str).map(str::to_owned);
    // `context` first, as talosctl writes it.
    let mut ordered = Mapping::new();
    if let Some(current) = root.remove("context") {
        ordered.insert("context".into(), current);
    }
    ordered.extend(root);
    (
        ordered,
        Merged {
            replaced_context,
            current_context,
            kept_endpoints,
            kept_nodes,
        },
    )
}

/// Remove the named contexts (and nothing else). Returns those removed.
pub fn remove_contexts(path: &Path, names: &[String]) -> Result<Vec<String>, TalosconfigError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let _lock = lock(path)?;
    let Some(mut root) = read(path)? else {
        return Ok(Vec::new());
    };
    let mut removed = Vec::new();
    if let Some(Value::Mapping(contexts)) = root.get_mut("contexts") {
        for name in names {
            if contexts.remove(name.as_str()).is_some() {
                removed.push(name.clone());
            }
        }
    }
    if removed.is_empty() {
        return Ok(removed);
    }
    if root
        .get("context")
        .and_then(Value::as_str)
        .is_some_and(|c| removed.iter().any(|r| r == c))
    {
        root.insert("context".into(), Value::String(String::new()));
    }
    write(path, &root)?;
    Ok(removed)
}

/// A context's certificate chain and key (PEM), if present.
#[derive(Debug, Clone)]
pub struct StoredContext {
    pub crt_pem: String,
    pub key_pem: String,
    pub endpoints: Vec<String>,
}

pub fn read_context(path: &Path, name: &str) -> Result<Option<StoredContext>, TalosconfigError> {
    let Some(root) = read(path)? else { return Ok(None) };
    let Some(Value::Mapping(context)) = root.get("contexts").and_then(|c| c.get(name)) else {
        return Ok(None);
    };
    let decode = |field: &str| {
        context
            .get(field)
            .and_then(Value::as_str)
            .and_then(|b| STANDARD.decode(b).ok())
            .and_then(|bytes| String::from_utf8(bytes).ok())
    };
    let (Some(crt_pem), Some(key_pem)) = (decode("crt"), decode("key")) else {
        return Ok(None);
    };
    let endpoints = context
        .get("endpoints")
        .and_then(Value::as_sequence)
        .map(|s| s.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    Ok(Some(StoredContext {
        crt_pem,
        key_pem,
        endpoints,
    }))
}

/// Write a talosconfig holding only `name` as current (for `exec`).
pub fn write_single_context(source: &Path, name: &str, destination: &Path) -> Result<(), TalosconfigError> {
    let root = read(source)?.unwrap_or_default();
    let Some(context) = root.get("contexts").and_then(|c| c.get(name)).cloned() else {
        return Err(TalosconfigError::Malformed {
            path: source.to_owned(),
            reason: format!("no context `{name}`"),
        });
    };
    let mut single = Mapping::new();
    single.insert("context".into(), Value::String(name.to_owned()));
    let mut contexts = Mapping::new();
    contexts.insert(name.into(), context);
    single.insert("contexts".into(), Value::Mapping(contexts));
    write(destination, &single)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: &str) -> ContextEntry {
        ContextEntry {
            endpoints: vec!["10.0.0.1".into()],
            nodes: vec![],
            ca_pem: format!("ca-{tag}"),
            crt_pem: format!("crt-{tag}"),
            key_pem: format!("key-{tag}"),
        }
    }

    #[test]
    fn unknown_fields_and_other_contexts_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(
            &path,
            "context: other\ncontexts:\n  other:\n    endpoints: [1.2.3.4]\n    auth: {siderov1: {identity: a@b}}\n    cluster: omni\n  prod:\n    endpoints: [old]\n    proxy-url: http://proxy:3128\nfuture-top-level: {x: 1}\n",
        )
        .unwrap();
        let outcome = upsert_context(&path, "prod", &entry("new"), None, false).unwrap();
        assert_eq!(
            outcome,
            WriteOutcome {
                created_file: false,
                replaced_context: true,
                current_context: Some("other".into()),
                kept_endpoints: true,
                kept_nodes: false,
            }
        );
        let value: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(value["context"], "other");
        assert_eq!(value["contexts"]["other"]["auth"]["siderov1"]["identity"], "a@b");
        assert_eq!(value["contexts"]["other"]["cluster"], "omni");
        assert_eq!(value["contexts"]["prod"]["proxy-url"], "http://proxy:3128");
        assert_eq!(
            value["contexts"]["prod"]["endpoints"][0], "old",
            "set by the person, not by this client"
        );
        assert_eq!(value["future-top-level"]["x"], 1);
        let stored = read_context(&path, "prod").unwrap().unwrap();
        assert_eq!(
            (stored.crt_pem.as_str(), stored.key_pem.as_str()),
            ("crt-new", "key-new")
        );
    }

    #[test]
    fn a_new_file_is_private_and_current() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("talos").join("config");
        let outcome = upsert_context(&path, "lab", &entry("x"), None, false).unwrap();
        assert!(outcome.created_file);
        assert_eq!(outcome.current_context.as_deref(), Some("lab"));
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            std::fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        // --set-current switches; otherwise the current context stays.
        upsert_context(&path, "prod", &entry("y"), None, false).unwrap();
        assert_eq!(
            upsert_context(&path, "prod", &entry("y"), None, true)
                .unwrap()
                .current_context
                .as_deref(),
            Some("prod")
        );
    }

    #[test]
    fn endpoints_and_nodes_the_person_set_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let server = |endpoints: &[&str], nodes: &[&str]| ContextEntry {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            ..entry("x")
        };
        let targets = |e: &ContextEntry| Targets {
            endpoints: e.endpoints.clone(),
            nodes: e.nodes.clone(),
        };
        let field = |name: &str| -> Value {
            let value: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            value["contexts"]["prod"][name].clone()
        };
        let list =
            |items: &[&str]| Value::Sequence(items.iter().map(|s| Value::String(s.to_string())).collect());
        // A new context: the server's values.
        let first = server(&["vip.example"], &["10.0.0.1"]);
        let outcome = upsert_context(&path, "prod", &first, None, false).unwrap();
        assert!(!outcome.kept_endpoints && !outcome.kept_nodes);
        assert_eq!(
            (field("endpoints"), field("nodes")),
            (list(&["vip.example"]), list(&["10.0.0.1"]))
        );
        // Unchanged since: the server's new values replace ours.
        let second = server(&["vip2.example"], &["10.0.0.2"]);
        let outcome = upsert_context(&path, "prod", &second, Some(&targets(&first)), false).unwrap();
        assert!(!outcome.kept_endpoints && !outcome.kept_nodes);
        assert_eq!(
            (field("endpoints"), field("nodes")),
            (list(&["vip2.example"]), list(&["10.0.0.2"]))
        );
        // The person runs `talosctl config node 10.0.0.9`: kept, endpoints still follow the server.
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("- 10.0.0.2", "- 10.0.0.9");
        std::fs::write(&path, text).unwrap();
        let third = server(&["vip3.example"], &["10.0.0.3"]);
        let outcome = upsert_context(&path, "prod", &third, Some(&targets(&second)), false).unwrap();
        assert!(!outcome.kept_endpoints && outcome.kept_nodes);
        assert_eq!(
            (field("endpoints"), field("nodes")),
            (list(&["vip3.example"]), list(&["10.0.0.9"]))
        );
        // A server with no nodes removes ours, never the person's.
        let outcome = upsert_context(
            &path,
            "prod",
            &server(&["vip3.example"], &[]),
            Some(&targets(&third)),
            false,
        )
        .unwrap();
        assert!(outcome.kept_nodes);
        assert_eq!(field("nodes"), list(&["10.0.0.9"]));
    }

    #[test]
    fn malformed_files_are_never_touched() {
        let dir = tempfile::tempdir().unwrap();
        for text in [
            "contexts: [a, b]\n",
            "{{{ not yaml",
            "- a\n- b\n",
            "context: [x]\ncontexts: {}\n",
            "contexts:\n  a: 5\n",
        ] {
            let path = dir.path().join("config");
            std::fs::write(&path, text).unwrap();
            let error = upsert_context(&path, "prod", &entry("x"), None, false).unwrap_err();
            assert!(
                matches!(error, TalosconfigError::Malformed { .. }),
                "{text}: {error}"
            );
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        }
    }

    /// Found by fuzzing (`fuzz/regressions/talosconfig/`): a mapping key
    /// with a YAML tag parses but cannot be written back; the login then
    /// failed with "cannot encode". It is a file this client cannot keep
    /// unchanged in meaning, so it is refused as such, and left untouched.
    #[test]
    fn a_file_that_cannot_be_written_back_is_refused_and_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let text = "context: other\ncontexts: {}\nfuture-top-level: {!x : 1}\n";
        std::fs::write(&path, text).unwrap();
        let error = upsert_context(&path, "prod", &entry("x"), None, false).unwrap_err();
        assert!(matches!(error, TalosconfigError::Malformed { .. }), "{error}");
        assert!(error.to_string().contains("cannot write back"), "{error}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn removing_contexts_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        upsert_context(&path, "a", &entry("a"), None, false).unwrap();
        upsert_context(&path, "b", &entry("b"), None, false).unwrap();
        assert_eq!(remove_contexts(&path, &["a".into(), "zz".into()]).unwrap(), ["a"]);
        let value: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(value["contexts"].get("a").is_none() && value["contexts"].get("b").is_some());
        assert_eq!(value["context"], "", "the removed context was current");
    }

    #[cfg(unix)]
    #[test]
    fn a_link_planted_at_the_lock_path_stops_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let elsewhere = dir.path().join("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("config.lock")).unwrap();
        let error = upsert_context(&path, "prod", &entry("x"), None, false)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!(
                "cannot lock {}: {}/config.lock is a symbolic link",
                path.display(),
                dir.path().display()
            )),
            "{error}"
        );
        assert!(!elsewhere.exists() && !path.exists());
    }
}
