//! Where a decision is committed: the group-commit writer in the running
//! server, the store itself for one-off commands (`break-glass`). Both answer
//! only once the record is durable, so whatever they return may be acted on.

use std::future::Future;

use super::store::{Append, Appended, AuditStore};
use super::writer::{AuditError, AuditWriter, WriterStats, write_one};

/// Commits one record (with its token claim, deny-list check and change).
pub trait Recorder: Sync {
    fn append(&self, append: Append) -> impl Future<Output = Result<Appended, AuditError>> + Send;
}

impl Recorder for AuditWriter {
    async fn append(&self, append: Append) -> Result<Appended, AuditError> {
        AuditWriter::append(self, append).await
    }
}

/// As the writer writes a record on its own: one the database refuses
/// leaves its `audit.record_refused` stand-in.
impl Recorder for AuditStore {
    async fn append(&self, append: Append) -> Result<Appended, AuditError> {
        write_one(self, &WriterStats::default(), append).await
    }
}
