//! CSV for spreadsheets: the console's exports and the CLI's `--output
//! csv`. Values are kept exact (the server stores text already escaped);
//! the `csv` crate quotes what needs quoting (RFC 4180), and one guard
//! keeps a cell from being run as a formula by the spreadsheet that opens
//! the file.

use std::borrow::Cow;

pub use ::csv::Error;

/// One cell made safe for a spreadsheet. A value that starts like a
/// formula (`=`, `+`, `-`, `@`, TAB, CR) would be run by a spreadsheet
/// opening the export, so it gets a leading `'` (OWASP's advice) and is
/// read as text; the writer then quotes it as needed.
pub fn not_a_formula(cell: &str) -> Cow<'_, str> {
    if cell.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        Cow::Owned(format!("'{cell}"))
    } else {
        Cow::Borrowed(cell)
    }
}

/// Rows written to memory, each cell through [`not_a_formula`], each row
/// ending in `\n`. To memory, then out by the caller: the CSV writer's
/// errors do not keep an I/O error's kind, and a closed pipe must stay one.
#[derive(Debug)]
pub struct Rows {
    writer: ::csv::Writer<Vec<u8>>,
}

impl Default for Rows {
    fn default() -> Self {
        Self::new()
    }
}

impl Rows {
    pub fn new() -> Self {
        Self {
            writer: ::csv::Writer::from_writer(Vec::new()),
        }
    }

    /// Add one row.
    pub fn push<I, S>(&mut self, cells: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.writer.write_record(
            cells
                .into_iter()
                .map(|cell| not_a_formula(cell.as_ref()).into_owned()),
        )
    }

    /// The rows written so far.
    pub fn into_bytes(self) -> Result<Vec<u8>, Error> {
        self.writer.into_inner().map_err(|e| Error::from(e.into_error()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cells: &[&str]) -> String {
        let mut rows = Rows::new();
        rows.push(cells).unwrap();
        String::from_utf8(rows.into_bytes().unwrap()).unwrap()
    }

    #[test]
    fn cells_are_quoted_and_never_formulas() {
        assert_eq!(line(&["plain"]), "plain\n");
        assert_eq!(line(&["a,b"]), "\"a,b\"\n");
        assert_eq!(line(&["say \"hi\""]), "\"say \"\"hi\"\"\"\n");
        assert_eq!(line(&["=HYPERLINK(\"x\")"]), "\"'=HYPERLINK(\"\"x\"\")\"\n");
        assert_eq!(line(&["-1"]), "'-1\n");
        assert_eq!(line(&["line\nbreak"]), "\"line\nbreak\"\n");
        assert_eq!(line(&["=1+1"]), "'=1+1\n");
        assert_eq!(line(&["=a,\"b\""]), "\"'=a,\"\"b\"\"\"\n");
        assert_eq!(line(&["\r\n=1"]), "\"'\r\n=1\"\n");
        assert_eq!(line(&["a", "", "+b"]), "a,,'+b\n");
    }
}
