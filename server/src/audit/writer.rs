//! Group commit: requests hand their record to one writer task and wait for
//! its answer; the writer takes everything that queued up while the previous
//! transaction was committing and writes it in one transaction. Each request
//! is answered only after the commit that holds its record, so the promise
//! "no certificate before its audit record is durable" is kept, without one
//! fsync per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::RecordExt;
use super::store::{Append, Appended, AuditStore, StoreError};

/// Most records in one transaction.
pub const MAX_BATCH: usize = 256;

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
}

/// A handle to the writer task; cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditWriter {
    jobs: mpsc::Sender<Job>,
    store: AuditStore,
    stats: Arc<WriterStats>,
}

impl AuditWriter {
    /// Start the writer task. It ends when every handle is dropped, after
    /// writing what is still queued.
    pub fn start(store: AuditStore) -> (Self, tokio::task::JoinHandle<()>) {
        let (jobs, mut queue) = mpsc::channel::<Job>(MAX_BATCH * 16);
        let stats = Arc::new(WriterStats::default());
        let task_store = store.clone();
        let task_stats = stats.clone();
        let task = tokio::spawn(async move {
            let mut batch: Vec<Job> = Vec::with_capacity(MAX_BATCH);
            while let Some(first) = queue.recv().await {
                batch.push(first);
                while batch.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                write(&task_store, &task_stats, &mut batch).await;
            }
        });
        (Self { jobs, store, stats }, task)
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

async fn write(store: &AuditStore, stats: &WriterStats, batch: &mut Vec<Job>) {
    let appends: Vec<Append> = batch.iter().map(|job| job.append.clone()).collect();
    match store.append_batch(&appends).await {
        Ok(results) => {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats.records.fetch_add(results.len() as u64, Ordering::Relaxed);
            for (job, result) in batch.drain(..).zip(results) {
                let _ = job.respond.send(Ok(result));
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
