//! The Kubernetes objects of deploy/kubernetes against the code and each
//! other: labels select the server and never the database, the
//! NetworkPolicies, Ingresses and routes open and reach the ports the
//! server has, and the CloudNativePG roles are the ones the configuration
//! connects as.

use std::path::PathBuf;

use serde_yaml_ng::Value;

use super::*;

/// Every Kubernetes object under `deploy/kubernetes` (not the Kustomize
/// files, not the server's configuration), with the file it is in.
fn kubernetes_objects() -> Vec<(PathBuf, Value)> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy/kubernetes"), &mut files);
    files.sort();
    files
        .into_iter()
        .flat_map(|file| documents(&file).into_iter().map(move |doc| (file.clone(), doc)))
        .filter(|(_, doc)| {
            doc.get("kind").is_some()
                && !doc["apiVersion"]
                    .as_str()
                    .unwrap()
                    .starts_with("kustomize.config.k8s.io/")
        })
        .collect()
}

/// The one object of `kind` named `name` under `deploy/kubernetes`.
fn object(kind: &str, name: &str) -> Value {
    let found: Vec<Value> = kubernetes_objects()
        .into_iter()
        .map(|(_, doc)| doc)
        .filter(|doc| doc["kind"] == kind && doc["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind} {name}");
    found.into_iter().next().unwrap()
}

/// Whether a `matchLabels`-style mapping selects an object with `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    let selector = selector.as_mapping().expect("a selector");
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn labels_and_selectors_select_the_server_and_only_it() {
    // Every object names itself with the standard labels.
    for (file, doc) in kubernetes_objects() {
        let labels = &doc["metadata"]["labels"];
        for key in ["app.kubernetes.io/name", "app.kubernetes.io/part-of"] {
            assert!(
                labels.get(key).is_some(),
                "{} {}: no {key}",
                file.display(),
                doc["kind"].as_str().unwrap()
            );
        }
        assert_eq!(
            labels["app.kubernetes.io/part-of"],
            "talos-sso",
            "{}",
            file.display()
        );
    }
    let deployment = object("Deployment", "talos-sso-server");
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    let pods = &deployment["spec"]["template"]["metadata"]["labels"];
    assert!(selects(selector, pods), "the Deployment selects its own pods");
    // Nothing GitOps cannot converge: no Job (its pod spec is immutable)
    // anywhere in the material; the database's pods carry the installation's
    // labels but never the server's component.
    assert!(
        kubernetes_objects()
            .iter()
            .all(|(_, doc)| doc["kind"] != "Job" && doc["kind"] != "CronJob"),
        "a Job under deploy/kubernetes"
    );
    let cluster = object("Cluster", "talos-sso-db");
    let database_pods = &cluster["spec"]["inheritedMetadata"]["labels"];
    let service = object("Service", "talos-sso-server");
    let pdb = object("PodDisruptionBudget", "talos-sso-server");
    let server_policy = object("NetworkPolicy", "talos-sso-server");
    let spread = &deployment["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"];
    for (what, chosen) in [
        ("Deployment", selector),
        ("Service", &service["spec"]["selector"]),
        ("PodDisruptionBudget", &pdb["spec"]["selector"]["matchLabels"]),
        (
            "NetworkPolicy talos-sso-server",
            &server_policy["spec"]["podSelector"]["matchLabels"],
        ),
        ("topology spread", spread),
    ] {
        assert!(selects(chosen, pods), "{what} selects the server's pods");
        assert!(
            !selects(chosen, database_pods),
            "{what} selects the database's pods"
        );
    }
}

/// A list of ports as (name, number), the number under `number` (a
/// container's `containerPort`, a Service's `port`).
fn named_ports(list: &Value, number: &str) -> Vec<(String, u64)> {
    list.as_sequence()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p[number].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The ports, by name, of the server's container.
fn container_ports() -> Vec<(String, u64)> {
    let deployment = object("Deployment", "talos-sso-server");
    named_ports(
        &deployment["spec"]["template"]["spec"]["containers"][0]["ports"],
        "containerPort",
    )
}

#[test]
fn network_policies_open_what_the_server_uses() {
    let ports = container_ports();
    let policy = object("NetworkPolicy", "talos-sso-server");
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_yaml_ng::from_str::<Value>("[Ingress, Egress]").unwrap()
    );
    let ingress = policy["spec"]["ingress"].as_sequence().unwrap();
    // In: the API port from anywhere, the metrics port from the monitoring
    // namespace only; both named ports of the container.
    let rule_for = |name: &str| {
        ingress
            .iter()
            .find(|rule| {
                rule["ports"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == name)
            })
            .unwrap_or_else(|| panic!("no ingress rule for {name}"))
    };
    assert!(
        rule_for("https").get("from").is_none(),
        "the API port is open to its clients"
    );
    let metrics_from = rule_for("metrics")["from"]
        .as_sequence()
        .expect("metrics only from somewhere");
    assert_eq!(
        metrics_from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    for rule in ingress {
        for port in rule["ports"].as_sequence().unwrap() {
            let name = port["port"].as_str().unwrap();
            assert!(
                ports.iter().any(|(n, _)| n == name),
                "{name} is not a container port"
            );
        }
    }
    // Out: DNS over both protocols, HTTPS anywhere, Postgres to the
    // database's pods on the port database.url names.
    let egress = policy["spec"]["egress"].as_sequence().unwrap();
    let allows = |port: u64, protocol: &str| {
        egress.iter().find(|rule| {
            rule["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|p| p["port"].as_u64() == Some(port) && p["protocol"] == protocol)
        })
    };
    let dns = allows(53, "UDP").expect("DNS over UDP");
    assert!(allows(53, "TCP").is_some(), "DNS over TCP");
    assert_eq!(dns["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns");
    let https = allows(443, "TCP").expect("HTTPS out");
    assert_eq!(https["to"][0]["ipBlock"]["cidr"], "0.0.0.0/0");
    let raw_config = &documents(&repo().join("deploy/kubernetes/base/config.yaml"))[0];
    let database = url::Url::parse(raw_config["database"]["url"].as_str().unwrap()).unwrap();
    let postgres = allows(u64::from(database.port().unwrap()), "TCP").expect("Postgres out");
    let cluster = object("Cluster", "talos-sso-db");
    let database_pods = &cluster["spec"]["inheritedMetadata"]["labels"];
    assert!(selects(
        &postgres["to"][0]["podSelector"]["matchLabels"],
        database_pods
    ));
    // The init container `migrate` shares the pod and its policy: the owner
    // connects to the same database, on a port the policy lets out.
    let deployment = object("Deployment", "talos-sso-server");
    let migrate = &deployment["spec"]["template"]["spec"]["initContainers"][0];
    let env = env_pairs(migrate["env"].as_sequence().unwrap());
    let owner_url = &env
        .iter()
        .find(|(k, _)| k == "TALOS_SSO__DATABASE__URL")
        .expect("the owner's database.url")
        .1;
    let owner = url::Url::parse(owner_url).unwrap();
    assert_eq!(
        (owner.host_str(), owner.port()),
        (database.host_str(), database.port())
    );
    let policies = kubernetes_objects()
        .into_iter()
        .filter(|(_, doc)| doc["kind"] == "NetworkPolicy")
        .count();
    assert_eq!(policies, 1, "one pod, one policy");
}

#[test]
fn ingress_and_gateway_examples_reach_the_service() {
    let service = object("Service", "talos-sso-server");
    let service_ports = named_ports(&service["spec"]["ports"], "port");
    let https_port = service_ports.iter().find(|(n, _)| n == "https").unwrap().1;
    let objects = kubernetes_objects();
    let of_kind = |kind: &str| -> Vec<&Value> {
        objects
            .iter()
            .map(|(_, d)| d)
            .filter(|d| d["kind"] == kind)
            .collect()
    };
    let ingresses = of_kind("Ingress");
    assert_eq!(ingresses.len(), 2, "passthrough and re-encrypting");
    for ingress in &ingresses {
        let backend = &ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"];
        assert_eq!(backend["name"], service["metadata"]["name"]);
        assert_eq!(backend["port"]["name"], "https", "to the server's own TLS");
        let annotations = &ingress["metadata"]["annotations"];
        assert_eq!(
            annotations["nginx.ingress.kubernetes.io/backend-protocol"],
            "HTTPS"
        );
    }
    assert!(
        ingresses
            .iter()
            .any(|i| i["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true")
    );
    for kind in ["HTTPRoute", "TLSRoute"] {
        let routes = of_kind(kind);
        assert_eq!(routes.len(), 1, "{kind}");
        let backend = &routes[0]["spec"]["rules"][0]["backendRefs"][0];
        assert_eq!(backend["name"], service["metadata"]["name"], "{kind}");
        assert_eq!(backend["port"].as_u64(), Some(https_port), "{kind}");
        // Each route attaches to a listener of a Gateway that exists.
        let parent = &routes[0]["spec"]["parentRefs"][0];
        assert!(
            of_kind("Gateway")
                .iter()
                .any(|g| g["metadata"]["name"] == parent["name"]
                    && g["spec"]["listeners"]
                        .as_sequence()
                        .unwrap()
                        .iter()
                        .any(|l| l["name"] == parent["sectionName"])),
            "{kind}: its parent"
        );
    }
    // Re-encrypting: the Gateway checks the server's certificate for a name
    // the certificate carries, on a port the Service has.
    let certificate = object("Certificate", "talos-sso-tls");
    let names = certificate["spec"]["dnsNames"].as_sequence().unwrap();
    let policy = &of_kind("BackendTLSPolicy")[0]["spec"];
    assert!(names.contains(&policy["validation"]["hostname"]));
    assert!(
        service_ports
            .iter()
            .any(|(n, _)| policy["targetRefs"][0]["sectionName"] == n.as_str())
    );
    let reencrypt = ingresses
        .iter()
        .find(|i| {
            i["metadata"]["annotations"]
                .get("nginx.ingress.kubernetes.io/proxy-ssl-name")
                .is_some()
        })
        .unwrap();
    assert!(
        names.contains(&reencrypt["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-ssl-name"])
    );
    // The certificate lands in the Secret the Deployment mounts as its TLS.
    let deployment = object("Deployment", "talos-sso-server");
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    assert!(
        volumes
            .iter()
            .any(|v| v["name"] == "tls" && v["secret"]["secretName"] == certificate["spec"]["secretName"])
    );
    // Whoever terminates TLS in front adds X-Forwarded-For: the example's
    // server believes it from the pod network, and each component that
    // puts a proxy in front says to set it.
    let overlay_config = &documents(&repo().join("deploy/kubernetes/overlays/example/config.yaml"))[0];
    let trusted = overlay_config["http"]["trusted_proxies"].as_sequence().unwrap();
    assert!(!trusted.is_empty());
    for proxy in trusted {
        let (address, prefix) = proxy.as_str().unwrap().split_once('/').unwrap();
        address.parse::<std::net::IpAddr>().unwrap();
        prefix.parse::<u8>().unwrap();
    }
    for component in [
        "ingress-nginx-passthrough",
        "ingress-nginx-reencrypt",
        "gateway-tls-passthrough",
        "gateway-https-reencrypt",
    ] {
        let text = std::fs::read_to_string(repo().join(format!(
            "deploy/kubernetes/components/{component}/kustomization.yaml"
        )))
        .unwrap();
        assert!(text.contains("http.trusted_proxies"), "{component}");
    }
}

#[test]
fn cloudnative_pg_cluster_makes_the_roles_the_material_uses() {
    let cluster = object("Cluster", "talos-sso-db");
    let spec = &cluster["spec"];
    let raw_config = &documents(&repo().join("deploy/kubernetes/base/config.yaml"))[0];
    let runtime_url = url::Url::parse(raw_config["database"]["url"].as_str().unwrap()).unwrap();
    let deployment = object("Deployment", "talos-sso-server");
    let server_pod = &deployment["spec"]["template"]["spec"];
    let migrate = &server_pod["initContainers"][0];
    let env = env_pairs(migrate["env"].as_sequence().unwrap());
    let env_value = |name: &str| env.iter().find(|(k, _)| k == name).unwrap().1.clone();
    let owner_url = url::Url::parse(&env_value("TALOS_SSO__DATABASE__URL")).unwrap();
    // Both connect to the cluster's read-write Service, to its database,
    // checking its certificate against the CA the operator makes.
    let name = cluster["metadata"]["name"].as_str().unwrap();
    for url in [&runtime_url, &owner_url] {
        assert_eq!(url.host_str(), Some(format!("{name}-rw").as_str()), "{url}");
        assert_eq!(
            url.path(),
            format!("/{}", spec["bootstrap"]["initdb"]["database"].as_str().unwrap())
        );
        let query: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(query["sslmode"], "verify-full");
        assert!(query["sslrootcert"].starts_with("/etc/talos-sso/database-ca/"));
    }
    // The owner owns the database and is the role the init container
    // migrates as, with the password from the Secret it mounts.
    let initdb = &spec["bootstrap"]["initdb"];
    assert_eq!(initdb["owner"].as_str(), Some(owner_url.username()));
    let secret_of = |container: &Value, mount_prefix: &str| -> String {
        let mount = container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| {
                Path::new(mount_prefix).starts_with(m["mountPath"].as_str().unwrap())
                    && m["mountPath"] != "/etc/talos-sso"
            })
            .unwrap_or_else(|| panic!("nothing mounted at {mount_prefix}"));
        let volume = server_pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        volume["secret"]["secretName"].as_str().unwrap().to_owned()
    };
    let server = &server_pod["containers"][0];
    assert_eq!(
        initdb["secret"]["name"].as_str().unwrap(),
        secret_of(migrate, &env_value("TALOS_SSO__DATABASE__PASSWORD_FILE"))
    );
    // The runtime role: the one the server connects as and `migrate` grants,
    // its password from the Secret the server mounts, and nothing `migrate
    // --runtime-role` refuses (superuser, CREATEROLE, member of the owner).
    let roles = spec["managed"]["roles"].as_sequence().unwrap();
    assert_eq!(roles.len(), 1);
    let role = &roles[0];
    assert_eq!(role["name"].as_str(), Some(runtime_url.username()));
    let args = strings(&migrate["args"]);
    let granted = &args[args.iter().position(|a| a == "--runtime-role").unwrap() + 1];
    assert_eq!(role["name"].as_str(), Some(granted.as_str()));
    for flag in [
        "superuser",
        "createrole",
        "createdb",
        "replication",
        "bypassrls",
        "inherit",
    ] {
        assert_eq!(role[flag], false, "{flag}");
    }
    assert_eq!(role["login"], true);
    assert!(
        !role["inRoles"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|r| r == &initdb["owner"])
    );
    let password_file = raw_config["database"]["password_file"].as_str().unwrap();
    assert_eq!(
        role["passwordSecret"]["name"].as_str().unwrap(),
        secret_of(server, password_file)
    );
    assert_eq!(spec["enableSuperuserAccess"], false);
    // The CA both verify with is the operator's `<cluster>-ca`.
    let root_cert = runtime_url
        .query_pairs()
        .find(|(k, _)| k == "sslrootcert")
        .unwrap()
        .1
        .into_owned();
    for container in [server, migrate] {
        assert_eq!(secret_of(container, &root_cert), format!("{name}-ca"));
    }
}
