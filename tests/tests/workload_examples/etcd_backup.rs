//! The etcd backup CronJob (deploy/examples/etcd-backup): its script file
//! with the container's environment and a projected service-account token.

use std::collections::BTreeMap;

use serde_json::json;
use serde_yaml_ng::Value;
use talos_sso_server::audit::event;
use talos_sso_tests::standin_apid::proto;
use talos_sso_tests::workload_tokens::{Alg, WorkloadIssuer, kubernetes_claims};

use super::{Cluster, Runner, assert_issued, example_config, examples, text, with_server, yaml};

/// The etcd backup CronJob: its service account's projected token, its
/// script file, its environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_backup_cronjob_takes_a_snapshot_with_its_service_account() {
    let dir = examples().join("etcd-backup");
    let kustomization = yaml(&dir.join("kustomization.yaml"));
    let service_account = yaml(&dir.join("serviceaccount.yaml"));
    let cronjob = yaml(&dir.join("cronjob.yaml"));
    let namespace = text(&kustomization["namespace"]);
    let account = text(&service_account["metadata"]["name"]);
    let pod = &cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert_eq!(text(&pod["serviceAccountName"]), account);
    assert_eq!(pod["automountServiceAccountToken"], Value::Bool(false));
    let container = &pod["containers"][0];
    let mount = |volume: &str| -> String {
        let mounts = container["volumeMounts"].as_sequence().unwrap();
        let found = mounts.iter().find(|m| m["name"] == volume).unwrap();
        text(&found["mountPath"]).to_owned()
    };
    let volume = |name: &str| -> &Value {
        let volumes = pod["volumes"].as_sequence().unwrap();
        volumes.iter().find(|v| v["name"] == name).unwrap()
    };
    // The token: the projected one, for talos-sso's audience, an hour long.
    let projected = &volume("talos-sso-token")["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(projected["expirationSeconds"], Value::from(3600));
    let audience = text(&projected["audience"]);
    let token_path = format!("{}/{}", mount("talos-sso-token"), text(&projected["path"]));
    // The script: the ConfigMap made from the file, mounted where the
    // container's command runs it.
    let script_map = text(&volume("script")["configMap"]["name"]);
    let generators = kustomization["configMapGenerator"].as_sequence().unwrap();
    let generator = generators.iter().find(|g| g["name"] == script_map).unwrap();
    let script_name = text(&generator["files"][0]);
    let command: Vec<&str> = container["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(text)
        .collect();
    assert_eq!(
        command,
        ["/bin/sh", &format!("{}/{script_name}", mount("script"))]
    );
    let script = dir.join(script_name);

    let issuer = WorkloadIssuer::new("https://kubernetes.default.svc.cluster.local", Alg::Rs256);
    let cluster = Cluster::start(&example_config(&dir, &issuer), &issuer.jwks_file).await;
    let runner = Runner::new().await;
    let files = runner.scratch("pod");
    let backup = runner.scratch("backup");
    let token_file = files.join("token");
    let env_list = container["env"].as_sequence().unwrap();
    let mut vars: BTreeMap<String, String> = env_list
        .iter()
        .map(|e| (text(&e["name"]).to_owned(), text(&e["value"]).to_owned()))
        .collect();
    // Where the pod has its files, the test has its own.
    for (name, pod_path, here) in [
        ("TALOS_SSO_TOKEN_FILE", token_path.clone(), &token_file),
        ("BACKUP_DIR", mount("backup"), &backup),
        ("HOME", mount("tmp"), &runner.home),
    ] {
        let value = vars.get_mut(name).unwrap_or_else(|| panic!("{name} is set"));
        assert_eq!(*value, pod_path, "{name}");
        *value = here.display().to_string();
    }
    let vars = with_server(vars, &cluster);

    // Another service account of the namespace: refused, and the refusal
    // names no rule or claim; the record says what missed.
    let stranger = issuer.sign(&kubernetes_claims(&issuer, audience, namespace, "default"));
    std::fs::write(&token_file, &stranger).unwrap();
    let (code, out, err) = runner.run("sh", &[script.to_str().unwrap()], &vars).await;
    assert_eq!(code, 5, "a refusal: {out}{err}");
    assert!(
        err.contains("no workload rule of cluster `prod` admits this token"),
        "{err}"
    );
    assert!(
        !err.contains("service_account") && !err.contains("etcd-backup"),
        "{err}"
    );
    assert!(cluster.apid.calls().is_empty());
    let denied = cluster.records(event::CERTIFICATE_DENIED).await;
    let [refusal] = denied.as_slice() else {
        panic!("one refusal: {denied:#?}");
    };
    assert_eq!(
        refusal.record.reason_code.as_deref(),
        Some("workload_not_admitted")
    );
    assert!(err.contains(&refusal.record.request_id), "the request id: {err}");
    assert_eq!(
        refusal.record.details["workload"]["misses"],
        json!([{"rule": "etcd-backup", "claims": ["service_account"]}])
    );

    // The backup's own service account.
    let token = issuer.sign(&kubernetes_claims(&issuer, audience, namespace, account));
    std::fs::write(&token_file, &token).unwrap();
    let (code, out, err) = runner.run("sh", &[script.to_str().unwrap()], &vars).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !out.contains(&token) && !err.contains(&token),
        "the token is never shown"
    );
    let snapshot = std::fs::read(backup.join("etcd.snapshot")).unwrap();
    assert_eq!(snapshot, proto::pattern(0, proto::SNAPSHOT_DATA_LEN));
    let copies: Vec<_> = std::fs::read_dir(&backup)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("etcd-"))
        .collect();
    assert_eq!(copies.len(), 1, "the dated copy: {copies:?}");
    assert!(out.contains(&copies[0]), "{out}");

    let subject = format!("system:serviceaccount:{namespace}:{account}");
    let cn = format!("kubernetes:{subject}");
    let call = cluster.the_call().await;
    assert_eq!(call.method, proto::ETCD_SNAPSHOT);
    assert!(call.authorized, "{call:#?}");
    assert_eq!(call.certificate_common_name.as_deref(), Some(cn.as_str()));
    assert_eq!(call.certificate_roles, ["os:etcd:backup"]);
    assert_eq!(call.metadata_values("node"), ["cp-01.prod.internal"]);
    let workload = assert_issued(
        &cluster,
        &cn,
        &["os:etcd:backup"],
        "kubernetes",
        "k8s-prod",
        "etcd-backup",
    )
    .await;
    assert_eq!(workload["claims"]["namespace"], namespace);
    assert_eq!(workload["claims"]["service_account"], account);
    assert_eq!(workload["claims"]["sub"], subject.as_str());
    cluster.env.finish().await;
}
