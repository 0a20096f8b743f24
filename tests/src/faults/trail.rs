//! The audit trail after a fault, checked against what the load's
//! clients saw.

use std::collections::HashMap;

use talos_sso_server::audit::StoredRecord;
use talos_sso_server::audit::store::{AuditStore, StoreOptions};

use super::load::Attempt;

/// What the trail says about the certificates of a load.
#[derive(Debug, Default)]
pub struct TrailCheck {
    pub records: usize,
    /// `certificate.issued` rows.
    pub issued_rows: usize,
    /// Certificates the clients received, each matched to its one row.
    pub delivered: usize,
    /// Rows naming a certificate whose answer never reached its client,
    /// with what that client saw (the server died after the commit, or
    /// the commit's answer was lost).
    pub recorded_not_delivered: Vec<(String, String)>,
    /// Broken invariants; empty when the trail is right.
    pub problems: Vec<String>,
}

async fn all_records(store: &AuditStore) -> Result<Vec<StoredRecord>, String> {
    let mut out: Vec<StoredRecord> = Vec::new();
    loop {
        let after = out.last().map_or(0, |r| r.seq);
        let page = store.page(after, 1000).await.map_err(|e| e.to_string())?;
        if page.is_empty() {
            return Ok(out);
        }
        out.extend(page);
    }
}

/// Every certificate a client received has exactly one `certificate.issued`
/// row naming it (serial, certificate and key fingerprints); every such row
/// belongs to a request of the load; no serial appears twice.
pub async fn check_trail(database_url: &str, attempts: &[Attempt]) -> Result<TrailCheck, String> {
    let store = AuditStore::connect(database_url, &StoreOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    let records = all_records(&store).await?;
    store.close().await;
    let mut check = TrailCheck {
        records: records.len(),
        ..Default::default()
    };
    let issued: Vec<&StoredRecord> = records
        .iter()
        .filter(|r| r.record.event == "certificate.issued")
        .collect();
    check.issued_rows = issued.len();
    let mut by_serial: HashMap<&str, Vec<&StoredRecord>> = HashMap::new();
    for row in &issued {
        by_serial
            .entry(row.record.serial.as_deref().unwrap_or_default())
            .or_default()
            .push(row);
    }
    let by_key: HashMap<&str, &Attempt> = attempts
        .iter()
        .map(|a| (a.public_key_sha256.as_str(), a))
        .collect();
    for attempt in attempts.iter().filter(|a| a.issued()) {
        let serial = attempt.serial.as_deref().unwrap_or_default();
        match by_serial.get(serial).map(Vec::as_slice) {
            Some([row]) => {
                let r = &row.record;
                if r.outcome != "success"
                    || r.certificate_sha256 != attempt.certificate_sha256
                    || r.public_key_sha256.as_deref() != Some(attempt.public_key_sha256.as_str())
                {
                    check.problems.push(format!(
                        "serial {serial}: the row names another certificate or key"
                    ));
                } else {
                    check.delivered += 1;
                }
            }
            Some(rows) => check.problems.push(format!(
                "serial {serial} received once, recorded {} times",
                rows.len()
            )),
            None => check
                .problems
                .push(format!("serial {serial} was received without an audit row")),
        }
    }
    for row in &issued {
        let key = row.record.public_key_sha256.as_deref().unwrap_or_default();
        match by_key.get(key) {
            Some(attempt) if attempt.issued() => {}
            Some(attempt) => check
                .recorded_not_delivered
                .push((row.record.serial.clone().unwrap_or_default(), attempt.label())),
            None => check
                .problems
                .push(format!("seq {}: an issued row for a key no client sent", row.seq)),
        }
    }
    Ok(check)
}
