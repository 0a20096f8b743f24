//! The container material against the code: the Dockerfile and the
//! Compose stack name the ports, paths, users and variables the server
//! has, and the stack takes its database user from variables bash lets
//! you set.

use super::*;

#[test]
fn dockerfile_and_compose_match_the_code() {
    let dockerfile = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    for stage in [
        "AS server-build",
        "AS release-binary",
        "AS emulator-build",
        "AS emulator",
        "AS server",
    ] {
        assert!(dockerfile.contains(stage), "{stage}");
    }
    // The server's build compiles the server alone, never the tests crate.
    let server_build = dockerfile
        .split("\nFROM ")
        .find(|stage| stage.contains("AS server-build"))
        .unwrap();
    assert!(server_build.contains("--bin talos-sso-server"), "{server_build}");
    assert!(!server_build.contains("talos-sso-tests"), "{server_build}");
    assert!(dockerfile.contains("--bin entra-emulator"));
    // The base images are build arguments, and the final stage is the server.
    assert!(dockerfile.contains("ARG RUST_IMAGE=") && dockerfile.contains("ARG RUNTIME_IMAGE="));
    assert!(dockerfile.contains("FROM ${RUNTIME_IMAGE} AS server"));
    assert!(dockerfile.contains("org.opencontainers.image.revision"));
    let ignored = std::fs::read_to_string(repo().join(".dockerignore")).unwrap();
    for path in ["target/", ".git/", "**/node_modules/"] {
        assert!(
            ignored.lines().any(|line| line == path),
            "{path} in .dockerignore"
        );
    }
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
