//! The chain itself: how a batch's records are checked and linked onto
//! the head ([`extend_chain`], the same for both backends), and how a
//! batch is bounded in time and committed ([`append_in`]).

use time::OffsetDateTime;

use super::batch::{BatchTx, Identities, change_deny_list, entry_blocks};
use super::types::{Append, Appended, StoreError, TokenClaim, WRITE_TIMEOUT};
use crate::audit::{AuditRecord, GENESIS_HASH, RecordExt, StoredRecord, chain};

/// Append `batch` in order inside `tx`: deny list (read once for the batch,
/// and again after any change to it in the batch), replay guard, deny-list
/// changes, then the records on the chain.
///
/// The batch is taken in runs that end with a record changing the deny
/// list: every record of a run sees the same list, so a run's token claims
/// go to the backend together, before the run's change is applied.
pub(super) async fn extend_chain(
    tx: &mut impl BatchTx,
    batch: &[Append],
) -> Result<Vec<Appended>, StoreError> {
    // Checks compare what is stored: deny entries hold cleaned text, so the
    // record is cleaned first (a subject with a zero-width space must match
    // the entry an admin wrote from the trail).
    let mut records: Vec<AuditRecord> = batch.iter().map(|a| a.record.clone().normalised()).collect();
    let (subjects, usernames) = batch
        .iter()
        .zip(&records)
        .filter(|(a, _)| a.deny_check)
        .map(|(_, r)| {
            (
                r.subject.clone().unwrap_or_default(),
                r.username.clone().unwrap_or_default().to_lowercase(),
            )
        })
        .unzip();
    let checked = Identities { subjects, usernames };
    // Records that check no identity (one-off commands' records) read the
    // head alone: they are also what is written to a schema older than the
    // deny list's view (migrations/sqlite/0006).
    let (head, mut denied) = if checked.subjects.is_empty() {
        (tx.head().await?, Vec::new())
    } else {
        tx.head_and_denied(&checked).await?
    };
    let (seq, hash) = head.unwrap_or((0, GENESIS_HASH.to_owned()));
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut start = 0;
    while start < batch.len() {
        let end = batch[start..]
            .iter()
            .position(|a| a.deny_change.is_some())
            .map_or(batch.len(), |changer| start + changer + 1);
        for (append, record) in batch[start..end].iter().zip(&records[start..end]) {
            let blocked = append.deny_check
                && denied
                    .iter()
                    .any(|entry| entry_blocks(entry, record.subject.as_deref(), record.username.as_deref()));
            outcomes.push(if blocked {
                Outcome::Denied
            } else {
                Outcome::Recorded
            });
        }
        let claiming: Vec<(usize, &TokenClaim)> = (start..end)
            .filter_map(|i| match (&batch[i].claim, outcomes[i]) {
                (Some(claim), Outcome::Recorded) => Some((i, claim)),
                _ => None,
            })
            .collect();
        if !claiming.is_empty() {
            let claims: Vec<(&TokenClaim, OffsetDateTime)> = claiming
                .iter()
                .map(|&(i, claim)| (claim, records[i].occurred_at))
                .collect();
            let fresh = tx.claim_tokens(&claims).await?;
            if fresh.len() != claims.len() {
                return Err(StoreError::Unavailable(format!(
                    "the store answered {} of {} token claims",
                    fresh.len(),
                    claims.len()
                )));
            }
            for ((i, _), fresh) in claiming.into_iter().zip(fresh) {
                if !fresh {
                    outcomes[i] = Outcome::Replayed;
                }
            }
        }
        let last = end - 1;
        if let (Some(change), Outcome::Recorded) = (&batch[last].deny_change, outcomes[last]) {
            let rows = change_deny_list(tx, change).await?;
            note_change(&mut records[last], rows);
            if !checked.subjects.is_empty() {
                // Later records of this batch see the list as changed.
                denied = tx.denied(&checked).await?;
            }
        }
        start = end;
    }
    let mut stored = Vec::with_capacity(records.len());
    let (mut seq, mut hash) = (seq, hash);
    for (record, outcome) in records.into_iter().zip(&outcomes) {
        // Already normalised above; `apply` only clears fields.
        let next = chain(seq, &hash, outcome.apply(record));
        seq = next.seq;
        hash = next.hash.clone();
        stored.push(next);
    }
    tx.insert_records(&stored).await?;
    Ok(stored
        .into_iter()
        .zip(outcomes)
        .map(|(s, outcome)| outcome.wrap(s))
        .collect())
}

/// What the in-transaction checks decided for one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Recorded,
    Replayed,
    Denied,
}

impl Outcome {
    fn apply(self, record: AuditRecord) -> AuditRecord {
        match self {
            Outcome::Recorded => record,
            Outcome::Replayed => record.into_denial("token_replayed"),
            Outcome::Denied => record.into_denial("identity_denied"),
        }
    }

    fn wrap(self, stored: StoredRecord) -> Appended {
        match self {
            Outcome::Recorded => Appended::Recorded(stored),
            Outcome::Replayed => Appended::Replayed(stored),
            Outcome::Denied => Appended::Denied(stored),
        }
    }
}

/// Say in the record how many deny-list entries the change touched.
fn note_change(record: &mut AuditRecord, rows: u64) {
    if let serde_json::Value::Object(details) = &mut record.details {
        details.insert("entries_changed".into(), serde_json::json!(rows));
    }
}

/// The batch in `tx`, which holds the chain lock, then the commit;
/// `before_commit` runs when the records are written and the `COMMIT` is
/// about to be sent (where the next batch's lock is taken ahead).
pub(super) async fn append_in<Tx: BatchTx>(
    begin: impl Future<Output = Result<Tx, StoreError>>,
    batch: &[Append],
    before_commit: impl FnOnce(),
) -> Result<Vec<Appended>, StoreError> {
    let silent = || StoreError::Unavailable(format!("no answer within {WRITE_TIMEOUT:?}"));
    // Dropped on a timeout: the connection goes, the transaction with it.
    let (tx, out) = tokio::time::timeout(WRITE_TIMEOUT, async {
        let mut tx = begin.await?;
        let out = extend_chain(&mut tx, batch).await?;
        Ok::<_, StoreError>((tx, out))
    })
    .await
    .map_err(|_| silent())??;
    before_commit();
    let committed = tokio::time::timeout(WRITE_TIMEOUT, tx.commit())
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::Io(std::io::Error::other(silent().to_string()))));
    match committed {
        Ok(()) => Ok(out),
        // The database answered: it did not commit.
        Err(error @ sqlx::Error::Database(_)) => Err(error.into()),
        // No answer (connection cut, I/O error): the commit may have
        // happened, only reading it back can tell.
        Err(error) => Err(StoreError::CommitUnacknowledged {
            reason: error.to_string(),
            appended: out,
        }),
    }
}
