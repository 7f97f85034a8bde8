//! What an incumbent scheduler did with the jobs a live shadow log asked about, as an
//! operator exports it (Slurm `sacct`, Kubernetes pod events): `marshal shadow
//! --report-log LOG --outcomes FILE` joins it with the log.

use marshal_scheduler::shadow::IncumbentOutcome;

use crate::jobs::read_unique_rows;
use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport};

const HEADER: &str = "job,scheduled_time,deletion_time[,node]";

/// Parses an outcomes file: header `job,scheduled_time,deletion_time` and an optional
/// `node`, one row per job, times in seconds on the shadow log's clock (Unix time,
/// fractions allowed). An empty `scheduled_time` is a job never scheduled; an empty
/// `deletion_time` one still running when the file was exported. A row whose time is not
/// a number, whose `deletion_time` is before its `scheduled_time`, or whose job repeats
/// an earlier row is skipped with its line. A missing column is an error.
pub fn parse_incumbent_outcomes(
    name: &str,
    text: &str,
) -> Result<(Vec<IncumbentOutcome>, ParseReport), DatasetError> {
    let table = Table::open(name, text, HEADER)?;
    let job = table.column("job", HEADER)?;
    let scheduled = table.column("scheduled_time", HEADER)?;
    let deletion = table.column("deletion_time", HEADER)?;
    let node = table
        .has("node")
        .then(|| table.column("node", HEADER))
        .transpose()?;
    let (rows, report) = read_unique_rows(name, table, job, |row| {
        let scheduled_at = optional_seconds(row, scheduled)?;
        let deleted = optional_seconds(row, deletion)?;
        if let (Some(s), Some(d)) = (scheduled_at, deleted)
            && d < s
        {
            return Err(Bad::new(
                "deletion_time",
                format!("{d} is before scheduled_time {s}"),
            ));
        }
        Ok(IncumbentOutcome {
            job: row.text(job)?.to_string(),
            scheduled: scheduled_at,
            deleted,
            node: node
                .map(|c| row.get(c))
                .transpose()?
                .filter(|n| !n.is_empty())
                .map(String::from),
        })
    });
    if rows.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((rows, report))
}

/// Seconds (at most a trace's 10¹²), or `None` when the field is empty.
fn optional_seconds(row: &Row<'_>, col: Col) -> Result<Option<f64>, Bad> {
    match row.get(col)? {
        "" => Ok(None),
        _ => row.time_s(col).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_with_empty_times_and_bad_rows_are_skipped_by_line() {
        let text = "job,scheduled_time,deletion_time,node\n\
                    j1,1700000010.5,1700000100,n0\n\
                    j2,,,\n\
                    j3,soon,1700000100,n1\n\
                    j4,1700000050,1700000040,n1\n\
                    j1,1700000011,1700000100,n0\n\
                    j5,1700000020,,\n";
        let (rows, report) = parse_incumbent_outcomes("out.csv", text).unwrap();
        assert_eq!(
            report.skipped_at(),
            vec![(4, "scheduled_time"), (5, "deletion_time"), (6, "job")]
        );
        let jobs: Vec<&str> = rows.iter().map(|r| r.job.as_str()).collect();
        assert_eq!(jobs, ["j1", "j2", "j5"]);
        assert_eq!(rows[0].scheduled, Some(1_700_000_010.5));
        assert_eq!(rows[0].node.as_deref(), Some("n0"));
        assert_eq!((rows[1].scheduled, rows[1].deleted), (None, None));
        assert_eq!(
            (rows[2].deleted, rows[2].node.as_deref()),
            (None, None),
            "still running, no node"
        );
    }

    #[test]
    fn times_in_milliseconds_are_skipped_with_a_hint_not_replayed_for_millennia() {
        let text = "job,scheduled_time,deletion_time\n\
                    j1,1763823460000,1763823560000\n\
                    j2,1763823460,1763823560\n";
        let (rows, report) = parse_incumbent_outcomes("out.csv", text).unwrap();
        assert_eq!(report.skipped_at(), vec![(2, "scheduled_time")]);
        assert!(
            report.skipped[0].reason.contains("milliseconds"),
            "{}",
            report.skipped[0].reason
        );
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn a_missing_column_is_an_error_naming_it() {
        let err = parse_incumbent_outcomes("out.csv", "job,scheduled_time\nj1,5\n").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("out.csv") && text.contains("deletion_time"),
            "{text}"
        );
    }
}
