//! Lines of the files the server writes (JSON Lines: an export, a
//! checkpoint file), read back only in the one form the server writes them:
//! JSON lets one value be written many ways, and readers disagree on some.

use serde::de::DeserializeOwned;

/// How a line of the server's JSON that reads as the same value may
/// differ from the one it writes.
pub(crate) const OTHER_FORMS: &str = "a key repeated, moved, missing or added, whitespace, an escape or a number \
                                      written otherwise, a time in another form, a CR before the newline";

/// Why a line is not one the server writes.
#[derive(Debug)]
pub(crate) enum ExactLineError<T> {
    NotUtf8,
    /// Not the JSON of a `T`: why, as [`printable`] quotes a file.
    NotJson(String),
    /// The JSON of this `T`, in another form ([`OTHER_FORMS`]).
    OtherForm(T),
}

/// The `T` of one line of a file the server writes (JSON Lines), `None`
/// for an empty line: its bytes, the final `\n` aside, must be exactly
/// `to_line` of the `T` they read as.
pub(crate) fn read_exact_line<T: DeserializeOwned>(
    line: &[u8],
    to_line: impl FnOnce(&T) -> String,
) -> Result<Option<T>, ExactLineError<T>> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    if line.is_empty() {
        return Ok(None);
    }
    let text = std::str::from_utf8(line).map_err(|_| ExactLineError::NotUtf8)?;
    let value: T =
        serde_json::from_str(text).map_err(|e| ExactLineError::NotJson(printable(&e.to_string())))?;
    if to_line(&value) != text {
        return Err(ExactLineError::OtherForm(value));
    }
    Ok(Some(value))
}

/// Text from a file (a checkpoint file, an export) as an error may quote
/// it: escaped as Rust escapes text for debugging (control, format and
/// other invisible characters), at most 128 characters; the file is not the
/// server's until it is checked.
pub(crate) fn printable(text: &str) -> String {
    let mut out: String = text
        .chars()
        .take(128)
        .collect::<String>()
        .escape_debug()
        .to_string();
    if text.chars().count() > 128 {
        out.push('…');
    }
    out
}
