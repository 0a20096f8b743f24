//! The Talos extension material (deploy/talos): the server starts, in
//! accepted-CA mode, from its files laid out as Talos writes them, and a
//! CA key delivered as a world-readable `configFiles` entry is refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use serde_yaml_ng::Value;
use talos_sso_server::cli::Cli;
use talos_sso_server::config::Config;

use super::accepted_ca::{CaFiles, rebase_paths, write};
use super::{documents, repo, strings};

/// The Talos material: the node's machine configuration patch (its
/// `machine.files` and its `ExtensionServiceConfig`) and the service spec.
struct TalosMaterial {
    machine_files: Vec<Value>,
    service_config: Value,
    spec: Value,
}

fn talos_material() -> TalosMaterial {
    let patch = documents(&repo().join("deploy/talos/machine-config-patch.yaml"));
    assert_eq!(patch.len(), 2);
    let spec = documents(&repo().join("deploy/talos/extension/talos-sso-server.yaml"));
    TalosMaterial {
        machine_files: patch[0]["machine"]["files"].as_sequence().unwrap().clone(),
        service_config: patch[1].clone(),
        spec: spec[0].clone(),
    }
}

/// Lay the Talos material out under `root` as Talos would for the
/// service's container, with test material in place of the placeholders
/// (`material`: file name to content): every `configFiles` entry written
/// 0644 at its `mountPath`; every `machine.files` entry written with its
/// `permissions`, then seen through the spec's bind mounts, read-only ones
/// with their modes as written. Returns the configuration file's path.
fn lay_out_as_talos(talos: &TalosMaterial, root: &Path, material: &dyn Fn(&str, &str) -> String) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let inside = |path: &str| root.join(path.trim_start_matches('/'));
    let mounts = talos.spec["container"]["mounts"].as_sequence().unwrap();
    for file in &talos.machine_files {
        let path = file["path"].as_str().unwrap();
        assert!(
            path.starts_with("/var/"),
            "Talos creates files under /var only: {path}"
        );
        assert_eq!(file["op"], "create");
        let mode = u32::try_from(file["permissions"].as_u64().unwrap()).unwrap();
        let mount = mounts
            .iter()
            .find(|m| Path::new(path).starts_with(m["source"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{path} is under none of the service's mounts"));
        let relative = Path::new(path)
            .strip_prefix(mount["source"].as_str().unwrap())
            .unwrap();
        let seen = inside(mount["destination"].as_str().unwrap()).join(relative);
        write(&seen, &material(path, file["content"].as_str().unwrap()), mode);
    }
    for mount in mounts {
        // A source Talos has to make itself it makes 0700.
        let destination = inside(mount["destination"].as_str().unwrap());
        if !destination.exists() {
            std::fs::create_dir_all(&destination).unwrap();
            std::fs::set_permissions(&destination, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
    }
    let mut config_path = None;
    for file in talos.service_config["configFiles"].as_sequence().unwrap() {
        let mount_path = file["mountPath"].as_str().unwrap();
        let mut content = material(mount_path, file["content"].as_str().unwrap());
        if mount_path.ends_with("/config.yaml") {
            content = point_config_at(&content, root);
            config_path = Some(inside(mount_path));
        }
        write(&inside(mount_path), &content, 0o644);
    }
    config_path.expect("a config.yaml among the configFiles")
}

/// The Talos configuration, with every absolute path moved under `root`
/// and the identity provider swapped for the emulator's (the placeholders
/// name no real tenant), listening on a free local port.
fn point_config_at(content: &str, root: &Path) -> String {
    let mut config: Value = serde_yaml_ng::from_str(content).unwrap();
    rebase_paths(&mut config, root);
    config["listen"] = Value::from("127.0.0.1:0");
    serde_yaml_ng::to_string(&config).unwrap()
}

#[tokio::test]
async fn talos_extension_starts_from_the_files_talos_writes() {
    use talos_sso_tests::emulator::{CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, TENANT_ID};

    let talos = talos_material();
    // What the service waits for: its configuration, and each secret Talos
    // writes at boot.
    let depends = talos.spec["depends"].as_sequence().unwrap();
    assert!(depends.iter().any(|d| d["configuration"] == true));
    for file in &talos.machine_files {
        assert!(
            depends.iter().any(|d| d["path"] == file["path"]),
            "{:?} is not waited for",
            file["path"]
        );
        assert_eq!(file["permissions"].as_u64(), Some(0o600), "{:?}", file["path"]);
    }
    assert_eq!(talos.service_config["name"], talos.spec["name"]);
    assert_eq!(talos.service_config["kind"], "ExtensionServiceConfig");
    assert_eq!(talos.spec["container"]["security"]["writeableRootfs"], false);
    Cli::try_parse_from(
        std::iter::once("talos-sso-server".to_owned()).chain(strings(&talos.spec["container"]["args"])),
    )
    .unwrap();
    let readme = std::fs::read_to_string(repo().join("deploy/talos/README.md")).unwrap();
    let commands: Vec<&str> = readme
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("talos-sso-server "))
        .collect();
    assert!(!commands.is_empty());
    for command in commands {
        Cli::try_parse_from(command.split_whitespace()).unwrap_or_else(|e| panic!("{command}: {e}"));
    }
    let environment: Vec<(String, String)> = talos.service_config["environment"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            let (k, v) = e.as_str().unwrap().split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();

    // Real material for the placeholders: a TLS pair for 127.0.0.1, the
    // client CA the server signs with and the Talos CA certificate of the
    // cluster `prod`.
    let scratch = tempfile::tempdir().unwrap();
    let (tls_ca, tls_cert, tls_key) = talos_sso_tests::harness::tls_files(scratch.path());
    let tls_cert = std::fs::read_to_string(tls_cert).unwrap();
    let tls_key = std::fs::read_to_string(tls_key).unwrap();
    let ca = CaFiles::new("prod");
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let material = |path: &str, content: &str| -> String {
        match Path::new(path).file_name().unwrap().to_str().unwrap() {
            "tls.crt" => tls_cert.clone(),
            "tls.key" => tls_key.clone(),
            "prod-client-ca.crt" => ca.client_ca_cert.clone(),
            "prod-client-ca.key" => ca.client_ca_key.clone(),
            "prod-talos-ca.crt" => ca.talos_ca_cert.clone(),
            "config.yaml" => content
                .replace(
                    "https://login.microsoftonline.com/<tenant-id>/v2.0",
                    &emulator.issuer(),
                )
                .replace("<tenant-id>", TENANT_ID)
                .replace("<client id>", CLI_CLIENT_ID),
            other => panic!(
                "no test material for {other}: the Talos example delivers a file this test does not know"
            ),
        }
    };

    let root = tempfile::tempdir().unwrap();
    let config_path = lay_out_as_talos(&talos, root.path(), &material);
    let config = Config::load_with_env(&config_path, environment.clone()).unwrap();
    let prod = &config.clusters["prod"];
    assert!(
        prod.talos_ca.is_some(),
        "the Talos example is in accepted-CA mode"
    );
    let server = talos_sso_server::server::Server::bind(config, Arc::new(talos_sso_server::app::SystemClock))
        .await
        .unwrap_or_else(|e| panic!("the server does not start from the Talos layout: {e}"));
    let url = server.url();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(tls_ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let status = client
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200, "{url}");
    // It serves in accepted-CA mode, with the client CA delivered above.
    let readiness: serde_json::Value = client
        .get(format!("{url}/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        readiness["trust_modes"],
        serde_json::json!({ "prod": "accepted-ca" }),
        "{readiness}"
    );
    stop.send(()).unwrap();
    running.await.unwrap();

    // The path the example used to document: the CA key as a configFiles
    // entry, which Talos writes 0644. The server refuses it.
    let mut as_config_file = talos_material();
    let key = as_config_file
        .machine_files
        .iter()
        .position(|f| f["path"].as_str().unwrap().ends_with("prod-client-ca.key"))
        .unwrap();
    let entry = as_config_file.machine_files.remove(key);
    let config_text = as_config_file.service_config["configFiles"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let key_mount = "/etc/talos-sso/prod-client-ca.key";
    assert!(config_text.contains("/etc/talos-sso/secrets/prod-client-ca.key"));
    as_config_file.service_config["configFiles"][0]["content"] =
        Value::from(config_text.replace("/etc/talos-sso/secrets/prod-client-ca.key", key_mount));
    let mut extra = serde_yaml_ng::Mapping::new();
    extra.insert("mountPath".into(), key_mount.into());
    extra.insert("content".into(), entry["content"].clone());
    as_config_file.service_config["configFiles"]
        .as_sequence_mut()
        .unwrap()
        .push(Value::Mapping(extra));
    let root = tempfile::tempdir().unwrap();
    let config_path = lay_out_as_talos(&as_config_file, root.path(), &material);
    let config = Config::load_with_env(&config_path, environment).unwrap();
    let Err(refused) =
        talos_sso_server::server::Server::bind(config, Arc::new(talos_sso_server::app::SystemClock)).await
    else {
        panic!("a world-readable CA key is refused");
    };
    let message = format!("{refused:#}");
    assert!(
        message.contains("prod-client-ca.key") && message.contains("644"),
        "{message}"
    );
}
