//! The machine config source: a control plane machine config carries the
//! Talos API CA as `machine.ca` (a worker's has no key), and the CAs still
//! trusted during a rotation as `machine.acceptedCAs`; the file itself, or
//! the resource `talosctl get machineconfig -o yaml` prints.

use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use super::CaError;
use super::checks::can_vouch_for_a_server;
use super::material::{EncodedPair, Material, decode_base64, parse_certificates, read_text, yaml_error};
use crate::x509::ParsedCertificate;

/// A v1alpha1 machine config: only the part we read.
#[derive(Deserialize)]
struct MachineConfigDoc {
    machine: Option<MachineSection>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MachineSection {
    ca: Option<EncodedPair>,
    #[serde(default)]
    accepted_c_as: Vec<EncodedPair>,
}

/// The YAML documents of a machine config: the file's own, or, for what
/// `talosctl get machineconfig -o yaml` prints (a resource whose `spec` is
/// the config's text), those of that text; unwrapped once, never again.
pub(super) fn config_documents(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    let documents = yaml_documents(text)?;
    if documents.iter().any(|d| d.get("machine").is_some()) {
        return Ok(documents);
    }
    match documents.iter().find_map(|d| d.get("spec")?.as_str()) {
        Some(spec) => yaml_documents(spec),
        None => Ok(documents),
    }
}

fn yaml_documents(text: &str) -> Result<Vec<Value>, serde_yaml_ng::Error> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(Value::deserialize)
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

/// The v1alpha1 document of a machine config ([`config_documents`]), read
/// as `T`: Talos machine configs may hold several YAML documents, and the
/// v1alpha1 one carries `machine`. `None` when none does.
pub(super) fn v1alpha1_document<T: DeserializeOwned>(text: &str, path: &Path) -> Result<Option<T>, CaError> {
    config_documents(text)
        .map_err(yaml_error(path))?
        .into_iter()
        .find(|d| d.get("machine").is_some())
        .map(|d| serde_yaml_ng::from_value(d).map_err(yaml_error(path)))
        .transpose()
}

/// `machine.ca` and `machine.acceptedCAs` of a machine config's `text`,
/// read from `path`.
pub(super) fn machine_cas(text: &str, path: &Path) -> Result<(EncodedPair, Vec<EncodedPair>), CaError> {
    let machine = v1alpha1_document::<MachineConfigDoc>(text, path)?
        .and_then(|doc| doc.machine)
        .ok_or_else(|| CaError::MissingField {
            path: path.to_owned(),
            field: "machine",
        })?;
    let pair = machine.ca.ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field: "machine.ca",
    })?;
    Ok((pair, machine.accepted_c_as))
}

pub(super) fn read(path: &Path) -> Result<Material, CaError> {
    let (pair, accepted) = machine_cas(&read_text(path)?, path)?;
    let mut material = pair.decode(path, "machine.ca", "machine.ca.crt")?;
    // acceptedCAs travel with the config; they only need a certificate, and
    // are trusted next to the root, never part of its chain.
    material.accepted = server_cas(accepted, path)?;
    Ok(material)
}

/// The `machine.acceptedCAs` that can verify apid, for the talosconfig
/// `ca`: a client-only CA listed there (talos-sso's own) has no place in it.
pub(super) fn server_cas(accepted: Vec<EncodedPair>, path: &Path) -> Result<Vec<ParsedCertificate>, CaError> {
    let origin = format!("{} (machine.acceptedCAs)", path.display());
    let mut certs = Vec::new();
    for crt in accepted.into_iter().filter_map(|entry| entry.crt) {
        let pem = decode_base64(&crt, &origin, "crt")?;
        certs.extend(
            parse_certificates(&pem, &origin)?
                .into_iter()
                .filter(can_vouch_for_a_server),
        );
    }
    Ok(certs)
}
