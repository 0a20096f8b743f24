//! Distinguished names: written attribute by attribute (several
//! Organization values, Talos's roles, in order) and read back as strings.

use der::{Encode, Tag, Tagged};
use spki::ObjectIdentifier;

use super::X509Error;

/// Every string value of an attribute type in a name (PrintableString,
/// UTF8String, IA5String are what real CAs and Talos write).
pub fn attribute_strings(name: &x509_cert::name::Name, attribute: ObjectIdentifier) -> Vec<String> {
    name.iter()
        .filter(|atv| atv.oid == attribute)
        .filter_map(|atv| {
            let tag = atv.value.tag();
            match tag {
                Tag::PrintableString | Tag::Utf8String | Tag::Ia5String | Tag::TeletexString => {
                    std::str::from_utf8(atv.value.value()).ok().map(str::to_owned)
                }
                _ => None,
            }
        })
        .collect()
}

/// Encode a distinguished name from (attribute, value) pairs, one RDN each, in
/// order. Values that fit PrintableString are written as such (what Go and
/// Talos write), anything else as UTF8String.
pub fn encode_name(attributes: &[(ObjectIdentifier, &str)]) -> Result<Vec<u8>, X509Error> {
    use x509_cert::attr::AttributeTypeAndValue;
    use x509_cert::name::{RdnSequence, RelativeDistinguishedName};
    let mut rdns = RdnSequence::default();
    for (attribute, value) in attributes {
        let tag = if is_printable_string(value) {
            Tag::PrintableString
        } else {
            Tag::Utf8String
        };
        let mut rdn = RelativeDistinguishedName::default();
        rdn.insert(AttributeTypeAndValue {
            oid: *attribute,
            value: der::asn1::Any::new(tag, value.as_bytes())?,
        })?;
        rdns.push(rdn);
    }
    Ok(rdns.to_der()?)
}

fn is_printable_string(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b))
}

#[cfg(test)]
mod tests {
    use der::Decode;

    use super::*;
    use crate::x509::oid;

    #[test]
    fn printable_string_detection_matches_x680() {
        assert!(is_printable_string("os:admin"));
        assert!(is_printable_string("talos"));
        assert!(!is_printable_string("alice@example.com"));
        assert!(!is_printable_string("os_admin"));
    }

    #[test]
    fn names_round_trip_with_several_organizations() {
        let der = encode_name(&[
            (oid::ORGANIZATION, "os:admin"),
            (oid::ORGANIZATION, "os:reader"),
            (oid::COMMON_NAME, "alice@example.com"),
        ])
        .unwrap();
        let name = x509_cert::name::Name::from_der(&der).unwrap();
        assert_eq!(
            attribute_strings(&name, oid::ORGANIZATION),
            ["os:admin", "os:reader"]
        );
        assert_eq!(attribute_strings(&name, oid::COMMON_NAME), ["alice@example.com"]);
    }
}
