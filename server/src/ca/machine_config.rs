//! The machine config source: a control plane machine config carries the
//! Talos API CA as `machine.ca` (a worker's has no key), and the CAs still
//! trusted during a rotation as `machine.acceptedCAs`.

use std::path::Path;

use serde::Deserialize;

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

pub(super) fn read(path: &Path) -> Result<Material, CaError> {
    let text = read_text(path)?;
    // Talos machine configs may hold several YAML documents; the
    // v1alpha1 one carries `machine`.
    let mut found = None;
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let value = serde_yaml_ng::Value::deserialize(document).map_err(yaml_error(path))?;
        if value.get("machine").is_some() {
            let doc: MachineConfigDoc = serde_yaml_ng::from_value(value).map_err(yaml_error(path))?;
            found = doc.machine;
            break;
        }
    }
    let machine = found.ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field: "machine",
    })?;
    let pair = machine.ca.ok_or_else(|| CaError::MissingField {
        path: path.to_owned(),
        field: "machine.ca",
    })?;
    let mut material = pair.decode(path, "machine.ca", "machine.ca.crt")?;
    // acceptedCAs travel with the config; they only need a certificate.
    for extra in machine.accepted_c_as {
        if let Some(crt) = extra.crt {
            let pem = decode_base64(&crt, &material.origin, "machine.acceptedCAs[].crt")?;
            material.cert_pem.push('\n');
            material.cert_pem.push_str(&pem);
        }
    }
    Ok(material)
}
