//! Shared harness for talos-sso's end-to-end tests: checkers that stand in
//! for Talos itself, and helpers that make throwaway CA material.
//!
//! - `talos_checker`: an apid/talosctl stand-in doing a real mTLS handshake.
//! - `openssl`: a second opinion from the OpenSSL command line.
//! - `go_tls`: apid and talosctl stand-ins in Go's standard library.
//! - `grpc_client`, `go_grpc`, `grpcio_client`: three gRPC clients (tonic, Go,
//!   grpcio) that call as talosctl does and report what came back.
//! - `emulator`: an Entra ID emulator (also the `entra-emulator` binary).
//! - `faults`: fault injection against real processes (Postgres, the server).
//! - `harness`: a real server on a fresh database, with the emulator.
//! - `load`: the issuance request the load tools send, and their percentiles.
//! - `real_op`: a real, certified OpenID Provider (oidc-provider, on Node.js).
//! - `tls_front`: TLS from a private CA in front of a plain-HTTP test service.
//! - `quickstart`: the whole product on one machine (the `quickstart` binary).
//! - `material`: throwaway CAs and files with the right permissions.
//! - `audit_seed`: a large, realistic, made-up audit trail (seeding, SQL checks).
//! - `softhsm`: SoftHSM 2 tokens with keys generated inside them.
//! - `secret_service`: a real Secret Service (GNOME Keyring on a private D-Bus).
//! - `console_client`: the web console without a browser (tests, benchmark).
//! - `strategic_merge`: a model of Talos's strategic merge patches.
//! - `standin_apid`: apid in process, over gRPC: its authorization, a call log.
//! - `gateway_files`: a gateway cluster's CAs, certificates and configuration.
//! - `gateway_env`: a gateway cluster running: files, stand-in apid, server.

// The harness is test code: failing loudly on a broken fixture is the point.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod audit_seed;
pub mod console_client;
pub mod emulator;
pub mod faults;
pub mod gateway_env;
pub mod gateway_files;
pub mod go_grpc;
pub mod go_tls;
pub mod grpc_client;
pub mod grpcio_client;
pub mod harness;
pub mod load;
pub mod man_pages;
pub mod material;
pub mod openssl;
pub mod quickstart;
pub mod real_op;
pub mod secret_service;
pub mod softhsm;
pub mod standin_apid;
pub mod strategic_merge;
pub mod talos_checker;
pub mod tls_front;
pub mod workload_tokens;
