//! `server_config`: the configuration loader (`Config::from_text_with_env`
//! for YAML and TOML through the `config` crate, `Config::from_yaml` for
//! `check`), then what start-up derives from a configuration that loaded.
//!
//! Input: one byte choosing the loader (`y` YAML, `t` TOML, `c` the
//! `check` parser; others by their value), the file text, then optionally a
//! NUL and environment overrides, one `NAME=value` a line (`TALOS_SSO__` is
//! prefixed to names without it).
//!
//! Properties: nothing panics; a configuration that loads validates again;
//! its clusters' TTLs are within bounds; its issuers' rules, its clusters'
//! policies and policy examples and its rate limits can be built or are
//! refused with an error; a certificate can be signed, or refused, at the
//! longest TTL and the clock skew a cluster allows.

use talos_sso_server::certificate::{LeafRequest, sign_leaf};
use talos_sso_server::config::{Config, ENV_PREFIX};
use talos_sso_server::identity::issuer::IssuerRules;
use talos_sso_server::policy::ClusterPolicy;
use talos_sso_server::ratelimit::RateLimits;

fn environment(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| {
            let name = if name.starts_with(ENV_PREFIX) {
                name.to_owned()
            } else {
                format!("{ENV_PREFIX}__{name}")
            };
            (name, value.to_owned())
        })
        .collect()
}

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let parts = crate::input::parts(rest, 2);
    let text = crate::input::text(parts[0]);
    let env = environment(&crate::input::text(parts[1]));
    let loaded = match mode {
        b'c' => Config::from_yaml(&text),
        b't' => Config::from_text_with_env(&text, config::FileFormat::Toml, env),
        b'y' => Config::from_text_with_env(&text, config::FileFormat::Yaml, env),
        other if other % 2 == 0 => Config::from_text_with_env(&text, config::FileFormat::Toml, env),
        _ => Config::from_text_with_env(&text, config::FileFormat::Yaml, env),
    };
    let Ok(config) = loaded else { return };
    config
        .validate()
        .unwrap_or_else(|e| panic!("a loaded configuration does not validate: {e}"));
    // The domains' checks start-up runs besides (`app::check`): what
    // follows is derived from a configuration that passed them, as before
    // they left the loader.
    if talos_sso_server::app::check(&config).is_err() {
        return;
    }
    let _ = config.warnings();
    for issuer in config.identity.issuers() {
        // Graph settings name a secret file to read; the rest is pure.
        if issuer.entra_graph.is_none() {
            let _ = IssuerRules::new(&issuer);
        }
    }
    let _ = RateLimits::new(&config.rate_limits);
    // The `csr` target's CA, signing for its own key.
    let ca = crate::csr::ca();
    let spki = ca.signer().spki();
    for (name, cluster) in &config.clusters {
        assert!(
            !cluster.ttl.is_zero() && cluster.ttl <= cluster.max_ttl,
            "cluster {name}: TTL out of bounds"
        );
        cluster
            .ca
            .source()
            .unwrap_or_else(|e| panic!("cluster {name}: loaded without a CA source: {e}"));
        if let Ok(policy) = ClusterPolicy::new(cluster.policy(&config.identity)) {
            let _ = (policy.grantable_roles(), policy.referenced_groups().count());
            for example in config.policy_examples.iter().filter(|e| &e.cluster == name) {
                let _ = policy.check_example(example);
            }
        }
        let roles = ["os:reader".to_owned()];
        let request = LeafRequest {
            username: "alice@example.com",
            roles: &roles,
            ttl: cluster.max_ttl,
            clock_skew: cluster.clock_skew,
        };
        let _ = sign_leaf(ca, spki, &request, crate::now());
    }
}
