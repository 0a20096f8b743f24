//! The monitoring material checked against the server it watches: the alert
//! rules (deploy/prometheus) and their PrometheusRule twin, the
//! ServiceMonitor, the Grafana dashboard (deploy/grafana); every metric they
//! name is in a running server's exposition, the exposition passes
//! `promtool check metrics`, and a real Prometheus (the Debian package)
//! scrapes a real server and counts its issuances. A missing `promtool` or
//! `prometheus` is a failure, never a skip.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use talos_sso_tests::emulator::TokenKind;
use talos_sso_tests::harness::{Backend, CheckpointFiles, TestEnv};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

fn rule_file() -> PathBuf {
    repo().join("deploy/prometheus/talos-sso.rules.yaml")
}

fn yaml(path: &Path) -> Yaml {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Json {
    let path = repo().join("deploy/grafana/talos-sso.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The program `name` from PATH. The Debian package `prometheus` brings
/// both `prometheus` and `promtool`; `.ci/run` installs it.
fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!("`{name}` is not on PATH: install the Debian package `prometheus` (apt-get install prometheus; .ci/run does)")
        })
}

/// Every rule of the rule file: (alert name, rule).
fn rules() -> Vec<(String, Yaml)> {
    let file = yaml(&rule_file());
    let groups = file["groups"].as_sequence().expect("groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .map(|r| {
            (
                r["alert"].as_str().expect("every rule is an alert").to_owned(),
                r.clone(),
            )
        })
        .collect()
}

/// The metric names an expression uses: identifiers starting `talos_sso_`,
/// outside string literals (label values, which may hold anything).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut chars = expr.chars().peekable();
    while let Some(c) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            let mut escaped = false;
            for s in chars.by_ref() {
                if s == c && !escaped {
                    break;
                }
                escaped = s == '\\' && !escaped && c != '`';
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let mut word = String::from(c);
            while let Some(&n) = chars.peek() {
                if !(n.is_ascii_alphanumeric() || n == '_' || n == ':') {
                    break;
                }
                word.push(n);
                chars.next();
            }
            if word.starts_with("talos_sso_") {
                names.insert(word);
            }
        } else if c.is_ascii_digit() {
            // A number (1e3, 0x1f, 5m): not the start of a name.
            while chars
                .peek()
                .is_some_and(|n| n.is_ascii_alphanumeric() || *n == '.')
            {
                chars.next();
            }
        }
    }
    names
}

/// The series names an exposition offers: the name of every sample, and
/// the names each `# TYPE` line promises, so that a family with no series
/// yet (a counter per cluster that has never counted) still counts. A
/// counter's samples end in `_total` (OpenMetrics names the family
/// without it), a histogram's in `_bucket`, `_sum` and `_count`.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(declaration) = line.strip_prefix("# TYPE ") {
            let mut words = declaration.split_whitespace();
            let (Some(family), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" if family.ends_with("_total") => &[""],
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{family}{s}")));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Each expression's `talos_sso_` names the exposition lacks, by
/// expression; and the expressions that name no server metric at all.
fn unexported(exprs: &[(String, String)], exposition: &str) -> Vec<String> {
    let exported = exported_names(exposition);
    let mut problems = Vec::new();
    for (what, expr) in exprs {
        let used = metric_names(expr);
        // Prometheus's own `up` of the scrape job is the one other series a
        // query may watch alone: it says whether the server is there at all.
        if used.is_empty() && !expr.contains(r#"up{job="talos-sso"}"#) {
            problems.push(format!("{what}: names no talos_sso_ metric: {expr}"));
        }
        for name in used.difference(&exported) {
            let problem = format!("{what}: {name} is not in the exposition");
            // A panel's p50, p95 and p99 queries would say it three times.
            if !problems.contains(&problem) {
                problems.push(problem);
            }
        }
    }
    problems
}

/// Every query of the dashboard: each `expr` anywhere in it (panels inside
/// rows too), and each query variable's query. (where, query)
fn dashboard_queries(dashboard: &Json) -> Vec<(String, String)> {
    fn walk(value: &Json, title: &str, out: &mut Vec<(String, String)>) {
        match value {
            Json::Object(map) => {
                let title = map.get("title").and_then(Json::as_str).unwrap_or(title);
                if let Some(expr) = map.get("expr").and_then(Json::as_str) {
                    out.push((format!("panel {title:?}"), expr.to_owned()));
                }
                for (key, v) in map {
                    if key != "templating" {
                        walk(v, title, out);
                    }
                }
            }
            Json::Array(items) => items.iter().for_each(|v| walk(v, title, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "dashboard", &mut out);
    for variable in dashboard["templating"]["list"].as_array().expect("templating") {
        if variable["type"] == "query" {
            let query = &variable["query"];
            let text = query
                .as_str()
                .or_else(|| query["query"].as_str())
                .expect("a query");
            out.push((format!("variable {}", variable["name"]), text.to_owned()));
        }
    }
    out
}

fn rule_exprs() -> Vec<(String, String)> {
    rules()
        .into_iter()
        .map(|(alert, rule)| {
            (
                format!("alert {alert}"),
                rule["expr"].as_str().expect("expr").to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_name_the_exposition_lacks_is_named() {
    let exposition = "# HELP talos_sso_ready Ready.\n# TYPE talos_sso_ready gauge\ntalos_sso_ready 1\n\
        # HELP talos_sso_x Things.\n# TYPE talos_sso_x counter\n\
        # HELP talos_sso_h Time.\n# TYPE talos_sso_h histogram\n\
        talos_sso_certificates_issued_total{cluster=\"prod\"} 1\n# EOF\n";
    let exprs = [
        (
            "fine",
            r#"talos_sso_ready == 0 and talos_sso_x_total > 0 or talos_sso_h_bucket"#,
        ),
        ("seen", "sum(talos_sso_certificates_issued_total)"),
        (
            "missing",
            r#"rate(talos_sso_role_grants_total{role="talos_sso_ready"}[5m]) > 1e3"#,
        ),
        ("family name", "talos_sso_x + talos_sso_h"),
        ("the scrape", r#"absent(up{job="talos-sso"})"#),
        ("no metric", r#"absent(up{job="other"})"#),
    ]
    .map(|(w, e)| (w.to_owned(), e.to_owned()));
    assert_eq!(
        unexported(&exprs, exposition),
        [
            "missing: talos_sso_role_grants_total is not in the exposition",
            "family name: talos_sso_h is not in the exposition",
            "family name: talos_sso_x is not in the exposition",
            "no metric: names no talos_sso_ metric: absent(up{job=\"other\"})",
        ]
    );
}

/// What `https://…/docs/x.md#anchor` would land on: the file exists and,
/// when there is an anchor, one of its headings has that GitHub slug.
fn doc_target_exists(target: &str) -> Result<(), String> {
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let text = std::fs::read_to_string(repo().join(file)).map_err(|e| format!("{file}: {e}"))?;
    if anchor.is_empty() {
        return Ok(());
    }
    let slugs: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    if slugs.iter().any(|s| s == anchor) {
        Ok(())
    } else {
        Err(format!("{file} has no heading #{anchor} (it has {slugs:?})"))
    }
}

/// The runbooks' base URL, named once (deploy/kubernetes/monitoring/
/// runbooks.yaml): this release's docs in the project's repository.
fn runbook_base() -> String {
    let runbooks = yaml(&repo().join("deploy/kubernetes/monitoring/runbooks.yaml"));
    assert_eq!(
        runbooks["metadata"]["annotations"]["config.kubernetes.io/local-config"], "true",
        "read by kustomize, never applied"
    );
    let base = runbooks["data"]["base"].as_str().expect("data.base").to_owned();
    // `version = "..."` under `[workspace.package]` in the workspace's Cargo.toml.
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let version = cargo
        .lines()
        .skip_while(|l| l.trim() != "[workspace.package]")
        .take_while(|l| !l.starts_with('[') || l.trim() == "[workspace.package]")
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("[workspace.package] version");
    assert_eq!(
        base,
        format!("https://github.com/talos-sso/talos-sso/blob/v{version}"),
        "the runbooks of this release"
    );
    base
}

/// The kustomize replacement that writes the base over every runbook_url.
#[test]
fn the_runbook_base_is_replaced_into_every_alert() {
    let kustomization = yaml(&repo().join("deploy/kubernetes/monitoring/kustomization.yaml"));
    let replacements = kustomization["replacements"].as_sequence().expect("replacements");
    assert_eq!(replacements.len(), 1);
    let replacement = &replacements[0];
    assert_eq!(replacement["source"]["name"], "talos-sso-runbooks");
    assert_eq!(replacement["source"]["fieldPath"], "data.base");
    let target = &replacement["targets"][0];
    assert_eq!(target["select"]["kind"], "PrometheusRule");
    assert_eq!(
        target["fieldPaths"][0],
        "spec.groups.*.rules.*.annotations.runbook_url"
    );
    assert_eq!(target["options"]["delimiter"], "/docs/");
    assert_eq!(target["options"]["index"], 0);
    // The part before `/docs/` is the whole base: the page never repeats it.
    let base = runbook_base();
    for (alert, rule) in rules() {
        let url = rule["annotations"]["runbook_url"].as_str().unwrap().to_owned();
        assert_eq!(url.split("/docs/").next(), Some(base.as_str()), "{alert}");
        assert_eq!(url.matches("/docs/").count(), 1, "{alert}: {url}");
    }
}

#[test]
fn every_alert_says_how_bad_what_and_where_to_read_on() {
    let base = runbook_base();
    let rules = rules();
    let names: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), rules.len(), "alert names repeat");
    for wanted in [
        "TalosSsoAbsent",
        "TalosSsoDown",
        "TalosSsoNotReady",
        "TalosSsoConfigReloadFailed",
        "TalosSsoCaExpiresIn90Days",
        "TalosSsoCaExpiresIn30Days",
        "TalosSsoCaExpiresIn7Days",
        "TalosSsoTlsCertificateExpiresIn14Days",
        "TalosSsoTlsCertificateExpiresIn3Days",
        "TalosSsoSigningUnavailable",
        "TalosSsoIssuanceLatencyHigh",
        "TalosSsoAuditWriteFailures",
        "TalosSsoAuditCheckpointFailures",
        "TalosSsoIdentityProviderKeysStale",
    ] {
        assert!(names.contains(wanted), "no alert {wanted}");
    }
    for (alert, rule) in &rules {
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["info", "warning", "critical"].contains(&severity),
            "{alert}: severity {severity:?}"
        );
        for annotation in ["summary", "description", "runbook_url"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|t| !t.trim().is_empty()),
                "{alert}: no {annotation}"
            );
        }
        // Absolute, from the one base, to a section that exists.
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        let page = url
            .strip_prefix(&format!("{base}/"))
            .unwrap_or_else(|| panic!("{alert}: runbook_url {url} does not start with {base}/"));
        assert!(page.starts_with("docs/"), "{alert}: {url}");
        doc_target_exists(page).unwrap_or_else(|e| panic!("{alert}: runbook_url: {e}"));
    }
    // The absence alert is what pages when the whole installation is gone.
    let absent = &rules.iter().find(|(n, _)| n == "TalosSsoAbsent").unwrap().1;
    assert_eq!(absent["expr"].as_str(), Some(r#"absent(up{job="talos-sso"})"#));
    assert_eq!(absent["labels"]["severity"].as_str(), Some("critical"));
}

/// The unit tests, as promtool reads them: every alert has a case where it
/// fires and one where it must not.
#[test]
fn every_alert_has_a_unit_test_that_fires_it_and_one_that_does_not() {
    let tests = yaml(&repo().join("deploy/prometheus/talos-sso.rules.test.yaml"));
    assert_eq!(
        tests["rule_files"].as_sequence().map(Vec::as_slice),
        Some(&[Yaml::from("talos-sso.rules.yaml")][..])
    );
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for test in tests["tests"].as_sequence().expect("tests") {
        for case in test["alert_rule_test"].as_sequence().expect("alert_rule_test") {
            let alert = case["alertname"].as_str().expect("alertname").to_owned();
            let firing = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
            let entry = cases.entry(alert).or_default();
            if firing > 0 {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    for (alert, _) in rules() {
        let (fires, silent) = cases.get(&alert).copied().unwrap_or_default();
        assert!(
            fires > 0 && silent > 0,
            "{alert}: {fires} firing cases, {silent} silent ones"
        );
    }
}

#[test]
fn promtool_checks_the_rules_runs_their_unit_tests_and_reads_the_example_configuration() {
    let promtool = tool("promtool");
    let dir = repo().join("deploy/prometheus");
    for args in [
        &["check", "rules", "talos-sso.rules.yaml"][..],
        &["test", "rules", "talos-sso.rules.test.yaml"],
        &["check", "config", "prometheus.yml"],
    ] {
        let output = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "promtool {args:?}: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn the_prometheus_rule_holds_exactly_the_rule_file() {
    let manifest = yaml(&repo().join("deploy/kubernetes/monitoring/prometheusrule.yaml"));
    assert_eq!(manifest["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
    assert_eq!(manifest["kind"].as_str(), Some("PrometheusRule"));
    let file = yaml(&rule_file());
    assert!(file["groups"].as_sequence().is_some_and(|g| !g.is_empty()));
    assert_eq!(
        manifest["spec"]["groups"], file["groups"],
        "prometheusrule.yaml's spec.groups differ from talos-sso.rules.yaml: regenerate it (see its header)"
    );
    let monitoring = repo().join("deploy/kubernetes/monitoring");
    let kustomization = yaml(&monitoring.join("kustomization.yaml"));
    let resources: BTreeSet<&str> = kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        resources,
        BTreeSet::from([
            "servicemonitor.yaml",
            "prometheusrule.yaml",
            "../../grafana",
            "runbooks.yaml"
        ])
    );
}

/// The dashboard reaches Grafana's sidecar as a ConfigMap generated from
/// the JSON file (never a copy of it), labelled as the sidecar looks for.
#[test]
fn the_dashboard_is_a_configmap_generated_from_its_json() {
    let kustomization = yaml(&repo().join("deploy/grafana/kustomization.yaml"));
    let generators = kustomization["configMapGenerator"]
        .as_sequence()
        .expect("configMapGenerator");
    assert_eq!(generators.len(), 1);
    let generator = &generators[0];
    assert_eq!(
        generator["files"].as_sequence().map(Vec::as_slice),
        Some(&[Yaml::from("talos-sso.json")][..])
    );
    let options = &generator["options"];
    assert_eq!(options["labels"]["grafana_dashboard"].as_str(), Some("1"));
    assert_eq!(
        options["labels"]["app.kubernetes.io/part-of"].as_str(),
        Some("talos-sso")
    );
    assert_eq!(options["disableNameSuffixHash"], true);
    // The only JSON the folder holds is the one generated from.
    let json: Vec<_> = std::fs::read_dir(repo().join("deploy/grafana"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(json, ["talos-sso.json"]);
    assert!(dashboard()["uid"].as_str().is_some_and(|u| !u.is_empty()));
}

/// The labels the base's kustomization gives every resource it lists.
fn base_labels() -> BTreeMap<String, String> {
    let kustomization = yaml(&repo().join("deploy/kubernetes/base/kustomization.yaml"));
    let mut labels = BTreeMap::new();
    for entry in kustomization["labels"].as_sequence().into_iter().flatten() {
        for (k, v) in entry["pairs"].as_mapping().into_iter().flatten() {
            labels.insert(k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned());
        }
    }
    labels
}

#[test]
fn the_service_monitor_scrapes_the_services_metrics_port_as_job_talos_sso() {
    let monitor = yaml(&repo().join("deploy/kubernetes/monitoring/servicemonitor.yaml"));
    assert_eq!(monitor["kind"].as_str(), Some("ServiceMonitor"));
    let service = yaml(&repo().join("deploy/kubernetes/base/service.yaml"));
    let mut service_labels = base_labels();
    for (k, v) in service["metadata"]["labels"].as_mapping().into_iter().flatten() {
        service_labels.insert(k.as_str().unwrap().to_owned(), v.as_str().unwrap().to_owned());
    }
    for (k, v) in monitor["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("matchLabels")
    {
        let (k, v) = (k.as_str().unwrap(), v.as_str().unwrap());
        assert_eq!(
            service_labels.get(k).map(String::as_str),
            Some(v),
            "the Service does not carry the selected label {k}={v}: {service_labels:?}"
        );
    }
    let endpoints = monitor["spec"]["endpoints"].as_sequence().expect("endpoints");
    assert_eq!(endpoints.len(), 1);
    let endpoint = &endpoints[0];
    assert_eq!(endpoint["port"].as_str(), Some("metrics"));
    assert_eq!(endpoint["scheme"].as_str(), Some("http"));
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    // `job` is the Service's name unless relabelled; the rules want talos-sso.
    let relabelled_job = endpoint["relabelings"]
        .as_sequence()
        .into_iter()
        .flatten()
        .any(|r| r["targetLabel"] == "job" && r["replacement"] == "talos-sso");
    assert!(relabelled_job, "{endpoint:?}");
    let ports = service["spec"]["ports"].as_sequence().expect("ports");
    let metrics = ports.iter().find(|p| p["name"] == "metrics");
    assert!(
        metrics.is_some_and(|p| p["port"].as_u64() == Some(9090)),
        "deploy/kubernetes/base/service.yaml has no port `metrics` on 9090: {ports:?}"
    );
}

#[test]
fn the_dashboard_queries_through_its_variables() {
    let dashboard = dashboard();
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    let variables = dashboard["templating"]["list"].as_array().expect("templating");
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no variable {name}"))
    };
    let datasource = variable("datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    let cluster = variable("cluster");
    assert_eq!(
        cluster["query"]["query"].as_str(),
        Some("label_values(talos_sso_certificates_issued_total, cluster)")
    );
    assert_eq!(cluster["datasource"]["uid"], "${datasource}");
    let mut ids = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(ids.insert(panel["id"].as_u64().expect("id")), "panel id repeats");
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().expect("title");
        titles.push(title);
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    for wanted in [
        "Certificates issued per cluster",
        "Role grants by role",
        "Denials by reason",
        "Issuance latency",
        "HTTP requests by route and status",
        "Audit write failures",
        "Audit batch size",
        "Audit commit duration",
        "Time since the last audit checkpoint",
        "CA days left",
        "TLS days left",
        "Identity provider key age",
        "Ready",
    ] {
        assert!(titles.contains(&wanted), "no panel {wanted:?}: {titles:?}");
    }
}

/// A server with everything that has metrics switched on (TLS, signed
/// checkpoints, a metrics listener of its own), after one certificate
/// issued and one request denied, so that the labelled families have
/// series.
struct BusyServer {
    env: TestEnv,
    _checkpoints: CheckpointFiles,
    _tls: tempfile::TempDir,
}

/// What `GET /metrics` answered.
struct Scrape {
    content_type: String,
    vary: String,
    text: String,
}

impl BusyServer {
    /// `GET /metrics` on the metrics listener, with `accept` as the only
    /// `Accept` header or none at all: over a bare connection, as HTTP
    /// clients (reqwest, curl) send `Accept: */*` unless told otherwise.
    async fn scrape(&self, accept: Option<&str>) -> Scrape {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let base = self
            .env
            .server
            .metrics_url
            .as_deref()
            .expect("a metrics listener");
        let address = base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let accept = accept.map(|a| format!("accept: {a}\r\n")).unwrap_or_default();
        let request =
            format!("GET /metrics HTTP/1.1\r\nhost: {address}\r\n{accept}connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let response = String::from_utf8(response).unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        let header = |name: &str| {
            head.lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.trim().to_owned())
                .unwrap_or_default()
        };
        assert_eq!(header("content-length"), body.len().to_string(), "{head}");
        Scrape {
            content_type: header("content-type"),
            vary: header("vary"),
            text: body.to_owned(),
        }
    }
}

async fn busy_server() -> BusyServer {
    let scratch = tempfile::tempdir().unwrap();
    let (ca_pem, cert, key) = talos_sso_tests::harness::tls_files(scratch.path());
    let checkpoints = CheckpointFiles::new();
    let env = TestEnv::start_with(Backend::Sqlite, |yaml| {
        let tls = format!(
            "tls: {{ cert_file: \"{}\", key_file: \"{}\" }}",
            cert.display(),
            key.display()
        );
        let yaml = format!("{yaml}metrics: {{ listen: \"127.0.0.1:0\" }}\n");
        checkpoints.configure(
            &yaml.replace("insecure_http: true", &tls),
            "1h",
            "talos-sso-test-1",
        )
    })
    .await;
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for (user, status) in [("bob@example.com", 201), ("dave@example.com", 403)] {
        let token = env.emulator.token_for(user, TokenKind::id()).unwrap();
        let csr = talos_sso::key::ClientKey::generate().unwrap().csr_pem().unwrap();
        let response = client
            .post(format!("{}/v1/certificates", env.server.base_url))
            .bearer_auth(token)
            .json(&serde_json::json!({"cluster": "prod", "csr": csr}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{user}");
    }
    BusyServer {
        env,
        _checkpoints: checkpoints,
        _tls: scratch,
    }
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_use_is_exported() {
    let server = busy_server().await;
    // What Prometheus asks for.
    let exposition = server.scrape(Some(PROMETHEUS_ACCEPT)).await.text;
    let mut exprs = rule_exprs();
    exprs.extend(dashboard_queries(&dashboard()));
    assert!(exprs.len() > 30, "{exprs:?}");
    let problems = unexported(&exprs, &exposition);
    assert!(
        problems.is_empty(),
        "{} problems:\n{}\n\nthe exposition:\n{exposition}",
        problems.len(),
        problems.join("\n")
    );
    server.env.finish().await;
}

/// The `Accept` header of a Prometheus 2 scrape.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// `promtool check metrics` on `text`: what it said, empty when it found
/// nothing wrong.
fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("{}: {said}", output.status))
    }
}

/// A scraper that does not ask for OpenMetrics (no `Accept`, `*/*`,
/// `text/plain`: promtool, curl, older scrapers) gets the classic text
/// format, which names a counter's family with its `_total`; promtool, which
/// lints only that format, finds nothing wrong in it (fed OpenMetrics, it
/// says "no help text" for every counter: it takes the `_total` samples for
/// a family of their own). Prometheus, which asks for OpenMetrics first,
/// gets it.
#[tokio::test]
async fn promtool_finds_no_problem_in_the_exposition() {
    tool("promtool");
    let server = busy_server().await;
    let classic = "text/plain; version=0.0.4; charset=utf-8";
    for accept in [
        None,
        Some("*/*"),
        Some("text/plain"),
        Some("text/plain; version=0.0.4"),
        Some("application/openmetrics-text; q=0, */*; q=0.1"),
    ] {
        let scrape = server.scrape(accept).await;
        let text = &scrape.text;
        assert_eq!(
            (scrape.content_type.as_str(), scrape.vary.as_str()),
            (classic, "accept"),
            "Accept {accept:?}"
        );
        assert!(
            text.contains(
                "# HELP talos_sso_certificates_issued_total Certificates issued, by cluster.\n\
                 # TYPE talos_sso_certificates_issued_total counter\n"
            ) && text.contains("talos_sso_certificates_issued_total{cluster=\"prod\"} 1\n")
                && !text.contains("# EOF"),
            "Accept {accept:?}:\n{text}"
        );
        if let Err(said) = promtool_check(text) {
            panic!(
                "promtool check metrics on the exposition for Accept {accept:?}:\n{said}\nthe exposition:\n{text}"
            );
        }
    }

    let scrape = server.scrape(Some(PROMETHEUS_ACCEPT)).await;
    let text = &scrape.text;
    assert_eq!(
        scrape.content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(
        text.contains("# TYPE talos_sso_certificates_issued counter\n")
            && text.contains("talos_sso_certificates_issued_total{cluster=\"prod\"} 1\n")
            && text.ends_with("# EOF\n"),
        "{text}"
    );
    server.env.finish().await;
}

/// A Prometheus server, killed when dropped (a failed assertion too).
struct Prometheus {
    child: std::process::Child,
    url: String,
    http: reqwest::Client,
    /// Its storage and its log (`prometheus.log`).
    data: tempfile::TempDir,
}

impl Prometheus {
    /// Start `prometheus` on `config` with storage of its own, on a free
    /// port, and wait until it says it is ready.
    async fn start(config: &Path) -> Self {
        let binary = tool("prometheus");
        let mut log = String::new();
        // The port is free when asked; should another process take it
        // before Prometheus binds it, Prometheus exits and another is tried.
        for _ in 0..3 {
            let data = tempfile::tempdir().unwrap();
            let port = talos_sso_tests::faults::free_port().unwrap();
            let child = Command::new(&binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    data.path().join("tsdb").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(data.path().join("prometheus.log")).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
            let mut prometheus = Self {
                child,
                url: format!("http://127.0.0.1:{port}"),
                http: reqwest::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap(),
                data,
            };
            let deadline = Instant::now() + Duration::from_secs(30);
            while prometheus.child.try_wait().unwrap().is_none() {
                let ready = prometheus
                    .http
                    .get(format!("{}/-/ready", prometheus.url))
                    .send()
                    .await;
                if ready.is_ok_and(|r| r.status().is_success()) {
                    return prometheus;
                }
                assert!(
                    Instant::now() < deadline,
                    "prometheus did not get ready within 30 s:\n{}",
                    prometheus.log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            log = prometheus.log();
        }
        panic!("prometheus did not start:\n{log}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.data.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>` with `query`: the `data` of a successful answer.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Result<Json, String> {
        let answer: Json = self
            .http
            .get(format!("{}/api/v1/{path}", self.url))
            .query(query)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if answer["status"] == "success" {
            Ok(answer["data"].clone())
        } else {
            Err(answer.to_string())
        }
    }

    /// The single value an instant query answers, if it answers one.
    async fn value(&self, query: &str) -> Option<f64> {
        let data = self.api("query", &[("query", query)]).await.ok()?;
        let result = data["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Poll `query` until it answers `want` (at most `within`): what it
    /// answered last.
    async fn wait_for(&self, query: &str, want: f64, within: Duration) -> Option<f64> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.value(query).await;
            if got == Some(want) || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_real_prometheus_scrapes_the_server_and_counts_two_issuances() {
    let env = TestEnv::start(Backend::Sqlite).await;
    // The shipped example configuration, pointed at this server, scraping
    // every second; it loads the shipped rules.
    let mut config = yaml(&repo().join("deploy/prometheus/prometheus.yml"));
    config["global"]["scrape_interval"] = "1s".into();
    config["global"]["evaluation_interval"] = "1s".into();
    config["rule_files"] = Yaml::Sequence(vec![rule_file().display().to_string().into()]);
    let jobs = config["scrape_configs"]
        .as_sequence_mut()
        .expect("scrape_configs");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["job_name"].as_str(), Some("talos-sso"));
    let target = env.server.base_url.trim_start_matches("http://").to_owned();
    jobs[0]["static_configs"] = serde_yaml_ng::from_str(&format!("[{{targets: [\"{target}\"]}}]")).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let config_path = scratch.path().join("prometheus.yml");
    std::fs::write(&config_path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let prometheus = Prometheus::start(&config_path).await;

    let up = prometheus
        .wait_for(r#"up{job="talos-sso"}"#, 1.0, Duration::from_secs(30))
        .await;
    assert_eq!(up, Some(1.0), "{}", prometheus.log());
    for _ in 0..2 {
        let token = env
            .emulator
            .token_for("bob@example.com", TokenKind::id())
            .unwrap();
        assert_eq!(env.issue(&token).await.0, 201);
    }
    let issued = prometheus
        .wait_for(
            "sum(talos_sso_certificates_issued_total)",
            2.0,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(issued, Some(2.0), "{}", prometheus.log());

    // The rules load and evaluate (none has an error), and not one of
    // them fires against a healthy server.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rules = loop {
        let groups = prometheus.api("rules", &[]).await.unwrap()["groups"].clone();
        let rules: Vec<Json> = groups
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        if rules.iter().all(|r| r["health"] == "ok") || Instant::now() > deadline {
            break rules;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(rules.len(), rule_exprs().len());
    for rule in &rules {
        assert_eq!(rule["health"], "ok", "{rule}");
        assert_eq!(rule["state"], "inactive", "{rule}");
    }

    // Every dashboard query is PromQL this Prometheus accepts, with the
    // dashboard's variables as Grafana fills them in.
    for (what, query) in dashboard_queries(&dashboard()) {
        if let Some(args) = query.strip_prefix("label_values(") {
            let (metric, label) = args.trim_end_matches(')').split_once(',').unwrap();
            let values = prometheus
                .api(
                    &format!("label/{}/values", label.trim()),
                    &[("match[]", metric.trim())],
                )
                .await
                .unwrap();
            assert_eq!(values, serde_json::json!(["prod"]), "{what}");
            continue;
        }
        let promql = query.replace("$__rate_interval", "1m").replace("$cluster", ".*");
        assert!(!promql.contains('$'), "{what}: a variable left in {promql}");
        prometheus
            .api("query", &[("query", &promql)])
            .await
            .unwrap_or_else(|e| panic!("{what}: {promql}: {e}"));
    }
    drop(prometheus);
    env.finish().await;
}
