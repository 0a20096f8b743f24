//! The Talos side of accepted-CA mode, as machine-config patches people can
//! review and re-apply: the patch that adds a client-only CA to
//! `machine.acceptedCAs`, and the one that removes it.
//!
//! Talos applies strategic merge patches, which append to lists: a patch
//! re-applied by automation would add the CA again each time. So each
//! change comes in two forms:
//! - the *append* form, one patch that adds the CA (adding only; for a new
//!   cluster's `talosctl gen config --config-patch-control-plane`, or once
//!   by hand);
//! - the *replace* form, two patches applied in one call: the first deletes
//!   the list (`acceptedCAs: {$patch: delete}`), the second writes the whole
//!   new list, so it must carry the CAs already accepted. Applied any number
//!   of times, it leaves the same list; it is the only way to remove a CA.
//!   (JSON 6902 patches would say this more directly, but Talos refuses
//!   them on multi-document configs.)
//!
//! The current list comes from a machine config: the file itself, or what
//! `talosctl get machineconfig -o yaml` prints (the config in `spec`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_yaml_ng::{Mapping, Value};

use super::material::parse_certificates;
use crate::x509::ParsedCertificate;

/// One entry of `machine.acceptedCAs`, as written in the config.
#[derive(Debug, Clone)]
pub struct AcceptedEntry {
    /// The `crt` value, exactly as found (base64 of PEM).
    pub crt: String,
    /// Its certificates; `None` when the value cannot be read (kept as is).
    pub certs: Option<Vec<ParsedCertificate>>,
}

impl AcceptedEntry {
    fn of(cert: &ParsedCertificate) -> Self {
        Self {
            crt: STANDARD.encode(cert.to_pem()),
            certs: Some(vec![cert.clone()]),
        }
    }

    fn holds(&self, cert: &ParsedCertificate) -> bool {
        self.certs
            .as_ref()
            .is_some_and(|certs| certs.iter().any(|c| c.der == cert.der))
    }

    /// The entry without `cert`: as it is when it does not hold it, none
    /// when it held `cert` alone, and the other certificates when it held
    /// more (Talos trusts every certificate of an entry).
    fn without(&self, cert: &ParsedCertificate) -> Option<Self> {
        if !self.holds(cert) {
            return Some(self.clone());
        }
        let others: Vec<ParsedCertificate> = self
            .certs
            .iter()
            .flatten()
            .filter(|c| c.der != cert.der)
            .cloned()
            .collect();
        if others.is_empty() {
            return None;
        }
        let pem: String = others.iter().map(ParsedCertificate::to_pem).collect();
        Some(Self {
            crt: STANDARD.encode(pem),
            certs: Some(others),
        })
    }
}

/// Why the current list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    #[error("not YAML: {0}")]
    Yaml(String),
    #[error(
        "no v1alpha1 machine config document (one with `machine`) in it, nor a MachineConfig resource \
         from `talosctl get machineconfig -o yaml`"
    )]
    NoMachineConfig,
    #[error("`machine.acceptedCAs` is not a list of {{crt: ...}} entries")]
    NotAList,
    #[error(
        "entry {0} of `machine.acceptedCAs` is not base64 of PEM certificates this tool can read; \
         refusing to write a list that might keep the CA (check that entry by hand)"
    )]
    UnreadableEntry(usize),
}

/// The `machine.acceptedCAs` entries of a machine config (or of a
/// MachineConfig resource as talosctl prints it).
pub fn current_accepted_cas(text: &str) -> Result<Vec<AcceptedEntry>, PatchError> {
    let configs =
        super::machine_config::config_documents(text).map_err(|e| PatchError::Yaml(e.to_string()))?;
    let machine = configs
        .iter()
        .find_map(|d| d.get("machine"))
        .ok_or(PatchError::NoMachineConfig)?;
    let Some(list) = machine.get("acceptedCAs") else {
        return Ok(Vec::new());
    };
    if list.is_null() {
        return Ok(Vec::new());
    }
    let list = list.as_sequence().ok_or(PatchError::NotAList)?;
    list.iter()
        .map(|entry| {
            let crt = entry
                .get("crt")
                .and_then(Value::as_str)
                .ok_or(PatchError::NotAList)?;
            let certs = super::material::decode_base64_bytes(crt)
                .ok()
                .and_then(|pem| String::from_utf8(pem).ok())
                .and_then(|pem| parse_certificates(&pem, "machine.acceptedCAs").ok());
            Ok(AcceptedEntry {
                crt: crt.to_owned(),
                certs,
            })
        })
        .collect()
}

/// What a change prints: the forms, and the list Talos ends with.
#[derive(Debug, Clone)]
pub struct AcceptedCasPatches {
    /// The append form (adding only): one patch.
    pub append: Option<String>,
    /// The replace form, first patch: delete the list.
    pub delete_list: String,
    /// The replace form, second patch: the whole new list.
    pub new_list: String,
    /// The list after the change.
    pub resulting: Vec<AcceptedEntry>,
    /// Whether the change changes anything (the CA was not yet there, or
    /// was there, for a removal).
    pub changes: bool,
}

/// The patches that add `ca` to the `current` list.
pub fn add(current: &[AcceptedEntry], ca: &ParsedCertificate) -> AcceptedCasPatches {
    let present = current.iter().any(|e| e.holds(ca));
    let mut resulting = current.to_vec();
    if !present {
        resulting.push(AcceptedEntry::of(ca));
    }
    AcceptedCasPatches {
        append: Some(list_patch(&[AcceptedEntry::of(ca)])),
        delete_list: delete_patch(),
        new_list: list_patch(&resulting),
        resulting,
        changes: !present,
    }
}

/// The patches that remove `ca` from the `current` list (replace form only:
/// Talos's per-item `$patch: delete` is not relied on). An entry holding
/// other certificates besides `ca` keeps them. An entry that cannot be read
/// refuses the removal: it might be `ca` written another way, and a cut-off
/// that quietly keeps the CA is worse than none.
pub fn remove(current: &[AcceptedEntry], ca: &ParsedCertificate) -> Result<AcceptedCasPatches, PatchError> {
    if let Some(index) = current.iter().position(|e| e.certs.is_none()) {
        return Err(PatchError::UnreadableEntry(index));
    }
    let resulting: Vec<AcceptedEntry> = current.iter().filter_map(|e| e.without(ca)).collect();
    let changes = current.iter().any(|e| e.holds(ca));
    Ok(AcceptedCasPatches {
        append: None,
        delete_list: delete_patch(),
        new_list: list_patch(&resulting),
        changes,
        resulting,
    })
}

fn machine_patch(accepted: Value) -> String {
    let mut machine = Mapping::new();
    machine.insert("acceptedCAs".into(), accepted);
    let mut root = Mapping::new();
    root.insert("machine".into(), Value::Mapping(machine));
    // Serializing a mapping of strings cannot fail.
    serde_yaml_ng::to_string(&Value::Mapping(root)).unwrap_or_default()
}

fn delete_patch() -> String {
    let mut delete = Mapping::new();
    delete.insert("$patch".into(), "delete".into());
    machine_patch(Value::Mapping(delete))
}

fn list_patch(entries: &[AcceptedEntry]) -> String {
    let list = entries
        .iter()
        .map(|entry| {
            let mut item = Mapping::new();
            item.insert("crt".into(), entry.crt.clone().into());
            Value::Mapping(item)
        })
        .collect();
    machine_patch(Value::Sequence(list))
}

#[cfg(test)]
mod tests {
    use time::OffsetDateTime;

    use super::*;
    use crate::ca::generate::{NewKeyType, new_client_ca};

    fn ca() -> ParsedCertificate {
        let now = OffsetDateTime::now_utc();
        new_client_ca(
            NewKeyType::Ed25519,
            "prod",
            std::time::Duration::from_secs(86400),
            now,
        )
        .unwrap()
        .cert
    }

    fn config_with(entries: &[&ParsedCertificate]) -> String {
        let list: Vec<String> = entries
            .iter()
            .map(|c| format!("    - crt: {}\n", STANDARD.encode(c.to_pem())))
            .collect();
        format!(
            "version: v1alpha1\nmachine:\n  type: controlplane\n  acceptedCAs:\n{}---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: cp-1\n",
            list.concat()
        )
    }

    #[test]
    fn the_current_list_is_read_from_a_config_or_a_resource() {
        let (old, ours) = (ca(), ca());
        let config = config_with(&[&old]);
        let entries = current_accepted_cas(&config).unwrap();
        assert_eq!(entries.len(), 1);
        assert!(entries[0].holds(&old));
        let indented: String = config.lines().map(|l| format!("    {l}\n")).collect();
        let resource = format!(
            "node: 10.5.0.2\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    id: v1alpha1\nspec: |\n{indented}"
        );
        let entries = current_accepted_cas(&resource).unwrap();
        assert!(entries[0].holds(&old) && !entries[0].holds(&ours));
        let none = current_accepted_cas("version: v1alpha1\nmachine:\n  type: worker\n").unwrap();
        assert!(none.is_empty());
        assert!(matches!(
            current_accepted_cas("cluster: {}\n"),
            Err(PatchError::NoMachineConfig)
        ));
        assert!(matches!(
            current_accepted_cas("machine:\n  acceptedCAs: nope\n"),
            Err(PatchError::NotAList)
        ));
    }

    #[test]
    fn adding_keeps_what_is_accepted_and_adds_once() {
        let (old, ours) = (ca(), ca());
        let current = current_accepted_cas(&config_with(&[&old])).unwrap();
        let patches = add(&current, &ours);
        assert!(patches.changes);
        assert_eq!(patches.resulting.len(), 2);
        assert!(patches.resulting[0].holds(&old) && patches.resulting[1].holds(&ours));
        assert_eq!(
            patches.delete_list,
            "machine:\n  acceptedCAs:\n    $patch: delete\n"
        );
        // Once there, adding again changes nothing.
        let again = add(&patches.resulting, &ours);
        assert!(!again.changes);
        assert_eq!(again.new_list, patches.new_list);
    }

    #[test]
    fn removing_keeps_the_others_and_has_no_append_form() {
        let (old, ours) = (ca(), ca());
        let current = current_accepted_cas(&config_with(&[&old, &ours])).unwrap();
        let patches = remove(&current, &ours).unwrap();
        assert!(patches.changes && patches.append.is_none());
        assert_eq!(patches.resulting.len(), 1);
        assert!(patches.resulting[0].holds(&old));
        let gone = remove(&patches.resulting, &ours).unwrap();
        assert!(!gone.changes);
        let empty = remove(&current_accepted_cas(&config_with(&[&ours])).unwrap(), &ours).unwrap();
        assert_eq!(empty.new_list, "machine:\n  acceptedCAs: []\n");
    }

    #[test]
    fn removing_from_an_entry_of_several_certificates_keeps_the_others() {
        let (old, ours) = (ca(), ca());
        let bundled = format!("{}{}", ours.to_pem(), old.to_pem());
        let config = format!(
            "machine:\n  acceptedCAs:\n    - crt: {}\n",
            STANDARD.encode(bundled)
        );
        let patches = remove(&current_accepted_cas(&config).unwrap(), &ours).unwrap();
        assert!(patches.changes);
        assert_eq!(patches.resulting.len(), 1);
        let kept = &patches.resulting[0];
        assert!(kept.holds(&old) && !kept.holds(&ours));
        assert_eq!(kept.crt, STANDARD.encode(old.to_pem()));
        // Once out, removing again changes nothing.
        assert!(!remove(&patches.resulting, &ours).unwrap().changes);
    }

    #[test]
    fn a_wrapped_entry_is_read_and_an_unreadable_one_stops_a_removal() {
        let ours = ca();
        // As `base64 ca.crt` writes it: 76 columns, then a line break.
        let encoded = STANDARD.encode(ours.to_pem());
        let wrapped: Vec<String> = encoded
            .as_bytes()
            .chunks(76)
            .map(|c| format!("        {}\n", String::from_utf8_lossy(c)))
            .collect();
        let config = format!(
            "version: v1alpha1\nmachine:\n  acceptedCAs:\n    - crt: |\n{}",
            wrapped.concat()
        );
        let current = current_accepted_cas(&config).unwrap();
        assert!(current[0].holds(&ours), "Go's base64 reads it; so must we");
        let patches = remove(&current, &ours).unwrap();
        assert!(patches.changes && patches.resulting.is_empty());

        let unreadable = "version: v1alpha1\nmachine:\n  acceptedCAs:\n    - crt: not-base64!\n";
        let current = current_accepted_cas(unreadable).unwrap();
        assert!(matches!(
            remove(&current, &ours),
            Err(PatchError::UnreadableEntry(0))
        ));
    }
}
