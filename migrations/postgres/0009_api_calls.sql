-- Talos API calls through the gateway (`api.call`): a view for psql
-- (docs/audit.md, "API calls"), and the indexes the store's `method` and
-- `node` filters read. A gateway in front of a busy cluster writes many
-- more of these records than there are certificates, so a filter on them
-- must not read the records of every other event, nor every call.

-- One row per `api.call` record: a call that may change a node has two
-- (`started`, then `success`, `failed` or `denied`, with one request_id),
-- a call refused by the gateway one (`denied`, `rule` names what refused
-- it), and read-only calls one per certificate, method and minute
-- (`calls` says how many). `method` has the collation of its index, so a
-- comparison with it (`method = '/machine.MachineService/Reboot'`) is
-- served by that index; `nodes` is the JSON list of the nodes named.
CREATE VIEW audit_api_calls AS
    SELECT seq, occurred_at, outcome, reason_code, cluster, username, subject, roles_granted, serial,
           (details->>'method') COLLATE "C" AS method,
           details->'nodes' AS nodes,
           details->>'class' AS class,
           CASE WHEN jsonb_typeof(details->'grpc_status') = 'number'
                THEN (details->>'grpc_status')::numeric END AS grpc_status,
           details->>'grpc_message' AS grpc_message,
           CASE WHEN jsonb_typeof(details->'duration_ms') = 'number'
                THEN (details->>'duration_ms')::numeric END AS duration_ms,
           CASE WHEN jsonb_typeof(details->'calls') = 'number'
                THEN (details->>'calls')::numeric ELSE 1 END AS calls,
           details->>'rule' AS rule,
           client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND event = 'api.call';

-- The store's `method` filter: an exact method, or a prefix as a range
-- (`>= '/machine.MachineService/Etcd' AND < '/machine.MachineService/Etce'`),
-- compared byte by byte ("C"), which is how a prefix is a range whatever
-- the database's collation; `seq` after it gives a method's calls in
-- trail order. Partial: only `api.call` records have a method.
CREATE INDEX audit_events_api_method ON audit_events ((details->>'method') COLLATE "C", seq)
    WHERE event = 'api.call';

-- The store's `node` filter (`details->'nodes' @> '["10.5.0.2"]'`): the
-- members of each call's list of nodes, which no B-tree can hold.
CREATE INDEX audit_events_api_nodes ON audit_events USING gin ((details->'nodes') jsonb_path_ops)
    WHERE event = 'api.call';
