//! A workload's certificate record as the console shows it: the kind and
//! issuer in a table's cell, and on the record's page the rules that
//! admitted it (or each rule it missed, and the claims it missed), the
//! token's claims and which use of its token this was. Read from
//! `details.workload` as whatever JSON it holds; maud escapes every text.

use maud::{Markup, html};
use serde_json::Value;
use talos_sso_api::AuditRecord;
use talos_sso_api::audit::workload;

/// Most claims a page lists (the record has them all).
const CLAIMS_SHOWN: usize = 32;

/// The facts of `details.workload` a page shows.
pub(super) struct Workload<'a> {
    pub kind: &'a str,
    pub issuer: Option<&'a str>,
    /// The rules that admitted it (issued).
    pub rules: Vec<&'a str>,
    /// Each rule that did not admit it, and the claims it missed (refused).
    pub misses: Vec<(&'a str, Vec<&'a str>)>,
    /// The token's claims, each as its JSON text unless it is a string.
    pub claims: Vec<(&'a str, String)>,
    /// How many certificates one token of its issuer may mint.
    pub token_uses_max: Option<i64>,
}

/// The strings of a JSON list, others left out.
fn texts(value: Option<&Value>) -> Vec<&str> {
    value
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

impl<'a> Workload<'a> {
    /// `None` for a record without a workload whose kind is text (a
    /// person's record).
    pub fn of(record: &'a AuditRecord) -> Option<Self> {
        let details = record.details.get(workload::KEY)?;
        let text = |key: &str| details.get(key).and_then(Value::as_str);
        let misses = details
            .get(workload::MISSES)
            .and_then(Value::as_array)
            .map(|misses| {
                misses
                    .iter()
                    .filter_map(|miss| {
                        let rule = miss.get("rule").and_then(Value::as_str)?;
                        Some((rule, texts(miss.get(workload::CLAIMS))))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let claims = details
            .get(workload::CLAIMS)
            .and_then(Value::as_object)
            .map(|claims| {
                claims
                    .iter()
                    .take(CLAIMS_SHOWN)
                    .map(|(name, value)| {
                        let shown = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
                        (name.as_str(), shown)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            kind: text(workload::KIND)?,
            issuer: text(workload::ISSUER),
            rules: texts(details.get(workload::RULES)),
            misses,
            claims,
            token_uses_max: details.get(workload::TOKEN_USES_MAX).and_then(Value::as_i64),
        })
    }

    /// The kind and issuer, in one cell of a table.
    pub fn summary(&self) -> Markup {
        html! {
            span.workload { "workload " code { (self.kind) } @if let Some(issuer) = self.issuer { " via " code { (issuer) } } }
        }
    }

    /// Every fact, as a record's page lists them.
    pub fn section(&self) -> Markup {
        html! {
            h2 { "Workload" }
            dl.fields.workload {
                dt { "Kind" } dd.mono.kind { (self.kind) }
                dt { "Issuer" } dd.mono { (self.issuer.unwrap_or("")) }
                @if !self.rules.is_empty() {
                    dt { "Admitted by" } dd { @for (i, rule) in self.rules.iter().enumerate() { @if i > 0 { ", " } code { (rule) } } }
                }
                @if !self.misses.is_empty() {
                    dt { "Missed" } dd { ul.misses { @for (rule, claims) in &self.misses {
                        li { "rule " code { (rule) } @if !claims.is_empty() { ": " (claims.join(", ")) } }
                    } } }
                }
                @if let Some(max) = self.token_uses_max {
                    dt { "Certificates per token" } dd { "up to " (max) }
                }
                dt { "Claims" } dd { table.claims { tbody { @for (name, value) in &self.claims {
                    tr { th.mono { (name) } td.mono { (value) } }
                } } } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_workloads_facts_are_read_and_escaped() {
        let mut record = AuditRecord::default();
        assert!(Workload::of(&record).is_none(), "a person's record");
        record.details = json!({"workload": {
            "kind": "gitlab-ci", "issuer": "gitlab",
            "misses": [{"rule": "deploy", "claims": ["ref", "project_path"]}, {"claims": ["x"]}],
            "claims": {"project_path": "<script>alert(1)</script>", "pipeline_id": 42},
            "token_uses_max": 3,
        }});
        let found = Workload::of(&record).unwrap();
        assert_eq!(found.kind, "gitlab-ci");
        assert_eq!(found.misses, vec![("deploy", vec!["ref", "project_path"])]);
        assert_eq!(found.token_uses_max, Some(3));
        let page = found.section().into_string();
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{page}");
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("<td class=\"mono\">42</td>"), "{page}");
        assert!(page.contains("up to 3"), "{page}");
        assert!(found.summary().into_string().contains("<code>gitlab</code>"));
        // A workload whose kind is not text is shown as no workload.
        record.details = json!({"workload": {"kind": 7}});
        assert!(Workload::of(&record).is_none());
    }
}
