-- The web console's state, shared by every replica: any replica serves
-- any request of a session, and a restart signs nobody out. Nothing here
-- is a secret in clear: each id is the SHA-256 (hex) of the random id the
-- browser's cookie holds; a login's `state`, `nonce` and PKCE verifier are
-- derived from its id by the server, so they are not stored at all; a
-- form's CSRF token is derived from the session's id likewise. Times are
-- milliseconds since the Unix epoch, as the server's clock says.

-- Sessions: at most `console.max_sessions`, 5 per person; ended after
-- `console.session_idle` without a request and `console.session_lifetime`
-- after login (the server deletes them when it meets them, and sweeps the
-- expired ones whenever it opens a session).
CREATE TABLE console_sessions (
    id_hash      TEXT PRIMARY KEY CHECK (length(id_hash) = 64),
    -- Who: the person's qualified subject (the cap per person counts
    -- them), and what the verified ID token said that the console decides
    -- on (issuer, tenant, username, groups, app roles, token id and time),
    -- as JSON.
    subject      TEXT NOT NULL,
    identity     TEXT NOT NULL,
    started_ms   INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL
);
CREATE INDEX console_sessions_subject ON console_sessions (subject, last_seen_ms);
CREATE INDEX console_sessions_last_seen ON console_sessions (last_seen_ms);

-- The views a session recorded in the trail (once per session and view):
-- a hash of each, keyed by the session's id, at most 4,096 per session
-- (the oldest, lowest `ordinal`, goes first). Gone with their session.
CREATE TABLE console_views (
    session_hash TEXT NOT NULL REFERENCES console_sessions (id_hash) ON DELETE CASCADE,
    view_hash    TEXT NOT NULL,
    ordinal      INTEGER NOT NULL,
    PRIMARY KEY (session_hash, view_hash)
);
CREATE INDEX console_views_ordinal ON console_views (session_hash, ordinal);

-- Logins in progress: at most `console.max_sessions`, 16 per client
-- address (`address` is empty when none is known), ten minutes each,
-- deleted when the identity provider sends the browser back (used once).
CREATE TABLE console_logins (
    id_hash    TEXT PRIMARY KEY CHECK (length(id_hash) = 64),
    address    TEXT NOT NULL,
    return_to  TEXT NOT NULL CHECK (length(return_to) <= 1024),
    started_ms INTEGER NOT NULL
);
CREATE INDEX console_logins_address ON console_logins (address, started_ms);
CREATE INDEX console_logins_started ON console_logins (started_ms);
