//! Group commit: requests hand their record to one writer task and wait for
//! its answer; the writer takes everything that queued up while the previous
//! transaction was committing and writes it in one transaction. Each request
//! is answered only after the commit that holds its record, so the promise
//! "no certificate before its audit record is durable" is kept, without one
//! fsync per request.
//!
//! A commit the database never acknowledged (the connection broke in the
//! middle of it) is read back: when its records are there, the requests
//! are answered as committed; when they are not, refused. When the database
//! cannot be asked within [`RESOLVE_WITHIN`], the requests are refused and
//! the batch stays in doubt; once the database answers again, each
//! certificate of an in-doubt batch that did get committed is followed by a
//! `certificate.undelivered` record, so the trail never claims, unsaid, a
//! certificate that nobody received.
//!
//! Each batch transaction is reported to the [`CommitObserver`] the writer
//! was started with (its records and how long it took: the metrics' batch
//! size and commit time), committed or not; the record-by-record retries of
//! a refused batch are not batches.
//!
//! The writer runs on a thread and a runtime of its own, with Postgres
//! connections of its own, so that each step of a batch waits for the
//! database only, not for a turn among the requests. On Postgres, while a
//! batch commits and records are waiting, the next batch's transaction is
//! begun and its lock requested ([`LockAhead`]).
//!
//! After each commit the writer publishes the highest sequence number it
//! committed ([`AuditWriter::committed`]), so that followers of the trail
//! (`GET /v1/audit/stream`) wake up at once instead of polling.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::store::{Append, Appended, AuditStore, LockAhead, StoreError};
use super::{AuditRecord, RecordExt, StoredRecord, event, outcome};

/// Most records in one transaction.
pub const MAX_BATCH: usize = 256;

/// How long the requests of an unacknowledged commit wait for the
/// database to say whether it committed (well within the HTTP request
/// timeout).
pub const RESOLVE_WITHIN: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    /// The database could not take the record; nothing may be issued.
    #[error("the audit trail is unavailable")]
    Unavailable,
}

struct Job {
    append: Append,
    respond: oneshot::Sender<Result<Appended, AuditError>>,
}

/// Counters for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct WriterStats {
    pub batches: AtomicU64,
    pub records: AtomicU64,
    pub failures: AtomicU64,
    /// Records the database refused on their own (see [`write_one`]).
    pub refused: AtomicU64,
    /// Commits that were not acknowledged (see the module comment).
    pub unacknowledged: AtomicU64,
    /// Batches committed in a transaction begun ahead, while the batch
    /// before them committed (Postgres; see [`LockAhead`]).
    pub locked_ahead: AtomicU64,
}

/// Told of each batch transaction the writer runs: its records and how long
/// it took, whether it committed or not.
pub type CommitObserver = Box<dyn Fn(usize, Duration) + Send + Sync>;

/// A handle to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditWriter {
    jobs: mpsc::Sender<Job>,
    store: AuditStore,
    stats: Arc<WriterStats>,
    /// The highest sequence number this writer committed (0 before any).
    committed: watch::Receiver<i64>,
}

/// Where the writer publishes what it committed.
#[derive(Debug)]
struct Published(watch::Sender<i64>);

impl Published {
    /// Every record up to `results`' highest seq is committed: say so.
    fn committed(&self, results: &[Appended]) {
        if let Some(seq) = results.iter().map(|a| a.stored().seq).max() {
            self.0.send_if_modified(|head| {
                let newer = seq > *head;
                if newer {
                    *head = seq;
                }
                newer
            });
        }
    }
}

impl AuditWriter {
    /// Start the writer, on its thread. It ends when every handle is
    /// dropped, after writing what is still queued; the task returned
    /// finishes then.
    pub fn start(store: AuditStore, observer: CommitObserver) -> (Self, tokio::task::JoinHandle<()>) {
        let (jobs, mut queue) = mpsc::channel::<Job>(MAX_BATCH * 16);
        let stats = Arc::new(WriterStats::default());
        let (published, committed) = watch::channel(0);
        let published = Published(published);
        let main_store = store.clone();
        let task_stats = stats.clone();
        let run = async move {
            let task_store = main_store.for_writer();
            let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
            let mut in_doubt: Vec<Vec<Appended>> = Vec::new();
            // Settling costs the batch that does it a read (at most
            // RESOLVE_WITHIN); while the database cannot tell, not more
            // often than this.
            let mut next_settle = tokio::time::Instant::now();
            // The next batch's transaction, begun while the last one
            // committed (Postgres; see `LockAhead`).
            let mut ahead: Option<LockAhead> = None;
            while let Some(first) = queue.recv().await {
                if !in_doubt.is_empty() && tokio::time::Instant::now() >= next_settle {
                    settle_in_doubt(&task_store, &mut in_doubt, &mut batch).await;
                    next_settle = tokio::time::Instant::now() + RESOLVE_WITHIN;
                }
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                // Only when nothing is in doubt: settling it reads under the
                // lock, which a lock taken ahead would hold.
                let settled = in_doubt.is_empty();
                let more_waiting = || settled && !queue.is_empty();
                let doubt = write(
                    &task_store,
                    &task_stats,
                    &published,
                    &observer,
                    &mut batch,
                    &mut ahead,
                    more_waiting,
                )
                .await;
                if let Some(doubt) = doubt {
                    in_doubt.push(doubt);
                }
            }
            drop(ahead);
            task_store.close_for_writer().await;
        };
        // A thread and a runtime of the writer's own: under load, a task on
        // the server's runtime waits behind every runnable request (each
        // verifying and signing) each time it is woken, once per statement
        // of a batch, and the batch's cycle is what paces issuance
        // (docs/evidence/performance.md). Its connections are its own too
        // (`AuditStore::for_writer`), so that their sockets are watched by
        // this runtime rather than by the busy one. A thread of its own, not
        // one of the runtime's blocking pool: named in profiles, and not
        // waited for when the server's runtime is dropped (as a task, it
        // would be cancelled there; the server waits for it to drain first).
        let (finished, done) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("audit-writer".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(runtime) => runtime.block_on(run),
                    Err(error) => tracing::error!(%error, "the audit writer could not start its runtime"),
                }
                let _ = finished.send(());
            });
        // Either way the queue's end is dropped when the writer cannot
        // run: every append is refused.
        if let Err(error) = thread {
            tracing::error!(%error, "the audit writer could not start its thread");
        }
        let task = tokio::spawn(async move {
            let _ = done.await;
        });
        let writer = Self {
            jobs,
            store,
            stats,
            committed,
        };
        (writer, task)
    }

    /// The highest sequence number this writer committed, updated after
    /// each commit (records other replicas commit are not seen here).
    pub fn committed(&self) -> watch::Receiver<i64> {
        self.committed.clone()
    }

    /// Append one record and wait until it is committed.
    pub async fn append(&self, append: Append) -> Result<Appended, AuditError> {
        let (respond, answer) = oneshot::channel();
        self.jobs
            .send(Job { append, respond })
            .await
            .map_err(|_| AuditError::Unavailable)?;
        answer.await.map_err(|_| AuditError::Unavailable)?
    }

    pub fn store(&self) -> &AuditStore {
        &self.store
    }

    /// Shared, so that metrics can read them at each scrape.
    pub fn stats(&self) -> &Arc<WriterStats> {
        &self.stats
    }
}

/// Write `batch` (in the transaction `ahead` holds for it, if any) and
/// answer its jobs; an unacknowledged commit that could not be resolved
/// comes back, to be settled later. `ahead` is left holding the next
/// batch's lock when this one committed and `more_waiting` said records
/// were waiting.
async fn write(
    store: &AuditStore,
    stats: &WriterStats,
    published: &Published,
    observer: &CommitObserver,
    batch: &mut Vec<Job>,
    ahead: &mut Option<LockAhead>,
    more_waiting: impl FnOnce() -> bool,
) -> Option<Vec<Appended>> {
    let appends: Vec<Append> = batch.iter().map(|job| job.append.clone()).collect();
    let started = tokio::time::Instant::now();
    let began_ahead = ahead.is_some();
    let (written, next) = store
        .append_batch_ahead(&appends, ahead.take(), more_waiting)
        .await;
    *ahead = next;
    observer(appends.len(), started.elapsed());
    match written {
        Ok(results) => {
            if began_ahead {
                stats.locked_ahead.fetch_add(1, Ordering::Relaxed);
            }
            published.committed(&results);
            answer_committed(stats, batch, results);
        }
        Err(StoreError::CommitUnacknowledged { reason, appended }) => {
            stats.unacknowledged.fetch_add(1, Ordering::Relaxed);
            match resolve(store, &appended).await {
                Some(true) => {
                    tracing::warn!(%reason, records = batch.len(),
                        "audit commit not acknowledged; read back: committed");
                    published.committed(&appended);
                    answer_committed(stats, batch, appended);
                }
                resolved => {
                    stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(%reason, records = batch.len(), committed = ?resolved,
                        "audit commit not acknowledged; the requests are refused with audit_unavailable");
                    for job in batch.drain(..) {
                        let _ = job.respond.send(Err(AuditError::Unavailable));
                    }
                    // Unknown: settled once the database answers again.
                    if resolved.is_none() {
                        return Some(appended);
                    }
                }
            }
        }
        Err(StoreError::Refused(reason)) => {
            // The database is there but refused something in this batch:
            // write record by record, so that a bad record fails alone.
            tracing::warn!(%reason, records = batch.len(), "audit batch refused; writing record by record");
            let alone = batch.len() == 1;
            for job in batch.drain(..) {
                let result = if alone {
                    record_refusal(store, stats, job.append, &reason).await
                } else {
                    write_one(store, stats, job.append).await
                };
                if let Ok(appended) = &result {
                    published.committed(std::slice::from_ref(appended));
                }
                let _ = job.respond.send(result);
            }
        }
        Err(error) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            log_failure(&error, batch.len());
            for job in batch.drain(..) {
                let _ = job.respond.send(Err(AuditError::Unavailable));
            }
        }
    }
    None
}

fn answer_committed(stats: &WriterStats, batch: &mut Vec<Job>, results: Vec<Appended>) {
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.records.fetch_add(results.len() as u64, Ordering::Relaxed);
    for (job, result) in batch.drain(..).zip(results) {
        let _ = job.respond.send(Ok(result));
    }
}

/// Whether an unacknowledged batch was committed: its last record is in
/// the chain at its place (a batch commits whole or not at all). `None`
/// when the database could not be asked within [`RESOLVE_WITHIN`].
async fn resolve(store: &AuditStore, appended: &[Appended]) -> Option<bool> {
    let last = appended.last()?.stored();
    let deadline = tokio::time::Instant::now() + RESOLVE_WITHIN;
    loop {
        let attempt = tokio::time::timeout_at(deadline, store.holds(last)).await;
        match attempt {
            Ok(Ok(held)) => return Some(held),
            Ok(Err(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return None,
        }
    }
}

/// For each in-doubt batch the database now answers for: when it was
/// committed, queue a `certificate.undelivered` record for each of its
/// certificates ahead of `batch`; either way it is settled. Batches the
/// database still cannot answer for stay in doubt.
async fn settle_in_doubt(store: &AuditStore, in_doubt: &mut Vec<Vec<Appended>>, batch: &mut Vec<Job>) {
    let mut still = Vec::new();
    for appended in in_doubt.drain(..) {
        let Some(last) = appended.last().map(Appended::stored) else {
            continue;
        };
        match tokio::time::timeout(RESOLVE_WITHIN, store.holds(last)).await {
            Ok(Ok(true)) => {
                for issued in appended.iter().filter_map(|a| match a {
                    Appended::Recorded(stored) => Some(stored),
                    _ => None,
                }) {
                    if issued.record.event == event::CERTIFICATE_ISSUED
                        || issued.record.event == event::BREAK_GLASS_ISSUED
                    {
                        tracing::warn!(seq = issued.seq, serial = ?issued.record.serial,
                            "an unacknowledged commit was committed; recording its certificate as undelivered");
                        // Nobody waits for this answer.
                        let (respond, _) = oneshot::channel();
                        batch.push(Job {
                            append: Append {
                                record: undelivered(issued, time::OffsetDateTime::now_utc()),
                                ..Default::default()
                            },
                            respond,
                        });
                    }
                }
            }
            Ok(Ok(false)) => {}
            Ok(Err(_)) | Err(_) => still.push(appended),
        }
    }
    *in_doubt = still;
}

/// The record saying that the certificate `issued` names never left.
fn undelivered(issued: &StoredRecord, now: time::OffsetDateTime) -> AuditRecord {
    let original = &issued.record;
    let mut record = AuditRecord::new(
        event::CERTIFICATE_UNDELIVERED,
        outcome::DENIED,
        &original.request_id,
        now,
    );
    record.reason_code = Some("audit_unavailable".into());
    record.cluster = original.cluster.clone();
    record.issuer = original.issuer.clone();
    record.tenant = original.tenant.clone();
    record.subject = original.subject.clone();
    record.username = original.username.clone();
    record.identity_verified = original.identity_verified;
    record.roles_granted = original.roles_granted.clone();
    record.serial = original.serial.clone();
    record.certificate_sha256 = original.certificate_sha256.clone();
    record.public_key_sha256 = original.public_key_sha256.clone();
    record.not_before = original.not_before;
    record.not_after = original.not_after;
    record.client_ip = original.client_ip.clone();
    record.details = serde_json::json!({
        "recorded_seq": issued.seq,
        "recorded_event": original.event,
        "reason": "the commit of the record was not acknowledged; the request was refused and the certificate never left the server",
    });
    record
}

/// One record on its own (also what a one-off command commits through, see
/// [`super::recorder`]).
pub(super) async fn write_one(
    store: &AuditStore,
    stats: &WriterStats,
    append: Append,
) -> Result<Appended, AuditError> {
    match store.append_batch(std::slice::from_ref(&append)).await {
        Ok(mut results) => {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats.records.fetch_add(1, Ordering::Relaxed);
            results.pop().ok_or(AuditError::Unavailable)
        }
        Err(StoreError::Refused(reason)) => record_refusal(store, stats, append, &reason).await,
        Err(error) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            log_failure(&error, 1);
            Err(AuditError::Unavailable)
        }
    }
}

/// A record the database refused is replaced by an `audit.record_refused`
/// record that keeps what the server itself wrote (time, request id, event,
/// outcome, reason, configured cluster) and who asked from where; when the
/// database refuses that too, the stand-in without the identity. The trail
/// still shows the decision. The request is refused either way: nothing is
/// issued on a record that was not kept.
async fn record_refusal(
    store: &AuditStore,
    stats: &WriterStats,
    append: Append,
    reason: &str,
) -> Result<Appended, AuditError> {
    stats.failures.fetch_add(1, Ordering::Relaxed);
    stats.refused.fetch_add(1, Ordering::Relaxed);
    tracing::error!(%reason, request_id = %append.record.request_id,
        "audit record refused by the database; recording the refusal instead, the request is refused");
    for with_identity in [true, false] {
        let fallback = Append {
            record: append.record.refused_by_store(reason, with_identity),
            ..Default::default()
        };
        match store.append_batch(&[fallback]).await {
            Ok(_) => break,
            Err(StoreError::Refused(_)) if with_identity => continue,
            Err(error) => {
                log_failure(&error, 1);
                break;
            }
        }
    }
    Err(AuditError::Unavailable)
}

fn log_failure(error: &StoreError, records: usize) {
    tracing::error!(%error, records, "audit write failed; the requests are refused with audit_unavailable");
}
