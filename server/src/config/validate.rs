//! Checks of the configuration that need no knowledge beyond the file:
//! keys that go together, values in range, names usable as keys. What
//! needs a domain's knowledge (issuer kinds, app roles, rules) is that
//! domain's check, run by `app::check`.

use std::time::Duration;

use super::{Config, ConfigError, ConsoleConfig, FeedConfig, HttpConfig, LOGIN_ISSUER, invalid};

impl Config {
    /// Checks that need more than one key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.tls.is_none() && !self.insecure_http {
            return Err(invalid(
                "set `tls` (cert_file, key_file), or `insecure_http: true` behind a TLS proxy",
            ));
        }
        if self.clusters.is_empty() {
            return Err(invalid("no clusters configured"));
        }
        self.http.check()?;
        if let Some(checkpoints) = &self.audit.checkpoints {
            if checkpoints.key_file.is_some() == checkpoints.pkcs11.is_some() {
                return Err(invalid(
                    "audit.checkpoints needs exactly one of key_file and pkcs11 (the audit signing key)",
                ));
            }
            if checkpoints.interval < Duration::from_secs(1) {
                return Err(invalid("audit.checkpoints.interval must be at least 1s"));
            }
            if let Some(url) = &checkpoints.webhook_url {
                let url = url::Url::parse(url)
                    .map_err(|e| invalid(format!("audit.checkpoints.webhook_url: {e}")))?;
                if !secure_or_loopback(&url) {
                    return Err(invalid(
                        "audit.checkpoints.webhook_url must be https:// (http:// only to this machine)",
                    ));
                }
            }
        }
        self.audit.feed.check().map_err(invalid)?;
        self.console.check()?;
        if self.audit.refusals.window.is_zero() {
            return Err(invalid("audit.refusals.window must be above zero"));
        }
        if self
            .metrics
            .listen
            .is_some_and(|m| m == self.listen && m.port() != 0)
        {
            return Err(invalid(
                "metrics.listen is the same address as listen: give the metrics a port of their own",
            ));
        }
        for (name, cluster) in &self.clusters {
            if !valid_name(name) {
                return Err(invalid(format!(
                    "cluster name `{name}`: use letters, digits, `-`, `_`, `.`"
                )));
            }
            cluster.ca.source()?;
            if let Some(talos_ca) = &cluster.talos_ca {
                talos_ca.source()?;
            }
            if let Some(next) = &cluster.next_ca {
                next.source()?;
            }
            if cluster.endpoints.is_empty() {
                return Err(invalid(format!("cluster `{name}` has no endpoints")));
            }
            if cluster.ttl.is_zero() || cluster.ttl > cluster.max_ttl {
                return Err(invalid(format!(
                    "cluster `{name}`: ttl must be above zero and at most max_ttl"
                )));
            }
        }
        for example in &self.policy_examples {
            if !self.clusters.contains_key(&example.cluster) {
                return Err(invalid(format!(
                    "policy example names unknown cluster `{}`",
                    example.cluster
                )));
            }
        }
        self.validate_issuer_names()?;
        self.validate_workloads()?;
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return Err(invalid("log.format is `text` or `json`"));
        }
        Ok(())
    }

    /// Issuer names are unique and usable as keys, and what rules name;
    /// the rest is each issuer's kind's business
    /// (`identity::issuer::validate`, run by `app::check`).
    fn validate_issuer_names(&self) -> Result<(), ConfigError> {
        let issuers = self.identity.issuers();
        for (index, issuer) in issuers.iter().enumerate() {
            if !valid_name(&issuer.name) {
                return Err(invalid(format!(
                    "{}.name: use letters, digits, `-`, `_`, `.`",
                    issuer.section()
                )));
            }
            if issuers[..index].iter().any(|other| other.name == issuer.name) {
                return Err(invalid(format!(
                    "two issuers are named `{}` (`{LOGIN_ISSUER}` names the issuer of `identity` itself)",
                    issuer.name
                )));
            }
        }
        // A rule names issuers by these names.
        for (cluster, config) in &self.clusters {
            for (index, rule) in config.rules.iter().enumerate() {
                if let Some(unknown) = rule
                    .issuers
                    .iter()
                    .find(|name| !issuers.iter().any(|i| &i.name == *name))
                {
                    let names: Vec<&str> = issuers.iter().map(|i| i.name.as_str()).collect();
                    return Err(invalid(format!(
                        "clusters.{cluster}.rules[{index}] names issuer `{}`, which is not configured; issuers: {}",
                        talos_sso_text::clean(unknown, 64),
                        names.join(", ")
                    )));
                }
            }
        }
        Ok(())
    }

    /// Workload issuers and rules, as far as the file alone tells: workload
    /// issuers' own keys, rules named once and naming a workload issuer,
    /// lifetimes within the cluster's, and people's rules and examples kept
    /// apart from workloads. Claims and roles are `policy::workloads`'.
    fn validate_workloads(&self) -> Result<(), ConfigError> {
        let kinds = self.identity.workload_kinds();
        if self.identity.login_issuer().is_workload() {
            return Err(invalid(
                "identity.kind: people log in with the login issuer; a workload issuer goes under \
                 identity.trusted_issuers",
            ));
        }
        for issuer in &self.identity.trusted_issuers {
            let section = issuer.section();
            if !issuer.is_workload() {
                if issuer.jwks_file.is_some() || issuer.certificates_per_token.is_some() {
                    return Err(invalid(format!(
                        "{section}: `jwks_file` and `certificates_per_token` are for workload issuers \
                         (kind kubernetes, github-actions or gitlab-ci)"
                    )));
                }
                continue;
            }
            if issuer
                .certificates_per_token
                .is_some_and(|uses| !(1..=super::MAX_CERTIFICATES_PER_TOKEN).contains(&uses))
            {
                return Err(invalid(format!(
                    "{section}.certificates_per_token: from 1 to {}",
                    super::MAX_CERTIFICATES_PER_TOKEN
                )));
            }
            if issuer.jwks_file.is_some() && issuer.discovery_url.is_some() {
                return Err(invalid(format!(
                    "{section}: set `jwks_file` or `discovery_url`, not both"
                )));
            }
        }
        let names = kinds.keys().cloned().collect::<Vec<_>>().join(", ");
        for (cluster, config) in &self.clusters {
            for (index, rule) in config.rules.iter().enumerate() {
                if let Some(workload) = rule.issuers.iter().find(|name| kinds.contains_key(*name)) {
                    return Err(invalid(format!(
                        "clusters.{cluster}.rules[{index}] names workload issuer `{workload}`: \
                         workloads are judged by `workloads` rules only"
                    )));
                }
            }
            for (index, rule) in config.workloads.iter().enumerate() {
                let at = format!("clusters.{cluster}.workloads[{index}]");
                if !valid_name(&rule.name) {
                    return Err(invalid(format!("{at}.name: use letters, digits, `-`, `_`, `.`")));
                }
                if config.workloads[..index]
                    .iter()
                    .any(|other| other.name == rule.name)
                {
                    return Err(invalid(format!(
                        "{at}: two workload rules of cluster `{cluster}` are named `{}`",
                        rule.name
                    )));
                }
                if !kinds.contains_key(&rule.issuer) {
                    return Err(invalid(format!(
                        "{at}.issuer: `{}` is not a workload issuer; workload issuers: {}",
                        talos_sso_text::clean(&rule.issuer, 64),
                        if names.is_empty() { "none" } else { &names }
                    )));
                }
                if let Some(ttl) = rule.ttl
                    && (ttl.is_zero() || ttl > config.max_ttl)
                {
                    return Err(invalid(format!(
                        "{at}.ttl must be above zero and at most the cluster's max_ttl ({}s)",
                        config.max_ttl.as_secs()
                    )));
                }
            }
        }
        for example in &self.policy_examples {
            if let Some(issuer) = &example.issuer
                && !kinds.contains_key(issuer)
            {
                return Err(invalid(format!(
                    "policy example `{}` names `{}`, which is not a workload issuer (examples without \
                     `issuer` stand for people)",
                    example.description,
                    talos_sso_text::clean(issuer, 64)
                )));
            }
        }
        Ok(())
    }

    /// What is valid but should be said explicitly: logged at start and
    /// printed by `check`.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.identity.kind.is_none() {
            let kind = self.identity.login_issuer().kind;
            let because = if self.identity.allowed_tenants.is_empty() {
                "is not set"
            } else {
                "is set"
            };
            warnings.push(format!(
                "identity.kind is not set, so it is taken as `{kind}` because identity.allowed_tenants {because}; \
                 add the line `kind: {kind}` to the `identity` section (TOML: `kind = \"{kind}\"`) to say so"
            ));
        }
        warnings
    }

    /// Said by `check` and at start when the trail is not signed: a choice
    /// (homelab, evaluation), not a mistake, so not one of [`Self::warnings`].
    pub fn unsigned_trail_notice(&self) -> Option<&'static str> {
        self.audit.checkpoints.is_none().then_some(
            "audit.checkpoints is not set: the audit trail is not signed, so whoever can write the database can \
             rewrite it, or cut its end, unseen (docs/audit.md, \"Signed checkpoints\")",
        )
    }
}

impl HttpConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if self.header_read_timeout.is_zero() || self.request_timeout.is_zero() {
            return Err(invalid(
                "http.header_read_timeout and http.request_timeout must be above zero",
            ));
        }
        if self.idle_timeout <= self.request_timeout {
            return Err(invalid(format!(
                "http.idle_timeout ({:?}) must be longer than http.request_timeout ({:?}): \
                 a request in progress must not look idle",
                self.idle_timeout, self.request_timeout
            )));
        }
        if self.max_connections == 0 || self.max_connections > u32::MAX as usize {
            return Err(invalid("http.max_connections must be at least 1"));
        }
        if self.max_connections_per_address == 0 {
            return Err(invalid("http.max_connections_per_address must be at least 1"));
        }
        if self.http2_max_concurrent_streams == 0 {
            return Err(invalid("http.http2_max_concurrent_streams must be at least 1"));
        }
        Ok(())
    }
}

/// Whether `url` is https, or http to this machine only.
fn secure_or_loopback(url: &url::Url) -> bool {
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    url.scheme() == "https" || (url.scheme() == "http" && loopback)
}

impl ConsoleConfig {
    fn check(&self) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        let Some(public_url) = &self.public_url else {
            return Err(invalid(
                "console.public_url is required when console.enabled is set (the redirect URI is it plus /ui/callback)",
            ));
        };
        let url = url::Url::parse(public_url).map_err(|e| invalid(format!("console.public_url: {e}")))?;
        if !secure_or_loopback(&url) || url.query().is_some() || url.fragment().is_some() {
            return Err(invalid(
                "console.public_url must be https:// (http:// only to this machine), without query or fragment",
            ));
        }
        if self.max_sessions == 0 || self.session_idle.is_zero() || self.session_lifetime.is_zero() {
            return Err(invalid(
                "console.max_sessions, session_idle and session_lifetime must be above zero",
            ));
        }
        if self.max_exports == 0 || self.max_exports_per_person == 0 || self.export_timeout.is_zero() {
            return Err(invalid(
                "console.max_exports, max_exports_per_person and export_timeout must be above zero",
            ));
        }
        Ok(())
    }
}

/// Names of clusters and issuers: they become keys, labels and log fields.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

impl FeedConfig {
    /// What is wrong with the section, if anything.
    pub fn check(&self) -> Result<(), String> {
        if self.max_streams == 0 || self.max_streams_per_identity == 0 {
            return Err(
                "audit.feed.max_streams and audit.feed.max_streams_per_identity must be at least 1".into(),
            );
        }
        if self.heartbeat.is_zero() || self.poll_interval.is_zero() || self.write_timeout.is_zero() {
            return Err(
                "audit.feed.heartbeat, audit.feed.poll_interval and audit.feed.write_timeout must be above zero"
                    .into(),
            );
        }
        Ok(())
    }
}
