//! A batch's side of the store: the steps a backend runs inside the
//! transaction that holds the chain's lock ([`BatchTx`]), and the pieces
//! of the checks both backends share (token claims, deny-list matches).

use time::OffsetDateTime;

use super::query::{Statement, deny_change};
use super::types::{DenyChange, StoreError, TokenClaim};
use crate::audit::StoredRecord;

/// A token claim and when its token was used.
pub(super) type Claim<'c> = (&'c TokenClaim, OffsetDateTime);

/// The claims of a batch as one statement takes them (the replay guard):
/// each token id once, at its first claim, so that the statement never
/// meets the same key twice. A later claim of the same id in the batch is
/// a replay, whatever the table holds.
pub(super) fn distinct_claims<'c>(claims: &'c [Claim<'c>]) -> Vec<&'c Claim<'c>> {
    let mut seen = std::collections::HashSet::with_capacity(claims.len());
    claims
        .iter()
        .filter(|(claim, _)| seen.insert(claim.token_id.as_str()))
        .collect()
}

/// One answer per claim, in order, from the token ids the statement
/// inserted (the ones nobody had claimed): fresh for the first claim of an
/// inserted id, a replay for every other.
pub(super) fn claim_answers(claims: &[(&TokenClaim, OffsetDateTime)], inserted: Vec<String>) -> Vec<bool> {
    let mut inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
    claims
        .iter()
        .map(|(claim, _)| inserted.remove(&claim.token_id))
        .collect()
}

/// The keys of a token that may be claimed `uses` times: its id for the
/// first use, as a single-use token's, then `ID#2` to `ID#uses`.
pub(super) fn use_keys(token_id: &str, uses: u32) -> impl Iterator<Item = String> + '_ {
    (1..=uses.max(1)).map(move |n| {
        if n == 1 {
            token_id.to_owned()
        } else {
            format!("{token_id}#{n}")
        }
    })
}

/// `(subject, username)` of deny-list entries that match a batch.
pub(super) type DeniedPairs = Vec<(Option<String>, Option<String>)>;

/// The identities a batch checks against the deny list: each checked
/// record's subject, and its username lower-cased.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Identities {
    pub(super) subjects: Vec<String>,
    pub(super) usernames: Vec<String>,
}

/// The chain head (`None` for an empty trail) and the deny-list entries
/// that match a batch.
pub(super) type HeadAndDenied = (Option<(i64, String)>, DeniedPairs);

/// A row of a backend's `head_and_denied` statement: the chain head as
/// `(seq, hash, NULL, NULL)`, or a matching deny-list entry as
/// `(NULL, NULL, subject, username)`.
pub(super) type HeadOrDenied = (Option<i64>, Option<String>, Option<String>, Option<String>);

/// The head and the deny-list entries from the rows of [`HeadOrDenied`].
pub(super) fn head_and_denied(rows: Vec<HeadOrDenied>) -> Result<HeadAndDenied, StoreError> {
    let mut head = None;
    let mut denied = Vec::new();
    for row in rows {
        match row {
            (Some(seq), Some(hash), None, None) if head.is_none() => head = Some((seq, hash)),
            (None, None, subject, username) => denied.push((subject, username)),
            (seq, ..) => {
                return Err(StoreError::Corrupt(format!(
                    "the chain head query answered an unexpected row (seq {seq:?})"
                )));
            }
        }
    }
    Ok((head, denied))
}

/// One backend's side of appending a batch, inside the transaction it
/// opened under the lock that serialises chain appends. Each method is
/// handed a step of the batch whole and writes it with one statement (one
/// round trip while the lock is held, whatever the batch's size);
/// [`extend_chain`] decides what is written.
pub(super) trait BatchTx {
    /// The last record's sequence number and hash; `None` when the trail is empty.
    async fn head(&mut self) -> Result<Option<(i64, String)>, StoreError>;
    /// The last record's sequence number and hash (`None` when the trail
    /// is empty), and the deny-list entries matching any of `checked`: what
    /// every batch reads first, in one statement (rows of
    /// [`HeadOrDenied`]), since each statement is a round trip made while
    /// the chain's lock is held.
    async fn head_and_denied(&mut self, checked: &Identities) -> Result<HeadAndDenied, StoreError>;
    /// Deny-list entries matching any of `checked`, read again after a
    /// change in the batch: the same statement, the head it also reads left
    /// aside (one more lookup in the table's key, for a batch that changed
    /// the list), so that each backend writes that statement once.
    async fn denied(&mut self, checked: &Identities) -> Result<DeniedPairs, StoreError> {
        Ok(self.head_and_denied(checked).await?.1)
    }
    /// Claim these token ids, each used at its time, in order: one answer
    /// per claim, `false` when the id was claimed before (a replay),
    /// earlier in this list included. Each single-use id goes to the
    /// backend once ([`distinct_claims`]); the ids it inserted answer every
    /// claim ([`claim_answers`]). A token that may be claimed `uses` times
    /// (a workload's) takes the first free of its [`use_keys`], one
    /// statement per key tried: a replay once all are taken.
    async fn claim_tokens(
        &mut self,
        claims: &[(&TokenClaim, OffsetDateTime)],
    ) -> Result<Vec<bool>, StoreError> {
        let single: Vec<(&TokenClaim, OffsetDateTime)> = claims
            .iter()
            .filter(|(claim, _)| claim.uses <= 1)
            .copied()
            .collect();
        let inserted = self.insert_claims(&distinct_claims(&single)).await?;
        let mut single_answers = claim_answers(&single, inserted).into_iter();
        let mut answers = Vec::with_capacity(claims.len());
        for (claim, at) in claims {
            if claim.uses <= 1 {
                answers.push(single_answers.next().unwrap_or(false));
                continue;
            }
            let mut fresh = false;
            for token_id in use_keys(&claim.token_id, claim.uses) {
                let key = TokenClaim {
                    token_id,
                    expires_at: claim.expires_at,
                    uses: 1,
                };
                if !self.insert_claims(&[&(&key, *at)]).await?.is_empty() {
                    fresh = true;
                    break;
                }
            }
            answers.push(fresh);
        }
        Ok(answers)
    }
    /// Insert these claims (each token id once), leaving any claimed
    /// before as it is; the token ids it inserted.
    async fn insert_claims(&mut self, distinct: &[&Claim<'_>]) -> Result<Vec<String>, StoreError>;
    /// Run one statement written for both backends ([`Statement`]); the
    /// number of rows it touched.
    async fn execute(&mut self, statement: Statement) -> Result<u64, StoreError>;
    /// Write the batch's records, already chained, in order.
    async fn insert_records(&mut self, records: &[StoredRecord]) -> Result<(), StoreError>;
    /// Commit: the lock is freed, the batch is durable.
    async fn commit(self) -> Result<(), sqlx::Error>;
}

/// Whether a deny-list entry `(subject, username)` blocks `record`. Entries
/// match on the subject, which the person cannot change; an entry with no
/// subject (written before subjects were required) matches the lower-cased
/// username.
pub(super) fn entry_blocks(
    entry: &(Option<String>, Option<String>),
    subject: Option<&str>,
    username: Option<&str>,
) -> bool {
    match entry {
        (Some(listed), _) => Some(listed.as_str()) == subject,
        (None, Some(name)) => username.is_some_and(|u| u.to_lowercase() == *name),
        (None, None) => false,
    }
}

/// Apply a deny-list change in `tx`: the statements both backends run
/// ([`deny_change`]), each binding the times its own way; the number of
/// entries it changed.
pub(super) async fn change_deny_list(tx: &mut impl BatchTx, change: &DenyChange) -> Result<u64, StoreError> {
    let mut touched = 0;
    for statement in deny_change(change) {
        touched = tx.execute(statement).await?;
    }
    Ok(touched)
}
