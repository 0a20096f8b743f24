//! The fuzz targets of talos-sso: one `pub fn` per target, taking the raw
//! input and panicking when a property fails (a panic is what libFuzzer
//! reports as a finding). The `fuzz_targets/` binaries only hand libFuzzer's
//! input to these functions, so the same checks run under `cargo test`,
//! which replays every committed input (`corpus/<target>/` and
//! `regressions/<target>/`) on the stable toolchain, without libFuzzer.
//!
//! - [`csr`]: CSR parsing and every check before a leaf is signed, then the
//!   leaf itself (`certificate`, `x509`).
//! - [`token`]: bearer-token parsing, the claims read before the signature,
//!   routing and refused-token records; and tokens the harness signs itself,
//!   so that the claim checks after the signature are reached too.
//! - [`jwks`]: the JSON Web Key Set parser.
//! - [`talosconfig`]: the client's talosconfig reader and merge.
//! - [`server_config`]: the configuration loader (YAML, TOML, environment).
//! - [`ca_material`]: the CA loader (PEM files, secrets bundle, machine
//!   config).
//! - [`audit_query`]: `GET /v1/audit` query parameters as the server reads
//!   and checks them.
//! - [`forwarded_for`]: the client address behind trusted proxies.
//! - [`audit_encoding`]: audit records through JSON and the canonical hash
//!   encoding, and the chain check over changed and arbitrary rows.
//!
//! Every target is deterministic in what it checks (random serials and keys
//! aside), reads no clock but the one fixed below, and touches no network.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod audit;
mod ca_material;
mod csr;
mod forwarded_for;
mod input;
mod server_config;
mod talosconfig;
mod token;

/// Separates a `csr` input's CSR from its leaf request lines.
pub use csr::REQUEST_MARKER as CSR_REQUEST_MARKER;

/// The instant every target takes as "now": CAs, tokens and query times are
/// judged against it, so that an input means the same on every run.
pub fn now() -> time::OffsetDateTime {
    // 2026-12-01T12:00:00Z.
    time::OffsetDateTime::from_unix_timestamp(1_796_126_400).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// CSR parsing, the checks before signing, and the signed leaf.
pub fn csr(data: &[u8]) {
    csr::run(data)
}

/// Bearer tokens: parsing and claims before the signature; harness-signed
/// tokens through every check after it.
pub fn token(data: &[u8]) {
    token::run_token(data)
}

/// The JWKS document parser.
pub fn jwks(data: &[u8]) {
    token::run_jwks(data)
}

/// The talosconfig reader and merge: an existing file and a new context.
pub fn talosconfig(data: &[u8]) {
    talosconfig::run(data)
}

/// The server configuration loader, YAML and TOML, with environment overrides.
pub fn server_config(data: &[u8]) {
    server_config::run(data)
}

/// The CA material loader, for each source kind.
pub fn ca_material(data: &[u8]) {
    ca_material::run(data)
}

/// `GET /v1/audit` query parameters.
pub fn audit_query(data: &[u8]) {
    audit::run_query(data)
}

/// `X-Forwarded-For` behind trusted proxies.
pub fn forwarded_for(data: &[u8]) {
    forwarded_for::run(data)
}

/// Audit records through JSON and the canonical encoding; the chain check.
pub fn audit_encoding(data: &[u8]) {
    audit::run_encoding(data)
}

/// A target's checks: they panic on a finding.
pub type Target = fn(&[u8]);

/// Every target by its name (the name of its binary and corpus folder).
pub const TARGETS: &[(&str, Target)] = &[
    ("csr", csr),
    ("token", token),
    ("jwks", jwks),
    ("talosconfig", talosconfig),
    ("server_config", server_config),
    ("ca_material", ca_material),
    ("audit_query", audit_query),
    ("forwarded_for", forwarded_for),
    ("audit_encoding", audit_encoding),
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::Path;

    /// The regression replay: every committed input of every target goes
    /// through its function once. A finding fixed in the product keeps its
    /// minimised input in `regressions/<target>/`, so it can never return
    /// unnoticed.
    #[test]
    fn every_corpus_and_regression_input_passes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut replayed = 0;
        for (name, run) in super::TARGETS {
            let mut inputs = 0;
            for folder in ["corpus", "regressions"] {
                let dir = root.join(folder).join(name);
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
                paths.sort();
                for path in paths.into_iter().filter(|p| p.is_file()) {
                    let data = std::fs::read(&path).unwrap();
                    if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
                        let message = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        panic!("{name}: {} fails: {message}", path.display());
                    }
                    inputs += 1;
                }
            }
            assert!(inputs > 0, "target {name} has no corpus: seed it");
            replayed += inputs;
        }
        println!("replayed {replayed} inputs");
    }

    #[test]
    fn every_target_has_a_binary() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for (name, _) in super::TARGETS {
            assert!(
                root.join("fuzz_targets").join(format!("{name}.rs")).is_file(),
                "{name}"
            );
        }
    }
}
