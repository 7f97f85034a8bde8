//! The synthetic workloads of Pollux (OSDI '21) and Sia (SOSP '23): 160-job (and larger)
//! lists of applications sampled from Philly and Helios, one file per workload, in the
//! schema of Pollux's simulator: `name,time,application,num_replicas,batch_size`.

use marshal_scheduler::domain::{Job, JobId};

use crate::jobs::{at_least_one_gpu, read_unique_rows, rebase_and_number};
use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport};

const HEADER: &str = "name,time,application,num_replicas,batch_size";

struct Cols {
    name: Col,
    time: Col,
    application: Col,
    replicas: Col,
    batch_size: Col,
}

/// Parses a Pollux workload (`workloads*/workload-<k>.csv` of Pollux's simulator:
/// `name,time,application,num_replicas,batch_size`).
///
/// Jobs are sorted by `time` (stable), numbered in that order, and `submit_time` is
/// seconds since the earliest submission. Each job is [`Job::whole_gpus`] of
/// `num_replicas` GPUs (one replica per GPU); tenant is `default` (no user is
/// published); name is the file's `name` (`cifar10-0`), prefixed with
/// `<application>-` when it does not already start with it, so the application is
/// always the text before the first `-`. `batch_size` is kept in [`Job::batch_size`].
///
/// **`total_work` is 0**: these workloads give no duration; Pollux's simulator runs each
/// application to a fixed goal through its measured profile. The workload-enrichment
/// step must assign work (and elasticity) per application before simulating.
///
/// Skipped rows: an empty field, a time or count that is not a non-negative number,
/// 0 replicas, a batch size of 0, a repeated `name`.
pub fn parse_pollux(name: &str, text: &str) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let table = Table::open(name, text, HEADER)?;
    let cols = Cols {
        name: table.column("name", HEADER)?,
        time: table.column("time", HEADER)?,
        application: table.column("application", HEADER)?,
        replicas: table.column("num_replicas", HEADER)?,
        batch_size: table.column("batch_size", HEADER)?,
    };
    let (jobs, report) = read_unique_rows(name, table, cols.name, |row| parse_row(row, &cols));
    let jobs = rebase_and_number(jobs, &report)?;
    Ok((jobs, report))
}

/// Parses a Sia workload (`saturn/`, `philly/`, `newtrace/`, `scale/rate_<r>/`): the same
/// schema and mapping as [`parse_pollux`] (Sia's times may be fractional seconds).
pub fn parse_sia(name: &str, text: &str) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    parse_pollux(name, text)
}

fn parse_row(row: &Row<'_>, c: &Cols) -> Result<Job, Bad> {
    let name = row.text(c.name)?;
    let submit = row.time_s(c.time)?;
    let application = row.text(c.application)?;
    let gpus = at_least_one_gpu(row.uint(c.replicas)?, "num_replicas")?;
    let batch_size: u32 = row.uint(c.batch_size)?;
    if batch_size == 0 {
        return Err(Bad::new("batch_size", "a batch size of 0"));
    }
    let mut job = Job::whole_gpus(JobId(0), gpus, submit, 0.0);
    job.batch_size = Some(batch_size);
    job.name = match name.strip_prefix(application) {
        Some(rest) if rest.starts_with('-') => name.to_string(),
        _ => format!("{application}-{name}"),
    };
    Ok(job)
}

#[cfg(test)]
mod tests {
    use marshal_scheduler::domain::CommPattern;

    use super::*;

    const WORKLOAD: &str = "name,time,application,num_replicas,batch_size
cifar10-0,107,cifar10,6,2048
deepspeech2-1,110,deepspeech2,6,320
ncf-2,35,ncf,1,32768
job7,401.5,bert,2,384
";

    #[test]
    fn workloads_map_to_whole_gpu_jobs_without_work() {
        let (jobs, report) = parse_pollux("workload-1.csv", WORKLOAD).unwrap();
        assert_eq!((report.rows_read, report.rows_skipped), (4, 0));
        let got: Vec<_> = jobs
            .iter()
            .map(|j| (j.id.0, j.name.as_str(), j.submit_time, j.workers))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "ncf-2", 0.0, 1),
                (1, "cifar10-0", 72.0, 6),
                (2, "deepspeech2-1", 75.0, 6),
                (3, "bert-job7", 366.5, 2),
            ]
        );
        assert!(
            jobs.iter()
                .all(|j| j.total_work == 0.0 && j.tenant == "default" && j.validate().is_ok())
        );
        assert_eq!(jobs[0].comm, CommPattern::None);
        assert_eq!(jobs[1].comm, CommPattern::DataParallel);
        let (sia, _) = parse_sia("workload-1.csv", WORKLOAD).unwrap();
        assert_eq!(sia, jobs);
    }

    #[test]
    fn bad_workload_rows_are_skipped_with_line_and_field() {
        let text = format!(
            "{WORKLOAD}a-5,-1,a,1,8
a-6,1,,1,8
a-7,1,a,0,8
a-8,1,a,1,0
cifar10-0,1,cifar10,1,8
a-10,inf,a,1,8
a-11,1,a,1.5,8
"
        );
        let (jobs, report) = parse_pollux("w.csv", &text).unwrap();
        assert_eq!(jobs.len(), 4);
        assert_eq!((report.rows_read, report.rows_skipped), (11, 7));
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (6, "time"),
                (7, "application"),
                (8, "num_replicas"),
                (9, "batch_size"),
                (10, "name"),
                (11, "time"),
                (12, "num_replicas"),
            ]
        );
        assert!(report.skipped[4].reason.contains("duplicate"));
        assert!(report.skipped[5].reason.contains("finite"));
        assert!(report.skipped[6].reason.contains("whole"));
    }

    #[test]
    fn workload_header_and_empty_files_are_errors() {
        let err = parse_pollux("h.csv", "name,time,app,num_replicas,batch_size\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. }
                if file == "h.csv" && field == "application"),
            "{err}"
        );
        assert!(parse_sia("e.csv", "\n\n").is_err());
        let err = parse_pollux("n.csv", &format!("{HEADER}\n")).unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }
}
