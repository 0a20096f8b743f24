//! `audit_query` and `audit_encoding`.
//!
//! `audit_query`: the input is the query string of `GET /v1/audit`, read
//! as axum reads it (`Query<AuditQuery>`), cleaned as the handler cleans
//! it, then checked by `http::audit::filter`. Properties: nothing panics;
//! an accepted filter is within bounds (cursor, page size, known outcome
//! and event, a method that is a gRPC path or a prefix of one, one node,
//! a known workload kind)
//! and its times have the one text form of a time (they are
//! bound into SQL and compared with stored times); a refusal names a
//! parameter the query has.
//!
//! `audit_encoding`: `arbitrary` turns the input into records, which are
//! normalised and chained as the stores do. Properties: the direct
//! canonical encoding is the general one (`canonical_encoding_by_value`),
//! for the raw records and the cleaned ones; a stored record
//! reads back from its JSON (what `GET /v1/audit` serves) equal, with its
//! hash; the canonical encoding is canonical JSON that decodes to the
//! record, and distinct records encode distinctly; the chain check passes
//! the chain and, for any change to the rows (a field, a sequence number,
//! a hash, a row removed, duplicated or moved), reports the first changed
//! row as broken; arbitrary rows never make it panic.

use arbitrary::{Arbitrary, Unstructured};
use axum::extract::Query;
use axum::http::Uri;
use serde_json::{Map, Value};
use talos_sso_api::audit::{DEFAULT_PAGE, MAX_PAGE, workload};
use talos_sso_api::chain::canonical_encoding_by_value;
use talos_sso_api::{AuditQuery, audit::StoredRecord};
use talos_sso_server::audit::store::{KindFilter, MethodFilter};
use talos_sso_server::audit::{
    AuditRecord, ChainCheck, GENESIS_HASH, RecordExt, canonical_encoding, chain, event, format_micros,
    outcome, parse_micros, record_hash,
};
use talos_sso_server::http::audit::filter;
use talos_sso_text::clean_field;
use time::OffsetDateTime;

pub fn run_query(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(uri) = format!("/v1/audit?{text}").parse::<Uri>() else {
        return;
    };
    let Ok(Query(query)) = Query::<AuditQuery>::try_from_uri(&uri) else {
        return;
    };
    let query = query.map(clean_field);
    let _ = serde_json::json!({"action": "list", "filter": query});
    match filter(&query, crate::now()) {
        Ok(f) => {
            assert!(
                (1..=MAX_PAGE).contains(&f.limit),
                "page size {} out of bounds",
                f.limit
            );
            if query.limit.is_none() {
                assert_eq!(f.limit, DEFAULT_PAGE);
            }
            assert!(f.after_seq >= 0, "negative cursor");
            if let Some(o) = &f.outcome {
                assert!(
                    outcome::ALL.contains(&o.as_str()),
                    "unknown outcome {o:?} accepted"
                );
            }
            if let Some(e) = &f.event {
                assert!(event::ALL.contains(&e.as_str()), "unknown event {e:?} accepted");
            }
            // A method is a gRPC path, or a prefix of one, with no `*` left.
            if let Some(MethodFilter::Exact(m) | MethodFilter::Prefix(m)) = &f.method {
                assert!(m.starts_with('/') && !m.contains('*'), "method {m:?} accepted");
            }
            if let Some(n) = &f.node {
                assert!(
                    !n.is_empty() && !n.contains(|c: char| c == ',' || c.is_whitespace()),
                    "node {n:?} accepted"
                );
            }
            // A kind is one the trail records, `workload` or `person`.
            match &f.kind {
                Some(KindFilter::Workload(k)) => {
                    assert!(workload::KINDS.contains(&k.as_str()), "kind {k:?} accepted")
                }
                Some(KindFilter::AnyWorkload | KindFilter::Person) | None => {}
            }
            for t in [f.since, f.until].into_iter().flatten() {
                let text = format_micros(t);
                assert_eq!(
                    parse_micros(&text),
                    Some(talos_sso_server::audit::truncate_to_micros(t)),
                    "a filter time has no text form: {text}"
                );
            }
        }
        Err((parameter, _)) => {
            let given = serde_json::to_value(&query).unwrap_or_default();
            assert!(
                given.get(parameter).is_some(),
                "refused parameter `{parameter}`, which the query does not have"
            );
        }
    }
}

/// Any instant from year 0 to 9999 (what the one text form of a time can
/// say), any nanosecond, any offset.
fn instant(u: &mut Unstructured<'_>) -> arbitrary::Result<OffsetDateTime> {
    let seconds = u.int_in_range(-62_167_219_200i64..=253_402_300_799)?;
    let nanos = u.int_in_range(0u32..=999_999_999)?;
    let t = OffsetDateTime::from_unix_timestamp(seconds)
        .map_err(|_| arbitrary::Error::IncorrectFormat)?
        .replace_nanosecond(nanos)
        .map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let offset_minutes = u.int_in_range(-1439i32..=1439)?;
    let offset = time::UtcOffset::from_whole_seconds(offset_minutes * 60).unwrap_or(time::UtcOffset::UTC);
    // An offset that would leave the representable range keeps UTC.
    Ok(t.checked_to_offset(offset).unwrap_or(t))
}

fn json(u: &mut Unstructured<'_>, depth: usize) -> arbitrary::Result<Value> {
    let choice = if depth >= 3 {
        u.int_in_range(0..=4)?
    } else {
        u.int_in_range(0..=6)?
    };
    Ok(match choice {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => Value::from(u.arbitrary::<i64>()?),
        3 => serde_json::Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        4 => Value::String(u.arbitrary()?),
        5 => {
            let n = u.int_in_range(0..=4)?;
            Value::Array((0..n).map(|_| json(u, depth + 1)).collect::<Result<_, _>>()?)
        }
        _ => {
            let n = u.int_in_range(0..=4)?;
            let mut map = Map::new();
            for _ in 0..n {
                map.insert(u.arbitrary()?, json(u, depth + 1)?);
            }
            Value::Object(map)
        }
    })
}

fn record(u: &mut Unstructured<'_>) -> arbitrary::Result<AuditRecord> {
    let mut r = AuditRecord::new(
        &String::arbitrary(u)?,
        &String::arbitrary(u)?,
        &String::arbitrary(u)?,
        instant(u)?,
    );
    r.occurred_at = instant(u)?;
    r.reason_code = u.arbitrary()?;
    r.cluster = u.arbitrary()?;
    r.issuer = u.arbitrary()?;
    r.tenant = u.arbitrary()?;
    r.subject = u.arbitrary()?;
    r.username = u.arbitrary()?;
    r.identity_verified = u.arbitrary()?;
    r.groups_evaluated = u.arbitrary()?;
    r.roles_requested = u.arbitrary()?;
    r.roles_granted = u.arbitrary()?;
    r.serial = u.arbitrary()?;
    r.certificate_sha256 = u.arbitrary()?;
    r.public_key_sha256 = u.arbitrary()?;
    r.not_before = if u.arbitrary()? { Some(instant(u)?) } else { None };
    r.not_after = if u.arbitrary()? { Some(instant(u)?) } else { None };
    r.client_ip = u.arbitrary()?;
    r.user_agent = u.arbitrary()?;
    r.client_version = u.arbitrary()?;
    r.token_id = u.arbitrary()?;
    r.token_issued_at = if u.arbitrary()? { Some(instant(u)?) } else { None };
    r.details = json(u, 0)?;
    Ok(r)
}

/// A row as the chain check compares it: what is hashed, and the hashes.
fn row_bytes(row: &StoredRecord) -> (i64, Vec<u8>, String, String) {
    (
        row.seq,
        canonical_encoding(row.seq, &row.record, &row.prev_hash),
        row.prev_hash.clone(),
        row.hash.clone(),
    )
}

fn check(rows: &[StoredRecord]) -> ChainCheck {
    let mut check = ChainCheck::default();
    rows.iter().for_each(|r| check.feed(r));
    check
}

/// One change to a record's content.
fn change_field(u: &mut Unstructured<'_>, r: &mut AuditRecord) -> arbitrary::Result<()> {
    match u.int_in_range(0..=9)? {
        0 => r.request_id = u.arbitrary()?,
        1 => r.event = u.arbitrary()?,
        2 => r.outcome = u.arbitrary()?,
        3 => r.username = u.arbitrary()?,
        4 => r.subject = u.arbitrary()?,
        5 => r.roles_granted = u.arbitrary()?,
        6 => r.identity_verified = !r.identity_verified,
        7 => r.occurred_at = instant(u)?,
        8 => r.not_after = Some(instant(u)?),
        _ => r.details = json(u, 0)?,
    }
    Ok(())
}

pub fn run_encoding(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let count = u.int_in_range(1usize..=6).unwrap_or(1);
    let mut records = Vec::new();
    for _ in 0..count {
        match record(&mut u) {
            Ok(r) => {
                // The direct encoding is the general one, before the
                // record is cleaned too (control characters, any offset).
                let seq = u.arbitrary::<i64>().unwrap_or(1);
                let prev: String = u.arbitrary().unwrap_or_default();
                assert_eq!(
                    canonical_encoding(seq, &r, &prev),
                    canonical_encoding_by_value(seq, &r, &prev),
                    "the direct canonical encoding differs from the general one"
                );
                records.push(r.normalised());
            }
            Err(_) => break,
        }
    }
    if records.is_empty() {
        return;
    }

    let mut rows: Vec<StoredRecord> = Vec::new();
    let (mut seq, mut hash) = (0, GENESIS_HASH.to_owned());
    for record in &records {
        let row = chain(seq, &hash, record.clone());
        seq = row.seq;
        hash = row.hash.clone();
        rows.push(row);
    }

    for row in &rows {
        // What `GET /v1/audit` serves reads back as it was, with its hash.
        let served =
            serde_json::to_string(row).unwrap_or_else(|e| panic!("a record does not serialise: {e}"));
        let back: StoredRecord = serde_json::from_str(&served)
            .unwrap_or_else(|e| panic!("a served record does not read back: {e}\n{served}"));
        assert_eq!(
            row_bytes(&back),
            row_bytes(row),
            "a served record reads back different"
        );
        assert_eq!(record_hash(back.seq, &back.record, &back.prev_hash), back.hash);

        // The canonical encoding is canonical JSON of the record.
        let encoding = canonical_encoding(row.seq, &row.record, &row.prev_hash);
        assert_eq!(
            encoding,
            canonical_encoding_by_value(row.seq, &row.record, &row.prev_hash),
            "the direct canonical encoding differs from the general one"
        );
        let value: Value = serde_json::from_slice(&encoding)
            .unwrap_or_else(|e| panic!("the canonical encoding is not JSON: {e}"));
        assert_eq!(
            serde_json::to_vec(&value).unwrap_or_default(),
            encoding,
            "the canonical encoding is not stable"
        );
        let Value::Object(mut fields) = value else {
            panic!("the canonical encoding is not an object");
        };
        assert_eq!(fields.remove("seq"), Some(Value::from(row.seq)));
        assert_eq!(
            fields.remove("prev_hash"),
            Some(Value::from(row.prev_hash.clone()))
        );
        let decoded: AuditRecord = serde_json::from_value(Value::Object(fields))
            .unwrap_or_else(|e| panic!("the canonical encoding does not decode: {e}"));
        assert_eq!(
            canonical_encoding(row.seq, &decoded, &row.prev_hash),
            encoding,
            "the canonical encoding decodes to another record"
        );
    }
    for (i, a) in records.iter().enumerate() {
        for b in &records[i + 1..] {
            if canonical_encoding(1, a, GENESIS_HASH) == canonical_encoding(1, b, GENESIS_HASH) {
                assert_eq!(
                    serde_json::to_value(a).ok(),
                    serde_json::to_value(b).ok(),
                    "two different records have one encoding"
                );
            }
        }
    }

    let intact = check(&rows);
    assert_eq!(intact.first_broken, None, "a chain just written is broken");
    assert_eq!(intact.verified, rows.len() as u64);
    assert_eq!(intact.last_seq, rows.len() as i64);

    // One change to the rows; the chain check must name the first changed row.
    let mut changed = rows.clone();
    let at = u.int_in_range(0..=rows.len() - 1).unwrap_or(0);
    let mut rehashed = false;
    let applied: arbitrary::Result<()> = (|| {
        match u.int_in_range(0..=7)? {
            0 => change_field(&mut u, &mut changed[at].record)?,
            1 => {
                change_field(&mut u, &mut changed[at].record)?;
                let row = &mut changed[at];
                row.hash = record_hash(row.seq, &row.record, &row.prev_hash);
                rehashed = true;
            }
            2 => changed[at].seq = u.arbitrary()?,
            3 => changed[at].prev_hash = u.arbitrary()?,
            4 => changed[at].hash = u.arbitrary()?,
            5 => {
                changed.remove(at);
            }
            6 => changed.insert(at, rows[at].clone()),
            _ => {
                let to = u.int_in_range(0..=rows.len() - 1)?;
                changed.swap(at, to);
            }
        }
        Ok(())
    })();
    if applied.is_ok() {
        let first = rows
            .iter()
            .map(row_bytes)
            .zip(changed.iter().map(row_bytes))
            .position(|(a, b)| a != b)
            .or_else(|| (rows.len() != changed.len()).then(|| rows.len().min(changed.len())));
        let result = check(&changed);
        match first {
            // A change that changes nothing, or only removes the last row
            // (the chain check cannot see a truncation; the head is kept
            // elsewhere), leaves the chain intact.
            None => assert_eq!(result.first_broken, None),
            Some(first) if first == changed.len() => assert_eq!(result.first_broken, None),
            // A changed row re-hashed by whoever changed it is caught at the
            // next row, whose prev_hash no longer matches.
            Some(first) if rehashed => {
                if first + 1 < changed.len() {
                    assert_eq!(
                        result.verified,
                        first as u64 + 1,
                        "a re-hashed change went unnoticed"
                    );
                } else {
                    assert_eq!(result.first_broken, None);
                }
            }
            Some(first) => {
                assert_eq!(
                    result.verified, first as u64,
                    "the chain check missed a change at row {first}"
                );
                let broken = result
                    .first_broken
                    .unwrap_or_else(|| panic!("a change at row {first} went unnoticed"));
                assert_eq!(broken.seq, changed[first].seq);
            }
        }
    }

    // Arbitrary rows: the check never panics.
    let mut arbitrary_rows = Vec::new();
    while let (Ok(seq), Ok(prev_hash), Ok(hash)) = (
        i64::arbitrary(&mut u),
        String::arbitrary(&mut u),
        String::arbitrary(&mut u),
    ) {
        if u.is_empty() || arbitrary_rows.len() >= 8 {
            break;
        }
        arbitrary_rows.push(StoredRecord {
            seq,
            record: records[arbitrary_rows.len() % records.len()].clone(),
            prev_hash,
            hash,
        });
    }
    let _ = check(&arbitrary_rows);
}
