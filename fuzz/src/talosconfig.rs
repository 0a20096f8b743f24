//! `talosconfig`: an existing file and a new context through the client's
//! `talosconfig::parse`, `merge` and `encode`, the steps of a login's write.
//!
//! Input: the existing file's text, a NUL, then bytes that `arbitrary`
//! turns into the context name, whether to make it current, and the entry
//! (endpoints, nodes, CA, certificate and key text).
//!
//! Properties: nothing panics; a file that parses is always written, and
//! what is written parses again (unless the file itself holds YAML that
//! cannot be written back, which the client refuses: the merge never adds
//! such YAML); every other context and every other
//! top-level field come back unchanged in meaning; the new context holds
//! the entry and keeps its own unknown fields; the current context changes
//! only when asked or when there was none.

use arbitrary::Unstructured;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_yaml_ng::{Mapping, Value};
use talos_sso::talosconfig::{ContextEntry, Targets, encode, merge, parse};

/// Values compared by meaning: as YAML text, so that `.nan` equals itself.
fn same(a: &Value, b: &Value) -> bool {
    serde_yaml_ng::to_string(a).ok() == serde_yaml_ng::to_string(b).ok()
}

fn field_of<'a>(context: &'a Mapping, field: &str) -> &'a Value {
    context.get(field).unwrap_or(&Value::Null)
}

fn contexts(root: &Mapping) -> Mapping {
    match root.get("contexts") {
        Some(Value::Mapping(map)) => map.clone(),
        _ => Mapping::new(),
    }
}

pub fn run(data: &[u8]) {
    let parts = crate::input::parts(data, 2);
    let text = crate::input::text(parts[0]);
    let mut u = Unstructured::new(parts[1]);
    let name: String = u.arbitrary().unwrap_or_default();
    let name = if name.is_empty() { "prod".to_owned() } else { name };
    let set_current: bool = u.arbitrary().unwrap_or_default();
    let entry = ContextEntry {
        endpoints: u.arbitrary().unwrap_or_else(|_| vec!["10.5.0.2".into()]),
        nodes: u.arbitrary().unwrap_or_default(),
        ca_pem: u.arbitrary().unwrap_or_default(),
        crt_pem: u.arbitrary().unwrap_or_default(),
        key_pem: u.arbitrary().unwrap_or_default(),
    };
    // What the client wrote into the context last time, if it did.
    let last_written = match u.arbitrary::<Option<(Vec<String>, Vec<String>)>>() {
        Ok(Some((endpoints, nodes))) => Some(Targets { endpoints, nodes }),
        _ => None,
    };

    let Ok(before) = parse(&text) else { return };
    let (after, merged) = merge(before.clone(), &name, &entry, last_written.as_ref(), set_current);
    let written = match encode(&after) {
        Ok(written) => written,
        // Some YAML parses but cannot be written back (a tag on a mapping
        // key); the client refuses such a file, untouched. The merge itself
        // must never make a file unwritable.
        Err(e) => {
            assert!(
                encode(&before).is_err(),
                "the merge made the file unwritable: {e}"
            );
            return;
        }
    };
    let reread =
        parse(&written).unwrap_or_else(|e| panic!("what was written does not parse: {e}\n{written}"));

    let key = Value::String(name.clone());
    let old_contexts = contexts(&before);
    let new_contexts = contexts(&reread);
    assert_eq!(merged.replaced_context, old_contexts.contains_key(&key));
    for (other, value) in &old_contexts {
        if *other == key {
            continue;
        }
        let kept = new_contexts
            .get(other)
            .unwrap_or_else(|| panic!("context {other:?} was lost"));
        assert!(same(value, kept), "context {other:?} changed");
    }
    assert_eq!(
        new_contexts.len(),
        old_contexts.len() + usize::from(!merged.replaced_context),
        "contexts were added or lost"
    );
    for (field, value) in &before {
        if matches!(field.as_str(), Some("context" | "contexts")) {
            continue;
        }
        let kept = reread
            .get(field)
            .unwrap_or_else(|| panic!("top-level field {field:?} was lost"));
        assert!(same(value, kept), "top-level field {field:?} changed");
    }

    let Some(Value::Mapping(ours)) = new_contexts.get(&key) else {
        panic!("the new context is not there");
    };
    let text_of = |field: &str| {
        ours.get(field)
            .and_then(Value::as_str)
            .and_then(|b| STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok())
    };
    assert_eq!(text_of("ca").as_deref(), Some(entry.ca_pem.as_str()));
    assert_eq!(text_of("crt").as_deref(), Some(entry.crt_pem.as_str()));
    assert_eq!(text_of("key").as_deref(), Some(entry.key_pem.as_str()));
    let list = |field: &str| -> Option<Vec<String>> {
        ours.get(field)?
            .as_sequence()?
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let old_context = match old_contexts.get(&key) {
        Some(Value::Mapping(old)) => old.clone(),
        _ => Mapping::new(),
    };
    // A value the person set is kept as it was; otherwise the server's.
    if merged.kept_endpoints {
        assert!(
            same(field_of(&old_context, "endpoints"), field_of(ours, "endpoints")),
            "kept endpoints changed"
        );
    } else {
        assert_eq!(list("endpoints"), Some(entry.endpoints.clone()));
    }
    if merged.kept_nodes {
        assert!(
            same(field_of(&old_context, "nodes"), field_of(ours, "nodes")),
            "kept nodes changed"
        );
    } else if entry.nodes.is_empty() {
        assert!(ours.get("nodes").is_none());
    } else {
        assert_eq!(list("nodes"), Some(entry.nodes.clone()));
    }
    // Only a value that was there, and not what the client last wrote, is kept.
    for (kept, field, last) in [
        (
            merged.kept_endpoints,
            "endpoints",
            last_written.as_ref().map(|t| &t.endpoints),
        ),
        (
            merged.kept_nodes,
            "nodes",
            last_written.as_ref().map(|t| &t.nodes),
        ),
    ] {
        if kept {
            let before: Option<Vec<String>> = old_context
                .get(field)
                .and_then(Value::as_sequence)
                .and_then(|s| s.iter().map(|v| v.as_str().map(str::to_owned)).collect());
            assert!(
                last.is_none() || before.as_ref() != last,
                "{field}: what the client wrote was kept"
            );
        }
    }
    if let Some(Value::Mapping(old)) = old_contexts.get(&key) {
        for (field, value) in old {
            if matches!(field.as_str(), Some("endpoints" | "nodes" | "ca" | "crt" | "key")) {
                continue;
            }
            let kept = ours
                .get(field)
                .unwrap_or_else(|| panic!("field {field:?} of the replaced context was lost"));
            assert!(
                same(value, kept),
                "field {field:?} of the replaced context changed"
            );
        }
    }

    let old_current = before
        .get("context")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty());
    let new_current = reread.get("context").and_then(Value::as_str);
    let expected = match old_current {
        Some(current) if !set_current => current,
        _ => name.as_str(),
    };
    assert_eq!(new_current, Some(expected), "the current context is wrong");
    assert_eq!(merged.current_context.as_deref(), Some(expected));
}
