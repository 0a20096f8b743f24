//! PEM text in and out, with the `pem` crate (the one PEM reader of the
//! server, the CLI and the API types): strict about what it reads.

/// One PEM block, lines of 64 characters ending in LF (as Go, OpenSSL and
/// Talos write it).
pub fn pem_encode(label: &str, der: &[u8]) -> String {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new(label, der), config)
}

/// Why PEM text could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error(transparent)]
    Malformed(#[from] pem::PemError),
    #[error("a PEM block has no END line")]
    Unterminated,
    #[error("the `{label}` block has headers (an encrypted key?); only plain PEM is read")]
    Headers { label: String },
}

/// Every PEM block in `text` as (label, DER), in order. Text outside blocks is
/// ignored, like Go's `pem.Decode` loop.
pub fn pem_blocks(text: &str) -> Result<Vec<(String, Vec<u8>)>, PemError> {
    let blocks = pem::parse_many(text)?;
    // `parse_many` stops quietly at a BEGIN line with no END after it: a
    // truncated file would lose its last block (a chain its root) unnoticed.
    if text.matches("-----BEGIN ").count() > blocks.len() {
        return Err(PemError::Unterminated);
    }
    blocks
        .into_iter()
        .map(|block| {
            if block.headers().iter().next().is_some() {
                return Err(PemError::Headers {
                    label: block.tag().to_owned(),
                });
            }
            Ok((block.tag().to_owned(), block.into_contents()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_blocks_reads_every_block_and_skips_text() {
        let a = pem_encode("CERTIFICATE", b"\x30\x00");
        let b = pem_encode("ED25519 PRIVATE KEY", b"\x30\x01\x00");
        let text = format!("comment\n{a}junk\n{b}");
        let blocks = pem_blocks(&text).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].0, "CERTIFICATE");
        assert_eq!(blocks[1].0, "ED25519 PRIVATE KEY");
        assert_eq!(blocks[1].1, b"\x30\x01\x00");
    }

    #[test]
    fn pem_blocks_refuses_truncated_and_encrypted_blocks() {
        let whole = pem_encode("CERTIFICATE", b"\x30\x00");
        let truncated = format!("{whole}-----BEGIN CERTIFICATE-----\nMAA=\n");
        assert!(matches!(pem_blocks(&truncated), Err(PemError::Unterminated)));
        let encrypted = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\n\
                         DEK-Info: AES-128-CBC,00112233445566778899AABBCCDDEEFF\n\nMAA=\n\
                         -----END RSA PRIVATE KEY-----\n";
        assert!(
            matches!(pem_blocks(encrypted), Err(PemError::Headers { label }) if label == "RSA PRIVATE KEY")
        );
        assert!(pem_blocks("-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n").is_err());
        assert!(pem_blocks("-----BEGIN A-----\nMAA=\n-----END B-----\n").is_err());
        assert_eq!(pem_blocks("no PEM here").unwrap(), []);
    }
}
