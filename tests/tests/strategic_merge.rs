//! The strategic merge model (`talos_sso_tests::strategic_merge`) on
//! Talos's own semantics, as its sources and tests in siderolabs/talos
//! show them (`merge/merge.go`, `configpatcher/testdata/patchdelete*`).

use serde_yaml_ng::Value;
use talos_sso_tests::strategic_merge::{MergeError, apply, documents};

const CONFIG: &str = "\
version: v1alpha1
machine:
  type: controlplane
  certSANs: [a.example]
  install:
    wipe: true
    disk: /dev/sda
  features:
    rbac: true
  nodeLabels:
    zone: a
cluster:
  clusterName: demo
---
apiVersion: v1alpha1
kind: HostnameConfig
auto: stable
";

/// The v1alpha1 document of a result, and the others.
fn split(result: &str) -> (Value, Vec<Value>) {
    let mut all = documents(result).unwrap();
    let at = all.iter().position(|d| d.get("machine").is_some()).unwrap();
    let v1alpha1 = all.remove(at);
    (v1alpha1, all)
}

fn at<'a>(document: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(document, |node, key| &node[*key])
}

#[test]
fn a_patch_appends_to_a_list_and_merges_mappings_key_by_key() {
    let patched = apply(
        CONFIG,
        &["machine:\n  certSANs: [b.example]\n  install:\n    disk: /dev/vda\n"],
    )
    .unwrap();
    let (v1alpha1, others) = split(&patched);
    let sans: Vec<&str> = at(&v1alpha1, &["machine", "certSANs"])
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(sans, ["a.example", "b.example"]);
    assert_eq!(at(&v1alpha1, &["machine", "install", "disk"]), "/dev/vda");
    // The sibling the patch did not name stays.
    assert_eq!(
        at(&v1alpha1, &["machine", "install", "wipe"]).as_bool(),
        Some(true)
    );
    assert_eq!(at(&v1alpha1, &["cluster", "clusterName"]), "demo");
    // The other document is left as it was.
    assert_eq!(others, documents(CONFIG).unwrap()[1..]);
}

#[test]
fn a_list_of_structs_is_appended_to_without_matching_entries() {
    // merge.go appends slices whatever their element: the same entry twice
    // is two entries (this is why `ca patch` has a replace form).
    let patch = "machine:\n  acceptedCAs:\n    - crt: QUJD\n";
    let patched = apply(CONFIG, &[patch, patch]).unwrap();
    let (v1alpha1, _) = split(&patched);
    assert_eq!(
        at(&v1alpha1, &["machine", "acceptedCAs"])
            .as_sequence()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn zero_values_do_not_replace_but_false_does() {
    let patched = apply(
        CONFIG,
        &["machine:\n  type: ''\n  features:\n    rbac: false\n  install:\n    disk: ~\n"],
    )
    .unwrap();
    let (v1alpha1, _) = split(&patched);
    assert_eq!(at(&v1alpha1, &["machine", "type"]), "controlplane");
    assert_eq!(
        at(&v1alpha1, &["machine", "features", "rbac"]).as_bool(),
        Some(false)
    );
    assert_eq!(at(&v1alpha1, &["machine", "install", "disk"]), "/dev/sda");
}

#[test]
fn a_delete_removes_the_key_and_an_absent_key_is_no_error() {
    let delete = "machine:\n  certSANs:\n    $patch: delete\n";
    let patched = apply(CONFIG, &[delete]).unwrap();
    let (v1alpha1, _) = split(&patched);
    assert!(at(&v1alpha1, &["machine"]).get("certSANs").is_none());
    assert_eq!(at(&v1alpha1, &["machine", "type"]), "controlplane");
    // Again, on the result: the key is gone, its parent is there.
    let (again, _) = split(&apply(&patched, &[delete]).unwrap());
    assert_eq!(again, v1alpha1);
    // Talos's patchdeletemissing: a parent missing on the way is an error.
    let missing = apply(
        "version: v1alpha1\nmachine: {}\n",
        &["machine:\n  network:\n    hostname:\n      $patch: delete\n"],
    )
    .unwrap_err();
    assert_eq!(missing, MergeError::LookupFailed("machine.network".into()));
}

#[test]
fn patches_of_one_call_apply_in_order_and_deletes_before_their_document() {
    let delete = "machine:\n  certSANs:\n    $patch: delete\n";
    let list = "machine:\n  certSANs: [c.example]\n";
    let sans = |result: &str| {
        let (v1alpha1, _) = split(result);
        at(&v1alpha1, &["machine", "certSANs"]).clone()
    };
    // Delete, then the list: the list replaces; twice, the same.
    let once = apply(CONFIG, &[delete, list]).unwrap();
    assert_eq!(
        sans(&once),
        serde_yaml_ng::from_str::<Value>("[c.example]").unwrap()
    );
    assert_eq!(sans(&apply(&once, &[delete, list]).unwrap()), sans(&once));
    // The other order: the list is appended to, then deleted.
    let (reversed, _) = split(&apply(CONFIG, &[list, delete]).unwrap());
    assert!(at(&reversed, &["machine"]).get("certSANs").is_none());
    // One document holding both: its delete goes first (AppendDeletesTo),
    // the rest is merged after, whatever the order of the keys.
    let both = "machine:\n  install:\n    disk: /dev/vdb\n  certSANs:\n    $patch: delete\n";
    let (v1alpha1, _) = split(&apply(CONFIG, &[both]).unwrap());
    assert!(at(&v1alpha1, &["machine"]).get("certSANs").is_none());
    assert_eq!(at(&v1alpha1, &["machine", "install", "disk"]), "/dev/vdb");
}

#[test]
fn what_the_model_leaves_out_is_refused_not_guessed() {
    let refused = |patch: &str| match apply(CONFIG, &[patch]) {
        Err(MergeError::NotModelled(_)) => {}
        other => panic!("{patch}: {other:?}"),
    };
    refused("apiVersion: v1alpha1\nkind: HostnameConfig\nhostname: cp-1\n");
    refused("machine:\n  network:\n    interfaces:\n      - interface: eth0\n        $patch: delete\n");
    refused("$patch: delete\n");
    // Talos merges interfaces by name and replaces pod subnets and
    // extraArgs values: merging into them is refused, adding them is not.
    let network = "version: v1alpha1\nmachine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: true\ncluster:\n  network:\n    podSubnets: [10.244.0.0/16]\n  proxy:\n    extraArgs: {foo: bar}\n";
    for patch in [
        "machine:\n  network:\n    interfaces:\n      - interface: eth0\n        dhcp: false\n",
        "cluster:\n  network:\n    podSubnets: [10.0.0.0/8]\n",
        "cluster:\n  proxy:\n    extraArgs: {foo: baz}\n",
    ] {
        assert!(
            matches!(apply(network, &[patch]), Err(MergeError::NotModelled(_))),
            "{patch}"
        );
        assert!(apply(CONFIG, &[patch]).is_ok(), "{patch}");
    }
    assert!(matches!(
        apply(CONFIG, &["machine:\n  certSANs: {a: b}\n"]),
        Err(MergeError::TypeMismatch(path)) if path == "machine.certSANs"
    ));
    assert_eq!(
        apply("apiVersion: v1alpha1\nkind: HostnameConfig\n", &["machine: {}\n"]),
        Err(MergeError::NoMachineConfig)
    );
}
