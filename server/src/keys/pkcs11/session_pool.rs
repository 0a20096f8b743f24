//! [`Pkcs11Key`]: a private key on a token, signing on a pool of logged-in
//! sessions that is dropped and reopened when the module's epoch moves on,
//! with a bound on the signatures in flight.

use std::sync::{Arc, Mutex, PoisonError, RwLock};

use cryptoki::error::{Error as CkError, RvError};
use cryptoki::mechanism::Mechanism;
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use cryptoki::slot::Slot;
use cryptoki::types::AuthPin;
use spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};

use super::module::{Module, ModuleState, find_token, lock, module, unavailable, waiting_off_the_workers};
use super::signature::ecdsa_der;
use super::{Pkcs11Error, Pkcs11Source, TokenFacts};
use crate::keys::{KeyKind, KeyUnavailable, SignError, Signer, key_kind};

/// Idle sessions kept open, and issuances signing with one key at once
/// ([`Signer::turns`]).
const POOL_SIZE: usize = 8;

/// The signature mechanisms used, from the certificate's key type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    /// CKM_EDDSA over the message itself (PureEdDSA).
    Ed25519,
    /// CKM_ECDSA over the SHA-256 digest; the token's r||s becomes DER.
    EcdsaP256,
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

/// A private key inside a PKCS#11 token (a CA's, or the audit key).
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
        pin: &str,
        certificate_key: &SubjectPublicKeyInfoOwned,
    ) -> Result<Self, Pkcs11Error> {
        let algorithm = match key_kind(certificate_key) {
            KeyKind::Ed25519 => Algorithm::Ed25519,
            KeyKind::EcdsaP256 => Algorithm::EcdsaP256,
            other => return Err(Pkcs11Error::UnsupportedKeyType(other)),
        };
        let mut key = Self {
            source: source.clone(),
            pin: AuthPin::from(pin.to_owned()),
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

    /// Sign `message` as X.509 wants it: Ed25519 raw, ECDSA as a DER
    /// `Ecdsa-Sig-Value`. A failure re-initializes the module and tries
    /// once more (the token came back, or a session was lost). The calls
    /// wait on the token (a network HSM's round trip, a USB device) without
    /// holding up the runtime's other tasks (`module::waiting_off_the_workers`).
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

impl Signer for Pkcs11Key {
    fn kind(&self) -> KeyKind {
        Pkcs11Key::kind(self)
    }

    fn signature_algorithm(&self) -> AlgorithmIdentifierOwned {
        let oid = match self.algorithm {
            Algorithm::Ed25519 => const_oid::db::rfc8410::ID_ED_25519,
            Algorithm::EcdsaP256 => const_oid::db::rfc5912::ECDSA_WITH_SHA_256,
        };
        AlgorithmIdentifierOwned {
            oid,
            parameters: None,
        }
    }

    fn public_key_info(&self) -> Result<SubjectPublicKeyInfoOwned, der::Error> {
        Ok(self.public_key.clone())
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        Pkcs11Key::sign(self, message).map_err(|e| SignError::Unavailable(KeyUnavailable::new(e)))
    }

    fn location(&self) -> Option<String> {
        Some(self.facts.to_string())
    }

    /// Turns to sign, waited for without holding a thread: at most
    /// [`POOL_SIZE`] issuances sign with this key at once, each on a pooled
    /// session, and the rest wait for a turn. Without the bound every request in
    /// flight could be inside the token at once, each opening a session of
    /// its own: past the HSM's session limit `C_OpenSession` fails, which
    /// reads as a lost token and re-initializes the module under every
    /// signature in progress; and each waiting signature would hold a
    /// thread of the runtime's blocking pool (`module::waiting_off_the_workers`).
    /// The `/readyz` probe and checkpoints sign without a turn: one at a
    /// time each, and rarely.
    fn turns(&self) -> Option<&tokio::sync::Semaphore> {
        Some(&self.turns)
    }
}
