//! What a parse kept and what it skipped, and why.

use std::fmt;

use serde::Serialize;

/// Details are kept for at most this many skipped rows; all of them are counted.
pub const MAX_SKIPPED_DETAILS: usize = 20;

/// One skipped row: where it is and which field made it unusable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedRow {
    /// 1-based line number in the source file.
    pub line: usize,
    /// The column at fault (`record` when the row itself could not be read).
    pub field: String,
    pub reason: String,
}

impl fmt::Display for SkippedRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, field `{}`: {}",
            self.line, self.field, self.reason
        )
    }
}

/// The outcome of parsing one file.
///
/// `rows_read` counts data rows (blank lines and the header excluded), kept or skipped;
/// `rows_skipped` counts all skipped rows, while `skipped` details only the first
/// [`MAX_SKIPPED_DETAILS`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ParseReport {
    pub source: String,
    pub rows_read: usize,
    pub rows_skipped: usize,
    pub skipped: Vec<SkippedRow>,
}

impl ParseReport {
    pub fn new(source: impl Into<String>) -> Self {
        ParseReport {
            source: source.into(),
            ..ParseReport::default()
        }
    }

    /// Rows that became jobs or nodes.
    pub fn rows_kept(&self) -> usize {
        self.rows_read.saturating_sub(self.rows_skipped)
    }

    pub(crate) fn skip(&mut self, line: usize, field: &str, reason: String) {
        self.rows_skipped += 1;
        if self.skipped.len() < MAX_SKIPPED_DETAILS {
            self.skipped.push(SkippedRow {
                line,
                field: field.to_string(),
                reason,
            });
        }
    }

    /// The error for a file none of whose rows could be used.
    pub(crate) fn no_valid_rows(&self) -> crate::DatasetError {
        crate::DatasetError::NoValidRows {
            file: self.source.clone(),
            rows_skipped: self.rows_skipped,
            first: self.skipped.first().cloned(),
        }
    }
}

impl ParseReport {
    /// (line, field) of each detailed skipped row, in order: what a test of a parser
    /// asserts.
    pub fn skipped_at(&self) -> Vec<(usize, &str)> {
        self.skipped
            .iter()
            .map(|s| (s.line, s.field.as_str()))
            .collect()
    }
}

impl fmt::Display for ParseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} rows read, {} kept, {} skipped",
            self.source,
            self.rows_read,
            self.rows_kept(),
            self.rows_skipped
        )?;
        if let Some(first) = self.skipped.first() {
            write!(f, " (first: {first})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_skip_but_details_only_the_first_few() {
        let mut report = ParseReport::new("x.csv");
        report.rows_read = 100;
        for line in 2..52 {
            report.skip(line, "cpu_milli", "negative value".into());
        }
        assert_eq!(report.rows_skipped, 50);
        assert_eq!(report.skipped.len(), MAX_SKIPPED_DETAILS);
        assert_eq!(report.skipped[0].line, 2);
        assert_eq!(report.rows_kept(), 50);
        let text = report.to_string();
        assert!(text.contains("50 skipped"), "{text}");
        assert!(text.contains("line 2, field `cpu_milli`"), "{text}");
    }
}
