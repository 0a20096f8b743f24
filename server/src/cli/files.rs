//! Files the commands make: never overwriting one, keys readable by the
//! owner only.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};

/// Write a certificate (0644) and its key (0600); never overwrite either.
pub fn write_new_files(
    cert_path: &Path,
    cert_pem: &str,
    key_path: &Path,
    key_pem: &str,
) -> anyhow::Result<()> {
    for path in [cert_path, key_path] {
        if path.exists() {
            bail!("{} already exists; refusing to overwrite it", path.display());
        }
    }
    write_new_file(key_path, key_pem, 0o600)?;
    write_new_file(cert_path, cert_pem, 0o644)?;
    Ok(())
}

pub(super) fn write_new_file(path: &Path, contents: &str, mode: u32) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    let _ = mode;
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    Ok(())
}
