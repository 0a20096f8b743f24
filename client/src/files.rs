//! Private files done right: an exclusive lock on a sidecar `<file>.lock`,
//! atomic replacement (temporary file in the same directory, fsync, rename,
//! fsync of the directory), mode 0600 for files and 0700 for directories this
//! client creates. Used for the talosconfig, the client config and the token
//! cache.
//!
//! Lock and temporary files are opened without following a symbolic link
//! (`O_NOFOLLOW`), and a temporary file is always a new one (`O_EXCL`):
//! a link planted where either goes (the talosconfig may live in a shared
//! directory) is refused rather than followed to a file elsewhere.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An exclusive lock, released when dropped.
#[derive(Debug)]
pub struct FileLock(#[allow(dead_code)] File);

/// Mode 0600, and never through a symbolic link at the last component: one
/// planted at a lock or temporary path would make us create, lock or write
/// the file it points to, anywhere the user may write.
fn private_no_follow(options: &mut OpenOptions) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    #[cfg(not(unix))]
    let _ = options;
}

/// `error`, saying so plainly when `path` is a symbolic link (the kernel's
/// own words for it differ between systems).
fn explain_link(path: &Path, error: std::io::Error) -> std::io::Error {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => std::io::Error::new(
            error.kind(),
            format!(
                "{} is a symbolic link, which is not followed; remove it",
                path.display()
            ),
        ),
        _ => error,
    }
}

/// Lock `<path>.lock` exclusively (blocking until it is free).
pub fn lock(path: &Path) -> std::io::Result<FileLock> {
    lock_sidecar(path, "lock")
}

/// Lock `<path>.<suffix>` exclusively: a second, independent lock on the
/// same file (held across a slow operation without blocking plain updates).
/// The lock file is opened without following a symbolic link.
pub fn lock_sidecar(path: &Path, suffix: &str) -> std::io::Result<FileLock> {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    let lock_path = PathBuf::from(name);
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    private_no_follow(&mut options);
    let file = options
        .open(&lock_path)
        .map_err(|e| explain_link(&lock_path, e))?;
    file.lock()?;
    Ok(FileLock(file))
}

/// A lock taken without waiting ([`try_lock_sidecar`]).
#[derive(Debug)]
pub enum TryLock {
    Held(FileLock),
    /// Someone else holds it; `note` is what they wrote into it.
    Busy {
        note: String,
    },
}

/// Lock `<path>.<suffix>` exclusively unless someone else holds it, and
/// write `note` into it (who holds it: the next one to try reads it).
pub fn try_lock_sidecar(path: &Path, suffix: &str, note: &str) -> std::io::Result<TryLock> {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    let lock_path = PathBuf::from(name);
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    private_no_follow(&mut options);
    let mut file = options
        .open(&lock_path)
        .map_err(|e| explain_link(&lock_path, e))?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0)?;
            file.write_all(note.as_bytes())?;
            Ok(TryLock::Held(FileLock(file)))
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            use std::io::Read;
            let mut note = String::new();
            // Bounded: whoever wrote it may not be us.
            let _ = (&file).take(256).read_to_string(&mut note);
            Ok(TryLock::Busy { note })
        }
        Err(std::fs::TryLockError::Error(error)) => Err(error),
    }
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

/// Names tried for the temporary file before giving up (another file with
/// the same random name is not ours to replace).
const TEMP_ATTEMPTS: usize = 4;

/// Replace `path` with `contents` atomically, mode 0600. The temporary file
/// is new (`O_EXCL`, never a symbolic link or a file already there); the
/// rename then replaces `path` itself, even when it is a link.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let rng = ring::rand::SystemRandom::new();
    let mut attempt = 0;
    loop {
        let name = temp_name(&file_name, |bytes| ring::rand::SecureRandom::fill(&rng, bytes))
            .map_err(|e| std::io::Error::other(format!("{e}; {} was not written", path.display())))?;
        let temp = dir.join(name);
        match write_via(&temp, path, contents) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt + 1 < TEMP_ATTEMPTS => {
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// The name of a temporary file for `file_name`, with 48 random bits from
/// `fill` that nobody can guess. Without randomness there is no name: a
/// predictable one would let another user plant a file or link there first.
fn temp_name(
    file_name: &str,
    fill: impl FnOnce(&mut [u8]) -> Result<(), ring::error::Unspecified>,
) -> std::io::Result<String> {
    let mut random = [0u8; 6];
    fill(&mut random).map_err(|_| {
        std::io::Error::other(
            "the system random number generator failed, so no unpredictable temporary file name could be chosen",
        )
    })?;
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(".{file_name}.tmp-{suffix}"))
}

/// Write `contents` to the new file `temp`, then rename it over `path`.
fn write_via(temp: &Path, path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    private_no_follow(&mut options);
    // What is already at `temp` is not ours: neither written nor removed.
    let mut file = options.open(temp).map_err(|e| explain_link(temp, e))?;
    let written = file.write_all(contents).and_then(|()| file.sync_all());
    drop(file);
    let result = written.and_then(|()| {
        std::fs::rename(temp, path)?;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if let Ok(directory) = File::open(dir) {
            let _ = directory.sync_all();
        }
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(temp);
    }
    result
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A directory holding `config`, and a file elsewhere that a planted
    /// link points to.
    fn scene() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("home")).unwrap();
        std::fs::create_dir(root.path().join("elsewhere")).unwrap();
        let config = root.path().join("home").join("config");
        let target = root.path().join("elsewhere").join("victim");
        (root, config, target)
    }

    #[test]
    fn a_link_at_the_lock_path_is_not_followed() {
        let (_root, config, target) = scene();
        let lock_path = config.with_file_name("config.lock");
        // Dangling: following it would create the file it names.
        symlink(&target, &lock_path).unwrap();
        let error = lock(&config).unwrap_err().to_string();
        assert!(
            error.contains(&format!("{} is a symbolic link", lock_path.display())),
            "{error}"
        );
        assert!(!target.exists(), "nothing created through the link");
        // Pointing at an existing file: neither locked nor changed.
        std::fs::write(&target, "keep me").unwrap();
        let error = lock_sidecar(&config, "lock").unwrap_err().to_string();
        assert!(error.contains("is a symbolic link"), "{error}");
        let held = File::open(&target).unwrap();
        held.try_lock().expect("the target was not locked");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        assert!(
            std::fs::symlink_metadata(&lock_path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_link_where_the_temporary_file_goes_is_not_followed() {
        let (_root, config, target) = scene();
        std::fs::write(&config, "before").unwrap();
        let temp = config.with_file_name(".config.tmp-planted");
        for existing in [false, true] {
            if existing {
                std::fs::write(&target, "keep me").unwrap();
            }
            let _ = std::fs::remove_file(&temp);
            symlink(&target, &temp).unwrap();
            let error = write_via(&temp, &config, b"secret").unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{error}");
            assert!(error.to_string().contains("is a symbolic link"), "{error}");
            if existing {
                assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
            } else {
                assert!(!target.exists(), "nothing created through the link");
            }
            assert_eq!(std::fs::read_to_string(&config).unwrap(), "before");
            // Not ours, so left where it was.
            assert!(std::fs::symlink_metadata(&temp).unwrap().file_type().is_symlink());
        }
        // A plain file there is not ours either: refused, not overwritten.
        std::fs::remove_file(&temp).unwrap();
        std::fs::write(&temp, "someone's").unwrap();
        assert!(write_via(&temp, &config, b"secret").is_err());
        assert_eq!(std::fs::read_to_string(&temp).unwrap(), "someone's");
    }

    #[test]
    fn no_temporary_file_name_without_randomness() {
        let error = temp_name("config", |_| Err(ring::error::Unspecified)).unwrap_err();
        assert!(
            error.to_string().contains("random number generator failed"),
            "{error}"
        );
        let name = temp_name("config", |bytes| {
            bytes.fill(0xab);
            Ok(())
        })
        .unwrap();
        assert_eq!(name, ".config.tmp-abababababab");
    }

    #[test]
    fn atomic_writes_are_private_and_leave_no_temporary_file() {
        use std::os::unix::fs::PermissionsExt;
        let (root, config, _) = scene();
        write_atomic(&config, b"one").unwrap();
        write_atomic(&config, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&config).unwrap(), "two");
        let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(root.path().join("home"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["config"]);
    }
}
