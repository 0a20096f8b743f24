//! One call through the gateway: checked (the certificate still valid, the
//! person not on the deny list, the cluster's per-method rules), recorded
//! before it is forwarded when it may change a node (no record, no call),
//! forwarded to apid with the person's roles as `talos-role` and nothing the
//! client said about roles, and recorded when it ends. Refusals are gRPC
//! statuses whose message says why.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, Version};
use hyper::body::Incoming;

use super::body::{ForwardBody, ReturnBody, status, status_headers};
use super::upstream::{IMPERSONATOR, Link, endpoint_host};
use super::{ServedCluster, Shared};
use crate::audit::store::{Append, Appended};
use crate::talos_api::calls::{self, Call, CallEnd, Caller};
use crate::talos_api::methods::classify;
use crate::talos_api::rules;

/// The metadata apid takes roles from, from an `os:impersonator` client.
pub const TALOS_ROLE: &str = "talos-role";
/// The request id of the call's records, sent on to apid for its logs.
pub const REQUEST_ID: &str = "talos-sso-request-id";

/// Headers that belong to one hop (RFC 9113 forbids them in HTTP/2 anyway).
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// Metadata only apid sets: `proxyfrom` makes apid run the call on its own
/// node whatever `nodes` says, so a client's would make the trail name
/// another node than the one the call ran on.
const APID_ONLY: [&str; 1] = ["proxyfrom"];

/// A refusal: the status, the message the client reads, the recorded code.
struct Refused {
    status: u32,
    message: String,
    code: &'static str,
    rule: Option<String>,
}

/// Serve one call of `caller` on `gateway`'s cluster.
pub async fn call(
    shared: Arc<Shared>,
    gateway: Arc<ServedCluster>,
    caller: Arc<Caller>,
    link: Arc<Link>,
    request: Request<Incoming>,
) -> Response<ReturnBody> {
    let began = Instant::now();
    let app = shared.app.clone();
    let request_id = crate::random::random_hex(16).unwrap_or_else(|_| "api-call".into());
    let method = request.uri().path().to_owned();
    let is_grpc = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if request.method() != http::Method::POST || !is_grpc {
        // Not a gRPC call: nothing for apid, and nothing to record.
        return trailers_only(
            status::UNIMPLEMENTED,
            "talos-sso gateway: only gRPC calls are forwarded",
        );
    }
    if !well_formed(&method) || request.uri().query().is_some() {
        // grpc-go would answer it UNIMPLEMENTED: nothing to forward or record.
        return trailers_only(status::UNIMPLEMENTED, "talos-sso gateway: not a gRPC method name");
    }
    let nodes = nodes_of(request.headers());
    let too_many = nodes.len() > calls::MAX_NODES;
    let mut call = Call::new(&request_id, &method, nodes, classify(&method, &caller.roles));
    let now = app.clock.now();
    if too_many {
        // Recorded with the first nodes only: refused, so that no call
        // reaches a node its record does not name.
        let record = calls::denied(&caller, &call, "too_many_nodes", None, now);
        for record in gateway.refused(record, now) {
            shared.records.send(record);
        }
        let message = format!("talos-sso gateway: at most {} nodes per call", calls::MAX_NODES);
        return trailers_only(status::INVALID_ARGUMENT, &message);
    }

    if let Err(refused) = check(&shared, &gateway, &caller, &method, now) {
        let record = calls::denied(&caller, &call, refused.code, refused.rule.as_deref(), now);
        for record in gateway.refused(record, now) {
            shared.records.send(record);
        }
        return trailers_only(refused.status, &refused.message);
    }
    let (endpoint, mut sender) = match link.connection(&app, &gateway.upstream).await {
        Ok(connection) => connection,
        Err(error) => {
            tracing::warn!(cluster = %caller.cluster, %error, "gateway call not forwarded");
            let message = format!("talos-sso gateway: {error}");
            let now = app.clock.now();
            let record = calls::denied(&caller, &call, "upstream_unavailable", None, now);
            for record in gateway.refused(record, now) {
                shared.records.send(record);
            }
            return trailers_only(status::UNAVAILABLE, &message);
        }
    };
    if call.nodes.is_empty() {
        call.nodes = vec![endpoint_host(&endpoint)];
    }
    if call.class.recorded_before() {
        let started = calls::started(&caller, &call, app.clock.now());
        let appended = app
            .audit
            .append(Append {
                record: started,
                // The deny list in the same transaction: a person blocked
                // a moment ago gets no change through.
                deny_check: true,
                ..Append::default()
            })
            .await;
        match appended {
            Ok(Appended::Recorded(_)) => {}
            Ok(Appended::Denied(_) | Appended::Replayed(_)) => {
                return trailers_only(
                    status::PERMISSION_DENIED,
                    "talos-sso gateway: you are on the deny list; ask the platform team",
                );
            }
            Err(_) => {
                return trailers_only(
                    status::UNAVAILABLE,
                    "talos-sso gateway: the audit trail is unavailable, so this call was not forwarded; try again shortly",
                );
            }
        }
    }

    let (parts, body) = request.into_parts();
    let bytes_in = Arc::new(AtomicU64::new(0));
    let bytes_out = Arc::new(AtomicU64::new(0));
    let mut forwarded = Request::new(ForwardBody::new(body, bytes_in.clone()));
    *forwarded.method_mut() = http::Method::POST;
    *forwarded.version_mut() = Version::HTTP_2;
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let (host, port) = (endpoint_host(&endpoint), endpoint_port(&endpoint));
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    match format!("https://{authority}{path}").parse() {
        Ok(uri) => *forwarded.uri_mut() = uri,
        Err(_) => {
            return trailers_only(
                status::INVALID_ARGUMENT,
                "talos-sso gateway: the method name is not a path",
            );
        }
    }
    *forwarded.headers_mut() = upstream_headers(&parts.headers, &caller.roles, &request_id);

    let live = gateway
        .live
        .register(caller.subject.as_deref(), caller.username.as_deref());
    let max_call = gateway.max_call;
    let cut = live.cut();
    let cut: super::body::Cut = Box::pin(async move {
        tokio::select! {
            reason = cut => reason,
            () = tokio::time::sleep(max_call) => (
                status::DEADLINE_EXCEEDED,
                format!("talos-sso gateway: calls end after {}", humantime::format_duration(max_call)),
            ),
        }
    });
    let finish = {
        let (shared, gateway, caller, call) = (shared.clone(), gateway.clone(), caller.clone(), call.clone());
        let (bytes_in, bytes_out) = (bytes_in.clone(), bytes_out.clone());
        move |grpc_status: u32, grpc_message: Option<String>| {
            let _running = live;
            let end = CallEnd {
                grpc_status,
                grpc_message,
                duration: began.elapsed(),
                bytes_in: bytes_in.load(Ordering::Relaxed),
                bytes_out: bytes_out.load(Ordering::Relaxed),
            };
            let now = shared.app.clock.now();
            if call.class.recorded_before() {
                shared.records.send(calls::ended(&caller, &call, &end, now));
            } else {
                for record in gateway.reads(&caller, &call, &end, now) {
                    shared.records.send(record);
                }
            }
        }
    };
    let mut cut = cut;
    let answered = tokio::select! {
        answered = sender.send_request(forwarded) => answered,
        (status, message) = &mut cut => {
            finish(status, Some(message.clone()));
            return trailers_only(status, &message);
        }
    };
    match answered {
        Ok(response) => {
            let (mut parts, incoming) = response.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            let body = ReturnBody::forwarded(incoming, &parts.headers, bytes_out, cut, Box::new(finish));
            Response::from_parts(parts, body)
        }
        Err(error) => {
            let message = format!("talos-sso gateway: apid did not answer ({error})");
            finish(status::UNAVAILABLE, Some(message.clone()));
            trailers_only(status::UNAVAILABLE, &message)
        }
    }
}

/// The checks before anything is forwarded.
fn check(
    shared: &Shared,
    gateway: &ServedCluster,
    caller: &Caller,
    method: &str,
    now: time::OffsetDateTime,
) -> Result<(), Refused> {
    if !super::admission::within_validity(caller, now) {
        return Err(Refused {
            status: status::UNAUTHENTICATED,
            message: "talos-sso gateway: your certificate has expired; run talos-sso login again".into(),
            code: "certificate_expired",
            rule: None,
        });
    }
    match shared
        .deny
        .blocks(caller.subject.as_deref(), caller.username.as_deref())
    {
        Some(false) => {}
        Some(true) => {
            return Err(Refused {
                status: status::PERMISSION_DENIED,
                message: "talos-sso gateway: you are on the deny list; ask the platform team".into(),
                code: "identity_denied",
                rule: None,
            });
        }
        // Deny by default: the list has not been read since the start.
        None => {
            return Err(Refused {
                status: status::UNAVAILABLE,
                message: "talos-sso gateway: the deny list cannot be read yet; try again shortly".into(),
                code: "deny_list_unavailable",
                rule: None,
            });
        }
    }
    let settings = shared.app.settings();
    let Some(cluster_gateway) = settings
        .clusters
        .get(&caller.cluster)
        .and_then(|c| c.gateway.as_ref())
    else {
        return Err(Refused {
            status: status::UNAVAILABLE,
            message: "talos-sso gateway: this cluster is no longer served by the gateway".into(),
            code: "cluster_unknown",
            rule: None,
        });
    };
    let roles: Vec<String> = forwarded_roles(&caller.roles);
    if roles.is_empty() {
        return Err(Refused {
            status: status::PERMISSION_DENIED,
            message: "talos-sso gateway: your certificate carries no role the gateway passes on".into(),
            code: "no_roles",
            rule: None,
        });
    }
    let who = rules::Caller {
        roles: &caller.roles,
        groups: &caller.groups,
    };
    if let Err(refusal) = cluster_gateway.rules.check(method, who) {
        return Err(Refused {
            status: status::PERMISSION_DENIED,
            message: refusal.to_string(),
            code: "gateway_rule",
            rule: Some(refusal.rule),
        });
    }
    let _ = gateway;
    Ok(())
}

/// The roles apid is told: the person's, never `os:impersonator` (which
/// would let the call's metadata choose roles further on).
fn forwarded_roles(roles: &[String]) -> Vec<String> {
    roles.iter().filter(|r| *r != IMPERSONATOR).cloned().collect()
}

/// The client's headers for apid: every `talos-role` the client sent is
/// removed and the person's roles set; hop-by-hop headers and a client's own
/// request id are dropped.
fn upstream_headers(client: &HeaderMap, roles: &[String], request_id: &str) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(client.len() + roles.len() + 1);
    for (name, value) in client {
        let name_text = name.as_str();
        if name_text == TALOS_ROLE
            || name_text == REQUEST_ID
            || HOP_BY_HOP.contains(&name_text)
            || APID_ONLY.contains(&name_text)
        {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    for role in forwarded_roles(roles) {
        if let Ok(value) = HeaderValue::from_str(&role) {
            headers.append(HeaderName::from_static(TALOS_ROLE), value);
        }
    }
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(HeaderName::from_static(REQUEST_ID), value);
    }
    headers
}

/// The nodes a call targets: talosctl's `nodes` metadata (one value per
/// node, or comma-separated), else its `node`.
fn nodes_of(headers: &HeaderMap) -> Vec<String> {
    // As apid's director reads them: each value one node, as written
    // (not split, not trimmed); `nodes` when present, else `node`.
    let read = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    };
    if headers.contains_key("nodes") {
        read("nodes")
    } else {
        read("node")
    }
}

/// `/package.Service/Method`: what grpc-go routes (letters, digits, `_`,
/// and `.` in the service); anything else is no method of apid's.
fn well_formed(method: &str) -> bool {
    let Some((service, name)) = method.strip_prefix('/').and_then(|rest| rest.split_once('/')) else {
        return false;
    };
    let word = |text: &str, extra: &[u8]| {
        !text.is_empty()
            && text.len() <= 128
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || extra.contains(&b))
    };
    word(service, b".") && word(name, b"")
}

fn endpoint_port(endpoint: &str) -> u16 {
    let authority: Option<http::uri::Authority> = endpoint.trim_start_matches("https://").parse().ok();
    authority.and_then(|a| a.port_u16()).unwrap_or(50000)
}

/// An answer of the gateway's own: HTTP 200, the gRPC status in the
/// headers, no body (gRPC's trailers-only form).
fn trailers_only(status: u32, message: &str) -> Response<ReturnBody> {
    let mut response = Response::new(ReturnBody::empty());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.extend(status_headers(status, message));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_s_roles_never_reach_apid() {
        let mut client = HeaderMap::new();
        client.append("talos-role", HeaderValue::from_static("os:admin"));
        client.append("talos-role", HeaderValue::from_static("os:impersonator"));
        client.append("nodes", HeaderValue::from_static("10.5.0.2"));
        client.append("talos-sso-request-id", HeaderValue::from_static("forged"));
        client.append("te", HeaderValue::from_static("trailers"));
        let roles = vec!["os:reader".to_owned(), IMPERSONATOR.to_owned()];
        let headers = upstream_headers(&client, &roles, "abc");
        let sent: Vec<&str> = headers
            .get_all("talos-role")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(sent, ["os:reader"]);
        assert_eq!(headers.get("talos-sso-request-id").unwrap(), "abc");
        assert_eq!(headers.get("nodes").unwrap(), "10.5.0.2");
        assert_eq!(headers.get("te").unwrap(), "trailers");
    }

    #[test]
    fn nodes_are_read_as_apid_reads_them() {
        let mut headers = HeaderMap::new();
        headers.append("node", HeaderValue::from_static("10.5.0.9"));
        assert_eq!(nodes_of(&headers), ["10.5.0.9"]);
        // `nodes` wins, each value one node as written.
        headers.append("nodes", HeaderValue::from_static("10.5.0.2, 10.5.0.3"));
        headers.append("nodes", HeaderValue::from_static("10.5.0.4"));
        assert_eq!(nodes_of(&headers), ["10.5.0.2, 10.5.0.3", "10.5.0.4"]);
    }

    #[test]
    fn a_client_s_proxyfrom_never_reaches_apid() {
        let mut client = HeaderMap::new();
        client.append("proxyfrom", HeaderValue::from_static("10.5.0.1"));
        client.append("nodes", HeaderValue::from_static("10.5.0.99"));
        let headers = upstream_headers(&client, &["os:admin".to_owned()], "abc");
        assert!(headers.get("proxyfrom").is_none());
        assert_eq!(headers.get("nodes").unwrap(), "10.5.0.99");
    }

    #[test]
    fn only_grpc_method_names_are_forwarded() {
        assert!(well_formed("/machine.MachineService/Reboot"));
        assert!(well_formed("/cosi.resource.State/Get"));
        for bad in [
            "/machine.MachineService/Reboot/",
            "//machine.MachineService/Reboot",
            "/machine.MachineService",
            "/machine.MachineService/Re%62oot",
            "/machine.MachineService/Reb oot",
            "*",
            "/a/b/c",
            "/a./",
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }

    #[test]
    fn endpoints_keep_their_port() {
        assert_eq!(endpoint_port("10.5.0.2:50001"), 50001);
        assert_eq!(endpoint_port("10.5.0.2"), 50000);
    }
}
