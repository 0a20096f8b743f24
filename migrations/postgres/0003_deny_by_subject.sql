-- Deny-list entries block a subject; the username kept with an entry is a
-- label for people to read, and two entries may carry the same one (two
-- subjects that used one name). Only entries added with a username alone,
-- before subjects were required, block by it, so only those stay unique.
-- (A unique label made a second entry with the same label a silent no-op.)
DROP INDEX deny_list_username;
CREATE UNIQUE INDEX deny_list_username_only ON deny_list (username)
    WHERE subject IS NULL AND username IS NOT NULL;
