//! Kubernetes projected service-account tokens as a workload issuer: the
//! subject is `system:serviceaccount:NAMESPACE:NAME`, and the
//! `kubernetes.io` claim, which must agree with it, names the namespace,
//! the service account, the pod and the node. Rules name them flat:
//! `namespace`, `service_account`, `service_account_uid`, `pod`,
//! `pod_uid`, `node`, and `sub`. A cluster whose issuer is not reachable
//! publishes its keys to a `jwks_file` instead of discovery.

use std::collections::BTreeMap;

use serde_json::Value;

use super::Registration;
use super::workload::{Identified, Schema, registration, required};
use crate::identity::token::{ClaimSet, TokenError};

pub(super) const SCHEMA: Schema = Schema {
    kind: talos_sso_api::audit::workload::KUBERNETES,
    claims: &[
        "namespace",
        "service_account",
        "service_account_uid",
        "pod",
        "pod_uid",
        "node",
        "sub",
    ],
    anchors: &["namespace", "service_account_uid", "sub"],
    subject: "sub",
    name: "sub",
    markers: &["kubernetes.io"],
    identify,
};

pub(super) const KIND: Registration = registration(&SCHEMA);

/// `object.field` of the `kubernetes.io` claim, as text.
fn nested<'a>(claim: &'a Value, object: &str, field: &str) -> Option<&'a str> {
    claim.get(object)?.get(field)?.as_str().filter(|s| !s.is_empty())
}

fn identify(_schema: &Schema, claims: &ClaimSet) -> Result<Identified, TokenError> {
    let sub = required(claims, "sub")?;
    let (namespace, name) = sub
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
        .ok_or(TokenError::Malformed(
            "`sub` is not system:serviceaccount:NAMESPACE:NAME",
        ))?;
    let k8s = claims
        .get("kubernetes.io")
        .filter(|v| v.is_object())
        .ok_or(TokenError::Malformed("no `kubernetes.io` claim"))?;
    let claimed_namespace = k8s.get("namespace").and_then(Value::as_str);
    if claimed_namespace != Some(namespace) || nested(k8s, "serviceaccount", "name") != Some(name) {
        return Err(TokenError::Malformed(
            "the `kubernetes.io` claim names another service account than `sub`",
        ));
    }
    let mut offered = BTreeMap::new();
    let mut put = |key: &str, value: Option<&str>| {
        if let Some(value) = value.filter(|v| v.len() <= super::workload::MAX_CLAIM_LEN) {
            offered.insert(key.to_owned(), value.to_owned());
        }
    };
    put("sub", Some(sub));
    put("namespace", Some(namespace));
    put("service_account", Some(name));
    put("service_account_uid", nested(k8s, "serviceaccount", "uid"));
    put("pod", nested(k8s, "pod", "name"));
    put("pod_uid", nested(k8s, "pod", "uid"));
    put("node", nested(k8s, "node", "name"));
    Ok(Identified {
        subject: sub.to_owned(),
        name: sub.to_owned(),
        claims: offered,
    })
}
