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
    /// What became of the rows read.
    pub rows: RowsLeftOut,
}

/// The step-profile rows read, and those left out of every example, by reason (a row
/// is counted under the first reason that applies, in field order).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RowsLeftOut {
    pub rows_read: u64,
    /// Step time not a number of seconds within [`STEP_TIME_RANGE_S`] (NaN, infinite,
    /// zero, negative or absurd: written by another tool, since the sink refuses the
    /// first four).
    pub bad_step_time: u64,
    /// No model (workload kind): nothing to learn the row's job from.
    pub without_model: u64,
    /// A placement that is not `<nodes>x<GPUs per node>` with both at least 1.
    pub bad_placement: u64,
    /// A GPU count that does not fit the placement: 0, or not between one GPU per node
    /// and the shape's full size.
    pub gpus_not_in_placement: u64,
    /// A batch size of 0 (absent is fine: unknown).
    pub zero_batch_size: u64,
    /// Rows of (job, placement, co-tenancy) groups with no steady-phase row, so no
    /// step time to learn.
    pub without_steady_phase: u64,
}

impl RowsLeftOut {
    /// Rows left out, all reasons together.
    pub fn total(&self) -> u64 {
        self.malformed() + self.without_steady_phase
    }

    /// Rows left out for what they hold, not for what their job had yet reached (a job
    /// stopped during warm-up has no steady phase, and that is not damage).
    pub fn malformed(&self) -> u64 {
        self.bad_step_time
            + self.without_model
            + self.bad_placement
            + self.gpus_not_in_placement
            + self.zero_batch_size
    }

    /// One line: rows read, then each reason with its count (reasons with none left
    /// out).
    pub fn summary(&self) -> String {
        let reasons = [
            (
                self.bad_step_time,
                "a step time that is not a number of seconds between 1 µs and a day",
            ),
            (self.without_model, "no model"),
            (
                self.bad_placement,
                "a placement that is not <nodes>x<GPUs per node>",
            ),
            (
                self.gpus_not_in_placement,
                "a GPU count that does not fit the placement",
            ),
            (self.zero_batch_size, "a batch size of 0"),
            (
                self.without_steady_phase,
                "no steady-phase row in their job and placement",
            ),
        ];
        let parts: Vec<String> = reasons
            .iter()
            .filter(|(n, _)| *n > 0)
            .map(|(n, why)| format!("{n} with {why}"))
            .collect();
        if parts.is_empty() {
            format!("{} step-profile rows read", self.rows_read)
        } else {
            format!(
                "{} step-profile rows read, left out: {}",
                self.rows_read,
                parts.join(", ")
            )
        }
    }
}

/// Reads the step profiles under `dir` and groups them into examples. Rows that cannot
/// make an example are left out and counted by reason ([`RowsLeftOut`]); damaged files
/// are in the report. No example at all is an error that carries those counts.
pub fn load_step_examples(dir: &Path) -> Result<(Vec<StepExample>, StepScanReport), TrainerError> {
    let (rows, files): (Vec<StepProfile>, _) = read_all(dir, Query::new(TelemetryKind::Step))?;
    let (out, rows) = examples_from_rows(rows);
    if out.is_empty() {
        let mut why = rows.summary();
        if files.files_read == 0 {
            why = format!(
                "no step-profile files ({} data files of other kinds)",
                files.files_other_kind
            );
        }
        if !files.errors.is_empty() {
            why.push_str(&format!("; {} damaged files skipped", files.errors.len()));
        }
        return Err(TrainerError::NoExamples {
            dir: dir.display().to_string(),
            why,
        });
    }
    Ok((out, StepScanReport { files, rows }))
}

/// The shape `<nodes>x<GPUs per node>` of a row whose GPU count fits it.
fn usable_shape(r: &StepProfile, left_out: &mut RowsLeftOut) -> Option<(u32, u32)> {
    let Some((nodes, per_node)) = parse_shape(&r.placement).filter(|&(n, g)| n >= 1 && g >= 1)
    else {
        left_out.bad_placement += 1;
        return None;
    };
    let most = u64::from(nodes) * u64::from(per_node);
    if r.num_gpus < nodes || u64::from(r.num_gpus) > most {
        left_out.gpus_not_in_placement += 1;
        return None;
    }
    Some((nodes, per_node))
}

/// The step times a row may hold, in seconds: beyond them a value is damage, and
/// would also leave what `f32` features can carry (1e39 s becomes infinite, 1e-300 s
/// zero), so one such row would stop a whole training run.
pub const STEP_TIME_RANGE_S: std::ops::RangeInclusive<f64> = 1e-6..=86_400.0;

/// Groups step-profile rows into examples, counting the rows left out by reason.
fn examples_from_rows(rows: Vec<StepProfile>) -> (Vec<StepExample>, RowsLeftOut) {
    let mut left_out = RowsLeftOut {
        rows_read: rows.len() as u64,
        ..Default::default()
    };
    type Key = (String, (u32, u32), String, u16, String);
    let mut groups: BTreeMap<Key, Vec<StepProfile>> = BTreeMap::new();
    for r in rows {
        if !STEP_TIME_RANGE_S.contains(&r.step_time_s) {
            left_out.bad_step_time += 1;
            continue;
        }
        let Some(model) = r.model.as_deref() else {
            left_out.without_model += 1;
            continue;
        };
        let Some(shape) = usable_shape(&r, &mut left_out) else {
            continue;
        };
        if r.batch_size == Some(0) {
            left_out.zero_batch_size += 1;
            continue;
        }
        let key = (
            r.job_id.to_string(),
            shape,
            r.span.as_deref().unwrap_or("").to_string(),
            r.tenants.unwrap_or(1),
            model.to_string(),
        );
        groups.entry(key).or_default().push(r);
    }
    let phases = ["warmup", "steady", "eval", "checkpoint"];
    let mut out = Vec::new();
    for ((job_id, (nodes, gpus_per_node), span, tenants, model), rows) in groups {
        let steady: Vec<&StepProfile> = rows
            .iter()
            .filter(|r| r.phase.map(|p| p.as_str()) == Some("steady"))
            .collect();
        let Some(step_time_s) = median(steady.iter().map(|r| r.step_time_s).collect()) else {
            left_out.without_steady_phase += rows.len() as u64;
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
                    // The sink's own rule: a utilisation outside 0–100 % is no value.
                    .filter(|u| (0.0..=100.0).contains(u))
                    .collect(),
            ),
            peak_mem_gib,
            rows: rows.len(),
        });
    }
    (out, left_out)
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
            // Finite and positive, but beyond what a step takes and what f32 carries.
            row("c", 1e39),
            row("c", 1e-300),
        ];
        let (examples, left_out) = examples_from_rows(rows);
        assert_eq!(left_out.bad_step_time, 6);
        assert_eq!(left_out.total(), 6);
        let times: Vec<(&str, f64)> = examples
            .iter()
            .map(|e| (e.job_id.as_str(), e.step_time_s))
            .collect();
        assert_eq!(times, [("a", 3.0), ("c", 3.0)], "job b had no usable row");
    }

    #[test]
    fn rows_that_cannot_make_an_example_are_counted_by_reason() {
        let with = |f: &dyn Fn(&mut StepProfile)| {
            let mut r = row("j", 1.0);
            f(&mut r);
            r
        };
        let rows = vec![
            row("ok", 2.0),
            with(&|r| r.model = None),
            with(&|r| r.placement = "2-4".into()),
            with(&|r| r.placement = "0x4".into()),
            with(&|r| r.num_gpus = 0),
            // 2 machines × up to 4 GPUs hold 2 to 8 GPUs.
            with(&|r| {
                r.placement = "2x4".into();
                r.num_gpus = 9;
            }),
            with(&|r| {
                r.placement = "2x4".into();
                r.num_gpus = 1;
            }),
            with(&|r| {
                r.job_id = "uneven".into();
                r.placement = "2x2".into();
                r.num_gpus = 3;
            }),
            with(&|r| r.batch_size = Some(0)),
            with(&|r| {
                r.job_id = "no-steady".into();
                r.phase = Some(MemPhase::Warmup);
            }),
            with(&|r| {
                r.job_id = "no-steady".into();
                r.phase = Some(MemPhase::Eval);
            }),
        ];
        let (examples, left_out) = examples_from_rows(rows);
        let jobs: Vec<&str> = examples.iter().map(|e| e.job_id.as_str()).collect();
        assert_eq!(jobs, ["ok", "uneven"]);
        assert_eq!(
            left_out,
            RowsLeftOut {
                rows_read: 11,
                bad_step_time: 0,
                without_model: 1,
                bad_placement: 2,
                gpus_not_in_placement: 3,
                zero_batch_size: 1,
                without_steady_phase: 2,
            }
        );
        assert_eq!(left_out.malformed(), 7);
        assert_eq!(
            left_out.summary(),
            "11 step-profile rows read, left out: 1 with no model, 2 with a placement that is \
             not <nodes>x<GPUs per node>, 3 with a GPU count that does not fit the placement, \
             1 with a batch size of 0, 2 with no steady-phase row in their job and placement"
        );
    }

    #[test]
    fn a_utilisation_outside_0_to_100_percent_is_no_value() {
        let with_util = |u: f32| StepProfile {
            gpu_util_pct: Some(u),
            ..row("a", 1.0)
        };
        let rows = vec![with_util(40.0), with_util(-1.0), with_util(f32::INFINITY)];
        let (examples, _) = examples_from_rows(rows);
        assert_eq!(examples[0].gpu_util_pct, Some(40.0));
        let (examples, _) = examples_from_rows(vec![with_util(250.0)]);
        assert_eq!(examples[0].gpu_util_pct, None);
    }
}
