//! What every job-trace parser does after reading its rows: order the jobs by submission,
//! rebase times to the first submission and number them. Also the small row checks the
//! parsers share.

use std::collections::HashSet;

use marshal_scheduler::domain::{Job, JobId, MAX_GPUS};

use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport};

/// Reads every row of `table` through `parse`, skipping (and reporting) a row whose `id`
/// column repeats an earlier one, or one past the number of rows ids can number.
pub(crate) fn read_unique_rows<T>(
    name: &str,
    table: Table<'_>,
    id: Col,
    mut parse: impl FnMut(&Row<'_>) -> Result<T, Bad>,
) -> (Vec<T>, ParseReport) {
    let mut report = ParseReport::new(name);
    let mut rows = Vec::new();
    let mut ids = Unique::default();
    table.for_each_row(&mut report, |row| {
        check_room(rows.len(), id.name)?;
        let value = parse(row)?;
        ids.insert(row.text(id)?, id.name)?;
        rows.push(value);
        Ok(())
    });
    (rows, report)
}

/// Jobs are numbered with `u32` ids.
const MAX_JOBS: usize = u32::MAX as usize;

/// Sorts `jobs` by their absolute `submit_time` (stable: ties keep file order), rebases
/// submit times to the earliest one and numbers the jobs 0.. in that order. No jobs is
/// the report's [`DatasetError::NoValidRows`].
pub(crate) fn rebase_and_number(
    mut jobs: Vec<Job>,
    report: &ParseReport,
) -> Result<Vec<Job>, DatasetError> {
    jobs.sort_by(|a, b| a.submit_time.total_cmp(&b.submit_time));
    let Some(t0) = jobs.first().map(|j| j.submit_time) else {
        return Err(report.no_valid_rows());
    };
    for (i, job) in jobs.iter_mut().enumerate() {
        job.id = JobId(i as u32);
        job.submit_time -= t0;
    }
    Ok(jobs)
}

/// Refuses a row once `count` rows have been kept: ids must fit `u32`.
pub(crate) fn check_room(count: usize, field: &'static str) -> Result<(), Bad> {
    if count >= MAX_JOBS {
        return Err(Bad::new(field, "too many rows"));
    }
    Ok(())
}

/// A GPU count that must be at least one.
pub(crate) fn at_least_one_gpu(gpus: u32, field: &'static str) -> Result<u32, Bad> {
    if gpus == 0 {
        return Err(Bad::new(field, "a job needs at least one GPU"));
    }
    // Beyond the largest cluster a spec may describe no job can ever run, and the count
    // sizes work downstream (placement strings, global batch sizes).
    if u64::from(gpus) > MAX_GPUS {
        return Err(Bad::new(
            field,
            format!("{gpus} GPUs: more than any cluster holds (at most {MAX_GPUS})"),
        ));
    }
    Ok(gpus)
}

/// Identifiers that must be unique within a file.
#[derive(Debug, Default)]
pub(crate) struct Unique(HashSet<String>);

impl Unique {
    pub fn insert(&mut self, id: &str, field: &'static str) -> Result<(), Bad> {
        if !self.0.insert(id.to_string()) {
            return Err(Bad::new(field, format!("duplicate {field} {id:?}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_sorted_stably_rebased_and_renumbered() {
        let jobs: Vec<Job> = [(30.0, "a"), (10.0, "b"), (30.0, "c"), (10.0, "d")]
            .iter()
            .map(|&(t, name)| {
                let mut job = Job::whole_gpus(JobId(99), 1, t, 1.0);
                job.name = name.to_string();
                job
            })
            .collect();
        let jobs = rebase_and_number(jobs, &ParseReport::new("x")).unwrap();
        let got: Vec<_> = jobs
            .iter()
            .map(|j| (j.id.0, j.name.as_str(), j.submit_time))
            .collect();
        assert_eq!(
            got,
            vec![(0, "b", 0.0), (1, "d", 0.0), (2, "a", 20.0), (3, "c", 20.0)]
        );
        let err = rebase_and_number(Vec::new(), &ParseReport::new("none.csv")).unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }

    #[test]
    fn duplicates_and_zero_gpus_are_bad_rows() {
        let mut ids = Unique::default();
        assert!(ids.insert("a", "job_id").is_ok());
        let bad = ids.insert("a", "job_id").unwrap_err();
        assert_eq!(bad.field, "job_id");
        assert!(bad.reason.contains("duplicate"));
        assert_eq!(at_least_one_gpu(0, "num_gpu").unwrap_err().field, "num_gpu");
        let huge = at_least_one_gpu(4_000_001, "num_gpu").unwrap_err();
        assert!(
            huge.reason.contains("more than any cluster holds"),
            "{}",
            huge.reason
        );
        assert_eq!(at_least_one_gpu(4_000_000, "num_gpu").unwrap(), 4_000_000);
        assert_eq!(at_least_one_gpu(4, "num_gpu").unwrap(), 4);
    }
}
