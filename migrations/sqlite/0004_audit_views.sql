-- Views for people who read the trail with sqlite3 (docs/audit.md, "SQL"),
-- and the indexes the audit queries need on a large trail: the same views
-- and column names as the Postgres schema, which says what each is for.
-- Lists, `filter` and details are JSON text here, times RFC 3339 text.

CREATE VIEW audit_issued AS
    SELECT seq, occurred_at, event, cluster, username, subject, identity_verified,
           roles_granted, roles_requested, serial, certificate_sha256, public_key_sha256,
           not_before, not_after, client_ip, user_agent, client_version, request_id,
           json_extract(details, '$.operator') AS break_glass_operator,
           json_extract(details, '$.reason') AS break_glass_reason
    FROM audit_events
    WHERE event IN ('certificate.issued', 'break_glass.issued');

CREATE VIEW audit_denied AS
    SELECT seq, occurred_at, event, reason_code,
           CASE WHEN event = 'refusals.aggregated' AND json_type(details, '$.count') = 'integer'
                THEN json_extract(details, '$.count') ELSE 1 END AS attempts,
           cluster, json_extract(details, '$.requested_cluster') AS requested_cluster,
           username, subject, identity_verified, roles_requested, client_ip, user_agent, request_id
    FROM audit_events
    WHERE outcome = 'denied';

CREATE VIEW audit_deny_changes AS
    SELECT seq, occurred_at, event, outcome, reason_code,
           username AS admin_username, subject AS admin_subject,
           json_extract(details, '$.target_subject') AS target_subject,
           json_extract(details, '$.target_username') AS target_username,
           json_extract(details, '$.reason') AS reason,
           json_extract(details, '$.entries_changed') AS entries_changed,
           client_ip, request_id
    FROM audit_events
    WHERE event IN ('deny.added', 'deny.removed');

CREATE VIEW audit_reads AS
    SELECT seq, occurred_at, outcome, reason_code, username, subject,
           json_extract(details, '$.action') AS action, json_extract(details, '$.filter') AS filter,
           client_ip, request_id
    FROM audit_events
    WHERE event = 'audit.query';

CREATE VIEW audit_undelivered AS
    SELECT seq, occurred_at, json_extract(details, '$.recorded_seq') AS recorded_seq,
           json_extract(details, '$.recorded_event') AS recorded_event,
           json_extract(details, '$.reason') AS reason,
           cluster, username, subject, serial, certificate_sha256, request_id
    FROM audit_events
    WHERE event = 'certificate.undelivered';

CREATE VIEW audit_break_glass AS
    SELECT seq, occurred_at, cluster, username, json_extract(details, '$.operator') AS operator,
           json_extract(details, '$.login_uid') AS login_uid,
           json_extract(details, '$.claimed_user') AS claimed_user,
           json_extract(details, '$.host') AS host, json_extract(details, '$.reason') AS reason,
           json_extract(details, '$.ttl_seconds') AS ttl_seconds,
           roles_granted, serial, not_before, not_after, request_id
    FROM audit_events
    WHERE event = 'break_glass.issued';

-- Measured on a million records (docs/audit.md, "SQL"). The Postgres
-- schema has had a subject index from the start. No index can serve a
-- role in a JSON list: the store's role filter reads the rows its other
-- conditions leave.
CREATE INDEX audit_events_subject ON audit_events (subject, occurred_at);
CREATE INDEX audit_events_event ON audit_events (event, occurred_at);
