//! The example-gateway overlay's configuration started as the server
//! starts it, from files laid out where its Secrets and ConfigMap mount
//! them: the gateway listens, presents the serving certificate that
//! `gateway.tls.ca_file` (what talosconfigs get) verifies, speaks HTTP/2,
//! and ends a connection that brings no client certificate.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, ServerName};
use serde_yaml_ng::Value;
use talos_sso_server::config::Config;
use talos_sso_tests::emulator::{CLI_CLIENT_ID, EmulatorConfig, EmulatorHandle, TENANT_ID};
use tokio::io::AsyncReadExt;

use super::accepted_ca::{CaFiles, load_in_accepted_ca_mode, rebase_paths, write};
use super::gateway::{overlay_config_text, overlay_gateway, write_gateway_material};

#[tokio::test]
async fn example_gateway_overlay_starts_a_gateway_talosctl_can_verify() {
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    // The placeholders name no real tenant: the emulator's instead.
    let text = overlay_config_text()
        .replace(
            "https://login.microsoftonline.com/<tenant-id>/v2.0",
            &emulator.issuer(),
        )
        .replace("<tenant-id>", TENANT_ID)
        .replace(
            "<public client id of the talos-sso app registration>",
            CLI_CLIENT_ID,
        );
    let root = tempfile::tempdir().unwrap();
    let at = |path: &std::path::Path| root.path().join(path.strip_prefix("/").unwrap());
    // Here, not in a cluster: listeners on free local ports, the audit
    // trail in SQLite (Postgres is the CloudNativePG component's), no
    // checkpoints (their key is the secret manager's).
    let mut value: Value = serde_yaml_ng::from_str(&text).unwrap();
    value["listen"] = Value::from("127.0.0.1:0");
    value["metrics"]["listen"] = Value::from("127.0.0.1:0");
    value["clusters"]["prod"]["gateway"]["listen"] = Value::from("127.0.0.1:0");
    let top = value.as_mapping_mut().unwrap();
    top.remove("database");
    top.remove("audit");
    let data = root.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    top.insert("data_dir".into(), Value::from(data.display().to_string()));
    let text = serde_yaml_ng::to_string(&value).unwrap();

    // The material: the server's own TLS pair, the gateway's client CA and
    // serving pair, the cluster's client CA and the Talos CA certificate.
    let unmoved = Config::from_yaml(&text).unwrap();
    let server_tls = unmoved.tls.clone().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let (_, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    write(
        &at(&server_tls.cert_file),
        &std::fs::read_to_string(cert).unwrap(),
        0o644,
    );
    write(
        &at(&server_tls.key_file),
        &std::fs::read_to_string(key).unwrap(),
        0o600,
    );
    let (_, serving_ca) = write_gateway_material(&overlay_gateway(), root.path());
    load_in_accepted_ca_mode(
        "overlays/example-gateway/config.yaml, local",
        &text,
        root.path(),
        &CaFiles::new,
    );

    let mut moved: Value = serde_yaml_ng::from_str(&text).unwrap();
    rebase_paths(&mut moved, root.path());
    let config = Config::from_yaml(&serde_yaml_ng::to_string(&moved).unwrap()).unwrap();
    let server = talos_sso_server::server::Server::bind(config, Arc::new(talos_sso_server::app::SystemClock))
        .await
        .unwrap_or_else(|e| panic!("the server does not start from the overlay's material: {e}"));
    let gateways = server.gateway_addrs();
    assert_eq!(gateways.len(), 1, "{gateways:?}");
    let (cluster, address) = gateways[0].clone();
    assert_eq!(cluster, "prod");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(server.run_until_stopped(async move {
        let _ = stopped.await;
    }));

    // talosctl's view: the gateway's certificate verifies with the
    // talosconfig `ca` (the serving CA), over HTTP/2.
    let mut roots = rustls::RootCertStore::empty();
    for (_, der) in talos_sso_server::x509::pem_blocks(&serving_ca).unwrap() {
        roots.add(CertificateDer::from(der)).unwrap();
    }
    let mut client =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut tls = connector
        .connect(ServerName::IpAddress(address.ip().into()), tcp)
        .await
        .expect("the gateway's certificate verifies with gateway.tls.ca_file");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // Without a client certificate it goes no further.
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read(&mut byte))
        .await
        .expect("the gateway answers within 10 s");
    assert!(
        matches!(read, Err(_) | Ok(0)),
        "a connection without a client certificate: {read:?}"
    );

    stop.send(()).unwrap();
    running.await.unwrap();
}
