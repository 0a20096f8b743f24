//! The PKCS#11 module loaded in this process: initialized once per path,
//! re-initialized (a new epoch) when a token went away or appeared; the
//! token's slot found by label; and calls that wait on a token kept off the
//! async runtime's workers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::slot::Slot;

use super::{Pkcs11Error, Pkcs11Source};

/// A module loaded in this process. PKCS#11 initialization is per process,
/// so every key on one module shares it; re-initializing it (the only way
/// some modules, SoftHSM among them, see a token that came back or a new
/// one) waits until no key of any cluster is inside a call.
pub(super) struct Module {
    path: PathBuf,
    /// Readers are calls into the module; the writer re-initializes it.
    state: RwLock<ModuleState>,
}

pub(super) struct ModuleState {
    pub(super) pkcs11: Pkcs11,
    /// Counts initializations: sessions of an older one are dead handles.
    pub(super) epoch: u64,
}

/// The modules loaded in this process, by path.
static MODULES: Mutex<Vec<Arc<Module>>> = Mutex::new(Vec::new());

fn initialize(path: &Path) -> Result<Pkcs11, Pkcs11Error> {
    let failed = |reason: String| Pkcs11Error::Module {
        module: path.to_owned(),
        reason,
    };
    let pkcs11 = Pkcs11::new(path).map_err(|e| failed(e.to_string()))?;
    match pkcs11.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => Ok(pkcs11),
        Err(CkError::Pkcs11(rv, _)) => Err(failed(format!("C_Initialize: {rv:?}"))),
        Err(e) => Err(failed(format!("C_Initialize: {e}"))),
    }
}

/// The module at `path`, loaded and initialized on first use.
pub(super) fn module(path: &Path) -> Result<Arc<Module>, Pkcs11Error> {
    let mut modules = lock(&MODULES);
    if let Some(module) = modules.iter().find(|m| m.path == path) {
        return Ok(Arc::clone(module));
    }
    let module = Arc::new(Module {
        path: path.to_owned(),
        state: RwLock::new(ModuleState {
            pkcs11: initialize(path)?,
            epoch: 0,
        }),
    });
    modules.push(Arc::clone(&module));
    Ok(module)
}

impl Module {
    pub(super) fn read(&self) -> std::sync::RwLockReadGuard<'_, ModuleState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Finalize and initialize again, unless another caller already did
    /// since `seen`. Every session of the old epoch is dead afterwards.
    pub(super) fn reinitialize(&self, seen: u64) -> Result<(), Pkcs11Error> {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if state.epoch != seen {
            return Ok(());
        }
        if let Err(error) = state.pkcs11.clone().finalize() {
            tracing::debug!(%error, module = %self.path.display(), "C_Finalize");
        }
        state.epoch += 1;
        state.pkcs11 = initialize(&self.path)?;
        Ok(())
    }
}

pub(super) fn unavailable(source: &Pkcs11Source, operation: &'static str, error: &CkError) -> Pkcs11Error {
    let reason = match error {
        CkError::Pkcs11(rv, _) => format!("{rv:?}"),
        other => other.to_string(),
    };
    Pkcs11Error::Unavailable {
        token_label: source.token_label.clone(),
        operation,
        reason,
    }
}

/// The slot holding the token labelled `source.token_label`.
pub(super) fn find_token(pkcs11: &Pkcs11, source: &Pkcs11Source) -> Result<Slot, Pkcs11Error> {
    let slots = pkcs11
        .get_slots_with_token()
        .map_err(|e| unavailable(source, "C_GetSlotList", &e))?;
    let mut present = Vec::new();
    for slot in slots {
        let Ok(info) = pkcs11.get_token_info(slot) else {
            continue;
        };
        let label = info.label().trim_end().to_owned();
        if label == source.token_label {
            return Ok(slot);
        }
        present.push(format!("`{}`", talos_sso_text::clean(&label, 64)));
    }
    Err(Pkcs11Error::TokenUnknown {
        module: source.module.clone(),
        token_label: source.token_label.clone(),
        present: if present.is_empty() {
            "none".into()
        } else {
            present.join(", ")
        },
    })
}

/// Runs `call`, which may wait a while on a token, so that the other tasks
/// of the runtime it is called from go on meanwhile. On a worker of a
/// multi-thread runtime (the server's) `block_in_place` hands that worker's
/// queue to another thread for the wait: without it, a signature through a
/// network HSM would stop every connection scheduled on the same worker for
/// its round trip, and as many signatures at once as there are workers
/// would stop the server. Anywhere else it simply runs: a current-thread
/// runtime (a test's), where `block_in_place` would panic, a blocking-pool
/// thread (the `/readyz` probe), or outside any runtime. (It would still
/// panic inside a `LocalSet` on a multi-thread runtime; the server runs
/// none.)
pub(super) fn waiting_off_the_workers<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(call)
        }
        _ => call(),
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait inside a signature must not stop the other tasks of a
    /// multi-thread runtime. With one worker, the task that signs wakes
    /// another task and then waits for it to answer: only if the worker's
    /// queue went to another thread for the wait can the answer come.
    /// Without `block_in_place` the wait times out (and, were it not
    /// bounded, would never end).
    #[test]
    fn a_wait_on_the_token_lets_the_runtimes_other_tasks_run() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let answered = runtime.block_on(async {
            tokio::spawn(async {
                let (wake, woken) = tokio::sync::oneshot::channel::<()>();
                let (answer, answers) = std::sync::mpsc::channel::<()>();
                tokio::spawn(async move {
                    if woken.await.is_ok() {
                        let _ = answer.send(());
                    }
                });
                // Only now can the other task run: it waits for this.
                let _ = wake.send(());
                waiting_off_the_workers(|| answers.recv_timeout(std::time::Duration::from_secs(10)))
            })
            .await
            .unwrap()
        });
        assert_eq!(answered, Ok(()), "the other task never ran during the wait");
    }

    /// Where `block_in_place` would panic (a current-thread runtime) or has
    /// nothing to do (no runtime, a blocking-pool thread), the call runs.
    #[test]
    fn a_wait_on_the_token_runs_on_any_thread() {
        assert_eq!(waiting_off_the_workers(|| 1), 1);
        let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
        assert_eq!(current.block_on(async { waiting_off_the_workers(|| 2) }), 2);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let on_blocking_thread = multi.block_on(async {
            tokio::task::spawn_blocking(|| waiting_off_the_workers(|| 3))
                .await
                .unwrap()
        });
        assert_eq!(on_blocking_thread, 3);
    }
}
