//! The notes that explain an issuance record's surprising fields.

use time::OffsetDateTime;

/// `later - earlier` as `5m00s` (or `-5m00s`).
fn interval(earlier: OffsetDateTime, later: OffsetDateTime) -> String {
    let seconds = (later - earlier).whole_seconds();
    let sign = if seconds < 0 { "-" } else { "" };
    let seconds = seconds.abs();
    format!("{sign}{}m{:02}s", seconds / 60, seconds % 60)
}

/// The fields of an issuance record that surprise a first reader, with
/// the reason for each (docs/audit.md has them all).
pub fn record_notes(record: &serde_json::Value) -> Vec<String> {
    let time = |field: &str| {
        record[field]
            .as_str()
            .and_then(talos_sso_server::audit::parse_micros)
    };
    let mut notes = Vec::new();
    // A certificate's times are whole seconds: compare them with the
    // second the decision was made in.
    let at = time("occurred_at").map(|at| at.replace_nanosecond(0).unwrap_or(at));
    if let (Some(at), Some(not_before), Some(not_after)) = (at, time("not_before"), time("not_after")) {
        notes.push(format!(
            "not_before is {} before occurred_at: the cluster's `clock_skew` (5m by default), so that a \
             Talos node whose clock is a little behind accepts the certificate at once. not_after is \
             occurred_at + the cluster's `ttl` ({}).",
            interval(not_before, at),
            interval(at, not_after)
        ));
    }
    if let (Some(at), Some(issued)) = (at, time("token_issued_at")) {
        notes.push(format!(
            "token_issued_at is {} before occurred_at although the login was just now: the identity \
             provider backdates a token's `iat` and `nbf` (Entra ID does, by five minutes, and so does \
             its emulator here).",
            interval(issued, at)
        ));
    }
    if let Some(groups) = record["groups_evaluated"].as_array() {
        let groups: Vec<&str> = groups.iter().filter_map(|g| g.as_str()).collect();
        notes.push(format!(
            "groups_evaluated is [{}]: only the person's groups that some rule, `auditors` or `admins` \
             names; their other groups are not kept.",
            groups.join(", ")
        ));
    }
    if record["identity_verified"] == true {
        notes.push(
            "identity_verified is true: subject, username and groups come from a token the server \
             verified (a refused token's claims are kept, marked false)."
                .into(),
        );
    }
    notes.push(
        "prev_hash and hash chain each record to the one before it: `audit verify` checks them.".into(),
    );
    notes
}
