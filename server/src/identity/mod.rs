//! Identity: what the server believes about the person behind a request.
//!
//! The server trusts nothing but a bearer token it has verified itself.
//! `token` checks a JWT against a set of provider keys, the issuer, the
//! audience, the clock and the tenant allowlist, and turns it into
//! [`token::VerifiedToken`]; `jwks` parses the provider's key set.
//! Fetching discovery documents and keys over HTTP, and resolving Entra group
//! overage through Graph, build on these.

pub mod jwks;
pub mod token;
