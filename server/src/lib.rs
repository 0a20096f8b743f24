//! talos-sso-server: signs five-minute Talos client certificates for people
//! who logged in with their company identity.
//!
//! Data flows one way: `http` extracts and authenticates (`identity`), then
//! calls `issuance`, which decides (`policy`), signs (`certificate` with a
//! `ca`) and records (`audit`) before anything is answered. The domain
//! modules know nothing about HTTP; only `audit::store` knows SQL. The
//! request and response types are the `talos-sso-api` crate's, shared with
//! the CLI.
//!
//! Modules are in layers, and imports point down only (a module may use
//! one of its own layer when no circle results):
//!
//! 0. Utilities, which import nothing of the crate but each other:
//!    - `random`: random values (request ids); a failing generator is an
//!      error.
//!    - `secret_file`: who may read a file holding a secret, and reading one.
//!    - `text_file`: reading a file the operator named, up to a bound.
//!    - `guid`: Entra's object and tenant ids (GUIDs).
//!    - `slots`: caps on long answers (exports, streams), in all and per
//!      person.
//!    - `telemetry`: logging setup.
//! 1. `config`: the configuration file, its cluster files and its
//!    environment overrides, as plain data with the checks the file alone
//!    allows; the checks that need a domain's knowledge are the domain's.
//! 2. The domain, which knows nothing of `app`, `http`, `server`, `cli` or
//!    `break_glass`:
//!    - `keys`: private keys behind one `Signer` trait: in memory (ring),
//!      or inside a hardware security module, signing through a pool of
//!      PKCS#11 sessions that reopens itself after a failure.
//!    - `x509`: DER mechanics (exact name bytes, building, signing with a
//!      `Signer`, verifying).
//!    - `ca`: Talos CA material in every form Talos writes (it reads files),
//!      refused when unsafe; `ca::generate` makes new roots and
//!      intermediates.
//!    - `certificate`: CSR checks and the Talos client certificate profile.
//!    - `identity`: bearer-token verification for every trusted issuer
//!      (kinds `oidc` and `entra`), discovery and keys, Entra group overage
//!      through Graph.
//!    - `policy`: claims to Talos roles per cluster; pure, checked at load.
//!    - `talos_api`: the Talos machine API as the gateway sees it: which
//!      methods change a node, per-method rules, the `api.call` records.
//!    - `cluster`: each cluster's CA and policy (and its gateway's CA and
//!      rules), built and checked, and the policy examples run against them.
//!    - `issuance`: the one service that decides, signs and records a
//!      certificate, for the API and for break-glass.
//!    - `audit`: the hash-chained, append-only trail in Postgres or SQLite,
//!      with group commit.
//!    - `ratelimit`: requests per identity and per client address.
//!    - `refusals`: unauthenticated and rate-limited refusals, aggregated so
//!      that a flood adds a bounded number of audit records.
//!    - `metrics`: Prometheus metrics, read from the rest through the
//!      closures it is given.
//! 3. `app`: the composition root: the server's state built from the
//!    configuration (after the domains' checks, `app::check`), and a
//!    reloaded configuration applied to it whole or refused
//!    (`app::reload`).
//! 4. The edges:
//!    - `http`: router, one module per endpoint group, problem details, the
//!      serve loop.
//!    - `server`: start-up and shutdown around the serve loop, one path for
//!      `serve`, the tests and the quick start; everything is checked
//!      before the port is taken, and a stop loses no audit record. The
//!      reload watcher (SIGHUP, changed files) starts here.
//!    - `gateway`: the access gateway: talosctl's mutual TLS ended, each
//!      call admitted, recorded and forwarded to apid with the gateway's
//!      own `os:impersonator` certificate; running calls cut off.
//!    - `break_glass`: certificates when the identity provider is down.
//!    - `cli`: the command line; the only place `anyhow` is used.

/// This build's version (`talos-sso-server --version`, `/v1/info`, metrics).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source revision this build was made from (`git rev-parse HEAD`, or
/// `TALOS_SSO_REVISION` at build time), `unknown` when neither was there.
pub const REVISION: &str = env!("TALOS_SSO_REVISION");

/// What `--version` prints after the name: the version and the revision.
pub const VERSION_LINE: &str = env!("TALOS_SSO_VERSION_LINE");

pub mod app;
pub mod audit;
pub mod break_glass;
pub mod ca;
pub mod certificate;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod gateway;
mod guid;
pub mod http;
pub mod identity;
pub mod issuance;
pub mod keys;
pub mod metrics;
pub mod policy;
pub mod random;
pub mod ratelimit;
pub mod refusals;
pub mod secret_file;
pub mod server;
pub mod slots;
pub mod talos_api;
pub mod telemetry;
pub mod text_file;
pub mod x509;
