//! Audit records as people and tools read them: a table for the terminal,
//! CSV for spreadsheets, JSON lines and YAML for tools. The table escapes every text
//! from a record (see [`talos_sso_text::safe`]); JSON escapes control
//! characters itself; CSV keeps each value exact for the spreadsheet (the
//! server stores text already escaped) behind a guard against formulas
//! ([`talos_sso_text::csv`], the console's exports use the same).
//!
//! JSON lines written to a file or a pipe are exactly the lines the server
//! writes ([`StoredRecord::to_line`]), the only text of a record that
//! `audit verify --file` accepts; on a terminal, characters it could act on
//! are shown as `\u` escapes instead (the same JSON value, other bytes).

use std::io::Write;

use clap::ValueEnum;
use talos_sso_api::StoredRecord;
use talos_sso_api::audit::{api_call, event, format_micros};

/// How `audit list` and `audit export` show records.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum AuditOutput {
    /// For people.
    Table,
    /// JSON lines: one record per line, as the server writes it.
    Json,
    /// One YAML list of the records (the same fields as JSON), written a
    /// page at a time.
    Yaml,
    /// For spreadsheets.
    Csv,
    /// JSON lines in the Elastic Common Schema (`talos_sso_api::feed`).
    Ecs,
}

/// The CSV export's columns, by the names of the record's fields.
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

/// A record's values under [`AUDIT_COLUMNS`], in that order.
fn csv_row(stored: &StoredRecord) -> [String; 10] {
    let r = &stored.record;
    [
        stored.seq.to_string(),
        format_micros(r.occurred_at),
        r.event.clone(),
        r.outcome.clone(),
        text(&r.reason_code),
        text(&r.cluster),
        text(&r.username),
        r.roles_granted.join(" "),
        text(&r.serial),
        text(&r.client_ip),
    ]
}

/// An optional value as a cell: empty when absent.
fn text(value: &Option<String>) -> String {
    value.clone().unwrap_or_default()
}

/// The table's columns: heading, then the narrowest and the widest the
/// column may be (in characters). The widest bound keeps one long value
/// (which the server may have taken from anyone) from pushing the other
/// columns off screen; the full value is in the JSON and CSV outputs.
///
/// The stops are fixed rather than fitted to the values (as table crates
/// do): records are printed page by page as they arrive, so no column can
/// be sized to all of them, and fitting each page would move the columns
/// from one page to the next.
const TABLE_COLUMNS: [(&str, usize, usize); 7] = [
    ("SEQ", 6, 12),
    ("TIME", 27, 32),
    ("EVENT", 19, 24),
    ("OUTCOME", 24, 40),
    ("CLUSTER", 8, 24),
    ("USER", 24, 48),
    ("ROLES / CALL", 0, 64),
];

/// One table line: each value escaped (see [`talos_sso_text::bounded`]) and cut to
/// its column's widest, padded to its narrowest; SEQ aligned right.
fn table_line(cells: [&str; 7]) -> String {
    let mut line = String::new();
    for (index, ((_, narrowest, widest), text)) in TABLE_COLUMNS.iter().zip(cells).enumerate() {
        let text = talos_sso_text::bounded(text, *widest);
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

/// A record as pretty JSON, terminal-safe (see [`talos_sso_text::json`])
/// and still exactly the record.
pub(super) fn record_json(record: &StoredRecord) -> anyhow::Result<String> {
    Ok(talos_sso_text::json(&serde_json::to_string_pretty(record)?))
}

/// One page of records in `output`'s form; the heading (of the table or
/// the CSV) only when `header`, for the first page. `terminal`: `out` is a
/// terminal, where JSON lines are made safe rather than exact.
pub(super) fn print_records(
    records: &[StoredRecord],
    output: AuditOutput,
    header: bool,
    terminal: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    match output {
        AuditOutput::Ecs => {
            for record in records {
                let document = talos_sso_api::feed::ecs_document(record, None);
                writeln!(
                    out,
                    "{}",
                    talos_sso_text::json(&serde_json::to_string(&document)?)
                )?;
            }
        }
        AuditOutput::Yaml => {
            // Items of one list, page after page; an empty page writes
            // nothing (`[]` would end the list: see `print_no_records`).
            if !records.is_empty() {
                write!(out, "{}", super::format::yaml_text(records)?)?;
            }
        }
        AuditOutput::Json => {
            for record in records {
                let line = record.to_line();
                if terminal {
                    writeln!(out, "{}", talos_sso_text::json(&line))?;
                } else {
                    writeln!(out, "{line}")?;
                }
            }
        }
        AuditOutput::Csv => {
            // Written to memory, then out: the CSV writer's errors do not
            // keep an I/O error's kind, and a closed pipe must stay one
            // (see `cli::closed_pipe`).
            let mut csv = talos_sso_text::csv::Rows::new();
            if header {
                csv.push(AUDIT_COLUMNS)?;
            }
            for record in records {
                csv.push(csv_row(record))?;
            }
            out.write_all(&csv.into_bytes()?)?;
        }
        AuditOutput::Table => {
            if header {
                writeln!(
                    out,
                    "{}",
                    table_line(TABLE_COLUMNS.map(|(heading, _, _)| heading))
                )?;
            }
            for stored in records {
                let r = &stored.record;
                let outcome = match r.reason_code.as_deref() {
                    None | Some("") => r.outcome.clone(),
                    Some(reason) => format!("{} ({reason})", r.outcome),
                };
                let last = if r.event == event::API_CALL {
                    api_call_cell(&r.details)
                } else {
                    r.roles_granted.join(" ")
                };
                let cells = [
                    stored.seq.to_string(),
                    format_micros(r.occurred_at),
                    r.event.clone(),
                    outcome,
                    text(&r.cluster),
                    text(&r.username),
                    last,
                ];
                writeln!(out, "{}", table_line(cells.each_ref().map(String::as_str)))?;
            }
        }
    }
    Ok(())
}

/// An API call in the table's last column, compactly: its method, the
/// nodes (comma-separated), `×N` for a record counting N read-only calls,
/// and the gRPC status when it was not OK. Only strings and whole numbers
/// of `details` are shown; the table escapes them.
fn api_call_cell(details: &serde_json::Value) -> String {
    use serde_json::Value;
    let mut cell = details
        .get(api_call::METHOD)
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_owned();
    let nodes: Vec<&str> = details
        .get(api_call::NODES)
        .and_then(Value::as_array)
        .map(|nodes| nodes.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !nodes.is_empty() {
        cell.push(' ');
        cell.push_str(&nodes.join(","));
    }
    match details.get(api_call::CALLS).and_then(Value::as_i64) {
        Some(calls) if calls > 1 => cell.push_str(&format!(" ×{calls}")),
        _ => {}
    }
    match details.get(api_call::GRPC_STATUS).and_then(Value::as_i64) {
        Some(status) if status != 0 => cell.push_str(&format!(" gRPC {status}")),
        _ => {}
    }
    cell
}

/// What `output` writes when no record matched at all: YAML's empty list,
/// so that the output still parses as one; nothing for the line formats.
pub(super) fn print_no_records(output: AuditOutput, out: &mut dyn Write) -> anyhow::Result<()> {
    if output == AuditOutput::Yaml {
        writeln!(out, "[]")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::cli::tests::no_hostile_characters;

    /// A record as the server sends it: every field, `fields` over empty
    /// defaults.
    fn record(fields: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        let empty = StoredRecord {
            seq: 0,
            record: talos_sso_api::AuditRecord::default(),
            prev_hash: "0".repeat(64),
            hash: "f".repeat(64),
        };
        let serde_json::Value::Object(mut record) = serde_json::to_value(empty).unwrap() else {
            panic!("a record is an object");
        };
        record.extend(fields.as_object().unwrap().clone());
        record
    }

    /// `record` as the client reads it.
    fn typed(record: &serde_json::Map<String, serde_json::Value>) -> StoredRecord {
        serde_json::from_value(serde_json::Value::Object(record.clone())).unwrap()
    }

    /// `records` as printed to a terminal.
    fn render(records: &[serde_json::Map<String, serde_json::Value>], output: AuditOutput) -> String {
        render_to(records, output, true)
    }

    fn render_to(
        records: &[serde_json::Map<String, serde_json::Value>],
        output: AuditOutput,
        terminal: bool,
    ) -> String {
        let records: Vec<StoredRecord> = records.iter().map(typed).collect();
        let mut out = Vec::new();
        print_records(&records, output, true, terminal, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// One value as the CSV export writes it, quoted as needed.
    fn csv_field(text: &str) -> String {
        let mut csv = talos_sso_text::csv::Rows::new();
        csv.push([text]).unwrap();
        let line = String::from_utf8(csv.into_bytes().unwrap()).unwrap();
        line.strip_suffix('\n').unwrap().to_owned()
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
            "roles_granted": ["os:admin\u{202e}"],
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
    fn an_api_call_shows_its_method_and_nodes_compactly() {
        let call = record(json!({
            "seq": 9, "event": "api.call", "outcome": "failed", "username": "bob@example.com",
            "roles_granted": ["os:operator"],
            "details": {"method": "/machine.MachineService/Reboot", "nodes": ["10.5.0.2", "10.5.0.3"],
                        "class": "mutating", "grpc_status": 14, "calls": 1},
        }));
        let reads = record(json!({
            "seq": 10, "event": "api.call", "outcome": "success",
            "details": {"method": "/cosi.resource.State/List", "nodes": ["10.5.0.2", 7, "\u{1b}[31mx"],
                        "grpc_status": 0, "calls": 12},
        }));
        let table = render(&[call, reads], AuditOutput::Table);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[1].ends_with("  /machine.MachineService/Reboot 10.5.0.2,10.5.0.3 gRPC 14"),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains("  failed  "), "{}", lines[1]);
        assert!(
            lines[2].ends_with("  /cosi.resource.State/List 10.5.0.2,\\u{1b}[31mx ×12"),
            "{}",
            lines[2]
        );
        no_hostile_characters(&table);
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
                "{:>6}  {:<27}  {:<19}  {:<24}  {:<8}  {:<24}  ROLES / CALL",
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

    /// `talos-sso audit export | head`: the reader stops reading.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_pipe_stays_one_in_every_output() {
        // A full page: more than any writer buffers before it writes.
        let records = vec![typed(&ordinary_record()); 1000];
        for output in [
            AuditOutput::Table,
            AuditOutput::Json,
            AuditOutput::Yaml,
            AuditOutput::Csv,
            AuditOutput::Ecs,
        ] {
            let error = print_records(&records, output, true, false, &mut ClosedPipe).unwrap_err();
            assert!(crate::cli::closed_pipe(&error), "{output:?}: {error:?}");
        }
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
        let shown = record_json(&typed(&records[0])).unwrap();
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

    /// Pages of YAML items make one list, the records exactly.
    #[test]
    fn yaml_pages_make_one_list_of_the_exact_records() {
        let records = [hostile_record(), ordinary_record()];
        let typed_records: Vec<StoredRecord> = records.iter().map(typed).collect();
        let mut out = Vec::new();
        for page in typed_records.chunks(1) {
            print_records(page, AuditOutput::Yaml, false, true, &mut out).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        no_hostile_characters(&text);
        let back: Vec<serde_json::Map<String, serde_json::Value>> = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, records);
        let mut none = Vec::new();
        print_no_records(AuditOutput::Yaml, &mut none).unwrap();
        let back: Vec<serde_json::Value> = serde_yaml_ng::from_slice(&none).unwrap();
        assert!(back.is_empty());
    }

    /// To a file or a pipe, JSON lines are the server's own lines, which
    /// `audit verify --file` accepts: the terminal's escapes are the same
    /// value in other bytes, which it would refuse.
    #[test]
    fn json_lines_to_a_file_are_the_lines_the_server_writes() {
        let records = [hostile_record(), ordinary_record()];
        let exact = render_to(&records, AuditOutput::Json, false);
        let lines: Vec<&str> = exact.lines().collect();
        for (line, record) in lines.iter().zip(&records) {
            assert_eq!(*line, typed(record).to_line());
            assert_eq!(
                talos_sso_api::chain::read_record_line(line.as_bytes()),
                Ok(Some(typed(record)))
            );
        }
        assert!(exact.contains('\u{202e}'), "{exact}");
        let shown = render_to(&records, AuditOutput::Json, true);
        assert_ne!(shown, exact);
        assert!(talos_sso_api::chain::read_record_line(shown.lines().next().unwrap().as_bytes()).is_err());
    }
}
