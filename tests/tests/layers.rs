//! The module graph of the workspace's crates, checked: imports point one
//! way. Every path counts, not only `use` lines (`graph`), and two rules
//! hold (`rules`): no circle among the child modules of any module, and the
//! server's top-level modules use only their own layer and those below.
//!
//! The layers are the server's shape (docs/architecture.md): utilities at
//! the bottom, then plain configuration data, then the domain, then the
//! composition root `app`, then what faces the outside. A new top-level
//! module fails here until it is given a layer: where it belongs is a
//! decision, not a default.

mod graph;
mod rules;
mod selftest;

use std::path::Path;

/// The server's layers, bottom first.
pub const SERVER_LAYERS: rules::Layers = &[
    (
        "utilities",
        &["random", "secret_file", "text_file", "guid", "slots", "telemetry"],
    ),
    ("configuration", &["config"]),
    (
        "domain",
        &[
            "keys",
            "x509",
            "ca",
            "certificate",
            "audit",
            "policy",
            "identity",
            "ratelimit",
            "refusals",
            "metrics",
            "talos_api",
            "cluster",
            "issuance",
        ],
    ),
    ("composition root", &["app"]),
    ("top", &["http", "gateway", "server", "cli", "break_glass"]),
];

/// The crates whose sources are checked (directories of the repository);
/// one that does not exist (yet) is skipped.
const CRATES: &[&str] = &["server", "api", "client", "text"];

/// The violations in the crates under `repo`, each a message of its own.
/// `layers` applies to the server library's top-level modules.
fn check(repo: &Path, layers: rules::Layers) -> Result<Vec<String>, String> {
    let mut violations = Vec::new();
    for name in CRATES {
        let src = repo.join(name).join("src");
        if !src.is_dir() {
            continue;
        }
        let mut roots = vec![(name.to_string(), src.join("lib.rs"))];
        roots.push((format!("{name} (bin main)"), src.join("main.rs")));
        if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
            for entry in entries.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "rs") {
                    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                    roots.push((format!("{name} (bin {stem})"), path));
                }
            }
        }
        for (crate_name, root) in roots.into_iter().filter(|(_, root)| root.is_file()) {
            let krate = graph::read_crate(&crate_name, &root, repo)?;
            violations.extend(rules::circles(&krate));
            if crate_name == "server" {
                violations.extend(rules::layers(&krate, layers));
            }
        }
    }
    Ok(violations)
}

#[test]
fn imports_point_one_way() {
    let tests = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = tests.parent().expect("the tests crate sits in the repository");
    let violations = check(repo, SERVER_LAYERS).unwrap_or_else(|error| panic!("{error}"));
    for violation in &violations {
        eprintln!("{violation}\n");
    }
    assert!(
        violations.is_empty(),
        "{} module graph violation(s), each printed above. The rules (tests/tests/layers.rs): \
         sibling modules never depend on each other in a circle, and the server's top-level \
         modules use only their own layer and those below it.",
        violations.len()
    );
}
