//! Gavel's (OSDI '20) Philly job-size distribution: the (duration, GPU count) pairs its
//! trace generator samples jobs from.

use serde::Serialize;

use crate::bundled::GAVEL_PHILLY_DISTRIBUTION;
use crate::table::Table;
use crate::{DatasetError, ParseReport};

const HEADER: &str = "duration_s,num_gpus";

/// One sample of a job-size distribution: how long a job ran on how many GPUs.
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct JobShape {
    pub duration_s: f64,
    pub gpus: u32,
}

/// Parses a job-size distribution (`duration_s,num_gpus`, the CSV form of Gavel's
/// `philly_job_distribution.pickle`), keeping file order (Gavel samples from it by
/// index).
///
/// Skipped rows: a duration that is empty, not a number, NaN, infinite or negative; a
/// GPU count that is not a whole number of at least 1.
pub fn parse_gavel_distribution(
    name: &str,
    text: &str,
) -> Result<(Vec<JobShape>, ParseReport), DatasetError> {
    let table = Table::open(name, text, HEADER)?;
    let duration = table.column("duration_s", HEADER)?;
    let gpus = table.column("num_gpus", HEADER)?;
    let mut report = ParseReport::new(name);
    let mut shapes = Vec::new();
    table.for_each_row(&mut report, |row| {
        let duration_s = row.time_s(duration)?;
        let gpus = crate::jobs::at_least_one_gpu(row.uint(gpus)?, "num_gpus")?;
        shapes.push(JobShape { duration_s, gpus });
        Ok(())
    });
    if shapes.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((shapes, report))
}

/// Gavel's Philly distribution (bundled): 33,192 jobs of 1, 2, 4 or 8 GPUs lasting 1 h to
/// about 60 days.
pub fn gavel_philly_distribution() -> Result<(Vec<JobShape>, ParseReport), DatasetError> {
    let file = GAVEL_PHILLY_DISTRIBUTION;
    parse_gavel_distribution(file.name, file.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_file_order_and_bad_rows_are_counted() {
        let text = "duration_s,num_gpus
860662.0,1
7944.0,8
-1,1
nan,1
10,0
10,two
10
";
        let (shapes, report) = parse_gavel_distribution("d.csv", text).unwrap();
        assert_eq!(
            shapes,
            vec![
                JobShape {
                    duration_s: 860_662.0,
                    gpus: 1
                },
                JobShape {
                    duration_s: 7944.0,
                    gpus: 8
                },
            ]
        );
        assert_eq!((report.rows_read, report.rows_skipped), (7, 5));
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (4, "duration_s"),
                (5, "duration_s"),
                (6, "num_gpus"),
                (7, "num_gpus"),
                (8, "num_gpus")
            ]
        );
        let err = parse_gavel_distribution("h.csv", "duration,gpus\n1,1\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "duration_s"),
            "{err}"
        );
        assert!(matches!(
            parse_gavel_distribution("n.csv", "duration_s,num_gpus\n").unwrap_err(),
            DatasetError::NoValidRows { .. }
        ));
    }
}
