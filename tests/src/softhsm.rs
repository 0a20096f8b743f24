//! SoftHSM 2 tokens for the PKCS#11 tests, made with the commands
//! docs/hsm.md gives (`softhsm2-util`, `pkcs11-tool`).
//!
//! PKCS#11 modules are initialized once per process and SoftHSM reads the
//! file `SOFTHSM2_CONF` names when it is, so the whole test binary shares
//! one configuration: `.cargo/config.toml` points the variable at
//! `target/softhsm2/softhsm2.conf`, and the first test to need SoftHSM
//! writes there a configuration naming a fresh, private token directory.
//! Each test makes tokens of its own, under a random label, and holds
//! [`SoftHsm::exclusive`] while it runs: SoftHSM reads the token folders
//! when the module is (re-)initialized, and a folder another test's
//! `softhsm2-util` is still writing reads as a token without a PIN.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use talos_sso_server::config::Pkcs11Source;

use crate::material::write_file;

/// The first line of the configuration the tests write: a file without it
/// is someone's real SoftHSM configuration, never overwritten.
const MARKER: &str = "# talos-sso tests: a throwaway SoftHSM configuration";

/// The user PIN of every test token.
pub const PIN: &str = "2468-talos";

/// Where Debian's `softhsm2` package puts the module; `SOFTHSM2_MODULE`
/// overrides it.
fn module_path() -> PathBuf {
    let path = std::env::var_os("SOFTHSM2_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/softhsm/libsofthsm2.so"));
    assert!(
        path.exists(),
        "the SoftHSM 2 module {} is missing: install the `softhsm2` and `opensc` packages \
         (or set SOFTHSM2_MODULE)",
        path.display()
    );
    path
}

/// The process's SoftHSM configuration and token directory.
#[derive(Debug)]
pub struct SoftHsm {
    /// Kept for the process's life (the module holds its tokens open).
    root: PathBuf,
    config: PathBuf,
    pub module: PathBuf,
    /// Changes to the token directory (a new token, a new key, a token
    /// moved away or back) one at a time: to tell which folder is whose,
    /// and because SoftHSM's tools fail on a folder that moves under them.
    changing: Mutex<()>,
}

/// A token with one key pair, and what the server's `ca.pkcs11` needs.
#[derive(Debug)]
pub struct TestToken {
    pub label: String,
    /// The token's own directory inside SoftHSM's token directory.
    pub directory: PathBuf,
    pub source: Pkcs11Source,
}

/// The key types the tests make inside tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKey {
    Ed25519,
    EcdsaP256,
}

impl TokenKey {
    /// `pkcs11-tool --key-type`.
    fn pkcs11_tool_name(self) -> &'static str {
        match self {
            TokenKey::Ed25519 => "EC:edwards25519",
            TokenKey::EcdsaP256 => "EC:prime256v1",
        }
    }
}

/// The SoftHSM of this process, for one test at a time.
#[derive(Debug)]
pub struct Exclusive {
    _turn: std::sync::MutexGuard<'static, ()>,
    hsm: &'static SoftHsm,
}

impl std::ops::Deref for Exclusive {
    type Target = SoftHsm;
    fn deref(&self) -> &SoftHsm {
        self.hsm
    }
}

impl SoftHsm {
    /// The process's SoftHSM, once the tests before have let it go.
    pub fn exclusive() -> Exclusive {
        static TURN: Mutex<()> = Mutex::new(());
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        Exclusive {
            _turn: turn,
            hsm: Self::shared(),
        }
    }

    /// The one SoftHSM of this test process.
    fn shared() -> &'static SoftHsm {
        static SHARED: OnceLock<SoftHsm> = OnceLock::new();
        SHARED.get_or_init(|| {
            let config =
                PathBuf::from(std::env::var_os("SOFTHSM2_CONF").expect(
                    "SOFTHSM2_CONF is not set: run the tests with cargo (.cargo/config.toml sets it)",
                ));
            if let Ok(existing) = std::fs::read_to_string(&config) {
                assert!(
                    existing.starts_with(MARKER),
                    "SOFTHSM2_CONF names {}, which the tests did not write: unset it to run them",
                    config.display()
                );
            }
            let parent = config.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(parent).expect("SoftHSM configuration directory");
            // Next to the configuration (under target/), one folder per run.
            let root = tempfile::Builder::new()
                .prefix("run-")
                .tempdir_in(parent)
                .expect("temp dir")
                .keep();
            let tokens = root.join("tokens");
            std::fs::create_dir(&tokens).expect("token dir");
            std::fs::write(
                &config,
                format!(
                    "{MARKER}\ndirectories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
                    tokens.display()
                ),
            )
            .expect("softhsm2.conf");
            SoftHsm {
                root,
                config,
                module: module_path(),
                changing: Mutex::new(()),
            }
        })
    }

    fn tokens(&self) -> PathBuf {
        self.root.join("tokens")
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let output = Command::new(program)
            .args(args)
            .env("SOFTHSM2_CONF", &self.config)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e} (install softhsm2 and opensc)"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{program} {args:?}: {text}");
        text
    }

    /// A new token with a key pair `key_label` of `key`, generated inside
    /// the token, and a 0600 PIN file in `dir`.
    pub fn token(&self, dir: &Path, key: TokenKey, key_label: &str) -> TestToken {
        let label = format!("t-{}", hex_suffix());
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let directory = {
            let before = self.token_directories();
            self.run(
                "softhsm2-util",
                &[
                    "--init-token",
                    "--free",
                    "--label",
                    &label,
                    "--so-pin",
                    "13579",
                    "--pin",
                    PIN,
                ],
            );
            let mut new: Vec<PathBuf> = self
                .token_directories()
                .into_iter()
                .filter(|d| !before.contains(d))
                .collect();
            assert_eq!(new.len(), 1, "one new token directory");
            new.remove(0)
        };
        let token = TestToken {
            source: Pkcs11Source {
                module: self.module.clone(),
                token_label: label.clone(),
                key_label: key_label.to_owned(),
                pin_file: write_file(dir, &format!("{label}.pin"), &format!("{PIN}\n"), 0o600),
            },
            label,
            directory,
        };
        self.keypairgen(&token, key, key_label);
        token
    }

    /// Another key pair on `token`.
    pub fn generate(&self, token: &TestToken, key: TokenKey, key_label: &str) {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.keypairgen(token, key, key_label);
    }

    fn keypairgen(&self, token: &TestToken, key: TokenKey, key_label: &str) {
        let module = self.module.display().to_string();
        self.run(
            "pkcs11-tool",
            &[
                "--module",
                &module,
                "--token-label",
                &token.label,
                "--login",
                "--pin",
                PIN,
                "--keypairgen",
                "--key-type",
                key.pkcs11_tool_name(),
                "--label",
                key_label,
            ],
        );
    }

    fn token_directories(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.tokens())
            .expect("token dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect()
    }
}

impl TestToken {
    /// Take the token away (as a pulled HSM or a lost network link would),
    /// returning where it went.
    pub fn remove(&self) -> PathBuf {
        let _one_at_a_time = SoftHsm::shared()
            .changing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Out of the token directory: SoftHSM reads every folder in it.
        let tokens = self.directory.parent().expect("token directory");
        let name = self.directory.file_name().expect("token folder name");
        let away = tokens.with_file_name(name).with_extension("away");
        std::fs::rename(&self.directory, &away).expect("move token away");
        away
    }

    /// Put a removed token back.
    pub fn restore(&self, away: &Path) {
        let _one_at_a_time = SoftHsm::shared()
            .changing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        std::fs::rename(away, &self.directory).expect("put token back");
    }
}

fn hex_suffix() -> String {
    let mut bytes = [0u8; 6];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("random");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The certificate of an intermediate whose key is `source`'s token key,
/// signed by a fresh file-backed root (the offline root), written as
/// `cert_file` wants it. Returns (root, cert_file).
pub fn intermediate_for(
    dir: &Path,
    source: &Pkcs11Source,
) -> (talos_sso_server::ca::CertificateAuthority, PathBuf) {
    let root = crate::material::fresh_ca(talos_sso_server::ca::generate::NewKeyType::Ed25519);
    let spki = talos_sso_server::keys::pkcs11::token_public_key(source).expect("the token's public key");
    let (_, chain_pem) = talos_sso_server::ca::generate::intermediate_certificate(
        &root,
        &spki,
        "talos-sso HSM intermediate",
        std::time::Duration::from_secs(30 * 86400),
        time::OffsetDateTime::now_utc(),
    )
    .expect("intermediate certificate");
    let name = format!("{}-{}.crt", source.token_label, source.key_label);
    (root, write_file(dir, &name, &chain_pem, 0o644))
}

/// The test configuration's `ca:` line for a CA whose key is in a token.
pub fn ca_line(cert_file: &Path, source: &Pkcs11Source) -> String {
    format!(
        "    ca: {{ cert_file: \"{}\", pkcs11: {{ module: \"{}\", token_label: \"{}\", key_label: \"{}\", pin_file: \"{}\" }} }}",
        cert_file.display(),
        source.module.display(),
        source.token_label,
        source.key_label,
        source.pin_file.display()
    )
}

/// The test configuration (`harness::config_yaml`) with its `ca:` line
/// replaced by `line`.
pub fn with_ca_line(yaml: &str, line: &str) -> String {
    yaml.lines()
        .map(|l| {
            if l.trim_start().starts_with("ca: {") {
                line.to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}
