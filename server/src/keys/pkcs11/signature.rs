//! PKCS#11 signatures as X.509 wants them.

use der::Encode;
use der::asn1::UintRef;

/// PKCS#11 returns ECDSA signatures as r||s; X.509 wants
/// `Ecdsa-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER }`.
pub(super) fn ecdsa_der(raw: &[u8]) -> Option<Vec<u8>> {
    #[derive(der::Sequence)]
    struct EcdsaSigValue<'a> {
        r: UintRef<'a>,
        s: UintRef<'a>,
    }
    if raw.len() != 64 {
        return None;
    }
    let (r, s) = raw.split_at(32);
    EcdsaSigValue {
        r: UintRef::new(r).ok()?,
        s: UintRef::new(s).ok()?,
    }
    .to_der()
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ecdsa_signature_from_the_token_becomes_der_that_ring_verifies() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::EcdsaKeyPair::generate_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let fixed = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .unwrap();
        use ring::signature::KeyPair;
        // Many signatures, so that r or s with a high bit (or a leading zero) occurs.
        for _ in 0..64 {
            let raw = fixed.sign(&rng, b"tbs").unwrap();
            let der = ecdsa_der(raw.as_ref()).unwrap();
            ring::signature::UnparsedPublicKey::new(
                &ring::signature::ECDSA_P256_SHA256_ASN1,
                fixed.public_key().as_ref(),
            )
            .verify(b"tbs", &der)
            .unwrap();
        }
        assert_eq!(ecdsa_der(&[0; 63]), None);
    }
}
