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

use super::{DECISIONS_DIR, batches, parquet_files};

/// What [`highest_logged_decision`] found.
#[derive(Debug, Default)]
pub struct HighestLogged {
    /// The highest id and the file that holds it; `None` when the log holds none.
    pub found: Option<(u64, String)>,
    /// Damaged files passed over, each with why.
    pub skipped: Vec<String>,
}

/// The highest decision id in the log under `dir` that `database` may have written.
/// Files of other databases are passed over, and so are damaged ones (named in
/// [`HighestLogged::skipped`]).
pub fn highest_logged_decision(dir: &Path, database: u64) -> Result<HighestLogged, String> {
    let mut skipped = Vec::new();
    for path in parquet_files(&dir.join(DECISIONS_DIR))?.iter().rev() {
        let (named, batches) = match batches(path) {
            Ok(read) => read,
            Err(e) => {
                skipped.push(e);
                continue;
            }
        };
        if named.is_some_and(|db| db != database) {
            continue;
        }
        let mut highest: Option<u64> = None;
        for b in &batches {
            let Some(ids) = b
                .column_by_name("decision_id")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>())
            else {
                skipped.push(format!("{}: no decision_id column of u64", path.display()));
                highest = None;
                break;
            };
            let max = ids.iter().flatten().max();
            highest = highest.max(max);
        }
        if let Some(id) = highest {
            return Ok(HighestLogged {
                found: Some((id, path.display().to_string())),
                skipped,
            });
        }
    }
    Ok(HighestLogged {
        found: None,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision_log::{DecisionLog, DecisionRow, LogBatch, LogOptions};

    fn write(dir: &Path, database: Option<u64>, ids: std::ops::Range<u64>) {
        let log = DecisionLog::open(
            dir,
            LogOptions {
                file_rows: 4,
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
        let counts = log.finish();
        assert_eq!(counts.rows_lost, 0);
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
    fn files_naming_no_database_count_and_a_damaged_file_is_passed_over() {
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
        let highest = highest_logged_decision(dir.path(), 3).unwrap();
        assert_eq!(highest.found.unwrap().0, 8);
        assert_eq!(highest.skipped.len(), 1);
        assert!(
            highest.skipped[0].contains("999999"),
            "{:?}",
            highest.skipped
        );
    }
}
