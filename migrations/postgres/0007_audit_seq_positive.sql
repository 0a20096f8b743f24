-- The hash chain starts at seq 1 and `audit verify` reads from there, so a
-- row at seq 0 or below is outside the chain: no server writes one, and
-- nothing vouches for it. Until now the table took one from anyone who may
-- insert (the server's runtime role included), and the reads that did not
-- start from the chain (a username resolved to a subject for the deny
-- list, the console's charts, these views) used it: a row at seq -1 could
-- tie a username to a made-up subject while the trail verified intact.
--
-- The constraint refuses such rows for every role, the runtime role's
-- INSERT included; only the table's owner could drop it, as it could the
-- append-only triggers. Adding it reads the whole table under an exclusive
-- lock (writes wait for it) and fails on a row already there; the server
-- looks for such rows before it migrates and, finding one, refuses with
-- each named instead (docs/operations.md, "Rows outside the chain").
--
-- This keeps out rows below the chain, nothing more: a record the runtime
-- role appends after the head, with the right hashes, is in the chain and
-- verifies like the server's own (docs/security.md).
ALTER TABLE audit_events ADD CONSTRAINT audit_events_seq_in_chain CHECK (seq > 0);

-- Every view keeps to the rows of the chain with the test the server's
-- queries of records use (`seq > 0`, server/src/audit/store/mod.rs,
-- `chain_rows!`): with the constraint no other row can be there, and a
-- view says so itself. The columns are those of 0001 and 0004, unchanged:
-- CREATE OR REPLACE keeps each view's grants (the runtime role's SELECT).
CREATE OR REPLACE VIEW issued_certificates AS
    SELECT seq, occurred_at, cluster, username, subject, roles_granted, serial,
           not_before, not_after, client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND event IN ('certificate.issued', 'break_glass.issued');

CREATE OR REPLACE VIEW denied_requests AS
    SELECT seq, occurred_at, cluster, username, subject, identity_verified,
           reason_code, roles_requested, client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND outcome = 'denied';

CREATE OR REPLACE VIEW audit_issued AS
    SELECT seq, occurred_at, event, cluster, username, subject, identity_verified,
           roles_granted, roles_requested, serial, certificate_sha256, public_key_sha256,
           not_before, not_after, client_ip, user_agent, client_version, request_id,
           details->>'operator' AS break_glass_operator,
           details->>'reason' AS break_glass_reason
    FROM audit_events
    WHERE seq > 0 AND event IN ('certificate.issued', 'break_glass.issued');

CREATE OR REPLACE VIEW audit_denied AS
    SELECT seq, occurred_at, event, reason_code,
           CASE WHEN event = 'refusals.aggregated' AND jsonb_typeof(details->'count') = 'number'
                THEN (details->>'count')::bigint ELSE 1 END AS attempts,
           cluster, details->>'requested_cluster' AS requested_cluster,
           username, subject, identity_verified, roles_requested, client_ip, user_agent, request_id
    FROM audit_events
    WHERE seq > 0 AND outcome = 'denied';

CREATE OR REPLACE VIEW audit_deny_changes AS
    SELECT seq, occurred_at, event, outcome, reason_code,
           username AS admin_username, subject AS admin_subject,
           details->>'target_subject' AS target_subject,
           details->>'target_username' AS target_username,
           details->>'reason' AS reason,
           (details->>'entries_changed')::bigint AS entries_changed,
           client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND event IN ('deny.added', 'deny.removed');

CREATE OR REPLACE VIEW audit_reads AS
    SELECT seq, occurred_at, outcome, reason_code, username, subject,
           details->>'action' AS action, details->'filter' AS filter,
           client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND event = 'audit.query';

CREATE OR REPLACE VIEW audit_undelivered AS
    SELECT seq, occurred_at, (details->>'recorded_seq')::bigint AS recorded_seq,
           details->>'recorded_event' AS recorded_event, details->>'reason' AS reason,
           cluster, username, subject, serial, certificate_sha256, request_id
    FROM audit_events
    WHERE seq > 0 AND event = 'certificate.undelivered';

CREATE OR REPLACE VIEW audit_break_glass AS
    SELECT seq, occurred_at, cluster, username, details->>'operator' AS operator,
           (details->>'login_uid')::bigint AS login_uid, details->>'claimed_user' AS claimed_user,
           details->>'host' AS host, details->>'reason' AS reason,
           (details->>'ttl_seconds')::bigint AS ttl_seconds,
           roles_granted, serial, not_before, not_after, request_id
    FROM audit_events
    WHERE seq > 0 AND event = 'break_glass.issued';
