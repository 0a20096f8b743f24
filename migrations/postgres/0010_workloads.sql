-- Certificates of workloads (Kubernetes service accounts, GitHub Actions,
-- GitLab CI): a view for psql (docs/audit.md, "Workload logins"), and the
-- indexes the store's `kind` filter reads. A workload's certificate
-- records (`certificate.issued`, `certificate.denied`) hold
-- `details.workload`; a person's records do not. CI pipelines may log in
-- far more often than people do, or far less: either way a filter on one
-- kind must not read the records of every other.

-- One row per record of a workload. `kind` is the issuer's kind
-- (`kubernetes`, `github-actions`, `gitlab-ci`), `workload_issuer` the
-- configured name of the issuer that verified the token; `rules` names the
-- workload rules that admitted it (issued), `misses` each rule that did not
-- and the claims it missed (refused), `claims` the token's claims that
-- rules can name; `token_uses_max` how many certificates one token may
-- mint (each such record carries the token's `token_id`).
CREATE VIEW audit_workloads AS
    SELECT seq, occurred_at, event, outcome, reason_code, cluster, username, subject,
           roles_granted, serial,
           details->'workload'->>'kind' AS kind,
           details->'workload'->>'issuer' AS workload_issuer,
           details->'workload'->'rules' AS rules,
           details->'workload'->'misses' AS misses,
           details->'workload'->'claims' AS claims,
           CASE WHEN jsonb_typeof(details->'workload'->'token_uses_max') = 'number'
                THEN (details->'workload'->>'token_uses_max')::numeric END AS token_uses_max,
           client_ip, request_id
    FROM audit_events
    WHERE seq > 0 AND details ? 'workload';

-- The store's filter on one kind (`details ? 'workload' AND
-- details->'workload'->'kind' = to_jsonb('github-actions'::text)`): a
-- kind's records in trail order. The kind as JSON, not as text, so that a
-- kind that is not a string matches no text, as in SQLite. Partial: only a
-- workload's records have a kind, and a person's records cost this index
-- nothing.
CREATE INDEX audit_events_workload_kind ON audit_events ((details->'workload'->'kind'), seq)
    WHERE details ? 'workload';

-- The store's filter on any workload (`details ? 'workload'`): every
-- workload's record in trail order, whatever its kind, which the index of
-- the kinds does not give without a sort.
CREATE INDEX audit_events_workload ON audit_events (seq) WHERE details ? 'workload';
