//! Accepted-CA mode in the deployment configurations: test CA material (a
//! client-only CA and a Talos cluster CA certificate) written where a
//! configuration names it, and the clusters loaded from it as the server
//! loads them at start, each checked to sign with that client CA and to
//! hand out that Talos CA.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_yaml_ng::Value;
use talos_sso_server::ca::TrustMode;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_server::cluster::{Clusters, load_clusters};
use talos_sso_server::config::Config;
use time::OffsetDateTime;

/// One cluster's CA material in accepted-CA mode, PEM.
pub struct CaFiles {
    /// What `talos-sso-server ca client-ca` writes: the CA the server signs with.
    pub client_ca_cert: String,
    pub client_ca_key: String,
    /// What `talos-sso-server ca talos-ca` writes: the Talos cluster CA
    /// certificate alone (its key stays with Talos).
    pub talos_ca_cert: String,
}

impl CaFiles {
    /// A new client-only CA for `cluster`, and the certificate of a new
    /// Talos-shaped cluster CA.
    pub fn new(cluster: &str) -> Self {
        let now = OffsetDateTime::now_utc();
        let year = std::time::Duration::from_secs(365 * 86400);
        let client = generate::new_client_ca(NewKeyType::Ed25519, cluster, year, now).unwrap();
        let talos = generate::new_root(NewKeyType::Ed25519, "talos", 10 * year, now).unwrap();
        CaFiles {
            client_ca_cert: client.cert_pem,
            client_ca_key: client.key_pem,
            talos_ca_cert: talos.cert_pem,
        }
    }
}

/// Every absolute path under `/etc`, `/var` or `/run` in a configuration
/// (YAML), moved under `root`.
pub fn rebase_paths(value: &mut Value, root: &Path) {
    match value {
        Value::String(s) if ["/etc/", "/var/", "/run/"].iter().any(|p| s.starts_with(p)) => {
            *s = root.join(s.trim_start_matches('/')).display().to_string();
        }
        Value::Mapping(m) => m.values_mut().for_each(|v| rebase_paths(v, root)),
        Value::Sequence(items) => items.iter_mut().for_each(|v| rebase_paths(v, root)),
        _ => {}
    }
}

/// Writes `content` at `path` with `mode`, making its folders.
pub fn write(path: &Path, content: &str, mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The clusters of the configuration `text` (YAML; `what` names it in
/// failures), loaded as the server loads them at start, with its paths
/// moved under `root` and each cluster's material from `files` written
/// where the configuration names it (the key 0600, the certificates
/// 0644). Every cluster must be in accepted-CA mode, sign with its client
/// CA and give talosconfigs its Talos CA.
pub fn load_in_accepted_ca_mode(
    what: &str,
    text: &str,
    root: &Path,
    files: &dyn Fn(&str) -> CaFiles,
) -> Clusters {
    let mut value: Value = serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}"));
    rebase_paths(&mut value, root);
    let config = Config::from_yaml(&serde_yaml_ng::to_string(&value).unwrap())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(!config.clusters.is_empty(), "{what}: no cluster");
    let mut material = Vec::new();
    for (name, cluster) in &config.clusters {
        let ca_files = files(name);
        let named = |path: &Option<std::path::PathBuf>, field: &str| {
            path.clone()
                .unwrap_or_else(|| panic!("{what}: cluster {name} has no {field}"))
        };
        let talos_ca = cluster
            .talos_ca
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: cluster {name} has no talos_ca (accepted-CA mode)"));
        write(
            &named(&cluster.ca.cert_file, "ca.cert_file"),
            &ca_files.client_ca_cert,
            0o644,
        );
        write(
            &named(&cluster.ca.key_file, "ca.key_file"),
            &ca_files.client_ca_key,
            0o600,
        );
        write(
            &named(&talos_ca.cert_file, "talos_ca.cert_file"),
            &ca_files.talos_ca_cert,
            0o644,
        );
        material.push((name.clone(), ca_files));
    }
    let (clusters, _) = load_clusters(&config, OffsetDateTime::now_utc())
        .unwrap_or_else(|e| panic!("{what}: the server refuses its clusters: {e}"));
    for (name, ca_files) in material {
        let cluster = &clusters[&name];
        assert_eq!(cluster.mode(), TrustMode::AcceptedCa, "{what}: cluster {name}");
        assert_eq!(
            cluster.ca.signer().to_pem(),
            ca_files.client_ca_cert,
            "{what}: cluster {name} signs with its client CA"
        );
        assert_eq!(
            cluster.ca.trust_bundle_pem().trim(),
            ca_files.talos_ca_cert.trim(),
            "{what}: cluster {name}'s talosconfigs verify the nodes with the Talos CA alone"
        );
    }
    clusters
}
