//! GitLab CI/CD ID tokens (`id_tokens`) as a workload issuer: the subject
//! is the project's id (a moved project stays itself), the CN its path
//! (`group/project`), and rules name the claims
//! GitLab documents. On a shared GitLab anyone can create a project, so
//! every rule names its project or namespace exactly (the schema's
//! anchors). GitLab sends `ref_protected` and `environment_protected` as
//! the strings `"true"` and `"false"`.

use super::Registration;
use super::workload::{Schema, identify_top_level, registration};

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
    subject: "project_id",
    name: "project_path",
    markers: &["pipeline_id", "job_id", "ci_config_ref_uri"],
    identify: identify_top_level,
};

pub(super) const KIND: Registration = registration(&SCHEMA);
