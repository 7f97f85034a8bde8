//! Lucid's (ASPLOS '23) job profiles: `single_data.csv` (each job configuration alone on
//! a GPU) and `colocate_info.csv` (pairs of jobs sharing a GPU and their slowdowns).
//! S-Lab License 1.0 (non-commercial): read from the traces directory, never bundled.

use std::collections::HashSet;

use serde::Serialize;

use crate::resolve::{find_in_trace_dirs, read_text_file, trace_dirs};
use crate::table::{Bad, Col, Row, Table};
use crate::{DatasetError, ParseReport};

const SINGLE_HEADER: &str = "model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label";
const PAIR_HEADER: &str = ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,model2,dataset2,\
                           gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem";

/// A job configuration as Lucid profiles it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct LucidJob {
    pub model: String,
    pub dataset: String,
    /// Samples per step.
    pub batch_size: u32,
    /// Mixed precision (automatic mixed precision on).
    pub amp: bool,
}

/// One job configuration running alone on one GPU (`single_data.csv`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LucidSingle {
    pub job: LucidJob,
    /// Training speed as Lucid logged it (model-specific units, e.g. samples/s or
    /// iterations/s; comparable only within a model).
    pub speed: f64,
    /// GPU utilisation, percent (0–100).
    pub gpu_util_pct: f64,
    /// GPU memory-bandwidth utilisation, percent (0–100).
    pub gmem_util_pct: f64,
    /// GPU memory used, MiB.
    pub gmem_mib: f64,
    /// Lucid's packing label: 0, 1 or 2 (how readily the job shares a GPU; 0 packs best).
    pub label: u8,
}

/// Two jobs sharing one GPU (`colocate_info.csv`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LucidPair {
    pub a: LucidJob,
    pub b: LucidJob,
    /// GPUs each job used (1 in every published row).
    pub gpus_a: u32,
    pub gpus_b: u32,
    /// Speed of each job while co-located, normalised to its speed alone (1 = no
    /// slowdown; values slightly above 1 are measurement noise).
    pub speed_a: f64,
    pub speed_b: f64,
    /// Combined GPU utilisation and memory-bandwidth utilisation, percent.
    pub gpu_util_pct: f64,
    pub gmem_util_pct: f64,
    /// Combined GPU memory used, MiB.
    pub gmem_mib: f64,
}

/// Lucid's profiles, for lookups.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LucidProfiles {
    pub singles: Vec<LucidSingle>,
    pub pairs: Vec<LucidPair>,
}

impl LucidProfiles {
    /// The profile of `job` alone.
    pub fn single(&self, job: &LucidJob) -> Option<&LucidSingle> {
        self.singles.iter().find(|s| &s.job == job)
    }

    /// The normalised speeds (of `a`, of `b`) when `a` and `b` share a GPU, in either
    /// order of the file.
    pub fn colocated(&self, a: &LucidJob, b: &LucidJob) -> Option<(f64, f64)> {
        self.pairs.iter().find_map(|p| {
            if &p.a == a && &p.b == b {
                Some((p.speed_a, p.speed_b))
            } else if &p.a == b && &p.b == a {
                Some((p.speed_b, p.speed_a))
            } else {
                None
            }
        })
    }

    /// The models profiled alone, sorted.
    pub fn models(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.singles.iter().map(|s| s.job.model.as_str()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

struct JobCols {
    model: Col,
    dataset: Col,
    batch: Col,
    amp: Col,
}

impl JobCols {
    fn read(&self, row: &Row<'_>) -> Result<LucidJob, Bad> {
        let amp: u8 = row.uint(self.amp)?;
        if amp > 1 {
            return Err(Bad::new(self.amp.name, format!("{amp} is not 0 or 1")));
        }
        let batch_size: u32 = row.uint(self.batch)?;
        if batch_size == 0 {
            return Err(Bad::new(self.batch.name, "batch size 0"));
        }
        Ok(LucidJob {
            model: row.text(self.model)?.to_string(),
            dataset: row.text(self.dataset)?.to_string(),
            batch_size,
            amp: amp == 1,
        })
    }
}

/// A finite non-negative number; a percentage also at most 100 (`max`).
fn number(row: &Row<'_>, col: Col, max: Option<f64>) -> Result<f64, Bad> {
    let v = row.seconds(col)?;
    match max {
        Some(m) if v > m => Err(Bad::new(col.name, format!("{v} is above {m}"))),
        _ => Ok(v),
    }
}

/// Parses Lucid's `single_data.csv` (see [`LucidSingle`] for units), in file order.
///
/// Skipped rows: an empty field, a number that is not finite and non-negative, a
/// percentage above 100, `amp` not 0/1, batch size 0, `label` not 0–2, a repeated job.
pub fn parse_lucid_single(
    name: &str,
    text: &str,
) -> Result<(Vec<LucidSingle>, ParseReport), DatasetError> {
    let table = Table::open(name, text, SINGLE_HEADER)?;
    let job = JobCols {
        model: table.column("model", SINGLE_HEADER)?,
        dataset: table.column("dataset", SINGLE_HEADER)?,
        batch: table.column("batchsize", SINGLE_HEADER)?,
        amp: table.column("amp", SINGLE_HEADER)?,
    };
    let speed = table.column("speed", SINGLE_HEADER)?;
    let gpu_util = table.column("gpu_util", SINGLE_HEADER)?;
    let gmem_util = table.column("gmem_util", SINGLE_HEADER)?;
    let gmem = table.column("gmem", SINGLE_HEADER)?;
    let label = table.column("label", SINGLE_HEADER)?;
    let mut report = ParseReport::new(name);
    let mut singles = Vec::new();
    let mut seen = HashSet::new();
    table.for_each_row(&mut report, |row| {
        let s = LucidSingle {
            job: job.read(row)?,
            speed: number(row, speed, None)?,
            gpu_util_pct: number(row, gpu_util, Some(100.0))?,
            gmem_util_pct: number(row, gmem_util, Some(100.0))?,
            gmem_mib: number(row, gmem, None)?,
            label: row.uint(label)?,
        };
        if s.label > 2 {
            return Err(Bad::new("label", format!("{} is not 0, 1 or 2", s.label)));
        }
        if !seen.insert(s.job.clone()) {
            return Err(Bad::new("model", format!("repeated job {:?}", s.job)));
        }
        singles.push(s);
        Ok(())
    });
    if singles.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((singles, report))
}

/// Parses Lucid's `colocate_info.csv` (see [`LucidPair`] for units), in file order; the
/// unnamed first column (a row index) is validated as a whole number, not kept.
///
/// Skipped rows: as for [`parse_lucid_single`], plus a GPU count of 0.
pub fn parse_lucid_colocation(
    name: &str,
    text: &str,
) -> Result<(Vec<LucidPair>, ParseReport), DatasetError> {
    let table = Table::open(name, text, PAIR_HEADER)?;
    let index = table.column("", PAIR_HEADER)?;
    let side = |n: u8| -> Result<(JobCols, Col, Col), DatasetError> {
        let c = |one: &'static str, two: &'static str| {
            table.column(if n == 1 { one } else { two }, PAIR_HEADER)
        };
        Ok((
            JobCols {
                model: c("model1", "model2")?,
                dataset: c("dataset1", "dataset2")?,
                batch: c("batchsize1", "batchsize2")?,
                amp: c("amp1", "amp2")?,
            },
            c("gpu_num1", "gpu_num2")?,
            c("speed1", "speed2")?,
        ))
    };
    let (job_a, gpus_a, speed_a) = side(1)?;
    let (job_b, gpus_b, speed_b) = side(2)?;
    let gpu_util = table.column("gpu_util", PAIR_HEADER)?;
    let gmem_util = table.column("gmem_util", PAIR_HEADER)?;
    let gmem = table.column("gmem", PAIR_HEADER)?;
    let mut report = ParseReport::new(name);
    let mut pairs = Vec::new();
    table.for_each_row(&mut report, |row| {
        let _: u64 = row.uint(index)?;
        let gpus = |col: Col| -> Result<u32, Bad> {
            match row.uint(col)? {
                0 => Err(Bad::new(col.name, "0 GPUs")),
                g => Ok(g),
            }
        };
        pairs.push(LucidPair {
            a: job_a.read(row)?,
            gpus_a: gpus(gpus_a)?,
            speed_a: number(row, speed_a, None)?,
            b: job_b.read(row)?,
            gpus_b: gpus(gpus_b)?,
            speed_b: number(row, speed_b, None)?,
            gpu_util_pct: number(row, gpu_util, Some(100.0))?,
            gmem_util_pct: number(row, gmem_util, Some(100.0))?,
            gmem_mib: number(row, gmem, None)?,
        });
        Ok(())
    });
    if pairs.is_empty() {
        return Err(report.no_valid_rows());
    }
    Ok((pairs, report))
}

/// Lucid's profiles from `lucid-profiles/{single_data,colocate_info}.csv` in the traces
/// directory (not bundled: non-commercial licence); reports of both files, in that order.
pub fn load_lucid_profiles() -> Result<(LucidProfiles, Vec<ParseReport>), DatasetError> {
    let dirs = trace_dirs();
    let single = find_in_trace_dirs("lucid-profiles", "lucid-profiles/single_data.csv", &dirs)?;
    let pairs = find_in_trace_dirs("lucid-profiles", "lucid-profiles/colocate_info.csv", &dirs)?;
    let (singles, r1) =
        parse_lucid_single(&single.display().to_string(), &read_text_file(&single)?)?;
    let (pairs, r2) =
        parse_lucid_colocation(&pairs.display().to_string(), &read_text_file(&pairs)?)?;
    Ok((LucidProfiles { singles, pairs }, vec![r1, r2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(model: &str, dataset: &str, batch_size: u32, amp: bool) -> LucidJob {
        LucidJob {
            model: model.into(),
            dataset: dataset.into(),
            batch_size,
            amp,
        }
    }

    #[test]
    fn single_rows_validate_units_and_labels() {
        let text = "model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label
BERT,SQuAD,32,0,84.872,99.689,62.484,20162.0,2
BERT,SQuAD,32,1,119.911,99.593,74.23,16334.0,2
BERT,SQuAD,32,1,119.911,99.593,74.23,16334.0,2
DCGAN,LSUN,32,2,1.0,1.0,1.0,1.0,1
DCGAN,LSUN,32,0,nan,1.0,1.0,1.0,1
DCGAN,LSUN,32,0,1.0,101,1.0,1.0,1
DCGAN,LSUN,32,0,1.0,1.0,1.0,-5,1
DCGAN,LSUN,32,0,1.0,1.0,1.0,5,3
,LSUN,32,0,1.0,1.0,1.0,5,1
";
        let (singles, report) = parse_lucid_single("s.csv", text).unwrap();
        assert_eq!(singles.len(), 2);
        assert_eq!(singles[0].gmem_mib, 20162.0);
        assert!(singles[1].job.amp);
        let got: Vec<_> = report.skipped_at();
        assert_eq!(
            got,
            vec![
                (4, "model"),
                (5, "amp"),
                (6, "speed"),
                (7, "gpu_util"),
                (8, "gmem"),
                (9, "label"),
                (10, "model"),
            ]
        );
        let err = parse_lucid_single("h.csv", "model,dataset\nA,B\n").unwrap_err();
        assert!(
            matches!(&err, DatasetError::Malformed { field, .. } if field == "batchsize"),
            "{err}"
        );
    }

    #[test]
    fn pairs_look_up_in_either_order() {
        let text = PAIR_HEADER.to_string()
            + "
0,MobileNetV3,ImageNet,1,32,0,0.983,ResNet18,CIFAR-10,1,32,0,1.034,64.789,29.461,5106
1,MobileNetV3,ImageNet,0,32,0,0.983,ResNet18,CIFAR-10,1,32,0,1.034,64.789,29.461,5106
2,MobileNetV3,ImageNet,1,32,0,0.983,ResNet18,CIFAR-10,1,32,0,-1,64.789,29.461,5106
x,MobileNetV3,ImageNet,1,32,0,0.983,ResNet18,CIFAR-10,1,32,0,1,64.789,29.461,5106
";
        let (pairs, report) = parse_lucid_colocation("c.csv", &text).unwrap();
        assert_eq!((pairs.len(), report.rows_skipped), (1, 3));
        let got: Vec<_> = report.skipped.iter().map(|s| s.field.as_str()).collect();
        assert_eq!(got, vec!["gpu_num1", "speed2", ""]);
        let profiles = LucidProfiles {
            singles: vec![],
            pairs,
        };
        let m = job("MobileNetV3", "ImageNet", 32, false);
        let r = job("ResNet18", "CIFAR-10", 32, false);
        assert_eq!(profiles.colocated(&m, &r), Some((0.983, 1.034)));
        assert_eq!(profiles.colocated(&r, &m), Some((1.034, 0.983)));
        assert_eq!(profiles.colocated(&m, &m), None);
    }
}
