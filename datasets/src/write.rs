//! Writing jobs back out as a trace file that [`crate::load_trace`] reads, so that a
//! sample or a synthetic workload can be replayed with `marshal sim --trace FILE`.
//!
//! Two formats cover what the domain can express: gangs of single-GPU workers with no
//! CPU or memory request (what Philly-style traces record) are written as Philly CSV;
//! single-worker tasks with CPU, memory, GPU shares and model constraints are written as
//! an 11-column openb pod list. A workload that mixes the two, or holds a job neither can
//! express (a multi-worker gang of multi-GPU or shared workers, a MIG request), is refused
//! with the job's name rather than written wrongly.

use std::fmt::Write as _;

use marshal_scheduler::domain::{GpuCatalog, GpuDemand, Job};

use crate::DatasetError;
use crate::table::MAX_TRACE_SECONDS;

/// Philly timestamps need a calendar date; submit times are written relative to this one
/// (2017-10-01 00:00:00 UTC, inside the original trace's span).
const PHILLY_EPOCH_S: i64 = 1_506_816_000;

/// The trace formats [`write_trace`] can produce.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    Philly,
    Openb,
}

fn philly_shaped(job: &Job) -> bool {
    job.gpu == GpuDemand::Whole(1)
        && job.cpu_milli == 0
        && job.memory_mib == 0
        && job.gpu_models.is_any()
}

fn openb_shaped(job: &Job) -> bool {
    job.workers == 1 && !matches!(job.gpu, GpuDemand::Mig { .. })
}

/// The format that can hold every job of `jobs`.
pub fn trace_format_for(jobs: &[Job]) -> Result<TraceFormat, DatasetError> {
    if jobs.iter().all(philly_shaped) {
        return Ok(TraceFormat::Philly);
    }
    match jobs.iter().find(|j| !openb_shaped(j)) {
        None => Ok(TraceFormat::Openb),
        Some(job) => Err(DatasetError::Unrepresentable {
            job: job.name.clone(),
            reason: format!(
                "{} workers of {:?} fit neither a Philly row (single-GPU workers, no CPU or \
                 memory) nor an openb pod (one worker, no MIG)",
                job.workers, job.gpu
            ),
        }),
    }
}

/// Writes `jobs` in the format [`trace_format_for`] picks.
pub fn write_trace(
    jobs: &[Job],
    catalog: &GpuCatalog,
) -> Result<(TraceFormat, String), DatasetError> {
    let format = trace_format_for(jobs)?;
    let mut out = String::new();
    match format {
        TraceFormat::Philly => {
            out.push_str("timestamp,duration,num_gpus,gpu_time,cluster\n");
            for job in jobs {
                let t = PHILLY_EPOCH_S + whole_seconds(job, "submit time", job.submit_time)?;
                let stamp = chrono::DateTime::from_timestamp(t, 0)
                    .map(|d| d.format("%Y-%m-%d %H:%M:%S").to_string())
                    .ok_or_else(|| DatasetError::Unrepresentable {
                        job: job.name.clone(),
                        reason: format!("submit time {} s is out of range", job.submit_time),
                    })?;
                let gpus = job.workers;
                let _ = writeln!(
                    out,
                    "{stamp},{:.1},{gpus},{:.1},{}",
                    job.total_work,
                    job.total_work * gpus as f64,
                    csv_field(&job.tenant)
                );
            }
        }
        TraceFormat::Openb => {
            out.push_str(
                "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,\
                 deletion_time,scheduled_time\n",
            );
            for job in jobs {
                let (num_gpu, gpu_milli) = match job.gpu {
                    GpuDemand::None => (0, 0),
                    GpuDemand::Whole(n) => (n, 1000),
                    GpuDemand::Milli(m) => (1, m),
                    GpuDemand::Mig { .. } => unreachable!("refused by trace_format_for"),
                };
                let spec: Vec<&str> = job
                    .gpu_models
                    .ids()
                    .map(|id| catalog.get(id).name.as_str())
                    .collect();
                let created = whole_seconds(job, "submit time", job.submit_time)?;
                let deleted = whole_seconds(job, "end time", job.submit_time + job.total_work)?;
                let qos = if job.priority > 0 { "LS" } else { "BE" };
                let _ = writeln!(
                    out,
                    "{},{},{},{num_gpu},{gpu_milli},{},{qos},Running,{created},{deleted},{created}",
                    csv_field(&job.name),
                    job.cpu_milli,
                    job.memory_mib,
                    spec.join("|")
                );
            }
        }
    }
    Ok((format, out))
}

/// `seconds` rounded to a whole number, or an error naming the job if it is not finite
/// or beyond what the trace parsers read back ([`MAX_TRACE_SECONDS`]).
fn whole_seconds(job: &Job, what: &str, seconds: f64) -> Result<i64, DatasetError> {
    if seconds.is_finite() && seconds.abs() <= MAX_TRACE_SECONDS {
        Ok(seconds.round() as i64)
    } else {
        Err(DatasetError::Unrepresentable {
            job: job.name.clone(),
            reason: format!("{what} {seconds} s is out of range"),
        })
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_openb_pods, parse_philly};
    use marshal_scheduler::domain::{GpuModelSet, JobId};

    #[test]
    fn philly_jobs_round_trip() {
        let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                    2017-10-09 07:01:55,66.0,1,66.0,vc1\n\
                    2017-10-09 08:00:00,3600.0,8,28800.0,vc2\n";
        let (jobs, _) = parse_philly("in.csv", text).unwrap();
        let (format, written) = write_trace(&jobs, &GpuCatalog::default()).unwrap();
        assert_eq!(format, TraceFormat::Philly);
        let (again, report) = parse_philly("out.csv", &written).unwrap();
        assert_eq!(report.rows_skipped, 0);
        assert_eq!(again.len(), 2);
        for (a, b) in jobs.iter().zip(&again) {
            assert_eq!(
                (a.workers, a.total_work, a.submit_time, &a.tenant),
                (b.workers, b.total_work, b.submit_time, &b.tenant)
            );
        }
    }

    #[test]
    fn openb_tasks_round_trip_with_shares_and_model_constraints() {
        let catalog = GpuCatalog::default();
        let mut a = Job::whole_gpus(JobId(0), 1, 0.0, 100.0);
        a.name = "a".into();
        a.gpu = GpuDemand::Milli(460);
        a.cpu_milli = 6000;
        a.memory_mib = 12288;
        a.gpu_models = GpuModelSet::of([catalog.id("T4").unwrap(), catalog.id("P100").unwrap()]);
        let mut b = a.clone();
        b.name = "b".into();
        b.gpu = GpuDemand::None;
        b.submit_time = 50.0;
        let (format, written) = write_trace(&[a.clone(), b], &catalog).unwrap();
        assert_eq!(format, TraceFormat::Openb);
        let (again, report) = parse_openb_pods("out.csv", &written, &catalog).unwrap();
        assert_eq!(report.rows_skipped, 0);
        assert_eq!(again[0].gpu, GpuDemand::Milli(460));
        assert_eq!(again[0].gpu_models, a.gpu_models);
        assert_eq!((again[0].cpu_milli, again[0].memory_mib), (6000, 12288));
        assert_eq!(again[1].gpu, GpuDemand::None);
        assert_eq!(again[1].submit_time, 50.0);
    }

    #[test]
    fn a_job_no_format_can_hold_is_refused_by_name() {
        let mut gang = Job::whole_gpus(JobId(0), 4, 0.0, 1.0);
        gang.name = "gang".into();
        gang.gpu = GpuDemand::Whole(2);
        let err = write_trace(&[gang], &GpuCatalog::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("gang"), "{err}");
    }

    #[test]
    fn a_time_beyond_any_timestamp_is_refused_by_name_in_both_formats() {
        let mut philly = Job::whole_gpus(JobId(0), 1, 1e300, 60.0);
        philly.name = "late".into();
        let mut openb = philly.clone();
        openb.gpu = GpuDemand::Whole(1);
        openb.cpu_milli = 1000;
        for (job, format) in [(philly, TraceFormat::Philly), (openb, TraceFormat::Openb)] {
            assert_eq!(
                trace_format_for(std::slice::from_ref(&job)).unwrap(),
                format
            );
            let err = write_trace(&[job], &GpuCatalog::default())
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("late") && err.contains("out of range"),
                "{err}"
            );
        }
    }
}
