//! Accepted-CA mode at load time: where the Talos cluster CA certificate
//! (`talos_ca`) may come from, every refusal with its code, and what goes
//! into the talosconfig `ca` (the Talos CA and `accepted_cas`, never the
//! client-only CA that signs). And the machine config of a cluster-CA
//! cluster whose `machine.acceptedCAs` has entries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use talos_sso_server::ca::generate::{self, NewCa, NewKeyType};
use talos_sso_server::ca::{CaError, CaOptions, CertificateAuthority, TrustMode, parse_certificates};
use talos_sso_server::config::{CaSource, TalosCaSource};
use talos_sso_tests::material::{fixture, private_copy, read_fixture, write_file};
use time::OffsetDateTime;

fn code(result: Result<CertificateAuthority, CaError>) -> &'static str {
    match result {
        Ok(_) => "loaded",
        Err(e) => e.code(),
    }
}

/// A base64 PEM field of a Talos YAML file, decoded.
fn pem_field(yaml: &str, path: &[&str]) -> String {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).unwrap();
    let node = path.iter().fold(&value, |node, key| &node[*key]);
    String::from_utf8(STANDARD.decode(node.as_str().unwrap()).unwrap()).unwrap()
}

/// The first document of a multi-document machine config, parsed.
fn v1alpha1(path: &str) -> String {
    read_fixture(path).split("\n---\n").next().unwrap().to_owned()
}

/// A client-only CA of talos-sso's own, its files in `dir`.
fn client_ca(dir: &Path, name: &str) -> (CaSource, NewCa) {
    let ca = generate::new_client_ca(
        NewKeyType::Ed25519,
        "prod",
        Duration::from_secs(30 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    let source = CaSource::Files {
        cert_file: write_file(dir, &format!("{name}.crt"), &ca.cert_pem, 0o644),
        key_file: write_file(dir, &format!("{name}.key"), &ca.key_pem, 0o600),
    };
    (source, ca)
}

/// A Talos-style root (serverAuth + clientAuth), as `talosctl gen secrets` makes.
fn talos_style_root() -> NewCa {
    generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(3650 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap()
}

fn load_with(
    source: &CaSource,
    talos_ca: Option<TalosCaSource>,
    accepted_cas: Vec<PathBuf>,
) -> Result<CertificateAuthority, CaError> {
    let options = CaOptions {
        accepted_cas,
        talos_ca,
        ..Default::default()
    };
    CertificateAuthority::load(source, &options, OffsetDateTime::now_utc())
}

/// The trust bundle (talosconfig `ca`), as DER.
fn bundle(ca: &CertificateAuthority) -> Vec<Vec<u8>> {
    parse_certificates(ca.trust_bundle_pem(), "bundle")
        .unwrap()
        .into_iter()
        .map(|c| c.der)
        .collect()
}

fn der(pem: &str) -> Vec<u8> {
    parse_certificates(pem, "pem").unwrap().remove(0).der
}

#[test]
fn a_talos_ca_source_holding_the_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, _) = client_ca(dir.path(), "client");
    let with = |talos_ca: TalosCaSource| code(load_with(&signer, Some(talos_ca), Vec::new()));
    let bundle_yaml = read_fixture("talos/secrets-bundle.yaml");
    let cases = [
        TalosCaSource::SecretsBundle(private_copy(dir.path(), "talos/secrets-bundle.yaml")),
        TalosCaSource::MachineConfig(private_copy(dir.path(), "talos/controlplane-v1.12.yaml")),
    ];
    for source in cases {
        assert_eq!(with(source.clone()), "talos_ca_key_present", "{source}");
    }
    // A PEM file with the certificate and a key, under each label a key has.
    let crt = pem_field(&bundle_yaml, &["certs", "os", "crt"]);
    let key = pem_field(&bundle_yaml, &["certs", "os", "key"]);
    let etcd_key = pem_field(&bundle_yaml, &["certs", "etcd", "key"]);
    assert!(etcd_key.contains("BEGIN EC PRIVATE KEY"));
    let pkcs8 = key.replace("ED25519 PRIVATE KEY", "PRIVATE KEY");
    for (i, key) in [key.as_str(), pkcs8.as_str(), etcd_key.as_str()]
        .iter()
        .enumerate()
    {
        let file = write_file(
            dir.path(),
            &format!("with-key-{i}.pem"),
            &format!("{crt}{key}"),
            0o600,
        );
        assert_eq!(
            with(TalosCaSource::CertFile(file)),
            "talos_ca_key_present",
            "case {i}"
        );
    }
    // The same sources without the key name the Talos CA.
    let crt_file = write_file(dir.path(), "os.crt", &crt, 0o644);
    assert_eq!(with(TalosCaSource::CertFile(crt_file)), "loaded");
    // With only the os key blanked, the bundle still holds every other
    // secret (the trustd token, the etcd and Kubernetes CA keys): refused.
    let encoded_key = STANDARD.encode(&key);
    let text = bundle_yaml.replacen(&encoded_key, "''", 1);
    assert_ne!(text, bundle_yaml, "the os key is in the bundle");
    let file = write_file(dir.path(), "os-key-blanked-bundle.yaml", &text, 0o644);
    let error = load_with(&signer, Some(TalosCaSource::SecretsBundle(file)), Vec::new()).unwrap_err();
    assert_eq!(error.code(), "talos_ca_secret_present", "{error}");
    // Every secret redacted: the Talos CA certificate is read.
    let file = write_file(
        dir.path(),
        "redacted-bundle.yaml",
        &redact_secrets(&bundle_yaml),
        0o644,
    );
    let ca = load_with(&signer, Some(TalosCaSource::SecretsBundle(file)), Vec::new()).unwrap();
    assert_eq!(bundle(&ca), [der(&crt)]);
}

/// `text` with every secret-like value (`key`, `*token*`, `*secret*`,
/// `*password*`) replaced by `******`, as Talos redacts them.
fn redact_secrets(text: &str) -> String {
    use serde::Deserialize;
    fn redact(value: &mut serde_yaml_ng::Value) {
        match value {
            serde_yaml_ng::Value::Mapping(mapping) => {
                for (key, value) in mapping.iter_mut() {
                    let name = key.as_str().unwrap_or_default().to_ascii_lowercase();
                    let secret =
                        name == "key" || ["token", "secret", "password"].iter().any(|w| name.contains(w));
                    if secret && value.as_str().is_some_and(|v| !v.is_empty()) {
                        *value = "******".into();
                    } else {
                        redact(value);
                    }
                }
            }
            serde_yaml_ng::Value::Sequence(items) => items.iter_mut().for_each(redact),
            _ => {}
        }
    }
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|document| {
            let mut value = serde_yaml_ng::Value::deserialize(document).unwrap();
            redact(&mut value);
            serde_yaml_ng::to_string(&value).unwrap()
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn the_signer_must_be_a_self_signed_client_only_ca_other_than_the_talos_ca() {
    let dir = tempfile::tempdir().unwrap();
    let talos = talos_style_root();
    let talos_file = write_file(dir.path(), "talos-ca.crt", &talos.cert_pem, 0o644);
    let talos_ca = || Some(TalosCaSource::CertFile(talos_file.clone()));

    // A Talos-style root signing in accepted-CA mode could vouch for apid.
    let root = talos_style_root();
    let root_source = CaSource::Files {
        cert_file: write_file(dir.path(), "root.crt", &root.cert_pem, 0o644),
        key_file: write_file(dir.path(), "root.key", &root.key_pem, 0o600),
    };
    let error = load_with(&root_source, talos_ca(), Vec::new()).unwrap_err();
    assert_eq!(error.code(), "ca_not_client_only");
    assert!(
        error.to_string().contains("serverAuth") || error.to_string().contains("1.3.6.1.5.5.7.3.1"),
        "{error}"
    );

    // A client CA without talos_ca: talosctl could not verify apid with it.
    let (client, client_ca) = client_ca(dir.path(), "client");
    assert_eq!(
        code(load_with(&client, None, Vec::new())),
        "ca_client_only_without_talos_ca"
    );
    assert_eq!(code(load_with(&client, talos_ca(), Vec::new())), "loaded");

    // talos_ca naming the client CA itself.
    let itself = write_file(dir.path(), "itself.crt", &client_ca.cert_pem, 0o644);
    assert_eq!(
        code(load_with(
            &client,
            Some(TalosCaSource::CertFile(itself)),
            Vec::new()
        )),
        "talos_ca_is_signer"
    );

    // An intermediate under the Talos root (clientAuth only, but a chain).
    let now = OffsetDateTime::now_utc();
    let loaded_talos =
        CertificateAuthority::from_pem(&talos.cert_pem, &talos.key_pem, "talos", Vec::new(), now).unwrap();
    let intermediate = generate::new_intermediate(
        &loaded_talos,
        NewKeyType::Ed25519,
        "talos-sso",
        Duration::from_secs(86400),
        now,
    )
    .unwrap();
    let chain = CaSource::Files {
        cert_file: write_file(dir.path(), "chain.crt", &intermediate.cert_pem, 0o644),
        key_file: write_file(dir.path(), "chain.key", &intermediate.key_pem, 0o600),
    };
    assert_eq!(
        code(load_with(&chain, talos_ca(), Vec::new())),
        "ca_not_self_signed"
    );
    // Without talos_ca the same files are intermediate mode.
    assert_eq!(
        load_with(&chain, None, Vec::new()).unwrap().mode(),
        TrustMode::Intermediate
    );
}

#[test]
fn a_talosconfig_names_the_talos_ca_of_a_context() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, _) = client_ca(dir.path(), "client");
    let text = read_fixture("talos/talosconfig-2021-admin.yaml");
    let expected = der(&pem_field(&text, &["contexts", "no-roles", "ca"]));
    // An administrator's talosconfig carries a client key the server has no
    // use for: refused; the same file without `crt` and `key` is read.
    let with_key = TalosCaSource::Talosconfig {
        path: fixture("talos/talosconfig-2021-admin.yaml"),
        context: None,
    };
    assert_eq!(
        code(load_with(&signer, Some(with_key), Vec::new())),
        "talos_ca_client_key_present"
    );
    let mut stripped: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    for (_, context) in stripped["contexts"].as_mapping_mut().unwrap() {
        let context = context.as_mapping_mut().unwrap();
        context.remove("crt");
        context.remove("key");
    }
    let path = write_file(
        dir.path(),
        "talosconfig",
        &serde_yaml_ng::to_string(&stripped).unwrap(),
        0o600,
    );
    let talosconfig = |context: Option<&str>| TalosCaSource::Talosconfig {
        path: path.clone(),
        context: context.map(str::to_owned),
    };
    // Its current context (`context: no-roles`), then the same by name.
    for context in [None, Some("no-roles")] {
        let ca = load_with(&signer, Some(talosconfig(context)), Vec::new()).unwrap();
        assert_eq!(bundle(&ca), [expected.as_slice()], "{context:?}");
        assert_eq!(ca.mode(), TrustMode::AcceptedCa);
    }
    let error = load_with(&signer, Some(talosconfig(Some("prod"))), Vec::new()).unwrap_err();
    assert_eq!(error.code(), "talos_ca_context_unknown");
    assert!(error.to_string().contains("its contexts: no-roles"), "{error}");
}

#[test]
fn a_worker_or_redacted_machine_config_names_the_talos_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, ours) = client_ca(dir.path(), "client");
    // The worker's machine.ca carries no key, but machine.token lets
    // trustd sign server certificates under the cluster CA: refused.
    let worker = private_copy(dir.path(), "talos/worker-v1.12.yaml");
    let error = load_with(&signer, Some(TalosCaSource::MachineConfig(worker)), Vec::new()).unwrap_err();
    assert_eq!(error.code(), "talos_ca_secret_present");
    assert!(error.to_string().contains("(machine.token)"), "{error}");
    // Redacted, it names the Talos CA.
    let redacted_worker = redact_secrets(&read_fixture("talos/worker-v1.12.yaml"));
    let worker = write_file(dir.path(), "worker-redacted.yaml", &redacted_worker, 0o644);
    let ca = load_with(&signer, Some(TalosCaSource::MachineConfig(worker)), Vec::new()).unwrap();
    let worker_ca = der(&pem_field(
        &v1alpha1("talos/worker-v1.12.yaml"),
        &["machine", "ca", "crt"],
    ));
    assert_eq!(bundle(&ca), [worker_ca]);

    // A control plane config as `talosctl get machineconfig` shows it,
    // listing a CA of a rotation in progress and our own client CA.
    let control_plane = read_fixture("talos/controlplane-v1.12.yaml");
    let key = STANDARD.encode(pem_field(
        &v1alpha1("talos/controlplane-v1.12.yaml"),
        &["machine", "ca", "key"],
    ));
    let next_talos = talos_style_root();
    let listed = format!(
        "machine:\n  acceptedCAs:\n    - crt: {}\n    - crt: {}\n",
        STANDARD.encode(&next_talos.cert_pem),
        STANDARD.encode(&ours.cert_pem)
    );
    assert!(control_plane.contains(&key), "the key is in the fixture");
    let redacted = redact_secrets(&control_plane).replacen("machine:\n", &listed, 1);
    assert!(redacted.contains("acceptedCAs"), "{redacted}");
    let path = write_file(dir.path(), "redacted.yaml", &redacted, 0o644);
    let ca = load_with(&signer, Some(TalosCaSource::MachineConfig(path)), Vec::new()).unwrap();
    let cp_ca = der(&pem_field(
        &v1alpha1("talos/controlplane-v1.12.yaml"),
        &["machine", "ca", "crt"],
    ));
    // The CA that can vouch for apid joins; our client-only CA does not.
    assert_eq!(bundle(&ca), [cp_ca.clone(), next_talos.cert.der.clone()]);

    // The same, as `talosctl get machineconfig -o yaml` prints it: a
    // resource whose `spec` is the config's text.
    let spec: String = redacted.lines().map(|line| format!("    {line}\n")).collect();
    let resource = format!(
        "node: 10.5.0.2\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    \
         id: v1alpha1\n    version: 2\n    phase: running\nspec: |\n{spec}"
    );
    let path = write_file(dir.path(), "resource.yaml", &resource, 0o600);
    let ca = load_with(
        &signer,
        Some(TalosCaSource::MachineConfig(path.clone())),
        Vec::new(),
    )
    .unwrap();
    assert_eq!(bundle(&ca), [cp_ca, next_talos.cert.der.clone()]);
    // As the signing `ca` it is read too, and refused for what it lacks.
    assert_eq!(
        code(load_with(&CaSource::MachineConfig(path), None, Vec::new())),
        "ca_key_redacted"
    );
}

#[test]
fn the_trust_bundle_is_the_talos_ca_and_accepted_cas_never_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, ours) = client_ca(dir.path(), "client");
    let talos = talos_style_root();
    let during_rotation = talos_style_root();
    let talos_file = write_file(dir.path(), "talos.crt", &talos.cert_pem, 0o644);
    let accepted = write_file(dir.path(), "rotation.crt", &during_rotation.cert_pem, 0o644);
    let ca = load_with(&signer, Some(TalosCaSource::CertFile(talos_file)), vec![accepted]).unwrap();
    assert_eq!(ca.mode(), TrustMode::AcceptedCa);
    assert_eq!(ca.signer().der, ours.cert.der);
    assert_eq!(
        bundle(&ca),
        [talos.cert.der.clone(), during_rotation.cert.der.clone()]
    );
    assert!(!bundle(&ca).contains(&ours.cert.der));
    assert_eq!(ca.chain_to_send().count(), 0, "no chain after the leaf");
}

/// Before accepted-CA mode, a machine config's acceptedCAs were read as the
/// signing CA's chain, and broke it: a cluster-CA cluster whose Talos nodes
/// list a CA (a rotation, or talos-sso's own) could not load its config.
#[test]
fn a_cluster_ca_machine_config_with_accepted_cas_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (_, ours) = client_ca(dir.path(), "client");
    let during_rotation = talos_style_root();
    let listed = format!(
        "machine:\n    acceptedCAs:\n        - crt: {}\n        - crt: {}\n",
        STANDARD.encode(&during_rotation.cert_pem),
        STANDARD.encode(&ours.cert_pem)
    );
    let config = read_fixture("talos/controlplane-v1.12.yaml").replacen("machine:\n", &listed, 1);
    let path = write_file(dir.path(), "controlplane.yaml", &config, 0o600);
    let ca = load_with(&CaSource::MachineConfig(path), None, Vec::new()).unwrap();
    assert_eq!(ca.mode(), TrustMode::ClusterCa);
    assert!(!ca.is_intermediate());
    let machine_ca = der(&pem_field(
        &v1alpha1("talos/controlplane-v1.12.yaml"),
        &["machine", "ca", "crt"],
    ));
    assert_eq!(ca.signer().der, machine_ca);
    // The server-capable one is trusted for apid; the client-only one is not.
    assert_eq!(bundle(&ca), [machine_ca, during_rotation.cert.der.clone()]);
}
