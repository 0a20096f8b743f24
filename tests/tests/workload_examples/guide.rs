//! docs/workload-identity.md and configuration.md's workload section, as
//! written: their configuration starts a server, the guide's commands parse.

use serde_yaml_ng::Value;
use talos_sso_tests::harness::server_cli;
use talos_sso_tests::workload_tokens::{Alg, WorkloadIssuer};

use super::{Cluster, examples, text};

/// The fenced blocks of `lang` in `markdown`.
fn fenced(markdown: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim()) {
            (None, fence) if fence == format!("```{lang}") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// A command line's words as a shell splits them: quotes group, a
/// trailing `\` continues the line, a pipe ends the command.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, '|') => break,
            (None, '\\') => {}
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The guide's configuration and configuration.md's workload section load
/// into a running server (keys from a test JWKS file instead of each
/// issuer's), rules and policy examples as written, and `check` lists the
/// rules; every `talos-sso`
/// command of the guide parses with the CLI's own command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_configuration_loads_and_its_commands_parse() {
    use clap::Parser;

    let docs = examples().join("../../docs");
    let guide = std::fs::read_to_string(docs.join("workload-identity.md")).unwrap();
    let reference = std::fs::read_to_string(docs.join("configuration.md")).unwrap();
    let section = reference
        .split("\n## Workload issuers and rules\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("configuration.md has the workload section");
    let keys = WorkloadIssuer::new("https://keys.example", Alg::Rs256);
    for (document, markdown) in [("the guide", guide.as_str()), ("configuration.md", section)] {
        let block = fenced(markdown, "yaml")
            .into_iter()
            .find(|block| block.contains("trusted_issuers"))
            .unwrap_or_else(|| panic!("{document} shows a configuration"));
        let fragment: Value = serde_yaml_ng::from_str(&block).unwrap();
        let written: Vec<&str> = fragment["clusters"]["prod"]["workloads"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|rule| text(&rule["name"]))
            .collect();
        let cluster = Cluster::start(&fragment, &keys.jwks_file).await;
        let config = cluster.env.config();
        let loaded: Vec<&str> = config.clusters["prod"]
            .workloads
            .iter()
            .map(|rule| rule.name.as_str())
            .collect();
        assert_eq!(loaded, written, "{document}");
        // `check` lists each rule as it read it, as the guide says.
        let config_file = cluster.env.config_file();
        let checked = server_cli(&["check", "--config", config_file.to_str().unwrap()])
            .await
            .unwrap_or_else(|e| panic!("{document}: {e}"));
        for name in &written {
            assert!(
                checked.contains(&format!("cluster prod: workload rule {name}: ")),
                "{document}: {checked}"
            );
        }
        cluster.env.finish().await;
    }

    let mut commands = Vec::new();
    for block in fenced(&guide, "sh") {
        for line in block.replace("\\\n", " ").lines() {
            let words = shell_words(line);
            if words.first().map(String::as_str) == Some("talos-sso") {
                talos_sso::cli::Cli::try_parse_from(&words).unwrap_or_else(|e| panic!("{line}: {e}"));
                commands.push(words[1].clone());
            }
        }
    }
    for command in ["login", "deny", "audit"] {
        assert!(commands.iter().any(|c| c == command), "{command}: {commands:?}");
    }
}
