//! A small model of Talos's strategic merge patches, as
//! `talosctl patch machineconfig --patch A --patch B` applies them to the
//! v1alpha1 document of a machine config: what `ca patch` prints is
//! checked by applying it here, as Talos would.
//!
//! Modelled from siderolabs/talos:
//! - `pkg/machinery/config/configpatcher/apply.go`: the patches of one call
//!   are applied in order, each to the result of the one before;
//! - `pkg/machinery/config/configpatcher/strategic.go`: a patch document is
//!   merged into the config document of the same apiVersion/kind (a
//!   document without them is the legacy v1alpha1 one, which carries
//!   `machine`); the other documents are left as they are;
//! - `pkg/machinery/config/merge/merge.go`: mappings merge key by key,
//!   recursively; lists are appended to (lists of structs too, such as
//!   `machine.acceptedCAs`: nothing is matched or deduplicated); a scalar
//!   replaces the one on the left unless it is its type's zero value (`""`,
//!   `0`), but a boolean always replaces; a null changes nothing;
//! - `pkg/machinery/config/configloader/internal/decoder/delete.go`: a
//!   mapping holding `$patch: delete` deletes the key it is the value of;
//!   the deletes of a patch document are taken out of it and applied before
//!   the rest of it is merged (`AppendDeletesTo` runs before the document is
//!   decoded); mappings left empty by the removal disappear from the patch;
//! - `.../decoder/selector.go`: a delete walks its path in the config; a
//!   missing parent on the way is an error ("lookup failed", as Talos's
//!   `TestPatchDeleteMissing` shows for `machine.network.hostname`), while
//!   the last key being absent is not (`deleteForPath` zeroes a struct field
//!   whatever it held: deleting `machine.acceptedCAs` from a config that has
//!   none succeeds).
//!
//! Left out (refused with [`MergeError::NotModelled`], so that a test cannot
//! pass by relying on them): patch documents with `apiVersion`/`kind`
//! (other documents, appended or merged by name); deleting a whole document;
//! deleting list elements (`- {interface: eth0, $patch: delete}`) or keys
//! under a list element; merging into the v1alpha1 fields that Talos merges
//! its own way ([`OWN_MERGE`]: a `Merge` method, such as
//! `machine.network.interfaces` merged by interface name, or
//! `merge:"replace"`, such as `cluster.network.podSubnets`, replaced rather
//! than appended to), and into any `extraArgs` (`meta.Args`, whose values
//! are replaced whole). Not modelled, because they need Talos's Go types:
//! the error Talos gives for deleting an absent key of a *map* (such as
//! `machine.nodeLabels`; the model treats every key as a struct field),
//! and the decoding checks (unknown keys, types).

use std::fmt;

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

/// The v1alpha1 fields Talos does not merge as above (v1alpha1_types.go:
/// the types with a `Merge` method and the fields tagged `merge:"replace"`).
pub const OWN_MERGE: &[&str] = &[
    "machine.network.interfaces",
    "cluster.apiServer.admissionControl",
    "cluster.apiServer.auditPolicy",
    "cluster.network.podSubnets",
    "cluster.network.serviceSubnets",
];

/// Why a patch could not be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeError {
    /// Not YAML, or not a mapping where one is needed.
    Yaml(String),
    /// The config has no v1alpha1 document (one with `machine`).
    NoMachineConfig,
    /// A delete whose path leads through a missing key (Talos: "lookup failed").
    LookupFailed(String),
    /// The two sides have different shapes at a path (Talos: "merge type mismatch").
    TypeMismatch(String),
    /// Something Talos does that this model does not.
    NotModelled(String),
}

impl fmt::Display for MergeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MergeError::Yaml(reason) => write!(f, "not YAML: {reason}"),
            MergeError::NoMachineConfig => f.write_str("no v1alpha1 document (with `machine`)"),
            MergeError::LookupFailed(path) => write!(f, "patch delete: path '{path}': lookup failed"),
            MergeError::TypeMismatch(path) => write!(f, "merge type mismatch at '{path}'"),
            MergeError::NotModelled(what) => write!(f, "not modelled: {what}"),
        }
    }
}

/// Apply `patches` in order to the v1alpha1 document of `config` (YAML,
/// one or more documents); the documents, the others untouched, as YAML.
pub fn apply(config: &str, patches: &[&str]) -> Result<String, MergeError> {
    let mut documents = documents(config)?;
    let target = documents
        .iter()
        .position(|d| d.get("machine").is_some())
        .ok_or(MergeError::NoMachineConfig)?;
    for patch in patches {
        for document in self::documents(patch)? {
            apply_document(&mut documents[target], document)?;
        }
    }
    let texts = documents
        .iter()
        .map(|d| serde_yaml_ng::to_string(d).map_err(|e| MergeError::Yaml(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("---\n"))
}

/// The YAML documents of `text`, without empty ones.
pub fn documents(text: &str) -> Result<Vec<Value>, MergeError> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).map_err(|e| MergeError::Yaml(e.to_string())))
        .filter(|d| !matches!(d, Ok(Value::Null)))
        .collect()
}

/// One patch document: its deletes first, then the rest merged.
fn apply_document(target: &mut Value, mut patch: Value) -> Result<(), MergeError> {
    let Value::Mapping(root) = &mut patch else {
        return Err(MergeError::Yaml("a patch document is not a mapping".into()));
    };
    if root.contains_key("apiVersion") || root.contains_key("kind") {
        return Err(MergeError::NotModelled(
            "patch documents other than v1alpha1 (with apiVersion/kind)".into(),
        ));
    }
    if is_delete(root) {
        return Err(MergeError::NotModelled(
            "deleting a whole document (Talos refuses it for the v1alpha1 one)".into(),
        ));
    }
    let mut deletes = Vec::new();
    take_deletes(root, &mut Vec::new(), &mut deletes)?;
    for path in &deletes {
        delete_path(target, path)?;
    }
    merge(target, patch, &mut Vec::new())
}

fn is_delete(mapping: &Mapping) -> bool {
    mapping.get("$patch").and_then(Value::as_str) == Some("delete")
}

/// Take the `{$patch: delete}` values out of `mapping` (at `path`), their
/// paths into `deletes`, in document order; mappings emptied by it go too.
fn take_deletes(
    mapping: &mut Mapping,
    path: &mut Vec<String>,
    deletes: &mut Vec<Vec<String>>,
) -> Result<(), MergeError> {
    let keys: Vec<Value> = mapping.keys().cloned().collect();
    for key in keys {
        let name = key_name(&key)?;
        path.push(name);
        let remove = match mapping.get_mut(&key) {
            Some(Value::Mapping(inner)) if is_delete(inner) => {
                deletes.push(path.clone());
                true
            }
            Some(Value::Mapping(inner)) => {
                take_deletes(inner, path, deletes)?;
                inner.is_empty()
            }
            Some(Value::Sequence(items)) if contains_delete(items) => {
                return Err(MergeError::NotModelled(format!(
                    "deletes inside the list at '{}'",
                    path.join(".")
                )));
            }
            _ => false,
        };
        if remove {
            mapping.remove(&key);
        }
        path.pop();
    }
    Ok(())
}

fn contains_delete(items: &[Value]) -> bool {
    items.iter().any(|item| match item {
        Value::Mapping(m) => is_delete(m) || m.values().any(|v| contains_delete(std::slice::from_ref(v))),
        Value::Sequence(inner) => contains_delete(inner),
        _ => false,
    })
}

fn key_name(key: &Value) -> Result<String, MergeError> {
    match key {
        Value::String(s) => Ok(s.clone()),
        other => serde_yaml_ng::to_string(other)
            .map(|s| s.trim_end().to_owned())
            .map_err(|e| MergeError::Yaml(e.to_string())),
    }
}

/// Delete the key at `path`: every parent must be there, the key itself
/// need not.
fn delete_path(target: &mut Value, path: &[String]) -> Result<(), MergeError> {
    let (last, parents) = path
        .split_last()
        .ok_or_else(|| MergeError::NotModelled("an empty path".into()))?;
    let mut node = target;
    for (depth, key) in parents.iter().enumerate() {
        node = match node.get_mut(key.as_str()) {
            Some(child @ Value::Mapping(_)) => child,
            _ => return Err(MergeError::LookupFailed(path[..=depth].join("."))),
        };
    }
    match node {
        Value::Mapping(mapping) => {
            mapping.remove(last.as_str());
            Ok(())
        }
        _ => Err(MergeError::LookupFailed(path.join("."))),
    }
}

/// Merge `right` into `left` (at `path`), as `merge.Merge` does.
fn merge(left: &mut Value, right: Value, path: &mut Vec<String>) -> Result<(), MergeError> {
    let mismatch = |path: &[String]| MergeError::TypeMismatch(path.join("."));
    match (left, right) {
        (_, Value::Null) => Ok(()),
        (left @ Value::Null, right) => {
            *left = right;
            Ok(())
        }
        (Value::Mapping(left), Value::Mapping(right)) => {
            for (key, value) in right {
                path.push(key_name(&key)?);
                match left.get_mut(&key) {
                    Some(existing) if !existing.is_null() => {
                        let at = path.join(".");
                        if OWN_MERGE.contains(&at.as_str()) || path.last().is_some_and(|k| k == "extraArgs") {
                            return Err(MergeError::NotModelled(format!(
                                "merging into '{at}', which Talos merges its own way"
                            )));
                        }
                        merge(existing, value, path)?
                    }
                    _ => {
                        left.insert(key, value);
                    }
                }
                path.pop();
            }
            Ok(())
        }
        (Value::Sequence(left), Value::Sequence(right)) => {
            left.extend(right);
            Ok(())
        }
        (Value::Mapping(_) | Value::Sequence(_), _) | (_, Value::Mapping(_) | Value::Sequence(_)) => {
            Err(mismatch(path))
        }
        (left, right @ Value::Bool(_)) => {
            *left = right;
            Ok(())
        }
        (left, right) => {
            if !is_zero(&right) {
                *left = right;
            }
            Ok(())
        }
    }
}

/// A Go zero value: such a value on the right leaves the left as it was.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}
