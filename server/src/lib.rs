//! talos-sso-server: signs five-minute Talos client certificates for people
//! who logged in with their company identity.
//!
//! Data flows one way: `http` extracts and authenticates (`identity`), then
//! calls `issuance`, which decides (`policy`), signs (`certificate` with a
//! `ca`) and records (`audit`) before anything is answered. The domain
//! modules (`issuance`, `certificate`, `policy`, `ca`, `identity::token`)
//! know nothing about HTTP; only `audit::store` knows SQL. The request and
//! response types are the `talos-sso-api` crate's, shared with the CLI.
//!
//! - `x509`: DER mechanics (exact name bytes, building, signing, verifying).
//! - `ca`: Talos CA material in every form Talos writes (it reads files),
//!   refused when unsafe; `ca::generate` makes new roots and intermediates.
//! - `keys`: private keys behind one `Signer` trait: in memory (ring), or
//!   inside a hardware security module, signing through a pool of PKCS#11
//!   sessions that reopens itself after a failure.
//! - `certificate`: CSR checks and the Talos client certificate profile.
//! - `identity`: bearer-token verification for every trusted issuer (kinds
//!   `oidc` and `entra`), discovery and keys, Entra group overage through Graph.
//! - `policy`: claims to Talos roles per cluster; pure, checked at load.
//! - `issuance`: the one service that decides, signs and records a
//!   certificate, for the API and for break-glass.
//! - `audit`: the hash-chained, append-only trail in Postgres or SQLite, with
//!   group commit.
//! - `metrics`: Prometheus metrics on `/metrics` (on the main port, or a
//!   listener of their own).
//! - `config`: the configuration file, its cluster files and its
//!   environment overrides.
//! - `app`: the server's state built from the configuration.
//! - `reload`: the configuration read again while the server runs (SIGHUP,
//!   a changed file), applied whole or refused.
//! - `http`: router, one module per endpoint group, problem details, the
//!   serve loop.
//! - `server`: start-up and shutdown around the serve loop, one path for
//!   `serve`, the tests and the quick start; everything is checked before
//!   the port is taken, and a stop loses no audit record.
//! - `ratelimit`: requests per identity and per client address.
//! - `refusals`: unauthenticated and rate-limited refusals, aggregated so
//!   that a flood adds a bounded number of audit records.
//! - `secret_file`: who may read a file holding a secret.
//! - `text_file`: reading a file the operator named, up to a bound.
//! - `guid`: Entra's object and tenant ids (GUIDs), for `identity` and
//!   `policy`.
//! - `random`: random values (request ids); a failing generator is an error.
//! - `break_glass`: certificates when the identity provider is down.
//! - `cli`: the command line; the only place `anyhow` is used.
//! - `telemetry`: logging setup.

/// This build's version (`talos-sso-server --version`, `/v1/info`, metrics).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source revision this build was made from (`git rev-parse HEAD`, or
/// `TALOS_SSO_REVISION` at build time), `unknown` when neither was there.
pub const REVISION: &str = env!("TALOS_SSO_REVISION");

pub mod app;
pub mod audit;
pub mod break_glass;
pub mod ca;
pub mod certificate;
pub mod cli;
pub mod config;
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
pub mod reload;
pub mod secret_file;
pub mod server;
pub mod telemetry;
pub mod text_file;
pub mod x509;
