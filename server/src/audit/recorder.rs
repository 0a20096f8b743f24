//! Where a decision is committed: the group-commit writer in the running
//! server, the store itself for one-off commands (`break-glass`). Both answer
//! only once the record is durable, so whatever they return may be acted on.

use std::future::Future;

use super::store::{Append, Appended, AuditStore};
use super::writer::{AuditError, AuditWriter};

/// Commits one record (with its token claim, deny-list check and change).
pub trait Recorder: Sync {
    fn append(&self, append: Append) -> impl Future<Output = Result<Appended, AuditError>> + Send;
}

impl Recorder for AuditWriter {
    async fn append(&self, append: Append) -> Result<Appended, AuditError> {
        AuditWriter::append(self, append).await
    }
}

impl Recorder for AuditStore {
    async fn append(&self, append: Append) -> Result<Appended, AuditError> {
        match self.append_batch(std::slice::from_ref(&append)).await {
            Ok(mut appended) => appended.pop().ok_or(AuditError::Unavailable),
            Err(error) => {
                tracing::error!(%error, "the audit record could not be written");
                Err(AuditError::Unavailable)
            }
        }
    }
}
