//! Running one simulated episode with the learned placer in a given mode, and turning
//! its recorded decisions into training samples.

use std::sync::{Arc, Mutex};

use marshal_model::policy::{CandidateSet, DeclineHead, PolicyScorer, Sample};
use marshal_scheduler::domain::{Job, Topology};
use marshal_scheduler::framework::Policy;
use marshal_scheduler::policies::learned::{
    Act, Gate, GateCounts, LearnedPlacer, Record, learned_policy,
};
use marshal_scheduler::policies::{self, UnknownPolicy};
use marshal_scheduler::sim::{Mode, SimConfig, SimResult, run_inflation, run_replay};

/// What an episode is judged by.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Objective {
    /// Mean JCT in a replay (lower is better).
    Replay,
    /// Unallocated GPUs at 100 % arrived load in the FGD experiment (lower is better).
    Inflation,
}

impl Objective {
    pub fn name(self) -> &'static str {
        match self {
            Objective::Replay => "replay",
            Objective::Inflation => "inflation",
        }
    }
}

/// A trace on a cluster under one simulator configuration; the seed varies per episode.
#[derive(Clone, Debug)]
pub struct EpisodeSpec {
    pub name: String,
    pub topo: Arc<Topology>,
    /// The jobs of each seed (enriched per seed in replay; the caller prepares them).
    pub jobs_by_seed: Vec<(u64, Vec<Job>)>,
    pub config: SimConfig,
    pub fallback: String,
}

impl EpisodeSpec {
    pub fn objective(&self) -> Objective {
        match self.config.mode {
            Mode::Replay => Objective::Replay,
            Mode::Inflation { .. } => Objective::Inflation,
        }
    }
}

/// One run's outcome.
#[derive(Debug)]
pub struct Outcome {
    pub result: SimResult,
    /// The objective's value (lower is better).
    pub score: f64,
    pub records: Vec<Record>,
    pub counts: GateCounts,
    /// Inflation: GPU capacity (milli) allocated before each task arrived.
    pub alloc_before_call: Vec<u64>,
}

/// The objective's value of a result (lower is better); NaN for a replay without JCTs.
pub fn score_of(objective: Objective, r: &SimResult) -> f64 {
    match objective {
        Objective::Replay => r.jct_mean_s.unwrap_or(f64::NAN),
        // A run too coarse to have a point at 100 % (tiny clusters) is judged by the
        // GPUs left unallocated at its end.
        Objective::Inflation => r
            .unallocated_gpus_at_100
            .unwrap_or(r.gpus as f64 * (1.0 - r.gpu_alloc_pct / 100.0)),
    }
}

/// How the episode's policy decides.
#[derive(Clone, Debug)]
pub enum Driver {
    /// The fallback heuristic alone.
    Fallback,
    /// The learned placer (`Act::Imitate` without a scorer records the fallback's choices).
    Learned {
        scorer: Option<Arc<PolicyScorer>>,
        act: Act,
        gate: Gate,
        /// The candidate set the network ranks (and imitation records).
        candidates: CandidateSet,
        /// The decline head, when one decides besides the network (inflation only).
        decline: Option<Arc<DeclineHead>>,
    },
}

fn run_policy(
    policy: &Policy,
    spec: &EpisodeSpec,
    jobs: &[Job],
    seed: u64,
) -> Result<(SimResult, Vec<u64>), String> {
    let config = SimConfig {
        seed,
        ..spec.config.clone()
    };
    let err = |e| format!("{}: {e}", spec.name);
    match config.mode {
        Mode::Replay => run_replay(policy, spec.topo.clone(), jobs, &spec.name, &config)
            .map(|r| (r.0, Vec::new()))
            .map_err(err),
        Mode::Inflation { .. } => {
            let (result, curve) =
                run_inflation(policy, spec.topo.clone(), jobs, &spec.name, &config).map_err(err)?;
            let capacity = result.gpus as f64 * 1000.0;
            let before = std::iter::once(0)
                .chain(
                    curve
                        .points
                        .iter()
                        .map(|(_, alloc)| (alloc / 100.0 * capacity).round() as u64),
                )
                .collect();
            Ok((result, before))
        }
    }
}

/// Runs episode `index` (a seed and its jobs) of `spec` under `driver`.
pub fn run_episode(spec: &EpisodeSpec, index: usize, driver: &Driver) -> Result<Outcome, String> {
    let (seed, jobs) = &spec.jobs_by_seed[index % spec.jobs_by_seed.len()];
    let objective = spec.objective();
    match driver {
        Driver::Fallback => {
            let policy =
                policies::build(&spec.fallback, jobs).map_err(|e: UnknownPolicy| e.to_string())?;
            let (result, alloc_before_call) = run_policy(&policy, spec, jobs, *seed)?;
            Ok(Outcome {
                score: score_of(objective, &result),
                result,
                records: Vec::new(),
                counts: GateCounts::default(),
                alloc_before_call,
            })
        }
        Driver::Learned {
            scorer,
            act,
            gate,
            candidates,
            decline,
        } => {
            let recorder = Arc::new(Mutex::new(Vec::new()));
            let model = scorer.clone().ok_or_else(|| "no model yet".to_string());
            let (policy, stats) = learned_policy(&spec.fallback, jobs, |fallback| {
                let p = LearnedPlacer::new(fallback, jobs, model, *gate)
                    .with_candidates(*candidates)
                    .with_decline(decline.clone(), jobs);
                if *act == Act::Greedy {
                    p
                } else {
                    p.with_recorder(*act, recorder.clone())
                }
            })
            .map_err(|e| e.to_string())?;
            let (result, alloc_before_call) = run_policy(&policy, spec, jobs, *seed)?;
            drop(policy);
            let records = std::mem::take(&mut *recorder.lock().unwrap_or_else(|e| e.into_inner()));
            Ok(Outcome {
                score: score_of(objective, &result),
                result,
                records,
                counts: stats.snapshot(),
                alloc_before_call,
            })
        }
    }
}

/// Policy-gradient samples from a sampled episode, with returns relative to the
/// fallback's run on the same seed (a baseline that depends on the seed only, so it
/// leaves the gradient unbiased and removes the variance of the workload draw):
/// - inflation: the GPUs this run allocated from the decision on, minus what the fallback
///   allocated from the same arrival on (decision `k` of both runs is task `k`);
/// - replay: the relative mean-JCT improvement over the fallback, for every decision.
pub fn pg_samples(objective: Objective, ours: &Outcome, fallback: &Outcome) -> Vec<Sample> {
    let fallback_alloc_by_call = &fallback.alloc_before_call;
    match objective {
        Objective::Inflation => {
            let final_ours = ours
                .records
                .last()
                .map_or(0, |r| r.allocated_milli)
                .max(allocated_milli(&ours.result));
            let final_theirs = allocated_milli(&fallback.result);
            ours.records
                .iter()
                .map(|r| {
                    let theirs_before = fallback_alloc_by_call
                        .get(r.call as usize)
                        .copied()
                        .unwrap_or(final_theirs);
                    let ours_gain = final_ours.saturating_sub(r.allocated_milli) as f64;
                    let theirs_gain = final_theirs.saturating_sub(theirs_before) as f64;
                    Sample {
                        decision: r.features.clone(),
                        chosen: r.chosen,
                        ret: ((ours_gain - theirs_gain) / 1000.0) as f32,
                    }
                })
                .collect()
        }
        Objective::Replay => {
            let gain = if fallback.score > 0.0 && ours.score.is_finite() {
                (fallback.score - ours.score) / fallback.score
            } else {
                0.0
            };
            ours.records
                .iter()
                .map(|r| Sample {
                    decision: r.features.clone(),
                    chosen: r.chosen,
                    ret: gain as f32,
                })
                .collect()
        }
    }
}

/// GPU capacity (milli) allocated at the end of a run.
pub fn allocated_milli(r: &SimResult) -> u64 {
    (r.gpu_alloc_pct / 100.0 * r.gpus as f64 * 1000.0).round() as u64
}
