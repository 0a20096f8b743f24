//! `csr`: a CSR (PEM or DER) and, optionally, what the leaf should say,
//! through `certificate::verify_csr` and `certificate::issue`.
//!
//! Input: the CSR bytes, then optionally [`REQUEST_MARKER`] and four lines:
//! username, roles (comma-separated), TTL seconds, clock skew seconds. The
//! marker is text that DER does not contain by chance, so a DER CSR can hold
//! any byte.
//!
//! Properties: nothing panics; `issue` signs exactly when the CSR verifies
//! and the request passes its checks, and refuses with the CSR's own reason
//! otherwise; a refusal names a real fault of the request; a signed leaf has
//! the CSR's key, the CA's subject bytes as issuer, one `O` per distinct
//! role in order, the username as CN, clientAuth only, no CA flag, a
//! signature by the CA, and a validity inside the CA's and the TTL.

use std::sync::OnceLock;
use std::time::Duration;

use talos_sso_server::ca::CertificateAuthority;
use talos_sso_server::ca::generate::{NewKeyType, new_root};
use talos_sso_server::certificate::{IssueError, LeafRequest, MAX_USERNAME_LEN, issue, verify_csr};
use talos_sso_server::keys::{KeyKind, key_kind};
use talos_sso_server::x509::oid;

/// Separates the CSR from the request lines.
pub const REQUEST_MARKER: &[u8] = b"\n~~leaf request~~\n";

/// The CA every input is signed with: a Talos-style Ed25519 root valid
/// around [`crate::now`] (the other targets that sign use it too).
pub(crate) fn ca() -> &'static CertificateAuthority {
    static CA: OnceLock<CertificateAuthority> = OnceLock::new();
    CA.get_or_init(|| {
        let start = crate::now() - time::Duration::days(1);
        let root = new_root(
            NewKeyType::Ed25519,
            "talos",
            Duration::from_secs(10 * 365 * 86_400),
            start,
        )
        .unwrap_or_else(|e| panic!("test CA: {e}"));
        CertificateAuthority::from_pem(&root.cert_pem, &root.key_pem, "fuzz CA", Vec::new(), crate::now())
            .unwrap_or_else(|e| panic!("test CA: {e}"))
    })
}

struct Request {
    username: String,
    roles: Vec<String>,
    ttl: Duration,
    skew: Duration,
}

fn request(lines: &[u8]) -> Request {
    let text = String::from_utf8_lossy(lines);
    let mut lines = text.split('\n');
    let username = lines.next().unwrap_or_default().to_owned();
    let roles = lines
        .next()
        .unwrap_or_default()
        .split(',')
        .filter(|r| !r.is_empty())
        .map(str::to_owned)
        .collect();
    let mut seconds = || Duration::from_secs(lines.next().and_then(|l| l.trim().parse().ok()).unwrap_or(300));
    let ttl = seconds();
    let skew = seconds();
    Request {
        username,
        roles,
        ttl,
        skew,
    }
}

fn split(data: &[u8]) -> (&[u8], Request) {
    let at = data
        .windows(REQUEST_MARKER.len())
        .rposition(|w| w == REQUEST_MARKER);
    match at {
        Some(at) => (&data[..at], request(&data[at + REQUEST_MARKER.len()..])),
        None => (
            data,
            Request {
                username: "alice@example.com".into(),
                roles: vec!["os:reader".into(), "os:etcd:backup".into()],
                ttl: Duration::from_secs(300),
                skew: Duration::from_secs(300),
            },
        ),
    }
}

fn well_formed_role(role: &str) -> bool {
    !role.is_empty()
        && role.len() <= 64
        && role
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":._-".contains(&b))
}

fn well_formed_username(name: &str) -> bool {
    !name.is_empty() && name.chars().count() <= MAX_USERNAME_LEN && !name.chars().any(char::is_control)
}

pub fn run(data: &[u8]) {
    let (csr, req) = split(data);
    let verified = verify_csr(csr);
    if let Ok(spki) = &verified {
        let kind = key_kind(spki);
        assert!(
            matches!(kind, KeyKind::Ed25519 | KeyKind::EcdsaP256)
                || matches!(kind, KeyKind::Rsa { bits } if (2048..=8192).contains(&bits)),
            "a {kind} key was accepted"
        );
    }
    let now = crate::now();
    let leaf_request = LeafRequest {
        username: &req.username,
        roles: &req.roles,
        ttl: req.ttl,
        clock_skew: req.skew,
    };
    let issued = issue(ca(), csr, &leaf_request, now);
    let (spki, issued) = match (verified, issued) {
        (Err(_), Ok(_)) => panic!("a leaf was signed for a CSR that does not verify"),
        (Err(expected), Err(IssueError::Csr(got))) => {
            assert_eq!(
                expected.reason(),
                got.reason(),
                "the CSR was judged twice, differently"
            );
            return;
        }
        (Err(_), Err(other)) => panic!("a CSR that does not verify was refused for another reason: {other}"),
        (Ok(_), Err(IssueError::Csr(e))) => panic!("a verified CSR was refused as a CSR: {e}"),
        (Ok(_), Err(refusal)) => {
            let justified = match &refusal {
                IssueError::NoRoles => req.roles.is_empty(),
                IssueError::InvalidRole(_) => req.roles.iter().any(|r| !well_formed_role(r)),
                IssueError::InvalidUsername => !well_formed_username(&req.username),
                IssueError::InvalidTtl => req.ttl < Duration::from_secs(1),
                _ => false,
            };
            assert!(justified, "refused without a fault of the request: {refusal}");
            return;
        }
        (Ok(spki), Ok(issued)) => (spki, issued),
    };
    assert!(req.roles.iter().all(|r| well_formed_role(r)) && !req.roles.is_empty());
    assert!(well_formed_username(&req.username));
    let leaf = &issued.leaf;
    let signer = ca().signer();
    assert_eq!(leaf.spki(), &spki, "the leaf does not carry the CSR's key");
    assert_eq!(
        leaf.raw_issuer, signer.raw_subject,
        "issuer bytes differ from the CA subject"
    );
    leaf.verify_signed_by(signer.spki())
        .unwrap_or_else(|e| panic!("the leaf is not signed by the CA: {e}"));
    let mut distinct: Vec<&String> = Vec::new();
    for role in &req.roles {
        if !distinct.contains(&role) {
            distinct.push(role);
        }
    }
    let organizations = leaf.subject_organizations();
    assert_eq!(
        organizations.iter().collect::<Vec<_>>(),
        distinct,
        "the leaf's O values are not the roles"
    );
    assert_eq!(issued.roles, organizations);
    assert_eq!(leaf.subject_common_name().as_deref(), Some(req.username.as_str()));
    assert_eq!(
        leaf.ext_key_usage(),
        Some(vec![oid::KP_CLIENT_AUTH]),
        "EKU is not clientAuth only"
    );
    assert!(
        leaf.basic_constraints().is_none_or(|bc| !bc.ca),
        "the leaf is a CA"
    );
    assert!(leaf.not_after() <= signer.not_after(), "the leaf outlives its CA");
    assert!(
        leaf.not_before() <= now && now < leaf.not_after(),
        "the leaf is not valid now"
    );
    let ttl = time::Duration::try_from(req.ttl).unwrap_or(time::Duration::MAX);
    assert!(leaf.not_after() - now <= ttl, "the leaf outlives its TTL");
    assert!(issued.chain_pem.starts_with("-----BEGIN CERTIFICATE-----"));
}
