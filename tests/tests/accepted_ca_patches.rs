//! `talos-sso-server ca patch add|remove`, the binary itself, against copies
//! of Talos's own machine configs: what it prints and writes is YAML, and
//! applied as Talos applies patches (the strategic merge model of
//! `talos_sso_tests::strategic_merge`) it leaves the list it says.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_yaml_ng::Value;
use talos_sso_server::ca::generate::{self, NewKeyType};
use talos_sso_tests::material::{read_fixture, write_file};
use talos_sso_tests::strategic_merge::{apply, documents};
use time::OffsetDateTime;

const CONTROL_PLANE: &str = "talos/controlplane-v1.12.yaml";
const WORKER: &str = "talos/worker-v1.12.yaml";

/// What one run of the binary gave.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn ca_patch(args: &[&str]) -> Run {
    let binary = talos_sso_tests::faults::server_binary().expect("the server binary");
    let output = Command::new(binary)
        .args(["ca", "patch"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run talos-sso-server");
    Run {
        ok: output.status.success(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn text(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A client-only CA of talos-sso's own (the certificate, PEM), in `dir`.
fn client_ca(dir: &Path, name: &str) -> (PathBuf, String) {
    let ca = generate::new_client_ca(
        NewKeyType::Ed25519,
        "prod",
        Duration::from_secs(30 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap();
    (write_file(dir, name, &ca.cert_pem, 0o644), ca.cert_pem)
}

/// A Talos-style CA (what `talosctl gen secrets` makes), PEM.
fn talos_style_ca() -> String {
    generate::new_root(
        NewKeyType::Ed25519,
        "talos",
        Duration::from_secs(3650 * 86400),
        OffsetDateTime::now_utc(),
    )
    .unwrap()
    .cert_pem
}

/// A fixture with `machine.acceptedCAs` holding `entries` (PEM), as Talos
/// writes it (4-space indents, base64 of the PEM).
fn config_with(fixture: &str, entries: &[&str]) -> String {
    let config = read_fixture(fixture);
    if entries.is_empty() {
        return config;
    }
    let list: String = entries
        .iter()
        .map(|pem| format!("        - crt: {}\n", STANDARD.encode(pem)))
        .collect();
    config.replacen("machine:\n", &format!("machine:\n    acceptedCAs:\n{list}"), 1)
}

/// The `machine.acceptedCAs` of a config's v1alpha1 document, as PEM.
fn accepted(config: &str) -> Vec<String> {
    let documents = documents(config).unwrap();
    let machine = documents.iter().find_map(|d| d.get("machine")).unwrap();
    match machine.get("acceptedCAs") {
        None | Some(Value::Null) => Vec::new(),
        Some(list) => list
            .as_sequence()
            .unwrap()
            .iter()
            .map(|entry| {
                let pem = STANDARD.decode(entry["crt"].as_str().unwrap()).unwrap();
                String::from_utf8(pem).unwrap()
            })
            .collect(),
    }
}

/// The patches printed by a run, by the heading before each: `append`,
/// `delete`, `list`; each must be a YAML mapping.
fn printed(stdout: &str) -> Vec<(&'static str, String)> {
    let mut patches: Vec<(&'static str, String)> = Vec::new();
    let mut current: Option<usize> = None;
    for line in stdout.lines() {
        if let Some(heading) = line.strip_prefix("== ") {
            let form = if heading.starts_with("append form") {
                "append"
            } else if heading.contains("patch 1 of 2") {
                "delete"
            } else if heading.contains("patch 2 of 2") {
                "list"
            } else {
                panic!("unknown heading {line:?}")
            };
            patches.push((form, String::new()));
            current = Some(patches.len() - 1);
        } else if line.is_empty() {
            current = None;
        } else if let Some(at) = current {
            patches[at].1.push_str(line);
            patches[at].1.push('\n');
        }
    }
    for (form, patch) in &patches {
        let value: Value = serde_yaml_ng::from_str(patch).unwrap_or_else(|e| panic!("{form}: {e}\n{patch}"));
        assert!(value.is_mapping(), "{form}: {patch}");
    }
    patches
}

fn form<'a>(patches: &'a [(&'static str, String)], name: &str) -> &'a str {
    &patches.iter().find(|(form, _)| *form == name).unwrap().1
}

#[test]
fn the_replace_form_adds_once_and_keeps_what_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, ours) = client_ca(dir.path(), "ours.crt");
    let other = talos_style_ca();
    for fixture in [CONTROL_PLANE, WORKER] {
        let config = config_with(fixture, &[&other]);
        let current = write_file(dir.path(), "current.yaml", &config, 0o600);
        let run = ca_patch(&["add", "--ca-cert", text(&ours_file), "--current", text(&current)]);
        assert!(run.ok, "{fixture}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stdout
                .contains("machine.acceptedCAs: 1 entry now, 2 entries after (adds the CA)"),
            "{}",
            run.stdout
        );
        let patches = printed(&run.stdout);
        let forms: Vec<&str> = patches.iter().map(|(form, _)| *form).collect();
        assert_eq!(forms, ["append", "delete", "list"], "{}", run.stdout);
        let replace = [form(&patches, "delete"), form(&patches, "list")];

        // The replace pair in one call, twice: our CA once, the other kept.
        let once = apply(&config, &replace).unwrap();
        assert_eq!(accepted(&once), [other.clone(), ours.clone()], "{fixture}");
        let twice = apply(&once, &replace).unwrap();
        assert_eq!(accepted(&twice), accepted(&once), "{fixture}");
        // The documents besides v1alpha1 stay as they were.
        assert_eq!(documents(&twice).unwrap()[1..], documents(&config).unwrap()[1..]);

        // The append form, twice: our CA twice (why the replace form exists).
        let append = form(&patches, "append");
        let appended = apply(&apply(&config, &[append]).unwrap(), &[append]).unwrap();
        assert_eq!(accepted(&appended), [other.clone(), ours.clone(), ours.clone()]);

        // Asked again against the result: nothing to add, the same list.
        let patched = write_file(dir.path(), "patched.yaml", &once, 0o600);
        let again = ca_patch(&["add", "--ca-cert", text(&ours_file), "--current", text(&patched)]);
        assert!(
            again.ok && again.stdout.contains("the CA is already accepted"),
            "{}",
            again.stdout
        );
        let again = printed(&again.stdout);
        assert_eq!(form(&again, "list"), form(&patches, "list"));

        // Removed: gone, the other kept, and the same when applied twice.
        let run = ca_patch(&[
            "remove",
            "--ca-cert",
            text(&ours_file),
            "--current",
            text(&patched),
        ]);
        assert!(run.ok, "{}{}", run.stdout, run.stderr);
        assert!(
            run.stdout
                .contains("2 entries now, 1 entry after (removes the CA)"),
            "{}",
            run.stdout
        );
        let patches = printed(&run.stdout);
        let forms: Vec<&str> = patches.iter().map(|(form, _)| *form).collect();
        assert_eq!(forms, ["delete", "list"], "no append form for a removal");
        let replace = [form(&patches, "delete"), form(&patches, "list")];
        let removed = apply(&once, &replace).unwrap();
        assert_eq!(accepted(&removed), [other.as_str()], "{fixture}");
        assert_eq!(accepted(&apply(&removed, &replace).unwrap()), [other.as_str()]);
    }
}

#[test]
fn a_config_without_accepted_cas_gets_ours_and_loses_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, ours) = client_ca(dir.path(), "ours.crt");
    let config = read_fixture(CONTROL_PLANE);
    let current = write_file(dir.path(), "current.yaml", &config, 0o600);
    let run = ca_patch(&["add", "--ca-cert", text(&ours_file), "--current", text(&current)]);
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    let patches = printed(&run.stdout);
    // Deleting a list that is not there is no error to Talos.
    let added = apply(&config, &[form(&patches, "delete"), form(&patches, "list")]).unwrap();
    assert_eq!(accepted(&added), [ours.as_str()]);
    let patched = write_file(dir.path(), "patched.yaml", &added, 0o600);
    let run = ca_patch(&[
        "remove",
        "--ca-cert",
        text(&ours_file),
        "--current",
        text(&patched),
    ]);
    let patches = printed(&run.stdout);
    let removed = apply(&added, &[form(&patches, "delete"), form(&patches, "list")]).unwrap();
    assert!(accepted(&removed).is_empty());
}

#[test]
fn without_current_only_the_append_form_and_no_removal() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, ours) = client_ca(dir.path(), "ours.crt");
    let run = ca_patch(&["add", "--ca-cert", text(&ours_file)]);
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    let patches = printed(&run.stdout);
    let forms: Vec<&str> = patches.iter().map(|(form, _)| *form).collect();
    assert_eq!(forms, ["append"], "{}", run.stdout);
    let config = read_fixture(WORKER);
    assert_eq!(
        accepted(&apply(&config, &[form(&patches, "append")]).unwrap()),
        [ours]
    );

    let run = ca_patch(&["remove", "--ca-cert", text(&ours_file)]);
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stderr.contains("`ca patch remove` needs --current"),
        "{}",
        run.stderr
    );
    assert!(printed(&run.stdout).is_empty(), "{}", run.stdout);
}

#[test]
fn out_dir_writes_what_is_printed_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, _) = client_ca(dir.path(), "ours.crt");
    let config = config_with(CONTROL_PLANE, &[&talos_style_ca()]);
    let current = write_file(dir.path(), "current.yaml", &config, 0o600);
    let args = ["add", "--ca-cert", text(&ours_file), "--current", text(&current)];
    let printed_run = ca_patch(&args);
    let patches = printed(&printed_run.stdout);
    let out = dir.path().join("patches");
    let run = ca_patch(&[&args[..], &["--out-dir", text(&out)]].concat());
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    let files = [
        ("append", "accepted-ca-append.yaml"),
        ("delete", "accepted-ca-replace-1-delete.yaml"),
        ("list", "accepted-ca-replace-2-list.yaml"),
    ];
    for (name, file) in files {
        let written = std::fs::read_to_string(out.join(file)).unwrap();
        assert_eq!(written, form(&patches, name), "{file}");
        serde_yaml_ng::from_str::<Value>(&written).unwrap();
    }
    let delete = format!("@{}", out.join(files[1].1).display());
    let list = format!("@{}", out.join(files[2].1).display());
    assert!(
        run.stdout.contains(&format!(
            "talosctl -n <node> patch machineconfig --mode=no-reboot --patch {delete} --patch {list}"
        )),
        "{}",
        run.stdout
    );

    // Again into the same folder: refused, the files as they were.
    std::fs::write(out.join(files[2].1), "kept: true\n").unwrap();
    let again = ca_patch(&[&args[..], &["--out-dir", text(&out)]].concat());
    assert!(!again.ok, "{}", again.stdout);
    assert!(
        again.stderr.contains("already exists; refusing to overwrite it"),
        "{}",
        again.stderr
    );
    assert_eq!(
        std::fs::read_to_string(out.join(files[2].1)).unwrap(),
        "kept: true\n"
    );
}

/// `machine.ca.key` replaced by what `talosctl get machineconfig` shows.
fn redacted(config: &str) -> String {
    let key_line = config
        .lines()
        .find(|line| line.trim_start().starts_with("key: LS0t"))
        .unwrap();
    let indent = &key_line[..key_line.len() - key_line.trim_start().len()];
    config.replacen(key_line, &format!("{indent}key: '******'"), 1)
}

#[test]
fn the_resource_talosctl_prints_and_a_redacted_config_serve_as_current() {
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, ours) = client_ca(dir.path(), "ours.crt");
    let other = talos_style_ca();
    let config = config_with(CONTROL_PLANE, &[&other]);
    let plain = write_file(dir.path(), "plain.yaml", &config, 0o600);
    let reference =
        printed(&ca_patch(&["add", "--ca-cert", text(&ours_file), "--current", text(&plain)]).stdout);

    let secret_free = redacted(&config);
    assert!(secret_free.contains("key: '******'"), "{secret_free}");
    // `talosctl get machineconfig -o yaml`: a resource, the config as text in `spec`.
    let spec: String = secret_free.lines().map(|line| format!("    {line}\n")).collect();
    let resource = format!(
        "node: 10.5.0.2\nmetadata:\n    namespace: config\n    type: MachineConfigs.config.talos.dev\n    \
         id: v1alpha1\n    version: 3\n    owner:\n    phase: running\n    created: 2026-12-01T10:00:00Z\n    \
         updated: 2026-12-01T10:00:00Z\nspec: |\n{spec}"
    );
    for (name, current) in [("redacted.yaml", secret_free), ("resource.yaml", resource)] {
        let path = write_file(dir.path(), name, &current, 0o600);
        let run = ca_patch(&["add", "--ca-cert", text(&ours_file), "--current", text(&path)]);
        assert!(run.ok, "{name}: {}{}", run.stdout, run.stderr);
        assert!(
            run.stdout.contains("1 entry now, 2 entries after"),
            "{name}: {}",
            run.stdout
        );
        let patches = printed(&run.stdout);
        assert_eq!(form(&patches, "list"), form(&reference, "list"), "{name}");
        let applied = apply(&config, &[form(&patches, "delete"), form(&patches, "list")]).unwrap();
        assert_eq!(accepted(&applied), [other.clone(), ours.clone()], "{name}");
    }
}

#[test]
fn removing_from_an_entry_bundling_several_cas_keeps_the_others() {
    // Talos trusts every certificate of an entry's `crt`.
    let dir = tempfile::tempdir().unwrap();
    let (ours_file, ours) = client_ca(dir.path(), "ours.crt");
    let other = talos_style_ca();
    let config = config_with(WORKER, &[&format!("{ours}{other}")]);
    let current = write_file(dir.path(), "current.yaml", &config, 0o600);
    let run = ca_patch(&[
        "remove",
        "--ca-cert",
        text(&ours_file),
        "--current",
        text(&current),
    ]);
    assert!(run.ok, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("1 entry now, 1 entry after (removes the CA)"),
        "{}",
        run.stdout
    );
    let patches = printed(&run.stdout);
    let replace = [form(&patches, "delete"), form(&patches, "list")];
    let removed = apply(&config, &replace).unwrap();
    assert_eq!(accepted(&removed), [other.as_str()]);
    assert_eq!(accepted(&apply(&removed, &replace).unwrap()), [other.as_str()]);
}
