//! Writes the realistic seeds of every corpus that cannot be copied from a
//! fixture: CSRs made by the client's own key code, tokens shaped like the
//! identity providers', query strings, `X-Forwarded-For` chains, talosconfig
//! merges, configurations, CA sources and audit records (the Talos and
//! OpenSSL fixtures are read from `tests/fixtures/`). The OpenSSL CSRs of
//! `tests/fixtures/openssl/` are in `corpus/csr/` as they are.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds -- fuzz/corpus`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

fn put(root: &Path, target: &str, name: &str, data: impl AsRef<[u8]>) {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), data).unwrap();
}

fn fixture(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap()
}

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into()));
    let marker = String::from_utf8(talos_sso_fuzz::CSR_REQUEST_MARKER.to_vec()).unwrap();

    // csr: the client's CSR, PEM and DER, with and without a leaf request.
    let key = talos_sso::key::ClientKey::generate().unwrap();
    let pem = key.csr_pem().unwrap();
    let der = key.csr_der().unwrap();
    put(&root, "csr", "client-ed25519.pem", &pem);
    put(&root, "csr", "client-ed25519.der", &der);
    put(
        &root,
        "csr",
        "client-with-request.pem",
        format!("{pem}{marker}alice@example.com\nos:admin,os:reader,os:admin\n900\n300"),
    );
    let mut with_request = der.clone();
    with_request.extend_from_slice(format!("{marker}svc-backup\nos:etcd:backup\n1\n0").as_bytes());
    put(&root, "csr", "client-with-request.der", with_request);

    // token: JWTs shaped like Entra's and a generic provider's (unsigned
    // here; the target signs a payload itself), and the payloads alone.
    let now = 1_796_126_400i64;
    let entra = serde_json::json!({
        "aud": "11111111-2222-3333-4444-555555555555",
        "iss": "https://login.microsoftonline.com/72f988bf-86f1-41af-91ab-2d7cd011db47/v2.0",
        "iat": now - 60, "nbf": now - 60, "exp": now + 3600,
        "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47",
        "oid": "00000000-0000-0000-0000-0000000000a1",
        "sub": "pairwise-subject",
        "preferred_username": "alice@contoso.com",
        "groups": ["3f6c2b1a-0e9d-4c8b-a7f6-5e4d3c2b1a01"],
        "roles": ["Talos.Reader"],
        "uti": "AAECAwQFBgcICQ", "azp": "11111111-2222-3333-4444-555555555555", "ver": "2.0"
    });
    let oidc = serde_json::json!({
        "aud": ["api://talos-sso", "other"], "iss": "https://idp.example.com",
        "iat": now, "exp": now + 300, "sub": "user-42", "email": "bob@example.com",
        "email_verified": true, "jti": "token-1"
    });
    let overage = serde_json::json!({
        "aud": "11111111-2222-3333-4444-555555555555",
        "iss": "https://sts.windows.net/72f988bf-86f1-41af-91ab-2d7cd011db47/",
        "exp": now + 600, "tid": "72f988bf-86f1-41af-91ab-2d7cd011db47", "oid": "o",
        "_claim_names": {"groups": "src1"}, "upn": "carol@contoso.com", "appid": "x"
    });
    for (name, claims) in [("entra", &entra), ("oidc", &oidc), ("overage", &overage)] {
        let payload = claims.to_string();
        put(&root, "token", &format!("{name}-payload.json"), &payload);
        for (alg, kid) in [("RS256", "rsa"), ("EdDSA", "fuzz-ed"), ("none", "x")] {
            let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}","kid":"{kid}","typ":"JWT"}}"#));
            let token = format!(
                "{header}.{}.{}",
                URL_SAFE_NO_PAD.encode(&payload),
                URL_SAFE_NO_PAD.encode([7u8; 64])
            );
            put(&root, "token", &format!("{name}-{alg}.jwt"), token);
        }
    }

    // jwks: the shapes providers publish.
    let n = URL_SAFE_NO_PAD.encode([0xC5u8; 256]);
    let x = URL_SAFE_NO_PAD.encode([7u8; 32]);
    put(
        &root,
        "jwks",
        "mixed.json",
        format!(
            r#"{{"keys":[{{"kty":"RSA","use":"sig","kid":"rsa1","x5t":"a","n":"{n}","e":"AQAB","x5c":["MIIC"],"issuer":"https://login.microsoftonline.com/{{tenantid}}/v2.0"}},
{{"kty":"EC","crv":"P-256","kid":"ec1","alg":"ES256","x":"{x}","y":"{x}"}},
{{"kty":"OKP","crv":"Ed25519","kid":"ed1","x":"{x}"}},
{{"kty":"RSA","kid":"enc","use":"enc","n":"{n}","e":"AQAB"}},
{{"kty":"oct","kid":"hmac","k":"c2VjcmV0"}}]}}"#
        ),
    );
    put(
        &root,
        "jwks",
        "rsa-only.json",
        format!(r#"{{"keys":[{{"kty":"RSA","kid":"k","alg":"RS256","n":"{n}","e":"AQAB"}}]}}"#),
    );

    // talosconfig: real files, then a NUL and the new context's bytes.
    let new_context = b"\0lab\x01\x02\x0810.5.0.2\x00ca-pem\x00crt\x00key";
    for (name, text) in [
        ("talos-2021-admin.yaml", fixture("tests/fixtures/talos/talosconfig-2021-admin.yaml")),
        (
            "unknown-fields.yaml",
            "context: other\ncontexts:\n  other:\n    endpoints: [1.2.3.4]\n    auth: {siderov1: {identity: a@b}}\n    cluster: omni\n  lab:\n    endpoints: [old]\n    proxy-url: http://proxy:3128\nfuture-top-level: {x: 1}\n".into(),
        ),
        ("empty.yaml", String::new()),
    ] {
        let mut data = text.into_bytes();
        data.extend_from_slice(new_context);
        put(&root, "talosconfig", name, data);
    }

    // server_config: the shipped configurations, as YAML, TOML and `check`.
    // Each name says the loader its first byte picks; `.seed`, not the
    // loader's letter, so that no tool takes `x.c` or `x.y` for source code.
    for (name, path) in [
        ("compose", "deploy/compose/config.yaml"),
        ("systemd", "deploy/systemd/config.yaml"),
        ("kubernetes", "deploy/kubernetes/base/config.yaml"),
    ] {
        let text = fixture(path);
        put(
            &root,
            "server_config",
            &format!("{name}-yaml.seed"),
            format!("y{text}"),
        );
        put(
            &root,
            "server_config",
            &format!("{name}-check.seed"),
            format!("c{text}"),
        );
        put(
            &root,
            "server_config",
            &format!("{name}-yaml-env.seed"),
            format!(
                "y{text}\0TALOS_SSO__IDENTITY__CLIENT_ID=abc\nIDENTITY__AUDIENCES=a,b\nCLUSTERS__X__TTL=10m\n"
            ),
        );
    }
    put(
        &root,
        "server_config",
        "minimal-toml.seed",
        "tinsecure_http = true\n[identity]\nkind = \"oidc\"\nissuer = \"https://idp.example.com\"\nclient_id = \"cli\"\n\
         [[identity.trusted_issuers]]\nname = \"ci\"\nkind = \"oidc\"\nissuer = \"https://token.actions.example\"\naudiences = [\"talos\"]\n\
         [clusters.lab]\nendpoints = [\"10.5.0.2\"]\nttl = \"5m\"\nmax_ttl = \"1h\"\nclock_skew = \"1m\"\n[clusters.lab.ca]\nsecrets_bundle = \"/etc/talos/secrets.yaml\"\n\
         [[clusters.lab.rules]]\nusers = [\"alice\"]\nroles = [\"os:admin\"]\n[rate_limits]\nper_identity_per_minute = 0\n",
    );

    // ca_material: every Talos source, and PEM files.
    let bundle = fixture("tests/fixtures/talos/secrets-bundle.yaml");
    put(&root, "ca_material", "secrets-bundle", format!("b{bundle}"));
    put(
        &root,
        "ca_material",
        "stability-secrets",
        format!("b{}", fixture("tests/fixtures/talos/stability-secrets.yaml")),
    );
    put(
        &root,
        "ca_material",
        "controlplane",
        format!("m{}", fixture("tests/fixtures/talos/controlplane-v1.12.yaml")),
    );
    put(
        &root,
        "ca_material",
        "worker",
        format!("m{}", fixture("tests/fixtures/talos/worker-v1.12.yaml")),
    );
    for name in ["p384-ca", "rsa-ca", "rsa1024-ca"] {
        let crt = fixture(&format!("tests/fixtures/openssl/{name}.crt"));
        let key = fixture(&format!("tests/fixtures/openssl/{name}.key"));
        put(
            &root,
            "ca_material",
            &format!("{name}-files"),
            format!("f{crt}\0{key}\0"),
        );
    }
    // The bundle's own CA as PEM files, with an accepted CA.
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&bundle).unwrap();
    let decode = |field: &str| {
        String::from_utf8(
            STANDARD
                .decode(value["certs"]["os"][field].as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let (crt, key) = (decode("crt"), decode("key"));
    put(
        &root,
        "ca_material",
        "talos-files",
        format!("f{crt}\0{key}\0{crt}"),
    );

    // audit_query: what the CLI sends.
    for (name, query) in [
        ("since-duration", "since=7d&event=certificate.issued&limit=50"),
        (
            "rfc3339",
            "since=2026-11-01T00:00:00Z&until=2026-12-01T12:00:00%2B01:00&outcome=denied",
        ),
        (
            "everything",
            "username=alice%40example.com&subject=o&cluster=prod&role=os:admin&serial=0a1b&cursor=100&limit=1000",
        ),
        ("bad", "limit=0&cursor=-1&outcome=maybe"),
    ] {
        put(&root, "audit_query", name, query);
    }

    // forwarded_for: peer, trusted proxies, header lines.
    for (name, input) in [
        ("one-proxy", "10.0.0.5\n10.0.0.0/8\n203.0.113.7"),
        (
            "chain",
            "10.0.0.5\n10.0.0.0/8, 192.168.0.0/16\n198.51.100.1, 192.168.1.1\n203.0.113.7:51234, 10.1.1.1",
        ),
        (
            "ipv6",
            "[2001:db8::1]:443\n2001:db8::/32\n[2001:db8::2]:1234, ::ffff:10.0.0.1, 2001:db8::3",
        ),
        ("untrusted", "198.51.100.9\n10.0.0.0/8\n1.2.3.4"),
    ] {
        put(&root, "forwarded_for", name, input);
    }

    // audit_encoding: bytes that `arbitrary` reads as records.
    for n in 0u8..4 {
        let bytes: Vec<u8> = (0..400u32)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(n * 17))
            .collect();
        put(&root, "audit_encoding", &format!("pattern-{n}"), bytes);
    }
}
