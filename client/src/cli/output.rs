//! Audit records as people and tools read them: a table for the terminal,
//! CSV for spreadsheets, JSON lines for tools. Every text from a record is
//! escaped (see [`crate::display`]) before it reaches a terminal.

use std::io::Write;

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum AuditOutput {
    Table,
    Json,
    Csv,
}

const AUDIT_COLUMNS: [&str; 10] = [
    "seq",
    "occurred_at",
    "event",
    "outcome",
    "reason_code",
    "cluster",
    "username",
    "roles_granted",
    "serial",
    "client_ip",
];

fn cell(record: &serde_json::Map<String, serde_json::Value>, column: &str) -> String {
    match record.get(column) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// One CSV field. A value that starts like a formula (`=`, `+`, `-`, `@`,
/// TAB, CR) would be run by a spreadsheet opening the export, so it gets a
/// leading `'` (OWASP's advice) and is read as text; then the usual quoting.
fn csv_field(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

/// The table's columns: heading, then the narrowest and the widest the
/// column may be (in characters). The widest bound keeps one long value
/// (which the server may have taken from anyone) from pushing the other
/// columns off screen; the full value is in the JSON and CSV outputs.
const TABLE_COLUMNS: [(&str, usize, usize); 7] = [
    ("SEQ", 6, 12),
    ("TIME", 27, 32),
    ("EVENT", 19, 24),
    ("OUTCOME", 24, 40),
    ("CLUSTER", 8, 24),
    ("USER", 24, 48),
    ("ROLES", 0, 64),
];

/// One table line: each value escaped (see [`crate::display`]) and cut to
/// its column's widest, padded to its narrowest; SEQ aligned right.
fn table_line(cells: [&str; 7]) -> String {
    let mut line = String::new();
    for (index, ((_, narrowest, widest), text)) in TABLE_COLUMNS.iter().zip(cells).enumerate() {
        let text = crate::display::bounded(text, *widest);
        if index == 0 {
            line.push_str(&format!("{text:>narrowest$}"));
        } else if index == TABLE_COLUMNS.len() - 1 {
            line.push_str("  ");
            line.push_str(&text);
        } else {
            line.push_str(&format!("  {text:<narrowest$}"));
        }
    }
    line
}

/// A record as JSON, on one line or pretty, terminal-safe (see
/// [`crate::display::json`]) and still exactly the record.
pub(super) fn record_json(
    record: &serde_json::Map<String, serde_json::Value>,
    pretty: bool,
) -> anyhow::Result<String> {
    let text = if pretty {
        serde_json::to_string_pretty(record)?
    } else {
        serde_json::to_string(record)?
    };
    Ok(crate::display::json(&text))
}

pub(super) fn print_records(
    records: &[serde_json::Map<String, serde_json::Value>],
    output: AuditOutput,
    header: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match output {
        AuditOutput::Json => {
            for record in records {
                writeln!(out, "{}", record_json(record, false)?)?;
            }
        }
        AuditOutput::Csv => {
            if header {
                writeln!(out, "{}", AUDIT_COLUMNS.join(","))?;
            }
            for record in records {
                let row: Vec<String> = AUDIT_COLUMNS
                    .iter()
                    .map(|c| csv_field(&cell(record, c)))
                    .collect();
                writeln!(out, "{}", row.join(","))?;
            }
        }
        AuditOutput::Table => {
            if header {
                writeln!(
                    out,
                    "{}",
                    table_line(TABLE_COLUMNS.map(|(heading, _, _)| heading))
                )?;
            }
            for r in records {
                let outcome = match cell(r, "reason_code").as_str() {
                    "" => cell(r, "outcome"),
                    reason => format!("{} ({reason})", cell(r, "outcome")),
                };
                let cells = [
                    cell(r, "seq"),
                    cell(r, "occurred_at"),
                    cell(r, "event"),
                    outcome,
                    cell(r, "cluster"),
                    cell(r, "username"),
                    cell(r, "roles_granted"),
                ];
                writeln!(out, "{}", table_line(cells.each_ref().map(String::as_str)))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::tests::no_hostile_characters;

    fn record(fields: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        fields.as_object().unwrap().clone()
    }

    fn render(records: &[serde_json::Map<String, serde_json::Value>], output: AuditOutput) -> String {
        let mut out = Vec::new();
        print_records(records, output, true, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// A username that tries to erase its own row, forge another, hide text
    /// and recolour the terminal.
    const FORGED: &str = "mallory@example.com\u{1b}[2K\r     7  2026-01-01T00:00:00.000000Z  \
        certificate.issued  success  prod  bob@example.com\n\u{1b}[8m\u{202e}moc.elpmaxe@eve\u{2066}\
        \u{200b}\u{feff}\u{9b}31m\u{7f}\t\u{85}\u{2028}";

    fn hostile_record() -> serde_json::Map<String, serde_json::Value> {
        record(json!({
            "seq": 6,
            "occurred_at": "2026-01-01T00:00:00.000000Z",
            "event": "certificate.denied",
            "outcome": "denied",
            "reason_code": "no_matching_rule\u{1b}]8;;http://evil\u{7}",
            "cluster": "prod\r\n",
            "username": FORGED,
            "user_agent": "curl\u{1b}[1A",
            "roles_granted": ["os:admin\u{202e}", 5],
            "details": {"note": "\u{1b}c\u{2069}"},
        }))
    }

    fn ordinary_record() -> serde_json::Map<String, serde_json::Value> {
        record(json!({
            "seq": 7,
            "occurred_at": "2026-01-01T00:00:01.000000Z",
            "event": "certificate.issued",
            "outcome": "success",
            "reason_code": null,
            "cluster": "prod",
            "username": "bob@example.com",
            "roles_granted": ["os:operator"],
        }))
    }

    #[test]
    fn record_text_cannot_forge_recolour_or_hide_table_rows() {
        let table = render(&[hostile_record(), ordinary_record()], AuditOutput::Table);
        no_hostile_characters(&table);
        let lines: Vec<&str> = table.split('\n').collect();
        assert_eq!(lines.len(), 4, "a heading, two rows, the final newline: {table}");
        assert_eq!(lines[3], "");
        let row = lines[1];
        assert!(row.starts_with("     6  "), "{row}");
        assert!(row.contains("  prod\\u{d}\\u{a}  "), "{row}");
        assert!(row.contains("mallory@example.com\\u{1b}[2K\\u{d}"), "{row}");
        assert!(
            row.contains("  denied (no_matching_rule\\u{1b}]8;;http:…  "),
            "{row}"
        );
        assert!(row.ends_with("  os:admin\\u{202e}"), "{row}");
        assert!(lines[2].starts_with("     7  "), "{table}");
    }

    #[test]
    fn one_long_value_cannot_push_the_other_columns_off_screen() {
        let long = "c".repeat(10_000);
        let mut huge = ordinary_record();
        huge.insert("cluster".into(), json!(long));
        huge.insert("username".into(), json!(format!("{long}@example.com")));
        let table = render(&[huge.clone(), ordinary_record()], AuditOutput::Table);
        let lines: Vec<&str> = table.lines().collect();
        let widest: usize = TABLE_COLUMNS.iter().map(|(_, _, widest)| widest).sum::<usize>() + 2 * 6;
        for line in &lines {
            assert!(line.chars().count() <= widest, "{line}");
        }
        let cut_cluster = format!("  {}…  ", "c".repeat(23));
        let cut_user = format!("  {}…  ", "c".repeat(47));
        assert!(lines[1].contains(&cut_cluster), "{}", lines[1]);
        assert!(lines[1].contains(&cut_user), "{}", lines[1]);
        assert!(lines[1].ends_with("  os:operator"), "{}", lines[1]);
        // Ordinary values keep the layout they always had.
        assert_eq!(
            lines[0],
            format!(
                "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  ROLES",
                "SEQ", "TIME", "EVENT", "OUTCOME", "CLUSTER", "USER"
            )
        );
        assert_eq!(
            lines[2],
            format!(
                "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  {}",
                7,
                "2026-01-01T00:00:01.000000Z",
                "certificate.issued",
                "success",
                "prod",
                "bob@example.com",
                "os:operator"
            )
        );
        // JSON and CSV keep the whole value.
        let exported = render(std::slice::from_ref(&huge), AuditOutput::Json);
        let back: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(exported.trim_end()).unwrap();
        assert_eq!(back, huge);
        let csv = render(std::slice::from_ref(&huge), AuditOutput::Csv);
        assert_eq!(parse_csv(&csv)[1][5], long);
    }

    /// RFC 4180 as a spreadsheet reads it: quoted fields may hold commas,
    /// doubled quotes and line breaks.
    fn parse_csv(text: &str) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        let mut row = Vec::new();
        let mut field = String::new();
        let mut chars = text.chars().peekable();
        let mut quoted = false;
        while let Some(c) = chars.next() {
            match (quoted, c) {
                (true, '"') if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                (true, '"') => quoted = false,
                (true, c) => field.push(c),
                (false, '"') if field.is_empty() => quoted = true,
                (false, ',') => row.push(std::mem::take(&mut field)),
                (false, '\n') => {
                    row.push(std::mem::take(&mut field));
                    rows.push(std::mem::take(&mut row));
                }
                (false, c) => field.push(c),
            }
        }
        assert!(
            !quoted && field.is_empty() && row.is_empty(),
            "unterminated: {text:?}"
        );
        rows
    }

    #[test]
    fn csv_cells_cannot_become_formulas_and_quoting_stays_right() {
        let values = [
            "=HYPERLINK(\"http://evil.example/\",\"details\")",
            "=1+1",
            "+1+1",
            "-2+3",
            "@SUM(A1:A9)",
            "\tcmd",
            "\r=1",
            "a,b",
            "say \"hi\"",
            "two\nlines",
            "bob@example.com",
            "",
        ];
        let records: Vec<_> = values
            .iter()
            .map(|v| {
                let mut r = ordinary_record();
                r.insert("username".into(), json!(v));
                r.insert("cluster".into(), json!(v));
                r
            })
            .collect();
        let csv = render(&records, AuditOutput::Csv);
        let rows = parse_csv(&csv);
        assert_eq!(rows.len(), values.len() + 1, "{csv}");
        assert_eq!(rows[0], AUDIT_COLUMNS);
        for (value, row) in values.iter().zip(&rows[1..]) {
            assert_eq!(row.len(), AUDIT_COLUMNS.len(), "{row:?}");
            let formula = value.starts_with(['=', '+', '-', '@', '\t', '\r']);
            let expected = if formula {
                format!("'{value}")
            } else {
                value.to_string()
            };
            assert_eq!(row[5], expected, "cluster");
            assert_eq!(row[6], expected, "username");
            assert!(
                !row.iter().any(|f| f.starts_with(['=', '+', '@', '\t', '\r'])),
                "{row:?}"
            );
        }
        assert_eq!(csv_field("=1+1"), "'=1+1");
        assert_eq!(csv_field("=a,\"b\""), "\"'=a,\"\"b\"\"\"");
        assert_eq!(csv_field("\r\n=1"), "\"'\r\n=1\"");
        assert_eq!(csv_field("plain"), "plain");
    }

    #[test]
    fn json_output_is_exactly_the_record_and_terminal_safe() {
        let records = [hostile_record(), ordinary_record()];
        let lines = render(&records, AuditOutput::Json);
        no_hostile_characters(&lines);
        let back: Vec<serde_json::Map<String, serde_json::Value>> =
            lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(back, records);
        // `audit show`: the same, pretty.
        let shown = record_json(&records[0], true).unwrap();
        no_hostile_characters(&shown);
        let back: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, records[0]);
        assert!(
            shown.contains(r#""username": "mallory@example.com\u001b[2K\r"#),
            "{shown}"
        );
        assert!(
            shown.contains(r"\u202emoc.elpmaxe@eve\u2066\u200b\ufeff\u009b31m\u007f\t\u0085\u2028"),
            "{shown}"
        );
    }
}
