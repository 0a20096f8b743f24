//! A scenario's outcome: its figures, its failures and the verdict.

use std::collections::BTreeMap;

use super::load::Attempt;
use super::trail::TrailCheck;

/// One scenario's outcome: figures as lines, and a verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub name: String,
    pub lines: Vec<String>,
    pub failures: Vec<String>,
}

impl Report {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    pub fn say(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("[{}] {line}", self.name);
        self.lines.push(line);
    }

    /// Record a broken expectation (the scenario fails, and goes on).
    pub fn expect(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        if ok {
            self.say(format!("ok: {what}"));
        } else {
            self.say(format!("FAILED: {what}"));
            self.failures.push(what);
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    pub fn verdict(&self) -> String {
        if self.passed() {
            format!("{}: PASS", self.name)
        } else {
            format!("{}: FAIL ({})", self.name, self.failures.join("; "))
        }
    }

    /// Counts by answer, longest latency, and the trail check's figures.
    pub fn attempts(&mut self, attempts: &[Attempt]) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for attempt in attempts {
            *counts.entry(attempt.label()).or_default() += 1;
        }
        let longest = attempts.iter().map(|a| a.latency).max().unwrap_or_default();
        self.say(format!(
            "{} requests: {}; longest answer {:.2} s",
            attempts.len(),
            counts
                .iter()
                .map(|(label, n)| format!("{n} × {label}"))
                .collect::<Vec<_>>()
                .join(", "),
            longest.as_secs_f64()
        ));
    }

    pub fn trail(&mut self, check: &TrailCheck, verify: &Result<String, String>) {
        self.say(format!(
            "trail: {} records, {} certificate.issued rows, {} received certificates each matched to one row",
            check.records, check.issued_rows, check.delivered
        ));
        for (serial, seen) in &check.recorded_not_delivered {
            self.say(format!(
                "recorded, not delivered: serial {serial} (the client saw: {seen})"
            ));
        }
        for problem in &check.problems {
            self.expect(false, problem.clone());
        }
        self.expect(
            check.problems.is_empty(),
            "every received certificate has exactly one row, every row a request",
        );
        match verify {
            Ok(text) => self.expect(
                text.contains("audit chain intact"),
                format!("`audit verify`: {}", text.trim()),
            ),
            Err(error) => self.expect(false, format!("`audit verify` failed: {error}")),
        }
    }
}
