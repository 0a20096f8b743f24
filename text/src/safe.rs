//! Text from outside made safe: to keep (the server's audit records, its
//! logs and error messages) and to show (the client's terminal).
//!
//! Such text can carry characters chosen by an attacker: bytes a database
//! refuses (Postgres takes no NUL in `text` and no `\u0000` in `jsonb`), an
//! escape sequence that recolours, moves the cursor or erases what an
//! auditor is reading, CR and LF that forge whole rows, bidirectional
//! overrides and invisible characters that reorder or hide part of a name.
//! Each of them becomes a visible `\u{..}` instead, so what is shown is what
//! was sent. Escaping is one-way and idempotent: backslashes are left as
//! they are (a literal `\u{1b}` typed by someone is harmless visible text,
//! names such as `CORP\alice` stay readable), so escaping twice changes
//! nothing.
//!
//! Text is also bounded: a value longer than its bound is cut between
//! characters, never inside an escape, and ends in `…`. The server's bound
//! counts the characters kept before the `…` ([`clean`]); the client's
//! counts the `…` too, as a column width does ([`bounded`]).

use std::fmt::Write;

use serde_json::{Number, Value};

/// Most characters kept of one text field (usernames, user agents, claims).
pub const FIELD_CHARS: usize = 256;

/// Most characters kept of a free-text reason (deny list, break-glass).
pub const REASON_CHARS: usize = 1024;

/// Most items kept of a list (roles requested, groups evaluated).
pub const LIST_ITEMS: usize = 64;

/// Most characters kept of one list item (roles and group ids are short).
pub const ITEM_CHARS: usize = 128;

/// Deepest nesting kept in JSON from outside (the server builds a record's
/// `details`; this bounds anything copied into it).
const JSON_DEPTH: usize = 8;

/// Whether `c` must not be kept as it is in what the server stores:
/// control characters (C0, DEL, C1) and the format characters that hide or
/// reorder text (zero-width, bidirectional embeddings, overrides and
/// isolates, line and paragraph separators, the byte-order mark).
///
/// This set is part of the audit trail's data: deny-list subjects, record
/// fields and filters are compared in their stored form, so a character
/// added here would make a value stored before differ from the same value
/// sent after (an old deny-list entry would stop blocking). It changes only
/// with a migration of the stored values. What is merely shown can be
/// escaped more: [`is_unsafe`].
pub fn is_unsafe_to_keep(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Zero-width space, joiners, left-to-right and right-to-left marks.
            '\u{200b}'..='\u{200f}'
            // Line and paragraph separators, bidirectional embeddings and
            // overrides.
            | '\u{2028}'..='\u{202e}'
            // Word joiner, invisible operators, bidirectional isolates.
            | '\u{2060}'..='\u{2069}'
            // Byte order mark (zero-width no-break space).
            | '\u{feff}'
        )
}

/// Whether `c` must not be shown as it is in a terminal: everything
/// [`is_unsafe_to_keep`] escapes, and the other characters that are
/// invisible or blank on screen.
pub fn is_unsafe(c: char) -> bool {
    is_unsafe_to_keep(c)
        || matches!(
            c,
            // Soft hyphen, Arabic letter mark, Mongolian vowel separator.
            '\u{ad}' | '\u{61c}' | '\u{180e}'
            // Hangul fillers: blank glyphs, a classic for invisible names.
            | '\u{115f}' | '\u{1160}' | '\u{3164}' | '\u{ffa0}'
            // The deprecated shaping controls.
            | '\u{206a}'..='\u{206f}'
            // Interlinear annotation controls.
            | '\u{fff9}'..='\u{fffb}'
            // Invisible musical formatting controls.
            | '\u{1d173}'..='\u{1d17a}'
            // Tags: invisible copies of ASCII, used to smuggle text.
            | '\u{e0000}'..='\u{e007f}'
        )
}

/// Which characters a form escapes: [`is_unsafe_to_keep`] or [`is_unsafe`].
type Rule = fn(char) -> bool;

/// How many characters `c` takes once escaped.
fn width(c: char, unsafe_: Rule) -> usize {
    if unsafe_(c) { c.escape_unicode().count() } else { 1 }
}

fn push_escaped(out: &mut String, c: char, unsafe_: Rule) {
    if unsafe_(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

fn escape_by(text: &str, unsafe_: Rule) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c, unsafe_);
    }
    out
}

/// `text` with every character unsafe to show written as `\u{..}`.
pub fn escape(text: &str) -> String {
    escape_by(text, is_unsafe)
}

/// `text` escaped, unless that takes more than `max` characters: then the
/// longest escaped start of it that takes at most `room`, and a `…`.
fn escape_within(text: &str, max: usize, room: usize, unsafe_: Rule) -> String {
    if text.chars().map(|c| width(c, unsafe_)).sum::<usize>() <= max {
        return escape_by(text, unsafe_);
    }
    let mut out = String::with_capacity(room.min(text.len()) + 3);
    let mut used = 0;
    for c in text.chars() {
        let width = width(c, unsafe_);
        if used + width > room {
            break;
        }
        push_escaped(&mut out, c, unsafe_);
        used += width;
    }
    out.push('…');
    out
}

/// `text` with the characters unsafe to keep escaped, cut to at most
/// `max_chars` characters (plus a final `…` when cut): the server's form,
/// for what it stores and logs.
pub fn clean(text: &str, max_chars: usize) -> String {
    escape_within(text, max_chars, max_chars, is_unsafe_to_keep)
}

/// [`clean`] for a field that is usually short and clean: no work beyond
/// the copy when nothing needs doing.
pub fn clean_field(text: &str) -> String {
    if text.chars().count() <= FIELD_CHARS && !text.chars().any(is_unsafe_to_keep) {
        return text.to_owned();
    }
    clean(text, FIELD_CHARS)
}

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

/// Every string (and object key) in `value` cleaned, lists and objects cut
/// to [`LIST_ITEMS`], nesting bounded; a number `keep_number` refuses is
/// kept exactly, as text (the audit chain keeps only numbers every JSON
/// reader writes alike).
pub fn clean_json(value: Value, keep_number: fn(&Number) -> bool) -> Value {
    clean_json_at(value, 0, keep_number)
}

fn clean_json_at(value: Value, depth: usize, keep_number: fn(&Number) -> bool) -> Value {
    if depth > JSON_DEPTH {
        return Value::String("…".into());
    }
    match value {
        Value::String(s) => Value::String(clean(&s, REASON_CHARS)),
        Value::Array(items) => {
            let len = items.len();
            let mut out: Vec<Value> = items
                .into_iter()
                .take(LIST_ITEMS)
                .map(|v| clean_json_at(v, depth + 1, keep_number))
                .collect();
            if len > LIST_ITEMS {
                out.push(Value::String(format!("… {} more", len - LIST_ITEMS)));
            }
            Value::Array(out)
        }
        Value::Object(map) => Value::Object(
            map.into_iter()
                .take(LIST_ITEMS)
                .map(|(k, v)| (clean(&k, FIELD_CHARS), clean_json_at(v, depth + 1, keep_number)))
                .collect(),
        ),
        Value::Number(n) if !keep_number(&n) => Value::String(n.to_string()),
        other => other,
    }
}

/// [`escape`], cut to at most `max` characters, the `…` included: the
/// client's form, for a column of a terminal.
pub fn bounded(text: &str, max: usize) -> String {
    match max.checked_sub(1) {
        Some(room) => escape_within(text, max, room, is_unsafe),
        None => String::new(),
    }
}

/// serde_json's text with every unsafe character written as a JSON `\u`
/// escape: the same JSON value, safe for a terminal. serde_json escapes C0
/// characters inside strings already, and outside strings its text holds
/// only JSON's own punctuation and whitespace, so only characters from DEL
/// up are left to escape, and only inside strings can they appear.
pub fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if u32::from(c) >= 0x7f && is_unsafe(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The audit chain's rule (`talos_sso_api::chain::is_safe_integer`).
    fn safe_integer(n: &Number) -> bool {
        n.as_i64()
            .map(i64::unsigned_abs)
            .or_else(|| n.as_u64())
            .is_some_and(|m| m <= 9_007_199_254_740_991)
    }

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

        let value = clean_json(
            json!({"k\u{0}": ["\u{0}", {"deep": "x\u{1b}"}], "n": 5}),
            safe_integer,
        );
        assert_eq!(
            value,
            json!({"k\\u{0}": ["\\u{0}", {"deep": "x\\u{1b}"}], "n": 5})
        );
        assert_eq!(
            clean_json(
                json!([
                    9_007_199_254_740_991_u64,
                    9_007_199_254_740_993_u64,
                    -9_007_199_254_740_993_i64,
                    0.5
                ]),
                safe_integer
            ),
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
        assert!(clean_json(deep, safe_integer).to_string().contains('…'));
    }
    const HOSTILE: [char; 24] = [
        '\u{0}',
        '\u{7}',
        '\u{8}',
        '\t',
        '\n',
        '\r',
        '\u{1b}',
        '\u{7f}',
        '\u{80}',
        '\u{9b}',
        '\u{9f}',
        '\u{200b}',
        '\u{200f}',
        '\u{2028}',
        '\u{2029}',
        '\u{202a}',
        '\u{202e}',
        '\u{2066}',
        '\u{2069}',
        '\u{feff}',
        '\u{ad}',
        '\u{3164}',
        '\u{e0041}',
        '\u{e007f}',
    ];

    #[test]
    fn every_hostile_character_becomes_visible_text() {
        for c in HOSTILE {
            assert!(is_unsafe(c), "{c:?}");
            let shown = escape(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", u32::from(c)));
            assert!(!shown.chars().any(is_unsafe), "{shown:?}");
        }
        assert_eq!(escape("\u{1b}[31mred"), "\\u{1b}[31mred");
    }

    /// What the server stores is compared with what it stored before (deny
    /// entries, filters): these characters were always kept as they are in
    /// stored values, so they stay kept, while a terminal still sees them
    /// escaped.
    #[test]
    fn the_stored_form_keeps_what_it_always_kept_and_only_display_escapes_more() {
        for c in [
            '\u{ad}',
            '\u{61c}',
            '\u{180e}',
            '\u{3164}',
            '\u{206a}',
            '\u{fff9}',
            '\u{1d173}',
            '\u{e0041}',
        ] {
            assert!(!is_unsafe_to_keep(c), "{c:?}");
            assert_eq!(clean(&format!("a{c}b"), FIELD_CHARS), format!("a{c}b"));
            assert_eq!(clean_field(&format!("a{c}b")), format!("a{c}b"));
            assert!(is_unsafe(c), "{c:?}");
            assert_eq!(escape(&format!("a{c}b")), format!("a\\u{{{:x}}}b", u32::from(c)));
        }
        for c in ['\u{1b}', '\u{0}', '\u{200b}', '\u{202e}', '\u{2066}', '\u{feff}'] {
            assert!(is_unsafe_to_keep(c), "{c:?}");
            assert_eq!(
                clean(&format!("a{c}b"), FIELD_CHARS),
                format!("a\\u{{{:x}}}b", u32::from(c))
            );
        }
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in [
            "alice@example.com",
            "CORP\\alice",
            "Zoë Ångström",
            "李小龙",
            "مرحبا",
            "os:operator os:reader",
            "\\u{1b} typed by hand",
        ] {
            assert_eq!(escape(text), text);
        }
        // Escaping twice changes nothing.
        let once = escape("\u{202e}evil\r\n");
        assert_eq!(escape(&once), once);
    }

    #[test]
    fn bounded_cuts_long_values_between_escapes() {
        assert_eq!(bounded("abcdef", 6), "abcdef");
        assert_eq!(bounded("abcdefg", 6), "abcde…");
        assert_eq!(bounded("", 3), "");
        assert_eq!(bounded("abc", 0), "");
        // `ab\u{1b}cd` is 11 characters once escaped: cut before the escape
        // rather than inside it.
        assert_eq!(bounded("ab\u{1b}cd", 8), "ab…");
        assert_eq!(bounded("ab\u{1b}cd", 9), "ab\\u{1b}…");
        let huge = "x".repeat(100_000);
        assert_eq!(bounded(&huge, 40).chars().count(), 40);
    }

    #[test]
    fn json_stays_the_same_value_and_becomes_terminal_safe() {
        let original: String = HOSTILE.iter().collect::<String>() + "plain \\ \" end";
        let value = serde_json::json!({"username": original, "nested": [original]});
        for text in [
            serde_json::to_string(&value).unwrap(),
            serde_json::to_string_pretty(&value).unwrap(),
        ] {
            let safe = json(&text);
            let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
            assert_eq!(back, value);
            assert!(!safe.chars().any(|c| is_unsafe(c) && c != '\n'), "{safe:?}");
        }
        // Outside the basic plane: a surrogate pair.
        assert_eq!(json("\"\u{e0041}\""), "\"\\udb40\\udc41\"");
    }
}
