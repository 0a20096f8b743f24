//! The committed manual pages (`docs/man`) are what the CLI's clap
//! definitions make today: none missing, none left over, none stale.

use std::collections::BTreeMap;
use std::path::Path;

use talos_sso_tests::man_pages;

fn pages(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&path).unwrap())
        })
        .collect()
}

#[test]
fn the_committed_manual_pages_match_the_commands() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let fresh = tempfile::tempdir().unwrap();
    man_pages::generate(fresh.path()).unwrap();
    let made = pages(fresh.path());
    assert!(
        made.contains_key("talos-sso.1") && made.contains_key("talos-sso-login.1"),
        "{:?}",
        made.keys()
    );
    let committed = pages(&repo.join(man_pages::DIR));
    let fix = "regenerate them: cargo run -p talos-sso-tests --bin man-pages";
    let missing: Vec<_> = made.keys().filter(|k| !committed.contains_key(*k)).collect();
    let extra: Vec<_> = committed.keys().filter(|k| !made.contains_key(*k)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "pages missing {missing:?}, left over {extra:?} (delete those); {fix}"
    );
    for (name, text) in &made {
        assert!(committed[name] == *text, "docs/man/{name} is stale; {fix}");
    }
}
