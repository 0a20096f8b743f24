-- The audit trail for single-node installations: the same fields as the
-- Postgres schema, times as RFC 3339 text with microseconds, lists as JSON
-- arrays, details as JSON text.
CREATE TABLE audit_events (
    seq                 INTEGER PRIMARY KEY,
    occurred_at         TEXT NOT NULL,
    request_id          TEXT NOT NULL,
    event               TEXT NOT NULL,
    outcome             TEXT NOT NULL,
    reason_code         TEXT,
    cluster             TEXT,
    issuer              TEXT,
    tenant              TEXT,
    subject             TEXT,
    username            TEXT,
    identity_verified   INTEGER NOT NULL,
    groups_evaluated    TEXT NOT NULL,
    roles_requested     TEXT NOT NULL,
    roles_granted       TEXT NOT NULL,
    serial              TEXT,
    certificate_sha256  TEXT,
    public_key_sha256   TEXT,
    not_before          TEXT,
    not_after           TEXT,
    client_ip           TEXT,
    user_agent          TEXT,
    client_version      TEXT,
    token_id            TEXT,
    token_issued_at     TEXT,
    details             TEXT NOT NULL,
    prev_hash           TEXT NOT NULL,
    hash                TEXT NOT NULL
);

CREATE INDEX audit_events_occurred_at ON audit_events (occurred_at);
CREATE INDEX audit_events_username ON audit_events (username, occurred_at);
CREATE INDEX audit_events_serial ON audit_events (serial);

-- Append-only, enforced by the database.
CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit_events is append-only: UPDATE refused');
END;

CREATE TRIGGER audit_events_no_delete BEFORE DELETE ON audit_events
BEGIN
    SELECT RAISE(ABORT, 'audit_events is append-only: DELETE refused');
END;

-- The replay guard (see the Postgres schema).
CREATE TABLE used_tokens (
    token_id    TEXT PRIMARY KEY,
    used_at     TEXT NOT NULL,
    expires_at  TEXT
);

CREATE VIEW issued_certificates AS
    SELECT seq, occurred_at, cluster, username, subject, roles_granted, serial,
           not_before, not_after, client_ip, request_id
    FROM audit_events
    WHERE event IN ('certificate.issued', 'break_glass.issued');

CREATE VIEW denied_requests AS
    SELECT seq, occurred_at, cluster, username, subject, identity_verified,
           reason_code, roles_requested, client_ip, request_id
    FROM audit_events
    WHERE outcome = 'denied';
