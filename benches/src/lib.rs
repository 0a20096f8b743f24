//! Nothing here: this package holds the criterion benchmarks in
//! `benches/` (`cargo bench --manifest-path benches/Cargo.toml`), kept out of
//! the main workspace so that their dependencies never change its builds.
