//! Reading a text file the operator named (the configuration, a secret, CA
//! material), up to a bound: a path that leads to an endless file
//! (`/dev/zero`, a device, a pipe someone keeps writing) must end in an
//! error, not in a server that fills its memory before it starts.

use std::io::Read;
use std::path::Path;

/// Largest file read: far above any configuration, machine config or
/// secrets bundle (tens of KiB).
pub const MAX_LEN: u64 = 16 * 1024 * 1024;

/// The file's text, or an error when it is larger than [`MAX_LEN`] or not
/// UTF-8.
pub fn read(path: &Path) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_LEN + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} MiB, so not read", MAX_LEN / (1024 * 1024)),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}
