//! Training the placement policy in the simulator.
//!
//! 1. **Behaviour cloning** (warm start): every training episode is run once with the
//!    learned placer in imitation mode, which records, through the scheduler's one
//!    featuriser, each decision's candidates and the fallback heuristic's choice; the
//!    network is fitted to those choices by cross-entropy. The imitation run schedules
//!    exactly as the fallback does, so it is also the fallback's reference run.
//! 2. **REINFORCE with a learned baseline, or PPO**: each iteration runs episodes with
//!    the placer sampling from the network's softmax, turns every decision into a sample
//!    whose return is measured against the fallback's run on the same seed
//!    ([`pg_samples`]), and takes policy-gradient steps with the value head as a further
//!    baseline: one REINFORCE pass, or ([`PolicyGradient::Ppo`]) several passes of PPO's
//!    clipped surrogate over the same samples.
//! 3. **Model selection and the gate**, on validation episodes (every seed of every
//!    validation spec): the network (after cloning or after any evaluated RL iteration)
//!    with the best greedy result is kept; then the margin threshold with the best mean
//!    gain among those whose gated policy is nowhere worse than the fallback by more than
//!    `tolerance` is stored ([`select_gate`]; [`regate`] runs the same selection later for
//!    another fallback heuristic).
//!
//! Reward: mean JCT (replay) or unallocated GPUs at 100 % arrived load (inflation), each
//! as the improvement over the fallback on the same seed; an episode set that mixes both
//! objectives mixes their samples, each standardised by the pass's spread.
//! Everything is seeded: the same episodes and options give the same weights.

mod decline;
mod episodes;
mod from_log;
mod gate;
mod rollout;

pub use decline::{DeclineIteration, DeclineOptions, DeclineRow, DeclineSearch, train_decline};
pub use episodes::{
    Driver, EpisodeSpec, Objective, Outcome, allocated_milli, pg_samples, run_episode, score_of,
};
pub use from_log::{LogSampleReport, LogTrainOptions, LogTrained, log_samples, retrain_from_log};
pub use gate::{
    GateChoice, ValidationRef, fallback_references, regate, select_gate, validation_scores,
};
pub use rollout::{
    Labelled, RolloutOptions, best_of, label_run, resample, roll_out, rollout_failures,
    rollout_labels,
};

use std::collections::BTreeMap;
use std::sync::Arc;

use gate::validate;

use marshal_model::policy::{
    CandidateSet, DecisionFeatures, FeatureStats, PolicyConfig, PolicyLearner, PolicyNetwork,
    PolicyScorer, Sample,
};
use marshal_scheduler::policies::learned::{Act, Gate};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Training settings.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub seed: u64,
    pub hidden_size: usize,
    pub bc_epochs: usize,
    /// Expert-iteration rounds on inflation episodes (0: none): rollout-labelled
    /// decisions, from the fallback's trajectory in round 1 and from the current
    /// network's afterwards (DAgger), aggregated and cloned.
    pub expert_rounds: usize,
    /// Cross-entropy passes over the aggregate per expert round.
    pub expert_epochs: usize,
    /// Each rollout-labelled decision counts this many times in those passes.
    pub expert_weight: usize,
    pub rollout: RolloutOptions,
    pub rl_iterations: usize,
    pub episodes_per_iteration: usize,
    /// How each RL iteration's samples update the network.
    pub policy_gradient: PolicyGradient,
    /// Evaluate greedily on validation every this many RL iterations (and at the end).
    pub eval_every: usize,
    /// Decisions per optimiser pass at most (subsampled, seeded).
    pub max_samples: usize,
    /// Margin thresholds tried for the gate.
    pub margins: Vec<f32>,
    /// Largest relative worsening against the fallback allowed on any validation episode.
    pub tolerance: f64,
    /// The distance limit is this multiple of the training decisions' 99.9th percentile.
    pub distance_factor: f32,
    /// The candidates the network learns to rank (recorded in the artifact, which the
    /// scheduler then serves with the same set).
    pub candidates: CandidateSet,
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            seed: 0,
            hidden_size: 32,
            bc_epochs: 10,
            expert_rounds: 0,
            expert_epochs: 4,
            expert_weight: 4,
            rollout: RolloutOptions::default(),
            rl_iterations: 10,
            episodes_per_iteration: 2,
            policy_gradient: PolicyGradient::Reinforce,
            eval_every: 5,
            max_samples: 20_000,
            margins: vec![0.0, 0.1, 0.2, 0.4, 0.6, 0.8],
            tolerance: 0.01,
            distance_factor: 2.0,
            candidates: CandidateSet::Ranked,
        }
    }
}

/// The update an RL iteration makes from its sampled episodes.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum PolicyGradient {
    /// One pass of REINFORCE with the value head as baseline.
    Reinforce,
    /// `epochs` passes of PPO's clipped surrogate, ratios against the network that
    /// sampled the episodes and clipped at `1 ± clip`.
    Ppo { epochs: usize, clip: f32 },
}

impl TrainOptions {
    /// Settings that cannot train are refused before any episode runs.
    pub fn validate(&self) -> Result<(), String> {
        if let PolicyGradient::Ppo { epochs, clip } = self.policy_gradient {
            if epochs == 0 {
                return Err("PPO needs at least one pass per iteration (--ppo-epochs)".into());
            }
            if !(clip.is_finite() && clip > 0.0 && clip < 1.0) {
                return Err(format!("PPO's clip {clip} is not in (0, 1) (--ppo-clip)"));
            }
        }
        Ok(())
    }
}

/// One point of the learning curves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// `clone`, `reinforce` or `validate`.
    pub phase: String,
    pub step: usize,
    pub samples: usize,
    pub nll: f64,
    /// Share of decisions where the network's top choice is the taken one.
    pub agreement: f64,
    pub value_mse: f64,
    /// Mean relative improvement over the fallback, in % (episodes of this step).
    pub gain_pct: f64,
}

/// The chosen gate on one validation episode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValidationRow {
    pub episode: String,
    pub fallback: f64,
    pub gated: f64,
    pub ungated: f64,
    pub fallback_rate: f64,
}

/// A trained policy, ready to save.
#[derive(Debug)]
pub struct TrainedPolicy {
    pub network: PolicyNetwork,
    pub config: PolicyConfig,
    pub stats: FeatureStats,
    pub gate: Gate,
    pub curve: Vec<CurvePoint>,
    pub validation: Vec<ValidationRow>,
    /// Which snapshot was kept (`clone` or `reinforce-N`).
    pub kept: String,
}

/// A progress message for the caller's bar.
#[derive(Clone, Debug)]
pub struct ProgressEvent {
    pub phase: &'static str,
    pub done: usize,
    pub total: usize,
    pub message: String,
}

fn subsample(samples: &mut Vec<Sample>, max: usize, rng: &mut ChaCha8Rng) {
    if samples.len() > max {
        samples.shuffle(rng);
        samples.truncate(max);
    }
}

pub(crate) fn gain(fallback: f64, ours: f64) -> f64 {
    if fallback > 0.0 && ours.is_finite() {
        (fallback - ours) / fallback
    } else if ours <= fallback {
        0.0
    } else {
        -1.0
    }
}

/// `f` over `items` on up to `threads` threads, results in order.
pub(crate) fn par_map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let threads = threads.clamp(1, items.len().max(1));
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t..items.len())
                        .step_by(threads)
                        .map(|i| (i, f(&items[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(rows) => rows.into_iter().for_each(|(i, r)| out[i] = Some(r)),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    out.into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

pub(crate) fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 { 0.0 } else { s / n as f64 }
}

/// Trains on `train` episodes and chooses the gate on `valid` (every seed of each
/// validation spec). `progress` receives a message per episode and pass.
pub fn train_policy(
    train: &[EpisodeSpec],
    valid: &[EpisodeSpec],
    opts: &TrainOptions,
    progress: &mut dyn FnMut(ProgressEvent),
) -> Result<TrainedPolicy, String> {
    opts.validate()?;
    if train.is_empty() || valid.is_empty() {
        return Err("training needs at least one training and one validation episode".into());
    }
    if train.iter().chain(valid).any(|s| s.jobs_by_seed.is_empty()) {
        return Err("every episode needs at least one seed".into());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ 0x7261_696e);
    let open = Gate {
        margin_threshold: 0.0,
        distance_limit: f32::INFINITY,
    };
    let imitate = Driver::Learned {
        scorer: None,
        act: Act::Imitate,
        gate: open,
        candidates: opts.candidates,
        decline: None,
    };
    // 1. Imitation runs: the decisions to clone and the fallback's reference outcomes.
    let seeds_of = |s: &EpisodeSpec| s.jobs_by_seed.len();
    let total: usize = train.iter().map(seeds_of).sum();
    let mut reference: Vec<Vec<Outcome>> = Vec::new();
    let mut clone_samples = Vec::new();
    let mut done = 0;
    for spec in train {
        let mut outs = Vec::new();
        for i in 0..seeds_of(spec) {
            let o = run_episode(spec, i, &imitate)?;
            clone_samples.extend(o.records.iter().map(|r| Sample {
                decision: r.features.clone(),
                chosen: r.chosen,
                ret: 0.0,
            }));
            done += 1;
            progress(ProgressEvent {
                phase: "imitate",
                done,
                total,
                message: format!(
                    "{} seed {}: {:.1}",
                    spec.name, spec.jobs_by_seed[i].0, o.score
                ),
            });
            outs.push(o);
        }
        reference.push(outs);
    }
    if clone_samples.is_empty() {
        return Err("the training episodes produced no decisions to learn from".into());
    }
    subsample(&mut clone_samples, opts.max_samples, &mut rng);
    let decisions: Vec<&DecisionFeatures> = clone_samples.iter().map(|s| &s.decision).collect();
    let stats = FeatureStats::fit(&decisions);
    let config = PolicyConfig::new()
        .with_hidden_size(opts.hidden_size)
        .with_seed(opts.seed);
    let mut learner =
        PolicyLearner::new(config.clone(), stats.clone()).map_err(|e| e.to_string())?;
    let mut curve = Vec::new();
    for epoch in 1..=opts.bc_epochs {
        let r = learner
            .clone_epoch(&clone_samples)
            .map_err(|e| e.to_string())?;
        progress(ProgressEvent {
            phase: "clone",
            done: epoch,
            total: opts.bc_epochs,
            message: format!("nll {:.3}, agreement {:.1} %", r.nll, 100.0 * r.agreement),
        });
        curve.push(CurvePoint {
            phase: "clone".into(),
            step: epoch,
            samples: clone_samples.len(),
            nll: r.nll,
            agreement: r.agreement,
            value_mse: 0.0,
            gain_pct: 0.0,
        });
    }

    // Validation references: the fallback on every validation episode.
    let valid_refs = fallback_references(valid)?;
    let distance_limit = stats.distance_p999 * opts.distance_factor;
    let eval_gate = Gate {
        margin_threshold: 0.0,
        distance_limit,
    };
    let mut best: Option<(f64, PolicyNetwork, String)> = None;
    let mut consider = |learner: &PolicyLearner,
                        name: String,
                        step: usize,
                        curve: &mut Vec<CurvePoint>|
     -> Result<(), String> {
        let scorer = Arc::new(learner.scorer().map_err(|e| e.to_string())?);
        let rows = validate(&valid_refs, &scorer, eval_gate, opts.candidates)?;
        let g = mean(rows.iter().map(|(fb, ours, _)| gain(*fb, *ours)));
        curve.push(CurvePoint {
            phase: "validate".into(),
            step,
            samples: 0,
            nll: 0.0,
            agreement: 0.0,
            value_mse: 0.0,
            gain_pct: 100.0 * g,
        });
        if best.as_ref().is_none_or(|(b, _, _)| g > *b) {
            best = Some((g, learner.network(), name));
        }
        Ok(())
    };
    consider(&learner, "clone".into(), 0, &mut curve)?;

    // 1b. Expert iteration on the inflation episodes: rollout labels, aggregated.
    let mut expert: Vec<Sample> = Vec::new();
    for round in 1..=opts.expert_rounds {
        let behaviour = if round == 1 {
            None
        } else {
            Some(Arc::new(learner.scorer().map_err(|e| e.to_string())?))
        };
        let gate = Gate {
            margin_threshold: 0.0,
            distance_limit: f32::INFINITY,
        };
        let (mut labelled, mut improvable, mut gain_milli) = (0usize, 0usize, 0u64);
        for spec in train {
            if spec.objective() != Objective::Inflation {
                continue;
            }
            for i in 0..seeds_of(spec) {
                let labels = rollout_labels(
                    spec,
                    i,
                    behaviour.as_ref(),
                    gate,
                    opts.candidates,
                    &opts.rollout,
                )?;
                labelled += labels.len();
                for l in &labels {
                    if l.best != l.fallback {
                        improvable += 1;
                        gain_milli += l.gain_milli();
                    }
                    for _ in 0..opts.expert_weight.max(1) {
                        expert.push(Sample {
                            decision: l.features.clone(),
                            chosen: l.best,
                            ret: 0.0,
                        });
                    }
                }
            }
        }
        let mut mixed: Vec<Sample> = clone_samples.clone();
        mixed.extend(expert.iter().cloned());
        let mut last = None;
        for _ in 0..opts.expert_epochs {
            last = Some(learner.clone_epoch(&mixed).map_err(|e| e.to_string())?);
        }
        progress(ProgressEvent {
            phase: "expert",
            done: round,
            total: opts.expert_rounds,
            message: format!(
                "{labelled} labelled, {improvable} improvable (gain {:.1} GPUs), nll {:.3}",
                gain_milli as f64 / 1000.0,
                last.map_or(f64::NAN, |r| r.nll)
            ),
        });
        curve.push(CurvePoint {
            phase: "expert".into(),
            step: round,
            samples: mixed.len(),
            nll: last.map_or(f64::NAN, |r| r.nll),
            agreement: last.map_or(f64::NAN, |r| r.agreement),
            value_mse: 0.0,
            gain_pct: 0.0,
        });
        consider(&learner, format!("expert-{round}"), round, &mut curve)?;
    }
    drop(clone_samples);
    drop(expert);

    // 2. REINFORCE.
    let slots: Vec<(usize, usize)> = train
        .iter()
        .enumerate()
        .flat_map(|(s, spec)| (0..seeds_of(spec)).map(move |i| (s, i)))
        .collect();
    for it in 1..=opts.rl_iterations {
        let scorer = Arc::new(learner.scorer().map_err(|e| e.to_string())?);
        let driver = Driver::Learned {
            scorer: Some(scorer),
            act: Act::Sample,
            gate: open,
            candidates: opts.candidates,
            decline: None,
        };
        let mut samples = Vec::new();
        let mut gains = Vec::new();
        for j in 0..opts.episodes_per_iteration {
            let (s, i) = slots[((it - 1) * opts.episodes_per_iteration + j) % slots.len()];
            let ours = run_episode(&train[s], i, &driver)?;
            let fb = &reference[s][i];
            gains.push(gain(fb.score, ours.score));
            samples.extend(pg_samples(train[s].objective(), &ours, fb));
        }
        subsample(&mut samples, opts.max_samples, &mut rng);
        let g = mean(gains.iter().copied());
        let r = if samples.is_empty() {
            None
        } else {
            let step = match opts.policy_gradient {
                PolicyGradient::Reinforce => learner.policy_gradient_epoch(&samples),
                PolicyGradient::Ppo { epochs, clip } => learner.ppo_update(&samples, epochs, clip),
            };
            Some(step.map_err(|e| e.to_string())?)
        };
        progress(ProgressEvent {
            phase: "reinforce",
            done: it,
            total: opts.rl_iterations,
            message: format!("sampled episodes {:+.2} % vs fallback", 100.0 * g),
        });
        curve.push(CurvePoint {
            phase: "reinforce".into(),
            step: it,
            samples: samples.len(),
            nll: r.map_or(f64::NAN, |r| r.nll),
            agreement: r.map_or(f64::NAN, |r| r.agreement),
            value_mse: r.map_or(f64::NAN, |r| r.value_mse),
            gain_pct: 100.0 * g,
        });
        if it % opts.eval_every.max(1) == 0 || it == opts.rl_iterations {
            consider(&learner, format!("reinforce-{it}"), it, &mut curve)?;
        }
    }
    let (_, network, kept) = best.ok_or("no snapshot was evaluated")?;

    // 3. The gate.
    let scorer = Arc::new(PolicyScorer::new(&network, stats.clone()).map_err(|e| e.to_string())?);
    let GateChoice {
        gate, validation, ..
    } = select_gate(
        &valid_refs,
        &scorer,
        opts.candidates,
        distance_limit,
        &opts.margins,
        opts.tolerance,
        progress,
    )?;
    Ok(TrainedPolicy {
        network,
        config,
        stats,
        gate,
        curve,
        validation,
        kept,
    })
}

/// Settings and outcome in the artifact's `training` map.
pub fn training_summary(
    opts: &TrainOptions,
    trained: &TrainedPolicy,
    seconds: f64,
) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    m.insert("seed".into(), opts.seed as f64);
    m.insert("bc_epochs".into(), opts.bc_epochs as f64);
    m.insert("rl_iterations".into(), opts.rl_iterations as f64);
    m.insert(
        "episodes_per_iteration".into(),
        opts.episodes_per_iteration as f64,
    );
    if let PolicyGradient::Ppo { epochs, clip } = opts.policy_gradient {
        m.insert("ppo_epochs".into(), epochs as f64);
        m.insert("ppo_clip".into(), f64::from(clip));
    }
    m.insert("hidden_size".into(), opts.hidden_size as f64);
    m.insert("max_samples".into(), opts.max_samples as f64);
    m.insert("expert_rounds".into(), opts.expert_rounds as f64);
    if opts.expert_rounds > 0 {
        let r = &opts.rollout;
        m.insert("expert_epochs".into(), opts.expert_epochs as f64);
        m.insert("expert_weight".into(), opts.expert_weight as f64);
        m.insert("rollout_decisions".into(), r.decisions as f64);
        m.insert("rollout_from_pct".into(), r.from_pct);
        m.insert("rollout_to_pct".into(), r.to_pct);
        m.insert("rollout_until_pct".into(), r.until_pct);
        m.insert("rollout_horizon".into(), r.horizon as f64);
        m.insert("rollout_futures".into(), r.futures as f64);
    }
    m.insert("tolerance".into(), opts.tolerance);
    m.insert("train_seconds".into(), seconds);
    m.insert(
        "kept_reinforce_iteration".into(),
        trained
            .kept
            .strip_prefix("reinforce-")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0),
    );
    m
}

#[cfg(test)]
mod tests;
