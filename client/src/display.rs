//! Text from elsewhere (audit records from the server, the identity
//! provider's answers, a browser redirect) made safe to show in a terminal.
//!
//! Such text can carry characters chosen by an attacker: an escape sequence
//! could recolour, move the cursor or erase what an auditor is reading; CR
//! and LF could forge whole rows; bidirectional overrides and invisible
//! characters could reorder or hide part of a name. Each of them is shown
//! as a visible `\u{..}` instead, so what is printed is what is stored.
//!
//! Backslashes are left as they are: a literal `\u{1b}` typed by someone is
//! harmless visible text, names such as `CORP\alice` stay readable, and
//! escaping twice changes nothing.

use std::fmt::Write;

/// Whether `c` must not reach a terminal as it is: control characters (C0,
/// DEL, C1) and the characters that are invisible or reorder the text
/// around them.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Soft hyphen, Arabic letter mark, Mongolian vowel separator.
            '\u{ad}' | '\u{61c}' | '\u{180e}'
            // Hangul fillers: blank glyphs, a classic for invisible names.
            | '\u{115f}' | '\u{1160}' | '\u{3164}' | '\u{ffa0}'
            // Zero-width space, joiners, left-to-right and right-to-left marks.
            | '\u{200b}'..='\u{200f}'
            // Line and paragraph separators: line breaks to some renderers.
            | '\u{2028}' | '\u{2029}'
            // Bidirectional embeddings and overrides.
            | '\u{202a}'..='\u{202e}'
            // Word joiner, invisible operators, bidirectional isolates and
            // the deprecated shaping controls.
            | '\u{2060}'..='\u{206f}'
            // Byte order mark (zero-width no-break space).
            | '\u{feff}'
            // Interlinear annotation controls.
            | '\u{fff9}'..='\u{fffb}'
            // Invisible musical formatting controls.
            | '\u{1d173}'..='\u{1d17a}'
            // Tags: invisible copies of ASCII, used to smuggle text.
            | '\u{e0000}'..='\u{e007f}'
        )
}

/// `text` with every unsafe character written as `\u{..}`.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    if is_unsafe(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

/// [`escape`], cut to at most `max` characters: a longer value ends in `…`
/// and is cut between characters, never inside an escape.
pub fn bounded(text: &str, max: usize) -> String {
    let escaped = escape(text);
    if escaped.chars().count() <= max {
        return escaped;
    }
    let Some(room) = max.checked_sub(1) else {
        return String::new();
    };
    let mut out = String::new();
    let mut used = 0;
    let mut unit = String::new();
    for c in text.chars() {
        unit.clear();
        push_escaped(&mut unit, c);
        let width = unit.chars().count();
        if used + width > room {
            break;
        }
        out.push_str(&unit);
        used += width;
    }
    out.push('…');
    out
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
    use super::*;

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
