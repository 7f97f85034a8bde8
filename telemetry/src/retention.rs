//! Retention: deleting whole days of telemetry once they are older than a horizon.
//!
//! Design decisions:
//!
//! * **By the data's day, not the file's age.** A partition's `date=` is the UTC day of
//!   every row in it, so a day goes once *all* of it is older than the horizon: the
//!   partitions dated before the day that `now − retention` falls on. A row is therefore
//!   kept at least `retention` and at most a day longer. File modification times would
//!   keep a backfilled day for another whole retention, and would differ between copies.
//! * **Only our files.** Inside an expired partition, only data files the sink or
//!   `compact` wrote (`part-…`/`compact-…` `.parquet`, and their hidden `.tmp` forms) are
//!   deleted; anything else is left with its directory and reported, so a retention set
//!   on the wrong directory cannot empty it.
//! * **A partition in use is left alone.** The sink passes the directories it has open or
//!   waiting to be published, and they are skipped until the next sweep: retention never
//!   deletes a file under the writer.
//! * **Errors are reported, not fatal.** A file that cannot be deleted stays, the sweep
//!   goes on, and the next sweep tries again.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::partition::{Date, seq_of};
use crate::schema::TelemetryKind;

/// What a sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Expired partition directories whose data files were all deleted (and which were
    /// removed, unless something else was left in them).
    pub partitions: Vec<PathBuf>,
    /// Data files deleted.
    pub files: u64,
    /// Bytes in those files.
    pub bytes: u64,
    /// Expired partitions skipped because the caller is writing them.
    pub in_use: Vec<PathBuf>,
    /// Files in expired partitions that are not telemetry data files, left in place.
    pub foreign: Vec<PathBuf>,
    /// Deletions or listings that failed (path: reason).
    pub errors: Vec<String>,
}

/// The first day kept by a retention of `retention` at `now`: the day `now − retention`
/// falls on. `None` when that is before the epoch (nothing is old enough to go).
pub fn first_day_kept(now: SystemTime, retention: Duration) -> Option<Date> {
    let cutoff = now.checked_sub(retention)?;
    let us = cutoff.duration_since(UNIX_EPOCH).ok()?.as_micros();
    Some(Date::of_us(i64::try_from(us).ok()?))
}

/// Deletes the telemetry partitions under `root` dated before `keep_from`, except those
/// at or below a directory in `in_use`.
///
/// A root that does not exist has nothing to prune (an empty report); one that cannot
/// be listed is an error in the report.
pub fn prune_before(root: &Path, keep_from: Date, in_use: &HashSet<PathBuf>) -> PruneReport {
    let mut report = PruneReport::default();
    for kind_dir in subdirs(root, &mut report) {
        let kind = key_value(&kind_dir, "kind").and_then(TelemetryKind::parse);
        if kind.is_none() {
            continue;
        }
        for date_dir in subdirs(&kind_dir, &mut report) {
            let Some(date) = key_value(&date_dir, "date").and_then(Date::parse) else {
                continue;
            };
            if date >= keep_from {
                continue;
            }
            if in_use.iter().any(|d| d.starts_with(&date_dir)) {
                report.in_use.push(date_dir);
                continue;
            }
            let errors_before = report.errors.len();
            let foreign_before = report.foreign.len();
            delete_data_files(&date_dir, &mut report);
            if report.errors.len() == errors_before && report.foreign.len() == foreign_before {
                report.partitions.push(date_dir);
            }
        }
    }
    report
}

/// `v` when the directory's name is `key=v`.
fn key_value<'a>(dir: &'a Path, key: &str) -> Option<&'a str> {
    let (k, v) = dir.file_name()?.to_str()?.split_once('=')?;
    (k == key).then_some(v)
}

/// The visible subdirectories of `dir`, sorted (so reports are in a stable order).
fn subdirs(dir: &Path, report: &mut PruneReport) -> Vec<PathBuf> {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            report
                .errors
                .push(format!("{}: listing: {e}", dir.display()));
            return Vec::new();
        }
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Deletes the data files under `dir` (recursively), then the directories left empty.
fn delete_data_files(dir: &Path, report: &mut PruneReport) {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            report
                .errors
                .push(format!("{}: listing: {e}", dir.display()));
            return;
        }
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir {
            delete_data_files(&path, report);
            continue;
        }
        if entry.file_name().to_str().and_then(seq_of).is_none() {
            report.foreign.push(path);
            continue;
        }
        let bytes = entry.metadata().map(|m| m.len()).unwrap_or(0);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                report.files += 1;
                report.bytes += bytes;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => report
                .errors
                .push(format!("{}: deleting: {e}", path.display())),
        }
    }
    // Fails, as it should, when something was left in it.
    let _ = std::fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, bytes: usize) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![7u8; bytes]).unwrap();
    }

    fn day(s: &str) -> Date {
        Date::parse(s).unwrap()
    }

    #[test]
    fn days_before_the_first_kept_go_and_later_days_stay() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(
            &r.join("kind=gpu/date=2026-01-01/node=a/part-000001.parquet"),
            10,
        );
        touch(
            &r.join("kind=gpu/date=2026-01-01/node=b/compact-000002.parquet"),
            20,
        );
        touch(
            &r.join("kind=gpu/date=2026-01-01/node=b/.part-000003.parquet.tmp"),
            5,
        );
        touch(&r.join("kind=step/date=2026-01-02/part-000001.parquet"), 30);
        touch(
            &r.join("kind=gpu/date=2026-01-03/node=a/part-000001.parquet"),
            40,
        );
        touch(
            &r.join("kind=node/date=2026-01-04/node=a/part-000001.parquet"),
            50,
        );

        let report = prune_before(r, day("2026-01-03"), &HashSet::new());

        assert_eq!(report.files, 4);
        assert_eq!(report.bytes, 65);
        assert!(report.errors.is_empty() && report.foreign.is_empty());
        assert_eq!(
            report.partitions,
            vec![
                r.join("kind=gpu/date=2026-01-01"),
                r.join("kind=step/date=2026-01-02")
            ]
        );
        assert!(!r.join("kind=gpu/date=2026-01-01").exists());
        assert!(!r.join("kind=step/date=2026-01-02").exists());
        assert!(
            r.join("kind=gpu/date=2026-01-03/node=a/part-000001.parquet")
                .exists()
        );
        assert!(
            r.join("kind=node/date=2026-01-04/node=a/part-000001.parquet")
                .exists()
        );
    }

    #[test]
    fn files_that_are_not_telemetry_and_directories_that_are_not_partitions_stay() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(
            &r.join("kind=gpu/date=2026-01-01/node=a/part-000001.parquet"),
            10,
        );
        touch(&r.join("kind=gpu/date=2026-01-01/node=a/notes.txt"), 3);
        touch(&r.join("kind=gpu/date=garbage/part-000001.parquet"), 3);
        touch(&r.join("kind=weird/date=2026-01-01/part-000001.parquet"), 3);
        touch(&r.join("other/date=2026-01-01/part-000001.parquet"), 3);

        let report = prune_before(r, day("2026-02-01"), &HashSet::new());

        assert_eq!(report.files, 1);
        assert_eq!(
            report.foreign,
            vec![r.join("kind=gpu/date=2026-01-01/node=a/notes.txt")]
        );
        assert!(
            report.partitions.is_empty(),
            "a partition with a foreign file is not gone"
        );
        assert!(r.join("kind=gpu/date=2026-01-01/node=a/notes.txt").exists());
        assert!(r.join("kind=gpu/date=garbage/part-000001.parquet").exists());
        assert!(
            r.join("kind=weird/date=2026-01-01/part-000001.parquet")
                .exists()
        );
        assert!(r.join("other/date=2026-01-01/part-000001.parquet").exists());
    }

    #[test]
    fn a_partition_in_use_is_skipped() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let open = r.join("kind=gpu/date=2026-01-01/node=a");
        touch(&open.join(".part-000002.parquet.tmp"), 10);
        touch(
            &r.join("kind=gpu/date=2026-01-02/node=a/part-000001.parquet"),
            10,
        );

        let in_use = HashSet::from([open.clone()]);
        let report = prune_before(r, day("2026-02-01"), &in_use);

        assert_eq!(report.in_use, vec![r.join("kind=gpu/date=2026-01-01")]);
        assert!(open.join(".part-000002.parquet.tmp").exists());
        assert_eq!(report.partitions, vec![r.join("kind=gpu/date=2026-01-02")]);
    }

    #[test]
    fn a_missing_root_has_nothing_to_prune() {
        let root = tempfile::tempdir().unwrap();
        let report = prune_before(
            &root.path().join("absent"),
            day("2026-02-01"),
            &HashSet::new(),
        );
        assert_eq!(report, PruneReport::default());
    }

    #[test]
    fn the_first_day_kept_is_the_day_the_horizon_falls_on() {
        let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
        // 1970-01-11 06:00 less 7 days is 1970-01-04 06:00: day 3 is kept, days 0–2 go.
        let now = at(10 * 86_400 + 6 * 3600);
        assert_eq!(
            first_day_kept(now, Duration::from_secs(7 * 86_400)),
            Some(Date(3))
        );
        assert_eq!(first_day_kept(at(100), Duration::from_secs(200)), None);
    }
}
