-- Views for people who read the trail with psql (docs/audit.md, "SQL"),
-- and the indexes the audit queries need on a large trail. The views pick
-- the columns each question needs and lift the facts an event keeps in
-- `details` into columns of their own; they add no rows and hide none.
-- SQLite has the same views with the same column names (lists and details
-- are JSON text there).

-- Every certificate signed: through the API, and break-glass on the
-- server host (then `identity_verified` is false and `break_glass_*` say
-- who ran it and why). One whose seq appears in audit_undelivered never
-- left the server.
CREATE VIEW audit_issued AS
    SELECT seq, occurred_at, event, cluster, username, subject, identity_verified,
           roles_granted, roles_requested, serial, certificate_sha256, public_key_sha256,
           not_before, not_after, client_ip, user_agent, client_version, request_id,
           details->>'operator' AS break_glass_operator,
           details->>'reason' AS break_glass_reason
    FROM audit_events
    WHERE event IN ('certificate.issued', 'break_glass.issued');

-- Every refusal, whatever was refused. `attempts` is how many refusals the
-- row stands for: 1, or for refusals.aggregated the number it counted.
-- `requested_cluster` is a cluster name that was not configured.
CREATE VIEW audit_denied AS
    SELECT seq, occurred_at, event, reason_code,
           CASE WHEN event = 'refusals.aggregated' AND jsonb_typeof(details->'count') = 'number'
                THEN (details->>'count')::bigint ELSE 1 END AS attempts,
           cluster, details->>'requested_cluster' AS requested_cluster,
           username, subject, identity_verified, roles_requested, client_ip, user_agent, request_id
    FROM audit_events
    WHERE outcome = 'denied';

-- The deny list's history: who blocked or unblocked whom, and why. A
-- refused attempt has outcome `denied` and its reason_code.
CREATE VIEW audit_deny_changes AS
    SELECT seq, occurred_at, event, outcome, reason_code,
           username AS admin_username, subject AS admin_subject,
           details->>'target_subject' AS target_subject,
           details->>'target_username' AS target_username,
           details->>'reason' AS reason,
           (details->>'entries_changed')::bigint AS entries_changed,
           client_ip, request_id
    FROM audit_events
    WHERE event IN ('deny.added', 'deny.removed');

-- Readings of the trail through the API: who looked, at what (`filter`
-- holds the query parameters as sent), and who tried and was refused.
CREATE VIEW audit_reads AS
    SELECT seq, occurred_at, outcome, reason_code, username, subject,
           details->>'action' AS action, details->'filter' AS filter,
           client_ip, request_id
    FROM audit_events
    WHERE event = 'audit.query';

-- Certificates that were signed and recorded but never left the server
-- (the commit's answer was lost); `recorded_seq` is their audit_issued row.
CREATE VIEW audit_undelivered AS
    SELECT seq, occurred_at, (details->>'recorded_seq')::bigint AS recorded_seq,
           details->>'recorded_event' AS recorded_event, details->>'reason' AS reason,
           cluster, username, subject, serial, certificate_sha256, request_id
    FROM audit_events
    WHERE event = 'certificate.undelivered';

-- Break-glass certificates, with what the command knew of who ran it
-- (`claimed_user` is recorded, never believed).
CREATE VIEW audit_break_glass AS
    SELECT seq, occurred_at, cluster, username, details->>'operator' AS operator,
           (details->>'login_uid')::bigint AS login_uid, details->>'claimed_user' AS claimed_user,
           details->>'host' AS host, details->>'reason' AS reason,
           (details->>'ttl_seconds')::bigint AS ttl_seconds,
           roles_granted, serial, not_before, not_after, request_id
    FROM audit_events
    WHERE event = 'break_glass.issued';

-- Measured on a million records (docs/audit.md, "SQL"), each index for a
-- query that read most of the table without it, and no more: every index
-- is written by every issuance.
--
-- A role, granted or requested (`--role`, and the views' role questions):
-- the store asks `(roles_granted || roles_requested) @> ARRAY[role]`.
CREATE INDEX audit_events_roles ON audit_events USING gin ((roles_granted || roles_requested));
-- One event over a period (`--event`, and every view); with `seq`, so
-- that a page of a frequent event over a long window is found in the
-- index alone before its records are read.
CREATE INDEX audit_events_event ON audit_events (event, occurred_at, seq);
