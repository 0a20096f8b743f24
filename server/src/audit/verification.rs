//! One verification of the whole chain at a time on a replica, whoever
//! asks (`GET /v1/audit/verify`, the console's chain page): it reads the
//! whole trail, a million records take most of a minute, and several at
//! once slow every issuance down. Those who ask while one runs wait for
//! its answer; the last answer is kept, with when it was found.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use talos_sso_api::ChainStatus;
use time::OffsetDateTime;

/// The chain verifications of one replica.
#[derive(Debug, Default)]
pub struct Verifications {
    /// The last verification that finished, and when.
    last: Mutex<Option<(OffsetDateTime, ChainStatus)>>,
    /// The verification running now, if one is.
    running: Mutex<Option<Verification>>,
    /// Verifications started since the server started.
    started: AtomicU64,
}

/// A verification under way: when it started, and its answer once there
/// is one (`Some(None)`: the store could not be read).
#[derive(Debug, Clone)]
pub struct Verification {
    pub started: OffsetDateTime,
    pub answer: tokio::sync::watch::Receiver<Option<Option<ChainStatus>>>,
}

impl Verification {
    /// Its answer, once it has one: `None` when the store could not be
    /// read (or the verification ended without an answer).
    pub async fn finished(&mut self) -> Option<ChainStatus> {
        match self.answer.wait_for(Option::is_some).await {
            Ok(answer) => answer.clone().flatten(),
            Err(_) => None,
        }
    }
}

impl Verifications {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Verifications started since the server started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// What the last verification that finished found: when the chain was
    /// broken, every console page says so.
    pub fn last_status(&self) -> Option<ChainStatus> {
        self.last().map(|(_, status)| status)
    }

    /// The last verification that finished, and when.
    pub fn last(&self) -> Option<(OffsetDateTime, ChainStatus)> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The running verification, started now with `verify` when none is
    /// (`verify` is dropped unused otherwise). `clock` says when it ends.
    pub fn start_or_join<F>(
        self: &Arc<Self>,
        now: OffsetDateTime,
        clock: impl Fn() -> OffsetDateTime + Send + 'static,
        verify: F,
    ) -> Verification
    where
        F: Future<Output = Option<ChainStatus>> + Send + 'static,
    {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(verification) = running.as_ref() {
            return verification.clone();
        }
        let (done, answer) = tokio::sync::watch::channel(None);
        let verification = Verification { started: now, answer };
        *running = Some(verification.clone());
        self.started.fetch_add(1, Ordering::Relaxed);
        let verifications = self.clone();
        tokio::spawn(async move {
            // However this task ends (a panic included), the next caller
            // may start a verification again.
            let running = NotRunning(verifications.clone());
            let status = verify.await;
            if let Some(status) = &status {
                *verifications.last.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((clock(), status.clone()));
            }
            drop(running);
            let _ = done.send(Some(status));
        });
        verification
    }
}

/// Clears [`Verifications::running`] when dropped.
struct NotRunning(Arc<Verifications>);

impl Drop for NotRunning {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn intact() -> ChainStatus {
        ChainStatus {
            intact: true,
            verified: 3,
            last_seq: 3,
            first_broken: None,
            checkpoints: None,
        }
    }

    #[tokio::test]
    async fn callers_while_one_runs_share_it_and_its_answer() {
        let verifications = Verifications::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let counted = runs.clone();
        let mut first =
            verifications.start_or_join(OffsetDateTime::UNIX_EPOCH, OffsetDateTime::now_utc, async move {
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = released.await;
                Some(intact())
            });
        let counted = runs.clone();
        let mut second =
            verifications.start_or_join(OffsetDateTime::now_utc(), OffsetDateTime::now_utc, async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Some(intact())
            });
        assert_eq!(
            second.started,
            OffsetDateTime::UNIX_EPOCH,
            "joined the running one"
        );
        let _ = release.send(());
        assert_eq!(first.finished().await, Some(intact()));
        assert_eq!(second.finished().await, Some(intact()));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(verifications.started(), 1);
        assert!(verifications.last().is_some());
    }

    #[tokio::test]
    async fn a_verification_that_panics_leaves_none_running() {
        let verifications = Verifications::new();
        let mut failed =
            verifications.start_or_join(OffsetDateTime::UNIX_EPOCH, OffsetDateTime::now_utc, async {
                panic!("the store reader failed badly");
            });
        assert_eq!(failed.finished().await, None);
        let mut next =
            verifications.start_or_join(OffsetDateTime::now_utc(), OffsetDateTime::now_utc, async {
                Some(intact())
            });
        let answer = tokio::time::timeout(Duration::from_secs(5), next.finished()).await;
        assert_eq!(answer.expect("a new one ran"), Some(intact()));
    }
}
