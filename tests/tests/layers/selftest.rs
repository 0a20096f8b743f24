//! The checker checked: small source trees written to a temporary
//! directory, each with one way to break a rule, so that a checker that
//! stopped seeing a kind of path would fail here rather than pass silently.

use super::{SERVER_LAYERS, check};

/// A server crate with one module per layer, clean, plus `files` written
/// over it (a file given twice takes the later text).
fn run(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let base: &[(&str, &str)] = &[
        (
            "server/src/lib.rs",
            "pub const VERSION: &str = \"1\";\n\
             pub mod random;\npub mod config;\npub mod issuance;\npub mod policy;\n\
             pub mod app;\npub mod http;\n",
        ),
        ("server/src/random.rs", "pub fn id() -> u64 { 4 }\n"),
        (
            "server/src/config.rs",
            "#[derive(serde::Deserialize)]\npub struct Config {\n    \
             #[serde(default = \"crate::random::id\")]\n    pub seed: u64,\n}\n",
        ),
        (
            "server/src/issuance.rs",
            "use crate::config::Config;\npub fn issue(_: &Config) -> u64 { crate::random::id() }\n",
        ),
        // Nothing above uses `policy`: an upward reference from it makes no
        // circle, so each test below sees exactly one violation.
        (
            "server/src/policy.rs",
            "use crate::config::Config;\npub fn decide(_: &Config) {}\n",
        ),
        (
            "server/src/app.rs",
            "use crate::{config, issuance};\n\
             pub fn build(c: &config::Config) -> u64 { issuance::issue(c) + crate::VERSION.len() as u64 }\n",
        ),
        (
            "server/src/http.rs",
            "pub const NAME: &str = \"http\";\n\
             pub fn x() {}\npub fn serve() { let _ = format!(\"{}\", crate::app::build); }\n",
        ),
        ("api/src/lib.rs", "pub mod wire;\n"),
        ("api/src/wire.rs", "pub struct Request;\n"),
    ];
    for (path, text) in base.iter().chain(files) {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
    }
    check(dir.path(), SERVER_LAYERS).expect("the tree reads")
}

/// Exactly one violation, which says `expected` (every piece).
fn one(violations: Vec<String>, expected: &[&str]) {
    assert_eq!(violations.len(), 1, "{violations:#?}");
    for piece in expected {
        assert!(
            violations[0].contains(piece),
            "{piece:?} missing from:\n{}",
            violations[0]
        );
    }
}

#[test]
fn a_clean_tree_passes() {
    assert_eq!(run(&[]), Vec::<String>::new());
}

#[test]
fn an_upward_path_inline_in_a_function_body_fails() {
    let source = "use crate::config::Config;\n\
                  pub fn decide(_: &Config) {\n    crate::http::x();\n}\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &[
            "upward references from `policy` (layer 2 domain) to `http` (layer 4 top) in server:",
            "\n    server/src/policy.rs:3 `crate::http::x`\n",
            "To fix it",
        ],
    );
}

#[test]
fn an_upward_use_fails() {
    let source = "use super::app::build as b;\npub fn decide() {}\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &["server/src/policy.rs:1 `super::app::build`", "to `app`"],
    );
}

#[test]
fn an_upward_use_is_named_once_and_every_place_is_listed() {
    // The `use` is the reference; calls through the name it binds are not
    // listed again, but a use further down is.
    let source = "use crate::http as web;\npub fn decide() { web::x(); }\n\
                  use web::NAME;\npub fn name() -> &'static str { NAME }\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &[":\n    server/src/policy.rs:1 `crate::http`\n    server/src/policy.rs:3 `web::NAME`\n"],
    );
}

#[test]
fn an_upward_path_inside_a_macro_fails() {
    let source = "pub fn decide() -> String {\n    \
                  format!(\"{}\", vec![crate::http::NAME].len())\n}\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &["server/src/policy.rs:2 `crate::http::NAME`"],
    );
}

#[test]
fn an_upward_path_in_a_serde_attribute_string_fails() {
    let source = "#[derive(serde::Deserialize)]\npub struct Rule {\n    \
                  #[serde(default = \"crate::app::seed\")]\n    pub seed: u64,\n}\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &[
            "from `policy` (layer 2 domain) to `app` (layer 3 composition root)",
            "server/src/policy.rs:3 `crate::app::seed`",
        ],
    );
}

#[test]
fn a_top_level_module_without_a_layer_fails() {
    let lib = "pub mod random;\npub mod config;\npub mod issuance;\npub mod policy;\n\
               pub mod app;\npub mod http;\npub mod reload;\n";
    one(
        run(&[
            ("server/src/lib.rs", lib),
            ("server/src/reload.rs", "pub fn watch() {}\n"),
        ]),
        &[
            "top-level module `reload` of server (server/src/reload.rs) has no layer",
            "tests/tests/layers.rs",
        ],
    );
}

#[test]
fn two_siblings_using_each_other_fail() {
    one(
        run(&[
            ("api/src/lib.rs", "pub mod wire;\npub mod a;\npub mod b;\n"),
            ("api/src/a.rs", "pub fn f() { crate::b::g(); }\n"),
            ("api/src/b.rs", "use super::a::f;\npub fn g() { let _ = f; }\n"),
        ]),
        &[
            "circle among the modules inside api (the crate root): a, b",
            "The shortest circle: a -> b -> a\n",
            "a -> b: api/src/a.rs:1 `crate::b::g`",
            "b -> a: api/src/b.rs:1 `super::a::f`",
        ],
    );
}

#[test]
fn a_circle_of_three_deep_inside_the_tree_fails() {
    // `outer.rs` with its children in `outer/`; the reference to `b`
    // comes from a grandchild of `a` (`a`'s subtree counts as `a`).
    one(
        run(&[
            ("client/src/lib.rs", "mod outer;\n"),
            ("client/src/outer.rs", "mod a;\nmod b;\nmod c;\n"),
            ("client/src/outer/a.rs", "mod deep;\n"),
            (
                "client/src/outer/a/deep.rs",
                "pub fn f() { crate::outer::b::g(); }\n",
            ),
            ("client/src/outer/b.rs", "pub fn g() { super::c::h(); }\n"),
            (
                "client/src/outer/c.rs",
                "pub fn h() {\n    tokio::select! { _ = async {} => super::a::deep::f() }\n}\n",
            ),
        ]),
        &[
            "circle among the modules inside client::outer: a, b, c",
            "The shortest circle: a -> b -> c -> a\n",
            "a -> b: client/src/outer/a/deep.rs:1 `crate::outer::b::g`",
            "b -> c: client/src/outer/b.rs:1 `super::c::h`",
            "c -> a: client/src/outer/c.rs:2 `super::a::deep::f`",
        ],
    );
}

#[test]
fn inline_modules_are_modules_too() {
    let source = "pub mod a { pub fn f() { super::b::g() } }\n\
                  pub mod b { pub fn g() { self::inner::h() } pub mod inner { pub fn h() { crate::api_a::a::f() } } }\n";
    let violations = run(&[
        ("api/src/lib.rs", "pub mod wire;\npub mod api_a;\n"),
        ("api/src/api_a.rs", source),
    ]);
    one(
        violations,
        &[
            "inside api::api_a: a, b",
            "b -> a: api/src/api_a.rs:2 `crate::api_a::a::f`",
        ],
    );
}

#[test]
fn a_parent_and_its_children_may_use_each_other() {
    let source = "pub mod child;\npub struct Parent;\n\
                  pub fn f() -> child::Child { child::Child(Parent) }\n";
    let child = "use super::Parent;\npub struct Child(pub Parent);\n\
                 pub fn g() { let _ = crate::issuance::f; let _ = crate::VERSION; }\n";
    assert_eq!(
        run(&[
            ("server/src/issuance.rs", source),
            ("server/src/issuance/child.rs", child),
        ]),
        Vec::<String>::new()
    );
}

#[test]
fn test_code_is_left_out() {
    // `testing.rs` does not exist: a `#[cfg(test)] mod` is not followed.
    let source = "use crate::config::Config;\n\
                  pub fn issue(_: &Config) -> u64 { 0 }\n\
                  #[cfg(test)]\nuse crate::http::x;\n\
                  #[cfg(test)]\nfn helper() { crate::http::x(); }\n\
                  #[cfg(all(test, unix))]\nfn unix_helper() { crate::http::x(); }\n\
                  pub struct S;\nimpl S {\n    #[cfg(test)]\n    fn t() { crate::app::build; }\n}\n\
                  #[cfg(test)]\nmod testing;\n\
                  #[cfg(test)]\nmod tests {\n    use crate::http::x;\n    #[test]\n    fn t() { x() }\n}\n";
    assert_eq!(run(&[("server/src/issuance.rs", source)]), Vec::<String>::new());
}

#[test]
fn code_that_only_may_be_test_code_still_counts() {
    let source = "#[cfg(any(test, feature = \"testing\"))]\npub fn helper() { crate::http::x(); }\n";
    one(
        run(&[("server/src/policy.rs", source)]),
        &["server/src/policy.rs:2 `crate::http::x`"],
    );
}

#[test]
fn other_crates_and_doc_links_are_not_references() {
    let source = "//! See [`crate::http`] for the routes.\n\
                  use std::fmt;\nuse ::http::Method;\n\
                  /// Called by [`crate::http::serve`].\npub fn issue() -> fmt::Result { let _ = Method::GET; Ok(()) }\n";
    assert_eq!(run(&[("server/src/issuance.rs", source)]), Vec::<String>::new());
}

#[test]
fn strings_in_macros_are_text_not_paths() {
    let source = "pub fn decide() -> String { format!(\"see crate::http::x\") + \"crate::http\" }\n\
                  pub fn sql() -> &'static str { concat!(\"crate::http::x\") }\n";
    assert_eq!(run(&[("server/src/policy.rs", source)]), Vec::<String>::new());
}
