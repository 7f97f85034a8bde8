//! Alibaba's disaggregated DLRM serving trace (cluster-trace-gpu-v2025, NSDI '25): the
//! inference instances of 156 recommendation apps, split into CPU-node (`CN`) and
//! GPU-node (`HN`) roles.

use marshal_scheduler::domain::{Checkpointing, CommPattern, GpuDemand, GpuModelSet, Job, JobId};

use crate::jobs::{read_unique_rows, rebase_and_number};
use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport, RecordedRun};

const HEADER: &str = "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,\
                      rdma_request,rdma_limit,memory_request,memory_limit,disk_request,\
                      disk_limit,max_instance_per_node,creation_time,scheduled_time,\
                      deletion_time";

struct Cols {
    sn: Col,
    role: Col,
    app: Col,
    /// (request, limit) pairs: cpu, gpu, rdma, memory, disk.
    cpu: (Col, Col),
    gpu: (Col, Col),
    rdma: (Col, Col),
    memory: (Col, Col),
    disk: (Col, Col),
    max_per_node: Col,
    creation: Col,
    scheduled: Col,
    deletion: Col,
}

struct Instance {
    job: Job,
    /// `creation_time`, if published.
    creation: Option<f64>,
    scheduled: Option<f64>,
    deletion: Option<f64>,
    /// The latest time the row mentions.
    latest: f64,
}

/// Parses the disaggregated DLRM trace (`instance_sn,role,app_name,cpu_request,
/// cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,
/// disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,
/// deletion_time`).
///
/// Each instance is a one-worker job named by `instance_sn`, tenant = `app_name`:
/// - resources are the requests: `cpu_request` cores → `cpu_milli`, `memory_request`
///   GiB → `memory_mib`, `gpu_request` whole GPUs (`CN` instances ask for none, `HN`
///   instances for at least one); limits must not be below requests; RDMA, disk and
///   `max_instance_per_node` (-1 = no limit) have no [`Job`] field and are validated
///   but not kept;
/// - serving instances are latency-critical: priority 1, not preemptible;
/// - submit = `creation_time`; an instance without one was already running when the
///   trace began and is submitted at time 0. Work = its lifetime: `deletion_time` −
///   submit, or, when it was never deleted, the trace's end (the latest time in the
///   file) − submit. Jobs are sorted by submission (stable), numbered in that order and
///   rebased to the earliest submission.
///
/// Skipped rows: an empty or non-numeric field, a role other than `CN`/`HN` or one that
/// contradicts the GPU request, a limit below its request, creation, scheduling and
/// deletion times out of order, a repeated `instance_sn`.
pub fn parse_dlrm(name: &str, text: &str) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let (instances, report, end) = read_instances(name, text)?;
    let jobs = instances
        .into_iter()
        .map(|i| {
            let mut job = i.job;
            job.submit_time = i.creation.unwrap_or(0.0);
            job.total_work = i.deletion.unwrap_or(end) - job.submit_time;
            job
        })
        .collect();
    let jobs = rebase_and_number(jobs, &report)?;
    Ok((jobs, report))
}

/// Parses the DLRM trace as [`parse_dlrm`] does, keeping with each instance what
/// Alibaba's scheduler did with it, for shadow mode. Unlike [`parse_dlrm`], jobs stay in
/// file order (ids 0.. in that order) and times stay in the file's clock.
///
/// - An instance with a `creation_time` was created then and started at its
///   `scheduled_time` (`None`: never scheduled; not in this trace, but a log may have
///   such rows).
/// - An instance with neither time was already running when the trace began: created and
///   started at 0, the trace's start.
/// - It ended at its `deletion_time`, or, never deleted, at the trace's end (the latest
///   time in the file), as in [`parse_dlrm`].
///
/// The trace names no node, so [`RecordedRun::node`] is `None`.
pub fn parse_dlrm_recorded(
    name: &str,
    text: &str,
) -> Result<(Vec<(Job, RecordedRun)>, ParseReport), DatasetError> {
    let (instances, report, end) = read_instances(name, text)?;
    if instances.is_empty() {
        return Err(report.no_valid_rows());
    }
    let rows = instances
        .into_iter()
        .enumerate()
        .map(|(i, instance)| {
            let created = instance.creation.unwrap_or(0.0);
            let scheduled = match instance.creation {
                Some(_) => instance.scheduled,
                None => Some(instance.scheduled.unwrap_or(0.0)),
            };
            let deleted = instance.deletion.unwrap_or(end);
            let mut job = instance.job;
            job.id = JobId(i as u32);
            job.submit_time = created;
            job.total_work = deleted - created;
            let run = RecordedRun {
                created,
                scheduled,
                deleted,
                node: None,
            };
            (job, run)
        })
        .collect();
    Ok((rows, report))
}

/// Every valid row of the trace, in file order, and the trace's end (the latest time in
/// the file).
fn read_instances(
    name: &str,
    text: &str,
) -> Result<(Vec<Instance>, ParseReport, f64), DatasetError> {
    let table = Table::open(name, text, HEADER)?;
    let col = |n: &'static str| table.column(n, HEADER);
    let cols = Cols {
        sn: col("instance_sn")?,
        role: col("role")?,
        app: col("app_name")?,
        cpu: (col("cpu_request")?, col("cpu_limit")?),
        gpu: (col("gpu_request")?, col("gpu_limit")?),
        rdma: (col("rdma_request")?, col("rdma_limit")?),
        memory: (col("memory_request")?, col("memory_limit")?),
        disk: (col("disk_request")?, col("disk_limit")?),
        max_per_node: col("max_instance_per_node")?,
        creation: col("creation_time")?,
        scheduled: col("scheduled_time")?,
        deletion: col("deletion_time")?,
    };
    let (instances, report) = read_unique_rows(name, table, cols.sn, |row| parse_row(row, &cols));
    let end = instances.iter().map(|i| i.latest).fold(0.0, f64::max);
    Ok((instances, report, end))
}

fn parse_row(row: &Row<'_>, c: &Cols) -> Result<Instance, Bad> {
    let sn = row.text(c.sn)?;
    let role = row.text(c.role)?;
    let app = row.text(c.app)?;
    let cores = request(row, c.cpu)?;
    let gpus: u16 = row.uint(c.gpu.0)?;
    let gpu_limit: u16 = row.uint(c.gpu.1)?;
    if gpu_limit < gpus {
        return Err(Bad::new(
            c.gpu.1.name,
            format!("limit {gpu_limit} is below the request {gpus}"),
        ));
    }
    request(row, c.rdma)?;
    let gib = request(row, c.memory)?;
    request(row, c.disk)?;
    match (role, gpus) {
        ("CN", 0) | ("HN", 1..) => {}
        ("CN" | "HN", _) => {
            return Err(Bad::new(
                "role",
                format!("a {role} instance requesting {gpus} GPUs"),
            ));
        }
        _ => {
            return Err(Bad::new(
                "role",
                format!("unknown role {role:?} (expected CN or HN)"),
            ));
        }
    }
    let max_per_node = row.text(c.max_per_node)?;
    if max_per_node != "-1" {
        let n: u32 = row.uint(c.max_per_node)?;
        if n == 0 {
            return Err(Bad::new(
                c.max_per_node.name,
                "0 (expected -1 or at least 1)",
            ));
        }
    }
    let cpu_milli = scaled(cores, 1000.0, c.cpu.0)?;
    let memory_mib = scaled(gib, 1024.0, c.memory.0)?;
    let creation = optional_time(row, c.creation)?;
    let scheduled = optional_time(row, c.scheduled)?;
    let deletion = optional_time(row, c.deletion)?;
    let times = [
        (c.creation, creation),
        (c.scheduled, scheduled),
        (c.deletion, deletion),
    ];
    let present: Vec<_> = times
        .iter()
        .filter_map(|&(col, t)| t.map(|t| (col, t)))
        .collect();
    for pair in present.windows(2) {
        let ((earlier, a), (later, b)) = (pair[0], pair[1]);
        if b < a {
            return Err(Bad::new(
                later.name,
                format!("{b} is before {} {a}", earlier.name),
            ));
        }
    }
    let latest = present.last().map_or(0.0, |&(_, t)| t);
    let job = Job {
        id: JobId(0),
        name: sn.to_string(),
        tenant: app.to_string(),
        priority: 1,
        workers: 1,
        gpu: if gpus == 0 {
            GpuDemand::None
        } else {
            GpuDemand::Whole(gpus)
        },
        cpu_milli: cpu_milli as u32,
        memory_mib,
        gpu_models: GpuModelSet::ANY,
        comm: CommPattern::None,
        workload: None,
        batch_size: None,
        total_work: 0.0,
        checkpoint: Checkpointing::default(),
        preemptible: false,
        elastic: None,
        submit_time: 0.0,
    };
    Ok(Instance {
        job,
        creation,
        scheduled,
        deletion,
        latest,
    })
}

/// A (request, limit) pair of non-negative amounts; returns the request.
fn request(row: &Row<'_>, (request, limit): (Col, Col)) -> Result<f64, Bad> {
    let r = row.seconds(request)?;
    let l = row.seconds(limit)?;
    if l < r {
        return Err(Bad::new(
            limit.name,
            format!("limit {l} is below the request {r}"),
        ));
    }
    Ok(r)
}

/// `amount × unit`, rounded, as an integer that fits `u32` (CPU) or `u64` (memory).
fn scaled(amount: f64, unit: f64, col: Col) -> Result<u64, Bad> {
    let value = (amount * unit).round();
    if value > f64::from(u32::MAX) {
        return Err(Bad::new(col.name, format!("{amount} is too large")));
    }
    Ok(value as u64)
}

fn optional_time(row: &Row<'_>, col: Col) -> Result<Option<f64>, Bad> {
    if row.get(col)?.is_empty() {
        return Ok(None);
    }
    row.seconds(col).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "instance_sn,role,app_name,cpu_request,cpu_limit,gpu_request,gpu_limit,rdma_request,rdma_limit,memory_request,memory_limit,disk_request,disk_limit,max_instance_per_node,creation_time,scheduled_time,deletion_time
instance_0,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,
instance_1,CN,app_22,64,64,0,0,1,1,320.0,320.0,544.0,640.0,-1,475.5,623.0,
instance_2,CN,app_88,64,64,0,0,1,1,320.0,320.0,255.0,300.0,-1,610.0,683.0,91730.0
instance_3,HN,app_0,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,,,2000.0
";

    #[test]
    fn instances_are_one_worker_serving_jobs_living_until_deleted() {
        let (jobs, report) = parse_dlrm("dlrm.csv", TRACE).unwrap();
        assert_eq!((report.rows_read, report.rows_skipped), (4, 0));
        let got: Vec<_> = jobs
            .iter()
            .map(|j| {
                (
                    j.id.0,
                    j.name.as_str(),
                    j.tenant.as_str(),
                    j.submit_time,
                    j.total_work,
                )
            })
            .collect();
        // The trace ends at 91,730 s, the latest time in the file.
        assert_eq!(
            got,
            vec![
                (0, "instance_0", "app_0", 0.0, 91_730.0),
                (1, "instance_3", "app_0", 0.0, 2000.0),
                (2, "instance_1", "app_22", 475.5, 91_730.0 - 475.5),
                (3, "instance_2", "app_88", 610.0, 91_730.0 - 610.0),
            ]
        );
        assert_eq!(jobs[0].gpu, GpuDemand::Whole(1));
        assert_eq!(
            (jobs[0].cpu_milli, jobs[0].memory_mib),
            (12_000, 120 * 1024)
        );
        assert_eq!(jobs[2].gpu, GpuDemand::None);
        assert_eq!(
            (jobs[2].cpu_milli, jobs[2].memory_mib),
            (64_000, 320 * 1024)
        );
        assert!(
            jobs.iter().all(|j| j.workers == 1
                && j.priority == 1
                && !j.preemptible
                && j.validate().is_ok())
        );
    }

    #[test]
    fn recorded_runs_keep_file_order_and_the_files_clock() {
        let never = "instance_4,CN,app_9,48,48,0,0,1,1,200.0,200.0,255.0,300.0,-1,700.0,,900.0\n";
        let text = format!("{TRACE}{never}");
        let (rows, report) = parse_dlrm_recorded("dlrm.csv", &text).unwrap();
        assert_eq!((report.rows_read, report.rows_skipped), (5, 0));
        let got: Vec<_> = rows
            .iter()
            .map(|(j, r)| {
                (
                    j.id.0,
                    j.name.as_str(),
                    j.submit_time,
                    r.created,
                    r.scheduled,
                    r.deleted,
                )
            })
            .collect();
        // Running when the trace began: created and started at 0. Never deleted: ends at
        // the trace's end, 91,730 s. Created but never scheduled: no start.
        assert_eq!(
            got,
            vec![
                (0, "instance_0", 0.0, 0.0, Some(0.0), 91_730.0),
                (1, "instance_1", 475.5, 475.5, Some(623.0), 91_730.0),
                (2, "instance_2", 610.0, 610.0, Some(683.0), 91_730.0),
                (3, "instance_3", 0.0, 0.0, Some(0.0), 2000.0),
                (4, "instance_4", 700.0, 700.0, None, 900.0),
            ]
        );
        assert!(rows.iter().all(|(_, r)| r.node.is_none()));
        assert_eq!(rows[2].0.total_work, 91_730.0 - 610.0);
        let err = parse_dlrm_recorded("n.csv", &format!("{HEADER}\n")).unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }

    #[test]
    fn bad_dlrm_rows_are_skipped_with_line_and_field() {
        let row = |fields: &[(usize, &str)]| {
            let mut f: Vec<String> = "i,HN,app,12,12,1,1,25,25,120.0,120.0,640.0,800.0,8,10,20,30"
                .split(',')
                .map(String::from)
                .collect();
            for &(i, v) in fields {
                f[i] = v.to_string();
            }
            f.join(",")
        };
        let rows = [
            row(&[(0, "b0"), (1, "XN")]),
            row(&[(0, "b1"), (1, "CN")]),
            row(&[(0, "b2"), (3, "NaN")]),
            row(&[(0, "b3"), (4, "8")]),
            row(&[(0, "b4"), (5, "2")]),
            row(&[(0, "b5"), (9, "-1")]),
            row(&[(0, "b6"), (13, "0")]),
            row(&[(0, "b7"), (15, "5")]),
            row(&[(0, "b8"), (16, "15")]),
            row(&[(0, "instance_0")]),
            row(&[(0, "b10"), (5, "0.5")]),
            row(&[(0, "ok")]),
        ];
        let text = format!("{TRACE}{}\n", rows.join("\n"));
        let (jobs, report) = parse_dlrm("d.csv", &text).unwrap();
        assert_eq!(jobs.len(), 5);
        assert_eq!((report.rows_read, report.rows_skipped), (16, 11));
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (6, "role"),
                (7, "role"),
                (8, "cpu_request"),
                (9, "cpu_limit"),
                (10, "gpu_limit"),
                (11, "memory_request"),
                (12, "max_instance_per_node"),
                (13, "scheduled_time"),
                (14, "deletion_time"),
                (15, "instance_sn"),
                (16, "gpu_request"),
            ]
        );
        assert!(report.skipped[0].reason.contains("unknown role"));
        assert!(
            report.skipped[1]
                .reason
                .contains("CN instance requesting 1 GPUs")
        );
        assert!(report.skipped[7].reason.contains("before creation_time"));
        assert!(report.skipped[10].reason.contains("whole"));
    }

    #[test]
    fn dlrm_header_errors_name_the_missing_column() {
        let err = parse_dlrm("h.csv", "instance_sn,role,app_name\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. }
                if file == "h.csv" && field == "cpu_request"),
            "{err}"
        );
        let err = parse_dlrm("n.csv", &format!("{HEADER}\n")).unwrap_err();
        assert!(matches!(err, DatasetError::NoValidRows { .. }), "{err}");
    }
}
