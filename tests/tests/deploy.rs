//! The deployment material checked against the code: YAML parses, every
//! referenced file exists, ports and probe paths match what the server
//! serves (the Dockerfile and Compose stack: `containers`), configuration
//! files load with the server's own parser, every
//! `TALOS_SSO__*` variable names a real key, commands parse with the server's
//! own command line; every cluster of the production configurations is in
//! accepted-CA mode and loads, as the server loads it, from the files the
//! material delivers (`accepted_ca`). The Kubernetes objects' labels select
//! the server and never the database, migrations run in an init container
//! (no Job), every mounted Secret has a declarative source, the
//! NetworkPolicies, Ingresses and routes open and reach the ports the
//! server has, the CloudNativePG roles are the ones the configuration
//! connects as (`kubernetes`); the Talos extension starts from the files laid out as Talos
//! writes them (`talos`); the access gateway's component and overlay open,
//! mount and expose what its configuration names, and load (`gateway`),
//! and the overlay's configuration starts a gateway (`gateway_serving`).

pub(crate) mod accepted_ca;
mod containers;
mod gateway;
mod gateway_serving;
mod kubernetes;
mod talos;

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_yaml_ng::Value;
use talos_sso_server::cli::Cli;
use talos_sso_server::config::Config;
use talos_sso_tests::harness::{Backend, TestEnv};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            out.push(path);
        }
    }
}

#[test]
fn every_yaml_file_parses() {
    let mut files = vec![repo().join("docker-compose.yml")];
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(files.len() >= 12, "{files:?}");
    for file in files {
        assert!(!documents(&file).is_empty(), "{}", file.display());
    }
}

/// Apply the `TALOS_SSO__*` variables to a configuration file: unknown keys fail.
fn load_with(config: &Path, env: Vec<(String, String)>) {
    Config::load_with_env(config, env).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
}

fn env_pairs(list: &[Value]) -> Vec<(String, String)> {
    list.iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str().unwrap_or_default().to_owned(),
            ))
        })
        .collect()
}

/// The arguments of a command line, as strings.
fn strings(list: &Value) -> Vec<String> {
    list.as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The user a database URL connects as.
fn database_user(url: &str) -> String {
    url::Url::parse(url).unwrap().username().to_owned()
}

/// A `migrate` command line: it parses with the server's own command line
/// and names the runtime role, the role the configuration at `config`
/// connects as, without migrating at start; the owner's connection (that
/// configuration with the `env` overrides, as `migrate` loads it) is another
/// role, with a password file. The owner's configuration.
fn assert_migrates_for(args: &[String], config: &Path, env: Vec<(String, String)>) -> Config {
    Cli::try_parse_from(std::iter::once("talos-sso-server".to_owned()).chain(args.iter().cloned())).unwrap();
    assert_eq!(args[0], "migrate", "{args:?}");
    let role = args
        .iter()
        .position(|a| a == "--runtime-role")
        .map(|i| args[i + 1].clone())
        .unwrap_or_else(|| panic!("no --runtime-role: {args:?}"));
    let runtime = Config::load_with_env(config, Vec::new()).unwrap();
    assert_eq!(
        database_user(runtime.database.url.as_deref().unwrap()),
        role,
        "{}: the server connects as the runtime role",
        config.display()
    );
    assert_eq!(
        runtime.database.migrate_on_start,
        Some(false),
        "{}",
        config.display()
    );
    let owner = Config::load_with_env(config, env).unwrap_or_else(|e| panic!("{}: {e}", config.display()));
    let owner_role = database_user(owner.database.url.as_deref().unwrap());
    assert!(
        !owner_role.is_empty() && owner_role != role,
        "owner {owner_role}, runtime {role}"
    );
    assert_ne!(owner.database.password_file, runtime.database.password_file);
    assert!(owner.database.password_file.is_some());
    owner
}

#[test]
fn kustomize_base_and_overlay_hold_together() {
    let base = repo().join("deploy/kubernetes/base");
    let overlay = repo().join("deploy/kubernetes/overlays/example");
    for dir in [&base, &overlay] {
        let kustomization = &documents(&dir.join("kustomization.yaml"))[0];
        for resource in kustomization["resources"].as_sequence().unwrap() {
            let path = dir.join(resource.as_str().unwrap());
            assert!(path.exists(), "{} names {}", dir.display(), path.display());
        }
        for component in kustomization["components"].as_sequence().into_iter().flatten() {
            let path = dir.join(component.as_str().unwrap()).join("kustomization.yaml");
            assert!(path.exists(), "{} names {}", dir.display(), path.display());
        }
        for generator in kustomization["configMapGenerator"].as_sequence().unwrap() {
            for file in generator["files"].as_sequence().unwrap() {
                let path = dir.join(file.as_str().unwrap());
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("{} names {}: {e}", dir.display(), path.display()));
                // The configuration the pods get loads with the server's parser.
                if path.extension().is_some_and(|e| e == "yaml") {
                    Config::from_yaml(&text).unwrap();
                }
            }
        }
    }
    // The Talos CA certificate each configuration names (`talos_ca`, public)
    // comes in the ConfigMap the configuration itself comes in: every
    // installation's generator delivers it next to config.yaml, mounted
    // where the configuration reads it.
    let installation = repo().join("deploy/gitops/installation");
    for (dir, config) in [
        (&overlay, overlay.join("config.yaml")),
        (&installation, overlay.join("config.yaml")),
        (&overlay, base.join("config.yaml")),
    ] {
        let kustomization = &documents(&dir.join("kustomization.yaml"))[0];
        let generator = kustomization["configMapGenerator"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "talos-sso-config")
            .unwrap_or_else(|| panic!("{}: no talos-sso-config", dir.display()));
        let delivered: Vec<&str> = generator["files"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let parsed = Config::from_yaml(&std::fs::read_to_string(&config).unwrap()).unwrap();
        for (name, cluster) in &parsed.clusters {
            let talos_ca = cluster
                .talos_ca
                .as_ref()
                .and_then(|t| t.cert_file.clone())
                .unwrap_or_else(|| panic!("{}: cluster {name} is not in accepted-CA mode", config.display()));
            let file = talos_ca.strip_prefix("/etc/talos-sso").unwrap_or_else(|_| {
                panic!(
                    "{}: {} is not in the ConfigMap's mount",
                    config.display(),
                    talos_ca.display()
                )
            });
            assert!(
                delivered.contains(&file.to_str().unwrap()),
                "{}: {} does not deliver {} ({delivered:?})",
                config.display(),
                dir.display(),
                file.display()
            );
        }
    }
    // Both configurations load, as the server loads them at start, from
    // test material where they name it: the client CA from the Secret, the
    // Talos CA certificate from the ConfigMap.
    for config in [base.join("config.yaml"), overlay.join("config.yaml")] {
        let root = tempfile::tempdir().unwrap();
        accepted_ca::load_in_accepted_ca_mode(
            &config.display().to_string(),
            &std::fs::read_to_string(&config).unwrap(),
            root.path(),
            &accepted_ca::CaFiles::new,
        );
    }
    let overlay_k = &documents(&overlay.join("kustomization.yaml"))[0];
    let tag = overlay_k["images"][0]["newTag"].as_str().unwrap();
    let pinned = tag
        .strip_prefix('v')
        .is_some_and(|v| v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()));
    assert!(pinned, "the overlay pins a release tag, not `{tag}`");

    let deployment = &documents(&base.join("deployment.yaml"))[0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    // The container port is the one the configuration listens on.
    let config = Config::from_yaml(&std::fs::read_to_string(base.join("config.yaml")).unwrap()).unwrap();
    assert_eq!(
        container["ports"][0]["containerPort"].as_u64(),
        Some(u64::from(config.listen.port()))
    );
    let service = &documents(&base.join("service.yaml"))[0];
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        container["ports"][0]["name"]
    );
    // The metrics listener: the container port named `metrics` is the one
    // `metrics.listen` names, and the Service exposes it under that name
    // (the ServiceMonitor scrapes the port `metrics`).
    let raw_config = &documents(&base.join("config.yaml"))[0];
    let metrics_listen: std::net::SocketAddr =
        raw_config["metrics"]["listen"].as_str().unwrap().parse().unwrap();
    assert_ne!(
        metrics_listen.port(),
        config.listen.port(),
        "metrics has a listener of its own"
    );
    let metrics_port = container["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a container port named metrics");
    assert_eq!(
        metrics_port["containerPort"].as_u64(),
        Some(u64::from(metrics_listen.port()))
    );
    assert!(
        service["spec"]["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "metrics" && p["targetPort"] == "metrics"),
        "the Service exposes the metrics port"
    );
    assert_eq!(
        documents(&base.join("poddisruptionbudget.yaml"))[0]["kind"],
        "PodDisruptionBudget"
    );
    // Every mounted Secret or ConfigMap path the configuration uses is mounted.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    let cluster = &config.clusters["prod"];
    let checkpoints = config
        .audit
        .checkpoints
        .clone()
        .expect("the base signs checkpoints");
    for file in [
        cluster.ca.cert_file.clone().unwrap(),
        cluster.ca.key_file.clone().unwrap(),
        cluster.talos_ca.clone().unwrap().cert_file.unwrap(),
        config.tls.clone().unwrap().key_file,
        config.database.password_file.clone().unwrap(),
        checkpoints
            .key_file
            .expect("the base keeps the audit key in a file"),
        checkpoints.file,
    ] {
        assert!(
            mounts.iter().any(|m| file.starts_with(m)),
            "{} is not under a mount: {mounts:?}",
            file.display()
        );
    }
    // Environment variables name real configuration keys.
    load_with(
        &base.join("config.yaml"),
        env_pairs(container["env"].as_sequence().unwrap()),
    );
    // The server's own command line accepts the arguments.
    let args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    Cli::try_parse_from(std::iter::once("talos-sso-server".to_owned()).chain(args)).unwrap();

    // The migrations: the pod's init container `migrate`, as the owner, with
    // the owner's secret, which the server's container never mounts; the
    // runtime role's grants. No Job: its pod spec cannot change between
    // releases, which Flux cannot apply and Argo CD shows as drift.
    let init = pod["initContainers"].as_sequence().expect("init containers");
    assert_eq!(init.len(), 1, "one init container");
    let migrate = &init[0];
    assert_eq!(migrate["name"], "migrate");
    assert_eq!(migrate["image"], container["image"], "the server's own image");
    assert_eq!(migrate["securityContext"], container["securityContext"]);
    assert!(
        migrate.get("ports").is_none(),
        "the init container serves nothing"
    );
    let owner = assert_migrates_for(
        &strings(&migrate["args"]),
        &base.join("config.yaml"),
        env_pairs(migrate["env"].as_sequence().unwrap()),
    );
    let volumes = pod["volumes"].as_sequence().unwrap();
    let secrets = |container: &Value| -> Vec<(String, String)> {
        container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .filter_map(|m| {
                let volume = volumes.iter().find(|v| v["name"] == m["name"])?;
                Some((
                    m["mountPath"].as_str()?.to_owned(),
                    volume["secret"]["secretName"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    let owner_password = owner.database.password_file.unwrap();
    let (_, owner_secret) = secrets(migrate)
        .into_iter()
        .find(|(mount, _)| owner_password.starts_with(mount))
        .unwrap_or_else(|| panic!("{} is not under a secret mount", owner_password.display()));
    assert!(
        secrets(container).iter().all(|(_, name)| *name != owner_secret),
        "the server's container mounts the owner's secret {owner_secret}"
    );
    let overlay_config = overlay.join("config.yaml");
    let overlay_runtime = Config::load_with_env(&overlay_config, Vec::new()).unwrap();
    assert_eq!(
        overlay_runtime.database.url, config.database.url,
        "the overlay's server connects as the runtime role the init container grants"
    );
}

#[tokio::test]
async fn probe_paths_are_served() {
    let deployment = &documents(&repo().join("deploy/kubernetes/base/deployment.yaml"))[0];
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = TestEnv::start(Backend::Sqlite).await;
    for probe in ["readinessProbe", "livenessProbe"] {
        let path = container[probe]["httpGet"]["path"].as_str().unwrap();
        let status = env
            .http
            .get(format!("{}{path}", env.server.base_url))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{probe} {path}");
    }
    env.finish().await;
}

#[test]
fn systemd_unit_matches_the_code() {
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/talos-sso-server.service")).unwrap();
    for hardening in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "StateDirectory=talos-sso",
    ] {
        assert!(unit.contains(hardening), "{hardening}");
    }
    for line in unit.lines().filter(|l| l.starts_with("ExecStart")) {
        let command = line.split_once('=').unwrap().1;
        let args: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(args[0], "/usr/local/bin/talos-sso-server");
        Cli::try_parse_from(std::iter::once("talos-sso-server").chain(args[1..].iter().copied())).unwrap();
    }
    let systemd_config = repo().join("deploy/systemd/config.yaml");
    let config = Config::from_yaml(&std::fs::read_to_string(&systemd_config).unwrap()).unwrap();
    assert_eq!(
        config.data_dir,
        PathBuf::from("/var/lib/talos-sso"),
        "the unit's StateDirectory"
    );
    // Credentials the configuration reads are the ones the unit loads.
    let homelab = &config.clusters["homelab"];
    for file in [
        homelab.ca.cert_file.clone().unwrap(),
        homelab.ca.key_file.clone().unwrap(),
        config.tls.clone().unwrap().key_file,
        config
            .audit
            .checkpoints
            .clone()
            .expect("checkpoints")
            .key_file
            .expect("a key file"),
    ] {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        assert!(unit.contains(&format!("LoadCredential={name}:")), "{name}");
    }
    let env_line = unit.lines().find(|l| l.starts_with("Environment=")).unwrap();
    let env: Vec<(String, String)> = env_line["Environment=".len()..]
        .split_whitespace()
        .filter_map(|pair| pair.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    load_with(&systemd_config, env);
    // The Talos CA certificate is public: a plain file next to the
    // configuration, which the unit's install line puts there (a
    // credential would be read only at start, not at a reload).
    let talos_ca = homelab.talos_ca.clone().unwrap().cert_file.unwrap();
    assert_eq!(talos_ca.parent(), Some(Path::new("/etc/talos-sso")));
    let install = unit
        .lines()
        .find(|l| l.contains("install -m 0644 config.yaml"))
        .expect("the unit's install line for /etc/talos-sso");
    let talos_ca_name = talos_ca.file_name().unwrap().to_str().unwrap();
    assert!(install.contains(talos_ca_name), "{install}");
    // Both configurations load in accepted-CA mode from the material where
    // they name it, and name the same files.
    let postgres_config = repo().join("deploy/systemd/config-postgres.yaml");
    for path in [&systemd_config, &postgres_config] {
        let root = tempfile::tempdir().unwrap();
        accepted_ca::load_in_accepted_ca_mode(
            &path.display().to_string(),
            &std::fs::read_to_string(path).unwrap(),
            root.path(),
            &accepted_ca::CaFiles::new,
        );
        let other = Config::from_yaml(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(other.clusters["homelab"].ca.cert_file, homelab.ca.cert_file);
        assert_eq!(other.clusters["homelab"].ca.key_file, homelab.ca.key_file);
        assert_eq!(
            other.clusters["homelab"].talos_ca.clone().unwrap().cert_file,
            Some(talos_ca.clone())
        );
    }
    // SQLite migrates at start: no roles, the file's permissions are the boundary.
    assert_eq!(config.database.url, None);
    assert_ne!(config.database.migrate_on_start, Some(false));

    // Postgres: the server as the runtime role; a unit of its own migrates as
    // the owner, with the owner's password loaded for it alone.
    let migrate_unit =
        std::fs::read_to_string(repo().join("deploy/systemd/talos-sso-server-migrate.service")).unwrap();
    assert!(migrate_unit.contains("Type=oneshot") && migrate_unit.contains("DynamicUser=yes"));
    let migrate_args: Vec<String> = migrate_unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart=/usr/local/bin/talos-sso-server "))
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let migrate_env: Vec<(String, String)> = migrate_unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment="))
        .unwrap()
        .split_whitespace()
        .filter_map(|pair| pair.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let owner = assert_migrates_for(&migrate_args, &postgres_config, migrate_env);
    let credential = |path: PathBuf, unit_name: &str| {
        let name = path
            .strip_prefix(format!("/run/credentials/{unit_name}/"))
            .unwrap_or_else(|_| panic!("{} is not a credential of {unit_name}", path.display()))
            .to_str()
            .unwrap()
            .to_owned();
        format!("LoadCredential={name}:")
    };
    let owner_credential = credential(
        owner.database.password_file.unwrap(),
        "talos-sso-server-migrate.service",
    );
    assert!(migrate_unit.contains(&owner_credential), "{owner_credential}");
    assert!(
        !unit.contains(&owner_credential),
        "the server loads the owner's password"
    );
    let runtime = Config::load_with_env(&postgres_config, Vec::new()).unwrap();
    let runtime_credential = credential(
        runtime.database.password_file.unwrap(),
        "talos-sso-server.service",
    );
    assert!(unit.contains(&runtime_credential), "{runtime_credential}");
    assert!(
        !unit.contains("ExecStartPre=/usr/local/bin/talos-sso-server migrate"),
        "the server's unit does not migrate"
    );
}

#[test]
fn the_emulator_binary_answers_help_and_refuses_unknown_options() {
    let emulator = env!("CARGO_BIN_EXE_entra-emulator");
    let help = std::process::Command::new(emulator)
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.starts_with("Usage: entra-emulator [ADDRESS] [--public-url URL]"),
        "{text}"
    );
    let bogus = std::process::Command::new(emulator)
        .arg("--bogus")
        .output()
        .unwrap();
    assert!(!bogus.status.success());
    let text = String::from_utf8(bogus.stderr).unwrap();
    assert!(text.contains("unknown option `--bogus`"), "{text}");
}

/// The fenced `yaml` blocks of a Markdown page.
fn yaml_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```yaml") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "a yaml block is not closed");
    blocks
}

#[test]
fn every_provider_pages_server_configuration_loads() {
    let dir = repo().join("docs/providers");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md") && !p.ends_with("README.md"))
        .collect();
    pages.sort();
    let names: Vec<String> = pages
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "authentik",
            "dex",
            "entra-id",
            "google-workspace",
            "keycloak",
            "okta"
        ]
    );
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut loaded = 0;
        for block in yaml_blocks(&text) {
            let value: Value = serde_yaml_ng::from_str(&block)
                .unwrap_or_else(|e| panic!("{}: a yaml block does not parse: {e}\n{block}", page.display()));
            // A server configuration names its identity provider; the other
            // blocks are the provider's own settings (Dex's staticClients).
            if value.get("identity").is_none() {
                continue;
            }
            let config =
                Config::from_yaml(&block).unwrap_or_else(|e| panic!("{}: {e}\n{block}", page.display()));
            // The rules as the server checks them at start (role names,
            // selectors), which needs no file.
            for (name, cluster) in &config.clusters {
                talos_sso_server::policy::ClusterPolicy::new(cluster.policy(&config.identity))
                    .unwrap_or_else(|e| panic!("{}: cluster {name}: {e}", page.display()));
            }
            // The clusters, in the mode production uses, with CA material
            // where the page names it.
            let root = tempfile::tempdir().unwrap();
            accepted_ca::load_in_accepted_ca_mode(
                &page.display().to_string(),
                &block,
                root.path(),
                &accepted_ca::CaFiles::new,
            );
            loaded += 1;
        }
        assert!(loaded >= 1, "{} has no server configuration", page.display());
    }
    // The index and the CLI's page link every provider page.
    let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
    for name in &names {
        assert!(
            index.contains(&format!("]({name}.md)")),
            "docs/providers/README.md: {name}"
        );
    }
    let cli = std::fs::read_to_string(repo().join("docs/cli.md")).unwrap();
    assert!(
        cli.contains("](providers/README.md)"),
        "docs/cli.md links the providers"
    );
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    assert!(
        readme.contains("](docs/providers/README.md)"),
        "README.md links the providers"
    );
}
