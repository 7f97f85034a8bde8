//! Hive-style partition paths and UTC calendar dates.
//!
//! Layout under a telemetry root:
//!
//! ```text
//! kind=gpu/date=2025-03-14/node=gpu-node-017/part-000003.parquet
//! kind=node/date=2025-03-14/node=gpu-node-017/part-000001.parquet
//! kind=step/date=2025-03-14/part-000001.parquet
//! ```
//!
//! * `date` is the UTC calendar day of every row in the file (a file never spans two).
//! * `node` is percent-encoded: bytes outside `[A-Za-z0-9._-]` become `%XX`, so a node
//!   name can never escape its directory or collide with the `key=value` syntax.
//! * Files being written are hidden (`.part-000004.parquet.tmp`); readers ignore them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::schema::TelemetryKind;

/// Microseconds in a day.
pub const DAY_US: i64 = 86_400_000_000;

/// A UTC calendar day, stored as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date(pub i64);

impl Date {
    /// The day a timestamp (µs since the epoch) falls on.
    pub fn of_us(ts_us: i64) -> Self {
        Date(ts_us.div_euclid(DAY_US))
    }

    /// First microsecond of the day.
    pub fn start_us(self) -> i64 {
        self.0.saturating_mul(DAY_US)
    }

    /// First microsecond of the next day.
    pub fn end_us(self) -> i64 {
        (self.0 + 1).saturating_mul(DAY_US)
    }

    /// `(year, month, day)` in the proleptic Gregorian calendar.
    pub fn ymd(self) -> (i64, u32, u32) {
        // Howard Hinnant's civil_from_days.
        let z = self.0 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let y = yoe + era * 400 + i64::from(m <= 2);
        (y, m, d)
    }

    /// The day with the given calendar date, if it exists. Years beyond a million either
    /// way are refused: a directory name is input, and the arithmetic below overflows
    /// near `i64`'s limits; every day an `i64` of microseconds reaches (years up to
    /// about 294,000) stays inside.
    pub fn from_ymd(y: i64, m: u32, d: u32) -> Option<Self> {
        if !(-MAX_YEAR..=MAX_YEAR).contains(&y)
            || !(1..=12).contains(&m)
            || d == 0
            || d > days_in_month(y, m)
        {
            return None;
        }
        // Howard Hinnant's days_from_civil.
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let m = i64::from(m);
        let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        Some(Date(era * 146_097 + doe - 719_468))
    }

    /// Parses `YYYY-MM-DD`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.splitn(3, '-');
        let y = it.next()?.parse().ok()?;
        let m = it.next()?.parse().ok()?;
        let d = it.next()?.parse().ok()?;
        Self::from_ymd(y, m, d)
    }
}

/// See [`Date::from_ymd`].
const MAX_YEAR: i64 = 1_000_000;

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        _ => 31,
    }
}

impl std::fmt::Display for Date {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (y, m, d) = self.ymd();
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

/// Percent-encodes a partition value (`[A-Za-z0-9._-]` pass through).
pub fn encode_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    // "." and ".." would be path components with a meaning of their own.
    if out == "." || out == ".." || out.is_empty() {
        out = out.bytes().map(|b| format!("%{b:02X}")).collect();
        if out.is_empty() {
            out.push_str("%00");
        }
    }
    out
}

/// Reverses [`encode_value`]; `None` for a malformed escape.
pub fn decode_value(v: &str) -> Option<String> {
    if v == "%00" {
        return Some(String::new());
    }
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = v.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The partition a file belongs to, parsed from (or rendered into) its directory path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Partition {
    /// `kind=`.
    pub kind: TelemetryKind,
    /// `date=`, the UTC day of every row in the file.
    pub date: Date,
    /// `node=`, for per-node kinds.
    pub node: Option<String>,
}

impl Partition {
    /// The directory of this partition, relative to the telemetry root.
    pub fn rel_dir(&self) -> PathBuf {
        let mut p = PathBuf::from(format!("kind={}", self.kind));
        p.push(format!("date={}", self.date));
        if let Some(node) = &self.node {
            p.push(format!("node={}", encode_value(node)));
        }
        p
    }

    /// Parses the `key=value` components of a path relative to the root. Unknown keys are
    /// kept in the returned map; `None` if `kind` or `date` is missing or malformed.
    pub fn parse(rel_dir: &Path) -> Option<(Self, BTreeMap<String, String>)> {
        let mut keys = BTreeMap::new();
        for comp in rel_dir.components() {
            let s = comp.as_os_str().to_str()?;
            let (k, v) = s.split_once('=')?;
            keys.insert(k.to_string(), decode_value(v)?);
        }
        let kind = TelemetryKind::parse(keys.get("kind")?)?;
        let date = Date::parse(keys.get("date")?)?;
        let node = keys.get("node").cloned();
        Some((Partition { kind, date, node }, keys))
    }
}

/// Prefix of data files written by the sink.
pub const PART_PREFIX: &str = "part-";
/// Prefix of data files written by `compact`.
pub const COMPACT_PREFIX: &str = "compact-";
/// Suffix of every data file.
pub const PARQUET_SUFFIX: &str = ".parquet";
/// Suffix of files still being written.
pub const TMP_SUFFIX: &str = ".tmp";

/// Name of the data file with sequence number `seq`.
pub fn part_name(prefix: &str, seq: u64) -> String {
    format!("{prefix}{seq:06}{PARQUET_SUFFIX}")
}

/// The hidden temporary name a file is written under before being renamed to `final_name`.
pub fn tmp_name(final_name: &str) -> String {
    format!(".{final_name}{TMP_SUFFIX}")
}

/// `true` for names a reader must not open: hidden or temporary files.
pub fn is_hidden_or_tmp(name: &str) -> bool {
    name.starts_with('.') || name.starts_with('_') || name.ends_with(TMP_SUFFIX)
}

/// The sequence number in a data-file name (visible or temporary), if it is one of ours.
pub fn seq_of(name: &str) -> Option<u64> {
    let name = name.strip_prefix('.').unwrap_or(name);
    let name = name.strip_suffix(TMP_SUFFIX).unwrap_or(name);
    let stem = name.strip_suffix(PARQUET_SUFFIX)?;
    let digits = stem
        .strip_prefix(PART_PREFIX)
        .or_else(|| stem.strip_prefix(COMPACT_PREFIX))?;
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        for (s, days) in [
            ("1970-01-01", 0),
            ("1969-12-31", -1),
            ("2000-02-29", 11_016),
            ("2024-12-31", 20_088),
            ("2025-03-01", 20_148),
        ] {
            let d = Date::parse(s).unwrap();
            assert_eq!(d.0, days, "{s}");
            assert_eq!(d.to_string(), s);
        }
        assert!(Date::parse("2025-02-29").is_none());
        assert!(Date::parse("2025-13-01").is_none());
        assert!(Date::parse("garbage").is_none());
        // A directory name is input: a year near i64's limits is not a date (its
        // arithmetic overflowed), while the last day of i64 microseconds still is.
        assert!(Date::parse("100000000000000000-01-01").is_none());
        let last = Date::of_us(i64::MAX);
        assert_eq!(Date::parse(&last.to_string()), Some(last));
        for day in -1000..30_000 {
            let d = Date(day);
            assert_eq!(Date::parse(&d.to_string()), Some(d));
        }
        assert_eq!(Date::of_us(-1), Date(-1));
        assert_eq!(Date::of_us(DAY_US), Date(1));
    }

    #[test]
    fn partition_path_round_trip_and_escaping() {
        let p = Partition {
            kind: TelemetryKind::Gpu,
            date: Date::parse("2025-03-14").unwrap(),
            node: Some("rack 3/node=7".into()),
        };
        let dir = p.rel_dir();
        assert_eq!(
            dir,
            PathBuf::from("kind=gpu/date=2025-03-14/node=rack%203%2Fnode%3D7")
        );
        let (back, keys) = Partition::parse(&dir).unwrap();
        assert_eq!(back, p);
        assert_eq!(keys["node"], "rack 3/node=7");
        for odd in ["..", ".", ""] {
            let enc = encode_value(odd);
            assert!(enc != "." && enc != ".." && !enc.is_empty());
            assert_eq!(decode_value(&enc).as_deref(), Some(odd));
        }
    }

    #[test]
    fn file_names() {
        assert_eq!(part_name(PART_PREFIX, 3), "part-000003.parquet");
        assert_eq!(tmp_name("part-000003.parquet"), ".part-000003.parquet.tmp");
        assert_eq!(seq_of("part-000003.parquet"), Some(3));
        assert_eq!(seq_of(".part-000004.parquet.tmp"), Some(4));
        assert_eq!(seq_of("compact-000010.parquet"), Some(10));
        assert_eq!(seq_of("notes.txt"), None);
        assert!(is_hidden_or_tmp(".part-000004.parquet.tmp"));
        assert!(!is_hidden_or_tmp("part-000004.parquet"));
    }
}
