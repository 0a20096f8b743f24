//! End-to-end tests, in one binary (one link on a 2-core machine).
//!
//! - `accepted_ca`: accepted-CA mode judged by OpenSSL and Go's standard
//!   library: the client-only profile, nothing it signs passes as a server,
//!   apid admits its leaves only while it is listed, a key in a token.
//! - `accepted_ca_break_glass`, `accepted_ca_tools`: break-glass in that
//!   mode, and the CA tools as an operator runs them.
//! - `ca_sources`: every CA form loads; every refusal has its own error.
//! - `gateway`: the access gateway end to end, between the stand-in apid
//!   and three gRPC clients (tonic, Go's standard library, grpcio): roles,
//!   RBAC, rules, records before calls, cut-off, cancellation, trailers,
//!   32 MiB messages, certificates from elsewhere.
//! - `gateway_edges`: streams, trailers and 32 MiB through the gateway,
//!   certificates from elsewhere, expiry, a renewed serving certificate.
//! - `gateway_config`: a gateway cluster at load time, at reload and in
//!   `check`: people's CA and talosconfig, each refusal.
//! - `accepted_ca_config`: accepted-CA mode at load time: where `talos_ca`
//!   comes from, each refusal, the trust bundle.
//! - `accepted_ca_rotation`: `next_ca` through `load_clusters` and a running
//!   server; its refusals; `check` and `/readyz` on the trust mode.
//! - `accepted_ca_patches`: `ca patch add|remove` (the binary) against Talos's
//!   machine configs, its patches applied through the strategic merge model.
//! - `strategic_merge`: that model on Talos's own merge and delete semantics.
//! - `standin_apid`: the gRPC apid stand-in and three gRPC clients (tonic, Go,
//!   grpcio) against each other: roles, impersonation, refusals, 32 MiB,
//!   client streams, statuses and trailers, cancellation, foreign CAs.
//! - `issuance`: certificates Talos accepts, checked by the apid stand-in and
//!   by OpenSSL, for each CA type and 1, 2 and 4 roles; CSR refusals;
//!   validity edges with an injected clock; intermediate mode.
//! - `identity`: the Entra emulator driven with `openidconnect`, and the
//!   server's token verification against it (rotation, outages, overage).
//! - `server`: the server end to end over HTTP, on Postgres and on SQLite:
//!   every field of the audit record, every denial, outages, tampering,
//!   replicas, break-glass.
//! - `feed`: feeds for a SIEM: service principals reading and following
//!   the trail, the follow stream's backlog, wake-ups, heartbeats, record,
//!   end at token expiry and cap, on Postgres and on SQLite.
//! - `faults`: fault injection against real processes: Postgres restarted
//!   under load, the server and a replica killed, a commit's answer lost.
//! - `deploy`: the deployment material checked against the code.
//! - `gitops`: the GitOps material against the base: a declarative source
//!   for every mounted Secret, the SOPS example, pinned remote bases, the
//!   production path's commands, concurrent init-container migrations.
//! - `roles`: the owner / runtime role split on Postgres: what the server's
//!   role may do, what it is refused, and what a server that may not
//!   migrate says.
//! - `hostile`: hostile input against a running server (poisoned text,
//!   extreme parameters, slow clients, floods, forwarded addresses, the
//!   deny list's edges).
//! - `matrix`: the hostile-input matrix of docs/evidence/reliability.md: every bad
//!   input by group, each with its exact status and code, nothing issued.
//! - `checkpoints`: signed audit checkpoints, and what they catch that the
//!   hash chain alone cannot (a rewritten trail, a cut end).
//! - `hsm`: a CA key inside a PKCS#11 token (SoftHSM 2): certificates Talos
//!   and OpenSSL accept, the checks at start, a token lost at run time.
//! - `reload`: the configuration read again while the server runs (a
//!   changed file or cluster file, SIGHUP): applied, recorded, counted, or
//!   refused with the running one kept.
//! - `client_key`: the client's key and CSR as Talos and OpenSSL read them.
//! - `quickstart`: the README's quick start as a newcomer runs it; its options.
//! - `metrics`: what each metric counts on a running server, labels no
//!   request can add, the TLS expiry, the metrics listener of their own.
//! - `batch`: the audit store's batches on both stores: one statement per
//!   table, and each record its own outcome (replays, denials, a record
//!   the database refuses) through the store and the group-commit writer.
//! - `audit_sql`: docs/audit.md's SQL and the store's filters, checked
//!   against a seeded trail on both stores.
//! - `audit_workloads`: workload logins in the trail: the `kind` filter
//!   and the view `audit_workloads`, on both stores.
//! - `console`: the web console in a real headless Chromium (login through
//!   the emulator, filters, a record's chain position, refusals, the deny
//!   list and the CLI, a tampered trail), and over HTTP on both stores.
//! - `exports`: the console's exports against the server binary in a
//!   process of its own: every record in order, memory bounded with
//!   stalled readers, the caps, the deadline and its record.
//! - `console_real_op`: the console's login through a real OpenID provider
//!   (oidc-provider), as its confidential web client, with no emulator.
//! - `monitoring`: the alert rules, their unit tests and the dashboard
//!   against the server's metrics; promtool on the exposition; a real
//!   Prometheus scraping a real server.
//! - `verification`: concurrent chain verifications share one run.
//! - `tools`: what the measuring tools read of the machine (CPU times from
//!   `/proc`).
//! - `layers`: the module graph of the sources: imports point one way (the
//!   server's layers), and no two sibling modules depend on each other.
//! - `man_pages`: the committed manual pages match the CLI's commands.
//! - `workload_examples`: deploy/examples run as written (the etcd backup
//!   CronJob's script, the GitHub Actions and GitLab CI jobs' steps) with
//!   the real CLI, a workload token of each kind, a real server and the
//!   apid stand-in: the certificate's CN and roles, the audit record.
//! - `outside_chain`: rows below the hash chain's first `seq`, on both
//!   stores: refused by the database, left out of every view and read, and
//!   a trail already holding one neither migrated, served nor verified.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

/// Each named test function, run once against each audit store:
/// `<module>::<name>::postgres` and `<module>::<name>::sqlite` (the module
/// must import `Backend`).
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test]
                async fn postgres() {
                    super::$name(Backend::Postgres).await;
                }

                #[tokio::test]
                async fn sqlite() {
                    super::$name(Backend::Sqlite).await;
                }
            }
        )*
    };
}

mod accepted_ca;
mod accepted_ca_break_glass;
mod accepted_ca_config;
mod accepted_ca_limits;
mod accepted_ca_patches;
mod accepted_ca_rotation;
mod accepted_ca_tools;
mod audit_sql;
mod audit_workloads;
mod batch;
mod ca_sources;
mod checkpoints;
mod client_key;
mod console;
mod console_real_op;
mod deploy;
mod exports;
mod faults;
mod feed;
mod gateway;
mod gateway_config;
mod gateway_edges;
mod gateway_workloads;
mod gitops;
mod hostile;
mod hsm;
mod identity;
mod issuance;
mod layers;
mod man_pages;
mod matrix;
mod metrics;
mod monitoring;
mod outside_chain;
mod quickstart;
mod reload;
mod roles;
mod server;
mod standin_apid;
mod strategic_merge;
mod tools;
mod verification;
mod workload_examples;
mod workloads;
