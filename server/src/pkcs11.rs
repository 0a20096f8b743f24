//! A CA key that never leaves a hardware security module: signing through a
//! PKCS#11 module (a YubiHSM 2, a cloud or network HSM, SoftHSM for tests).
//!
//! [`Pkcs11Key`] holds the module, the token's slot and a small pool of
//! logged-in sessions, so that concurrent issuances each sign on their own
//! session instead of queueing behind one. PKCS#11 keeps the login state per
//! token and application: the first session logs in and every later one
//! shares that state (`CKR_USER_ALREADY_LOGGED_IN` is expected, not an
//! error). A failed signature closes the pool, re-initializes the module
//! (some modules, SoftHSM among them, see a token that came back only
//! then) and tries once more; while the token stays away every signature
//! (an issuance, or the `/readyz` probe) tries again, so the server
//! recovers by itself when the HSM comes back. PKCS#11 initialization is
//! per process, so keys on one module share one [`Module`], and
//! re-initializing waits until none of them is inside a call. A
//! signature that cannot be made is [`Pkcs11Error`], which issuance answers
//! with `signing_unavailable` and never records as issued.
//!
//! The PIN is read from a file with the permission rules of a key file and
//! kept only as a `secrecy` string. This module knows nothing about HTTP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use der::asn1::UintRef;
use der::{Decode, Encode};
use spki::SubjectPublicKeyInfoOwned;

use crate::x509::{KeyKind, oid};

/// Idle sessions kept open, and issuances signing with one key at once
/// ([`Pkcs11Key::turn_to_sign`]).
const POOL_SIZE: usize = 8;

/// Where the key is: configuration data (`config`).
pub use crate::config::Pkcs11Source;

/// Why the token could not sign (or be opened). Each names the token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Pkcs11Error {
    #[error("cannot load the PKCS#11 module {module}: {reason}")]
    Module { module: PathBuf, reason: String },
    #[error("no PKCS#11 token labelled `{token_label}` in {module} (tokens present: {present})")]
    TokenUnknown {
        module: PathBuf,
        token_label: String,
        present: String,
    },
    #[error(
        "the PIN in {pin_file} is incorrect for PKCS#11 token `{token_label}` (CKR_PIN_INCORRECT); \
         repeated attempts may lock the token"
    )]
    PinIncorrect { token_label: String, pin_file: PathBuf },
    #[error(
        "the user PIN of PKCS#11 token `{token_label}` is locked (CKR_PIN_LOCKED); unlock it with the SO PIN"
    )]
    PinLocked { token_label: String },
    #[error("PKCS#11 token `{token_label}` has no private key labelled `{key_label}`")]
    KeyUnknown { token_label: String, key_label: String },
    #[error("PKCS#11 token `{token_label}` already holds a key labelled `{key_label}`; choose another label")]
    KeyExists { token_label: String, key_label: String },
    #[error(
        "PKCS#11 token `{token_label}`, key `{key_label}`: the key is a {found} key, the certificate's is {expected}"
    )]
    KeyTypeMismatch {
        token_label: String,
        key_label: String,
        found: String,
        expected: KeyKind,
    },
    #[error("the certificate's {0} key cannot sign through PKCS#11 here; use Ed25519 or ECDSA P-256")]
    UnsupportedKeyType(KeyKind),
    #[error("PKCS#11 token `{token_label}` is unavailable ({operation}: {reason})")]
    Unavailable {
        token_label: String,
        operation: &'static str,
        reason: String,
    },
}

impl Pkcs11Error {
    pub fn code(&self) -> &'static str {
        match self {
            Pkcs11Error::Module { .. } => "ca_pkcs11_module",
            Pkcs11Error::TokenUnknown { .. } => "ca_pkcs11_token_unknown",
            Pkcs11Error::KeyExists { .. } => "ca_pkcs11_key_exists",
            Pkcs11Error::PinIncorrect { .. } => "ca_pkcs11_pin_incorrect",
            Pkcs11Error::PinLocked { .. } => "ca_pkcs11_pin_locked",
            Pkcs11Error::KeyUnknown { .. } => "ca_pkcs11_key_unknown",
            Pkcs11Error::KeyTypeMismatch { .. } => "ca_key_mismatch",
            Pkcs11Error::UnsupportedKeyType(_) => "ca_key_type_unsupported",
            Pkcs11Error::Unavailable { .. } => "ca_pkcs11_unavailable",
        }
    }
}

/// The signature mechanisms used, from the certificate's key type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    /// CKM_EDDSA over the message itself (PureEdDSA).
    Ed25519,
    /// CKM_ECDSA over the SHA-256 digest; the token's r||s becomes DER.
    EcdsaP256,
}

/// The token as found: what `ca inspect` and `check` report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFacts {
    pub token_label: String,
    pub manufacturer: String,
    pub model: String,
    pub serial: String,
    pub slot: u64,
    pub key_label: String,
}

impl std::fmt::Display for TokenFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PKCS#11 token `{}` (slot {}, {} {}, serial {}), key `{}`",
            self.token_label, self.slot, self.manufacturer, self.model, self.serial, self.key_label
        )
    }
}

/// A module loaded in this process. PKCS#11 initialization is per process,
/// so every key on one module shares it; re-initializing it (the only way
/// some modules, SoftHSM among them, see a token that came back or a new
/// one) waits until no key of any cluster is inside a call.
struct Module {
    path: PathBuf,
    /// Readers are calls into the module; the writer re-initializes it.
    state: RwLock<ModuleState>,
}

struct ModuleState {
    pkcs11: Pkcs11,
    /// Counts initializations: sessions of an older one are dead handles.
    epoch: u64,
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
fn module(path: &Path) -> Result<Arc<Module>, Pkcs11Error> {
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
    fn read(&self) -> std::sync::RwLockReadGuard<'_, ModuleState> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Finalize and initialize again, unless another caller already did
    /// since `seen`. Every session of the old epoch is dead afterwards.
    fn reinitialize(&self, seen: u64) -> Result<(), Pkcs11Error> {
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

/// The token's slot in one epoch of the module, and its idle sessions.
struct Connection {
    slot: Slot,
    epoch: u64,
    idle: Mutex<Vec<PooledSession>>,
}

/// A logged-in session and the key's handle in it. Sessions are opened
/// without close-on-drop: one of a finalized epoch must never be closed,
/// as its handle may since name another key's session.
struct PooledSession {
    session: Session,
    key: ObjectHandle,
}

impl PooledSession {
    /// Close it; only while the module is in the epoch that opened it.
    fn close(self) {
        if let Err(error) = self.session.close() {
            tracing::debug!(%error, "C_CloseSession");
        }
    }
}

/// A CA private key inside a PKCS#11 token.
pub struct Pkcs11Key {
    source: Pkcs11Source,
    pin: AuthPin,
    algorithm: Algorithm,
    /// The certificate's public key: the token's key must match it.
    public_key: SubjectPublicKeyInfoOwned,
    module: Arc<Module>,
    /// `None` after a failure, until the next signature finds the token.
    connection: RwLock<Option<Connection>>,
    facts: TokenFacts,
    /// Turns to sign: [`POOL_SIZE`] of them.
    turns: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Pkcs11Key {
    // The PIN never appears, not even in a Debug dump.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pkcs11Key({})", self.source.describe())
    }
}

impl Pkcs11Key {
    /// Open the token, log in and find the key; the caller then proves with a
    /// probe signature that it belongs to the certificate.
    pub fn open(
        source: &Pkcs11Source,
        pin: AuthPin,
        certificate_key: &SubjectPublicKeyInfoOwned,
    ) -> Result<Self, Pkcs11Error> {
        let algorithm = match crate::x509::key_kind(certificate_key) {
            KeyKind::Ed25519 => Algorithm::Ed25519,
            KeyKind::EcdsaP256 => Algorithm::EcdsaP256,
            other => return Err(Pkcs11Error::UnsupportedKeyType(other)),
        };
        let mut key = Self {
            source: source.clone(),
            pin,
            algorithm,
            public_key: certificate_key.clone(),
            module: module(&source.module)?,
            connection: RwLock::new(None),
            turns: tokio::sync::Semaphore::new(POOL_SIZE),
            facts: TokenFacts {
                token_label: source.token_label.clone(),
                manufacturer: String::new(),
                model: String::new(),
                serial: String::new(),
                slot: 0,
                key_label: source.key_label.clone(),
            },
        };
        let module = Arc::clone(&key.module);
        let mut state = module.read();
        let mut found = key.connect(&state);
        if let Err(Pkcs11Error::TokenUnknown { .. }) = found {
            // A token made since the module was initialized in this process.
            let seen = state.epoch;
            drop(state);
            module.reinitialize(seen)?;
            state = module.read();
            found = key.connect(&state);
        }
        let connection = found?;
        let session = key.new_session(&state, &connection)?;
        let checked = key.check_key_type(&session);
        let info = state.pkcs11.get_token_info(connection.slot);
        lock(&connection.idle).push(session);
        checked?;
        let info = info.map_err(|e| key.unavailable("C_GetTokenInfo", &e))?;
        key.facts.manufacturer = info.manufacturer_id().trim().to_owned();
        key.facts.model = info.model().trim().to_owned();
        key.facts.serial = info.serial_number().trim().to_owned();
        key.facts.slot = connection.slot.id();
        *key.connection.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(connection);
        drop(state);
        Ok(key)
    }

    pub fn kind(&self) -> KeyKind {
        match self.algorithm {
            Algorithm::Ed25519 => KeyKind::Ed25519,
            Algorithm::EcdsaP256 => KeyKind::EcdsaP256,
        }
    }

    pub fn public_key_info(&self) -> &SubjectPublicKeyInfoOwned {
        &self.public_key
    }

    pub fn facts(&self) -> &TokenFacts {
        &self.facts
    }

    /// Wait, without holding a thread, for a turn to sign: at most
    /// [`POOL_SIZE`] issuances sign with this key at once, each on a pooled
    /// session, and the rest wait here. Without the bound every request in
    /// flight could be inside the token at once, each opening a session of
    /// its own: past the HSM's session limit `C_OpenSession` fails, which
    /// reads as a lost token and re-initializes the module under every
    /// signature in progress; and each waiting signature would hold a
    /// thread of the runtime's blocking pool ([`waiting_off_the_workers`]).
    /// The `/readyz` probe and checkpoints sign without a turn: one at a
    /// time each, and rarely.
    pub async fn turn_to_sign(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // The semaphore is never closed: `None` cannot happen.
        self.turns.acquire().await.ok()
    }

    /// Sign `message` as X.509 wants it: Ed25519 raw, ECDSA as a DER
    /// `Ecdsa-Sig-Value`. A failure re-initializes the module and tries
    /// once more (the token came back, or a session was lost). The calls
    /// wait on the token (a network HSM's round trip, a USB device) without
    /// holding up the runtime's other tasks: [`waiting_off_the_workers`].
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Pkcs11Error> {
        waiting_off_the_workers(|| self.sign_here(message))
    }

    fn sign_here(&self, message: &[u8]) -> Result<Vec<u8>, Pkcs11Error> {
        let digest;
        let (mechanism, data) = match self.algorithm {
            Algorithm::Ed25519 => (
                Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure)),
                message,
            ),
            Algorithm::EcdsaP256 => {
                digest = ring::digest::digest(&ring::digest::SHA256, message);
                (Mechanism::Ecdsa, digest.as_ref())
            }
        };
        let outcome = match self.attempt(&mechanism, data) {
            Ok(signature) => Ok(signature),
            Err((error, epoch)) => {
                tracing::warn!(token = %self.source.token_label, %error,
                    "PKCS#11 signing failed; re-initializing the module and trying again");
                self.module
                    .reinitialize(epoch)
                    .and_then(|()| self.attempt(&mechanism, data).map_err(|(error, _)| error))
            }
        };
        let raw = outcome?;
        match self.algorithm {
            Algorithm::Ed25519 => Ok(raw),
            Algorithm::EcdsaP256 => ecdsa_der(&raw).ok_or_else(|| Pkcs11Error::Unavailable {
                token_label: self.source.token_label.clone(),
                operation: "C_Sign",
                reason: format!("the token returned a {}-byte ECDSA signature, not 64", raw.len()),
            }),
        }
    }

    /// One signature in the module's current epoch, on a pooled session
    /// (or a new one, after finding the token again when the epoch moved).
    /// The error comes with the epoch it happened in.
    fn attempt(&self, mechanism: &Mechanism<'_>, data: &[u8]) -> Result<Vec<u8>, (Pkcs11Error, u64)> {
        let state = self.module.read();
        let epoch = state.epoch;
        let fail = |error| (error, epoch);
        {
            let current = self.connection.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(connection) = current.as_ref().filter(|c| c.epoch == epoch) {
                return self.sign_on(&state, connection, mechanism, data).map_err(fail);
            }
        }
        let mut current = self.connection.write().unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().is_none_or(|c| c.epoch != epoch) {
            // Sessions of an older epoch are dead handles: forget them.
            *current = None;
            *current = Some(self.connect(&state).map_err(fail)?);
        }
        let connection = current.as_ref().ok_or_else(|| fail(self.gone()))?;
        self.sign_on(&state, connection, mechanism, data).map_err(fail)
    }

    fn sign_on(
        &self,
        state: &ModuleState,
        connection: &Connection,
        mechanism: &Mechanism<'_>,
        data: &[u8],
    ) -> Result<Vec<u8>, Pkcs11Error> {
        let pooled = lock(&connection.idle).pop();
        let pooled = match pooled {
            Some(pooled) => pooled,
            None => self.new_session(state, connection)?,
        };
        let signature = match pooled.session.sign(mechanism, pooled.key, data) {
            Ok(signature) => signature,
            Err(error) => {
                pooled.close();
                // The others are likely as dead: open fresh ones next time.
                for stale in lock(&connection.idle).drain(..) {
                    stale.close();
                }
                return Err(self.unavailable("C_Sign", &error));
            }
        };
        let mut idle = lock(&connection.idle);
        if idle.len() < POOL_SIZE {
            idle.push(pooled);
        } else {
            drop(idle);
            pooled.close();
        }
        Ok(signature)
    }

    /// Find the token's slot in the module's current epoch.
    fn connect(&self, state: &ModuleState) -> Result<Connection, Pkcs11Error> {
        let slot = find_token(&state.pkcs11, &self.source)?;
        Ok(Connection {
            slot,
            epoch: state.epoch,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Open a session, log it in (once per token and application; later
    /// sessions share the state) and find the private key.
    fn new_session(
        &self,
        state: &ModuleState,
        connection: &Connection,
    ) -> Result<PooledSession, Pkcs11Error> {
        let session = state
            .pkcs11
            .open_ro_session_no_drop(connection.slot)
            .map_err(|e| self.unavailable("C_OpenSession", &e))?;
        let found = self.log_in_and_find(&session);
        match found {
            Ok(key) => Ok(PooledSession { session, key }),
            Err(error) => {
                if let Err(close) = session.close() {
                    tracing::debug!(error = %close, "C_CloseSession");
                }
                Err(error)
            }
        }
    }

    fn log_in_and_find(&self, session: &Session) -> Result<ObjectHandle, Pkcs11Error> {
        match session.login(UserType::User, Some(&self.pin)) {
            Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
            Err(CkError::Pkcs11(RvError::PinIncorrect, _)) => {
                return Err(Pkcs11Error::PinIncorrect {
                    token_label: self.source.token_label.clone(),
                    pin_file: self.source.pin_file.clone(),
                });
            }
            Err(CkError::Pkcs11(RvError::PinLocked, _)) => {
                return Err(Pkcs11Error::PinLocked {
                    token_label: self.source.token_label.clone(),
                });
            }
            Err(e) => return Err(self.unavailable("C_Login", &e)),
        }
        let template = [
            Attribute::Class(ObjectClass::PRIVATE_KEY),
            Attribute::Label(self.source.key_label.as_bytes().to_vec()),
        ];
        let found = session
            .find_objects(&template)
            .map_err(|e| self.unavailable("C_FindObjects", &e))?;
        found.first().copied().ok_or_else(|| Pkcs11Error::KeyUnknown {
            token_label: self.source.token_label.clone(),
            key_label: self.source.key_label.clone(),
        })
    }

    /// The token's key type must be the certificate's (a mismatch of curves
    /// is then caught by the probe signature).
    fn check_key_type(&self, pooled: &PooledSession) -> Result<(), Pkcs11Error> {
        let attributes = pooled
            .session
            .get_attributes(pooled.key, &[AttributeType::KeyType])
            .map_err(|e| self.unavailable("C_GetAttributeValue", &e))?;
        let found = attributes.iter().find_map(|a| match a {
            Attribute::KeyType(t) => Some(*t),
            _ => None,
        });
        let expected = match self.algorithm {
            Algorithm::Ed25519 => KeyType::EC_EDWARDS,
            Algorithm::EcdsaP256 => KeyType::EC,
        };
        match found {
            Some(t) if t == expected => Ok(()),
            other => Err(Pkcs11Error::KeyTypeMismatch {
                token_label: self.source.token_label.clone(),
                key_label: self.source.key_label.clone(),
                found: other.map_or_else(|| "unknown".into(), |t| t.to_string()),
                expected: self.kind(),
            }),
        }
    }

    fn unavailable(&self, operation: &'static str, error: &CkError) -> Pkcs11Error {
        unavailable(&self.source, operation, error)
    }

    fn gone(&self) -> Pkcs11Error {
        Pkcs11Error::Unavailable {
            token_label: self.source.token_label.clone(),
            operation: "C_OpenSession",
            reason: "no connection".into(),
        }
    }
}

impl Drop for Pkcs11Key {
    /// Closes the pooled sessions: calls into the module, which may wait
    /// on the token (and on a re-initialization in progress), so off the
    /// workers as a signature is; a key replaced by a reload is dropped
    /// wherever the last request that used it ends.
    fn drop(&mut self) {
        let connection = self
            .connection
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let module = &self.module;
        waiting_off_the_workers(|| {
            let state = module.read();
            if let Some(connection) = connection.filter(|c| c.epoch == state.epoch) {
                for pooled in lock(&connection.idle).drain(..) {
                    pooled.close();
                }
            }
        });
    }
}

fn unavailable(source: &Pkcs11Source, operation: &'static str, error: &CkError) -> Pkcs11Error {
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
fn find_token(pkcs11: &Pkcs11, source: &Pkcs11Source) -> Result<Slot, Pkcs11Error> {
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
        present.push(format!("`{}`", crate::audit::text::clean(&label, 64)));
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
fn waiting_off_the_workers<T>(call: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(call)
        }
        _ => call(),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// PKCS#11 returns ECDSA signatures as r||s; X.509 wants
/// `Ecdsa-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }`.
fn ecdsa_der(raw: &[u8]) -> Option<Vec<u8>> {
    #[derive(der::Sequence)]
    struct EcdsaSigValue<'a> {
        r: UintRef<'a>,
        s: UintRef<'a>,
    }
    if raw.len() != 64 {
        return None;
    }
    let (r, s) = raw.split_at(32);
    EcdsaSigValue {
        r: UintRef::new(r).ok()?,
        s: UintRef::new(s).ok()?,
    }
    .to_der()
    .ok()
}

/// The public key of `key_label` on the token, as a SubjectPublicKeyInfo:
/// what an offline root signs into the certificate of a key made inside the
/// token. Read from the public key object of the same label; no login.
pub fn token_public_key(source: &Pkcs11Source) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    let module = module(&source.module)?;
    let mut state = module.read();
    let mut slot = find_token(&state.pkcs11, source);
    if let Err(Pkcs11Error::TokenUnknown { .. }) = slot {
        let seen = state.epoch;
        drop(state);
        module.reinitialize(seen)?;
        state = module.read();
        slot = find_token(&state.pkcs11, source);
    }
    let session = state
        .pkcs11
        .open_ro_session_no_drop(slot?)
        .map_err(|e| unavailable(source, "C_OpenSession", &e))?;
    let read = read_public_key(&session, source);
    if let Err(error) = session.close() {
        tracing::debug!(%error, "C_CloseSession");
    }
    read
}

/// Make a key pair of `kind` inside the token, labelled `source.key_label`
/// (the private key sensitive and not extractable: it never leaves the
/// token), and return its public key. Refused when the label is taken.
pub fn generate_key_pair(
    source: &Pkcs11Source,
    pin: &AuthPin,
    kind: KeyKind,
) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    // The curve as CKA_EC_PARAMS: the DER of its OID (RFC 8410, SEC 2).
    let (mechanism, curve): (Mechanism, &[u8]) = match kind {
        KeyKind::Ed25519 => (Mechanism::EccEdwardsKeyPairGen, &[0x06, 0x03, 0x2b, 0x65, 0x70]),
        KeyKind::EcdsaP256 => (
            Mechanism::EccKeyPairGen,
            &[0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07],
        ),
        other => return Err(Pkcs11Error::UnsupportedKeyType(other)),
    };
    let module = module(&source.module)?;
    let state = module.read();
    let slot = find_token(&state.pkcs11, source)?;
    let session = state
        .pkcs11
        .open_rw_session(slot)
        .map_err(|e| unavailable(source, "C_OpenSession", &e))?;
    match session.login(UserType::User, Some(pin)) {
        Ok(()) | Err(CkError::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
        Err(CkError::Pkcs11(RvError::PinIncorrect, _)) => {
            return Err(Pkcs11Error::PinIncorrect {
                token_label: source.token_label.clone(),
                pin_file: source.pin_file.clone(),
            });
        }
        Err(e) => return Err(unavailable(source, "C_Login", &e)),
    }
    let label = source.key_label.as_bytes().to_vec();
    let taken = session
        .find_objects(&[Attribute::Label(label.clone())])
        .map_err(|e| unavailable(source, "C_FindObjects", &e))?;
    if !taken.is_empty() {
        return Err(Pkcs11Error::KeyExists {
            token_label: source.token_label.clone(),
            key_label: source.key_label.clone(),
        });
    }
    let public = [
        Attribute::Token(true),
        Attribute::Verify(true),
        Attribute::EcParams(curve.to_vec()),
        Attribute::Label(label.clone()),
    ];
    let private = [
        Attribute::Token(true),
        Attribute::Private(true),
        Attribute::Sensitive(true),
        Attribute::Extractable(false),
        Attribute::Sign(true),
        Attribute::Label(label),
    ];
    session
        .generate_key_pair(&mechanism, &public, &private)
        .map_err(|e| unavailable(source, "C_GenerateKeyPair", &e))?;
    read_public_key(&session, source)
}

fn read_public_key(
    session: &Session,
    source: &Pkcs11Source,
) -> Result<SubjectPublicKeyInfoOwned, Pkcs11Error> {
    let template = [
        Attribute::Class(ObjectClass::PUBLIC_KEY),
        Attribute::Label(source.key_label.as_bytes().to_vec()),
    ];
    let key = *session
        .find_objects(&template)
        .map_err(|e| unavailable(source, "C_FindObjects", &e))?
        .first()
        .ok_or_else(|| Pkcs11Error::KeyUnknown {
            token_label: source.token_label.clone(),
            key_label: source.key_label.clone(),
        })?;
    let attributes = session
        .get_attributes(key, &[AttributeType::KeyType, AttributeType::EcPoint])
        .map_err(|e| unavailable(source, "C_GetAttributeValue", &e))?;
    let mut key_type = None;
    let mut point = None;
    for attribute in attributes {
        match attribute {
            Attribute::KeyType(t) => key_type = Some(t),
            Attribute::EcPoint(p) => point = Some(unwrap_octet_string(&p)),
            _ => {}
        }
    }
    let point = point.ok_or_else(|| Pkcs11Error::KeyUnknown {
        token_label: source.token_label.clone(),
        key_label: source.key_label.clone(),
    })?;
    let algorithm = match key_type {
        Some(t) if t == KeyType::EC_EDWARDS && point.len() == 32 => spki::AlgorithmIdentifierOwned {
            oid: oid::ED25519,
            parameters: None,
        },
        Some(t) if t == KeyType::EC && point.len() == 65 => spki::AlgorithmIdentifierOwned {
            oid: oid::EC_PUBLIC_KEY,
            parameters: Some(
                der::asn1::Any::encode_from(&oid::SECP256R1).map_err(|e| unavailable_der(source, &e))?,
            ),
        },
        _ => {
            return Err(Pkcs11Error::UnsupportedKeyType(KeyKind::Other(
                "this token key".into(),
            )));
        }
    };
    Ok(SubjectPublicKeyInfoOwned {
        algorithm,
        subject_public_key: der::asn1::BitString::from_bytes(&point)
            .map_err(|e| unavailable_der(source, &e))?,
    })
}

fn unavailable_der(source: &Pkcs11Source, error: &der::Error) -> Pkcs11Error {
    Pkcs11Error::Unavailable {
        token_label: source.token_label.clone(),
        operation: "C_GetAttributeValue",
        reason: error.to_string(),
    }
}

/// `CKA_EC_POINT` is a DER OCTET STRING by the standard; some modules give
/// the bare point. Accept both.
fn unwrap_octet_string(value: &[u8]) -> Vec<u8> {
    match der::asn1::OctetString::from_der(value) {
        Ok(inner) => inner.as_bytes().to_vec(),
        Err(_) => value.to_vec(),
    }
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

    #[test]
    fn an_ecdsa_signature_from_the_token_becomes_der_that_ring_verifies() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let fixed = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        use ring::signature::KeyPair;
        // Many signatures, so that r or s with a high bit (or a leading zero) occurs.
        for _ in 0..64 {
            let raw = fixed.sign(&rng, b"tbs").unwrap();
            let der = ecdsa_der(raw.as_ref()).unwrap();
            ring::signature::UnparsedPublicKey::new(
                &ring::signature::ECDSA_P256_SHA256_ASN1,
                fixed.public_key().as_ref(),
            )
            .verify(b"tbs", &der)
            .unwrap();
        }
        assert_eq!(ecdsa_der(&[0; 63]), None);
    }

    #[test]
    fn an_ec_point_is_read_wrapped_or_bare() {
        let point = [4u8; 65];
        let wrapped = der::asn1::OctetString::new(point.to_vec())
            .unwrap()
            .to_der()
            .unwrap();
        assert_eq!(unwrap_octet_string(&wrapped), point.to_vec());
        assert_eq!(unwrap_octet_string(&point), point.to_vec());
    }
}
