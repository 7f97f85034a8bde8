//! What is obtainable of Alibaba's PAI GPU trace (cluster-trace-gpu-v2020, "MLaaS in the
//! Wild", NSDI '22): the machine spec and the per-worker mini-batch-time samples of four
//! jobs. The job, task and instance tables are not published in a fetchable form.

use std::collections::HashSet;

use serde::Serialize;

use crate::bundled::PAI_MACHINE_SPEC_TGZ;
use crate::gzip::{gunzip, tar_member};
use crate::table::{Bad, Table, malformed, utf8_text};
use crate::{DatasetError, ParseReport};

const BATCH_HEADER: &str = ",worker,gpu,time,batch_time_norm";
/// `headers/pai_machine_spec.header`: the CSV itself has no header line.
pub(crate) const MACHINE_SPEC_HEADER: &str = "machine,gpu_type,cap_cpu,cap_mem,cap_gpu";
const MACHINE_SPEC_MEMBER: &str = "pai_machine_spec.csv";

/// One mini-batch-time sample of one worker of a PAI job (`job_<k>_norm.csv`).
#[derive(Copy, Clone, Debug, PartialEq, Serialize)]
pub struct BatchTimeSample {
    pub worker: u32,
    /// The file's `gpu` column, constant within a job (25, 20, 25, 50 in jobs 1–4); the
    /// PAI analysis does not define it (a GPU request in percent, as PAI's `plan_gpu`,
    /// is the likely reading).
    pub gpu: u32,
    /// The sample's time index (1-based, increasing; all workers share it).
    pub time: u32,
    /// The mini-batch time normalised to the job's slowest sample = 1000.
    pub batch_time_norm: f64,
}

/// Parses a PAI `job_<k>_norm.csv` (`,worker,gpu,time,batch_time_norm`; the unnamed
/// first column is a row index, validated as a whole number but not kept), in file order.
///
/// Skipped rows: a field that is empty or not a non-negative number, a `time` below the
/// previous kept row's (samples are grouped by time).
pub fn parse_pai_batch_times(
    name: &str,
    text: &str,
) -> Result<(Vec<BatchTimeSample>, ParseReport), DatasetError> {
    let table = Table::open(name, text, BATCH_HEADER)?;
    let index = table.column("", BATCH_HEADER)?;
    let worker = table.column("worker", BATCH_HEADER)?;
    let gpu = table.column("gpu", BATCH_HEADER)?;
    let time = table.column("time", BATCH_HEADER)?;
    let batch = table.column("batch_time_norm", BATCH_HEADER)?;
    let mut report = ParseReport::new(name);
    let mut samples: Vec<BatchTimeSample> = Vec::new();
    table.for_each_row(&mut report, |row| {
        let _: u64 = row.uint(index)?;
        let sample = BatchTimeSample {
            worker: row.uint(worker)?,
            gpu: row.uint(gpu)?,
            time: row.uint(time)?,
            batch_time_norm: row.seconds(batch)?,
        };
        if let Some(last) = samples.last()
            && sample.time < last.time
        {
            return Err(Bad::new(
                "time",
                format!("{} is before the previous row's {}", sample.time, last.time),
            ));
        }
        samples.push(sample);
        Ok(())
    });
    if samples.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((samples, report))
}

/// One PAI machine (`pai_machine_spec`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PaiMachine {
    pub machine: String,
    /// `P100`, `T4`, `V100`, `V100M32`, `MISC` (unnamed models) or `CPU`.
    pub gpu_type: String,
    pub cpu_cores: u32,
    pub memory_gib: u32,
    pub gpus: u32,
}

/// Parses PAI's machine spec: the header-less CSV `machine,gpu_type,cap_cpu,cap_mem,
/// cap_gpu` (column names from `headers/pai_machine_spec.header`; line numbers are
/// those of the file, whose first line is data).
///
/// Skipped rows: an empty field, a count that is not a non-negative whole number, a
/// repeated machine, a `CPU` machine with GPUs or a GPU machine without any.
pub fn parse_pai_machine_spec(
    name: &str,
    text: &str,
) -> Result<(Vec<PaiMachine>, ParseReport), DatasetError> {
    let table = Table::open_headerless(name, text, MACHINE_SPEC_HEADER);
    let machine = table.column("machine", MACHINE_SPEC_HEADER)?;
    let gpu_type = table.column("gpu_type", MACHINE_SPEC_HEADER)?;
    let cpu = table.column("cap_cpu", MACHINE_SPEC_HEADER)?;
    let mem = table.column("cap_mem", MACHINE_SPEC_HEADER)?;
    let gpus = table.column("cap_gpu", MACHINE_SPEC_HEADER)?;
    let mut report = ParseReport::new(name);
    let mut machines = Vec::new();
    let mut seen = HashSet::new();
    table.for_each_row(&mut report, |row| {
        let m = PaiMachine {
            machine: row.text(machine)?.to_string(),
            gpu_type: row.text(gpu_type)?.to_string(),
            cpu_cores: row.uint(cpu)?,
            memory_gib: row.uint(mem)?,
            gpus: row.uint(gpus)?,
        };
        if (m.gpu_type == "CPU") != (m.gpus == 0) {
            return Err(Bad::new(
                "cap_gpu",
                format!("{} GPUs on a {} machine", m.gpus, m.gpu_type),
            ));
        }
        if !seen.insert(m.machine.clone()) {
            return Err(Bad::new(
                "machine",
                format!("duplicate machine {:?}", m.machine),
            ));
        }
        machines.push(m);
        Ok(())
    });
    if machines.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((machines, report))
}

/// Reads `pai_machine_spec.csv` out of the published `pai_machine_spec.tar.gz` and
/// parses it. `name` is the archive's name, for messages.
pub fn parse_pai_machine_spec_archive(
    name: &str,
    archive: &[u8],
) -> Result<(Vec<PaiMachine>, ParseReport), DatasetError> {
    let bad = |reason: String| malformed(name, 1, "archive", reason);
    let tar = gunzip(archive).map_err(bad)?;
    let csv = tar_member(&tar, MACHINE_SPEC_MEMBER).map_err(bad)?;
    let file = format!("{name}:{MACHINE_SPEC_MEMBER}");
    let text = utf8_text(&file, &csv)?;
    parse_pai_machine_spec(&file, text)
}

/// PAI's machine spec (bundled, as published: `pai_machine_spec.tar.gz`): 1,897 machines.
pub fn pai_machine_spec() -> Result<(Vec<PaiMachine>, ParseReport), DatasetError> {
    parse_pai_machine_spec_archive(PAI_MACHINE_SPEC_TGZ.name, PAI_MACHINE_SPEC_TGZ.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_times_keep_file_order_and_count_bad_rows() {
        let text = ",worker,gpu,time,batch_time_norm
0,0,25,1,476
1,1,25,1,509
2,0,25,2,468.5
3,1,25,1,400
4,x,25,3,400
5,1,25,3,-4
6,1,25,3
";
        let (samples, report) = parse_pai_batch_times("job_1_norm.csv", text).unwrap();
        assert_eq!(samples.len(), 3);
        assert_eq!(
            samples[2],
            BatchTimeSample {
                worker: 0,
                gpu: 25,
                time: 2,
                batch_time_norm: 468.5
            }
        );
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (5, "time"),
                (6, "worker"),
                (7, "batch_time_norm"),
                (8, "batch_time_norm")
            ]
        );
        let err = parse_pai_batch_times("h.csv", "worker,gpu,time\n").unwrap_err();
        assert!(matches!(&err, DatasetError::Malformed { .. }), "{err}");
    }

    #[test]
    fn machine_spec_has_no_header_line() {
        let text = "7399a758,CPU,96,512,0
m1,P100,64,512,2
m2,T4,96,384,0
m3,CPU,96,512,2
m1,P100,64,512,2
m5,V100,96,512,-8
";
        let (machines, report) = parse_pai_machine_spec("spec.csv", text).unwrap();
        assert_eq!(report.rows_read, 6, "the first line is data");
        assert_eq!(machines.len(), 2);
        assert_eq!(
            machines[1],
            PaiMachine {
                machine: "m1".into(),
                gpu_type: "P100".into(),
                cpu_cores: 64,
                memory_gib: 512,
                gpus: 2
            }
        );
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (3, "cap_gpu"),
                (4, "cap_gpu"),
                (5, "machine"),
                (6, "cap_gpu")
            ]
        );
    }

    #[test]
    fn the_bundled_archive_matches_the_published_counts() {
        let (machines, report) = pai_machine_spec().unwrap();
        assert_eq!((report.rows_read, report.rows_skipped), (1_897, 0));
        assert!(
            report
                .source
                .ends_with("pai_machine_spec.tar.gz:pai_machine_spec.csv")
        );
        let gpus: u32 = machines.iter().map(|m| m.gpus).sum();
        assert_eq!(gpus, 6_742);
        let count = |t: &str| machines.iter().filter(|m| m.gpu_type == t).count();
        assert_eq!(
            [
                count("P100"),
                count("T4"),
                count("MISC"),
                count("V100M32"),
                count("V100"),
                count("CPU")
            ],
            [798, 497, 280, 135, 104, 83]
        );
        let err = parse_pai_machine_spec_archive("x.tar.gz", b"not gzip").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { file, field, .. } if file == "x.tar.gz" && field == "archive"),
            "{err}"
        );
    }
}
