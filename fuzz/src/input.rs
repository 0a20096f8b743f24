//! Taking a fuzz input apart: NUL-separated parts (text inputs seldom hold a
//! NUL, so seeds stay readable files), and text from bytes.

/// The first `n - 1` NUL-separated parts of `data` and the rest; missing
/// parts are empty.
pub fn parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.splitn(n, |b| *b == 0).collect();
    out.resize(n, &[]);
    out
}

/// `bytes` as text, invalid UTF-8 replaced (the loaders take text).
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
