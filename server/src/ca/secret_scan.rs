//! Finding Talos secrets in a YAML document given to `talos_ca`: the
//! server needs a certificate from it, and nothing else in it. A worker's
//! machine config, say, carries no CA key but carries `machine.token`, with
//! which trustd signs any server certificate under the cluster CA, so
//! whoever holds it can stand in for apid before talosctl. Any value named
//! like a secret (`key`, `*token*`, `*secret*`, `*password*`) that is not
//! empty or redacted makes the source refused.

use serde_yaml_ng::Value;

/// The dotted path of the first secret in `document`, if any.
pub(super) fn first_secret(document: &Value) -> Option<String> {
    let mut path = Vec::new();
    find(document, &mut path)
}

fn find(value: &Value, path: &mut Vec<String>) -> Option<String> {
    match value {
        Value::Mapping(mapping) => mapping.iter().find_map(|(key, value)| {
            let name = match key {
                Value::String(name) => name.clone(),
                other => serde_yaml_ng::to_string(other)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            };
            path.push(name.clone());
            let found = match value {
                Value::String(text) if names_a_secret(&name) && !redacted(text) => Some(path.join(".")),
                _ => find(value, path),
            };
            path.pop();
            found
        }),
        Value::Sequence(items) => items.iter().enumerate().find_map(|(index, item)| {
            path.push(format!("[{index}]"));
            let found = find(item, path);
            path.pop();
            found
        }),
        Value::Tagged(tagged) => find(&tagged.value, path),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => None,
    }
}

fn names_a_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    name == "key"
        || ["token", "secret", "password"]
            .iter()
            .any(|word| name.contains(word))
}

/// Empty, or what Talos writes for a redacted secret.
pub(super) fn redacted(value: &str) -> bool {
    matches!(value.trim(), "" | "******" | "REDACTED")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Option<String> {
        first_secret(&serde_yaml_ng::from_str(text).unwrap())
    }

    #[test]
    fn secrets_are_named_by_their_path_and_redacted_ones_pass() {
        assert_eq!(
            scan("machine:\n  token: abc.def\n  ca: {crt: x, key: ''}\n").as_deref(),
            Some("machine.token")
        );
        assert_eq!(
            scan("cluster:\n  secretboxEncryptionSecret: s\n").as_deref(),
            Some("cluster.secretboxEncryptionSecret")
        );
        assert_eq!(
            scan("contexts:\n  a: {ca: x}\n  admin: {ca: x, crt: y, key: z}\n").as_deref(),
            Some("contexts.admin.key")
        );
        assert_eq!(
            scan("machine:\n  registries:\n    config:\n      r: {auth: {password: p}}\n").as_deref(),
            Some("machine.registries.config.r.auth.password")
        );
        assert_eq!(
            scan("certs:\n  list:\n    - {crt: x, key: k}\n").as_deref(),
            Some("certs.list.[0].key")
        );
        assert_eq!(
            scan(
                "machine:\n  token: '******'\n  ca: {crt: x, key: REDACTED}\n  features: {tokenRotation: true}\n"
            ),
            None
        );
    }
}
