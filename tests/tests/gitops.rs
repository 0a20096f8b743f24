//! The GitOps material checked against the base: every Secret the server's
//! pod mounts has a declarative source (the External Secrets component, or
//! the operator that makes it) with the keys the pod reads; the SOPS
//! example holds the same Secrets, encrypted; every remote talos-sso URL
//! pins a release tag or a full commit SHA, and the image the same
//! release; the Flux and Argo CD examples apply the installation folder;
//! docs/production.md's commands parse and its step 2 runs (`production`);
//! pods whose init containers migrate at once take turns on sqlx's
//! advisory lock (real Postgres).

mod production;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn kubernetes(relative: &str) -> PathBuf {
    repo().join("deploy/kubernetes").join(relative)
}

/// Every string in a YAML value.
fn strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Mapping(m) => m.values().for_each(|v| strings(v, out)),
        Value::Sequence(items) => items.iter().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The Secrets the server's pod mounts, with the keys its containers read:
/// the projected `items`, or every file a container's configuration or
/// environment names under the Secret's mount path.
fn mounted_secrets() -> BTreeMap<String, BTreeSet<String>> {
    let deployment = &documents(&kubernetes("base/deployment.yaml"))[0];
    let pod = &deployment["spec"]["template"]["spec"];
    let config = &documents(&kubernetes("base/config.yaml"))[0];
    let mut named = Vec::new();
    strings(config, &mut named);
    let containers: Vec<&Value> = pod["initContainers"]
        .as_sequence()
        .into_iter()
        .chain(pod["containers"].as_sequence())
        .flatten()
        .collect();
    for container in &containers {
        strings(&container["env"], &mut named);
    }
    let mut secrets = BTreeMap::new();
    for volume in pod["volumes"].as_sequence().unwrap() {
        let Some(name) = volume["secret"]["secretName"].as_str() else {
            continue;
        };
        let mut keys = BTreeSet::new();
        if let Some(items) = volume["secret"]["items"].as_sequence() {
            keys.extend(items.iter().map(|i| i["key"].as_str().unwrap().to_owned()));
        } else {
            for container in &containers {
                for mount in container["volumeMounts"].as_sequence().into_iter().flatten() {
                    if mount["name"] != volume["name"] {
                        continue;
                    }
                    let prefix = format!("{}/", mount["mountPath"].as_str().unwrap());
                    keys.extend(
                        named
                            .iter()
                            .filter_map(|s| s.strip_prefix(&prefix))
                            .map(str::to_owned),
                    );
                }
            }
        }
        assert!(!keys.is_empty(), "nothing reads the Secret {name}");
        secrets.insert(name.to_owned(), keys);
    }
    secrets
}

/// The ExternalSecrets of the component, by the Secret each makes: the
/// file it is in and the keys the Secret gets.
fn external_secrets() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let dir = kubernetes("components/external-secrets");
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap().to_owned();
        if file == "kustomization.yaml" || !file.ends_with(".yaml") {
            continue;
        }
        for doc in documents(&path) {
            assert_eq!(doc["kind"], "ExternalSecret", "{file}");
            let target = &doc["spec"]["target"];
            assert_eq!(target["name"], doc["metadata"]["name"], "{file}");
            // With a template's `data`, the Secret holds those keys alone.
            let keys: BTreeSet<String> = match target["template"]["data"].as_mapping() {
                Some(data) => data.keys().map(|k| k.as_str().unwrap().to_owned()).collect(),
                None => doc["spec"]["data"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|d| d["secretKey"].as_str().unwrap().to_owned())
                    .collect(),
            };
            let name = target["name"].as_str().unwrap().to_owned();
            assert!(
                found.insert(name.clone(), (file.clone(), keys)).is_none(),
                "{name} twice"
            );
        }
    }
    found
}

/// The Secrets an operator of a component makes: cert-manager's
/// Certificate and CloudNativePG's `<cluster>-ca`.
fn made_by_operators() -> BTreeSet<String> {
    let certificate = &documents(&kubernetes("components/cert-manager/certificate.yaml"))[0];
    let cluster = &documents(&kubernetes("components/cloudnative-pg/cluster.yaml"))[0];
    BTreeSet::from([
        certificate["spec"]["secretName"].as_str().unwrap().to_owned(),
        format!("{}-ca", cluster["metadata"]["name"].as_str().unwrap()),
    ])
}

#[test]
fn every_secret_the_pod_mounts_has_a_declarative_source() {
    let mounted = mounted_secrets();
    assert_eq!(mounted.len(), 6, "{mounted:?}");
    let external = external_secrets();
    let operators = made_by_operators();
    let component = &documents(&kubernetes("components/external-secrets/kustomization.yaml"))[0];
    let listed: BTreeSet<&str> = component["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for (secret, keys) in &mounted {
        let (file, made) = external
            .get(secret)
            .unwrap_or_else(|| panic!("no ExternalSecret makes {secret}"));
        assert!(
            made.is_superset(keys),
            "{secret}: {made:?} lacks some of {keys:?}"
        );
        // An operator's Secret is made by one writer: the ExternalSecret is
        // there for installations without the operator, not listed.
        assert_eq!(
            listed.contains(file.as_str()),
            !operators.contains(secret),
            "{secret} ({file}): listed in the component iff no operator makes it"
        );
    }
    for secret in external.keys() {
        assert!(mounted.contains_key(secret), "{secret}: nothing mounts it");
    }

    // CloudNativePG reads `username` too: the roles the cluster declares.
    let cluster = &documents(&kubernetes("components/cloudnative-pg/cluster.yaml"))[0];
    let role = &cluster["spec"]["managed"]["roles"][0];
    let initdb = &cluster["spec"]["bootstrap"]["initdb"];
    for (secret, user) in [
        (&role["passwordSecret"]["name"], &role["name"]),
        (&initdb["secret"]["name"], &initdb["owner"]),
    ] {
        let secret = secret.as_str().unwrap();
        let file = &external[secret].0;
        let doc = documents(&kubernetes(&format!("components/external-secrets/{file}")))
            .into_iter()
            .find(|d| d["metadata"]["name"] == secret)
            .unwrap();
        let template = &doc["spec"]["target"]["template"];
        assert_eq!(template["type"], "kubernetes.io/basic-auth", "{secret}");
        assert_eq!(&template["data"]["username"], user, "{secret}");
    }

    // The SOPS example: the same Secrets the component lists, the same
    // keys, every value encrypted, with the rules of its .sops.yaml.
    let sops_dir = repo().join("deploy/gitops/sops");
    let rules = &documents(&sops_dir.join(".sops.yaml"))[0]["creation_rules"][0];
    let encrypted: BTreeMap<String, BTreeSet<String>> = documents(&sops_dir.join("secrets.sops.yaml"))
        .into_iter()
        .map(|doc| {
            let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
            let sops = &doc["sops"];
            assert!(
                sops["mac"].as_str().is_some_and(|m| m.starts_with("ENC[")),
                "{name}"
            );
            assert_eq!(sops["encrypted_regex"], rules["encrypted_regex"], "{name}");
            assert_eq!(
                sops["age"][0]["recipient"], rules["age"],
                "{name}: encrypted for the .sops.yaml recipient"
            );
            let data = doc["stringData"].as_mapping().expect("stringData");
            for value in data.values() {
                assert!(
                    value.as_str().unwrap().starts_with("ENC[AES256_GCM,data:"),
                    "{name}: a value in plain text"
                );
            }
            let keys = data.keys().map(|k| k.as_str().unwrap().to_owned()).collect();
            (name, keys)
        })
        .collect();
    let expected: BTreeMap<String, BTreeSet<String>> = external
        .iter()
        .filter(|(_, (file, _))| listed.contains(file.as_str()))
        .map(|(name, (_, keys))| (name.clone(), keys.clone()))
        .collect();
    assert_eq!(encrypted, expected);
}

/// A `?ref=` kustomize can fetch and that names one version: a release tag
/// or a full 40-character commit SHA (a short one is refused).
fn pinned(reference: &str) -> bool {
    let tag = reference
        .strip_prefix('v')
        .is_some_and(|v| v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()));
    let sha = reference.len() == 40 && reference.chars().all(|c| c.is_ascii_hexdigit());
    tag || sha
}

/// Every talos-sso remote URL in a text, with its `?ref=`.
fn remote_refs(text: &str) -> Vec<(String, String)> {
    text.split_whitespace()
        .map(|w| w.trim_start_matches(['`', '(']))
        .filter(|w| w.starts_with("https://github.com/talos-sso/talos-sso//"))
        .map(|url| {
            let reference = url
                .split_once("?ref=")
                .map_or("", |(_, r)| r.trim_end_matches(['`', ')', ',', ':', '.']));
            (url.to_owned(), reference.to_owned())
        })
        .collect()
}

#[test]
fn every_remote_base_is_pinned_to_one_release() {
    assert!(pinned("v0.1.0") && pinned(&"0123456789abcdef".repeat(3)[..40]));
    for short in ["0123abc", "main", "v1", "v1.2", "latest", ""] {
        assert!(!pinned(short), "{short}");
    }
    let installation = repo().join("deploy/gitops/installation/kustomization.yaml");
    let kustomization = &documents(&installation)[0];
    let mut urls: Vec<String> = Vec::new();
    for field in ["resources", "components"] {
        for entry in kustomization[field].as_sequence().unwrap() {
            let entry = entry.as_str().unwrap();
            if entry.starts_with("https://") {
                urls.push(entry.to_owned());
            }
        }
    }
    assert!(urls.len() >= 5, "{urls:?}");
    let tag = kustomization["images"][0]["newTag"].as_str().unwrap();
    for url in &urls {
        let (_, reference) = remote_refs(url).pop().unwrap_or_else(|| panic!("{url}"));
        assert_eq!(reference, tag, "{url}: the image's release");
        assert!(pinned(&reference), "{url}");
    }
    // The same pins wherever the docs show a remote base.
    for doc in [
        "deploy/README.md",
        "deploy/kubernetes/overlays/example/kustomization.yaml",
        "docs/production.md",
    ] {
        let text = std::fs::read_to_string(repo().join(doc)).unwrap();
        let refs = remote_refs(&text);
        assert!(!refs.is_empty(), "{doc} shows no remote base");
        for (url, reference) in refs {
            assert!(pinned(&reference), "{doc}: {url} is not pinned");
        }
    }
}

#[test]
fn flux_and_argo_cd_apply_the_installation_folder() {
    let gitops = repo().join("deploy/gitops");
    let installation = &documents(&gitops.join("installation/kustomization.yaml"))[0];
    let flux = documents(&gitops.join("flux/talos-sso.yaml"));
    let source = flux.iter().find(|d| d["kind"] == "GitRepository").unwrap();
    let apply = flux.iter().find(|d| d["kind"] == "Kustomization").unwrap();
    assert_eq!(apply["spec"]["sourceRef"]["name"], source["metadata"]["name"]);
    assert_eq!(apply["spec"]["prune"], true);
    assert_eq!(apply["spec"]["wait"], true, "ready only when the pods are");
    assert_eq!(apply["spec"]["decryption"]["provider"], "sops");
    let argo = &documents(&gitops.join("argocd/talos-sso.yaml"))[0];
    assert_eq!(argo["kind"], "Application");
    assert_eq!(
        argo["spec"]["destination"]["namespace"], installation["namespace"],
        "Argo CD's namespace is the installation's"
    );
    assert_eq!(
        apply["spec"]["path"].as_str().unwrap().trim_start_matches("./"),
        argo["spec"]["source"]["path"].as_str().unwrap(),
        "both apply the same folder"
    );
    assert_eq!(argo["spec"]["syncPolicy"]["automated"]["prune"], true);
    // Every field ESO defaults is written out, or Argo CD shows drift.
    for (secret, (file, _)) in external_secrets() {
        for doc in documents(&kubernetes(&format!("components/external-secrets/{file}"))) {
            for data in doc["spec"]["data"].as_sequence().unwrap() {
                let remote = &data["remoteRef"];
                for field in ["conversionStrategy", "decodingStrategy", "metadataPolicy"] {
                    assert!(remote.get(field).is_some(), "{secret}: {field}");
                }
            }
        }
    }
}

/// sqlx's migration lock id for a database (sqlx-postgres 0.9,
/// `generate_lock_id`): 0x3d32ad9e times the CRC-32 (ISO-HDLC) of its name.
fn sqlx_migration_lock_id(database: &str) -> i64 {
    let mut crc = !0u32;
    for byte in database.bytes() {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    0x3d32_ad9e * i64::from(!crc)
}

/// The Deployment's pods each run `migrate --runtime-role` in their init
/// container; started together, they take turns on sqlx's advisory lock.
/// With the lock held from outside, two runs wait on it (seen in
/// `pg_locks`), then both succeed once it is released, each migration
/// applied once.
#[tokio::test]
async fn pods_starting_together_migrate_one_after_the_other() {
    use clap::Parser;
    use sqlx::Connection;
    use talos_sso_tests::emulator::{EmulatorConfig, EmulatorHandle};
    use talos_sso_tests::harness::{TestDatabase, Workdir, config_yaml, drop_role};

    assert_eq!(sqlx_migration_lock_id("123456789"), 0x3d32_ad9e * 0xCBF4_3926);
    let database = TestDatabase::create().await;
    let owner = format!("{}_owner", database.name);
    let runtime = format!("{}_app", database.name);
    database
        .superuser(&format!(
            "CREATE ROLE {owner} LOGIN; CREATE ROLE {runtime} LOGIN; ALTER DATABASE {} OWNER TO {owner};",
            database.name
        ))
        .await
        .unwrap();
    let emulator = EmulatorHandle::start(EmulatorConfig::default()).await.unwrap();
    let work = Workdir::new();
    let config = work.path().join("owner.yaml");
    std::fs::write(&config, config_yaml(&emulator, &work, &database.url_as(&owner))).unwrap();
    let config = config.to_str().unwrap().to_owned();
    let migrate = || async {
        let args = [
            "talos-sso-server",
            "migrate",
            "--config",
            &config,
            "--runtime-role",
            &runtime,
        ];
        let cli = talos_sso_server::cli::Cli::try_parse_from(args).unwrap();
        let mut out = Vec::new();
        let result = talos_sso_server::cli::run(cli, &mut out).await;
        let text = String::from_utf8(out).unwrap();
        result.map(|()| text.clone()).map_err(|e| format!("{text}{e:#}"))
    };

    let lock = sqlx_migration_lock_id(&database.name);
    let mut holder = sqlx::PgConnection::connect(&database.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(lock)
        .execute(&mut holder)
        .await
        .unwrap();
    let release = async {
        // Both runs queue behind the held lock, then it is let go.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut watcher = sqlx::PgConnection::connect(&database.url).await.unwrap();
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = $1",
            )
            .bind(&database.name)
            .fetch_one(&mut watcher)
            .await
            .unwrap();
            if waiting == 2 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{waiting} runs wait on the migration lock, not 2"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(lock)
            .execute(&mut holder)
            .await
            .unwrap();
    };
    let (first, second, ()) = tokio::join!(migrate(), migrate(), release);
    let (first, second) = (first.unwrap(), second.unwrap());
    for out in [&first, &second] {
        assert!(out.contains("audit database (postgres) is up to date"), "{out}");
    }
    let mut check = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let (rows, versions): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT version) FROM _sqlx_migrations WHERE success")
            .fetch_one(&mut check)
            .await
            .unwrap();
    assert!(rows >= 3 && rows == versions, "{rows} rows, {versions} versions");
    let may_insert: bool = sqlx::query_scalar("SELECT has_table_privilege($1, 'audit_events', 'INSERT')")
        .bind(&runtime)
        .fetch_one(&mut check)
        .await
        .unwrap();
    assert!(may_insert, "the runtime role's grants");
    drop(check);
    drop(holder);
    database.drop_now().await;
    drop_role(&owner).await;
    drop_role(&runtime).await;
}

/// Every object under `deploy/kubernetes` (not Kustomize's own files).
fn objects() -> Vec<Value> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&kubernetes(""), &mut files);
    files
        .iter()
        .flat_map(|f| documents(f))
        .filter(|d| d.get("kind").is_some())
        .collect()
}

/// Argo CD compares a custom resource's lists whole: a field the API server
/// or an operator defaults inside a list item shows as drift for ever. The
/// material writes those fields out (Gateway API references, CloudNativePG
/// roles, relabelings; the ExternalSecrets are checked above).
#[test]
fn no_list_item_gets_a_defaulted_field_argo_cd_would_see() {
    let has = |item: &Value, fields: &[&str], what: &str| {
        for field in fields {
            assert!(item.get(*field).is_some(), "{what}: no {field} in {item:?}");
        }
    };
    let mut checked = 0;
    for doc in objects() {
        let kind = doc["kind"].as_str().unwrap().to_owned();
        let spec = &doc["spec"];
        match kind.as_str() {
            "HTTPRoute" | "TLSRoute" => {
                for parent in spec["parentRefs"].as_sequence().unwrap() {
                    has(parent, &["group", "kind", "name"], &kind);
                }
                for rule in spec["rules"].as_sequence().unwrap() {
                    for backend in rule["backendRefs"].as_sequence().unwrap() {
                        has(backend, &["group", "kind", "name", "port", "weight"], &kind);
                    }
                    if kind == "HTTPRoute" {
                        for matched in rule["matches"].as_sequence().expect("matches") {
                            has(&matched["path"], &["type", "value"], &kind);
                        }
                    }
                }
            }
            "Gateway" => {
                for listener in spec["listeners"].as_sequence().unwrap() {
                    has(&listener["allowedRoutes"]["namespaces"], &["from"], "Gateway");
                    has(&listener["tls"], &["mode"], "Gateway");
                    for reference in listener["tls"]["certificateRefs"]
                        .as_sequence()
                        .into_iter()
                        .flatten()
                    {
                        has(reference, &["group", "kind", "name"], "Gateway");
                    }
                }
            }
            "Cluster" => {
                for role in spec["managed"]["roles"].as_sequence().unwrap() {
                    has(role, &["ensure", "connectionLimit", "inherit"], "Cluster");
                }
            }
            "ServiceMonitor" => {
                for endpoint in spec["endpoints"].as_sequence().unwrap() {
                    for relabeling in endpoint["relabelings"].as_sequence().into_iter().flatten() {
                        has(relabeling, &["action"], "ServiceMonitor");
                    }
                }
            }
            _ => continue,
        }
        checked += 1;
    }
    assert_eq!(
        checked, 6,
        "two routes, two Gateways, a Cluster, a ServiceMonitor"
    );
}
