-- Certificates of workloads: the same view as the Postgres schema, which
-- says what it is for, and the indexes of the store's `kind` filter.
-- `rules`, `misses` and `claims` are JSON text here.

CREATE VIEW audit_workloads AS
    SELECT seq, occurred_at, event, outcome, reason_code, cluster, username, subject,
           roles_granted, serial,
           json_extract(details, '$.workload.kind') AS kind,
           json_extract(details, '$.workload.issuer') AS workload_issuer,
           json_extract(details, '$.workload.rules') AS rules,
           json_extract(details, '$.workload.misses') AS misses,
           json_extract(details, '$.workload.claims') AS claims,
           CASE WHEN json_type(details, '$.workload.token_uses_max') IN ('integer', 'real')
                THEN json_extract(details, '$.workload.token_uses_max') END AS token_uses_max,
           client_ip, request_id
    FROM audit_events
    WHERE +seq > 0 AND json_type(details, '$.workload') IS NOT NULL;

-- One kind's records in `seq` order. The expression is written as the
-- store writes it, which is how SQLite knows the index serves it. Not
-- partial, as the method's index of 0009 is not: SQLite would use a
-- partial one only for a query that states its predicate, and the store's
-- kind filter states the kind alone; a person's records sit under NULL.
CREATE INDEX audit_events_workload_kind ON audit_events (json_extract(details, '$.workload.kind'), seq);

-- Every workload's record in `seq` order, whatever its kind: partial, for
-- the store's `workload` filter states this predicate as it is written here.
CREATE INDEX audit_events_workload ON audit_events (seq)
    WHERE json_type(details, '$.workload') IS NOT NULL;
