//! Per-cluster job statistics as the Acme (NSDI '24) and Helios (SC '21) papers publish
//! them: one row per cluster with job counts, mean/median run and queue times, and
//! completion rates.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::bundled::{ACME_CLUSTER_SUMMARY, HELIOS_CLUSTER_SUMMARY};
use crate::table::{Bad, Col, Table};
use crate::{DatasetError, ParseReport};

const EXPECTED: &str = "id,job_num,… (Acme's cluster_summary.csv or Helios' \
                        helios_cluster_summary.csv)";

/// The statistics columns read, the union of Acme's and Helios' files. Times are seconds;
/// `*_rate*` columns are fractions in 0..=1; `*_gpu_time` are GPU-seconds.
pub const SUMMARY_COLUMNS: [&str; 31] = [
    "gpu_num",
    "job_num",
    "cpu_job_num",
    "gpu_job_num",
    "avg_run_time_gpu",
    "avg_que_time_gpu",
    "avg_gpu_num",
    "med_run_time_gpu",
    "med_que_time_gpu",
    "med_gpu_num",
    "max_run_time_gpu",
    "max_gpu",
    "complete_rate",
    "cancel_rate",
    "fail_rate",
    "complete_rate_gpu",
    "cancel_rate_gpu",
    "fail_rate_gpu",
    "complete_gpu_time",
    "cancel_gpu_time",
    "fail_gpu_time",
    "complete_rate_gpu_time",
    "cancel_rate_gpu_time",
    "fail_rate_gpu_time",
    "avg_run_time_cpu",
    "avg_que_time_cpu",
    "med_run_time_cpu",
    "med_que_time_cpu",
    "complete_rate_cpu",
    "cancel_rate_cpu",
    "fail_rate_cpu",
];

/// One cluster's row: its name and the statistics the file gives for it (an empty cell
/// is absent, e.g. CPU statistics for Philly, which ran no CPU jobs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ClusterSummary {
    pub cluster: String,
    pub values: BTreeMap<&'static str, f64>,
}

impl ClusterSummary {
    /// The value of a column of [`SUMMARY_COLUMNS`], if the row has one.
    pub fn get(&self, column: &str) -> Option<f64> {
        self.values.get(column).copied()
    }
}

/// Parses a cluster-summary table (`id` then statistics columns). Every column of
/// [`SUMMARY_COLUMNS`] the header has is read; other columns are not. `id` and
/// `job_num` are required.
///
/// Skipped rows: an empty `id`, a repeated one, a value that is not a finite
/// non-negative number, a rate above 1.
pub fn parse_cluster_summary(
    name: &str,
    text: &str,
) -> Result<(Vec<ClusterSummary>, ParseReport), DatasetError> {
    let table = Table::open(name, text, EXPECTED)?;
    let id = table.column("id", EXPECTED)?;
    table.column("job_num", EXPECTED)?;
    let cols: Vec<Col> = SUMMARY_COLUMNS
        .iter()
        .filter(|c| table.has(c))
        .map(|c| table.column(c, EXPECTED))
        .collect::<Result<_, _>>()?;
    let mut report = ParseReport::new(name);
    let mut rows: Vec<ClusterSummary> = Vec::new();
    table.for_each_row(&mut report, |row| {
        let cluster = row.text(id)?;
        if rows.iter().any(|r| r.cluster == cluster) {
            return Err(Bad::new("id", format!("duplicate cluster {cluster:?}")));
        }
        let mut values = BTreeMap::new();
        for &col in &cols {
            if row.get(col)?.is_empty() {
                continue;
            }
            let v = row.seconds(col)?;
            if col.name.contains("_rate") && v > 1.0 {
                return Err(Bad::new(col.name, format!("rate {v} is above 1")));
            }
            values.insert(col.name, v);
        }
        rows.push(ClusterSummary {
            cluster: cluster.to_string(),
            values,
        });
        Ok(())
    });
    if rows.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((rows, report))
}

/// Acme's `cluster_summary.csv` (bundled): Seren, Kalos, Philly, Helios and PAI.
pub fn acme_cluster_summary() -> Result<(Vec<ClusterSummary>, ParseReport), DatasetError> {
    parse_cluster_summary(ACME_CLUSTER_SUMMARY.name, ACME_CLUSTER_SUMMARY.text)
}

/// Helios' `helios_cluster_summary.csv` (bundled): Venus, Earth, Saturn, Uranus and
/// their total.
pub fn helios_cluster_summary() -> Result<(Vec<ClusterSummary>, ParseReport), DatasetError> {
    parse_cluster_summary(HELIOS_CLUSTER_SUMMARY.name, HELIOS_CLUSTER_SUMMARY.text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_present_values_and_skip_bad_ones() {
        let text = "id,job_num,gpu_job_num,complete_rate_gpu,avg_run_time_cpu,extra
Philly,112956,112956,0.604,,zzz
PAI,1260920,1037085,,,
Philly,1,1,0.5,1,
Bad,-1,1,0.5,1,
Rate,1,1,1.5,1,
Nan,1,NaN,0.5,1,
";
        let (rows, report) = parse_cluster_summary("s.csv", text).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].cluster, "Philly");
        assert_eq!(rows[0].get("job_num"), Some(112_956.0));
        assert_eq!(rows[0].get("complete_rate_gpu"), Some(0.604));
        assert_eq!(rows[0].get("avg_run_time_cpu"), None);
        assert_eq!(rows[1].get("complete_rate_gpu"), None);
        assert_eq!(rows[0].values.len(), 3, "`extra` is not read");
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (4, "id"),
                (5, "job_num"),
                (6, "complete_rate_gpu"),
                (7, "gpu_job_num")
            ]
        );
        let err = parse_cluster_summary("h.csv", "name,job_num\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "id"),
            "{err}"
        );
        let err = parse_cluster_summary("n.csv", "id,job_num\n").unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }
}
