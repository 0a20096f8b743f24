//! The access gateway's Kubernetes material against the code and each
//! other: the component (deploy/kubernetes/components/gateway) opens the
//! port `gateway.listen` names, mounts the files the `gateway` section
//! reads from Secrets that something declares, exposes the port through a
//! Service that passes TLS through, gets a serving certificate for the
//! names people's talosconfigs use, and lets the pods reach apid; the
//! overlay that uses it (overlays/example-gateway) is the example's
//! configuration plus that section, and loads as the server loads it;
//! docs/operations.md's gateway commands parse and make what it loads.

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_yaml_ng::Value;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::cli::Cli;
use talos_sso_server::cluster::load_clusters;
use talos_sso_server::config::{Config, GatewayConfig};
use time::OffsetDateTime;

use super::accepted_ca::{CaFiles, load_in_accepted_ca_mode, rebase_paths, write};
use super::{documents, repo, yaml_files};

fn kubernetes(relative: &str) -> PathBuf {
    repo().join("deploy/kubernetes").join(relative)
}

/// The example-gateway overlay's configuration, as text.
pub(super) fn overlay_config_text() -> String {
    std::fs::read_to_string(kubernetes("overlays/example-gateway/config.yaml")).unwrap()
}

/// The cluster `prod` of the overlay's configuration and its gateway.
pub(super) fn overlay_gateway() -> GatewayConfig {
    let config = Config::from_yaml(&overlay_config_text()).unwrap();
    config.clusters["prod"]
        .gateway
        .clone()
        .expect("overlays/example-gateway: clusters.prod.gateway")
}

/// The port of a `host:port` endpoint, Talos's 50000 when it names none
/// (as the gateway and talosctl read endpoints).
fn endpoint_port(endpoint: &str) -> u64 {
    match endpoint.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(':') => port.parse().unwrap_or(50000),
        _ => 50000,
    }
}

fn endpoint_host(endpoint: &str) -> &str {
    endpoint.rsplit_once(':').map_or(endpoint, |(host, _)| host)
}

/// The component's kustomization and its two inline patches: the
/// Deployment's (strategic merge) and the NetworkPolicy's (JSON 6902).
struct Component {
    kustomization: Value,
    deployment: Value,
    policy_ops: Vec<Value>,
}

fn component() -> Component {
    let kustomization = documents(&kubernetes("components/gateway/kustomization.yaml"))
        .into_iter()
        .next()
        .unwrap();
    assert_eq!(kustomization["kind"], "Component");
    let patch = |kind: &str| -> Value {
        let patches = kustomization["patches"].as_sequence().unwrap();
        let found: Vec<&Value> = patches.iter().filter(|p| p["target"]["kind"] == kind).collect();
        assert_eq!(found.len(), 1, "one patch of the {kind}");
        serde_yaml_ng::from_str(found[0]["patch"].as_str().unwrap()).unwrap()
    };
    let deployment = patch("Deployment");
    let policy_ops = patch("NetworkPolicy").as_sequence().unwrap().clone();
    Component {
        kustomization,
        deployment,
        policy_ops,
    }
}

/// The one object of `kind` in a file of the component.
fn component_object(file: &str, kind: &str) -> Value {
    let docs = documents(&kubernetes(&format!("components/gateway/{file}")));
    let found: Vec<Value> = docs.into_iter().filter(|d| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "{file}: one {kind}");
    found.into_iter().next().unwrap()
}

#[test]
fn gateway_component_serves_what_the_configuration_names() {
    let gateway = overlay_gateway();
    let config = Config::from_yaml(&overlay_config_text()).unwrap();
    let component = component();
    for resource in component.kustomization["resources"].as_sequence().unwrap() {
        let path = kubernetes("components/gateway").join(resource.as_str().unwrap());
        assert!(path.is_file(), "{}", path.display());
    }

    // The patches reach the base's own Deployment, container and policy.
    let deployment = &documents(&kubernetes("base/deployment.yaml"))[0];
    let policy = &documents(&kubernetes("base/networkpolicy.yaml"))[0];
    assert_eq!(
        component.deployment["metadata"]["name"],
        deployment["metadata"]["name"]
    );
    let patches = component.kustomization["patches"].as_sequence().unwrap();
    assert!(
        patches
            .iter()
            .any(|p| p["target"]["kind"] == "NetworkPolicy"
                && p["target"]["name"] == policy["metadata"]["name"])
    );
    let base_container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let pod = &component.deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["name"], base_container["name"]);

    // The container port `gateway` is the port gateway.listen names, and
    // no port the server already has.
    let ports = container["ports"].as_sequence().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["name"], "gateway");
    assert_eq!(
        ports[0]["containerPort"].as_u64(),
        Some(u64::from(gateway.listen.port()))
    );
    for taken in base_container["ports"].as_sequence().unwrap() {
        assert_ne!(taken["containerPort"], ports[0]["containerPort"]);
    }
    assert_ne!(gateway.listen.port(), config.listen.port());

    // Every file the gateway section reads is in a Secret the patch mounts
    // (0440, as the base's), under a key that Secret's maker writes.
    let certificate = component_object("certificate.yaml", "Certificate");
    let external = documents(&kubernetes("components/gateway/external-secrets/gateway-ca.yaml"));
    assert_eq!(external.len(), 1);
    let external = &external[0];
    let made_keys = |secret: &str| -> Vec<String> {
        if certificate["spec"]["secretName"] == secret {
            // cert-manager writes these three.
            return ["tls.crt", "tls.key", "ca.crt"].map(str::to_owned).to_vec();
        }
        assert_eq!(
            external["spec"]["target"]["name"], secret,
            "nothing declares the Secret {secret}"
        );
        external["spec"]["data"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|d| d["secretKey"].as_str().unwrap().to_owned())
            .collect()
    };
    let mounts = container["volumeMounts"].as_sequence().unwrap();
    let volumes = pod["volumes"].as_sequence().unwrap();
    let base_mounts: Vec<&str> = base_container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    let base_tls = deployment["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    let mut secrets_read = std::collections::BTreeSet::new();
    for file in [
        &gateway.client_ca.cert_file,
        gateway
            .client_ca
            .key_file
            .as_ref()
            .expect("the client CA key in a file"),
        &gateway.tls.cert_file,
        &gateway.tls.key_file,
        &gateway.tls.ca_file,
    ] {
        let mount = mounts
            .iter()
            .find(|m| file.parent() == Some(Path::new(m["mountPath"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("{} is in none of the component's mounts", file.display()));
        let path = mount["mountPath"].as_str().unwrap();
        assert!(
            !base_mounts.contains(&path),
            "{path} is mounted by the base already"
        );
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume {:?}", mount["name"]));
        assert_eq!(
            volume["secret"]["defaultMode"],
            base_tls["secret"]["defaultMode"],
            "{}: the base's mode",
            file.display()
        );
        let secret = volume["secret"]["secretName"].as_str().unwrap();
        let key = file.file_name().unwrap().to_str().unwrap();
        assert!(
            made_keys(secret).iter().any(|k| k == key),
            "{secret} has no key {key}"
        );
        secrets_read.insert(secret.to_owned());
    }
    assert_eq!(
        secrets_read.len(),
        2,
        "the client CA and the serving pair: {secrets_read:?}"
    );
    // The Reloader annotation names exactly those Secrets: the gateway reads
    // the client CA at start only (the serving pair it loads again itself).
    let reload: std::collections::BTreeSet<String> =
        component.deployment["metadata"]["annotations"]["secret.reloader.stakater.com/reload"]
            .as_str()
            .unwrap()
            .split(',')
            .map(str::to_owned)
            .collect();
    assert_eq!(reload, secrets_read);
    // The ExternalSecret's own component lists it.
    let external_component = &documents(&kubernetes(
        "components/gateway/external-secrets/kustomization.yaml",
    ))[0];
    assert_eq!(external_component["kind"], "Component");
    assert_eq!(
        external_component["resources"],
        serde_yaml_ng::from_str::<Value>("[gateway-ca.yaml]").unwrap()
    );

    // The Service: the server's pods, a passthrough load balancer on the
    // port people's talosconfigs name, to the container port `gateway`,
    // keeping people's addresses (the gateway records them).
    let service = component_object("service.yaml", "Service");
    let base_service = &documents(&kubernetes("base/service.yaml"))[0];
    assert_eq!(service["spec"]["selector"], base_service["spec"]["selector"]);
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(service["spec"]["externalTrafficPolicy"], "Local");
    let service_ports = service["spec"]["ports"].as_sequence().unwrap();
    assert_eq!(service_ports.len(), 1);
    assert_eq!(service_ports[0]["targetPort"], "gateway");
    assert!(!gateway.endpoints.is_empty());
    for endpoint in &gateway.endpoints {
        assert_eq!(
            service_ports[0]["port"].as_u64(),
            Some(endpoint_port(endpoint)),
            "{endpoint}"
        );
        // The serving certificate is for the name talosctl dials.
        assert!(
            certificate["spec"]["dnsNames"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|n| n == endpoint_host(endpoint)),
            "{endpoint}: not in the certificate's dnsNames"
        );
    }
    let usages = certificate["spec"]["usages"].as_sequence().unwrap();
    assert!(usages.iter().any(|u| u == "server auth"));
    assert_eq!(certificate["spec"]["privateKey"]["encoding"], "PKCS8");

    // Nothing that ends TLS sends traffic to the gateway's Service: the
    // gateway must see the client certificate.
    let mut files = Vec::new();
    yaml_files(&kubernetes(""), &mut files);
    for file in files {
        for doc in documents(&file) {
            if matches!(doc["kind"].as_str(), Some("Ingress" | "HTTPRoute" | "GRPCRoute")) {
                let mut strings = Vec::new();
                all_strings(&doc, &mut strings);
                assert!(
                    !strings.contains(&service["metadata"]["name"].as_str().unwrap().to_owned()),
                    "{}: a {:?} ends TLS in front of the gateway",
                    file.display(),
                    doc["kind"]
                );
            }
        }
    }

    // The NetworkPolicy: the gateway port in from anywhere, apid out on
    // the port of every upstream.
    let added = |path: &str| -> Vec<&Value> {
        component
            .policy_ops
            .iter()
            .filter(|op| op["op"] == "add" && op["path"] == path)
            .map(|op| &op["value"])
            .collect()
    };
    let ingress = added("/spec/ingress/-");
    assert_eq!(ingress.len(), 1);
    assert!(ingress[0].get("from").is_none(), "talosctl comes from anywhere");
    assert_eq!(ingress[0]["ports"][0]["port"], "gateway");
    let egress = added("/spec/egress/-");
    assert_eq!(egress.len(), 1);
    let upstreams = if gateway.upstreams.is_empty() {
        config.clusters["prod"].endpoints.clone()
    } else {
        gateway.upstreams.clone()
    };
    assert!(!upstreams.is_empty());
    for upstream in &upstreams {
        let port = endpoint_port(upstream);
        assert!(
            egress[0]["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|p| p["port"].as_u64() == Some(port) && p["protocol"] == "TCP"),
            "apid at {upstream} is not let out"
        );
    }
}

fn all_strings(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Mapping(m) => m.values().for_each(|v| all_strings(v, out)),
        Value::Sequence(items) => items.iter().for_each(|v| all_strings(v, out)),
        _ => {}
    }
}

/// The gateway's own material, written under `root` where `gateway` (its
/// paths not yet moved) names it: a client-only CA of its own, and a
/// serving pair with its CA. Returns the gateway CA certificate and the
/// serving CA certificate.
pub(super) fn write_gateway_material(gateway: &GatewayConfig, root: &Path) -> (String, String) {
    let at = |path: &Path| root.join(path.strip_prefix("/").unwrap());
    let year = std::time::Duration::from_secs(365 * 86400);
    let client =
        generate::new_client_ca(NewKeyType::Ed25519, "prod", year, OffsetDateTime::now_utc()).unwrap();
    write(&at(&gateway.client_ca.cert_file), &client.cert_pem, 0o644);
    write(
        &at(gateway.client_ca.key_file.as_ref().unwrap()),
        &client.key_pem,
        0o600,
    );
    let scratch = tempfile::tempdir().unwrap();
    let (serving_ca, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    write(
        &at(&gateway.tls.cert_file),
        &std::fs::read_to_string(cert).unwrap(),
        0o644,
    );
    write(
        &at(&gateway.tls.key_file),
        &std::fs::read_to_string(key).unwrap(),
        0o600,
    );
    write(&at(&gateway.tls.ca_file), &serving_ca, 0o644);
    (client.cert_pem, serving_ca)
}

#[test]
fn example_gateway_overlay_is_the_example_plus_the_gateway_and_loads() {
    // The overlay's configuration is the example's, with the gateway
    // section alone added: the two cannot drift apart.
    let overlay_dir = kubernetes("overlays/example-gateway");
    let example_dir = kubernetes("overlays/example");
    let mut with_gateway: Value = serde_yaml_ng::from_str(&overlay_config_text()).unwrap();
    let example: Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(example_dir.join("config.yaml")).unwrap()).unwrap();
    let removed = with_gateway["clusters"]["prod"]
        .as_mapping_mut()
        .unwrap()
        .remove("gateway");
    assert!(removed.is_some());
    assert_eq!(
        with_gateway, example,
        "overlays/example-gateway/config.yaml drifted from the example's"
    );
    assert_eq!(
        std::fs::read_to_string(overlay_dir.join("prod-talos-ca.crt")).unwrap(),
        std::fs::read_to_string(example_dir.join("prod-talos-ca.crt")).unwrap()
    );
    // It builds on the example, with both components, and replaces the
    // ConfigMap with its configuration and the Talos CA it names.
    let kustomization = &documents(&overlay_dir.join("kustomization.yaml"))[0];
    assert_eq!(kustomization["resources"][0], "../example");
    let components: Vec<&str> = kustomization["components"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(
        components,
        [
            "../../components/gateway",
            "../../components/gateway/external-secrets"
        ]
    );
    let generator = &kustomization["configMapGenerator"][0];
    assert_eq!(generator["name"], "talos-sso-config");
    assert_eq!(generator["behavior"], "replace");
    assert_eq!(
        generator["files"],
        serde_yaml_ng::from_str::<Value>("[config.yaml, prod-talos-ca.crt]").unwrap()
    );

    // Loaded as the server loads it, from material where it names it: the
    // gateway's CA signs people's certificates, talosconfigs verify the
    // gateway with the serving CA and name the gateway's endpoints; the
    // cluster's own CA is what the gateway calls apid with.
    let gateway = overlay_gateway();
    let root = tempfile::tempdir().unwrap();
    let (gateway_ca, serving_ca) = write_gateway_material(&gateway, root.path());
    let text = overlay_config_text();
    let clusters = load_in_accepted_ca_mode(
        "overlays/example-gateway/config.yaml",
        &text,
        root.path(),
        &CaFiles::new,
    );
    let prod = &clusters["prod"];
    let loaded = prod.gateway.as_ref().expect("the gateway is loaded");
    let now = OffsetDateTime::now_utc();
    assert_eq!(loaded.client_ca.signer().to_pem(), gateway_ca);
    assert_eq!(prod.people_ca(now).signer().to_pem(), gateway_ca);
    assert_ne!(prod.ca.signer().to_pem(), gateway_ca);
    assert_eq!(prod.talosconfig_ca().trim(), serving_ca.trim());
    assert_eq!(prod.talosconfig_endpoints(), gateway.endpoints.as_slice());
    assert_eq!(prod.upstreams(), prod.config.endpoints.as_slice());

    // The client CA Talos trusts (the cluster's `ca`) in the gateway's
    // Secret instead is refused: its certificates would work at apid.
    let mut value: Value = serde_yaml_ng::from_str(&text).unwrap();
    rebase_paths(&mut value, root.path());
    let config = Config::from_yaml(&serde_yaml_ng::to_string(&value).unwrap()).unwrap();
    let cluster = &config.clusters["prod"];
    let rebased = cluster.gateway.as_ref().unwrap();
    for (from, to) in [
        (
            cluster.ca.cert_file.as_ref().unwrap(),
            &rebased.client_ca.cert_file,
        ),
        (
            cluster.ca.key_file.as_ref().unwrap(),
            rebased.client_ca.key_file.as_ref().unwrap(),
        ),
    ] {
        std::fs::copy(from, to).unwrap();
    }
    let refused = load_clusters(&config, now).expect_err("the cluster's CA as the gateway's");
    assert!(
        refused
            .to_string()
            .contains("gateway.client_ca is a CA Talos trusts"),
        "{refused}"
    );
}

/// The `talos-sso-server` and `talos-sso` command lines of the fenced `sh` blocks of
/// docs/operations.md's "Access gateway" section (run directly or through
/// `kubectl exec ... --`), `\` continuations joined.
fn gateway_section_commands() -> Vec<Vec<String>> {
    let page = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let section = page
        .split("\n## Access gateway\n")
        .nth(1)
        .expect("docs/operations.md: an \"Access gateway\" section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut commands = Vec::new();
    let (mut in_block, mut current) = (false, String::new());
    for line in section.lines() {
        // Blocks inside list items are indented.
        match line.trim() {
            "```sh" => in_block = true,
            "```" => in_block = false,
            text if in_block => {
                current.push_str(text.trim_end_matches('\\'));
                current.push(' ');
                if !text.ends_with('\\') {
                    // The command itself, or as `kubectl exec ... --` runs it.
                    let words: Vec<&str> = current.split_whitespace().collect();
                    let start = words.iter().enumerate().position(|(i, w)| {
                        ["talos-sso-server", "talos-sso"].contains(w) && (i == 0 || words[i - 1] == "--")
                    });
                    if let Some(start) = start {
                        commands.push(words[start..].iter().map(|w| (*w).to_owned()).collect());
                    }
                    current.clear();
                }
            }
            _ => {}
        }
    }
    commands
}

/// The section's commands parse with the programs' own command lines, and
/// its `ca client-ca`, run as written, makes a CA the overlay's gateway
/// loads as its client CA.
#[tokio::test]
async fn operations_gateway_commands_make_what_the_overlay_loads() {
    let commands = gateway_section_commands();
    for words in &commands {
        let parsed = if words[0] == "talos-sso" {
            talos_sso::cli::Cli::try_parse_from(words).map(drop)
        } else {
            Cli::try_parse_from(words).map(drop)
        };
        parsed.unwrap_or_else(|e| panic!("{}: {e}", words.join(" ")));
    }
    assert!(
        commands.iter().any(|w| w[0] == "talos-sso" && w[1] == "login"),
        "the section shows the first login through the gateway"
    );
    let commands: Vec<Vec<String>> = commands
        .into_iter()
        .filter(|w| w[0] == "talos-sso-server")
        .collect();
    let make = commands
        .iter()
        .find(|w| w[1..3] == ["ca", "client-ca"])
        .expect("the section makes the gateway CA with `ca client-ca`");
    assert!(
        commands.iter().any(|w| w[1] == "check"),
        "the section checks the configuration"
    );
    let scratch = tempfile::tempdir().unwrap();
    let flag = |name: &str| -> String {
        let at = make
            .iter()
            .position(|w| w == name)
            .unwrap_or_else(|| panic!("no {name}"));
        make[at + 1].clone()
    };
    let (out_cert, out_key) = (flag("--out-cert"), flag("--out-key"));
    let args: Vec<String> = make
        .iter()
        .map(|w| {
            if *w == out_cert || *w == out_key {
                scratch.path().join(w).display().to_string()
            } else {
                w.clone()
            }
        })
        .collect();
    let mut out = Vec::new();
    talos_sso_server::cli::run(Cli::try_parse_from(&args).unwrap(), &mut out)
        .await
        .unwrap_or_else(|e| panic!("{}: {e:#}", make.join(" ")));

    let gateway = overlay_gateway();
    let root = tempfile::tempdir().unwrap();
    write_gateway_material(&gateway, root.path());
    let at = |path: &Path| root.path().join(path.strip_prefix("/").unwrap());
    let made_cert = std::fs::read_to_string(scratch.path().join(&out_cert)).unwrap();
    write(&at(&gateway.client_ca.cert_file), &made_cert, 0o644);
    write(
        &at(gateway.client_ca.key_file.as_ref().unwrap()),
        &std::fs::read_to_string(scratch.path().join(&out_key)).unwrap(),
        0o600,
    );
    let clusters = load_in_accepted_ca_mode(
        "overlays/example-gateway/config.yaml with the gateway CA docs/operations.md makes",
        &overlay_config_text(),
        root.path(),
        &CaFiles::new,
    );
    let loaded = clusters["prod"].gateway.as_ref().unwrap();
    assert_eq!(loaded.client_ca.signer().to_pem(), made_cert);
}
