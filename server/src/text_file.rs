//! Reading a text file the operator named (the configuration, a secret, CA
//! material), or standard input, up to a bound: a path that leads to an
//! endless file (`/dev/zero`, a device, a pipe someone keeps writing) must
//! end in an error, not in a server that fills its memory before it starts.

use std::io::Read;
use std::path::Path;

/// Largest file read: far above any configuration, machine config or
/// secrets bundle (tens of KiB).
pub const MAX_LEN: u64 = 16 * 1024 * 1024;

/// The file's text, or an error when it is larger than [`MAX_LEN`] or not
/// UTF-8.
pub fn read(path: &Path) -> std::io::Result<String> {
    read_from(std::fs::File::open(path)?)
}

/// The text `reader` gives, with the bounds of [`read`].
pub fn read_from(reader: impl Read) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    reader.take(MAX_LEN + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_LEN {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} MiB, so not read", MAX_LEN / (1024 * 1024)),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_past_the_bound_is_refused_and_one_within_is_read() {
        let endless = std::io::repeat(b'a');
        let error = read_from(endless).unwrap_err();
        assert!(error.to_string().contains("larger than 16 MiB"), "{error}");
        assert_eq!(read_from(&b"machine: {}\n"[..]).unwrap(), "machine: {}\n");
        assert!(read_from(&[0xff, 0xfe][..]).is_err(), "not UTF-8");
    }
}
