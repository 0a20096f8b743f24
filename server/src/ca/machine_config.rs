//! The machine config source: a control plane machine config carries the
//! Talos API CA as `machine.ca` (a worker's has no key), and the CAs still
//! trusted during a rotation as `machine.acceptedCAs`; the file itself, or
//! the resource `talosctl get machineconfig -o yaml` prints.

use std::path::Path;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::CaError;
use super::material::{EncodedPair, Material, decode_base64, read_text, yaml_error};

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

/// The v1alpha1 document of a machine config, read as `T`: Talos machine
/// configs may hold several YAML documents, and the v1alpha1 one carries
/// `machine`. `talosctl get machineconfig -o yaml` prints a resource whose
/// `spec` is the config's text: that text is read the same way. `None`
/// when no document carries `machine`.
pub(super) fn v1alpha1_document<T: DeserializeOwned>(text: &str, path: &Path) -> Result<Option<T>, CaError> {
    let mut resource_spec = None;
    for document in serde_yaml_ng::Deserializer::from_str(text) {
        let value = serde_yaml_ng::Value::deserialize(document).map_err(yaml_error(path))?;
        if value.get("machine").is_some() {
            return serde_yaml_ng::from_value(value)
                .map(Some)
                .map_err(yaml_error(path));
        }
        if resource_spec.is_none() {
            resource_spec = value
                .get("spec")
                .and_then(|spec| spec.as_str())
                .map(str::to_owned);
        }
    }
    match resource_spec {
        Some(spec) => v1alpha1_document(&spec, path),
        None => Ok(None),
    }
}

/// `machine.ca` and `machine.acceptedCAs` of the machine config at `path`.
pub(super) fn machine_cas(path: &Path) -> Result<(EncodedPair, Vec<EncodedPair>), CaError> {
    let text = read_text(path)?;
    let machine = v1alpha1_document::<MachineConfigDoc>(&text, path)?
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
    let (pair, accepted) = machine_cas(path)?;
    let mut material = pair.decode(path, "machine.ca", "machine.ca.crt")?;
    // acceptedCAs travel with the config; they only need a certificate, and
    // are trusted next to the root, never part of its chain.
    for extra in accepted {
        if let Some(crt) = extra.crt {
            let pem = decode_base64(&crt, &material.origin, "machine.acceptedCAs[].crt")?;
            material.accepted_pem.push(pem);
        }
    }
    Ok(material)
}
