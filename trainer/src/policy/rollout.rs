//! Rollout labels for the FGD experiment (expert iteration): at sampled decisions of an
//! inflation episode, every candidate placement is applied to a copy of the simulator and
//! the episode is continued with the base heuristic on the same arrivals; the candidate
//! after which the fewest requested GPUs fail to fit becomes the decision's label. One
//! step of policy improvement over the base heuristic, measured per decision rather than
//! drowned in the noise of a whole episode (REINFORCE's problem).

use std::sync::Arc;

use marshal_model::policy::{CandidateSet, DecisionFeatures, PolicyScorer};
use marshal_scheduler::domain::{Job, JobId};
use marshal_scheduler::framework::Placer;
use marshal_scheduler::policies::learned::{Choice, Gate, LearnedPlacer};
use marshal_scheduler::policies::{self, UnknownPolicy};
use marshal_scheduler::sim::{InflationRun, SimConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::episodes::{EpisodeSpec, Objective};

/// Where and how far the labeller rolls out.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutOptions {
    /// Labelled decisions per episode.
    pub decisions: usize,
    /// Decisions are drawn evenly from arrivals whose arrived load (before them) lies in
    /// `[from_pct, to_pct)` % of capacity.
    pub from_pct: f64,
    pub to_pct: f64,
    /// A rollout ends once the arrived load reaches this % (the measure is taken at
    /// 100 %) …
    pub until_pct: f64,
    /// … or after this many arrivals, whichever comes first.
    pub horizon: usize,
    /// Futures averaged per decision: 0 rolls out on the episode's own arrivals (one
    /// draw: the label then also fits that draw's luck); `n` rolls every candidate out on
    /// the same `n` futures resampled uniformly from the trace (as the experiment's own
    /// tail is) and sums their failures.
    pub futures: usize,
    /// Threads rolling candidates out in parallel.
    pub threads: usize,
    /// Seed of the resampled futures (`marshal train policy` passes its `--seed`);
    /// [`rollout_labels`] mixes in the episode's own seed, and each decision draws its
    /// futures from the stream of its arrival position.
    pub seed: u64,
}

impl Default for RolloutOptions {
    fn default() -> Self {
        RolloutOptions {
            decisions: 200,
            from_pct: 70.0,
            to_pct: 100.0,
            until_pct: 100.5,
            horizon: 1_000,
            futures: 0,
            threads: 1,
            seed: 0,
        }
    }
}

/// One labelled decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Labelled {
    pub features: DecisionFeatures,
    /// Arrival index of the decision in its episode.
    pub position: usize,
    /// Index of the base heuristic's choice among the candidates.
    pub fallback: usize,
    /// GPU capacity (milli) that failed to fit from the decision to the rollout's end,
    /// per candidate (the decision's own task included).
    pub failed: Vec<u64>,
    /// The label: least failed; the base heuristic's choice on ties, else the first.
    pub best: usize,
}

impl Labelled {
    /// How much less capacity (milli) failed after the label than after the fallback.
    pub fn gain_milli(&self) -> u64 {
        self.failed[self.fallback] - self.failed[self.best]
    }
}

/// The label of a decision from its candidates' rollout outcomes (lower is better):
/// the base choice unless a candidate is strictly better, else the first best.
pub fn best_of(failed: &[u64], fallback: usize) -> usize {
    let min = failed.iter().copied().min().unwrap_or(0);
    if failed.get(fallback) == Some(&min) {
        fallback
    } else {
        failed.iter().position(|&f| f == min).unwrap_or(0)
    }
}

/// Continues `run` with `base` until the arrived load reaches `until_pct` or `horizon`
/// more tasks arrived; returns the capacity (milli) that failed in the continuation.
pub fn roll_out(run: &mut InflationRun, base: &dyn Placer, until_pct: f64, end: usize) -> u64 {
    let before = run.failed_milli();
    while run.position() < end && run.arrived_pct() < until_pct {
        if run.step(base).is_none() {
            break;
        }
    }
    run.failed_milli() - before
}

/// Labels decisions of episode `index` of `spec` (inflation only) over `candidates`. The
/// episode itself is driven by `behaviour` (greedy behind `gate`) when given, else by the
/// base heuristic (the spec's fallback), which also continues every rollout.
pub fn rollout_labels(
    spec: &EpisodeSpec,
    index: usize,
    behaviour: Option<&Arc<PolicyScorer>>,
    gate: Gate,
    candidates: CandidateSet,
    opts: &RolloutOptions,
) -> Result<Vec<Labelled>, String> {
    if spec.objective() != Objective::Inflation {
        return Err(format!(
            "{}: rollout labels need an inflation episode",
            spec.name
        ));
    }
    let (seed, jobs) = &spec.jobs_by_seed[index % spec.jobs_by_seed.len()];
    let config = SimConfig {
        seed: *seed,
        ..spec.config.clone()
    };
    let run = InflationRun::new(spec.topo.clone(), jobs, &config)
        .map_err(|e| format!("{}: {e}", spec.name))?;
    let opts = RolloutOptions {
        seed: futures_seed(opts.seed, *seed),
        ..opts.clone()
    };
    label_run(
        run,
        &spec.fallback,
        jobs,
        behaviour,
        gate,
        candidates,
        &opts,
    )
}

/// The futures' seed of one episode: the training seed and the episode's, so that
/// neither two episodes nor two training seeds share their futures.
pub(super) fn futures_seed(training: u64, episode: u64) -> u64 {
    // SplitMix64's finaliser: nearby seeds give unrelated keys.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    mix(training ^ mix(episode.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// [`rollout_labels`] on a given episode: `fallback` names the base heuristic, `jobs`
/// are the trace it derives its settings from (FGD's target workload).
pub fn label_run(
    mut run: InflationRun,
    fallback: &str,
    jobs: &[Job],
    behaviour: Option<&Arc<PolicyScorer>>,
    gate: Gate,
    candidates: CandidateSet,
    opts: &RolloutOptions,
) -> Result<Vec<Labelled>, String> {
    let build = || policies::build(fallback, jobs).map_err(|e: UnknownPolicy| e.to_string());
    let base = build()?.placer;
    let labeller = LearnedPlacer::new(build()?.placer, jobs, Err("labeller".into()), gate)
        .with_candidates(candidates);
    let driver: Box<dyn Placer> = match behaviour {
        Some(scorer) => Box::new(
            LearnedPlacer::new(build()?.placer, jobs, Ok(scorer.clone()), gate)
                .with_candidates(candidates),
        ),
        None => build()?.placer,
    };
    let capacity = run.state().capacity_milli().max(1) as f64;
    // Arrivals are the same whatever the policy does: pick the positions up front.
    let mut arrived = 0u64;
    let mut window = Vec::new();
    for (i, t) in run.tasks().iter().enumerate() {
        let pct = arrived as f64 / capacity * 100.0;
        if pct >= opts.from_pct && pct < opts.to_pct {
            window.push(i);
        }
        arrived += t.gpu_milli();
    }
    let n = opts.decisions.min(window.len());
    let mut picks: Vec<usize> = (0..n)
        .map(|k| window[(2 * k + 1) * window.len() / (2 * n)])
        .collect();
    picks.dedup();
    let mut out = Vec::with_capacity(picks.len());
    for &pos in &picks {
        while run.position() < pos {
            if run.step(driver.as_ref()).is_none() {
                break;
            }
        }
        if run.position() != pos {
            break;
        }
        let mut probe = run.clone();
        let decision = probe
            .with_next(|job, state, ctx| {
                let fb = labeller.fallback_place(job, state, ctx);
                labeller.decision(job, state, ctx, &fb)
            })
            .flatten();
        let Some((choices, features)) = decision else {
            continue;
        };
        if choices.len() < 2 {
            continue;
        }
        let Some(fallback) = choices
            .iter()
            .position(|c| matches!(c, Choice::Place { fallback: true, .. }))
        else {
            continue;
        };
        let failed = if opts.futures == 0 {
            let end = (pos + 1 + opts.horizon).min(run.tasks().len());
            rollout_failures(
                &run,
                &choices,
                base.as_ref(),
                opts.until_pct,
                end,
                opts.threads,
            )
        } else {
            let mut sum = vec![0u64; choices.len()];
            let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
            rng.set_stream(pos as u64);
            for _ in 0..opts.futures {
                let future = resample(&run.tasks()[pos], jobs, opts.horizon, &mut rng);
                let end = future.len();
                let alt = run.with_future(future);
                let failed = rollout_failures(
                    &alt,
                    &choices,
                    base.as_ref(),
                    opts.until_pct,
                    end,
                    opts.threads,
                );
                for (s, f) in sum.iter_mut().zip(failed) {
                    *s += f;
                }
            }
            sum
        };
        let best = best_of(&failed, fallback);
        out.push(Labelled {
            features,
            position: pos,
            fallback,
            failed,
            best,
        });
    }
    Ok(out)
}

/// `task` followed by `len` tasks drawn uniformly from `jobs` (fresh ids, so that they
/// never collide with the episode's): one draw of what may arrive after `task`.
pub fn resample(task: &Job, jobs: &[Job], len: usize, rng: &mut ChaCha8Rng) -> Vec<Job> {
    let mut out = Vec::with_capacity(len + 1);
    out.push(task.clone());
    if jobs.is_empty() {
        return out;
    }
    for k in 0..len {
        let mut t = jobs[rng.random_range(0..jobs.len())].clone();
        t.id = JobId(u32::MAX - k as u32);
        out.push(t);
    }
    out
}

/// Each choice applied to the next arrival of a copy of `run`, then rolled out with
/// `base` (see [`roll_out`]): the capacity (milli) that failed to fit, per choice.
pub fn rollout_failures(
    run: &InflationRun,
    choices: &[Choice],
    base: &dyn Placer,
    until_pct: f64,
    end: usize,
    threads: usize,
) -> Vec<u64> {
    let one = |c: &Choice| -> u64 {
        let mut r = run.clone();
        let before = r.failed_milli();
        let placement = match c {
            Choice::Place { placement, .. } => Some(placement),
            Choice::Wait => None,
        };
        r.apply(placement);
        let own = r.failed_milli() - before;
        own + roll_out(&mut r, base, until_pct, end)
    };
    super::par_map(choices, threads, one)
}
