//! Tokens as Entra writes them: claims for ID tokens, access tokens (v1 or
//! v2) and Graph app tokens, signed RS256 with the newest published key.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature;
use serde_json::{Value, json};

use super::{CLI_CLIENT_ID, SERVER_APP_ID, State, TENANT_ID, TestApplication, TestUser};

/// Which token to mint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenKind {
    /// ID token for the CLI (`aud` = CLI client id), with an optional nonce.
    Id { nonce: Option<String> },
    /// Access token for the server's API (`aud` = server app), in the
    /// emulator's configured version.
    Access { version: u8 },
}

impl TokenKind {
    pub fn id() -> Self {
        TokenKind::Id { nonce: None }
    }

    pub fn is_v1(&self) -> bool {
        matches!(self, TokenKind::Access { version: 1 })
    }
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A random URL-safe string (codes, token ids).
pub(crate) fn random_id(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    // SystemRandom only fails if the OS has no randomness; an emulator may panic then.
    SystemRandom::new().fill(&mut buf).expect("randomness");
    b64(&buf)
}

/// Entra's `sub` is pairwise: stable per user and application.
fn pairwise_sub(user: &TestUser, client_id: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{}|{client_id}", user.oid).as_bytes(),
    );
    b64(digest.as_ref())
}

pub(crate) fn claims(state: &State, user: &TestUser, kind: &TokenKind) -> Value {
    let iat = state.token_time.unwrap_or_else(|| state.now()) - 300;
    let base = &state.base_url;
    let (aud, iss, ver) = match kind {
        TokenKind::Id { .. } => (
            CLI_CLIENT_ID.to_owned(),
            format!("{base}/{TENANT_ID}/v2.0"),
            "2.0",
        ),
        TokenKind::Access { version: 1 } => (
            format!("api://{SERVER_APP_ID}"),
            format!("{base}/sts/{TENANT_ID}/"),
            "1.0",
        ),
        TokenKind::Access { .. } => (
            SERVER_APP_ID.to_owned(),
            format!("{base}/{TENANT_ID}/v2.0"),
            "2.0",
        ),
    };
    let mut claims = json!({
        "aud": aud,
        "iss": iss,
        "iat": iat,
        "nbf": iat,
        "exp": iat + 3900,
        "tid": TENANT_ID,
        "oid": user.oid,
        "sub": pairwise_sub(user, CLI_CLIENT_ID),
        "preferred_username": user.username,
        "name": user.name,
        "uti": random_id(16),
        "ver": ver,
    });
    let object = claims.as_object_mut().expect("object");
    if !state.config.token_ids {
        object.remove("uti");
    }
    if user.has_overage() {
        object.insert("_claim_names".into(), json!({"groups": "src1"}));
        object.insert(
            "_claim_sources".into(),
            json!({"src1": {"endpoint": format!("{base}/token-claim-source/{}/getMemberObjects", user.oid)}}),
        );
    } else if !user.groups.is_empty() {
        object.insert("groups".into(), json!(user.groups));
    }
    if !user.app_roles.is_empty() {
        object.insert("roles".into(), json!(user.app_roles));
    }
    match kind {
        TokenKind::Id { nonce: Some(nonce) } => {
            object.insert("nonce".into(), json!(nonce));
        }
        TokenKind::Id { nonce: None } => {}
        TokenKind::Access { version } => {
            object.insert("scp".into(), json!("talos.certificates"));
            if *version == 1 {
                object.insert("appid".into(), json!(CLI_CLIENT_ID));
                object.insert("upn".into(), json!(user.username));
                object.remove("preferred_username");
            } else {
                object.insert("azp".into(), json!(CLI_CLIENT_ID));
                object.insert("azpacr".into(), json!("0"));
            }
        }
    }
    claims
}

/// Sign claims with the newest key. v1 headers carry `x5t` next to `kid`.
pub(crate) fn sign(state: &State, claims: &Value, v1: bool) -> Result<String, String> {
    let key = state.keys.last().ok_or("no signing key")?;
    let header = if v1 {
        json!({"typ": "JWT", "alg": "RS256", "kid": key.kid, "x5t": key.kid})
    } else {
        json!({"typ": "JWT", "alg": "RS256", "kid": key.kid})
    };
    sign_with_header(state, &header, claims)
}

/// Sign claims (RS256, the newest key) under exactly the header given,
/// whatever `alg`, `kid` or `crit` it names: for tests of what the server
/// makes of a header Entra would not write.
pub(crate) fn sign_with_header(state: &State, header: &Value, claims: &Value) -> Result<String, String> {
    let key = state.keys.last().ok_or("no signing key")?;
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let mut sig = vec![0u8; key.pair.public().modulus_len()];
    key.pair
        .sign(
            &signature::RSA_PKCS1_SHA256,
            &SystemRandom::new(),
            input.as_bytes(),
            &mut sig,
        )
        .map_err(|_| "signing failed")?;
    Ok(format!("{input}.{}", b64(&sig)))
}

pub(crate) fn mint(state: &State, user: &TestUser, kind: TokenKind) -> Result<String, String> {
    let claims = claims(state, user, &kind);
    sign(state, &claims, kind.is_v1())
}

/// The claims of an application's own token for the API `resource` (an app
/// id), as Entra writes them for the client credentials grant: no `scp`, no
/// username claims, `oid` and `sub` the service principal's object id, the
/// app roles assigned to it in `roles`; v2 names the client in `azp`, v1 in
/// `appid`. `idtyp: app` only when the emulator is configured to add it.
pub(crate) fn app_claims(state: &State, application: &TestApplication, resource: &str) -> Value {
    let iat = state.now() - 300;
    let base = &state.base_url;
    let v1 = state.config.access_token_version == 1;
    let mut claims = json!({
        "aud": if v1 { format!("api://{resource}") } else { resource.to_owned() },
        "iss": if v1 { format!("{base}/sts/{TENANT_ID}/") } else { format!("{base}/{TENANT_ID}/v2.0") },
        "iat": iat, "nbf": iat, "exp": iat + 3900,
        "tid": TENANT_ID,
        "oid": application.object_id,
        "sub": application.object_id,
        "idp": if v1 { format!("https://sts.windows.net/{TENANT_ID}/") } else { format!("{base}/{TENANT_ID}/v2.0") },
        "uti": random_id(16),
        "ver": if v1 { "1.0" } else { "2.0" },
    });
    let object = claims.as_object_mut().expect("object");
    if v1 {
        object.insert("appid".into(), json!(application.client_id));
        object.insert("appidacr".into(), json!("1"));
    } else {
        object.insert("azp".into(), json!(application.client_id));
        object.insert("azpacr".into(), json!("1"));
    }
    if !application.app_roles.is_empty() {
        object.insert("roles".into(), json!(application.app_roles));
    }
    if state.config.app_token_idtyp {
        object.insert("idtyp".into(), json!("app"));
    }
    claims
}

/// The app-only token the server gets for Graph (client credentials).
pub(crate) fn graph_app_token(state: &State) -> Result<String, String> {
    let iat = state.now() - 300;
    let claims = json!({
        "aud": "https://graph.microsoft.com",
        "iss": format!("{}/sts/{TENANT_ID}/", state.base_url),
        "iat": iat, "nbf": iat, "exp": iat + 3900,
        "tid": TENANT_ID, "appid": SERVER_APP_ID, "idtyp": "app",
        "roles": ["GroupMember.Read.All"], "uti": random_id(16), "ver": "1.0",
    });
    sign(state, &claims, true)
}
