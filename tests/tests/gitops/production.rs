//! docs/production.md against the programs: its `talos-sso-server` and
//! `talos-sso` commands parse with their own command lines, and step 2
//! runs as written (accepted-CA mode): the CA material, the patches Talos
//! is given and the order they are applied in, the files the later steps
//! name, and the installation's configuration loading from them.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Parser;
use serde_yaml_ng::Value;
use talos_sso_server::ca::generate::{self, NewCa, NewKeyType};

use super::{documents, repo};
use crate::deploy::accepted_ca::{CaFiles, load_in_accepted_ca_mode};

fn page() -> String {
    std::fs::read_to_string(repo().join("docs/production.md")).unwrap()
}

/// The command lines of the fenced `sh` blocks of a Markdown page, with
/// `\` continuations joined and `$(...)` captures taken as the command.
fn shell_commands(page: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut current = String::new();
    for line in page.lines() {
        match line.trim_end() {
            "```sh" => in_block = true,
            "```" => in_block = false,
            text if in_block => {
                current.push_str(text.trim_end_matches('\\'));
                current.push(' ');
                if !text.ends_with('\\') {
                    let command = current.trim();
                    let command = command
                        .split_once("=$(")
                        .map_or(command, |(_, c)| c.trim_end_matches(')'));
                    commands.push(command.to_owned());
                    current.clear();
                }
            }
            _ => {}
        }
    }
    commands
}

/// Each command of a pipeline (`a | b`), as words.
fn pipeline(command: &str) -> Vec<Vec<String>> {
    command
        .split(" | ")
        .map(|part| part.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// docs/production.md's `talos-sso-server` and `talos-sso` commands,
/// each part of a pipeline too, parse with the programs' own command lines.
#[test]
fn the_production_path_commands_parse() {
    let commands = shell_commands(&page());
    let (mut server, mut client) = (0, 0);
    for command in &commands {
        for words in pipeline(command) {
            match words.first().map(String::as_str) {
                Some("talos-sso-server") => {
                    talos_sso_server::cli::Cli::try_parse_from(&words)
                        .unwrap_or_else(|e| panic!("{command}: {e}"));
                    server += 1;
                }
                Some("talos-sso") => {
                    talos_sso::cli::Cli::try_parse_from(&words).unwrap_or_else(|e| panic!("{command}: {e}"));
                    client += 1;
                }
                _ => {}
            }
        }
    }
    assert!(server >= 6 && client >= 3, "{commands:?}");
}

/// The flags of `talos-sso-server` whose value is a file or folder.
const PATH_FLAGS: &[&str] = &[
    "--out-cert",
    "--out-key",
    "--out-public",
    "--cert-file",
    "--key-file",
    "--talos-ca-cert-file",
    "--talosconfig",
    "--ca-cert",
    "--current",
    "--out-dir",
];

/// `talosctl -n <node> get machineconfig -o yaml` as it prints a node of
/// the cluster whose CA is `talos`: a control plane (`cp-...`, with the CA
/// key) or a worker (without it), accepting no other CA yet.
fn machine_config_resource(node: &str, talos: &NewCa) -> String {
    let control_plane = node.starts_with("cp");
    let config = format!(
        "version: v1alpha1\nmachine:\n    type: {}\n    ca:\n        crt: {}\n        key: \"{}\"\ncluster: {{}}\n",
        if control_plane { "controlplane" } else { "worker" },
        STANDARD.encode(&talos.cert_pem),
        if control_plane {
            STANDARD.encode(&talos.key_pem)
        } else {
            String::new()
        },
    );
    let spec: String = config.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        "node: {node}\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    id: v1alpha1\nspec: |\n{spec}"
    )
}

/// The node names of `-n a,b,c`.
fn nodes(words: &[String]) -> Vec<String> {
    let at = words
        .iter()
        .position(|w| w == "-n")
        .unwrap_or_else(|| panic!("no -n: {words:?}"));
    words[at + 1].split(',').map(str::to_owned).collect()
}

/// One `talosctl patch machineconfig` of the page.
#[derive(Debug)]
struct PatchRun {
    nodes: Vec<String>,
    patches: Vec<String>,
    dry_run: bool,
}

/// Step 2 of docs/production.md run as written, in a scratch folder, for
/// a Talos cluster made here and its administrator's talosconfig: each
/// `talos-sso-server` command through the server's own command line, with
/// the machine configuration `talosctl get machineconfig` prints for the
/// node it names as its input. Then: every patch a `talosctl patch` names
/// was written, lists the client CA, was rendered from a node of those it
/// is applied to, is checked with `--dry-run` before it is applied without
/// a reboot, control planes before workers; `ca talos-ca` wrote the Talos
/// CA certificate alone; the files step 3 stores were made; the
/// installation's ConfigMap carries the Talos CA certificate; and the
/// example configuration loads in accepted-CA mode from these files.
#[tokio::test]
async fn the_production_path_runs_as_written() {
    let page = page();
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("home");
    let year = std::time::Duration::from_secs(365 * 86400);
    let now = time::OffsetDateTime::now_utc();
    let talos = generate::new_root(NewKeyType::Ed25519, "talos", 10 * year, now).unwrap();
    let admin = generate::new_root(NewKeyType::Ed25519, "os:admin", year, now).unwrap();
    let talosconfig = format!(
        "context: prod\ncontexts:\n  prod:\n    endpoints: [cp-01]\n    ca: {}\n    crt: {}\n    key: {}\n",
        STANDARD.encode(&talos.cert_pem),
        STANDARD.encode(&admin.cert_pem),
        STANDARD.encode(&admin.key_pem),
    );
    std::fs::create_dir_all(home.join(".talos")).unwrap();
    std::fs::write(home.join(".talos/config"), talosconfig).unwrap();
    let path = |value: &str| -> String {
        match value.strip_prefix("~/") {
            Some(rest) => home.join(rest),
            None => scratch.path().join(value),
        }
        .display()
        .to_string()
    };

    let mut written: BTreeMap<String, String> = BTreeMap::new();
    let mut rendered_from: BTreeMap<String, String> = BTreeMap::new();
    let mut runs: Vec<PatchRun> = Vec::new();
    for command in shell_commands(&page) {
        let parts = pipeline(&command);
        let words = parts.last().unwrap();
        match words.first().map(String::as_str) {
            Some("talos-sso-server") => {}
            Some("talosctl") if words.get(3).map(String::as_str) == Some("patch") => {
                assert!(
                    words.contains(&"--mode=no-reboot".to_owned()),
                    "{command}: without a reboot"
                );
                let patches: Vec<String> = words
                    .iter()
                    .filter_map(|w| w.strip_prefix('@'))
                    .map(str::to_owned)
                    .collect();
                assert!(!patches.is_empty(), "{command}");
                runs.push(PatchRun {
                    nodes: nodes(words),
                    patches,
                    dry_run: words.contains(&"--dry-run".to_owned()),
                });
                continue;
            }
            _ => continue,
        }
        // Its input, when it reads a node's configuration from a pipe.
        let source = match parts.as_slice() {
            [_] => None,
            [from, _] => {
                assert_eq!(
                    from[1..],
                    ["-n", from[2].as_str(), "get", "machineconfig", "-o", "yaml"].map(str::to_owned),
                    "{command}"
                );
                Some(from[2].clone())
            }
            _ => panic!("{command}: a longer pipeline than this test knows"),
        };
        let mut args = vec![words[0].clone()];
        let mut flag: Option<&str> = None;
        for word in &words[1..] {
            let value = match flag.take() {
                Some("--current") if word == "-" => {
                    let node = source
                        .clone()
                        .unwrap_or_else(|| panic!("{command}: `--current -` without a pipe"));
                    let file = scratch.path().join(format!("current-{node}.yaml"));
                    std::fs::write(&file, machine_config_resource(&node, &talos)).unwrap();
                    file.display().to_string()
                }
                Some(name) if PATH_FLAGS.contains(&name) => {
                    written.insert(name.to_owned(), word.clone());
                    if name == "--out-dir" {
                        rendered_from.insert(word.clone(), source.clone().expect("a node"));
                    }
                    path(word)
                }
                _ => {
                    assert!(
                        !word.contains('/') && !word.contains(".crt") && !word.contains(".key"),
                        "{command}: {word} looks like a file this test does not place"
                    );
                    word.clone()
                }
            };
            if word.starts_with("--") {
                flag = PATH_FLAGS.iter().copied().find(|f| f == word);
            }
            args.push(value);
        }
        let cli =
            talos_sso_server::cli::Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{command}: {e}"));
        let mut out = Vec::new();
        let result = talos_sso_server::cli::run(cli, &mut out).await;
        let out = String::from_utf8_lossy(&out);
        result.unwrap_or_else(|e| panic!("{command}: {e:#}\n{out}"));
        if words[1..3] == ["ca", "client-ca"] {
            written.insert("client-ca.crt".into(), written["--out-cert"].clone());
            written.insert("client-ca.key".into(), written["--out-key"].clone());
        } else if words[1..3] == ["ca", "talos-ca"] {
            written.insert("talos-ca.crt".into(), written["--out-cert"].clone());
        }
    }

    // The CA material, as step 2 says: the Talos CA certificate alone.
    let read = |name: &str| std::fs::read_to_string(path(&written[name])).unwrap();
    let client_ca_cert = read("client-ca.crt");
    let talos_ca_cert = read("talos-ca.crt");
    assert_eq!(talos_ca_cert.trim(), talos.cert_pem.trim());
    assert!(!talos_ca_cert.contains("PRIVATE KEY"), "{talos_ca_cert}");

    // The patches: rendered from a node of those they go to, listing the
    // client CA, checked before they are applied, control planes first.
    let applied: Vec<&PatchRun> = runs.iter().filter(|r| !r.dry_run).collect();
    assert!(applied.len() >= 2, "{runs:?}");
    for (at, run) in runs.iter().enumerate() {
        for patch in &run.patches {
            let file = scratch.path().join(patch);
            assert!(file.is_file(), "{patch} was not written");
            let dir = Path::new(patch).parent().unwrap().to_str().unwrap();
            let from = &rendered_from[dir];
            assert!(
                run.nodes.contains(from),
                "{patch}, rendered from {from}, goes to {:?}",
                run.nodes
            );
            let patch_doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            if let Some(list) = patch_doc["machine"]["acceptedCAs"].as_sequence() {
                let listed = list.iter().any(|entry| {
                    let pem = STANDARD.decode(entry["crt"].as_str().unwrap()).unwrap();
                    String::from_utf8(pem).unwrap().trim() == client_ca_cert.trim()
                });
                assert!(listed, "{patch} does not list the client CA");
            }
        }
        if !run.dry_run {
            assert!(
                runs[..at]
                    .iter()
                    .any(|r| r.dry_run && r.nodes == run.nodes && r.patches == run.patches),
                "{run:?} is applied without a --dry-run first"
            );
        }
    }
    let is_control_plane = |run: &&PatchRun| run.nodes.iter().all(|n| n.starts_with("cp"));
    assert!(is_control_plane(&applied[0]), "{applied:?}");
    assert!(
        applied.iter().any(|r| !is_control_plane(r)),
        "the workers are patched too"
    );
    let first_worker = applied.iter().position(|r| !is_control_plane(r)).unwrap();
    assert!(
        applied[first_worker..].iter().all(|r| !is_control_plane(r)),
        "control planes first, then workers: {applied:?}"
    );

    // Step 3 stores files step 2 made.
    let step3 = page
        .split("## 3. ")
        .nth(1)
        .and_then(|rest| rest.split("## 4. ").next())
        .expect("a step 3");
    let stored: Vec<&str> = step3
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|w| w.ends_with(".crt") || w.ends_with(".key"))
        .collect();
    assert!(stored.len() >= 3, "{stored:?}");
    for file in stored {
        assert!(
            scratch.path().join(file).is_file(),
            "step 3 stores {file}, which step 2 does not make"
        );
    }

    // The installation carries the Talos CA certificate, by the name step 2
    // gives it, in the server's ConfigMap.
    let installation = &documents(&repo().join("deploy/gitops/installation/kustomization.yaml"))[0];
    let config_map = installation["configMapGenerator"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "talos-sso-config")
        .unwrap();
    assert!(
        config_map["files"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|f| f.as_str() == Some(written["talos-ca.crt"].as_str())),
        "{config_map:?}"
    );

    // The example configuration loads from exactly these files.
    let config = repo().join("deploy/kubernetes/overlays/example/config.yaml");
    let root = tempfile::tempdir().unwrap();
    load_in_accepted_ca_mode(
        "overlays/example/config.yaml with the production path's files",
        &std::fs::read_to_string(config).unwrap(),
        root.path(),
        &|_| CaFiles {
            client_ca_cert: client_ca_cert.clone(),
            client_ca_key: read("client-ca.key"),
            talos_ca_cert: talos_ca_cert.clone(),
        },
    );
}
