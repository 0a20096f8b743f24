//! The files the audit checkpoints need: a signing key, its public key
//! and the checkpoint file.

use std::path::{Path, PathBuf};

use crate::material::write_file;

/// An audit signing key, its public key and a checkpoint file, in a folder
/// of their own: what `audit.checkpoints` needs.
#[derive(Debug)]
pub struct CheckpointFiles {
    dir: tempfile::TempDir,
    pub key: PathBuf,
    pub public_key: PathBuf,
    pub file: PathBuf,
}

impl Default for CheckpointFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl CheckpointFiles {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_, private_pem, public_pem) =
            talos_sso_server::audit::checkpoint::AuditKey::generate().expect("audit key");
        let key = write_file(dir.path(), "audit-signing.key", &private_pem, 0o600);
        let public_key = write_file(dir.path(), "audit-signing.pub", &public_pem, 0o644);
        let file = dir.path().join("checkpoints.jsonl");
        Self {
            dir,
            key,
            public_key,
            file,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `yaml` with an `audit.checkpoints` section using these files, signed
    /// every `interval` by a server named `server_name`.
    pub fn configure(&self, yaml: &str, interval: &str, server_name: &str) -> String {
        format!(
            "{yaml}\naudit:\n  checkpoints:\n    key_file: \"{}\"\n    file: \"{}\"\n    interval: {interval}\n    \
             server_name: {server_name}\n",
            self.key.display(),
            self.file.display()
        )
    }

    /// The checkpoints in the file, in order, read as they are (no
    /// signature checked).
    pub fn read(&self) -> Vec<talos_sso_api::checkpoint::Checkpoint> {
        std::fs::read_to_string(&self.file)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("a checkpoint line"))
            .collect()
    }
}
