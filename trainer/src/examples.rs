//! Training examples from Parquet step profiles.

use std::collections::BTreeMap;
use std::path::Path;

use marshal_telemetry::{Query, ScanReport, StepProfile, TelemetryKind, read_all};

use crate::TrainerError;

/// One job on one placement shape at one co-tenancy: its features and measured answers.
#[derive(Clone, Debug, PartialEq)]
pub struct StepExample {
    pub job_id: String,
    /// Workload kind (what the job trains).
    pub model: String,
    pub gpu_type: String,
    pub num_gpus: u32,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Widest topology level the GPUs span.
    pub span: String,
    pub batch_size: Option<u32>,
    pub comm: String,
    pub tenants: u16,
    /// Median step time of the steady steps, seconds.
    pub step_time_s: f64,
    /// Median GPU utilisation of the steady steps.
    pub gpu_util_pct: Option<f64>,
    /// Peak memory per GPU by phase (warm-up, steady, eval, checkpoint), GiB.
    pub peak_mem_gib: [Option<f64>; 4],
    /// Step profile rows behind the example.
    pub rows: usize,
}

fn parse_shape(placement: &str) -> Option<(u32, u32)> {
    let (n, g) = placement.split_once('x')?;
    Some((n.parse().ok()?, g.parse().ok()?))
}

/// The median (the mean of the middle two for an even count); `None` when empty.
pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// What [`load_step_examples`] read and left out.
#[derive(Debug, Default)]
pub struct StepScanReport {
    /// Files read, pruned and skipped as damaged.
    pub files: ScanReport,
    /// Rows whose step time is not a positive number (NaN, infinite, zero or negative:
    /// written by another tool, since the sink refuses them), left out of every median.
    pub rows_bad_step_time: u64,
}

/// Reads the step profiles under `dir` and groups them into examples. Rows without a
/// model or a readable placement shape are skipped, and so are rows without a usable
/// step time (counted); damaged files are in the report.
pub fn load_step_examples(dir: &Path) -> Result<(Vec<StepExample>, StepScanReport), TrainerError> {
    let (rows, files): (Vec<StepProfile>, _) = read_all(dir, Query::new(TelemetryKind::Step))?;
    let (out, rows_bad_step_time) = examples_from_rows(rows);
    if out.is_empty() {
        return Err(TrainerError::NoExamples(dir.display().to_string()));
    }
    let report = StepScanReport {
        files,
        rows_bad_step_time,
    };
    Ok((out, report))
}

/// Groups step-profile rows into examples; also returns how many rows were left out
/// for a step time that is not a positive number.
fn examples_from_rows(rows: Vec<StepProfile>) -> (Vec<StepExample>, u64) {
    let mut bad_step_time = 0;
    type Key = (String, String, String, u16, String);
    let mut groups: BTreeMap<Key, Vec<StepProfile>> = BTreeMap::new();
    for r in rows {
        if !(r.step_time_s.is_finite() && r.step_time_s > 0.0) {
            bad_step_time += 1;
            continue;
        }
        let Some(model) = r.model.as_deref() else {
            continue;
        };
        let key = (
            r.job_id.to_string(),
            r.placement.to_string(),
            r.span.as_deref().unwrap_or("").to_string(),
            r.tenants.unwrap_or(1),
            model.to_string(),
        );
        groups.entry(key).or_default().push(r);
    }
    let phases = ["warmup", "steady", "eval", "checkpoint"];
    let mut out = Vec::new();
    for ((job_id, placement, span, tenants, model), rows) in groups {
        let Some((nodes, gpus_per_node)) = parse_shape(&placement) else {
            continue;
        };
        let steady: Vec<&StepProfile> = rows
            .iter()
            .filter(|r| r.phase.map(|p| p.as_str()) == Some("steady"))
            .collect();
        let Some(step_time_s) = median(steady.iter().map(|r| r.step_time_s).collect()) else {
            continue;
        };
        let mut peak_mem_gib = [None; 4];
        for (i, phase) in phases.iter().enumerate() {
            peak_mem_gib[i] = rows
                .iter()
                .filter(|r| r.phase.map(|p| p.as_str()) == Some(*phase))
                .filter_map(|r| r.peak_mem_bytes)
                .max()
                .map(|b| b as f64 / (1u64 << 30) as f64);
        }
        let first = &rows[0];
        out.push(StepExample {
            job_id,
            model,
            gpu_type: first.gpu_type.to_string(),
            num_gpus: first.num_gpus,
            nodes,
            gpus_per_node,
            span,
            batch_size: first.batch_size,
            comm: first.comm.as_deref().unwrap_or("none").to_string(),
            tenants,
            step_time_s,
            gpu_util_pct: median(
                steady
                    .iter()
                    .filter_map(|r| r.gpu_util_pct.map(f64::from))
                    .collect(),
            ),
            peak_mem_gib,
            rows: rows.len(),
        });
    }
    (out, bad_step_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use marshal_telemetry::MemPhase;

    fn row(job: &str, step_time_s: f64) -> StepProfile {
        StepProfile {
            job_id: job.into(),
            step_time_s,
            phase: Some(MemPhase::Steady),
            gpu_type: "V100".into(),
            num_gpus: 2,
            placement: "1x2".into(),
            model: Some("bert".into()),
            ..Default::default()
        }
    }

    #[test]
    fn rows_without_a_positive_step_time_are_counted_and_left_out_of_the_median() {
        let rows = vec![
            row("a", 2.0),
            row("a", f64::NAN),
            row("a", 4.0),
            row("a", f64::INFINITY),
            row("a", -1.0),
            row("b", 0.0),
            row("c", 3.0),
        ];
        let (examples, bad) = examples_from_rows(rows);
        assert_eq!(bad, 4);
        let times: Vec<(&str, f64)> = examples
            .iter()
            .map(|e| (e.job_id.as_str(), e.step_time_s))
            .collect();
        assert_eq!(times, [("a", 3.0), ("c", 3.0)], "job b had no usable row");
    }
}
