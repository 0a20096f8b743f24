//! The OpenID discovery documents (v2.0 and v1) and the signing keys.

use axum::extract::{Path, State as AxumState};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Shared, bad_tenant, json_response, known_tenant, lock, pause};
use crate::emulator::TENANT_ID;
use crate::emulator::tokens::b64;

fn malformed_document() -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        "{\"issuer\": \"https://",
    )
        .into_response()
}

/// A discovery document for `tenant`, built by `document(base, tenant,
/// issuer tenant)` after the checks and faults every document shares. The
/// multi-tenant names get the literal `{tenantid}` issuer template.
async fn discovery(
    state: Shared,
    tenant: String,
    document: impl FnOnce(&str, &str, &str) -> Value,
) -> Response {
    pause(&state).await;
    let mut s = lock(&state);
    s.counters.discovery += 1;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    if s.faults.malformed_documents {
        return malformed_document();
    }
    let issuer_tenant = if tenant == TENANT_ID {
        TENANT_ID
    } else {
        "{tenantid}"
    };
    json_response(StatusCode::OK, document(&s.base_url, &tenant, issuer_tenant))
}

pub(super) async fn discovery_v2(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
) -> Response {
    discovery(state, tenant, |base, tenant, issuer_tenant| {
        json!({
            "token_endpoint": format!("{base}/{tenant}/oauth2/v2.0/token"),
            "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
            "jwks_uri": format!("{base}/{tenant}/discovery/v2.0/keys"),
            "response_modes_supported": ["query", "fragment", "form_post"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
            "scopes_supported": ["openid", "profile", "email", "offline_access"],
            "issuer": format!("{base}/{issuer_tenant}/v2.0"),
            "request_uri_parameter_supported": false,
            "userinfo_endpoint": format!("{base}/oidc/userinfo"),
            "authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/authorize"),
            "device_authorization_endpoint": format!("{base}/{tenant}/oauth2/v2.0/devicecode"),
            "http_logout_supported": true,
            "frontchannel_logout_supported": true,
            "end_session_endpoint": format!("{base}/{tenant}/oauth2/v2.0/logout"),
            "claims_supported": ["sub", "iss", "cloud_instance_name", "cloud_instance_host_name", "cloud_graph_host_name",
                "msgraph_host", "aud", "exp", "iat", "auth_time", "acr", "nonce", "preferred_username", "name", "tid",
                "ver", "at_hash", "c_hash", "email"],
            "kerberos_endpoint": format!("{base}/{tenant}/kerberos"),
            "tenant_region_scope": "EU",
            "cloud_instance_name": "microsoftonline.com",
            "cloud_graph_host_name": "graph.windows.net",
            "msgraph_host": "graph.microsoft.com",
            "rbac_url": "https://pas.windows.net"
        })
    })
    .await
}

pub(super) async fn discovery_v1(
    AxumState(state): AxumState<Shared>,
    Path(tenant): Path<String>,
) -> Response {
    discovery(state, tenant, |base, tenant, issuer_tenant| {
        json!({
            "token_endpoint": format!("{base}/{tenant}/oauth2/token"),
            "jwks_uri": format!("{base}/{tenant}/discovery/keys"),
            "response_types_supported": ["code", "id_token", "code id_token", "token id_token", "token"],
            "subject_types_supported": ["pairwise"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "issuer": format!("{base}/sts/{issuer_tenant}/"),
            "authorization_endpoint": format!("{base}/{tenant}/oauth2/authorize"),
            "device_authorization_endpoint": format!("{base}/{tenant}/oauth2/devicecode"),
        })
    })
    .await
}

pub(super) async fn jwks(AxumState(state): AxumState<Shared>, Path(tenant): Path<String>) -> Response {
    pause(&state).await;
    let mut s = lock(&state);
    s.counters.jwks += 1;
    if !known_tenant(&tenant) {
        return bad_tenant(&tenant);
    }
    if s.faults.jwks_unavailable {
        return (StatusCode::SERVICE_UNAVAILABLE, "the key service is unavailable").into_response();
    }
    if s.faults.malformed_documents {
        return malformed_document();
    }
    let issuer = if tenant == TENANT_ID {
        format!("{}/{TENANT_ID}/v2.0", s.base_url)
    } else {
        format!("{}/{{tenantid}}/v2.0", s.base_url)
    };
    let keys: Vec<Value> = s
        .keys
        .iter()
        .map(|k| {
            let public: ring::signature::RsaPublicKeyComponents<Vec<u8>> = k.pair.public().into();
            json!({"kty": "RSA", "use": "sig", "kid": k.kid, "x5t": k.kid, "n": b64(&public.n), "e": b64(&public.e), "issuer": issuer})
        })
        .collect();
    json_response(StatusCode::OK, json!({"keys": keys}))
}
