-- The audit trail: one row per decision (certificate issued or denied,
-- break-glass), hash-chained by the server (server/src/audit/mod.rs
-- documents the canonical encoding). seq is assigned by the writer while it
-- holds an advisory lock, so several replicas extend one chain.
CREATE TABLE audit_events (
    seq                 BIGINT PRIMARY KEY,
    occurred_at         TIMESTAMPTZ NOT NULL,
    request_id          TEXT NOT NULL,
    event               TEXT NOT NULL,
    outcome             TEXT NOT NULL,
    reason_code         TEXT,
    cluster             TEXT,
    issuer              TEXT,
    tenant              TEXT,
    subject             TEXT,
    username            TEXT,
    identity_verified   BOOLEAN NOT NULL,
    groups_evaluated    TEXT[] NOT NULL,
    roles_requested     TEXT[] NOT NULL,
    roles_granted       TEXT[] NOT NULL,
    serial              TEXT,
    certificate_sha256  TEXT,
    public_key_sha256   TEXT,
    not_before          TIMESTAMPTZ,
    not_after           TIMESTAMPTZ,
    client_ip           TEXT,
    user_agent          TEXT,
    client_version      TEXT,
    token_id            TEXT,
    token_issued_at     TIMESTAMPTZ,
    details             JSONB NOT NULL,
    prev_hash           TEXT NOT NULL,
    hash                TEXT NOT NULL
);

-- The questions the security team asks: by time, by person, by certificate.
CREATE INDEX audit_events_occurred_at ON audit_events (occurred_at);
CREATE INDEX audit_events_username ON audit_events (username, occurred_at);
CREATE INDEX audit_events_subject ON audit_events (subject, occurred_at);
CREATE INDEX audit_events_serial ON audit_events (serial) WHERE serial IS NOT NULL;

-- Append-only is enforced by the database, not promised by the application:
-- UPDATE, DELETE and TRUNCATE fail for every role, the server's included. A
-- superuser can still disable the trigger; the hash chain is what shows it.
CREATE FUNCTION audit_events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_events is append-only: % refused', TG_OP;
END
$$;

CREATE TRIGGER audit_events_append_only
    BEFORE UPDATE OR DELETE ON audit_events
    FOR EACH ROW EXECUTE FUNCTION audit_events_refuse_change();

CREATE TRIGGER audit_events_no_truncate
    BEFORE TRUNCATE ON audit_events
    FOR EACH STATEMENT EXECUTE FUNCTION audit_events_refuse_change();

-- The replay guard: a token id (uti/jti, or a hash of the token) may mint one
-- certificate. Claimed in the same transaction as the audit row, so the
-- guard holds across replicas.
CREATE TABLE used_tokens (
    token_id    TEXT PRIMARY KEY,
    used_at     TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ
);

-- For people who prefer psql: who received which certificate, when.
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

-- The server needs no more than this at run time (migrations run as the
-- owner):
--   CREATE ROLE talos_sso_app LOGIN;
--   GRANT SELECT, INSERT ON audit_events, used_tokens TO talos_sso_app;
--   GRANT SELECT ON issued_certificates, denied_requests TO talos_sso_app;
