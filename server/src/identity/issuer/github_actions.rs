//! GitHub Actions OIDC tokens as a workload issuer: the subject is the
//! repository's id (a renamed repository stays itself), the CN its name
//! (`org/infra`), and rules name the claims GitHub documents
//! for deciding what a job may do. Any repository on GitHub can mint a
//! token for any audience, so every rule names its repository or owner
//! exactly (the schema's anchors); `repository_id` and
//! `repository_owner_id` survive a rename and a re-created name.

use super::Registration;
use super::workload::{Schema, identify_top_level, registration};

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
    // Not `sub`: a repository's admin chooses which claims make it up
    // (GitHub's OIDC subject customization), so another repository's token
    // can carry the same `sub`.
    anchors: &[
        "repository",
        "repository_id",
        "repository_owner",
        "repository_owner_id",
    ],
    subject: "repository_id",
    name: "repository",
    markers: &["run_id", "workflow_ref", "job_workflow_ref"],
    identify: identify_top_level,
};

pub(super) const KIND: Registration = registration(&SCHEMA);
