//! talos-sso-server: signs five-minute Talos client certificates for people
//! who logged in with their company identity.
//!
//! - `x509`: DER mechanics (exact name bytes, building, signing, verifying);
//!   no policy.
//! - `ca`: Talos CA material in every form Talos writes, refused when unsafe;
//!   `ca::generate` makes new roots and intermediates.
//! - `certificate`: CSR checks and the Talos client certificate profile, as a
//!   pure function of CA, CSR, identity, roles, validity and clock.
//! - `identity`: bearer-token verification (JWKS keys, Entra rules); pure.
//! - `policy`: claims to Talos roles per cluster; pure, checked at load.
//! - `cli`: the command line; the only place `anyhow` is used.
//! - `telemetry`: logging setup.

pub mod ca;
pub mod certificate;
pub mod cli;
pub mod identity;
pub mod policy;
pub mod telemetry;
pub mod x509;
