//! `-o, --output`: one set of formats for every command that prints data
//! (`table` for people, `json` and `yaml` for scripts), and the JSON and
//! YAML writers they share. Both write the same serde value (a wire type
//! of `talos-sso-api`, or one serde struct per command), so JSON and YAML
//! name the same fields the same way.
//!
//! Both are made safe for a terminal without changing the value they
//! carry: JSON through [`talos_sso_text::json`]; YAML by writing each
//! string that holds a character unsafe to show as a JSON string (a JSON
//! string is a valid YAML double-quoted scalar, `\u` escapes included),
//! since the YAML emitter writes such characters (bidirectional overrides,
//! zero-width spaces) as they are.

use std::io::Write;

use clap::ValueEnum;
use serde::Serialize;
use serde_yaml_ng::Value;

/// How a command prints its data.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// For people (also spelled `text`, its old name).
    #[value(alias = "text")]
    Table,
    /// JSON, for scripts.
    Json,
    /// YAML, the same fields as JSON.
    Yaml,
}

/// `value` as pretty JSON, terminal-safe, without a final newline.
pub fn json_text<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    Ok(talos_sso_text::json(&serde_json::to_string_pretty(value)?))
}

/// `value` as YAML (a document without the `---` start), terminal-safe,
/// ending with a newline; fields in the order of the type, as in JSON.
pub fn yaml_text<T: Serialize + ?Sized>(value: &T) -> anyhow::Result<String> {
    let mut value = serde_yaml_ng::to_value(value)?;
    // Each string with a character unsafe to show becomes a placeholder
    // the emitter writes as it is, then the JSON string in its place.
    let marker = placeholder_marker(&serde_yaml_ng::to_string(&value)?);
    let mut hostile = Vec::new();
    set_aside(&mut value, &marker, &mut hostile);
    let mut text = serde_yaml_ng::to_string(&value)?;
    for (index, original) in hostile.iter().enumerate() {
        let quoted = talos_sso_text::json(&serde_json::to_string(original)?);
        text = text.replace(&format!("{marker}{index}z"), &quoted);
    }
    Ok(text)
}

/// A prefix for placeholders that the value's text (`all`) does not
/// contain, so that replacing them cannot touch the value's own text.
fn placeholder_marker(all: &str) -> String {
    let mut marker = "talossso_unsafe_text_".to_owned();
    while all.contains(&marker) {
        marker.push('x');
    }
    marker
}

/// Replace each string (value or key) of `value` that holds a character
/// unsafe to show with `{marker}{n}z`, its text pushed to `hostile` at `n`.
fn set_aside(value: &mut Value, marker: &str, hostile: &mut Vec<String>) {
    match value {
        Value::String(text) if text.chars().any(talos_sso_text::is_unsafe) => {
            let original = std::mem::replace(text, format!("{marker}{}z", hostile.len()));
            hostile.push(original);
        }
        Value::Sequence(items) => items.iter_mut().for_each(|v| set_aside(v, marker, hostile)),
        Value::Mapping(map) => {
            let old = std::mem::take(map);
            for (mut key, mut item) in old {
                set_aside(&mut key, marker, hostile);
                set_aside(&mut item, marker, hostile);
                map.insert(key, item);
            }
        }
        Value::Tagged(tagged) => set_aside(&mut tagged.value, marker, hostile),
        _ => {}
    }
}

/// Print `value` as JSON or YAML (`format` is not [`Format::Table`]:
/// the command prints its own table).
pub fn print_data<T: Serialize + ?Sized>(
    format: Format,
    value: &T,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match format {
        Format::Json => writeln!(out, "{}", json_text(value)?)?,
        Format::Yaml | Format::Table => write!(out, "{}", yaml_text(value)?)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::cli::tests::no_hostile_characters;

    #[test]
    fn yaml_is_the_same_value_as_json_and_terminal_safe() {
        let hostile = "eve\u{1b}[2K\r\u{202e}\u{200b}moc\u{2066}\u{feff}\u{ad}\n2nd line";
        let value = json!({
            "cluster": "prod",
            "username": hostile,
            "roles": ["os:admin", hostile],
            "seconds_left": 299,
            "valid": true,
            "not_after": null,
            "details": {hostile: "key too", "note": "yes"},
            "looks_like_a_number": "0123",
            "talossso_unsafe_text_0z": "a key that looks like a placeholder",
        });
        let yaml = yaml_text(&value).unwrap();
        no_hostile_characters(&yaml);
        let back: Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(back, value, "{yaml}");
        let json = json_text(&value).unwrap();
        no_hostile_characters(&json);
        assert_eq!(serde_json::from_str::<Value>(&json).unwrap(), value);
        // Ordinary values read as YAML people write.
        assert!(yaml.contains("cluster: prod\n"), "{yaml}");
        assert!(yaml.contains("- os:admin\n"), "{yaml}");
        // Fields in the order of the type, as in its JSON.
        let status = crate::cli::status::VersionReport {
            client: crate::cli::status::ClientVersion {
                version: "1.2.3".into(),
                api_version: 1,
                commit: "abc".into(),
            },
            server: None,
        };
        assert_eq!(
            yaml_text(&status).unwrap(),
            "client:\n  version: 1.2.3\n  api_version: 1\n  commit: abc\nserver: null\n"
        );
    }

    #[test]
    fn text_is_the_old_name_of_table() {
        assert_eq!(Format::from_str("text", false), Ok(Format::Table));
        assert_eq!(Format::from_str("yaml", false), Ok(Format::Yaml));
    }
}
