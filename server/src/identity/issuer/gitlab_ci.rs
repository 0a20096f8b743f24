//! GitLab CI/CD ID tokens (`id_tokens`) as a workload issuer: the subject
//! is the project path (`group/project`), and rules name the claims
//! GitLab documents. On a shared GitLab anyone can create a project, so
//! every rule names its project or namespace exactly (the schema's
//! anchors). GitLab sends `ref_protected` and `environment_protected` as
//! the strings `"true"` and `"false"`.

use super::workload::{
    Identified, Schema, WorkloadKind, accepted_issuers, registration, required, top_level,
};
use super::{Kind, Registration};
use crate::config::IssuerConfig;
use crate::identity::token::{ClaimSet, TokenError};

pub(super) const SCHEMA: Schema = Schema {
    kind: talos_sso_api::audit::workload::GITLAB_CI,
    claims: &[
        "project_path",
        "project_id",
        "namespace_path",
        "namespace_id",
        "ref",
        "ref_type",
        "ref_path",
        "ref_protected",
        "environment",
        "environment_protected",
        "deployment_tier",
        "pipeline_source",
        "runner_environment",
        "sub",
    ],
    anchors: &[
        "project_path",
        "project_id",
        "namespace_path",
        "namespace_id",
        "sub",
    ],
};

pub(super) const KIND: Registration = registration(&SCHEMA, build);

fn build(config: &IssuerConfig) -> Result<Box<dyn Kind>, String> {
    Ok(Box::new(WorkloadKind {
        schema: &SCHEMA,
        issuers: accepted_issuers(config)?,
        token_uses: config.token_uses(),
        subject_claim: "project_path",
        identify,
    }))
}

fn identify(claims: &ClaimSet) -> Result<Identified, TokenError> {
    let project = required(claims, "project_path")?;
    Ok((project.to_owned(), top_level(claims, SCHEMA.claims)))
}
