-- A deny-list entry may end by itself: a block for the length of an
-- incident. An entry whose `expires_at` has passed blocks nothing; it stays
-- in the table until the identity is blocked again or the entry is removed.
-- Times are text in the trail's one form (`2026-12-01T12:00:00.123456Z`),
-- which sorts as time does; SQLite's own clock gives milliseconds, which
-- compare correctly against it to the millisecond.
ALTER TABLE deny_list ADD COLUMN expires_at TEXT;

-- The entries that block now: the server reads the deny list through this
-- view only.
CREATE VIEW deny_list_active AS
    SELECT subject, username, reason, added_by, added_at, expires_at
    FROM deny_list
    WHERE expires_at IS NULL OR expires_at > strftime('%Y-%m-%dT%H:%M:%fZ', 'now');
