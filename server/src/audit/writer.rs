//! Group commit: requests hand their record to one writer task and wait for
//! its answer; the writer takes everything that queued up while the previous
//! transaction was committing and writes it in one transaction. Each request
//! is answered only after the commit that holds its record, so the promise
//! "no certificate before its audit record is durable" is kept, without one
//! fsync per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

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

    pub fn stats(&self) -> &WriterStats {
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
        Err(error) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            log_failure(&error, batch.len());
            for job in batch.drain(..) {
                let _ = job.respond.send(Err(AuditError::Unavailable));
            }
        }
    }
}

fn log_failure(error: &StoreError, records: usize) {
    tracing::error!(%error, records, "audit write failed; the requests are refused with audit_unavailable");
}
