-- Records by client address (`client_ip`: the API's and the console's
-- "from where" filter). Without it a rare address read the whole trail
-- back to its start, 270 to 390 ms a page on a million records
-- (docs/performance.md, "Console"); with `seq`, newest first and the cursor
-- come from the index.
CREATE INDEX audit_events_client_ip ON audit_events (client_ip, seq);
