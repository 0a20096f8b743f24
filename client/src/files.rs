//! Private files done right: an exclusive lock on a sidecar `<file>.lock`,
//! atomic replacement (temporary file in the same directory, fsync, rename,
//! fsync of the directory), mode 0600 for files and 0700 for directories this
//! client creates. Used for the talosconfig, the client config and the token
//! cache.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An exclusive lock, released when dropped.
#[derive(Debug)]
pub struct FileLock(#[allow(dead_code)] File);

pub fn open_private(path: &Path, truncate: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(truncate);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// Lock `<path>.lock` exclusively (blocking until it is free).
pub fn lock(path: &Path) -> std::io::Result<FileLock> {
    lock_sidecar(path, "lock")
}

/// Lock `<path>.<suffix>` exclusively: a second, independent lock on the
/// same file (held across a slow operation without blocking plain updates).
pub fn lock_sidecar(path: &Path, suffix: &str) -> std::io::Result<FileLock> {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    let file = open_private(&PathBuf::from(name), false)?;
    file.lock()?;
    Ok(FileLock(file))
}

/// Create the parent directory of `path` (0700) when missing.
pub fn ensure_parent(path: &Path) -> std::io::Result<()> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.exists() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// Replace `path` with `contents` atomically, mode 0600.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let mut random = [0u8; 6];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random);
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let temp = dir.join(format!(".{file_name}.tmp-{suffix}"));
    let result = (|| {
        let mut file = open_private(&temp, true)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp, path)?;
        if let Ok(directory) = File::open(dir) {
            let _ = directory.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}
