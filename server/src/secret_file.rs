//! Who may read a file holding a secret (CA key, database password, Graph
//! client secret). A secret file must not be readable by others. Group read
//! is refused too, with one exception: the group is this process's own
//! effective group and the file belongs to root or to this process's user.
//! That is exactly how Kubernetes mounts Secrets with `fsGroup` (root-owned,
//! mode 0440, group = the pod's fsGroup), and it gives nobody else access.

use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// Why a secret file is too open, with its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOpen {
    pub mode: u32,
}

/// `(uid, effective gid)` of this process, from /proc (Linux); `None`
/// elsewhere, which keeps the strict rule.
fn process_ids() -> Option<(u32, u32)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        // "Uid:\treal\teffective\tsaved\tfs": take the effective id.
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((field("Uid:")?, field("Gid:")?))
}

/// Check `path`; `Ok(())` when only its owner (or, as above, its owner's
/// designated group) can read it. I/O errors are returned as is.
pub fn check(path: &Path) -> std::io::Result<Result<(), TooOpen>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let mode = meta.mode() & 0o7777;
        if mode & 0o007 != 0 {
            return Ok(Err(TooOpen { mode }));
        }
        if mode & 0o070 != 0 {
            let shared_with_own_group = process_ids().is_some_and(|(uid, gid)| {
                meta.gid() == gid && (meta.uid() == 0 || meta.uid() == uid) && mode & 0o020 == 0
            });
            if !shared_with_own_group {
                return Ok(Err(TooOpen { mode }));
            }
        }
    }
    let _ = path;
    Ok(Ok(()))
}

/// Why a secret could not be read from its file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read secret file {path}: {reason}")]
pub struct SecretError {
    pub path: PathBuf,
    pub reason: String,
}

/// Read a secret from a file, refusing files readable by group or others
/// (see [`check`]); the trailing line break is not part of it.
pub fn read_secret(path: &Path) -> Result<Zeroizing<String>, SecretError> {
    let error = |reason: String| SecretError {
        path: path.to_owned(),
        reason,
    };
    if let Err(too_open) = check(path).map_err(|e| error(e.to_string()))? {
        return Err(error(format!(
            "readable by group or others (mode {:04o}); chmod 600 it",
            too_open.mode
        )));
    }
    let text = crate::text_file::read(path).map_err(|e| error(e.to_string()))?;
    Ok(Zeroizing::new(text.trim_end_matches(['\n', '\r']).to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn file(dir: &Path, name: &str, mode: u32) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, "secret").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn owner_only_passes_others_never() {
        let dir = std::env::temp_dir().join(format!(
            "talos-sso-secret-{}",
            crate::random::random_hex(6).unwrap()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(check(&file(&dir, "a", 0o600)).unwrap(), Ok(()));
        assert_eq!(check(&file(&dir, "b", 0o400)).unwrap(), Ok(()));
        assert_eq!(
            check(&file(&dir, "c", 0o604)).unwrap(),
            Err(TooOpen { mode: 0o604 })
        );
        assert_eq!(
            check(&file(&dir, "d", 0o644)).unwrap(),
            Err(TooOpen { mode: 0o644 })
        );
        // Group-writable is never fine.
        assert_eq!(
            check(&file(&dir, "e", 0o660)).unwrap(),
            Err(TooOpen { mode: 0o660 })
        );
        // Group-readable: only for the process's own group (Kubernetes fsGroup).
        let own = file(&dir, "f", 0o440);
        let (_, gid) = process_ids().unwrap();
        assert_eq!(std::fs::metadata(&own).unwrap().gid(), gid);
        assert_eq!(check(&own).unwrap(), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
