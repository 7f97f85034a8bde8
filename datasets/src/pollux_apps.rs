//! How long a Pollux workload job runs: its application's measured curves turned into a
//! duration, so that the duration-less Pollux workloads can be replayed.
//!
//! Pollux's simulator runs each job until its training *progress* reaches the
//! application's goal. For a job that keeps the batch size and GPU count it was submitted
//! with (what Pollux's non-adaptive baselines, Tiresias and Optimus, do), that is:
//!
//! - **iterations** to the goal at global batch `B`: from `validation-<B>.csv` (progress
//!   by iteration), the iteration at which progress reaches the smallest final progress
//!   over all of the application's curves (the goal every batch size reaches), linearly
//!   interpolated between the two rows around it; batch sizes between two curves are
//!   interpolated in log–log (iterations fall close to a power law of batch size);
//! - **seconds per iteration** on the tightest placement of `R` GPUs on 4-GPU nodes
//!   (`"24"` for 6 GPUs, `"444"` for 12): `placements.csv` where measured, else
//!   `scalability.csv` for the same node and GPU counts (jobs over 16 GPUs), linearly
//!   interpolated in the per-GPU batch `B / R`; a per-GPU batch above the largest
//!   measured one is split into gradient-accumulation micro-steps, as Pollux does.
//!
//! The duration is their product, on T4 GPUs (the profiles' AWS g4dn nodes).

use std::collections::BTreeMap;

use crate::bundled::{
    POLLUX_PLACEMENT_PROFILES, POLLUX_SCALABILITY_PROFILES, POLLUX_VALIDATION_CURVES,
};
use crate::table::Table;
use crate::{DatasetError, StepTimeProfile, parse_step_profiles};

/// GPUs per node of the profiles' testbed (AWS g4dn.12xlarge).
pub const POLLUX_GPUS_PER_NODE: u32 = 4;

/// One application's curves.
#[derive(Clone, Debug, PartialEq)]
struct App {
    /// By placement string, each sorted by per-GPU batch.
    placements: BTreeMap<String, Vec<StepTimeProfile>>,
    /// By (nodes, GPUs), each sorted by per-GPU batch.
    scalability: BTreeMap<(u32, u32), Vec<StepTimeProfile>>,
    /// (global batch, iterations to the goal), ascending batch.
    iterations: Vec<(u32, f64)>,
}

/// The six Pollux applications' step times and iterations to their goal.
#[derive(Clone, Debug, PartialEq)]
pub struct PolluxApps {
    apps: BTreeMap<String, App>,
}

/// `(progress, iteration)` rows of one validation curve.
type Curve = Vec<(f64, f64)>;

fn parse_curve(name: &str, text: &str) -> Result<Curve, DatasetError> {
    const HEADER: &str = "progress,iteration,metric,grad_sqr,grad_var";
    let table = Table::open(name, text, HEADER)?;
    let progress = table.column("progress", HEADER)?;
    let iteration = table.column("iteration", HEADER)?;
    let mut report = crate::ParseReport::new(name);
    let mut rows = Vec::new();
    table.for_each_row(&mut report, |row| {
        let p = row.seconds(progress)?;
        let i = row.seconds(iteration)?;
        rows.push((p, i));
        Ok(())
    });
    if let Some(bad) = report.skipped.first() {
        return Err(crate::table::malformed(
            name,
            bad.line,
            &bad.field,
            bad.reason.clone(),
        ));
    }
    if rows.is_empty() || rows.windows(2).any(|w| w[1].0 < w[0].0 || w[1].1 < w[0].1) {
        return Err(crate::table::malformed(
            name,
            1,
            "progress",
            "a validation curve needs rows with non-decreasing progress and iterations".into(),
        ));
    }
    Ok(rows)
}

/// The iteration at which `curve` reaches `goal` (linear between rows; from the origin
/// before the first row).
fn iteration_at(curve: &[(f64, f64)], goal: f64) -> f64 {
    let mut prev = (0.0, 0.0);
    for &(p, i) in curve {
        if p >= goal {
            let t = if p > prev.0 {
                (goal - prev.0) / (p - prev.0)
            } else {
                1.0
            };
            return prev.1 + t * (i - prev.1);
        }
        prev = (p, i);
    }
    prev.1
}

/// Linear interpolation of step time in per-GPU batch over `rows` (sorted, non-empty);
/// clamped below the smallest batch, gradient accumulation above the largest.
fn step_time_at(rows: &[StepTimeProfile], local_bsz: f64) -> f64 {
    let first = &rows[0];
    let last = &rows[rows.len() - 1];
    let max = f64::from(last.local_bsz);
    if local_bsz > max {
        let micro_steps = (local_bsz / max).ceil();
        return micro_steps * step_time_at(rows, local_bsz / micro_steps);
    }
    if local_bsz <= f64::from(first.local_bsz) {
        return first.step_time_s;
    }
    for w in rows.windows(2) {
        let (a, b) = (f64::from(w[0].local_bsz), f64::from(w[1].local_bsz));
        if local_bsz <= b {
            let t = (local_bsz - a) / (b - a);
            return w[0].step_time_s + t * (w[1].step_time_s - w[0].step_time_s);
        }
    }
    last.step_time_s
}

/// The tightest placement of `gpus` on 4-GPU nodes, as the profiles write it (per-node
/// counts in ascending digit order: 6 GPUs is `"24"`).
pub fn tight_placement(gpus: u32) -> String {
    let full = gpus / POLLUX_GPUS_PER_NODE;
    let rest = gpus % POLLUX_GPUS_PER_NODE;
    let mut s = String::new();
    if rest > 0 {
        s.push(char::from_digit(rest, 10).unwrap_or('0'));
    }
    for _ in 0..full {
        s.push(char::from_digit(POLLUX_GPUS_PER_NODE, 10).unwrap_or('0'));
    }
    s
}

impl PolluxApps {
    /// Reads the bundled profiles.
    pub fn bundled() -> Result<Self, DatasetError> {
        let mut apps: BTreeMap<String, App> = BTreeMap::new();
        for (model, file) in POLLUX_PLACEMENT_PROFILES
            .iter()
            .chain(&POLLUX_SCALABILITY_PROFILES)
        {
            let (profiles, _) = parse_step_profiles(file.name, model, "aws", file.text)?;
            let app = apps.entry(model.to_string()).or_insert_with(|| App {
                placements: BTreeMap::new(),
                scalability: BTreeMap::new(),
                iterations: Vec::new(),
            });
            for p in profiles {
                match &p.placement {
                    Some(pl) => app.placements.entry(pl.clone()).or_default().push(p),
                    None => app
                        .scalability
                        .entry((p.nodes, p.replicas))
                        .or_default()
                        .push(p),
                }
            }
        }
        let mut curves: BTreeMap<&str, Vec<(u32, Curve)>> = BTreeMap::new();
        for (model, batch, file) in POLLUX_VALIDATION_CURVES {
            curves
                .entry(model)
                .or_default()
                .push((*batch, parse_curve(file.name, file.text)?));
        }
        for (model, curves) in curves {
            let goal = curves
                .iter()
                .filter_map(|(_, c)| c.last().map(|r| r.0))
                .fold(f64::INFINITY, f64::min);
            let Some(app) = apps.get_mut(model) else {
                continue;
            };
            app.iterations = curves
                .iter()
                .map(|(b, c)| (*b, iteration_at(c, goal)))
                .collect();
            app.iterations.sort_by_key(|r| r.0);
        }
        for rows in apps
            .values_mut()
            .flat_map(|a| a.placements.values_mut().chain(a.scalability.values_mut()))
        {
            rows.sort_by_key(|p| p.local_bsz);
            // Repeated measurements of one batch in scalability.csv: keep the first.
            rows.dedup_by_key(|p| p.local_bsz);
        }
        Ok(PolluxApps { apps })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.apps.keys().map(String::as_str)
    }

    /// Iterations `app` needs to reach its goal at global batch `batch`; `None` for an
    /// unknown application or a batch outside the measured range.
    pub fn iterations(&self, app: &str, batch: u32) -> Option<f64> {
        let curve = &self.apps.get(app)?.iterations;
        if let Some(&(_, i)) = curve.iter().find(|r| r.0 == batch) {
            return Some(i);
        }
        let w = curve
            .windows(2)
            .find(|w| w[0].0 < batch && batch < w[1].0)?;
        let (b0, i0, b1, i1) = (
            f64::from(w[0].0).ln(),
            w[0].1.ln(),
            f64::from(w[1].0).ln(),
            w[1].1.ln(),
        );
        let t = (f64::from(batch).ln() - b0) / (b1 - b0);
        Some((i0 + t * (i1 - i0)).exp())
    }

    /// Seconds per iteration of `app` on `gpus` T4s placed as tightly as 4-GPU nodes
    /// allow, at `local_bsz` samples per GPU.
    pub fn step_time(&self, app: &str, gpus: u32, local_bsz: f64) -> Option<f64> {
        let a = self.apps.get(app)?;
        if gpus == 0 || !(local_bsz.is_finite() && local_bsz > 0.0) {
            return None;
        }
        let nodes = gpus.div_ceil(POLLUX_GPUS_PER_NODE);
        let rows = a
            .placements
            .get(&tight_placement(gpus))
            .or_else(|| a.scalability.get(&(nodes, gpus)))?;
        Some(step_time_at(rows, local_bsz))
    }

    /// Seconds the job takes on its tightest placement: iterations × step time.
    pub fn duration(&self, app: &str, gpus: u32, batch: u32) -> Option<f64> {
        let local = f64::from(batch) / f64::from(gpus.max(1));
        Some(self.iterations(app, batch)? * self.step_time(app, gpus, local)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tight_placements_fill_nodes() {
        assert_eq!(tight_placement(1), "1");
        assert_eq!(tight_placement(4), "4");
        assert_eq!(tight_placement(6), "24");
        assert_eq!(tight_placement(16), "4444");
        assert_eq!(tight_placement(48), "444444444444");
    }

    #[test]
    fn iterations_come_from_the_validation_curves() {
        let apps = PolluxApps::bundled().unwrap();
        assert_eq!(apps.names().count(), 6);
        // cifar10 at batch 128 is the reference curve: progress == iterations + 1 in the
        // file, and the goal is the smallest final progress over the curves (39062.9 at
        // batch 256), reached at ≈ 39062 iterations.
        let i128 = apps.iterations("cifar10", 128).unwrap();
        assert!((i128 - 39061.9).abs() < 1.0, "{i128}");
        // Larger batches need fewer iterations, as the files say (2011 at 4096).
        let i4096 = apps.iterations("cifar10", 4096).unwrap();
        assert!((i4096 - 2011.0).abs() < 2.0, "{i4096}");
        // Between two curves: between their values.
        let i3000 = apps.iterations("cifar10", 3000).unwrap();
        assert!(i4096 < i3000 && i3000 < apps.iterations("cifar10", 2048).unwrap());
        assert_eq!(apps.iterations("cifar10", 64), None);
        assert_eq!(apps.iterations("alexnet", 128), None);
    }

    #[test]
    fn step_times_reproduce_the_measurements_and_interpolate_between_them() {
        let apps = PolluxApps::bundled().unwrap();
        let (profiles, _) = crate::pollux_placement_profiles().unwrap();
        for p in profiles.lookup("bert", "aws", "24") {
            let t = apps.step_time("bert", 6, f64::from(p.local_bsz)).unwrap();
            assert!((t - p.step_time_s).abs() < 1e-12);
        }
        let rows = profiles.lookup("bert", "aws", "24");
        let mid = f64::from(rows[0].local_bsz + rows[1].local_bsz) / 2.0;
        let t = apps.step_time("bert", 6, mid).unwrap();
        assert!((t - (rows[0].step_time_s + rows[1].step_time_s) / 2.0).abs() < 1e-9);
        // Above the largest measured batch: accumulation, at least the largest step time.
        let max = rows.last().unwrap();
        let t = apps
            .step_time("bert", 6, f64::from(max.local_bsz) * 3.0)
            .unwrap();
        assert!(t >= 3.0 * rows[0].step_time_s && t > max.step_time_s);
        // 48 GPUs are not in placements.csv; scalability.csv has 12 nodes × 4.
        assert!(apps.step_time("imagenet", 48, 133.3).is_some());
        assert_eq!(apps.step_time("imagenet", 0, 1.0), None);
    }

    #[test]
    fn every_pollux_workload_job_gets_a_duration() {
        let apps = PolluxApps::bundled().unwrap();
        for k in 1..=8 {
            let (jobs, _) = crate::load_trace(
                &format!("pollux-{k}"),
                &marshal_scheduler::domain::GpuCatalog::default(),
            )
            .unwrap();
            for job in &jobs {
                let app = job.name.split('-').next().unwrap();
                let d = apps
                    .duration(app, job.workers, job.batch_size.unwrap())
                    .unwrap_or_else(|| panic!("{}", job.name));
                assert!(d > 10.0 && d < 30.0 * 3600.0, "{}: {d} s", job.name);
            }
        }
    }
}
