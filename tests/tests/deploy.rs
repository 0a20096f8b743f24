//! The deployment material checked against the code: YAML parses, every
//! referenced file exists, ports and probe paths match what the server
//! serves, configuration files load with the server's own parser, every
//! `TALOS_SSO__*` variable names a real key, commands parse with the server's
//! own command line.

use std::path::{Path, PathBuf};

use clap::Parser;
use serde_yaml_ng::Value;
use talos_sso_server::cli::Cli;
use talos_sso_server::config::Config;
use talos_sso_tests::harness::{Backend, TestEnv};

fn repo() -> PathBuf {
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
        for generator in kustomization["configMapGenerator"].as_sequence().unwrap() {
            for file in generator["files"].as_sequence().unwrap() {
                let config = dir.join(file.as_str().unwrap());
                // The configuration the pods get loads with the server's parser.
                Config::from_yaml(&std::fs::read_to_string(&config).unwrap()).unwrap();
            }
        }
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

    // The migration Job: as the owner, with the owner's secret, which the
    // server's pods never mount; the runtime role's grants.
    let job = &documents(&base.join("migrate-job.yaml"))[0];
    assert_eq!(job["kind"], "Job");
    let job_pod = &job["spec"]["template"]["spec"];
    assert_eq!(job_pod["securityContext"]["runAsNonRoot"], true);
    let migrate = &job_pod["containers"][0];
    assert_eq!(migrate["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(migrate["securityContext"]["allowPrivilegeEscalation"], false);
    assert!(migrate.get("ports").is_none(), "the Service must not select it");
    let owner = assert_migrates_for(
        &strings(&migrate["args"]),
        &base.join("config.yaml"),
        env_pairs(migrate["env"].as_sequence().unwrap()),
    );
    let secrets = |pod: &Value| -> Vec<(String, String)> {
        let volumes = pod["volumes"].as_sequence().unwrap();
        pod["containers"][0]["volumeMounts"]
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
    let (_, owner_secret) = secrets(job_pod)
        .into_iter()
        .find(|(mount, _)| owner_password.starts_with(mount))
        .unwrap_or_else(|| panic!("{} is not under a secret mount", owner_password.display()));
    assert!(
        secrets(pod).iter().all(|(_, name)| *name != owner_secret),
        "the server's pods mount the owner's secret {owner_secret}"
    );
    let overlay_text = std::fs::read_to_string(overlay.join("kustomization.yaml")).unwrap();
    assert!(
        overlay_text.contains(&format!("create secret generic {owner_secret} ")),
        "the overlay says how to create {owner_secret}"
    );
    let overlay_config = overlay.join("config.yaml");
    let overlay_runtime = Config::load_with_env(&overlay_config, Vec::new()).unwrap();
    assert_eq!(
        overlay_runtime.database.url, config.database.url,
        "the overlay's server connects as the runtime role the Job grants"
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
fn dockerfile_and_compose_match_the_code() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    for stage in ["AS build", "AS emulator", "AS server"] {
        assert!(dockerfile.contains(stage), "{stage}");
    }
    assert!(dockerfile.contains("--bin talos-sso-server") && dockerfile.contains("--bin entra-emulator"));
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains("EXPOSE 8443"));
    for manifest in ["server/Cargo.toml", "tests/Cargo.toml"] {
        assert!(repo().join(manifest).exists());
    }
    assert!(
        std::fs::read_to_string(repo().join("tests/Cargo.toml"))
            .unwrap()
            .contains("name = \"entra-emulator\"")
    );

    let compose = &documents(&repo().join("docker-compose.yml"))[0];
    let services = &compose["services"];
    for name in ["postgres", "roles", "migrate", "emulator", "server"] {
        assert!(services.get(name).is_some(), "service {name}");
    }
    for name in ["emulator", "migrate", "server"] {
        let build = &services[name]["build"];
        assert!(repo().join(build["dockerfile"].as_str().unwrap()).exists());
        assert!(dockerfile.contains(&format!("AS {}", build["target"].as_str().unwrap())));
        assert_eq!(services[name]["read_only"], true);
    }
    assert!(services["postgres"]["healthcheck"].get("test").is_some());
    assert!(services["server"]["healthcheck"].get("test").is_some());
    let config_file = repo().join(compose["configs"]["server_config"]["file"].as_str().unwrap());
    let config = Config::from_yaml(&std::fs::read_to_string(&config_file).unwrap()).unwrap();
    let ports: Vec<&str> = services["emulator"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        ports
            .iter()
            .any(|p| p.ends_with(&format!(":{}", config.listen.port()))),
        "{ports:?}"
    );
    assert!(config.identity.issuer.starts_with("http://localhost:8400/"));
    assert!(ports.iter().any(|p| p.ends_with(":8400")));
    // Secrets are files the operator makes, kept out of git.
    for secret in compose["secrets"].as_mapping().unwrap().values() {
        assert!(
            secret["file"]
                .as_str()
                .unwrap()
                .starts_with("deploy/compose/secrets/")
        );
    }
    let ignore = std::fs::read_to_string(repo().join("deploy/compose/.gitignore")).unwrap();
    assert!(ignore.contains("secrets/"));
    let env: Vec<(String, String)> = services["server"]["environment"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned()))
        .collect();
    load_with(&config_file, env);
    let command: Vec<String> = services["server"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    Cli::try_parse_from(std::iter::once("talos-sso-server".to_owned()).chain(command)).unwrap();

    // The role split: `roles` makes the owner and the runtime role, then
    // `migrate` runs as the owner, then the server as the runtime role.
    let completed = |service: &str, after: &str| {
        assert_eq!(
            services[service]["depends_on"][after]["condition"], "service_completed_successfully",
            "{service} waits for {after}"
        );
    };
    completed("migrate", "roles");
    completed("server", "migrate");
    let migrate = &services["migrate"];
    let migrate_env: Vec<(String, String)> = migrate["environment"]
        .as_mapping()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned()))
        .collect();
    let owner = assert_migrates_for(&strings(&migrate["command"]), &config_file, migrate_env);
    let secret_of = |path: &Path| {
        path.strip_prefix("/run/secrets")
            .unwrap_or_else(|_| panic!("{} is not a secret", path.display()))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let owner_secret = secret_of(&owner.database.password_file.unwrap());
    let runtime_secret = secret_of(&config.database.password_file.clone().unwrap());
    let has = |service: &str, secret: &str| {
        services[service]["secrets"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|s| s == secret)
    };
    assert!(has("migrate", &owner_secret) && has("server", &runtime_secret));
    assert!(
        !has("server", &owner_secret),
        "the server holds the owner's password"
    );
    assert!(has("roles", &owner_secret) && has("roles", &runtime_secret));
    // The server signs checkpoints with a key it holds, into a folder it
    // can write (the rest of its filesystem is read-only).
    let checkpoints = config
        .audit
        .checkpoints
        .clone()
        .expect("compose signs checkpoints");
    assert!(has(
        "server",
        &secret_of(checkpoints.key_file.as_deref().expect("a key file"))
    ));
    let writable: Vec<String> = strings(&services["server"]["volumes"]);
    assert!(
        writable
            .iter()
            .any(|v| v.ends_with(&format!(":{}", checkpoints.file.parent().unwrap().display()))),
        "{writable:?}"
    );
    // The roles the script makes are the ones the configurations name.
    let roles = &services["roles"];
    let script = repo().join(compose["configs"]["postgres_roles"]["file"].as_str().unwrap());
    let script = std::fs::read_to_string(script).unwrap();
    for (variable, role, secret) in [
        (
            "TALOS_SSO_OWNER",
            database_user(owner.database.url.as_deref().unwrap()),
            &owner_secret,
        ),
        (
            "TALOS_SSO_RUNTIME",
            database_user(config.database.url.as_deref().unwrap()),
            &runtime_secret,
        ),
    ] {
        assert!(
            script.contains(&format!("${{{variable}_ROLE:={role}}}")),
            "{variable}: {role}"
        );
        assert!(
            script.contains(&format!("${{{variable}_PASSWORD_FILE:=/run/secrets/{secret}}}")),
            "{variable}: {secret}"
        );
    }
    assert_eq!(
        roles["user"], services["server"]["user"],
        "the secret files are yours"
    );
    let readme = std::fs::read_to_string(repo().join("deploy/compose/README.md")).unwrap();
    for secret in compose["secrets"].as_mapping().unwrap().keys() {
        let name = secret.as_str().unwrap();
        let file = compose["secrets"][name]["file"].as_str().unwrap();
        let file = file.rsplit('/').next().unwrap();
        assert!(readme.contains(file), "deploy/compose/README.md makes {file}");
    }
}

#[test]
fn systemd_unit_and_talos_example_match_the_code() {
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
    for file in [
        config.clusters["homelab"].ca.key_file.clone().unwrap(),
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
    // SQLite migrates at start: no roles, the file's permissions are the boundary.
    assert_eq!(config.database.url, None);
    assert_ne!(config.database.migrate_on_start, Some(false));

    // Postgres: the server as the runtime role; a unit of its own migrates as
    // the owner, with the owner's password loaded for it alone.
    let postgres_config = repo().join("deploy/systemd/config-postgres.yaml");
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

    let talos = documents(&repo().join("deploy/talos/extension-service.yaml"));
    assert_eq!(talos[0]["kind"], "ExtensionServiceConfig");
    let content = talos[0]["configFiles"][0]["content"].as_str().unwrap();
    Config::from_yaml(content).unwrap();
    let args: Vec<String> = talos[1]["container"]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    Cli::try_parse_from(std::iter::once("talos-sso-server".to_owned()).chain(args)).unwrap();
    assert_eq!(talos[1]["container"]["security"]["writeableRootfs"], false);
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

#[test]
fn the_compose_stack_takes_the_user_from_variables_bash_lets_you_set() {
    // `UID` is read-only in bash: `UID=$(id -u) docker compose up` fails.
    let compose =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docker-compose.yml")).unwrap();
    assert!(
        compose.contains("${TALOS_SSO_UID:-1000}:${TALOS_SSO_GID:-1000}"),
        "{compose}"
    );
    let readme = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/compose/README.md"
    ))
    .unwrap();
    assert!(
        !readme.contains(" UID=") && readme.contains("TALOS_SSO_UID=$(id -u)"),
        "{readme}"
    );
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
                talos_sso_server::policy::ClusterPolicy::new(cluster.policy())
                    .unwrap_or_else(|e| panic!("{}: cluster {name}: {e}", page.display()));
            }
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
