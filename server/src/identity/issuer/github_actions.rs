//! GitHub Actions OIDC tokens as a workload issuer: the subject is the
//! repository (`org/infra`), and rules name the claims GitHub documents
//! for deciding what a job may do. Any repository on GitHub can mint a
//! token for any audience, so every rule names its repository or owner
//! exactly (the schema's anchors); `repository_id` and
//! `repository_owner_id` survive a rename and a re-created name.

use super::workload::{
    Identified, Schema, WorkloadKind, accepted_issuers, registration, required, top_level,
};
use super::{Kind, Registration};
use crate::config::IssuerConfig;
use crate::identity::token::{ClaimSet, TokenError};

pub(super) const SCHEMA: Schema = Schema {
    kind: talos_sso_api::audit::workload::GITHUB_ACTIONS,
    claims: &[
        "repository",
        "repository_id",
        "repository_owner",
        "repository_owner_id",
        "repository_visibility",
        "ref",
        "ref_type",
        "ref_protected",
        "environment",
        "workflow_ref",
        "job_workflow_ref",
        "event_name",
        "runner_environment",
        "sub",
    ],
    anchors: &[
        "repository",
        "repository_id",
        "repository_owner",
        "repository_owner_id",
        "sub",
    ],
};

pub(super) const KIND: Registration = registration(&SCHEMA, build);

fn build(config: &IssuerConfig) -> Result<Box<dyn Kind>, String> {
    Ok(Box::new(WorkloadKind {
        schema: &SCHEMA,
        issuers: accepted_issuers(config)?,
        token_uses: config.token_uses(),
        subject_claim: "repository",
        identify,
    }))
}

fn identify(claims: &ClaimSet) -> Result<Identified, TokenError> {
    let repository = required(claims, "repository")?;
    Ok((repository.to_owned(), top_level(claims, SCHEMA.claims)))
}
