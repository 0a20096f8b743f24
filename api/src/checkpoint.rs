//! Signed checkpoints of the audit trail: the server signs the chain head
//! (sequence number and hash, with the time and its own name) with an
//! Ed25519 key of its own and publishes it outside the database, so that
//! someone who can rewrite the table cannot rewrite what was already
//! signed. This module holds the checkpoint as it is published, the bytes
//! its signature covers, the public keys it is checked with, and the
//! reading of a checkpoint file (one JSON object per line).
//!
//! Signed bytes: the RFC 8785 encoding ([`crate::canonical::canonical_json`])
//! of the checkpoint without its `signature`. The `type` field keeps those
//! bytes from meaning anything else. `key_id` is the hex SHA-256 of the
//! signing key's SubjectPublicKeyInfo DER, what
//! `openssl pkey -pubin -outform DER | sha256sum` prints for its public key.

use std::io::BufRead;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use spki::der::Decode;
use time::OffsetDateTime;

use crate::canonical::{canonical_json, sha256_hex};
use crate::exact_line::{ExactLineError, OTHER_FORMS, printable, read_exact_line};
use crate::time_text::micros;

/// The `type` of every checkpoint this version writes.
pub const CHECKPOINT_TYPE: &str = "talos-sso.audit.checkpoint.v1";

/// Why a checkpoint was signed.
pub mod trigger {
    /// The configured interval passed and the trail had grown.
    pub const INTERVAL: &str = "interval";
    /// The server was stopping: the head after its last record.
    pub const SHUTDOWN: &str = "shutdown";
    /// The server started: the head it found.
    pub const START: &str = "start";
    /// An auditor asked (`POST /v1/audit/checkpoint`).
    pub const REQUEST: &str = "request";
    /// `talos-sso-server audit checkpoint` on the server host.
    pub const COMMAND: &str = "command";
}

/// Longest line a checkpoint file may hold (a checkpoint is about 400
/// bytes): a longer one is not a checkpoint, and is not read whole.
pub const MAX_LINE: usize = 4096;

/// One signed checkpoint, as the server publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// [`CHECKPOINT_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The server that signed (`audit.checkpoints.server_name`, else the host name).
    pub server: String,
    /// The last record covered: every record from 1 to `seq`.
    pub seq: i64,
    /// That record's hash (64 zeros for an empty trail, `seq` 0).
    pub hash: String,
    #[serde(with = "micros")]
    pub signed_at: OffsetDateTime,
    /// One of [`trigger`].
    pub trigger: String,
    /// Hex SHA-256 of the signing key's SubjectPublicKeyInfo DER.
    pub key_id: String,
    /// Hex Ed25519 signature of [`Checkpoint::signed_bytes`].
    pub signature: String,
}

impl Checkpoint {
    /// The bytes the signature covers: the checkpoint without `signature`,
    /// RFC 8785.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("signature");
        }
        canonical_json(&value)
    }

    /// The checkpoint as one line of a checkpoint file (no newline): the
    /// compact JSON of this type, keys in the order of its fields. The one
    /// text of a checkpoint that [`read_checkpoints`] accepts.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why a checkpoint or a key cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("{origin}: not a PEM public key ({reason})")]
    NotAPublicKey { origin: String, reason: String },
    #[error("{origin}: the public key is {algorithm}, not Ed25519")]
    NotEd25519 { origin: String, algorithm: String },
    #[error("{origin}: cannot be read: {reason}")]
    Unreadable { origin: String, reason: String },
    #[error("{origin}, line {line}: not a checkpoint ({reason})")]
    Malformed {
        origin: String,
        line: usize,
        reason: String,
    },
    #[error(
        "{origin}, line {line}: the checkpoint of record {seq} is signed by key {key_id}, which is not one of the \
         public keys given"
    )]
    UnknownKey {
        origin: String,
        line: usize,
        seq: i64,
        key_id: String,
    },
    #[error(
        "{origin}, line {line}: the signature of the checkpoint of record {seq} does not verify: the checkpoint was \
         changed after it was signed, or forged"
    )]
    BadSignature { origin: String, line: usize, seq: i64 },
}

impl CheckpointError {
    /// The record the checkpoint at fault names, when it could be read.
    pub fn seq(&self) -> Option<i64> {
        match self {
            CheckpointError::UnknownKey { seq, .. } | CheckpointError::BadSignature { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

/// An Ed25519 public key that checkpoints are checked with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointKey {
    /// Hex SHA-256 of the SubjectPublicKeyInfo DER.
    pub key_id: String,
    /// The 32 bytes of the key.
    public: Vec<u8>,
}

/// The algorithm identifier of Ed25519 (RFC 8410).
const ED25519_OID: spki::ObjectIdentifier = spki::ObjectIdentifier::new_unwrap("1.3.101.112");

impl CheckpointKey {
    /// A key from the DER of its SubjectPublicKeyInfo.
    pub fn from_spki_der(der: &[u8], origin: &str) -> Result<Self, CheckpointError> {
        let info =
            spki::SubjectPublicKeyInfoRef::from_der(der).map_err(|e| CheckpointError::NotAPublicKey {
                origin: origin.to_owned(),
                reason: e.to_string(),
            })?;
        if info.algorithm.oid != ED25519_OID {
            return Err(CheckpointError::NotEd25519 {
                origin: origin.to_owned(),
                algorithm: info.algorithm.oid.to_string(),
            });
        }
        let public = info.subject_public_key.raw_bytes();
        if public.len() != 32 {
            return Err(CheckpointError::NotAPublicKey {
                origin: origin.to_owned(),
                reason: format!("an Ed25519 key has 32 bytes, this one {}", public.len()),
            });
        }
        Ok(Self {
            key_id: sha256_hex(der),
            public: public.to_vec(),
        })
    }

    /// A key from PEM text (`-----BEGIN PUBLIC KEY-----`, as `openssl pkey
    /// -pubout` and `talos-sso-server audit new-key` write it).
    pub fn from_pem(text: &str, origin: &str) -> Result<Self, CheckpointError> {
        let not_a_key = |reason: String| CheckpointError::NotAPublicKey {
            origin: origin.to_owned(),
            reason,
        };
        let block = pem::parse_many(text)
            .map_err(|e| not_a_key(e.to_string()))?
            .into_iter()
            .find(|p| p.tag() == "PUBLIC KEY")
            .ok_or_else(|| not_a_key("no PUBLIC KEY block".into()))?;
        Self::from_spki_der(block.contents(), origin)
    }

    /// Whether `signature` (hex) is this key's over `message`.
    fn verifies(&self, message: &[u8], signature: &str) -> bool {
        let Ok(signature) = hex::decode(signature) else {
            return false;
        };
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &self.public)
            .verify(message, &signature)
            .is_ok()
    }
}

/// The checkpoints of a checkpoint file, each signature checked with one of
/// `keys`; the first line that is not a good checkpoint fails the whole
/// file, naming the line. A line is a checkpoint only when its bytes, the
/// final `\n` aside, are exactly [`Checkpoint::to_line`] of the checkpoint
/// it reads as; empty lines are skipped.
pub fn read_checkpoints(
    mut reader: impl BufRead,
    origin: &str,
    keys: &[CheckpointKey],
) -> Result<Vec<Checkpoint>, CheckpointError> {
    let mut checkpoints = Vec::new();
    let mut line_number = 0;
    let mut line = Vec::new();
    loop {
        line.clear();
        line_number += 1;
        let read = std::io::Read::take(&mut reader, MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| CheckpointError::Unreadable {
                origin: origin.to_owned(),
                reason: e.to_string(),
            })?;
        if read == 0 {
            return Ok(checkpoints);
        }
        // Reasons quote nothing from the file but what read_exact_line
        // made printable.
        let malformed = |reason: String| CheckpointError::Malformed {
            origin: origin.to_owned(),
            line: line_number,
            reason,
        };
        if line.len() > MAX_LINE {
            return Err(malformed(format!("longer than {MAX_LINE} bytes")));
        }
        // The signature is checked over the bytes rebuilt from the parsed
        // checkpoint, so the line must be exactly the one the server wrote
        // for it: another text of it could read otherwise elsewhere (a key
        // given twice is the first one to some readers, the last one here),
        // or say another time (an offset) under the same signature.
        let checkpoint = match read_exact_line(&line, Checkpoint::to_line) {
            Ok(Some(checkpoint)) => checkpoint,
            Ok(None) => continue,
            Err(ExactLineError::NotUtf8) => return Err(malformed("not UTF-8".into())),
            Err(ExactLineError::NotJson(reason)) => return Err(malformed(reason)),
            Err(ExactLineError::OtherForm(_)) => {
                return Err(malformed(format!(
                    "not in the form the server writes ({OTHER_FORMS})"
                )));
            }
        };
        if checkpoint.kind != CHECKPOINT_TYPE {
            return Err(malformed(format!("its type is not {CHECKPOINT_TYPE}")));
        }
        let key = keys
            .iter()
            .find(|k| k.key_id == checkpoint.key_id)
            .ok_or_else(|| CheckpointError::UnknownKey {
                origin: origin.to_owned(),
                line: line_number,
                seq: checkpoint.seq,
                key_id: printable(&checkpoint.key_id),
            })?;
        if !key.verifies(&checkpoint.signed_bytes(), &checkpoint.signature) {
            return Err(CheckpointError::BadSignature {
                origin: origin.to_owned(),
                line: line_number,
                seq: checkpoint.seq,
            });
        }
        checkpoints.push(checkpoint);
    }
}

/// How far signed checkpoints vouch for a chain that was checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointCoverage {
    /// Checkpoints whose record was found with the signed hash.
    pub matched: u64,
    /// The last of them: every record up to its `seq` is as it was when it
    /// was signed.
    pub last: Option<Checkpoint>,
    /// Records after the last matched checkpoint, vouched for by the chain
    /// alone until the next checkpoint is signed.
    pub records_after_last: u64,
    /// Checkpoints before the first record checked (an export that starts
    /// later): they vouch for records that were not checked.
    pub before_first: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ed25519 key pair from ring, and its public key as SPKI DER.
    fn key_pair() -> (ring::signature::Ed25519KeyPair, Vec<u8>) {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let mut der = hex::decode("302a300506032b6570032100").unwrap();
        der.extend_from_slice(pair.public_key().as_ref());
        (pair, der)
    }

    fn signed(pair: &ring::signature::Ed25519KeyPair, key: &CheckpointKey, seq: i64) -> Checkpoint {
        let mut checkpoint = Checkpoint {
            kind: CHECKPOINT_TYPE.into(),
            server: "talos-sso-1".into(),
            seq,
            hash: "ab".repeat(32),
            signed_at: OffsetDateTime::UNIX_EPOCH,
            trigger: trigger::INTERVAL.into(),
            key_id: key.key_id.clone(),
            signature: String::new(),
        };
        checkpoint.signature = hex::encode(pair.sign(&checkpoint.signed_bytes()));
        checkpoint
    }

    #[test]
    fn signed_bytes_are_the_checkpoint_without_its_signature_in_rfc_8785_form() {
        let (pair, der) = key_pair();
        let key = CheckpointKey::from_spki_der(&der, "key").unwrap();
        let checkpoint = signed(&pair, &key, 7);
        let text = String::from_utf8(checkpoint.signed_bytes()).unwrap();
        assert_eq!(
            text,
            format!(
                r#"{{"hash":"{}","key_id":"{}","seq":7,"server":"talos-sso-1","signed_at":"1970-01-01T00:00:00.000000Z","trigger":"interval","type":"{CHECKPOINT_TYPE}"}}"#,
                "ab".repeat(32),
                key.key_id
            )
        );
    }

    #[test]
    fn a_checkpoint_file_is_read_with_every_signature_checked() {
        let (pair, der) = key_pair();
        let key = CheckpointKey::from_spki_der(&der, "key").unwrap();
        let lines: Vec<String> = [1, 5].iter().map(|s| signed(&pair, &key, *s).to_line()).collect();
        let file = format!("{}\n\n{}\n", lines[0], lines[1]);
        let read = read_checkpoints(file.as_bytes(), "c.jsonl", std::slice::from_ref(&key)).unwrap();
        assert_eq!(read.iter().map(|c| c.seq).collect::<Vec<_>>(), [1, 5]);

        // The seq changed after signing: the signature no longer verifies.
        let forged = lines[1].replace(r#""seq":5"#, r#""seq":4"#);
        let file = format!("{}\n{forged}\n", lines[0]);
        assert_eq!(
            read_checkpoints(file.as_bytes(), "c.jsonl", std::slice::from_ref(&key)),
            Err(CheckpointError::BadSignature {
                origin: "c.jsonl".into(),
                line: 2,
                seq: 4
            })
        );

        // Signed by another key.
        let (_, other) = key_pair();
        let other = CheckpointKey::from_spki_der(&other, "other").unwrap();
        assert!(matches!(
            read_checkpoints(lines[0].as_bytes(), "c.jsonl", &[other]),
            Err(CheckpointError::UnknownKey { line: 1, seq: 1, .. })
        ));

        // What an error quotes of an unsigned line reaches no terminal raw
        // (written as the server would write such a key id).
        let hostile = lines[0].replace(&key.key_id, "\\u001b[2J\u{202e}");
        let error = read_checkpoints(hostile.as_bytes(), "c.jsonl", std::slice::from_ref(&key))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("\\u{1b}[2J\\u{202e}") && !error.contains('\u{1b}'),
            "{error:?}"
        );
        // A signed line rewritten with an offset time is another text of
        // the same signed bytes: refused.
        let offset = lines[0].replace("1970-01-01T00:00:00.000000Z", "1970-01-01T01:00:00.000000+01:00");
        assert!(matches!(
            read_checkpoints(offset.as_bytes(), "c.jsonl", std::slice::from_ref(&key)),
            Err(CheckpointError::Malformed { line: 1, .. })
        ));

        for (bad, line) in [
            ("{}\n", 1),
            ("not json\n", 1),
            (&*format!("{}\n{}\n", lines[0], "x".repeat(5000)), 2),
        ] {
            assert!(
                matches!(
                    read_checkpoints(bad.as_bytes(), "c.jsonl", std::slice::from_ref(&key)),
                    Err(CheckpointError::Malformed { line: l, .. }) if l == line
                ),
                "{bad:.40}"
            );
        }
    }

    #[test]
    fn only_the_line_the_server_writes_reads_as_a_checkpoint() {
        let (pair, der) = key_pair();
        let key = CheckpointKey::from_spki_der(&der, "key").unwrap();
        let line = signed(&pair, &key, 5).to_line();
        assert!(
            line.starts_with(r#"{"type":"talos-sso.audit.checkpoint.v1","server":"talos-sso-1","seq":5,"#)
        );
        let read = |text: &str| read_checkpoints(text.as_bytes(), "c.jsonl", std::slice::from_ref(&key));
        assert_eq!(read(&format!("{line}\n")).unwrap().len(), 1);
        assert_eq!(read(&line).unwrap().len(), 1);

        let body = &line[1..line.len() - 1];
        let others = [
            // Another reader would take this checkpoint for one of record 9
            // signed by someone else.
            (
                "a fake seq and server before the real ones",
                format!(r#"{{"seq":9,"server":"elsewhere",{body}}}"#),
            ),
            (
                "a key moved",
                format!(
                    r#"{{{},"type":"{CHECKPOINT_TYPE}"}}"#,
                    body.replacen(&format!(r#""type":"{CHECKPOINT_TYPE}","#), "", 1)
                ),
            ),
            ("a space after each comma", line.replace(r#",""#, r#", ""#)),
            ("spaces around the object", format!(" {line} ")),
            ("a CR before the newline", format!("{line}\r")),
            (
                "a trailing copy of a field",
                format!(r#"{{{body},"server":"talos-sso-1"}}"#),
            ),
            ("a trailing field", format!(r#"{{{body},"note":"x"}}"#)),
            (
                "a letter as an escape",
                line.replacen("talos-sso-1", r"\u0074alos-sso-1", 1),
            ),
            (
                "a seq with a fraction",
                line.replacen(r#""seq":5,"#, r#""seq":5.0,"#, 1),
            ),
        ];
        let taken: Vec<&str> = others
            .iter()
            .chain(&[("a line of spaces", "  ".to_owned())])
            .filter(|(_, text)| {
                !matches!(
                    read(&format!("{text}\n")),
                    Err(CheckpointError::Malformed { line: 1, .. })
                )
            })
            .map(|(what, _)| *what)
            .collect();
        assert!(taken.is_empty(), "read as a checkpoint: {taken:?}");
        // The reason is given whole: only what comes from the file is cut.
        let error = read(&format!(" {line}")).unwrap_err().to_string();
        assert!(
            error.ends_with(&format!("(not in the form the server writes ({OTHER_FORMS}))")),
            "{error}"
        );
    }

    #[test]
    fn only_ed25519_public_keys_are_taken() {
        let (_, der) = key_pair();
        let pem = pem::encode(&pem::Pem::new("PUBLIC KEY", der.clone()));
        assert_eq!(
            CheckpointKey::from_pem(&pem, "k").unwrap(),
            CheckpointKey::from_spki_der(&der, "k").unwrap()
        );
        // A P-256 public key.
        let p256 = hex::decode(
            "3059301306072a8648ce3d020106082a8648ce3d03010703420004\
             6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296\
             4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5",
        )
        .unwrap();
        assert!(matches!(
            CheckpointKey::from_spki_der(&p256, "k"),
            Err(CheckpointError::NotEd25519 { .. })
        ));
        assert!(matches!(
            CheckpointKey::from_pem(
                "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n",
                "k"
            ),
            Err(CheckpointError::NotAPublicKey { .. })
        ));
    }
}
