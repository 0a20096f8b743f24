//! Shared test harness for talos-sso end-to-end tests.
