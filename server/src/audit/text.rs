//! Text from outside made safe to keep. Every string that reaches an audit
//! record (request bodies, unverified token claims, query filters, headers)
//! passes through here before it is hashed and stored, so that no caller can
//! choose bytes that the database refuses (Postgres takes no NUL in `text`
//! and no `\u0000` in `jsonb`), that a terminal interprets (escape sequences,
//! bidirectional overrides), or that make a row unboundedly large.
//!
//! Escaping is visible and one-way: a refused character becomes `\u{hex}`,
//! and text longer than its bound is cut and ends in `…`. Records keep what
//! was sent, in a form that is safe to show.

use serde_json::Value;

/// Most characters kept of one text field (usernames, user agents, claims).
pub const FIELD_CHARS: usize = 256;

/// Most characters kept of a free-text reason (deny list, break-glass).
pub const REASON_CHARS: usize = 1024;

/// Most items kept of a list (roles requested, groups evaluated).
pub const LIST_ITEMS: usize = 64;

/// Deepest nesting kept in `details` (the server builds it; this bounds
/// anything copied in from outside).
const DETAILS_DEPTH: usize = 8;

/// Characters that are escaped rather than kept: control characters (C0,
/// DEL, C1) and the invisible format characters that hide or reorder text
/// on screen (zero-width, bidirectional embeddings, overrides and isolates,
/// line and paragraph separators, the byte-order mark).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{2069}'
            | '\u{FEFF}')
}

/// `text` with unsafe characters escaped, cut to at most `max_chars`
/// characters (plus a final `…` when cut).
pub fn clean(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars * 4));
    let mut kept = 0;
    for c in text.chars() {
        let escaped;
        let piece: &str = if is_unsafe(c) {
            escaped = c.escape_unicode().to_string();
            &escaped
        } else {
            out.push(c);
            kept += 1;
            if kept > max_chars {
                out.pop();
                out.push('…');
                return out;
            }
            continue;
        };
        let len = piece.chars().count();
        if kept + len > max_chars {
            out.push('…');
            return out;
        }
        out.push_str(piece);
        kept += len;
    }
    out
}

/// [`clean`] for a field that is usually short and clean: no allocation
/// beyond the copy when nothing needs doing.
pub fn clean_field(text: &str) -> String {
    if text.chars().count() <= FIELD_CHARS && !text.chars().any(is_unsafe) {
        return text.to_owned();
    }
    clean(text, FIELD_CHARS)
}

/// Most characters kept of one list item (roles and group ids are short).
pub const ITEM_CHARS: usize = 128;

/// Each item cleaned and cut to [`ITEM_CHARS`], at most [`LIST_ITEMS`]
/// kept; a cut list ends with an item saying how many were left out.
pub fn clean_list(items: &[String]) -> Vec<String> {
    let mut out: Vec<String> = items
        .iter()
        .take(LIST_ITEMS)
        .map(|i| clean(i, ITEM_CHARS))
        .collect();
    if items.len() > LIST_ITEMS {
        out.push(format!("… {} more", items.len() - LIST_ITEMS));
    }
    out
}

/// Every string (and object key) in `value` cleaned, nesting bounded.
pub fn clean_json(value: Value) -> Value {
    clean_json_at(value, 0)
}

fn clean_json_at(value: Value, depth: usize) -> Value {
    if depth > DETAILS_DEPTH {
        return Value::String("…".into());
    }
    match value {
        Value::String(s) => Value::String(clean(&s, REASON_CHARS)),
        Value::Array(items) => {
            let len = items.len();
            let mut out: Vec<Value> = items
                .into_iter()
                .take(LIST_ITEMS)
                .map(|v| clean_json_at(v, depth + 1))
                .collect();
            if len > LIST_ITEMS {
                out.push(Value::String(format!("… {} more", len - LIST_ITEMS)));
            }
            Value::Array(out)
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .take(LIST_ITEMS)
                .map(|(k, v)| (clean(&k, FIELD_CHARS), clean_json_at(v, depth + 1)))
                .collect(),
        ),
        // The canonical encoding reads numbers as doubles (RFC 8785): an
        // integer beyond 2^53 would share its bytes, and so its hash, with
        // a neighbour. Kept exactly, as text; and so are fractions, so that
        // every number in a record is an integer any JSON reader and any
        // verifier writes alike (docs/audit.md, "The hash chain").
        Value::Number(n) if !talos_sso_api::chain::is_safe_integer(&n) => Value::String(n.to_string()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn control_and_format_characters_are_escaped() {
        assert_eq!(clean("a\u{0}b", 64), "a\\u{0}b");
        assert_eq!(clean("\u{1b}[31mred", 64), "\\u{1b}[31mred");
        assert_eq!(clean("evil\u{202e}gnp.exe", 64), "evil\\u{202e}gnp.exe");
        assert_eq!(
            clean("line\nbreak\ttab\u{7f}\u{85}", 64),
            "line\\u{a}break\\u{9}tab\\u{7f}\\u{85}"
        );
        assert_eq!(
            clean("zero\u{200b}width\u{feff}", 64),
            "zero\\u{200b}width\\u{feff}"
        );
        assert_eq!(clean("ünïcödé ok 名前", 64), "ünïcödé ok 名前");
        assert_eq!(clean_field("alice@example.com"), "alice@example.com");
    }

    #[test]
    fn length_is_bounded_after_escaping() {
        assert_eq!(clean("abcdef", 3), "abc…");
        assert_eq!(clean("abc", 3), "abc");
        // An escape never gets cut in half.
        assert_eq!(clean("ab\u{0}", 5), "ab…");
        let long = "\u{0}".repeat(10_000);
        assert!(clean(&long, FIELD_CHARS).chars().count() <= FIELD_CHARS + 1);
        assert_eq!(clean_field(&"x".repeat(300)).chars().count(), FIELD_CHARS + 1);
    }

    #[test]
    fn lists_and_json_are_bounded_and_cleaned() {
        let many: Vec<String> = (0..100).map(|i| format!("g{i}\u{0}")).collect();
        let cleaned = clean_list(&many);
        assert_eq!(cleaned.len(), LIST_ITEMS + 1);
        assert_eq!(cleaned[0], "g0\\u{0}");
        assert_eq!(cleaned[LIST_ITEMS], "… 36 more");

        let value = clean_json(json!({"k\u{0}": ["\u{0}", {"deep": "x\u{1b}"}], "n": 5}));
        assert_eq!(
            value,
            json!({"k\\u{0}": ["\\u{0}", {"deep": "x\\u{1b}"}], "n": 5})
        );
        assert_eq!(
            clean_json(json!([
                9_007_199_254_740_991_u64,
                9_007_199_254_740_993_u64,
                -9_007_199_254_740_993_i64,
                0.5
            ])),
            json!([
                9_007_199_254_740_991_u64,
                "9007199254740993",
                "-9007199254740993",
                "0.5"
            ])
        );
        let mut deep = json!("bottom");
        for _ in 0..20 {
            deep = json!([deep]);
        }
        assert!(clean_json(deep).to_string().contains('…'));
    }
}
