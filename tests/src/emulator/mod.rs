//! An Entra ID emulator: a loopback HTTP server that answers like Microsoft
//! Entra ID (and a sliver of Microsoft Graph) closely enough that talos-sso is
//! tested against Entra's real shapes, and that the quick-start demo runs
//! with no external service.
//!
//! What it serves (`{tenant}` is the tenant id or `organizations`):
//! - discovery: `/{tenant}/v2.0/.well-known/openid-configuration` (v2 issuer
//!   `{base}/{tid}/v2.0`), `/{tenant}/.well-known/openid-configuration` (v1
//!   issuer `{base}/sts/{tid}/`), and for `organizations` the literal
//!   `{tenantid}` issuer template;
//! - keys: `/{tenant}/discovery/v2.0/keys` (and the v1 path), at least two RSA
//!   keys, more added by [`EmulatorHandle::rotate_keys`];
//! - authorization code with PKCE S256, `state` and `nonce`, completed
//!   automatically for tests ([`EmulatorHandle::set_auto_login`] or
//!   `login_hint`) or through a small HTML page for people;
//! - the token endpoint: `authorization_code`, rotating `refresh_token`,
//!   device code (`authorization_pending`, `slow_down`, `expired_token`,
//!   `authorization_declined`), and `client_credentials` for Graph;
//! - `/{tenant}/oauth2/v2.0/devicecode` and a `/devicelogin` page;
//! - Graph: `POST /v1.0/users/{oid}/getMemberObjects`;
//! - fault knobs: JWKS unavailable, slow answers, malformed documents,
//!   Graph unavailable, and a clock offset.
//!
//! Tokens carry Entra's claims: `aud`, `iss`, `iat`/`nbf` backdated five
//! minutes, `exp = iat + 3900`, `tid`, `oid`, pairwise `sub`,
//! `preferred_username`, `name`, `groups` (object ids) or the overage claims,
//! `roles`, `uti`, `ver`, `nonce` (not on device-code tokens).

mod routes;
mod tokens;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ring::signature::RsaKeyPair;

pub use tokens::TokenKind;

/// The tenant every emulator instance plays.
pub const TENANT_ID: &str = "5b1a0c2e-7d3f-4e8a-9b6c-1f2e3d4c5b6a";
/// The public client id the talos-sso CLI uses against the emulator.
pub const CLI_CLIENT_ID: &str = "0c5a9f2e-1b3d-4c7e-8f60-2a4b6c8d0e1f";
/// The server's own app: API audience for access tokens, Graph credentials.
pub const SERVER_APP_ID: &str = "7e8f9a0b-1c2d-4e3f-8a9b-0c1d2e3f4a5b";
/// The secret of the server's app registration (for Graph).
pub const SERVER_APP_SECRET: &str = "emulator-graph-secret";

/// Demo group object ids.
pub const GROUP_PLATFORM_ADMINS: &str = "3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a01";
pub const GROUP_ONCALL: &str = "3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a02";
pub const GROUP_SECURITY: &str = "3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a03";

/// Sam Security's object id (`sam@example.com`, in `GROUP_SECURITY`).
pub const SAM_OID: &str = "f6000000-0000-4000-8000-000000000006";

/// A person who can log in.
#[derive(Debug, Clone)]
pub struct TestUser {
    pub oid: String,
    pub username: String,
    pub name: String,
    /// Group object ids.
    pub groups: Vec<String>,
    /// App roles assigned on the CLI's app.
    pub app_roles: Vec<String>,
    /// Force the overage claims even with few groups (Entra does it above 200).
    pub overage: bool,
}

impl TestUser {
    pub fn new(oid: &str, username: &str, name: &str, groups: &[&str], app_roles: &[&str]) -> Self {
        Self {
            oid: oid.into(),
            username: username.into(),
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            app_roles: app_roles.iter().map(|r| r.to_string()).collect(),
            overage: false,
        }
    }

    /// Entra omits `groups` above 200 of them (150 for SAML, 6 for implicit).
    pub fn has_overage(&self) -> bool {
        self.overage || self.groups.len() > 200
    }
}

/// The demo directory: an admin, an on-call engineer, a reader (by app
/// role), someone with no access, someone in 250 groups, a security auditor.
pub fn demo_users() -> Vec<TestUser> {
    let mut many: Vec<String> = (0..249)
        .map(|i| format!("9a9a9a9a-0000-4000-8000-{i:012}"))
        .collect();
    many.push(GROUP_ONCALL.into());
    vec![
        TestUser::new(
            "a1000000-0000-4000-8000-000000000001",
            "alice@example.com",
            "Alice Admin",
            &[GROUP_PLATFORM_ADMINS],
            &[],
        ),
        TestUser::new(
            "b2000000-0000-4000-8000-000000000002",
            "bob@example.com",
            "Bob Oncall",
            &[GROUP_ONCALL],
            &[],
        ),
        TestUser::new(
            "c3000000-0000-4000-8000-000000000003",
            "carol@example.com",
            "Carol Reader",
            &[],
            &["Talos.Reader"],
        ),
        TestUser::new(
            "d4000000-0000-4000-8000-000000000004",
            "dave@example.com",
            "Dave Nobody",
            &[],
            &[],
        ),
        TestUser {
            groups: many,
            ..TestUser::new(
                "e5000000-0000-4000-8000-000000000005",
                "erin@example.com",
                "Erin Manygroups",
                &[],
                &[],
            )
        },
        TestUser::new(SAM_OID, "sam@example.com", "Sam Security", &[GROUP_SECURITY], &[]),
    ]
}

/// An application registered in the tenant that gets tokens of its own
/// (client credentials), as a SIEM's collector does.
#[derive(Debug, Clone)]
pub struct TestApplication {
    /// The application (client) id: `azp` / `appid` of its tokens.
    pub client_id: String,
    pub client_secret: String,
    /// Its service principal's object id: `oid` and `sub` of its tokens.
    pub object_id: String,
    /// App roles assigned to it on the server's API.
    pub app_roles: Vec<String>,
}

/// The client id of the demo SIEM collector (app role `Talos.Auditor`).
pub const SIEM_CLIENT_ID: &str = "5e1e0000-0000-4000-8000-00000000c011";
/// Its secret.
pub const SIEM_CLIENT_SECRET: &str = "emulator-siem-secret";
/// A registered application with no app role on the server's API, but the
/// `Talos.Reader` role people get certificates by.
pub const OTHER_APP_CLIENT_ID: &str = "0a1e0000-0000-4000-8000-00000000a990";
pub const OTHER_APP_CLIENT_SECRET: &str = "emulator-other-secret";

/// The demo applications: the SIEM collector and another application.
pub fn demo_applications() -> Vec<TestApplication> {
    vec![
        TestApplication {
            client_id: SIEM_CLIENT_ID.into(),
            client_secret: SIEM_CLIENT_SECRET.into(),
            object_id: "5e1e5e1e-0000-4000-8000-0000000005a1".into(),
            app_roles: vec!["Talos.Auditor".into()],
        },
        TestApplication {
            client_id: OTHER_APP_CLIENT_ID.into(),
            client_secret: OTHER_APP_CLIENT_SECRET.into(),
            object_id: "0a1e0a1e-0000-4000-8000-0000000005a2".into(),
            app_roles: vec!["Talos.Reader".into()],
        },
    ]
}

/// How an emulator instance behaves.
#[derive(Debug, Clone)]
pub struct EmulatorConfig {
    pub users: Vec<TestUser>,
    /// Applications that may use the client credentials grant.
    pub applications: Vec<TestApplication>,
    /// Whether app-only tokens carry `idtyp: app` (the optional claim the
    /// API's registration may ask for); without it they are told by `oid`
    /// equal to `sub`.
    pub app_token_idtyp: bool,
    /// Polling interval announced for the device flow, in seconds.
    pub device_interval: u64,
    /// Lifetime of a device code.
    pub device_expires_in: Duration,
    /// 1 or 2: the version of access tokens for the server's API (Entra
    /// follows the API app's `accessTokenAcceptedVersion`).
    pub access_token_version: u8,
    /// The URL clients use to reach the emulator, when it is not the address
    /// it listens on (in a container: `http://localhost:8400`).
    pub public_url: Option<String>,
    /// Publish and sign with the keys another instance keeps spare, so
    /// that two instances in one test have no key in common.
    pub alternate_keys: bool,
    /// Whether tokens carry a unique id (`uti`), as Entra's do. Without
    /// one, as with many OpenID Providers, two tokens for the same person
    /// issued in the same second are byte-identical.
    pub token_ids: bool,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self {
            users: demo_users(),
            applications: demo_applications(),
            app_token_idtyp: true,
            device_interval: 5,
            device_expires_in: Duration::from_secs(900),
            access_token_version: 2,
            public_url: None,
            alternate_keys: false,
            token_ids: true,
        }
    }
}

/// Faults a test can switch on.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub jwks_unavailable: bool,
    pub graph_unavailable: bool,
    pub malformed_documents: bool,
    pub delay: Duration,
    /// The next this many token answers are issued at the time of the one
    /// before: with `token_ids: false`, what a provider does for two
    /// requests within one second (the same token again).
    pub repeat_token_time: u32,
}

/// How often endpoints were hit (for tests of caching and rate limits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub discovery: u64,
    pub jwks: u64,
    pub graph_member_objects: u64,
    /// Hits on the URL put inside overage tokens: must stay 0, since the
    /// server builds the Graph URL itself.
    pub token_claim_source: u64,
}

/// A secret the emulator issued or received, for tests that check the
/// client never shows one (`talos-sso --debug`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Secret {
    /// What it is: `id_token`, `access_token`, `refresh_token`,
    /// `authorization_code`, `device_code`, `code_verifier`,
    /// `code_challenge`, `state`, `nonce`.
    pub kind: &'static str,
    pub value: String,
}

/// How many secrets the emulator remembers: plenty for a test's logins,
/// and a bound for the load generator and the demo, which run for long.
pub const SECRETS_KEPT: usize = 1024;

pub(crate) struct SigningKey {
    pub kid: String,
    pub pair: RsaKeyPair,
}

pub(crate) struct PendingCode {
    pub client_id: String,
    pub redirect_uri: String,
    pub code_challenge: String,
    pub nonce: Option<String>,
    pub scope: String,
    pub user: String,
}

pub(crate) struct RefreshGrant {
    pub client_id: String,
    pub scope: String,
    pub user: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeviceStatus {
    Pending,
    Approved(String),
    Declined,
}

pub(crate) struct DeviceGrant {
    pub user_code: String,
    pub client_id: String,
    pub scope: String,
    pub expires_at: std::time::Instant,
    pub last_poll: Option<std::time::Instant>,
    pub status: DeviceStatus,
}

pub(crate) struct State {
    pub config: EmulatorConfig,
    pub base_url: String,
    /// Published keys; the last one signs.
    pub keys: Vec<SigningKey>,
    /// Keys not yet published, taken by `rotate_keys`.
    pub spare_keys: Vec<SigningKey>,
    pub codes: HashMap<String, PendingCode>,
    pub refresh_tokens: HashMap<String, RefreshGrant>,
    pub devices: HashMap<String, DeviceGrant>,
    pub graph_tokens: Vec<String>,
    pub auto_login: Option<String>,
    pub faults: Faults,
    pub counters: Counters,
    /// Seconds added to the emulator's clock.
    pub clock_offset: i64,
    /// When the last token answer was issued (see `Faults::repeat_token_time`).
    pub last_token_time: Option<i64>,
    /// The time tokens are being issued at, during one token answer.
    pub token_time: Option<i64>,
    /// The last [`SECRETS_KEPT`] secrets issued or received, oldest first
    /// (see [`Secret`]).
    pub secrets: std::collections::VecDeque<Secret>,
}

impl State {
    pub fn user(&self, username_or_oid: &str) -> Option<&TestUser> {
        self.config
            .users
            .iter()
            .find(|u| u.username.eq_ignore_ascii_case(username_or_oid) || u.oid == username_or_oid)
    }

    pub fn now(&self) -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp() + self.clock_offset
    }

    /// Remember a secret issued or received; empty values are not secrets.
    pub fn record(&mut self, kind: &'static str, value: &str) {
        if value.is_empty() {
            return;
        }
        if self.secrets.len() == SECRETS_KEPT {
            self.secrets.pop_front();
        }
        self.secrets.push_back(Secret {
            kind,
            value: value.to_owned(),
        });
    }
}

/// A running emulator. Dropping it stops the server.
#[derive(Clone)]
pub struct EmulatorHandle {
    pub base_url: String,
    pub address: SocketAddr,
    state: Arc<Mutex<State>>,
    _stop: Arc<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for EmulatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EmulatorHandle({})", self.base_url)
    }
}

/// The emulator's RSA keys, compiled in so the binary runs from anywhere.
const KEY_PEMS: [&str; 4] = [
    include_str!("../../fixtures/entra/signing-key-1.pem"),
    include_str!("../../fixtures/entra/signing-key-2.pem"),
    include_str!("../../fixtures/entra/signing-key-3.pem"),
    include_str!("../../fixtures/entra/signing-key-4.pem"),
];

fn load_keys() -> Vec<SigningKey> {
    KEY_PEMS
        .iter()
        .map(|text| {
            let der = talos_sso_server::x509::pem_blocks(text)
                .expect("key PEM")
                .remove(0)
                .1;
            let pair = RsaKeyPair::from_pkcs8(&der).expect("RSA key");
            let kid = tokens::b64(
                &ring::digest::digest(&ring::digest::SHA256, pair.public().as_ref()).as_ref()[..20],
            );
            SigningKey { kid, pair }
        })
        .collect()
}

impl EmulatorHandle {
    /// Start on 127.0.0.1 with a free port.
    pub async fn start(config: EmulatorConfig) -> std::io::Result<Self> {
        Self::start_on("127.0.0.1:0".parse().expect("address"), config).await
    }

    pub async fn start_on(address: SocketAddr, config: EmulatorConfig) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let base_url = config
            .public_url
            .clone()
            .map(|u| u.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| format!("http://{address}"));
        let mut keys = load_keys();
        if config.alternate_keys {
            keys.rotate_left(2);
        }
        let spare_keys = keys.split_off(2);
        let state = Arc::new(Mutex::new(State {
            config,
            base_url: base_url.clone(),
            keys,
            spare_keys,
            codes: HashMap::new(),
            refresh_tokens: HashMap::new(),
            devices: HashMap::new(),
            graph_tokens: Vec::new(),
            auto_login: None,
            faults: Faults::default(),
            counters: Counters::default(),
            clock_offset: 0,
            last_token_time: None,
            token_time: None,
            secrets: std::collections::VecDeque::new(),
        }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = routes::router(state.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Self {
            base_url,
            address,
            state,
            _stop: Arc::new(stop),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The v2 issuer for our tenant.
    pub fn issuer(&self) -> String {
        format!("{}/{TENANT_ID}/v2.0", self.base_url)
    }

    /// The v1 issuer (access tokens of APIs that accept v1).
    pub fn issuer_v1(&self) -> String {
        format!("{}/sts/{TENANT_ID}/", self.base_url)
    }

    /// Publish the next spare key and sign with it from now on. Returns its kid.
    pub fn rotate_keys(&self) -> Option<String> {
        let mut state = self.state();
        let key = state.spare_keys.pop()?;
        let kid = key.kid.clone();
        state.keys.push(key);
        Some(kid)
    }

    /// Complete every authorization request as this user without a page.
    pub fn set_auto_login(&self, username: Option<&str>) {
        self.state().auto_login = username.map(str::to_owned);
    }

    /// Change a user's groups, as a directory administrator would: tokens
    /// issued from now on (refreshes included) carry the new ones.
    pub fn set_groups(&self, username: &str, groups: &[&str]) {
        let mut state = self.state();
        let user = state
            .config
            .users
            .iter_mut()
            .find(|u| u.username.eq_ignore_ascii_case(username))
            .unwrap_or_else(|| panic!("no test user {username}"));
        user.groups = groups.iter().map(|g| g.to_string()).collect();
    }

    pub fn set_faults(&self, faults: Faults) {
        self.state().faults = faults;
    }

    pub fn counters(&self) -> Counters {
        self.state().counters.clone()
    }

    pub fn set_clock_offset(&self, seconds: i64) {
        self.state().clock_offset = seconds;
    }

    /// Approve a pending device code as `username`.
    pub fn approve_device(&self, user_code: &str, username: &str) -> bool {
        routes::set_device_status(
            &mut self.state(),
            user_code,
            DeviceStatus::Approved(username.to_owned()),
        )
    }

    pub fn decline_device(&self, user_code: &str) -> bool {
        routes::set_device_status(&mut self.state(), user_code, DeviceStatus::Declined)
    }

    /// Mint a token for `username` directly, as Entra would after a login:
    /// for tests that need a token without going through a flow.
    pub fn token_for(&self, username: &str, kind: TokenKind) -> Option<String> {
        let state = self.state();
        let user = state.user(username)?.clone();
        tokens::mint(&state, &user, kind).ok()
    }

    /// Mint a token with extra or changed claims (`null` removes one).
    pub fn token_with(&self, username: &str, kind: TokenKind, patch: serde_json::Value) -> Option<String> {
        let v1 = kind.is_v1();
        let claims = self.claims_with(username, kind, patch)?;
        tokens::sign(&self.state(), &claims, v1).ok()
    }

    /// The claims a token for `username` would carry, with `patch` applied
    /// as in [`Self::token_with`].
    pub fn claims_with(
        &self,
        username: &str,
        kind: TokenKind,
        patch: serde_json::Value,
    ) -> Option<serde_json::Value> {
        let state = self.state();
        let user = state.user(username)?.clone();
        let mut claims = tokens::claims(&state, &user, &kind);
        patched(&mut claims, &patch);
        Some(claims)
    }

    /// `claims` signed (RS256, the newest key) under `header` exactly as
    /// given: a `kid` the key set lacks, a `crit` list, a header that is
    /// not what Entra writes.
    pub fn sign_with_header(&self, header: serde_json::Value, claims: &serde_json::Value) -> Option<String> {
        tokens::sign_with_header(&self.state(), &header, claims).ok()
    }

    /// The `kid` the emulator signs with now.
    pub fn current_kid(&self) -> Option<String> {
        self.state().keys.last().map(|k| k.kid.clone())
    }

    /// The public key (PKCS#1 `RSAPublicKey` DER) the emulator signs with
    /// now, as an attacker reads it from the published key set.
    pub fn current_public_key(&self) -> Option<Vec<u8>> {
        self.state()
            .keys
            .last()
            .map(|k| ring::signature::KeyPair::public_key(&k.pair).as_ref().to_vec())
    }

    /// An app-only token of the application `client_id` for the server's
    /// API, as the client credentials grant answers, with `patch` applied
    /// as in [`Self::token_with`].
    pub fn app_token_with(&self, client_id: &str, patch: serde_json::Value) -> Option<String> {
        let state = self.state();
        let application = state
            .config
            .applications
            .iter()
            .find(|a| a.client_id == client_id)?
            .clone();
        let mut claims = tokens::app_claims(&state, &application, SERVER_APP_ID);
        patched(&mut claims, &patch);
        tokens::sign(&state, &claims, state.config.access_token_version == 1).ok()
    }

    /// The last [`SECRETS_KEPT`] secrets issued (tokens, authorization and device codes) or
    /// received (the PKCE verifier and challenge, state, nonce) so far.
    pub fn secrets(&self) -> Vec<Secret> {
        self.state().secrets.iter().cloned().collect()
    }

    pub fn users(&self) -> Vec<TestUser> {
        self.state().config.users.clone()
    }
}

/// `claims` with each claim of `patch` set, or removed where it is `null`.
fn patched(claims: &mut serde_json::Value, patch: &serde_json::Value) {
    if let (Some(claims), Some(patch)) = (claims.as_object_mut(), patch.as_object()) {
        for (name, value) in patch {
            if value.is_null() {
                claims.remove(name);
            } else {
                claims.insert(name.clone(), value.clone());
            }
        }
    }
}

/// How long tests wait for a device code or a page.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);
