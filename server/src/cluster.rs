//! The clusters the server signs for: each one's configuration, its CA
//! (read and checked) and the CA that takes over at a date, its policy
//! (built and checked), and the policy examples run against them. Built at
//! start and again by each reload.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use crate::ca::{CaError, CaOptions, CaWarning, CertificateAuthority, TrustMode, format_time};
use crate::config::{ClusterConfig, Config, ConfigError, GatewayConfig, TalosCaSource};
use crate::policy::{ClusterPolicy, PolicyConfigError};
use crate::talos_api::rules::MethodRules;

/// One cluster, ready to sign.
#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub config: ClusterConfig,
    /// The CA that signs until `next_ca`'s `signs_from`.
    pub ca: CertificateAuthority,
    /// The CA that signs from its `signs_from` on.
    pub next_ca: Option<NextCa>,
    pub policy: ClusterPolicy,
    /// The access gateway in front of the cluster's apid, when configured.
    pub gateway: Option<ClusterGateway>,
}

/// A gateway cluster's own material: the CA only the gateway accepts, and
/// the per-method rules.
#[derive(Debug)]
pub struct ClusterGateway {
    pub config: GatewayConfig,
    /// Signs people's certificates; its trust bundle is the CA that
    /// verifies the gateway's serving certificate (the talosconfig `ca`).
    pub client_ca: CertificateAuthority,
    pub rules: MethodRules,
}

/// A CA that takes over at a moment: a rotation with an overlap, both CAs
/// trusted by Talos meanwhile.
#[derive(Debug)]
pub struct NextCa {
    pub ca: CertificateAuthority,
    pub signs_from: OffsetDateTime,
}

impl Cluster {
    pub fn context_name(&self) -> String {
        self.config.context.clone().unwrap_or_else(|| self.name.clone())
    }

    /// The CA that signs at `now`: `next_ca` from its `signs_from` on,
    /// `ca` before.
    pub fn signing_ca(&self, now: OffsetDateTime) -> &CertificateAuthority {
        match &self.next_ca {
            Some(next) if now >= next.signs_from => &next.ca,
            _ => &self.ca,
        }
    }

    /// Every CA the cluster holds: `ca`, then `next_ca`.
    pub fn cas(&self) -> impl Iterator<Item = &CertificateAuthority> {
        std::iter::once(&self.ca).chain(self.next_ca.as_ref().map(|next| &next.ca))
    }

    /// How Talos trusts the cluster's certificates.
    pub fn mode(&self) -> TrustMode {
        self.ca.mode()
    }

    /// The CA that signs people's certificates at `now`: the gateway's
    /// client CA on a gateway cluster, else [`Self::signing_ca`].
    pub fn people_ca(&self, now: OffsetDateTime) -> &CertificateAuthority {
        match &self.gateway {
            Some(gateway) => &gateway.client_ca,
            None => self.signing_ca(now),
        }
    }

    /// What a person's talosconfig `ca` holds: what verifies the gateway,
    /// or apid.
    pub fn talosconfig_ca(&self) -> &str {
        match &self.gateway {
            Some(gateway) => gateway.client_ca.trust_bundle_pem(),
            None => self.ca.trust_bundle_pem(),
        }
    }

    /// A person's talosconfig `endpoints`: the gateway's, or apid's.
    pub fn talosconfig_endpoints(&self) -> &[String] {
        match &self.gateway {
            Some(gateway) => &gateway.config.endpoints,
            None => &self.config.endpoints,
        }
    }

    /// Where the gateway forwards to: `gateway.upstreams`, else the
    /// cluster's endpoints.
    pub fn upstreams(&self) -> &[String] {
        match &self.gateway {
            Some(gateway) if !gateway.config.upstreams.is_empty() => &gateway.config.upstreams,
            _ => &self.config.endpoints,
        }
    }
}

/// Why the clusters could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cluster `{cluster}`: {message}")]
    Cluster { cluster: String, message: String },
    #[error("{0}")]
    PolicyExample(String),
}

/// Clusters by name.
pub type Clusters = BTreeMap<String, Cluster>;

/// CA warnings with the cluster they concern.
pub type ClusterWarnings = Vec<(String, CaWarning)>;

/// Clusters with their CAs and policies, checked: at start, at each
/// reload, by `check` and by `break-glass`.
pub fn load_clusters(
    config: &Config,
    now: OffsetDateTime,
) -> Result<(Clusters, ClusterWarnings), ClusterError> {
    let mut clusters = BTreeMap::new();
    let mut warnings = Vec::new();
    for (name, cluster_config) in &config.clusters {
        let fail = |message: String| ClusterError::Cluster {
            cluster: name.clone(),
            message,
        };
        let talos_ca = cluster_config.talos_ca.as_ref().map(|t| t.source()).transpose()?;
        let options = CaOptions {
            accepted_cas: cluster_config.accepted_cas.clone(),
            allow_insecure_key_permissions: cluster_config.ca.allow_insecure_key_permissions,
            talos_ca,
        };
        let source = cluster_config.ca.source()?;
        // Once next_ca signs, ca signs nothing more: its expiry, which the
        // rotation was for, does not stop a start or a reload (it is
        // checked as it was when it stopped signing; NextCaSigning says to
        // retire it).
        let retired_at = cluster_config
            .next_ca
            .as_ref()
            .map(|next| next.signs_from)
            .filter(|signs_from| now >= *signs_from);
        // (Only an expired ca is loaded again, as of signs_from: a start or
        // reload past that point, rarely.)
        let ca = match (CertificateAuthority::load(&source, &options, now), retired_at) {
            (Err(CaError::Expired { .. }), Some(retired_at)) => {
                CertificateAuthority::load(&source, &options, retired_at)
            }
            (loaded, _) => loaded,
        }
        .map_err(|e| fail(format!("CA refused [{}]: {e}", e.code())))?;
        warnings.extend(
            ca.warnings()
                .iter()
                .filter(|w| retired_at.is_none() || !matches!(w, CaWarning::ExpiresSoon { .. }))
                .cloned()
                .map(|w| (name.clone(), w)),
        );
        let next_ca = match &cluster_config.next_ca {
            None => None,
            Some(next) => {
                let options = CaOptions {
                    allow_insecure_key_permissions: next.allow_insecure_key_permissions,
                    ..options
                };
                let next_ca = CertificateAuthority::load(&next.source()?, &options, now)
                    .map_err(|e| fail(format!("next_ca refused [{}]: {e}", e.code())))?;
                check_next_ca(&ca, &next_ca, next.signs_from).map_err(&fail)?;
                warnings.extend(next_ca.warnings().iter().cloned().map(|w| (name.clone(), w)));
                if now >= next.signs_from {
                    warnings.push((
                        name.clone(),
                        CaWarning::NextCaSigning {
                            since: format_time(next.signs_from),
                        },
                    ));
                }
                Some(NextCa {
                    ca: next_ca,
                    signs_from: next.signs_from,
                })
            }
        };
        let policy = ClusterPolicy::new(cluster_config.policy(&config.identity)).map_err(|e| match e {
            // Named by its place in the file, as the `auditors` and
            // `admins` app roles are by `app::check`.
            PolicyConfigError::AppRole { index, message } => ClusterError::Config(ConfigError::Invalid(
                format!("clusters.{name}.rules[{index}].app_roles: {message}"),
            )),
            other => fail(other.to_string()),
        })?;
        let gateway = match &cluster_config.gateway {
            None => None,
            Some(gateway) => Some(load_gateway(gateway, &ca, next_ca.as_ref(), now).map_err(&fail)?),
        };
        if let Some(gateway) = &gateway {
            warnings.extend(
                gateway
                    .client_ca
                    .warnings()
                    .iter()
                    .cloned()
                    .map(|w| (name.clone(), w)),
            );
        }
        clusters.insert(
            name.clone(),
            Cluster {
                name: name.clone(),
                config: cluster_config.clone(),
                ca,
                next_ca,
                policy,
                gateway,
            },
        );
    }
    for example in &config.policy_examples {
        let cluster = clusters
            .get(&example.cluster)
            .ok_or_else(|| ClusterError::PolicyExample(format!("unknown cluster `{}`", example.cluster)))?;
        cluster
            .policy
            .check_example(example)
            .map_err(|e| ClusterError::PolicyExample(format!("cluster `{}`: {e}", example.cluster)))?;
    }
    Ok((clusters, warnings))
}

/// A gateway's client CA and rules, checked: the CA must be a client-only
/// CA of its own that Talos does not trust (not the cluster's `ca`, nor in
/// what verifies apid), and the rules' examples must hold.
fn load_gateway(
    config: &GatewayConfig,
    ca: &CertificateAuthority,
    next_ca: Option<&NextCa>,
    now: OffsetDateTime,
) -> Result<ClusterGateway, String> {
    let source = crate::config::CaSource::from_parts(
        Some(&config.client_ca.cert_file),
        config.client_ca.key_file.as_ref(),
        None,
        None,
        config.client_ca.pkcs11.as_ref(),
    )
    .ok_or("gateway.client_ca needs cert_file with either key_file or pkcs11")?;
    // Loaded as an accepted-CA signer whose "Talos CA" is the CA of the
    // gateway's serving certificate: the same checks (self-signed,
    // client-only, path length 0; the serving CA able to vouch for a
    // server and not the signer), and the bundle is the talosconfig `ca`.
    let options = CaOptions {
        accepted_cas: Vec::new(),
        allow_insecure_key_permissions: config.client_ca.allow_insecure_key_permissions,
        talos_ca: Some(TalosCaSource::CertFile(config.tls.ca_file.clone())),
    };
    let client_ca = CertificateAuthority::load(&source, &options, now)
        .map_err(|e| format!("gateway.client_ca refused [{}]: {e}", e.code()))?;
    let trusted_by_talos = |ca: &CertificateAuthority| {
        std::iter::once(ca.signer().der.as_slice())
            .chain(ca.chain_to_send().map(|c| c.der.as_slice()))
            .any(|der| der == client_ca.signer().der.as_slice())
            || crate::x509::pem_blocks(ca.trust_bundle_pem())
                .unwrap_or_default()
                .iter()
                .any(|(_, der)| *der == client_ca.signer().der)
            || client_ca.signer().spki() == ca.signer().spki()
    };
    if std::iter::once(ca)
        .chain(next_ca.map(|next| &next.ca))
        .any(trusted_by_talos)
    {
        return Err(
            "gateway.client_ca is a CA Talos trusts (the cluster's ca, or in what verifies apid): \
             certificates it signs would work at apid directly, around the gateway; make a CA of its own \
             with `talos-sso-server ca client-ca` and do not list it in machine.acceptedCAs"
                .into(),
        );
    }
    if config.endpoints.is_empty() {
        return Err("gateway.endpoints is empty: say where talosctl reaches the gateway".into());
    }
    let rules = MethodRules::new(&config.rules)?;
    for example in &config.examples {
        rules.check_example(example)?;
    }
    Ok(ClusterGateway {
        config: config.clone(),
        client_ca,
        rules,
    })
}

/// A `next_ca` must be another CA of the same mode, valid when it takes
/// over, and must take over before `ca` expires.
fn check_next_ca(
    ca: &CertificateAuthority,
    next: &CertificateAuthority,
    signs_from: OffsetDateTime,
) -> Result<(), String> {
    if next.signer().spki() == ca.signer().spki() {
        return Err("next_ca has the same key as ca: a rotation needs a new key".into());
    }
    if next.trust_bundle_pem() != ca.trust_bundle_pem() {
        return Err(
            "next_ca is not trusted through the same Talos CA as ca, so talosconfigs would change with it; \
             a cluster-CA rotation is Talos's own (talosctl rotate-ca, then accepted_cas here)"
                .into(),
        );
    }
    if next.mode() != ca.mode() {
        return Err(format!(
            "next_ca is in {} mode, ca in {}: a rotation keeps the mode",
            next.mode(),
            ca.mode()
        ));
    }
    if signs_from < next.signer().not_before() || signs_from >= next.signer().not_after() {
        return Err(format!(
            "next_ca.signs_from {} is outside the next CA's validity ({} to {})",
            format_time(signs_from),
            format_time(next.signer().not_before()),
            format_time(next.signer().not_after())
        ));
    }
    if signs_from > ca.signer().not_after() {
        return Err(format!(
            "next_ca.signs_from {} is after ca expires ({}): nothing could sign in between",
            format_time(signs_from),
            format_time(ca.signer().not_after())
        ));
    }
    Ok(())
}
