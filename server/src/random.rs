//! Random values from the system's generator (request ids, test names).
//! A failing generator is an error, never a predictable value instead.

/// The system's random number generator failed: nothing that needs a
/// random value may go on with a predictable one instead.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the system random number generator failed")]
pub struct RandomError;

/// `bytes` random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> Result<String, RandomError> {
    let mut buf = vec![0u8; bytes];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut buf).map_err(|_| RandomError)?;
    Ok(hex::encode(buf))
}

#[cfg(test)]
mod tests {
    use super::random_hex;

    #[test]
    fn hex_of_the_asked_length_and_never_twice_the_same() {
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
    }
}
