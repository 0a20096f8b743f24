//! `POST /v1/certificates`: authenticate the caller, read the request, let
//! [`crate::issuance`] decide, sign and record, and answer. Every decision
//! (issued or refused, for any reason) is committed to the audit trail
//! before the answer leaves; when that is impossible the answer is 503
//! `audit_unavailable` and nothing is issued.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use talos_sso_api::{CertificateRequest, Identity, IssuedCertificate};

use super::caller::Caller;
use super::error::ApiError;
use super::gate::{Gate, IdentityLimit};
use crate::app::App;
use crate::audit::{event, format_micros};
use crate::issuance::Issuance;

pub async fn issue(
    State(app): State<Arc<App>>,
    caller: Caller,
    body: Bytes,
) -> Result<(StatusCode, Json<IssuedCertificate>), ApiError> {
    let started = std::time::Instant::now();
    let answer = issue_certificate(&app, &caller, &body).await;
    app.metrics
        .issuance_duration
        .observe(started.elapsed().as_secs_f64());
    answer.map(|issued| (StatusCode::CREATED, Json(issued)))
}

async fn issue_certificate(app: &App, caller: &Caller, body: &[u8]) -> Result<IssuedCertificate, ApiError> {
    let parsed: Result<CertificateRequest, String> = serde_json::from_slice(body).map_err(|e| e.to_string());
    let gate = Gate::open(app, caller, event::CERTIFICATE_DENIED);
    let gate = match &parsed {
        Ok(request) => gate.asking_for(request),
        Err(_) => gate,
    };
    let admitted = gate.pass(IdentityLimit::Certificates).await?;
    let request = match parsed {
        Ok(request) => request,
        Err(reason) => {
            let error = ApiError::request_invalid(
                format!("the request body is not a certificate request: {reason}"),
                None,
            );
            return Err(admitted.refuse(error).await);
        }
    };
    // One configuration for the whole decision, even if a reload lands
    // while it is made.
    let settings = admitted.settings().clone();
    let (verified, record) = admitted.into_parts();
    let issuance = Issuance {
        clusters: &settings.clusters,
        recorder: &app.audit,
        metrics: &app.metrics,
    };
    let issued = issuance
        .issue(&verified, &request, record, app.clock.now())
        .await?;
    let cluster = issued.cluster;
    Ok(IssuedCertificate {
        certificate: issued.certificate.chain_pem,
        ca: cluster.talosconfig_ca().to_owned(),
        endpoints: cluster.talosconfig_endpoints().to_vec(),
        nodes: cluster.config.nodes.clone(),
        cluster: cluster.name.clone(),
        context: cluster.context_name(),
        roles: issued.certificate.roles,
        identity: Identity {
            issuer: verified.issuer,
            tenant: verified.tenant,
            subject: verified.subject,
            username: verified.username,
        },
        serial: issued.certificate.serial_hex,
        not_before: format_micros(issued.certificate.not_before),
        not_after: format_micros(issued.certificate.not_after),
        audit_id: issued.record.seq,
    })
}
