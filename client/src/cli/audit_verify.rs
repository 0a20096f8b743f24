//! `audit verify --file EXPORT [--checkpoints FILE --public-key FILE]`: an
//! export of the trail checked here, with no server and no database: every
//! record's hash recomputed from its content (RFC 8785, SHA-256), every
//! link to the record before it, and, with checkpoints, every record a
//! signed checkpoint names, and that none names a record past the end.
//! Every line must be exactly the text the server writes for its record
//! ([`read_record_line`]). Also how both forms of `audit verify` report.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use talos_sso_api::audit::{ChainStatus, StoredRecord};
use talos_sso_api::chain::{ChainCheck, LineError, describe, read_record_line};
use talos_sso_api::checkpoint::{CheckpointKey, read_checkpoints};

/// Longest line of an export read: a record is bounded by the server (a
/// few KiB); a longer line is not one of its records.
const MAX_RECORD_LINE: u64 = 1024 * 1024;

/// Largest public key file read.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// Verify the export at `file`, against the checkpoints of `checkpoint_files`
/// checked with `public_keys`.
pub(super) fn verify_export(
    file: &Path,
    from: Option<i64>,
    checkpoint_files: &[PathBuf],
    public_keys: &[PathBuf],
) -> anyhow::Result<ChainStatus> {
    if !checkpoint_files.is_empty() && public_keys.is_empty() {
        bail!("--checkpoints needs --public-key: the server's audit public key checks their signatures");
    }
    let keys = public_keys
        .iter()
        .map(|path| {
            let text = read_bounded(path, MAX_KEY_FILE)?;
            Ok(CheckpointKey::from_pem(&text, &path.display().to_string())?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut checkpoints = Vec::new();
    for path in checkpoint_files {
        let origin = path.display().to_string();
        let reader = std::fs::File::open(path).with_context(|| format!("cannot open {origin}"))?;
        checkpoints.extend(read_checkpoints(std::io::BufReader::new(reader), &origin, &keys)?);
    }

    let origin = file.display().to_string();
    let mut reader =
        std::io::BufReader::new(std::fs::File::open(file).with_context(|| format!("cannot open {origin}"))?);
    let mut check: Option<ChainCheck> = None;
    let mut pending = (!checkpoint_files.is_empty()).then_some(checkpoints);
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let read = std::io::Read::take(&mut reader, MAX_RECORD_LINE + 1)
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read {origin}"))?;
        if read == 0 {
            break;
        }
        if line.len() as u64 > MAX_RECORD_LINE {
            bail!("{origin}, line {number}: longer than {MAX_RECORD_LINE} bytes, not a record of the trail");
        }
        let record = match read_record_line(&line) {
            Ok(Some(record)) => record,
            Ok(None) => continue,
            Err(error @ (LineError::NotUtf8 | LineError::NotARecord(_))) => {
                bail!("{origin}, line {number}: {error} (export with `--output json`)")
            }
            // A terminal gets the export with characters escaped (see
            // `talos_sso_text::json`): another form of the line, never another number.
            Err(error @ LineError::NotServerForm { .. }) => bail!(
                "{origin}, line {number}: {error}: the line was changed after export, or the export was printed \
                 to a terminal (export into a file)"
            ),
            Err(error @ LineError::Number { .. }) => {
                bail!("{origin}, line {number}: {error}: the line was changed after export")
            }
        };
        if check.is_none() {
            let start = start_of(&record, from, &origin)?;
            check = Some(match pending.take() {
                Some(signed) => start.with_checkpoints(signed),
                None => start,
            });
        }
        if let Some(check) = check.as_mut() {
            check.feed(&record);
        }
    }
    let Some(mut check) = check else {
        bail!("{origin} holds no records");
    };
    check.finish();
    Ok(check.status())
}

/// Where the check of an export starts. An export must start at record 1,
/// after the 64 zeros, unless `--from SEQ` says where it starts: then its
/// first `prev_hash` is taken as given, and the report says so. (Otherwise
/// an export that leaves out the first records, or makes up a trail of its
/// own, would verify.)
fn start_of(first: &StoredRecord, from: Option<i64>, origin: &str) -> anyhow::Result<ChainCheck> {
    let expected = from.unwrap_or(1);
    if first.seq != expected {
        bail!(
            "{origin} starts at record {}, not {expected}: {}",
            first.seq,
            if from.is_some() {
                "--from names the first record of the export"
            } else {
                "an export to verify starts at record 1 (or name its first record with --from)"
            }
        );
    }
    match first.seq.checked_sub(1) {
        Some(0) => Ok(ChainCheck::default()),
        Some(before) if before > 0 => Ok(ChainCheck::after(before, &first.prev_hash)),
        _ => bail!(
            "{origin}: record {} is not a record of a trail (they start at 1)",
            first.seq
        ),
    }
}

fn read_bounded(path: &Path, max: u64) -> anyhow::Result<String> {
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
            max,
        ),
        &mut text,
    )
    .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text)
}

/// `status` as JSON or YAML (`audit verify --output`); an error (exit 1)
/// when the chain is broken, after the status is printed, as [`report`].
pub(super) fn report_data(
    status: &ChainStatus,
    output: super::format::Format,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    super::format::print_data(output, status, out)?;
    match describe(status) {
        Ok(_) => Ok(()),
        Err(text) => bail!(
            "{}",
            text.lines()
                .map(talos_sso_text::escape)
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// Print `status` as `audit verify` reports it; an error (exit 1) when the
/// chain is broken. Everything that came from the trail, the checkpoints
/// or the server is escaped before it reaches the terminal.
pub(super) fn report(status: &ChainStatus, out: &mut dyn Write) -> anyhow::Result<()> {
    let escaped = |text: String| -> String {
        text.lines()
            .map(talos_sso_text::escape)
            .collect::<Vec<_>>()
            .join("\n")
    };
    match describe(status) {
        Ok(text) => {
            writeln!(out, "{}", escaped(text))?;
            Ok(())
        }
        Err(text) => bail!("{}", escaped(text)),
    }
}
