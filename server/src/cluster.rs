//! The clusters the server signs for: each one's configuration, its CA
//! (read and checked) and its policy (built and checked), and the policy
//! examples run against them. Built at start and again by each reload.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use crate::ca::{CaOptions, CaWarning, CertificateAuthority};
use crate::config::{ClusterConfig, Config, ConfigError};
use crate::policy::{ClusterPolicy, PolicyConfigError};

/// One cluster, ready to sign.
#[derive(Debug)]
pub struct Cluster {
    pub name: String,
    pub config: ClusterConfig,
    pub ca: CertificateAuthority,
    pub policy: ClusterPolicy,
}

impl Cluster {
    pub fn context_name(&self) -> String {
        self.config.context.clone().unwrap_or_else(|| self.name.clone())
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
    let tenancy = config.identity.tenancy();
    for (name, cluster_config) in &config.clusters {
        let fail = |message: String| ClusterError::Cluster {
            cluster: name.clone(),
            message,
        };
        let options = CaOptions {
            accepted_cas: cluster_config.accepted_cas.clone(),
            allow_insecure_key_permissions: cluster_config.ca.allow_insecure_key_permissions,
        };
        let source = cluster_config.ca.source()?;
        let ca = CertificateAuthority::load(&source, &options, now)
            .map_err(|e| fail(format!("CA refused [{}]: {e}", e.code())))?;
        warnings.extend(ca.warnings().iter().cloned().map(|w| (name.clone(), w)));
        let policy = ClusterPolicy::new(cluster_config.policy(&tenancy)).map_err(|e| match e {
            // Named by its place in the file, as the `auditors` and
            // `admins` app roles are by `app::check`.
            PolicyConfigError::AppRole { index, message } => ClusterError::Config(ConfigError::Invalid(
                format!("clusters.{name}.rules[{index}].app_roles: {message}"),
            )),
            other => fail(other.to_string()),
        })?;
        clusters.insert(
            name.clone(),
            Cluster {
                name: name.clone(),
                config: cluster_config.clone(),
                ca,
                policy,
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
