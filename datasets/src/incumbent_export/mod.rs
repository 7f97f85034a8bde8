//! Exporters for what an incumbent scheduler did, in the CSV [`parse_incumbent_outcomes`]
//! reads (`job,scheduled_time,deletion_time,node`): from Slurm's accounting
//! ([`parse_sacct`]) and from a Kubernetes pod list ([`parse_kubectl_pods`]). `marshal
//! datasets outcomes` is their CLI; `marshal shadow --outcomes` joins the CSV with a live
//! shadow log.
//!
//! Both map the same way: a job never started has both times empty (whatever the source
//! says about its end), one still running an empty `deletion_time`, and `node` is the
//! first node it ran on. A row the CSV could not hold (a pod repeated, an end before the
//! start) is skipped with its line, so that every CSV written here parses back; the runs
//! of a requeued Slurm job are merged into one row ([`parse_sacct`]).
//!
//! [`parse_incumbent_outcomes`]: crate::parse_incumbent_outcomes

mod hostlist;
mod json_items;
mod pods;
mod sacct;

use marshal_scheduler::shadow::IncumbentOutcome;

use crate::ParseReport;
use crate::table::Bad;

pub use hostlist::first_host;
pub use pods::{PodId, parse_kubectl_pods};
pub use sacct::{WallClock, parse_sacct, parse_time_zone, parse_utc_offset};

/// The rows an exporter produced and what it left out.
#[derive(Clone, Debug, PartialEq)]
pub struct IncumbentExport {
    pub rows: Vec<IncumbentOutcome>,
    /// Rows (or pods) read and skipped, with their line and reason.
    pub report: ParseReport,
    /// `sacct` step rows (`1234.batch`, `1234.0`) left out without a warning: what
    /// `sacct` prints without `--allocations`. Neither read nor skipped in `report`.
    pub steps_left_out: usize,
    /// Times read as the cluster's wall clock (`YYYY-MM-DDTHH:MM:SS`) and converted
    /// with the UTC offset or time zone given (UTC when none was).
    pub local_times: usize,
    /// Of those, times in an hour the time zone passed twice (clocks set back), read as
    /// the earlier of the two moments.
    pub ambiguous_times: usize,
    /// `sacct` rows that were another run of a job already read (a requeued job, as
    /// `sacct --duplicates` lists them), merged into its row.
    pub runs_merged: usize,
}

/// Writes `rows` as the outcomes CSV, header `job,scheduled_time,deletion_time,node`,
/// times in Unix seconds (shortest form that reads back as the same number), empty when
/// absent.
pub fn write_incumbent_outcomes(rows: &[IncumbentOutcome]) -> String {
    let mut out = csv::Writer::from_writer(Vec::new());
    let time = |t: Option<f64>| t.map(|t| t.to_string()).unwrap_or_default();
    // Writing to a Vec cannot fail; a failure would only lose the row, never panic.
    let _ = out.write_record(["job", "scheduled_time", "deletion_time", "node"]);
    for row in rows {
        let _ = out.write_record([
            row.job.clone(),
            time(row.scheduled),
            time(row.deleted),
            row.node.clone().unwrap_or_default(),
        ]);
    }
    let bytes = out.into_inner().unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

/// The outcome of a job that started at `scheduled` (if ever) and ended at `deleted`
/// (if it has): a job never started has no end, and an end before the start is refused
/// (`field` names the end's column).
fn outcome(
    job: String,
    scheduled: Option<f64>,
    deleted: Option<f64>,
    node: Option<String>,
    field: &'static str,
) -> Result<IncumbentOutcome, Bad> {
    let deleted = scheduled.and(deleted);
    if let (Some(s), Some(d)) = (scheduled, deleted)
        && d < s
    {
        return Err(Bad::new(
            field,
            format!("ends at {d}, before its start {s}"),
        ));
    }
    Ok(IncumbentOutcome {
        job,
        scheduled,
        deleted,
        node: node.filter(|n| !n.is_empty()),
    })
}

#[cfg(test)]
mod tests;
