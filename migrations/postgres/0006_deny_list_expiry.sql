-- A deny-list entry may end by itself: a block for the length of an
-- incident. An entry whose `expires_at` has passed blocks nothing; it stays
-- in the table (the audit trail records its addition, with the expiry) until
-- the identity is blocked again or the entry is removed.
ALTER TABLE deny_list ADD COLUMN expires_at TIMESTAMPTZ;

-- The entries that block now: the server reads the deny list through this
-- view only. `now()` is the transaction's start, so an issuance sees one
-- deny list for its whole transaction.
CREATE VIEW deny_list_active AS
    SELECT subject, username, reason, added_by, added_at, expires_at
    FROM deny_list
    WHERE expires_at IS NULL OR expires_at > now();

-- At run time the server also needs (migrate --runtime-role grants it):
--   GRANT SELECT ON deny_list_active TO talos_sso_app;
