-- The hash chain starts at seq 1 and `audit verify` reads from there, so a
-- row at seq 0 or below is outside the chain (see the Postgres schema):
-- refused from now on, and kept out of every view. This keeps out rows
-- below the chain, nothing more: a record appended after the head, with
-- the right hashes, is in the chain and verifies like the server's own.
--
-- SQLite cannot add a CHECK to an existing table, so a trigger refuses the
-- row instead of rebuilding the table: a rebuild copies the whole trail
-- (and the file twice over meanwhile) and must recreate every trigger, index and view on it, the append-only ones
-- included, when this trigger adds one check to each insert and leaves the
-- rest as it is. It guards what a CHECK would (a trigger can be dropped by
-- whoever may write the file, as the append-only ones can; the chain is
-- what shows their work). The test is that seq is an integer above 0: the
-- column's affinity has made an integer of any number given as text, and
-- a row inserted without a seq (SQLite would pick one) is refused too,
-- since the server names every record's.
CREATE TRIGGER audit_events_seq_in_chain BEFORE INSERT ON audit_events
WHEN NOT (typeof(NEW.seq) = 'integer' AND NEW.seq > 0)
BEGIN
    SELECT RAISE(ABORT, 'audit_events: seq must be above 0 (the chain starts at 1)');
END;

-- A trigger checks only what is inserted after it: a row already outside
-- the chain fails this migration here, as the Postgres constraint does (the
-- server looks first and names each; docs/operations.md, "Rows outside the
-- chain").
CREATE TEMP TABLE audit_events_outside_chain (seq INTEGER CHECK (seq > 0));
INSERT INTO audit_events_outside_chain SELECT seq FROM audit_events WHERE seq <= 0;
DROP TABLE audit_events_outside_chain;

-- Every view keeps to the rows of the chain with the test the server's
-- queries of records use (server/src/audit/store/mod.rs, `chain_rows!`). It
-- is written `+seq > 0`: the unary `+` keeps it from SQLite's indexes,
-- which otherwise seek from this bound rather than from a query's own, so
-- that `SELECT * FROM audit_issued WHERE seq > N` would read the view from
-- seq 1, and a count could lose its covering index. The columns are those
-- of 0001 and 0004, unchanged.
DROP VIEW issued_certificates;
CREATE VIEW issued_certificates AS
    SELECT seq, occurred_at, cluster, username, subject, roles_granted, serial,
           not_before, not_after, client_ip, request_id
    FROM audit_events
    WHERE +seq > 0 AND event IN ('certificate.issued', 'break_glass.issued');

DROP VIEW denied_requests;
CREATE VIEW denied_requests AS
    SELECT seq, occurred_at, cluster, username, subject, identity_verified,
           reason_code, roles_requested, client_ip, request_id
    FROM audit_events
    WHERE +seq > 0 AND outcome = 'denied';

DROP VIEW audit_issued;
CREATE VIEW audit_issued AS
    SELECT seq, occurred_at, event, cluster, username, subject, identity_verified,
           roles_granted, roles_requested, serial, certificate_sha256, public_key_sha256,
           not_before, not_after, client_ip, user_agent, client_version, request_id,
           json_extract(details, '$.operator') AS break_glass_operator,
           json_extract(details, '$.reason') AS break_glass_reason
    FROM audit_events
    WHERE +seq > 0 AND event IN ('certificate.issued', 'break_glass.issued');

DROP VIEW audit_denied;
CREATE VIEW audit_denied AS
    SELECT seq, occurred_at, event, reason_code,
           CASE WHEN event = 'refusals.aggregated' AND json_type(details, '$.count') = 'integer'
                THEN json_extract(details, '$.count') ELSE 1 END AS attempts,
           cluster, json_extract(details, '$.requested_cluster') AS requested_cluster,
           username, subject, identity_verified, roles_requested, client_ip, user_agent, request_id
    FROM audit_events
    WHERE +seq > 0 AND outcome = 'denied';

DROP VIEW audit_deny_changes;
CREATE VIEW audit_deny_changes AS
    SELECT seq, occurred_at, event, outcome, reason_code,
           username AS admin_username, subject AS admin_subject,
           json_extract(details, '$.target_subject') AS target_subject,
           json_extract(details, '$.target_username') AS target_username,
           json_extract(details, '$.reason') AS reason,
           json_extract(details, '$.entries_changed') AS entries_changed,
           client_ip, request_id
    FROM audit_events
    WHERE +seq > 0 AND event IN ('deny.added', 'deny.removed');

DROP VIEW audit_reads;
CREATE VIEW audit_reads AS
    SELECT seq, occurred_at, outcome, reason_code, username, subject,
           json_extract(details, '$.action') AS action, json_extract(details, '$.filter') AS filter,
           client_ip, request_id
    FROM audit_events
    WHERE +seq > 0 AND event = 'audit.query';

DROP VIEW audit_undelivered;
CREATE VIEW audit_undelivered AS
    SELECT seq, occurred_at, json_extract(details, '$.recorded_seq') AS recorded_seq,
           json_extract(details, '$.recorded_event') AS recorded_event,
           json_extract(details, '$.reason') AS reason,
           cluster, username, subject, serial, certificate_sha256, request_id
    FROM audit_events
    WHERE +seq > 0 AND event = 'certificate.undelivered';

DROP VIEW audit_break_glass;
CREATE VIEW audit_break_glass AS
    SELECT seq, occurred_at, cluster, username, json_extract(details, '$.operator') AS operator,
           json_extract(details, '$.login_uid') AS login_uid,
           json_extract(details, '$.claimed_user') AS claimed_user,
           json_extract(details, '$.host') AS host, json_extract(details, '$.reason') AS reason,
           json_extract(details, '$.ttl_seconds') AS ttl_seconds,
           roles_granted, serial, not_before, not_after, request_id
    FROM audit_events
    WHERE +seq > 0 AND event = 'break_glass.issued';
