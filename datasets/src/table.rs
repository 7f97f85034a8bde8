//! A thin layer over `csv`: columns found by header name, rows with 1-based line numbers,
//! and field parsers whose errors say what is wrong, so that each trace parser is only its
//! mapping.

use csv::{ReaderBuilder, StringRecord, StringRecordsIntoIter};

use crate::{DatasetError, ParseReport};

/// Why a row is unusable: the column at fault and the reason.
#[derive(Debug)]
pub(crate) struct Bad {
    pub field: &'static str,
    pub reason: String,
}

impl Bad {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Bad {
            field,
            reason: reason.into(),
        }
    }
}

/// A column located in the header.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Col {
    index: usize,
    pub name: &'static str,
}

pub(crate) struct Table<'a> {
    file: &'a str,
    header: Vec<String>,
    records: StringRecordsIntoIter<&'a [u8]>,
    lines: LineCounter<'a>,
}

/// 1-based line numbers from byte offsets (`csv`'s own line count does not advance over
/// the empty lines it skips). Records come in order, so counting resumes where it
/// stopped.
#[derive(Debug)]
struct LineCounter<'a> {
    text: &'a [u8],
    byte: usize,
    line: usize,
}

impl LineCounter<'_> {
    fn line_at(&mut self, position: Option<&csv::Position>) -> usize {
        let Some(target) = position.and_then(|p| usize::try_from(p.byte()).ok()) else {
            return self.line;
        };
        // A record's position is where the reader resumed, before the empty lines it
        // skipped: step over them to the record itself.
        let mut target = target.min(self.text.len());
        while matches!(self.text.get(target), Some(b'\n' | b'\r')) {
            target += 1;
        }
        if target < self.byte {
            // Never expected; recount from the start rather than report a wrong line.
            self.byte = 0;
            self.line = 1;
        }
        self.line += self.text[self.byte..target]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        self.byte = target;
        self.line
    }
}

pub(crate) fn malformed(file: &str, line: usize, field: &str, reason: String) -> DatasetError {
    DatasetError::Malformed {
        file: file.to_string(),
        line,
        field: field.to_string(),
        reason,
    }
}

/// `bytes` as text, or a malformed-row error at the line and column of the first byte
/// that is not UTF-8: a trace edited on another system should point at the row to fix.
pub(crate) fn utf8_text<'b>(file: &str, bytes: &'b [u8]) -> Result<&'b str, DatasetError> {
    std::str::from_utf8(bytes).map_err(|e| not_utf8(file, bytes, e))
}

/// The error for `bytes` failing UTF-8 decoding with `e`.
pub(crate) fn not_utf8(file: &str, bytes: &[u8], e: std::str::Utf8Error) -> DatasetError {
    let valid = &bytes[..e.valid_up_to()];
    let line = 1 + valid.iter().filter(|&&b| b == b'\n').count();
    let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    malformed(
        file,
        line,
        "encoding",
        format!(
            "byte {} of the line (0x{:02x}) is not UTF-8; the file must be UTF-8 text",
            valid.len() - line_start + 1,
            bytes[e.valid_up_to()]
        ),
    )
}

impl std::fmt::Debug for Table<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("file", &self.file)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

fn is_blank(record: &StringRecord) -> bool {
    record.iter().all(|f| f.trim().is_empty())
}

impl<'a> Table<'a> {
    /// Reads the header (the first non-blank line). `expected` is the header the caller
    /// wants, quoted in errors.
    pub fn open(file: &'a str, text: &'a str, expected: &str) -> Result<Self, DatasetError> {
        Self::open_delimited(file, text, expected, b',')
    }

    /// [`Table::open`] for a file whose fields are separated by `delimiter`. Any delimiter
    /// but a comma turns quoting off: such files (`sacct --parsable2`, `|`) do not quote.
    pub fn open_delimited(
        file: &'a str,
        text: &'a str,
        expected: &str,
        delimiter: u8,
    ) -> Result<Self, DatasetError> {
        let mut records = ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .delimiter(delimiter)
            .quoting(delimiter == b',')
            .from_reader(text.as_bytes())
            .into_records();
        let mut lines = LineCounter {
            text: text.as_bytes(),
            byte: 0,
            line: 1,
        };
        let header = loop {
            match records.next() {
                None => {
                    return Err(malformed(
                        file,
                        1,
                        "header",
                        format!("empty file; expected header `{expected}`"),
                    ));
                }
                Some(Err(e)) => {
                    return Err(malformed(
                        file,
                        lines.line_at(e.position()),
                        "header",
                        e.to_string(),
                    ));
                }
                Some(Ok(r)) if is_blank(&r) => {}
                Some(Ok(r)) => {
                    break r
                        .iter()
                        .map(|h| h.trim_start_matches('\u{feff}').trim().to_string())
                        .collect::<Vec<_>>();
                }
            }
        };
        Ok(Table {
            file,
            header,
            records,
            lines,
        })
    }

    /// A file without a header line: `header` (comma-separated) names its columns, and
    /// its first line is data (line 1).
    pub fn open_headerless(file: &'a str, text: &'a str, header: &str) -> Self {
        let records = ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(text.as_bytes())
            .into_records();
        Table {
            file,
            header: header.split(',').map(|h| h.trim().to_string()).collect(),
            records,
            lines: LineCounter {
                text: text.as_bytes(),
                byte: 0,
                line: 1,
            },
        }
    }

    /// The header as read, for messages.
    pub fn header_line(&self) -> String {
        self.header.join(",")
    }

    pub fn has(&self, name: &str) -> bool {
        self.header.iter().any(|h| h == name)
    }

    /// Locates a required column; its absence is an error naming the file and the column.
    pub fn column(&self, name: &'static str, expected: &str) -> Result<Col, DatasetError> {
        self.locate(name, expected, |h| h == name)
    }

    /// [`Table::column`], ignoring ASCII case (`JobID`, `jobid`).
    pub fn column_ignore_case(
        &self,
        name: &'static str,
        expected: &str,
    ) -> Result<Col, DatasetError> {
        self.locate(name, expected, |h| h.eq_ignore_ascii_case(name))
    }

    /// An optional column, ignoring ASCII case.
    pub fn find_ignore_case(&self, name: &'static str) -> Option<Col> {
        self.header
            .iter()
            .position(|h| h.eq_ignore_ascii_case(name))
            .map(|index| Col { index, name })
    }

    fn locate(
        &self,
        name: &'static str,
        expected: &str,
        matches: impl Fn(&str) -> bool,
    ) -> Result<Col, DatasetError> {
        let mut found = self.header.iter().enumerate().filter(|(_, h)| matches(h));
        match (found.next(), found.next()) {
            // Two columns of one name: which one the writer meant is unknowable, and
            // taking the first would read the wrong values without a word.
            (Some((first, _)), Some((second, _))) => Err(malformed(
                self.file,
                1,
                name,
                format!(
                    "the header names this column twice (fields {} and {}): `{}`",
                    first + 1,
                    second + 1,
                    self.header_line()
                ),
            )),
            (Some((index, _)), None) => Ok(Col { index, name }),
            (None, _) => Err(malformed(
                self.file,
                1,
                name,
                format!(
                    "missing column; the header is `{}`, expected `{expected}`",
                    self.header_line()
                ),
            )),
        }
    }

    /// Feeds every non-blank data row to `f`; a row `f` rejects is counted as skipped with
    /// its line and field. Blank lines are neither read nor skipped.
    pub fn for_each_row(
        self,
        report: &mut ParseReport,
        mut f: impl FnMut(&Row<'_>) -> Result<(), Bad>,
    ) {
        let mut lines = self.lines;
        for result in self.records {
            match result {
                Err(e) => {
                    report.rows_read += 1;
                    report.skip(lines.line_at(e.position()), "record", e.to_string());
                }
                Ok(record) if is_blank(&record) => {}
                Ok(record) => {
                    report.rows_read += 1;
                    let row = Row {
                        line: lines.line_at(record.position()),
                        record: &record,
                    };
                    if let Err(bad) = f(&row) {
                        report.skip(row.line, bad.field, bad.reason);
                    }
                }
            }
        }
    }
}

/// One data row.
#[derive(Debug)]
pub(crate) struct Row<'r> {
    pub line: usize,
    record: &'r StringRecord,
}

impl Row<'_> {
    /// The field without surrounding whitespace, possibly empty. (Trimming here rather
    /// than in the reader avoids copying every record.)
    pub fn get(&self, col: Col) -> Result<&str, Bad> {
        self.record.get(col.index).map(str::trim).ok_or_else(|| {
            Bad::new(
                col.name,
                format!("missing: the row has only {} fields", self.record.len()),
            )
        })
    }

    /// A field that must not be empty.
    pub fn text(&self, col: Col) -> Result<&str, Bad> {
        match self.get(col)? {
            "" => Err(Bad::new(col.name, "empty")),
            s => Ok(s),
        }
    }

    /// A non-negative integer that fits `T`.
    pub fn uint<T: TryFrom<u64>>(&self, col: Col) -> Result<T, Bad> {
        parse_uint(self.get(col)?).map_err(|reason| Bad::new(col.name, reason))
    }

    /// A finite, non-negative number of seconds.
    pub fn seconds(&self, col: Col) -> Result<f64, Bad> {
        parse_seconds(self.get(col)?).map_err(|reason| Bad::new(col.name, reason))
    }

    /// A trace's submission time, duration or deadline in seconds ([`parse_trace_seconds`]).
    pub fn time_s(&self, col: Col) -> Result<f64, Bad> {
        parse_trace_seconds(self.get(col)?).map_err(|reason| Bad::new(col.name, reason))
    }
}

/// Parses a non-negative integer. Whole-valued decimals (`8.0`) are accepted because some
/// exports write every number as a float.
pub(crate) fn parse_uint<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    let value = match s.parse::<u64>() {
        Ok(v) => v,
        Err(_) => match s.parse::<f64>() {
            Ok(v) if v.is_nan() => return Err(format!("not a number ({s})")),
            Ok(v) if v < 0.0 => return Err(format!("negative value {s}")),
            Ok(v) if v.is_finite() && v.fract() == 0.0 && v < u64::MAX as f64 => v as u64,
            Ok(_) => return Err(format!("{s} is not a whole number")),
            Err(_) => return Err(format!("not a number: {s:?}")),
        },
    };
    T::try_from(value).map_err(|_| format!("{s} is too large"))
}

/// Parses a finite, non-negative number of seconds.
pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    if s.is_empty() {
        return Err("empty".into());
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_nan() => Err(format!("not a number ({s})")),
        Ok(v) if !v.is_finite() => Err(format!("{s} is not finite")),
        Ok(v) if v < 0.0 => Err(format!("negative value {s}")),
        Ok(v) => Ok(v),
        Err(_) => Err(format!("not a number: {s:?}")),
    }
}

/// The largest time or duration a trace may hold, 10¹² s (some 30,000 years): beyond
/// it, sums of times lose whole seconds and a replay's clock would never reach it.
pub const MAX_TRACE_SECONDS: f64 = 1e12;

/// A trace's time or duration: [`parse_seconds`], at most [`MAX_TRACE_SECONDS`].
pub(crate) fn parse_trace_seconds(s: &str) -> Result<f64, String> {
    match parse_seconds(s)? {
        // Unix time in milliseconds or microseconds lands here: say so.
        v if v > MAX_TRACE_SECONDS && v < 1e17 => Err(format!(
            "{s} s is beyond any trace (at most 1e12 s; Unix time in milliseconds or \
             microseconds? times are in seconds)"
        )),
        v if v > MAX_TRACE_SECONDS => Err(format!("{s} s is beyond any trace (at most 1e12 s)")),
        v => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_named_twice_in_the_header_is_refused() {
        let table = Table::open("t.csv", "a,b,A,a\n1,2,3,4\n", "a,b").unwrap();
        let err = table.column("a", "a,b").unwrap_err().to_string();
        assert!(
            err.contains(
                "t.csv, line 1, field `a`: the header names this column twice (fields 1 and 4)"
            ),
            "{err}"
        );
        assert_eq!(table.column("b", "a,b").unwrap().index, 1);
        let err = table.column_ignore_case("b", "a,b");
        assert!(err.is_ok());
        assert!(table.column_ignore_case("a", "a,b").is_err());
    }

    #[test]
    fn a_byte_that_is_not_utf8_is_reported_at_its_line_and_column() {
        let bytes = b"name,gpus\njob-1,2\njo\xffb-2,4\n";
        let err = utf8_text("trace.csv", bytes).unwrap_err().to_string();
        assert!(
            err.starts_with("trace.csv, line 3, field `encoding`"),
            "{err}"
        );
        assert!(err.contains("byte 3 of the line (0xff)"), "{err}");
        assert_eq!(utf8_text("t.csv", b"a,b\n1,2\n").unwrap(), "a,b\n1,2\n");
    }

    #[test]
    fn integers_reject_negative_nan_fractions_and_overflow_with_reasons() {
        assert_eq!(parse_uint::<u32>("12000"), Ok(12000));
        assert_eq!(parse_uint::<u16>("8.0"), Ok(8));
        assert!(parse_uint::<u32>("-5").unwrap_err().contains("negative"));
        assert!(
            parse_uint::<u32>("NaN")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(parse_uint::<u32>("1.5").unwrap_err().contains("whole"));
        assert!(
            parse_uint::<u32>("abc")
                .unwrap_err()
                .contains("not a number")
        );
        assert!(
            parse_uint::<u16>("70000")
                .unwrap_err()
                .contains("too large")
        );
        assert_eq!(parse_uint::<u32>(""), Err("empty".to_string()));
    }

    #[test]
    fn seconds_must_be_finite_and_non_negative() {
        assert_eq!(parse_seconds("66.0"), Ok(66.0));
        assert!(parse_seconds("nan").unwrap_err().contains("not a number"));
        assert!(parse_seconds("inf").unwrap_err().contains("finite"));
        assert!(parse_seconds("-1").unwrap_err().contains("negative"));
        assert_eq!(
            parse_seconds("1e308"),
            Ok(1e308),
            "not every number is a time"
        );
        assert_eq!(parse_trace_seconds("1e12"), Ok(1e12));
        assert!(
            parse_trace_seconds("1e308")
                .unwrap_err()
                .contains("beyond any trace")
        );
        assert!(parse_trace_seconds("-1").unwrap_err().contains("negative"));
    }

    #[test]
    fn header_is_the_first_non_blank_line_and_rows_carry_file_line_numbers() {
        let text = "\na,b\n1,2\n\n\n3\n\"x\ny\",-1\n";
        let table = Table::open("t.csv", text, "a,b").unwrap();
        let b = table.column("b", "a,b").unwrap();
        let mut report = ParseReport::new("t.csv");
        let mut seen = Vec::new();
        table.for_each_row(&mut report, |row| {
            seen.push((row.line, row.uint::<u32>(b)?));
            Ok(())
        });
        assert_eq!(seen, vec![(3, 2)]);
        assert_eq!(report.rows_read, 3);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(got, vec![(6, "b"), (7, "b")]);
        assert!(report.skipped[0].reason.contains("missing"));
        assert!(report.skipped[1].reason.contains("negative"));
    }

    #[test]
    fn empty_text_and_missing_columns_are_errors_naming_the_file() {
        let err = Table::open("e.csv", " \n", "a,b").unwrap_err().to_string();
        assert!(err.contains("e.csv") && err.contains("empty file"), "{err}");
        let table = Table::open("m.csv", "a\n1\n", "a,b").unwrap();
        let err = table.column("b", "a,b").unwrap_err().to_string();
        assert!(err.contains("m.csv") && err.contains("`b`"), "{err}");
    }
}
