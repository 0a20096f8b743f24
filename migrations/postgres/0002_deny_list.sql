-- The deny list: identities blocked from new certificates at once, whatever
-- their groups say. Checked inside the transaction that commits an issuance,
-- so every replica sees a change immediately. Changes are made together with
-- their audit record (deny.added / deny.removed) in one transaction.
CREATE TABLE deny_list (
    -- Entra oid or OIDC sub; NULL when blocked by username only.
    subject     TEXT,
    -- Lower-cased username; NULL when blocked by subject only.
    username    TEXT,
    reason      TEXT NOT NULL,
    added_by    TEXT NOT NULL,
    added_at    TIMESTAMPTZ NOT NULL,
    CHECK (subject IS NOT NULL OR username IS NOT NULL)
);
CREATE UNIQUE INDEX deny_list_subject ON deny_list (subject) WHERE subject IS NOT NULL;
CREATE UNIQUE INDEX deny_list_username ON deny_list (username) WHERE username IS NOT NULL;

-- At run time the server also needs:
--   GRANT SELECT, INSERT, DELETE ON deny_list TO talos_sso_app;
