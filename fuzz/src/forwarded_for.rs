//! `forwarded_for`: the client address behind trusted proxies
//! (`http::client_address`, `http::forwarded_address`).
//!
//! Input lines: the peer address, the trusted proxies (comma-separated
//! addresses or CIDRs; unreadable ones skipped), then one `X-Forwarded-For`
//! header line each (bytes; lines a header cannot hold are skipped).
//!
//! Properties: nothing panics; the answer is a canonical address (an
//! IPv4-mapped IPv6 address is its IPv4 address); an untrusted peer is the
//! client; otherwise the client is the peer or an entry of the headers, and
//! every hop to the right of that entry, and the peer, is a trusted proxy.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderValue};
use talos_sso_server::http::{client_address, forwarded_address};

pub fn run(data: &[u8]) {
    let mut lines = data.split(|b| *b == b'\n');
    let peer_text = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let Some(peer) = forwarded_address(&peer_text) else {
        return;
    };
    let trusted: Vec<ipnet::IpNet> = String::from_utf8_lossy(lines.next().unwrap_or_default())
        .split(',')
        .filter_map(|t| {
            let t = t.trim();
            t.parse::<ipnet::IpNet>()
                .ok()
                .or_else(|| t.parse::<IpAddr>().ok().map(ipnet::IpNet::from))
        })
        .collect();
    let mut headers = HeaderMap::new();
    for line in lines {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append("x-forwarded-for", value);
        }
    }

    // Each entry as the walk reads it: `None` for one that is unreadable.
    let entries: Vec<Option<IpAddr>> = headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|line| line.as_bytes().split(|b| *b == b','))
        .map(|entry| std::str::from_utf8(entry).ok().and_then(forwarded_address))
        .collect();
    for ip in entries.iter().flatten() {
        assert_eq!(*ip, ip.to_canonical(), "an entry is not canonical");
    }

    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    let client = client_address(&trusted, peer, &headers);
    assert_eq!(
        client,
        client.to_canonical(),
        "the client address is not canonical"
    );
    let peer = peer.to_canonical();
    if !is_trusted(&peer) {
        assert_eq!(client, peer, "an untrusted peer's header was believed");
        return;
    }
    if client == peer {
        return;
    }
    // The rightmost entry that is the client, with every hop right of it
    // readable and trusted.
    let position = entries.iter().rposition(|e| *e == Some(client));
    let Some(position) = position else {
        panic!("the client {client} is neither the peer nor an entry");
    };
    let right = &entries[position + 1..];
    assert!(
        right.iter().all(|e| e.as_ref().is_some_and(is_trusted)),
        "the client {client} is left of an untrusted or unreadable hop"
    );
}
