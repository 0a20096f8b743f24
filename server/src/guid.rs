//! Entra's identifiers (object ids, tenant ids): GUIDs.

/// Whether `text` is a GUID, `8-4-4-4-12` hexadecimal digits: an Entra
/// object or tenant id. Anything else never goes into a Graph URL, and
/// is never read as a tenant.
pub fn is_guid(text: &str) -> bool {
    text.len() == 36
        && text.chars().enumerate().all(|(i, c)| {
            if [8, 13, 18, 23].contains(&i) {
                c == '-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

#[cfg(test)]
mod tests {
    use super::is_guid;

    #[test]
    fn only_guids() {
        assert!(is_guid("a1000000-0000-4000-8000-000000000001"));
        assert!(is_guid("72F988BF-86F1-41AF-91AB-2D7CD011DB47"));
        assert!(!is_guid("../../me/sendMail?x=a1000000-0000-4000"));
        assert!(!is_guid("a1000000-0000-4000-8000-00000000000/"));
        assert!(!is_guid("a1000000-0000-4000-8000-0000000000001"));
        assert!(!is_guid("a10000000-000-4000-8000-000000000001"));
        assert!(!is_guid("a1000000-0000-4000-8000-0000000000é"));
        assert!(!is_guid("contoso"));
        assert!(!is_guid(""));
    }
}
