//! Microsoft Graph's group overage endpoint, and where a token's claim
//! source points to it.

use axum::extract::{Path, State as AxumState};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::json;

use super::{Shared, json_response, lock, pause};

pub(super) async fn graph_member_objects(
    AxumState(state): AxumState<Shared>,
    Path(oid): Path<String>,
    headers: HeaderMap,
) -> Response {
    // Counted on arrival, so a test can tell a request is in flight.
    lock(&state).counters.graph_member_objects += 1;
    pause(&state).await;
    let s = lock(&state);
    if s.faults.graph_unavailable {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "serviceNotAvailable", "message": "Service unavailable"}}),
        );
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    if !s.graph_tokens.iter().any(|t| t == bearer) {
        return json_response(
            StatusCode::UNAUTHORIZED,
            json!({"error": {"code": "InvalidAuthenticationToken", "message": "Access token is empty or invalid."}}),
        );
    }
    match s.config.users.iter().find(|u| u.oid == oid) {
        Some(user) => json_response(
            StatusCode::OK,
            json!({"@odata.context": "https://graph.microsoft.com/v1.0/$metadata#Collection(Edm.String)", "value": user.groups}),
        ),
        None => json_response(
            StatusCode::NOT_FOUND,
            json!({"error": {"code": "Request_ResourceNotFound", "message": format!("Resource '{oid}' does not exist.")}}),
        ),
    }
}

/// The URL written into overage tokens. The server must never call it.
pub(super) async fn token_claim_source(AxumState(state): AxumState<Shared>) -> Response {
    lock(&state).counters.token_claim_source += 1;
    json_response(
        StatusCode::FORBIDDEN,
        json!({"error": "this URL came from a token and must not be fetched"}),
    )
}
