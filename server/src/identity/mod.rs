//! Identity: what the server believes about the person behind a request.
//!
//! The server trusts nothing but a bearer token it has verified itself.
//! - `token`: checks a JWT against a key set, the issuer, the audience, the
//!   clock and the tenant allowlist (pure).
//! - `jwks`: the provider's key set, reduced to usable signing keys (pure).
//! - `provider`: discovery at start and the JWKS cache (refresh on unknown
//!   `kid`, rate-limited, last good set kept).
//! - `graph`: Entra group overage through Microsoft Graph.
//! - `authenticator`: the three together: token in, person and groups out.

pub mod authenticator;
pub mod graph;
pub mod jwks;
pub mod provider;
pub mod token;
