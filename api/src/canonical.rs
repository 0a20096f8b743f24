//! RFC 8785 (the JSON Canonicalization Scheme), as the audit chain and the
//! checkpoints use it: the general encoder of a JSON value, the writer the
//! record encoding is built with, the numbers every reader reads alike,
//! and the hash of the bytes.
//!
//! [RFC 8785]: https://www.rfc-editor.org/rfc/rfc8785

use serde_json::Value;

use crate::time_text::format_micros;

/// Largest integer magnitude a record may hold as a number: beyond it,
/// RFC 8785 (which reads every number as an IEEE 754 double) would write
/// two different integers as the same bytes.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// An RFC 8785 object written key by key, the caller giving the keys in
/// their canonical order.
pub(crate) struct CanonicalObject {
    out: Vec<u8>,
}

impl CanonicalObject {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut out = Vec::with_capacity(capacity);
        out.push(b'{');
        Self { out }
    }

    /// `"key":`, after a comma unless it is the first. Keys here are
    /// plain ASCII names: nothing to escape.
    pub(crate) fn key(&mut self, key: &str) {
        if self.out.len() > 1 {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    pub(crate) fn raw(&mut self, key: &str, value: &str) {
        self.key(key);
        self.out.extend_from_slice(value.as_bytes());
    }

    pub(crate) fn string(&mut self, key: &str, value: &str) {
        self.key(key);
        push_string(&mut self.out, value);
    }

    pub(crate) fn optional(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(value) => self.string(key, value),
            None => self.raw(key, "null"),
        }
    }

    pub(crate) fn list(&mut self, key: &str, items: &[String]) {
        self.key(key);
        self.out.push(b'[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            push_string(&mut self.out, item);
        }
        self.out.push(b']');
    }

    /// A time in its one text form, as the record's serialisation writes it.
    pub(crate) fn time(&mut self, key: &str, value: Option<time::OffsetDateTime>) {
        match value {
            Some(t) => self.string(key, &format_micros(t)),
            None => self.raw(key, "null"),
        }
    }

    /// Any JSON value, canonicalised on its own (most records hold `{}`);
    /// false when it has no canonical form.
    pub(crate) fn details(&mut self, key: &str, value: &Value) -> bool {
        self.key(key);
        if value.as_object().is_some_and(serde_json::Map::is_empty) {
            self.out.extend_from_slice(b"{}");
            return true;
        }
        let bytes = canonical_json(value);
        self.out.extend_from_slice(&bytes);
        !bytes.is_empty()
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.out.push(b'}');
        self.out
    }
}

/// A JSON string as RFC 8785 writes it: quoted, with `"`, `\` and the
/// control characters escaped (the short escapes where JSON has them,
/// else `\u00xx` in lowercase hex), everything else as it is.
fn push_string(out: &mut Vec<u8>, value: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut start = 0;
    let mut unicode = *b"\\u0000";
    for (i, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0a => b"\\n",
            0x0c => b"\\f",
            0x0d => b"\\r",
            0x00..=0x1f => {
                unicode[4] = HEX[usize::from(byte >> 4)];
                unicode[5] = HEX[usize::from(byte & 0xf)];
                &unicode
            }
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        out.extend_from_slice(escape);
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// RFC 8785 bytes of `value`. Empty only for a value JSON cannot hold
/// (a non-finite float), which no record or checkpoint has.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(value).unwrap_or_default()
}

/// Whether every number in `value` is an integer of at most
/// [`MAX_SAFE_INTEGER`] in magnitude.
pub(crate) fn only_safe_integers(value: &Value) -> bool {
    match value {
        Value::Number(n) => is_safe_integer(n),
        Value::Array(items) => items.iter().all(only_safe_integers),
        Value::Object(map) => map.values().all(only_safe_integers),
        Value::Null | Value::Bool(_) | Value::String(_) => true,
    }
}

/// Whether `n` is an integer of at most [`MAX_SAFE_INTEGER`] in magnitude:
/// a number a record may hold as a number (fractions and larger integers
/// are kept as strings), which every JSON reader reads and writes alike.
pub fn is_safe_integer(n: &serde_json::Number) -> bool {
    n.as_i64()
        .map(i64::unsigned_abs)
        .or_else(|| n.as_u64())
        .is_some_and(|magnitude| magnitude <= MAX_SAFE_INTEGER)
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}
