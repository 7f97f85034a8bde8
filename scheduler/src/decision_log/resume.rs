//! Where a database's decision ids resume: above every id its log already holds.
//!
//! A decision id is the key that joins a decision row to its outcome row, so an id must
//! never be written twice by one database. Its next id lives in the database, and two
//! ways bring back one the log has already used: a database restored from an older
//! snapshot (it keeps its identity, so the reader takes both runs' files for one), and a
//! crash with `durable_commits = false` (the last commits, with the ids they advanced,
//! are lost, while the log's files were already written). So at start the server asks
//! the log for the highest id written by its database and resumes above it.
//!
//! Only the decision file with the highest first id that the database wrote (or that
//! names no database, which may be its own from before files named one) is read: a
//! writer writes ids in order and names each file by its first id. A damaged file is
//! passed over for the next one down.

use std::path::Path;

use arrow_array::{Array, UInt64Array};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;

use super::{DECISIONS_DIR, open_log_file, parquet_files};

/// What [`highest_logged_decision`] found.
#[derive(Debug, Default)]
pub struct HighestLogged {
    /// The highest id and the file that holds it (or names it, for a damaged file whose
    /// name is all there is to go by); `None` when the log holds none.
    pub found: Option<(u64, String)>,
    /// Damaged files passed over, each with why.
    pub skipped: Vec<String>,
}

/// The highest decision id in the log under `dir` that `database` may have written
/// (files naming no database count, as they may be its own from before files named
/// one). Every file is looked at, since two runs' files can overlap (a database
/// restored from a snapshot wrote ids its first run's later files also hold), but
/// mostly through its footer: the database it names, and the row groups' `decision_id`
/// maxima; only a file written without statistics has that column read. A damaged
/// file counts with the first id in its name (`part-<id>-…`), the least it held; each
/// is named in [`HighestLogged::skipped`].
pub fn highest_logged_decision(dir: &Path, database: u64) -> Result<HighestLogged, String> {
    let mut highest = HighestLogged::default();
    for path in parquet_files(&dir.join(DECISIONS_DIR))? {
        let id = match max_in(&path, database) {
            Ok(id) => id,
            Err(e) => {
                highest.skipped.push(e);
                first_id_in_name(&path)
            }
        };
        if let Some(id) = id
            && highest.found.as_ref().is_none_or(|(best, _)| id > *best)
        {
            highest.found = Some((id, path.display().to_string()));
        }
    }
    Ok(highest)
}

/// The highest `decision_id` in the file at `path`, unless it names another database
/// than `database` or holds no row.
fn max_in(path: &Path, database: u64) -> Result<Option<u64>, String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let (named, builder) = open_log_file(path)?;
    if named.is_some_and(|db| db != database) {
        return Ok(None);
    }
    let metadata = builder.metadata().clone();
    let converter =
        StatisticsConverter::try_new("decision_id", builder.schema(), builder.parquet_schema())
            .map_err(|e| err(&e))?;
    let maxima = converter
        .row_group_maxes(metadata.row_groups())
        .map_err(|e| err(&e))?;
    if let Some(maxima) = maxima.as_any().downcast_ref::<UInt64Array>()
        && maxima.null_count() == 0
    {
        return Ok(maxima.iter().flatten().max());
    }
    // Written without statistics: read the column.
    let mask = ProjectionMask::columns(builder.parquet_schema(), ["decision_id"]);
    let reader = builder.with_projection(mask).build().map_err(|e| err(&e))?;
    let mut highest = None;
    for batch in reader {
        let batch = batch.map_err(|e| err(&e))?;
        let ids = batch
            .column_by_name("decision_id")
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            .ok_or_else(|| format!("{}: no decision_id column of u64", path.display()))?;
        highest = highest.max(ids.iter().flatten().max());
    }
    Ok(highest)
}

/// The first decision id a file's name gives (`part-<id, 20 digits>-<seq>.parquet`).
fn first_id_in_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    name.strip_prefix("part-")?.get(..20)?.parse().ok()
}

/// Writes a placement decision for each of `ids` into the log under `dir` as
/// `database`'s writer would, `file_rows` to a file (for tests here and elsewhere).
#[cfg(test)]
pub(crate) fn write_placements(
    dir: &Path,
    database: Option<u64>,
    ids: std::ops::Range<u64>,
    file_rows: usize,
) -> super::LogCounts {
    use super::{DecisionLog, DecisionRow, LogBatch, LogOptions};
    let log = DecisionLog::open(
        dir,
        LogOptions {
            file_rows,
            database,
            ..LogOptions::default()
        },
    );
    log.send(LogBatch {
        decisions: ids
            .map(|id| DecisionRow {
                decision_id: id,
                verdict: "place".into(),
                ..DecisionRow::default()
            })
            .collect(),
        outcomes: Vec::new(),
    });
    log.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, database: Option<u64>, ids: std::ops::Range<u64>) {
        write_files_of(4, dir, database, ids);
    }

    fn write_files_of(rows: usize, dir: &Path, database: Option<u64>, ids: std::ops::Range<u64>) {
        let counts = write_placements(dir, database, ids, rows);
        assert_eq!(counts.rows_lost, 0);
    }

    /// A database restored from a snapshot at id 300 wrote 300–799 into one file, below
    /// (by name) the first run's last small files of ids 501–510: the highest is the
    /// second run's, found in its file's footer.
    #[test]
    fn overlapping_runs_of_one_database_give_the_highest_of_all_files() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), Some(7), 1..511);
        write_files_of(1000, dir.path(), Some(7), 300..800);
        let highest = highest_logged_decision(dir.path(), 7).unwrap();
        let (id, file) = highest.found.unwrap();
        assert_eq!(id, 799);
        assert!(file.contains(&format!("part-{:020}", 300)), "{file}");
    }

    #[test]
    fn the_highest_id_of_the_database_is_found_past_other_databases_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(highest_logged_decision(dir.path(), 7).unwrap().found, None);
        write(dir.path(), Some(7), 1..11);
        // Another database's files hold higher ids: not this one's.
        write(dir.path(), Some(8), 100..110);
        let highest = highest_logged_decision(dir.path(), 7).unwrap();
        assert_eq!(highest.found.unwrap().0, 10);
        assert!(highest.skipped.is_empty());
        assert_eq!(
            highest_logged_decision(dir.path(), 8)
                .unwrap()
                .found
                .unwrap()
                .0,
            109
        );
        // A database that wrote nothing has no id to resume above, beside others' files.
        assert_eq!(highest_logged_decision(dir.path(), 9).unwrap().found, None);
    }

    #[test]
    fn files_naming_no_database_count_and_a_damaged_file_counts_by_its_name() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), None, 1..6);
        assert_eq!(
            highest_logged_decision(dir.path(), 3)
                .unwrap()
                .found
                .unwrap()
                .0,
            5
        );
        write(dir.path(), Some(3), 6..9);
        let damaged = dir
            .path()
            .join(DECISIONS_DIR)
            .join(format!("part-{:020}-999999.parquet", 50));
        std::fs::write(&damaged, b"PAR1 cut short").unwrap();
        // Above every readable file, a damaged one counts by its name's first id, the
        // least it held (its ids may have been this database's).
        let highest = highest_logged_decision(dir.path(), 3).unwrap();
        assert_eq!(highest.found.unwrap().0, 50);
        assert_eq!(highest.skipped.len(), 1);
        assert!(
            highest.skipped[0].contains("999999"),
            "{:?}",
            highest.skipped
        );
    }
}
