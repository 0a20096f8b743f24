//! A gateway cluster's per-method rules, on top of Talos's own role
//! checks: methods (exact, or a prefix ending in `*`) that need one of some
//! roles or groups, or are refused through the gateway outright. Every rule
//! that names a method applies to it; the first one the caller does not
//! satisfy refuses the call, by name. Checked at load, with the examples.

use crate::config::{MethodExample, MethodRuleConfig};

/// What the gateway knows of a caller: the certificate's roles and the
/// groups recorded when it was issued.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    pub roles: &'a [String],
    pub groups: &'a [String],
}

/// A rule refused the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleRefusal {
    pub rule: String,
    /// What the rule asks for, for the refusal's message.
    pub needs: String,
}

impl std::fmt::Display for RuleRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused by talos-sso gateway rule `{}`: {}",
            self.rule, self.needs
        )
    }
}

#[derive(Debug, Clone)]
struct MethodRule {
    name: String,
    patterns: Vec<Pattern>,
    roles: Vec<String>,
    /// Lower-cased.
    groups: Vec<String>,
    refuse: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    Prefix(String),
}

impl Pattern {
    fn matches(&self, method: &str) -> bool {
        match self {
            Pattern::Exact(exact) => method == exact,
            Pattern::Prefix(prefix) => method.starts_with(prefix.as_str()),
        }
    }
}

/// The rules of one gateway cluster, checked.
#[derive(Debug, Clone, Default)]
pub struct MethodRules {
    rules: Vec<MethodRule>,
}

/// Longest method pattern and rule name.
const MAX_PATTERN: usize = 200;

impl MethodRules {
    pub fn new(configs: &[MethodRuleConfig]) -> Result<Self, String> {
        let mut rules: Vec<MethodRule> = Vec::with_capacity(configs.len());
        for config in configs {
            let name = config.name.trim();
            if name.is_empty() || name.len() > 64 || name.chars().any(|c| c.is_control() || c == '`') {
                return Err(format!(
                    "gateway rule name {:?}: 1 to 64 printable characters, no backquote",
                    talos_sso_text::clean(&config.name, 64)
                ));
            }
            if rules.iter().any(|r| r.name == name) {
                return Err(format!("gateway rule `{name}` is named twice"));
            }
            if config.methods.is_empty() {
                return Err(format!("gateway rule `{name}` names no method"));
            }
            let patterns = config
                .methods
                .iter()
                .map(|method| pattern(name, method))
                .collect::<Result<Vec<_>, _>>()?;
            match (config.refuse, config.roles.is_empty() && config.groups.is_empty()) {
                (true, false) => {
                    return Err(format!(
                        "gateway rule `{name}` both refuses outright and names roles or groups: pick one"
                    ));
                }
                (false, true) => {
                    return Err(format!(
                        "gateway rule `{name}` needs `roles` or `groups` that may call its methods, \
                         or `refuse: true`"
                    ));
                }
                _ => {}
            }
            rules.push(MethodRule {
                name: name.to_owned(),
                patterns,
                roles: config.roles.clone(),
                groups: config.groups.iter().map(|g| g.to_lowercase()).collect(),
                refuse: config.refuse,
            });
        }
        Ok(Self { rules })
    }

    /// `Ok` when every rule naming `method` lets `caller` call it.
    pub fn check(&self, method: &str, caller: Caller<'_>) -> Result<(), RuleRefusal> {
        for rule in &self.rules {
            if !rule.patterns.iter().any(|p| p.matches(method)) {
                continue;
            }
            if rule.refuse {
                return Err(RuleRefusal {
                    rule: rule.name.clone(),
                    needs: "this method is not allowed through the gateway".into(),
                });
            }
            let by_role = caller.roles.iter().any(|r| rule.roles.contains(r));
            let by_group = caller
                .groups
                .iter()
                .any(|g| rule.groups.contains(&g.to_lowercase()));
            if !by_role && !by_group {
                let mut needs = Vec::new();
                if !rule.roles.is_empty() {
                    needs.push(format!("one of the roles {}", rule.roles.join(", ")));
                }
                if !rule.groups.is_empty() {
                    needs.push(format!(
                        "membership of one of the groups {}",
                        rule.groups.join(", ")
                    ));
                }
                return Err(RuleRefusal {
                    rule: rule.name.clone(),
                    needs: format!("needs {}", needs.join(" or ")),
                });
            }
        }
        Ok(())
    }

    /// The groups the rules name (recorded at issuance, so that the
    /// gateway can read them back).
    pub fn referenced_groups(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .flat_map(|r| r.groups.iter().map(String::as_str))
    }

    /// Check one example; the error says what was expected and what happened.
    pub fn check_example(&self, example: &MethodExample) -> Result<(), String> {
        let caller = Caller {
            roles: &example.roles,
            groups: &example.groups,
        };
        let got = match self.check(&example.method, caller) {
            Ok(()) => "allowed".to_owned(),
            Err(refusal) => refusal.rule,
        };
        if got == example.expect {
            return Ok(());
        }
        let said = |answer: &str| {
            if answer == "allowed" {
                "allowed".to_owned()
            } else {
                format!("refused by rule `{answer}`")
            }
        };
        Err(format!(
            "gateway example `{}` ({}) expected {} but was {}",
            example.description,
            example.method,
            said(&example.expect),
            said(&got)
        ))
    }
}

fn pattern(rule: &str, method: &str) -> Result<Pattern, String> {
    let bad = || {
        format!(
            "gateway rule `{rule}`: method {:?} is neither a full method name \
             (/machine.MachineService/Reset) nor a prefix ending in * (/machine.MachineService/Etcd*)",
            talos_sso_text::clean(method, 80)
        )
    };
    if !method.starts_with('/') || method.len() > MAX_PATTERN || !method.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(bad());
    }
    match method.strip_suffix('*') {
        Some(prefix) if !prefix.contains('*') => Ok(Pattern::Prefix(prefix.to_owned())),
        Some(_) => Err(bad()),
        None if method.contains('*') || method.matches('/').count() != 2 || method.ends_with('/') => {
            Err(bad())
        }
        None => Ok(Pattern::Exact(method.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, methods: &[&str], roles: &[&str], groups: &[&str], refuse: bool) -> MethodRuleConfig {
        MethodRuleConfig {
            name: name.into(),
            methods: methods.iter().map(|m| (*m).to_owned()).collect(),
            roles: roles.iter().map(|m| (*m).to_owned()).collect(),
            groups: groups.iter().map(|m| (*m).to_owned()).collect(),
            refuse,
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn every_matching_rule_must_be_satisfied() {
        let rules = MethodRules::new(&[
            rule(
                "reset-sre",
                &["/machine.MachineService/Reset"],
                &[],
                &["SRE-Oncall"],
                false,
            ),
            rule(
                "etcd-admins",
                &["/machine.MachineService/Etcd*"],
                &["os:admin"],
                &[],
                false,
            ),
            rule("no-upgrade", &["/machine.MachineService/Upgrade"], &[], &[], true),
        ])
        .unwrap();
        let admin = strings(&["os:admin"]);
        let sre = strings(&["sre-oncall"]);
        let none: Vec<String> = Vec::new();
        let check = |method: &str, roles: &[String], groups: &[String]| {
            rules.check(method, Caller { roles, groups }).map_err(|r| r.rule)
        };
        assert_eq!(
            check("/machine.MachineService/Reset", &admin, &none),
            Err("reset-sre".into())
        );
        assert_eq!(check("/machine.MachineService/Reset", &admin, &sre), Ok(()));
        assert_eq!(
            check("/machine.MachineService/EtcdRemoveMemberByID", &none, &sre),
            Err("etcd-admins".into())
        );
        assert_eq!(
            check("/machine.MachineService/EtcdRemoveMemberByID", &admin, &none),
            Ok(())
        );
        assert_eq!(
            check("/machine.MachineService/Upgrade", &admin, &sre),
            Err("no-upgrade".into())
        );
        assert_eq!(check("/machine.MachineService/Version", &none, &none), Ok(()));
        // A prefix is a prefix of the full name, not a substring.
        assert_eq!(check("/other.MachineService/EtcdStatus", &none, &none), Ok(()));
        let refusal = rules
            .check(
                "/machine.MachineService/Reset",
                Caller {
                    roles: &admin,
                    groups: &none,
                },
            )
            .unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "refused by talos-sso gateway rule `reset-sre`: needs membership of one of the groups sre-oncall"
        );
    }

    #[test]
    fn bad_rules_are_refused_with_their_name() {
        let refused = |r: MethodRuleConfig| MethodRules::new(&[r]).unwrap_err();
        assert!(refused(rule("a", &["Reset"], &["os:admin"], &[], false)).contains("neither a full method"));
        assert!(refused(rule("a", &["/machine.*/Reset"], &["os:admin"], &[], false)).contains("neither"));
        assert!(
            refused(rule(
                "a",
                &["/machine.MachineService/"],
                &["os:admin"],
                &[],
                false
            ))
            .contains("neither")
        );
        assert!(refused(rule("a", &[], &["os:admin"], &[], false)).contains("names no method"));
        assert!(refused(rule("a", &["/a.B/C"], &[], &[], false)).contains("`roles` or `groups`"));
        assert!(refused(rule("a", &["/a.B/C"], &["os:admin"], &[], true)).contains("pick one"));
        assert!(refused(rule("", &["/a.B/C"], &[], &[], true)).contains("1 to 64"));
        let twice = MethodRules::new(&[
            rule("a", &["/a.B/C"], &[], &[], true),
            rule("a", &["/a.B/D"], &[], &[], true),
        ]);
        assert!(twice.unwrap_err().contains("named twice"));
    }

    #[test]
    fn examples_say_what_they_expected() {
        let rules = MethodRules::new(&[rule(
            "no-reset",
            &["/machine.MachineService/Reset"],
            &[],
            &[],
            true,
        )])
        .unwrap();
        let example = |method: &str, expect: &str| MethodExample {
            description: "d".into(),
            method: method.into(),
            roles: strings(&["os:admin"]),
            groups: Vec::new(),
            expect: expect.into(),
        };
        assert!(
            rules
                .check_example(&example("/machine.MachineService/Reset", "no-reset"))
                .is_ok()
        );
        assert!(
            rules
                .check_example(&example("/machine.MachineService/Reboot", "allowed"))
                .is_ok()
        );
        assert_eq!(
            rules
                .check_example(&example("/machine.MachineService/Reset", "allowed"))
                .unwrap_err(),
            "gateway example `d` (/machine.MachineService/Reset) expected allowed but was refused by rule `no-reset`"
        );
    }
}
