//! Retraining the placement policy from the service's Parquet decision log.
//!
//! The log holds, for every decision of `policy = "learned"`, the candidates as the
//! featuriser saw them, the one executed (the network's or the fallback's) and, once the
//! placement ended, how long the job ran. The simulator is not involved: these are real
//! decisions with real outcomes, made by another (the served) policy, so the update is an
//! off-policy one — advantage-weighted regression (Peng et al., 2019): cross-entropy on
//! the executed candidates, each weighted by `exp(A / β)`, capped at `max_weight`.
//!
//! The advantage of a decision is how much faster its job ran than comparable jobs:
//! `A = mean log(run) of the group − log(run)`, where the group is the job's name and shape
//! (workers × GPU per worker) when the log holds at least `min_group` such completed
//! decisions (recurring jobs: the placement is what differs), else all completed jobs of
//! the same GPU count. A job alone in its group gets `A = 0`, i.e. plain cloning. Only
//! completed placements count: a failed, preempted or requeued run's length says nothing
//! about its placement's speed. The wait before a decision is not in the advantage, since
//! the decision could not change it.
//!
//! The input statistics and the gate thresholds stay those of the initial artifact:
//! choosing a new gate needs validation episodes, which a log does not provide (run
//! `marshal eval` on the result before serving it).

use std::collections::HashMap;
use std::path::Path;

use marshal_model::artifact::fnv1a64;
use marshal_model::policy::{PolicyLearner, PolicyMeta, Sample, StepReport, save_policy};
use marshal_scheduler::decision_log::{DecisionLogData, DecisionRow, OutcomeRow};
use serde::Serialize;

/// Settings of a retraining from the log.
#[derive(Clone, Debug, PartialEq)]
pub struct LogTrainOptions {
    pub seed: u64,
    pub epochs: usize,
    pub learning_rate: f64,
    /// Temperature of the advantage weights (in log-run-time units).
    pub beta: f64,
    /// Largest weight a decision gets.
    pub max_weight: f64,
    /// Completed decisions a (name, shape) group needs to be its own baseline.
    pub min_group: usize,
}

impl Default for LogTrainOptions {
    fn default() -> Self {
        LogTrainOptions {
            seed: 0,
            epochs: 10,
            learning_rate: 1e-3,
            beta: 0.5,
            max_weight: 20.0,
            min_group: 2,
        }
    }
}

impl LogTrainOptions {
    pub fn validate(&self) -> Result<(), String> {
        if self.epochs == 0 {
            return Err("epochs must be at least 1".into());
        }
        if !(self.learning_rate > 0.0 && self.learning_rate < 1.0) {
            return Err(format!(
                "learning rate {} outside (0, 1)",
                self.learning_rate
            ));
        }
        if !(self.beta > 0.0 && self.beta.is_finite()) {
            return Err(format!("beta {} must be positive", self.beta));
        }
        if !(self.max_weight >= 1.0 && self.max_weight.is_finite()) {
            return Err(format!("max weight {} must be at least 1", self.max_weight));
        }
        if self.min_group < 2 {
            return Err("min group must be at least 2".into());
        }
        Ok(())
    }
}

/// What became of the log's decision rows.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LogSampleReport {
    pub decisions: usize,
    /// Turned into training samples.
    pub used: usize,
    /// Rows without features (heuristic policies, older files).
    pub no_features: usize,
    /// Placements still running (no outcome yet).
    pub no_outcome: usize,
    /// Ended otherwise than completed, or with no positive run time.
    pub not_completed: usize,
    /// Features this build cannot use (another layout, bad lengths), with the first reason.
    pub unusable: usize,
    pub first_unusable: Option<String>,
    /// Decisions the network made (path `learned`) among those used.
    pub learned_path: usize,
    /// Used decisions whose advantage came from their own (name, shape) group.
    pub own_group: usize,
    pub mean_weight: f64,
}

/// Training samples from the log: `ret` holds each decision's weight.
pub fn log_samples(
    data: &DecisionLogData,
    opts: &LogTrainOptions,
) -> (Vec<Sample>, LogSampleReport) {
    let mut report = LogSampleReport::default();
    let mut usable: Vec<(&DecisionRow, f64, Sample)> = Vec::new();
    for (d, outcome) in data.joined() {
        report.decisions += 1;
        let Some(f) = &d.features else {
            report.no_features += 1;
            continue;
        };
        let Some(outcome) = outcome else {
            report.no_outcome += 1;
            continue;
        };
        let Some(run) = completed_run(outcome) else {
            report.not_completed += 1;
            continue;
        };
        match f.decision() {
            Ok((decision, chosen)) => usable.push((
                d,
                run.ln(),
                Sample {
                    decision,
                    chosen,
                    ret: 1.0,
                },
            )),
            Err(why) => {
                report.unusable += 1;
                report
                    .first_unusable
                    .get_or_insert_with(|| format!("decision {}: {why}", d.decision_id));
            }
        }
    }
    // Baselines: mean log run time per (name, shape) and per GPU count.
    let mut by_shape: HashMap<(&str, u64), (f64, usize)> = HashMap::new();
    let mut by_gpus: HashMap<u64, (f64, usize)> = HashMap::new();
    for (d, log_run, _) in &usable {
        add(
            by_shape.entry((d.job_name.as_str(), shape(d))).or_default(),
            *log_run,
        );
        add(by_gpus.entry(shape(d)).or_default(), *log_run);
    }
    let mut samples = Vec::with_capacity(usable.len());
    let mut weight_sum = 0.0;
    for (d, log_run, mut sample) in usable {
        let own = by_shape[&(d.job_name.as_str(), shape(d))];
        let baseline = if !d.job_name.is_empty() && own.1 >= opts.min_group {
            report.own_group += 1;
            own.0 / own.1 as f64
        } else {
            let g = by_gpus[&shape(d)];
            g.0 / g.1 as f64
        };
        let weight = ((baseline - log_run) / opts.beta)
            .exp()
            .min(opts.max_weight);
        sample.ret = weight as f32;
        weight_sum += weight;
        report.used += 1;
        report.learned_path += usize::from(d.path == "learned");
        samples.push(sample);
    }
    report.mean_weight = weight_sum / report.used.max(1) as f64;
    (samples, report)
}

fn add(acc: &mut (f64, usize), v: f64) {
    acc.0 += v;
    acc.1 += 1;
}

/// GPU thousandths the job asks for in all.
fn shape(d: &DecisionRow) -> u64 {
    u64::from(d.workers) * u64::from(d.gpu_milli_per_worker)
}

fn completed_run(o: &OutcomeRow) -> Option<f64> {
    let run = o.run_s.filter(|r| r.is_finite() && *r > 0.0)?;
    o.state.eq_ignore_ascii_case("completed").then_some(run)
}

/// A policy retrained from a log.
#[derive(Debug)]
pub struct LogTrained {
    pub report: LogSampleReport,
    /// One entry per epoch.
    pub epochs: Vec<StepReport>,
    pub meta: PolicyMeta,
}

/// Retrains the artifact in `init` on `data` and writes the result to `out`.
pub fn retrain_from_log(
    init: &Path,
    data: &DecisionLogData,
    out: &Path,
    opts: &LogTrainOptions,
    progress: &mut dyn FnMut(usize, &StepReport),
) -> Result<LogTrained, String> {
    opts.validate()?;
    // Writing over the artifact being retrained would leave no good copy if the save
    // were cut off (and a served directory should change only through `model promote`).
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(init, out) {
        return Err(format!(
            "--out {} is the initial artifact: write the retrained one elsewhere (then `marshal model promote` it)",
            out.display()
        ));
    }
    let (samples, report) = log_samples(data, opts);
    if samples.is_empty() {
        return Err(format!(
            "no usable decisions in the log ({report:?}): it needs `policy = \"learned\"` decisions whose placements completed"
        ));
    }
    let (mut learner, init_artifact) =
        PolicyLearner::resume(init, opts.seed, opts.learning_rate)
            .map_err(|e| format!("initial policy {}: {e}", init.display()))?;
    let mut epochs = Vec::with_capacity(opts.epochs);
    for epoch in 0..opts.epochs {
        let step = learner
            .weighted_clone_epoch(&samples)
            .map_err(|e| e.to_string())?;
        progress(epoch, &step);
        epochs.push(step);
    }
    let old = init_artifact.meta;
    // Per-fallback gates (`old.gates`) are not carried over: they were chosen for the old
    // weights; `marshal train gate` chooses them again for the new ones.
    let mut meta = PolicyMeta::new(old.margin_threshold, old.distance_limit);
    meta.fallback = old.fallback;
    // The logged decisions' candidates came from the serving model's set; the retrained
    // network ranks that set too.
    meta.candidates = old.candidates;
    meta.training_data_hash = format!(
        "decision-log:{}+init:{}",
        log_hash(&samples),
        old.weights_fnv1a64
    );
    let t = &mut meta.training;
    t.insert("log_decisions".into(), report.decisions as f64);
    t.insert("log_samples".into(), report.used as f64);
    t.insert("log_mean_weight".into(), report.mean_weight);
    t.insert("log_epochs".into(), opts.epochs as f64);
    t.insert("log_beta".into(), opts.beta);
    t.insert("log_max_weight".into(), opts.max_weight);
    t.insert("log_learning_rate".into(), opts.learning_rate);
    t.insert("seed".into(), opts.seed as f64);
    let meta = save_policy(
        out,
        &learner.network(),
        learner.config(),
        learner.stats(),
        meta,
    )
    .map_err(|e| format!("writing {}: {e}", out.display()))?;
    Ok(LogTrained {
        report,
        epochs,
        meta,
    })
}

/// FNV-1a 64 over the samples' features, choices and weights.
fn log_hash(samples: &[Sample]) -> String {
    let mut bytes = Vec::with_capacity(samples.len() * 1024);
    for s in samples {
        for v in s
            .decision
            .job
            .iter()
            .chain(s.decision.candidates.iter().flatten())
        {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes.extend_from_slice(&(s.chosen as u64).to_le_bytes());
        bytes.extend_from_slice(&s.ret.to_le_bytes());
    }
    fnv1a64(&bytes)
}

#[cfg(test)]
mod tests;
