-- The deny list (see the Postgres schema).
CREATE TABLE deny_list (
    subject     TEXT,
    username    TEXT,
    reason      TEXT NOT NULL,
    added_by    TEXT NOT NULL,
    added_at    TEXT NOT NULL,
    CHECK (subject IS NOT NULL OR username IS NOT NULL)
);
CREATE UNIQUE INDEX deny_list_subject ON deny_list (subject) WHERE subject IS NOT NULL;
CREATE UNIQUE INDEX deny_list_username ON deny_list (username) WHERE username IS NOT NULL;
