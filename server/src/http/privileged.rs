//! Auditors and admins: a caller authenticated like any other, then checked
//! against the configured `auditors` or `admins` and the deny list. Every
//! refusal is recorded; the action itself is committed with its record in
//! one transaction that checks the deny list again ([`commit`]).

use serde_json::Value;
use talos_sso_api::ErrorCode;

use super::caller::Caller;
use super::error::ApiError;
use super::gate::{Admitted, Gate, IdentityLimit};
use crate::app::App;
use crate::audit::store::{Append, Appended, DenyChange};
use crate::audit::{AuditRecord, StoredRecord};
use crate::identity::VerifiedIdentity;
use crate::policy::AppRoleSelector;

/// Who may do what beyond asking for a certificate.
#[derive(Debug, Clone, Copy)]
pub enum Privilege {
    Auditor,
    Admin,
}

/// Auditors and admins are people, or applications (their own tokens,
/// client credentials), of the login issuer: a trusted issuer (workloads,
/// another directory) can assert any group or role name. An application is
/// in by an app role or by its client id; a person never by a client id.
/// An app role counts only in the tenant its selector names (or the login
/// issuer's only tenant): another allowed tenant's administrators assign
/// the same role values to whom they like. `tenants` are the login
/// issuer's (`identity.allowed_tenants`).
pub(super) fn is_member(
    list: &crate::config::GroupList,
    tenants: &[String],
    verified: &VerifiedIdentity,
) -> bool {
    if !verified.from_login_issuer() {
        return false;
    }
    let home = crate::config::home_tenant(tenants);
    let tenant = verified.tenant.as_deref();
    let by_client_id = verified
        .application
        .as_ref()
        .is_some_and(|client_id| list.client_ids.iter().any(|c| c.eq_ignore_ascii_case(client_id)));
    by_client_id
        || list
            .groups
            .iter()
            .any(|g| verified.groups.iter().any(|have| have.eq_ignore_ascii_case(g)))
        || list
            .app_roles
            .iter()
            .any(|r| AppRoleSelector::parse(r).matches(home, tenant, &verified.app_roles))
}

pub(super) fn identity_denied() -> ApiError {
    ApiError::new(
        ErrorCode::IdentityDenied,
        "you are blocked on this server (deny list); ask the platform team",
    )
}

/// Pass `caller` through the gate and check `privilege`; every refusal is
/// recorded. On success, the request (event `event`, with `details`) is
/// admitted: its record is committed with the action
/// ([`Admitted::into_success`], [`commit`]), or with a later refusal.
pub async fn authorize<'a>(
    app: &'a App,
    caller: &'a Caller,
    privilege: Privilege,
    event: &str,
    details: Value,
) -> Result<Admitted<'a>, ApiError> {
    let admitted = Gate::open(app, caller, event)
        .with_details(details)
        .pass(IdentityLimit::Api)
        .await?;
    let settings = admitted.settings().clone();
    let (list, code, message) = match privilege {
        Privilege::Auditor => (
            &settings.config.auditors,
            ErrorCode::NotAnAuditor,
            "reading the audit trail needs membership in one of the `auditors` groups or app roles \
             (or, for an application, one of its client ids)",
        ),
        Privilege::Admin => (
            &settings.config.admins,
            ErrorCode::NotAnAdmin,
            "changing the deny list needs membership in one of the `admins` groups or app roles \
             (or, for an application, one of its client ids)",
        ),
    };
    let verified = &admitted.verified;
    if !is_member(list, &settings.config.identity.allowed_tenants, verified) {
        return Err(admitted.refuse(ApiError::new(code, message)).await);
    }
    // A deny-listed auditor or admin is out too. Checked here so that they
    // get no answer computed for them, and again in the transaction that
    // commits the action ([`commit`]), so no change slips between.
    if app
        .audit
        .store()
        .is_denied(&verified.subject, &verified.username)
        .await?
    {
        return Err(admitted.refuse(identity_denied()).await);
    }
    Ok(admitted)
}

/// Commit the record of a privileged action, with its deny-list change, in
/// one transaction that also checks the caller is not on the deny list:
/// refused there, neither the change nor the answer happens.
pub async fn commit(
    app: &App,
    record: AuditRecord,
    deny_change: Option<DenyChange>,
) -> Result<StoredRecord, ApiError> {
    let appended = app
        .audit
        .append(Append {
            record,
            claim: None,
            deny_check: true,
            deny_change,
        })
        .await?;
    match appended {
        Appended::Recorded(stored) => Ok(stored),
        Appended::Denied(_) => Err(identity_denied()),
        Appended::Replayed(_) => Err(ApiError::audit_unavailable()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GroupList;

    fn caller(application: Option<&str>, app_roles: &[&str], groups: &[&str]) -> VerifiedIdentity {
        VerifiedIdentity {
            issuer_name: crate::config::LOGIN_ISSUER.into(),
            issuer: "https://login.example/t/v2.0".into(),
            tenant: Some("t".into()),
            subject: "oid-1".into(),
            username: application.unwrap_or("sam@example.com").into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            app_roles: app_roles.iter().map(|r| r.to_string()).collect(),
            token_id: None,
            signed_sha256: "00".repeat(32),
            issued_at: None,
            expires_at: time::OffsetDateTime::UNIX_EPOCH,
            claims: Default::default(),
            application: application.map(str::to_owned),
            workload: None,
        }
    }

    #[test]
    fn applications_are_auditors_by_client_id_or_app_role_and_people_never_by_client_id() {
        let auditors = GroupList {
            groups: vec!["security".into()],
            app_roles: vec!["Talos.Auditor".into()],
            client_ids: vec!["SIEM-client".into()],
        };
        let tenants = ["t".to_owned()];
        assert!(is_member(
            &auditors,
            &tenants,
            &caller(Some("siem-client"), &[], &[])
        ));
        assert!(is_member(
            &auditors,
            &tenants,
            &caller(Some("other"), &["Talos.Auditor"], &[])
        ));
        assert!(!is_member(
            &auditors,
            &tenants,
            &caller(Some("other"), &["Talos.Reader"], &[])
        ));
        // A person whose username happens to be a client id is no application.
        assert!(!is_member(&auditors, &tenants, &caller(None, &[], &[])));
        let mut named = caller(None, &[], &[]);
        named.username = "siem-client".into();
        assert!(!is_member(&auditors, &tenants, &named));
        assert!(is_member(&auditors, &tenants, &caller(None, &[], &["SECURITY"])));
        // Another issuer's tokens are never auditors.
        let mut workload = caller(Some("siem-client"), &["Talos.Auditor"], &[]);
        workload.issuer_name = "ci".into();
        assert!(!is_member(&auditors, &tenants, &workload));
        // Nor by a group of the login issuer's that another issuer asserts.
        let mut colleague = caller(None, &[], &["security"]);
        colleague.issuer_name = "partner".into();
        assert!(!is_member(&auditors, &tenants, &colleague));
    }

    #[test]
    fn an_app_role_makes_an_auditor_only_in_the_tenant_it_names() {
        let (home, partner) = (
            "aaaaaaaa-0000-4000-8000-00000000000a",
            "bbbbbbbb-0000-4000-8000-00000000000b",
        );
        let both = [home.to_owned(), partner.to_owned()];
        let admins = GroupList {
            app_roles: vec![format!("{}/Talos.Admin", home.to_uppercase())],
            ..GroupList::default()
        };
        let of = |tenant: &str, application: Option<&str>| VerifiedIdentity {
            tenant: Some(tenant.into()),
            ..caller(application, &["Talos.Admin"], &[])
        };
        assert!(is_member(&admins, &both, &of(home, None)));
        assert!(is_member(&admins, &both, &of(home, Some("automation"))));
        // The partner's administrators assigned the same role value.
        assert!(!is_member(&admins, &both, &of(partner, None)));
        assert!(!is_member(&admins, &both, &of(partner, Some("automation"))));
        // A role alone is the only tenant's; with several, nobody's.
        let alone = GroupList {
            app_roles: vec!["Talos.Admin".into()],
            ..GroupList::default()
        };
        let only_home = [home.to_owned()];
        assert!(is_member(&alone, &only_home, &of(home, None)));
        assert!(!is_member(&alone, &only_home, &of(partner, None)));
        assert!(!is_member(&alone, &both, &of(home, None)));
        // A login issuer without tenants: the role as written.
        let tenantless = VerifiedIdentity {
            tenant: None,
            ..caller(None, &["Talos.Admin"], &[])
        };
        assert!(is_member(&alone, &[], &tenantless));
        assert!(!is_member(&admins, &both, &tenantless));
    }
}
