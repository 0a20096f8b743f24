//! The store's choice, moves between stores and forgetting, with an
//! in-memory keyring (the real Secret Service: `client/tests/cli/keyring.rs`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;

/// A keyring in memory, shared so that a test can look inside.
#[derive(Clone, Default)]
struct MemoryVault(Arc<Mutex<BTreeMap<String, String>>>);

impl Vault for MemoryVault {
    fn get(&self, id: &str) -> anyhow::Result<Option<Zeroizing<String>>> {
        Ok(self.0.lock().unwrap().get(id).cloned().map(Zeroizing::new))
    }
    fn set(&self, id: &str, secret: &str) -> anyhow::Result<()> {
        self.0.lock().unwrap().insert(id.into(), secret.into());
        Ok(())
    }
    fn delete(&self, id: &str) -> anyhow::Result<bool> {
        Ok(self.0.lock().unwrap().remove(id).is_some())
    }
    fn delete_all(&self) -> anyhow::Result<usize> {
        let mut items = self.0.lock().unwrap();
        let count = items.len();
        items.clear();
        Ok(count)
    }
    fn describe(&self) -> String {
        "the keyring (memory)".into()
    }
}

fn answering(vault: &MemoryVault) -> impl FnOnce() -> anyhow::Result<Box<dyn Vault>> {
    let vault = vault.clone();
    move || Ok(Box::new(vault) as Box<dyn Vault>)
}

fn silent() -> anyhow::Result<Box<dyn Vault>> {
    Err(anyhow!("no D-Bus session"))
}

fn never() -> anyhow::Result<Box<dyn Vault>> {
    panic!("the keyring must not be asked")
}

fn cache(dir: &tempfile::TempDir, store: TokenStore, vault: Option<&MemoryVault>) -> Cache {
    Cache {
        index: dir.path().join("tokens.json"),
        store,
        keyring: vault.map(|v| Box::new(v.clone()) as Box<dyn Vault>),
    }
}

const KEY: &str = "https://sso.example https://idp.example client";

#[test]
fn the_first_login_takes_the_keyring_when_one_answers() {
    let vault = MemoryVault::default();
    let choice = choose(None, None, answering(&vault), true, Path::new("/c/tokens.json")).unwrap();
    assert_eq!(choice.store, TokenStore::Keyring);
    assert!(choice.notice.is_none());
}

#[test]
fn the_first_login_without_a_keyring_takes_the_file_and_says_so_once() {
    let choice = choose(None, None, silent, true, Path::new("/c/tokens.json")).unwrap();
    assert_eq!(choice.store, TokenStore::File);
    let notice = choice.notice.expect("a notice");
    assert!(
        notice.contains("no keyring answers (no D-Bus session)"),
        "{notice}"
    );
    assert!(notice.contains("/c/tokens.json"), "{notice}");
    // Remembered afterwards: the keyring is not even asked again.
    let again = choose(
        None,
        Some(TokenStore::File),
        never,
        true,
        Path::new("/c/tokens.json"),
    )
    .unwrap();
    assert_eq!(again.store, TokenStore::File);
    assert!(again.notice.is_none());
}

#[test]
fn without_a_file_store_a_silent_keyring_is_an_error() {
    let Err(error) = choose(None, None, silent, false, Path::new("/c/tokens.json")) else {
        panic!("chosen without a keyring")
    };
    assert!(error.to_string().contains("only in its keychain"), "{error}");
    assert!(choose(Some(TokenStore::File), None, never, false, Path::new("/c")).is_err());
}

#[test]
fn a_remembered_keyring_that_stops_answering_is_an_error_not_a_move_to_disk() {
    let Err(error) = choose(None, Some(TokenStore::Keyring), silent, true, Path::new("/c")) else {
        panic!("fell back to the file")
    };
    let error = error.to_string();
    assert!(
        error.contains("your saved logins are in the keyring, which does not answer"),
        "{error}"
    );
    assert!(error.contains("--token-store file"), "{error}");
}

#[test]
fn an_asked_for_keyring_must_answer_and_an_asked_for_file_asks_no_keyring() {
    let Err(error) = choose(
        Some(TokenStore::Keyring),
        Some(TokenStore::File),
        silent,
        true,
        Path::new("/c"),
    ) else {
        panic!("chosen without a keyring")
    };
    assert!(
        error
            .to_string()
            .starts_with("--token-store keyring: no D-Bus session"),
        "{error}"
    );
    let file = choose(
        Some(TokenStore::File),
        Some(TokenStore::Keyring),
        never,
        true,
        Path::new("/c"),
    )
    .unwrap();
    assert_eq!(file.store, TokenStore::File);
}

#[test]
fn a_token_in_the_keyring_is_not_in_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let vault = MemoryVault::default();
    let cache = cache(&dir, TokenStore::Keyring, Some(&vault));
    cache.put(KEY, "refresh-secret-1", "ada").unwrap();
    assert_eq!(
        cache.get(KEY).as_deref().map(String::as_str),
        Some("refresh-secret-1")
    );
    assert_eq!(
        vault.0.lock().unwrap().get(KEY).map(String::as_str),
        Some("refresh-secret-1")
    );
    let index = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!index.contains("refresh-secret-1"), "{index}");
    assert!(index.contains(r#""store": "keyring""#), "{index}");
}

#[test]
fn choosing_the_keyring_moves_file_tokens_into_it_and_off_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    cache(&dir, TokenStore::File, None)
        .put(KEY, "refresh-secret-2", "ada")
        .unwrap();
    let vault = MemoryVault::default();
    let mut keyring = cache(&dir, TokenStore::Keyring, Some(&vault));
    assert_eq!(keyring.move_into_store(never).unwrap(), 1);
    assert_eq!(
        vault.0.lock().unwrap().get(KEY).map(String::as_str),
        Some("refresh-secret-2")
    );
    let index = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!index.contains("refresh-secret-2"), "{index}");
    assert_eq!(
        keyring.get(KEY).as_deref().map(String::as_str),
        Some("refresh-secret-2")
    );
    assert_eq!(keyring.move_into_store(never).unwrap(), 0, "nothing left to move");
}

#[test]
fn choosing_the_file_moves_keyring_tokens_out_of_the_keyring() {
    let dir = tempfile::tempdir().unwrap();
    let vault = MemoryVault::default();
    cache(&dir, TokenStore::Keyring, Some(&vault))
        .put(KEY, "refresh-secret-3", "ada")
        .unwrap();
    let mut file = cache(&dir, TokenStore::File, None);
    assert_eq!(file.move_into_store(answering(&vault)).unwrap(), 1);
    assert!(vault.0.lock().unwrap().is_empty(), "the keyring item is gone");
    assert_eq!(
        file.get(KEY).as_deref().map(String::as_str),
        Some("refresh-secret-3")
    );
}

#[test]
fn tokens_in_a_keyring_that_does_not_answer_stay_there() {
    let dir = tempfile::tempdir().unwrap();
    let vault = MemoryVault::default();
    cache(&dir, TokenStore::Keyring, Some(&vault))
        .put(KEY, "refresh-secret-4", "ada")
        .unwrap();
    let mut file = cache(&dir, TokenStore::File, None);
    assert_eq!(file.move_into_store(silent).unwrap(), 0);
    assert_eq!(file.get(KEY), None, "read as no saved login");
    assert_eq!(vault.0.lock().unwrap().len(), 1);
}

#[test]
fn forgetting_a_server_removes_its_tokens_from_both_stores_and_only_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let vault = MemoryVault::default();
    let other = "https://other.example https://idp.example client";
    cache(&dir, TokenStore::File, None)
        .put(KEY, "in-file", "ada")
        .unwrap();
    let keyring = cache(&dir, TokenStore::Keyring, Some(&vault));
    keyring
        .put("https://sso.example https://idp2.example c2", "in-keyring", "ada")
        .unwrap();
    keyring.put(other, "other-server", "bob").unwrap();
    assert_eq!(keyring.forget(Some("https://sso.example")).unwrap(), 2);
    assert_eq!(keyring.get(KEY), None);
    assert_eq!(vault.0.lock().unwrap().keys().collect::<Vec<_>>(), vec![other]);
    let index = std::fs::read_to_string(dir.path().join("tokens.json")).unwrap();
    assert!(!index.contains("in-file"), "{index}");
}

#[test]
fn forgetting_everything_also_clears_items_nothing_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let vault = MemoryVault::default();
    vault.set("left over by an older client", "stray").unwrap();
    let keyring = cache(&dir, TokenStore::Keyring, Some(&vault));
    keyring.put(KEY, "indexed", "ada").unwrap();
    assert_eq!(keyring.forget(None).unwrap(), 1);
    assert!(vault.0.lock().unwrap().is_empty());
}

#[test]
fn an_index_written_before_the_keyring_reads_as_the_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let old = serde_json::json!({"entries": {KEY: {"refresh_token": "old-token", "username": "ada"}}});
    std::fs::write(dir.path().join("tokens.json"), old.to_string()).unwrap();
    let file = cache(&dir, TokenStore::File, None);
    assert_eq!(file.get(KEY).as_deref().map(String::as_str), Some("old-token"));
}
