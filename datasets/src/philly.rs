//! Microsoft's Philly trace (2017): the job list as processed by Pollux, and the machine
//! list with Hu et al.'s corrected GPU counts.

use std::collections::HashMap;

use chrono::{NaiveDate, NaiveDateTime};
use marshal_scheduler::domain::{ClusterSpec, GpuCatalog, Job, JobId, NodeGroupSpec};

use crate::bundled::{Bundled, PHILLY_MACHINES, PHILLY_REVISED_MACHINES};
use crate::openb::{NODES_PER_RACK, RACKS_PER_SPINE, push_grouped};
use crate::table::{Bad, Table};
use crate::{DatasetError, ParseReport, links};

const JOB_HEADER: &str = "timestamp,duration,num_gpus,gpu_time,cluster";
const TIMESTAMP_FORMAT: &str = "%Y-%m-%d %H:%M:%S";
const DAY_S: f64 = 86_400.0;

const MACHINE_HEADER: &str = "machineId,number of GPUs,single GPU mem";
const REVISED_HEADER: &str = ",machineId,number of GPUs";
/// Philly publishes no CPU or memory per machine, and its jobs ask for neither; every
/// node gets this much so that the spec is complete.
const NODE_CPU_MILLI: u32 = 32_000;
const NODE_MEMORY_MIB: u64 = 256 * 1024;

struct PhillyRow {
    line: usize,
    submit: i64,
    gpus: u32,
    duration: f64,
    vc: String,
}

/// Parses the Pollux copy of the Philly trace (`timestamp,duration,num_gpus,gpu_time,
/// cluster`; `gpu_time` is derived and not read).
///
/// Jobs are sorted by submit time (stable, so ties keep file order) and numbered in that
/// order; `submit_time` is seconds since the earliest submission. Each job is
/// [`Job::whole_gpus`] (one worker per GPU, data-parallel when it has more than one),
/// with `total_work` = the measured duration, tenant = the virtual cluster and name
/// `philly-<line>`. Timestamps are `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn parse_philly(name: &str, text: &str) -> Result<(Vec<Job>, ParseReport), DatasetError> {
    let table = Table::open(name, text, JOB_HEADER)?;
    let timestamp = table.column("timestamp", JOB_HEADER)?;
    let duration = table.column("duration", JOB_HEADER)?;
    let num_gpus = table.column("num_gpus", JOB_HEADER)?;
    let cluster = table.column("cluster", JOB_HEADER)?;
    let mut report = ParseReport::new(name);
    let mut rows = Vec::new();
    table.for_each_row(&mut report, |row| {
        let ts = row.text(timestamp)?;
        let submit = parse_timestamp(ts)?;
        let duration = row.time_s(duration)?;
        let gpus = crate::jobs::at_least_one_gpu(row.uint(num_gpus)?, "num_gpus")?;
        if rows.len() >= u32::MAX as usize {
            return Err(Bad::new("record", "too many rows"));
        }
        let vc = row.text(cluster)?.to_string();
        rows.push(PhillyRow {
            line: row.line,
            submit,
            gpus,
            duration,
            vc,
        });
        Ok(())
    });
    let Some(t0) = rows.iter().map(|r| r.submit).min() else {
        return Err(report.no_valid_rows());
    };
    rows.sort_by_key(|r| r.submit);
    let jobs = rows
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let mut job =
                Job::whole_gpus(JobId(i as u32), r.gpus, (r.submit - t0) as f64, r.duration);
            job.name = format!("philly-{}", r.line);
            job.tenant = r.vc;
            job
        })
        .collect();
    Ok((jobs, report))
}

/// Seconds since the Unix epoch of a `YYYY-MM-DD HH:MM:SS` UTC timestamp, refused before
/// 1970: no GPU cluster ran then, and one such row (a year `0000` from a broken export)
/// would become the trace's start and push every other job millennia later.
pub(crate) fn parse_timestamp(ts: &str) -> Result<i64, Bad> {
    let t = parse_any_timestamp(ts)?;
    if t < 0 {
        return Err(Bad::new(
            "timestamp",
            format!("{ts:?} is before 1970-01-01, the earliest time a trace may hold"),
        ));
    }
    Ok(t)
}

/// [`parse_timestamp`] without the range check. The canonical layout takes a fast path
/// (chrono's format parser dominates the parse otherwise); other layouts go through
/// chrono, which also words the errors.
fn parse_any_timestamp(ts: &str) -> Result<i64, Bad> {
    let b = ts.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<u32> {
        let digits = b.get(range)?;
        digits.iter().try_fold(0u32, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + u32::from(d - b'0'))
        })
    };
    if b.len() == 19
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b' '
        && b[13] == b':'
        && b[16] == b':'
        && let (Some(y), Some(mo), Some(d), Some(h), Some(mi), Some(s)) = (
            num(0..4),
            num(5..7),
            num(8..10),
            num(11..13),
            num(14..16),
            num(17..19),
        )
        && let Some(t) =
            NaiveDate::from_ymd_opt(y as i32, mo, d).and_then(|date| date.and_hms_opt(h, mi, s))
    {
        return Ok(t.and_utc().timestamp());
    }
    NaiveDateTime::parse_from_str(ts, TIMESTAMP_FORMAT)
        .map(|t| t.and_utc().timestamp())
        .map_err(|e| {
            Bad::new(
                "timestamp",
                format!("{ts:?} is not YYYY-MM-DD HH:MM:SS: {e}"),
            )
        })
}

/// The jobs submitted in `[start_day, start_day + days)` (days since the trace's start),
/// in their original order, with submit times rebased to the window's start and ids
/// renumbered from 0. Works on any job list with submit times in seconds.
pub fn philly_window(jobs: &[Job], start_day: f64, days: f64) -> Vec<Job> {
    let start = start_day * DAY_S;
    let end = start + days * DAY_S;
    jobs.iter()
        .filter(|j| j.submit_time >= start && j.submit_time < end)
        .enumerate()
        .map(|(i, j)| Job {
            id: JobId(i as u32),
            submit_time: j.submit_time - start,
            ..j.clone()
        })
        .collect()
}

/// The Philly cluster: `cluster_machine_list` (machine, GPUs, per-GPU memory) joined with
/// Hu et al.'s `revised_machine_list.csv`, whose GPU counts (inferred from utilisation
/// logs) replace the original ones; a machine missing there keeps its original count.
///
/// Machines left with 0 GPUs are dropped. GPUs are `philly-12g` / `philly-24g` by memory.
/// Consecutive machines of one shape form a group named by machine id. Philly's servers
/// had no NVLink (PCIe only); it publishes no rack map (16 nodes per rack and 8 racks per
/// spine are assumed) and no CPU/memory per machine (32 cores and 256 GiB are assumed:
/// Philly jobs ask for neither).
pub fn philly_cluster() -> Result<ClusterSpec, DatasetError> {
    parse_philly_cluster(PHILLY_MACHINES, PHILLY_REVISED_MACHINES)
}

fn parse_philly_cluster(machines: Bundled, revised: Bundled) -> Result<ClusterSpec, DatasetError> {
    let revised_gpus = parse_revised(revised)?;
    let table = Table::open(machines.name, machines.text, MACHINE_HEADER)?;
    let id_col = table.column("machineId", MACHINE_HEADER)?;
    let gpus_col = table.column("number of GPUs", MACHINE_HEADER)?;
    let mem_col = table.column("single GPU mem", MACHINE_HEADER)?;
    let catalog = GpuCatalog::default();
    let mut report = ParseReport::new(machines.name);
    let mut groups = Vec::new();
    table.for_each_row(&mut report, |row| {
        let id = row.text(id_col)?;
        let listed: u16 = row.uint(gpus_col)?;
        let mem = row.text(mem_col)?;
        let gib = mem
            .strip_suffix("GB")
            .or_else(|| mem.strip_suffix("gb"))
            .and_then(|n| n.trim().parse::<u32>().ok())
            .ok_or_else(|| Bad::new("single GPU mem", format!("{mem:?} is not <n>GB")))?;
        let model = format!("philly-{gib}g");
        if catalog.id(&model).is_none() {
            return Err(Bad::new(
                "single GPU mem",
                format!("no GPU model {model:?} for {mem}"),
            ));
        }
        let gpus = revised_gpus.get(id).copied().unwrap_or(listed);
        if gpus == 0 {
            return Ok(());
        }
        if gpus > 64 {
            return Err(Bad::new(
                "number of GPUs",
                format!("{gpus} GPUs on one machine"),
            ));
        }
        push_grouped(
            &mut groups,
            NodeGroupSpec {
                count: 1,
                name_prefix: None,
                names: vec![id.to_string()],
                gpu_model: Some(model),
                gpus,
                nvlink_domain: 0,
                cpu_milli: NODE_CPU_MILLI,
                memory_mib: NODE_MEMORY_MIB,
                mig_gpus: None,
                mig_layout: Vec::new(),
            },
        );
        Ok(())
    });
    if groups.is_empty() {
        return Err(report.no_valid_rows());
    }
    let spec = ClusterSpec {
        name: "philly".to_string(),
        nodes_per_rack: NODES_PER_RACK,
        racks_per_spine: RACKS_PER_SPINE,
        links: links::v100_era(),
        gpu_models: Vec::new(),
        node_groups: groups,
    };
    spec.validate().map_err(|e| DatasetError::InvalidCluster {
        file: machines.name.to_string(),
        reason: e.to_string(),
    })?;
    Ok(spec)
}

/// machine id → corrected GPU count. Unreadable rows are left out (the machine then keeps
/// its listed count).
fn parse_revised(revised: Bundled) -> Result<HashMap<String, u16>, DatasetError> {
    let table = Table::open(revised.name, revised.text, REVISED_HEADER)?;
    let id_col = table.column("machineId", REVISED_HEADER)?;
    let gpus_col = table.column("number of GPUs", REVISED_HEADER)?;
    let mut report = ParseReport::new(revised.name);
    let mut counts = HashMap::new();
    table.for_each_row(&mut report, |row| {
        counts.insert(row.text(id_col)?.to_string(), row.uint(gpus_col)?);
        Ok(())
    });
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use marshal_scheduler::domain::{CommPattern, GpuDemand};

    use super::*;

    const JOBS: &str = "timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,vc1
2017-10-09 06:13:03,2951.0,8,23608.0,vc2
2017-10-09 06:13:03,10.0,2,20.0,vc3

";

    #[test]
    fn jobs_are_sorted_by_submit_time_and_rebased_to_the_first() {
        let (jobs, report) = parse_philly("p.csv", JOBS).unwrap();
        assert_eq!(report.rows_read, 3, "trailing blank line is not a row");
        assert_eq!(report.rows_skipped, 0);
        let got: Vec<_> = jobs
            .iter()
            .map(|j| {
                (
                    j.id.0,
                    j.name.as_str(),
                    j.submit_time,
                    j.workers,
                    j.tenant.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "philly-3", 0.0, 8, "vc2"),
                (1, "philly-4", 0.0, 2, "vc3"),
                (2, "philly-2", 2932.0, 1, "vc1"),
            ]
        );
        assert_eq!(jobs[0].gpu, GpuDemand::Whole(1));
        assert_eq!(jobs[0].comm, CommPattern::DataParallel);
        assert_eq!(jobs[0].total_work, 2951.0);
        assert_eq!(jobs[2].comm, CommPattern::None);
    }

    #[test]
    fn bad_philly_rows_are_skipped_with_line_and_field() {
        let text = format!(
            "{}\n2017-10-09 07:01:55,NaN,1,66.0,vc1
2017-10-09 07:01:55,-3,1,66.0,vc1
2017-13-09 07:01:55,3,1,3,vc1
2017-10-09 07:01:55,3,0,0,vc1
2017-10-09 07:01:55,3,two,0,vc1
2017-10-09 07:01:55,3,1,3,
",
            JOBS.trim_end()
        );
        let (jobs, report) = parse_philly("p.csv", &text).unwrap();
        assert_eq!(report.rows_skipped, 6, "{report:?} {jobs:?}");
        assert_eq!(jobs.len(), 3);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (5, "duration"),
                (6, "duration"),
                (7, "timestamp"),
                (8, "num_gpus"),
                (9, "num_gpus"),
                (10, "cluster"),
            ]
        );
        assert!(report.skipped[0].reason.contains("not a number"));
    }

    #[test]
    fn philly_header_and_empty_files_are_errors() {
        let err = parse_philly("h.csv", "time,duration,num_gpus,cluster\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. } if file == "h.csv" && field == "timestamp"),
            "{err}"
        );
        let err = parse_philly("e.csv", "").unwrap_err();
        assert!(matches!(&err, DatasetError::Malformed { file, line: 1, .. } if file == "e.csv"));
        let err =
            parse_philly("n.csv", "timestamp,duration,num_gpus,gpu_time,cluster\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::NoValidRows { file, rows_skipped: 0, .. } if file == "n.csv")
        );
    }

    #[test]
    fn timestamps_are_utc_seconds_and_validated() {
        assert_eq!(parse_timestamp("1970-01-02 00:00:01").unwrap(), 86_401);
        assert_eq!(
            parse_timestamp("2017-09-04 10:30:41").unwrap(),
            1_504_521_041
        );
        // Non-canonical but valid layouts still parse, through chrono.
        assert_eq!(parse_timestamp("2017-9-4 10:30:41").unwrap(), 1_504_521_041);
        for bad in [
            "2017-02-30 00:00:00",
            "2017-10-09 24:00:00",
            "2017-10-09",
            "yesterday",
            "0000-01-01 00:00:00",
            "1969-12-31 23:59:59",
        ] {
            let err = parse_timestamp(bad).unwrap_err();
            assert_eq!(err.field, "timestamp", "{bad}");
        }
        assert!(
            parse_timestamp("0000-10-09 10:00:00")
                .unwrap_err()
                .reason
                .contains("before 1970-01-01")
        );
        assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0);
    }

    #[test]
    fn window_keeps_half_open_range_rebases_and_renumbers() {
        let jobs: Vec<Job> = [0.0, 0.5, 1.0, 1.5, 2.0]
            .iter()
            .enumerate()
            .map(|(i, &d)| Job::whole_gpus(JobId(i as u32 + 10), 1, d * DAY_S, 60.0))
            .collect();
        let window = philly_window(&jobs, 1.0, 1.0);
        let got: Vec<_> = window
            .iter()
            .map(|j| (j.id.0, j.submit_time, j.name.as_str()))
            .collect();
        assert_eq!(got, vec![(0, 0.0, "job-12"), (1, 0.5 * DAY_S, "job-13")]);
        assert!(philly_window(&jobs, 3.0, 7.0).is_empty());
        assert!(philly_window(&jobs, f64::NAN, 1.0).is_empty());
    }

    #[test]
    fn machine_list_joins_revised_counts_and_drops_empty_machines() {
        let machines = Bundled {
            name: "machines",
            text: "machineId, number of GPUs, single GPU mem\nm0,2, 12GB\nm1,2, 12GB\nm2,8, 24GB\nm3,8, 24GB\nm4,8, 48GB\n",
        };
        let revised = Bundled {
            name: "revised.csv",
            text: ",machineId,number of GPUs\n0,m0,8\n1,m1,8\n2,m2,0\n",
        };
        let spec = parse_philly_cluster(machines, revised).unwrap();
        let groups: Vec<_> = spec
            .node_groups
            .iter()
            .map(|g| (g.names.clone(), g.gpus, g.gpu_model.as_deref()))
            .collect();
        assert_eq!(
            groups,
            vec![
                (
                    vec!["m0".to_string(), "m1".to_string()],
                    8,
                    Some("philly-12g")
                ),
                (vec!["m3".to_string()], 8, Some("philly-24g")),
            ]
        );
        let bad = Bundled {
            name: "machines",
            text: "machine,gpus\n",
        };
        let err = parse_philly_cluster(bad, revised).unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. } if file == "machines" && field == "machineId")
        );
    }
}
