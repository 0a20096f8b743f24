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
-- schema has had a subject index from the start.
CREATE INDEX audit_events_subject ON audit_events (subject, occurred_at);
CREATE INDEX audit_events_event ON audit_events (event, occurred_at);

-- The roles of each record (granted or requested), one row per record
-- and role: no SQLite index can hold the members of a JSON list, and the
-- store's role filter tested every record of a long window without one.
-- Derived data, kept by the triggers below from the records themselves:
-- neither the hash chain nor `audit verify` reads it, and it can always be
-- rebuilt from `audit_events`. Its primary key is the index the filter
-- reads: a role's records in `seq` order.
CREATE TABLE audit_event_roles (
    seq     INTEGER NOT NULL,
    role    TEXT NOT NULL,
    PRIMARY KEY (role, seq)
) WITHOUT ROWID;

-- A role both granted and requested is one row (UNION). A list that is
-- not JSON (the store writes none, and cannot read a record holding one)
-- gives no roles rather than an error.
INSERT INTO audit_event_roles (seq, role)
    SELECT seq, value FROM audit_events,
        json_each(CASE WHEN json_valid(roles_granted) THEN roles_granted ELSE '[]' END)
    UNION
    SELECT seq, value FROM audit_events,
        json_each(CASE WHEN json_valid(roles_requested) THEN roles_requested ELSE '[]' END);

CREATE TRIGGER audit_events_roles_on_insert AFTER INSERT ON audit_events
BEGIN
    INSERT INTO audit_event_roles (seq, role)
        SELECT NEW.seq, value
            FROM json_each(CASE WHEN json_valid(NEW.roles_granted) THEN NEW.roles_granted ELSE '[]' END)
        UNION
        SELECT NEW.seq, value
            FROM json_each(CASE WHEN json_valid(NEW.roles_requested) THEN NEW.roles_requested ELSE '[]' END);
END;

-- The table says what the records say, no more and no less: a row is
-- accepted only when its record lists the role, refused when changed, and
-- refused when removed while its record still lists the role. The filter
-- cannot be made to find, or to miss, a record this way.
CREATE TRIGGER audit_event_roles_no_update BEFORE UPDATE ON audit_event_roles
BEGIN
    SELECT RAISE(ABORT, 'audit_event_roles is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_event_roles_no_delete BEFORE DELETE ON audit_event_roles
WHEN EXISTS (
    SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_granted) THEN roles_granted ELSE '[]' END)
        WHERE audit_events.seq = OLD.seq AND value = OLD.role
    UNION ALL
    SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_requested) THEN roles_requested ELSE '[]' END)
        WHERE audit_events.seq = OLD.seq AND value = OLD.role)
BEGIN
    SELECT RAISE(ABORT, 'audit_event_roles is append-only: DELETE refused');
END;

CREATE TRIGGER audit_event_roles_only_listed BEFORE INSERT ON audit_event_roles
WHEN NOT EXISTS (
    SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_granted) THEN roles_granted ELSE '[]' END)
        WHERE audit_events.seq = NEW.seq AND value = NEW.role
    UNION ALL
    SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_requested) THEN roles_requested ELSE '[]' END)
        WHERE audit_events.seq = NEW.seq AND value = NEW.role)
BEGIN
    SELECT RAISE(ABORT, 'audit_event_roles holds only the roles of audit_events');
END;

-- Records change or go only when their owner has removed the append-only
-- triggers (which the chain then shows); the roles follow them, so that a
-- record appended again at a removed `seq` is not refused for its roles.
CREATE TRIGGER audit_events_roles_on_delete AFTER DELETE ON audit_events
BEGIN
    DELETE FROM audit_event_roles WHERE seq = OLD.seq;
END;

CREATE TRIGGER audit_events_roles_on_update AFTER UPDATE OF seq, roles_granted, roles_requested ON audit_events
BEGIN
    DELETE FROM audit_event_roles
        WHERE seq IN (OLD.seq, NEW.seq) AND NOT EXISTS (
            SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_granted) THEN roles_granted ELSE '[]' END)
                WHERE audit_events.seq = audit_event_roles.seq AND value = audit_event_roles.role
            UNION ALL
            SELECT 1 FROM audit_events, json_each(CASE WHEN json_valid(roles_requested) THEN roles_requested ELSE '[]' END)
                WHERE audit_events.seq = audit_event_roles.seq AND value = audit_event_roles.role);
    INSERT OR IGNORE INTO audit_event_roles (seq, role)
        SELECT NEW.seq, value
            FROM json_each(CASE WHEN json_valid(NEW.roles_granted) THEN NEW.roles_granted ELSE '[]' END)
        UNION
        SELECT NEW.seq, value
            FROM json_each(CASE WHEN json_valid(NEW.roles_requested) THEN NEW.roles_requested ELSE '[]' END);
END;
