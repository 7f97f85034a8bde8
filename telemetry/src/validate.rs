//! Validation of telemetry values on their way into a record batch.
//!
//! Policy (the same for every schema):
//!
//! * **Identity or time is broken → the row is rejected.** A negative timestamp, an empty
//!   cluster / node / GPU UUID / job id, or a non-finite or non-positive step time cannot be
//!   attributed or ordered, so the row is dropped and counted.
//! * **A row repeats the one before → it is rejected.** A GPU row (or a host row) with
//!   the same timestamp as the row accepted before it for the same GPU (or node) in the
//!   same file is a duplicate sample (a source retried, a replay overlapped), counted
//!   under `timestamp` / `duplicate`. Only the previous row of the open file is compared
//!   (one comparison per row), so a repeat of an older timestamp, or of the last row of
//!   a file already published, is kept.
//! * **A measured value is broken → that value is nulled.** NaN, ±∞, a negative value, or a
//!   value outside its physical range (a percentage above 100, more memory used than
//!   installed, a temperature above 200 °C) becomes null; the rest of the row is kept.
//!
//! Nothing is ever clamped or written as garbage, and nothing panics. Every rejected row
//! and every nulled value is counted in a [`ValidationReport`] under the column name and
//! an [`Issue`], so a dashboard can show *why* data is missing.

use std::collections::BTreeMap;

/// Why a value was nulled or a row rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Issue {
    /// NaN or ±infinity.
    NonFinite,
    /// A negative value where only non-negative values make sense.
    Negative,
    /// Finite and non-negative, but outside the physical range of the quantity.
    OutOfRange,
    /// A required identity string (cluster, node, uuid, job) was empty.
    Empty,
    /// The same GPU (or node) and timestamp as the row accepted before it.
    Duplicate,
}

impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Issue::NonFinite => "non-finite",
            Issue::Negative => "negative",
            Issue::OutOfRange => "out of range",
            Issue::Empty => "empty",
            Issue::Duplicate => "duplicate",
        })
    }
}

/// Counts of rows rejected and values nulled, by column and reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValidationReport {
    /// Rows offered for conversion.
    pub rows_in: u64,
    /// Rows dropped because their identity or time was invalid.
    pub rows_rejected: u64,
    /// Rows dropped, by the column that caused it and why.
    pub rejected: BTreeMap<(&'static str, Issue), u64>,
    /// Values replaced by null, by column and why.
    pub nulled: BTreeMap<(&'static str, Issue), u64>,
}

impl ValidationReport {
    /// Values of `column` nulled for `issue`.
    pub fn nulled_count(&self, column: &str, issue: Issue) -> u64 {
        self.nulled
            .iter()
            .filter(|((c, i), _)| *c == column && *i == issue)
            .map(|(_, n)| *n)
            .sum()
    }

    /// Rows rejected because of `column` for `issue`.
    pub fn rejected_count(&self, column: &str, issue: Issue) -> u64 {
        self.rejected
            .iter()
            .filter(|((c, i), _)| *c == column && *i == issue)
            .map(|(_, n)| *n)
            .sum()
    }

    /// All values nulled, over every column and reason.
    pub fn total_nulled(&self) -> u64 {
        self.nulled.values().sum()
    }

    /// `true` when nothing was nulled or rejected.
    pub fn is_clean(&self) -> bool {
        self.rows_rejected == 0 && self.nulled.is_empty()
    }

    /// Adds another report's counts to this one.
    pub fn merge(&mut self, other: &ValidationReport) {
        self.rows_in += other.rows_in;
        self.rows_rejected += other.rows_rejected;
        for (k, v) in &other.rejected {
            *self.rejected.entry(*k).or_default() += v;
        }
        for (k, v) in &other.nulled {
            *self.nulled.entry(*k).or_default() += v;
        }
    }

    pub(crate) fn reject(&mut self, column: &'static str, issue: Issue) {
        self.rows_rejected += 1;
        *self.rejected.entry((column, issue)).or_default() += 1;
    }

    pub(crate) fn null(&mut self, column: &'static str, issue: Issue) {
        *self.nulled.entry((column, issue)).or_default() += 1;
    }

    /// A non-negative, finite float no larger than `max`, or null with the reason counted.
    #[inline]
    pub(crate) fn f32_in(&mut self, column: &'static str, v: Option<f32>, max: f32) -> Option<f32> {
        let v = v?;
        match classify(f64::from(v), f64::from(max)) {
            None => Some(v),
            Some(issue) => {
                self.null(column, issue);
                None
            }
        }
    }

    /// A value no larger than `max`, or null with the reason counted.
    #[inline]
    pub(crate) fn at_most<T: PartialOrd>(
        &mut self,
        column: &'static str,
        v: Option<T>,
        max: T,
    ) -> Option<T> {
        let v = v?;
        if v > max {
            self.null(column, Issue::OutOfRange);
            None
        } else {
            Some(v)
        }
    }
}

/// `None` when `v` is finite, non-negative and at most `max`.
#[inline]
pub(crate) fn classify(v: f64, max: f64) -> Option<Issue> {
    if !v.is_finite() {
        Some(Issue::NonFinite)
    } else if v < 0.0 {
        Some(Issue::Negative)
    } else if v > max {
        Some(Issue::OutOfRange)
    } else {
        None
    }
}

/// One line for an operator: what was rejected and nulled, by column and reason, e.g.
/// `1 of 40 rows rejected (gpu_uuid empty ×1); 6 values nulled (sm_util_pct out of
/// range ×3, mem_used_bytes out of range ×3)`.
impl std::fmt::Display for ValidationReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn counts(
            f: &mut std::fmt::Formatter<'_>,
            by: &BTreeMap<(&'static str, Issue), u64>,
        ) -> std::fmt::Result {
            for (k, ((column, issue), n)) in by.iter().enumerate() {
                let sep = if k == 0 { "" } else { ", " };
                write!(f, "{sep}{column} {issue} ×{n}")?;
            }
            Ok(())
        }
        write!(
            f,
            "{} of {} rows rejected",
            self.rows_rejected, self.rows_in
        )?;
        if !self.rejected.is_empty() {
            f.write_str(" (")?;
            counts(f, &self.rejected)?;
            f.write_str(")")?;
        }
        write!(f, "; {} values nulled", self.total_nulled())?;
        if !self.nulled.is_empty() {
            f.write_str(" (")?;
            counts(f, &self.nulled)?;
            f.write_str(")")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_rejects_nan_inf_negative_and_out_of_range() {
        assert_eq!(classify(f64::NAN, 100.0), Some(Issue::NonFinite));
        assert_eq!(classify(f64::INFINITY, 100.0), Some(Issue::NonFinite));
        assert_eq!(classify(f64::NEG_INFINITY, 100.0), Some(Issue::NonFinite));
        assert_eq!(classify(-0.5, 100.0), Some(Issue::Negative));
        assert_eq!(classify(100.5, 100.0), Some(Issue::OutOfRange));
        assert_eq!(classify(100.0, 100.0), None);
        assert_eq!(classify(0.0, 100.0), None);
    }

    #[test]
    fn report_counts_and_merges() {
        let mut a = ValidationReport::default();
        assert_eq!(a.f32_in("x", Some(f32::NAN), 1.0), None);
        assert_eq!(a.f32_in("x", Some(0.5), 1.0), Some(0.5));
        assert_eq!(a.f32_in("x", None, 1.0), None);
        a.reject("ts", Issue::Negative);
        let mut b = ValidationReport::default();
        b.merge(&a);
        b.merge(&a);
        assert_eq!(b.nulled_count("x", Issue::NonFinite), 2);
        assert_eq!(b.rejected_count("ts", Issue::Negative), 2);
        assert_eq!(b.rows_rejected, 2);
        assert!(!b.is_clean());
        b.rows_in = 10;
        assert_eq!(
            b.to_string(),
            "2 of 10 rows rejected (ts negative ×2); 2 values nulled (x non-finite ×2)"
        );
        let clean = ValidationReport {
            rows_in: 5,
            ..ValidationReport::default()
        };
        assert_eq!(clean.to_string(), "0 of 5 rows rejected; 0 values nulled");
    }
}
