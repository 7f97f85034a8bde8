//! Training the decline head (`marshal train decline`) by the cross-entropy method on
//! whole-episode returns.
//!
//! The head decides whether a GPU share that would open an idle GPU is left unplaced
//! (module docs of `marshal_model::policy::DeclineHead` say why it is a separate head).
//! Its value shows only at the end of an episode, hundreds of arrivals after the
//! decision, and only summed over many decisions, so it is searched on that: each
//! candidate head (a draw from a diagonal Gaussian over its weights) runs every training
//! episode with the artifact's network, gate and fallback, and is scored by the mean
//! relative gain over the same network without a head, minus twice its worst episode's
//! loss (a head that wins on one workload by losing on another is not wanted). The best
//! `elite` draws set the next Gaussian. Iteration 0's mean is a rule, not zero: "decline
//! while the whole-GPU pressure is at least `init_threshold`" (the whole-GPU demand
//! forecast to arrive over the idle GPUs; at 1 the idle GPUs will not hold it), the
//! heuristic the search refines (as behaviour cloning warm-starts the network).
//!
//! With `share_ties`, the search also draws the head's share-ties switch
//! (`marshal_model::policy::ShareTies`: FGD with sum-of-squares ties places the shares
//! instead of the network while the workload's mix lies in a box), jointly, since the
//! switch changes which shares open idle GPUs and so what declining pays. What is drawn
//! is which training workloads the switch is on for: one Bernoulli bit per training
//! trace (probability ½ at iteration 0, then the elite's share, kept within [0.05,
//! 0.95]), beside the head's Gaussian weights. A draw's box is the tightest one around
//! the workloads its bits hold, widened by `RANGE_SLACK`, and the draw runs with that
//! box, so what the search scores is what is stored. Bounds drawn as numbers were tried
//! first: a box must leave out *every* workload where the rule loses before it scores
//! above no switch at all, which almost no draw of eight bounds did, and where bounds
//! fall *between* training workloads is not something a search measures anyway; the
//! tight box keeps the switch off for a mix unlike every workload it paid on.
//!
//! The result is checked on validation episodes: if it is worse than the network
//! without a head by more than `tolerance` on any of them, no head is stored. Same seed
//! and episodes ⇒ the same head.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use marshal_model::policy::{
    DECLINE_FEATURES, DeclineHead, PolicyScorer, RANGE_SLACK, SHARE_TIES_BASE, SHARE_TIES_FEATURES,
    ShareTies, load_policy, write_decline_head,
};
use marshal_scheduler::policies::learned::decline::{
    MAX_WHOLE_GPU_PRESSURE, WorkloadMix, cpu_pressure, share_ties_features,
};
use marshal_scheduler::policies::learned::{Act, CLOSED_MARGIN, Gate, GateCounts};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Driver, EpisodeSpec, Objective, ProgressEvent, gain, mean, par_map, run_episode};
use marshal_model::policy::CandidateSet;

/// Settings of the search.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclineOptions {
    pub seed: u64,
    pub iterations: usize,
    /// Heads drawn per iteration.
    pub population: usize,
    /// The best this many set the next iteration's Gaussian.
    pub elite: usize,
    /// Iteration 0's mean declines while the whole-GPU pressure is at least this.
    pub init_threshold: f32,
    /// Iteration 0's spread of every weight, in logit units over its input's training
    /// range: weight `i` starts with standard deviation `init_std / width_i`, so that
    /// every input can move the decision about as much (the workload-mix inputs span a
    /// fraction of what the allocation inputs do).
    pub init_std: f32,
    /// Largest relative loss against the network without a head allowed on any
    /// validation episode.
    pub tolerance: f64,
    /// Search a share-ties switch with the head (needs FGD as the fallback).
    pub share_ties: bool,
    pub threads: usize,
}

impl Default for DeclineOptions {
    fn default() -> Self {
        DeclineOptions {
            seed: 0,
            iterations: 8,
            population: 12,
            elite: 4,
            init_threshold: 1.0,
            init_std: 1.0,
            tolerance: 0.01,
            share_ties: false,
            threads: 1,
        }
    }
}

impl DeclineOptions {
    pub fn validate(&self) -> Result<(), String> {
        if self.iterations == 0 || self.population < 2 {
            return Err("the search needs at least one iteration of at least two heads".into());
        }
        if self.elite == 0 || self.elite > self.population {
            return Err(format!(
                "elite {} must be between 1 and the population {}",
                self.elite, self.population
            ));
        }
        // At the cap itself p = ½, which never declines.
        if !(self.init_threshold > 0.0 && self.init_threshold < MAX_WHOLE_GPU_PRESSURE) {
            return Err(format!(
                "the initial threshold {} must be in (0, {MAX_WHOLE_GPU_PRESSURE})",
                self.init_threshold
            ));
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            return Err(format!(
                "the initial spread {} must be positive",
                self.init_std
            ));
        }
        if !(self.tolerance.is_finite() && self.tolerance >= 0.0) {
            return Err(format!("the tolerance {} must be ≥ 0", self.tolerance));
        }
        Ok(())
    }
}

/// One iteration of the search.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclineIteration {
    pub iteration: usize,
    /// Fitness of the iteration's best draw, its elite's mean, and the population's mean.
    pub best: f64,
    pub elite_mean: f64,
    pub mean: f64,
    /// The best draw's mean relative gain (without the worst-episode penalty).
    pub best_gain: f64,
}

/// A validation episode with and without the head.
#[derive(Clone, Debug, PartialEq)]
pub struct DeclineRow {
    pub episode: String,
    pub without: f64,
    pub with: f64,
    pub declined: u64,
    /// Shares placed with sum-of-squares ties (the switch on).
    pub sum_of_squares_ties: u64,
}

/// What the search found.
#[derive(Clone, Debug)]
pub struct DeclineSearch {
    /// The best head's fitness on the training episodes (mean relative gain over no
    /// head, minus twice its worst episode's loss).
    pub training_fitness: f64,
    /// The head written (`None`: it did not beat having no head on the training
    /// episodes, or it lost more than the tolerance on a validation episode; then none
    /// was written and any earlier one was removed).
    pub stored: Option<DeclineHead>,
    /// The searched head, stored or not.
    pub head: DeclineHead,
    pub curve: Vec<DeclineIteration>,
    pub validation: Vec<DeclineRow>,
}

/// A network-driven episode of `spec`, seed index `index`, with `head` (or none).
struct Runner {
    scorer: Arc<PolicyScorer>,
    gate: Gate,
    candidates: CandidateSet,
}

impl Runner {
    fn run(
        &self,
        spec: &EpisodeSpec,
        index: usize,
        head: Option<&DeclineHead>,
    ) -> Result<(f64, GateCounts), String> {
        let o = run_episode(
            spec,
            index,
            &Driver::Learned {
                scorer: Some(self.scorer.clone()),
                act: Act::Greedy,
                gate: self.gate,
                candidates: self.candidates,
                decline: head.cloned().map(Arc::new),
            },
        )?;
        Ok((o.score, o.counts))
    }
}

/// Every (spec, seed index) of `specs`.
fn episodes(specs: &[EpisodeSpec]) -> Vec<(&EpisodeSpec, usize)> {
    specs
        .iter()
        .flat_map(|s| (0..s.jobs_by_seed.len()).map(move |i| (s, i)))
        .collect()
}

/// A standard normal draw (Box–Muller), so that the search needs no further crate.
fn normal(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

/// The input range the head may act in: the allocation and share inputs span [0, 1]
/// and the whole-GPU pressure [0, its cap] in every inflation episode; the workload
/// mix and CPU pressure only the training workloads' values.
fn input_range(train: &[EpisodeSpec]) -> Vec<[f32; 2]> {
    let mixes: Vec<WorkloadMix> = train
        .iter()
        .flat_map(|s| s.jobs_by_seed.iter().map(|(_, jobs)| WorkloadMix::of(jobs)))
        .collect();
    let cpu: Vec<f32> = train
        .iter()
        .flat_map(|s| {
            s.jobs_by_seed
                .iter()
                .map(|(_, jobs)| cpu_pressure(&s.topo, WorkloadMix::of(jobs)))
        })
        .collect();
    let span_of = |values: &[f32]| {
        let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        [lo, hi]
    };
    let span = |f: fn(&WorkloadMix) -> f32| span_of(&mixes.iter().map(f).collect::<Vec<_>>());
    vec![
        [1.0, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
        [0.0, 1.0],
        span(|m| m.whole_any_model),
        span(|m| m.whole_given_models),
        [0.0, MAX_WHOLE_GPU_PRESSURE],
        span_of(&cpu),
    ]
}

/// The share-ties switch on for the workloads `held`: the tightest box around them,
/// widened by [`RANGE_SLACK`]; `None` when there are none.
pub fn box_around(held: &[[f32; SHARE_TIES_FEATURES]]) -> Option<ShareTies> {
    if held.is_empty() {
        return None;
    }
    let bounds = (0..SHARE_TIES_FEATURES)
        .map(|k| {
            let lo = held.iter().map(|x| x[k]).fold(f32::INFINITY, f32::min);
            let hi = held.iter().map(|x| x[k]).fold(f32::NEG_INFINITY, f32::max);
            [lo - RANGE_SLACK, hi + RANGE_SLACK]
        })
        .collect();
    Some(ShareTies::new(bounds))
}

/// Whether a head is stored: it must beat having no head on the training episodes
/// (`training_fitness` > 0; the search's mean can end on a head that never declines,
/// which is not worth recording) and lose no more than `tolerance` on any validation
/// episode (`worst_validation_gain`, relative).
pub fn worth_storing(training_fitness: f64, worst_validation_gain: f64, tolerance: f64) -> bool {
    training_fitness > 0.0 && worst_validation_gain >= -tolerance
}

/// Searches a decline head for the artifact in `dir` on `train` and checks it on
/// `valid` (all inflation episodes); writes it into the artifact's `meta.json` when it
/// passes, and removes any earlier head when it does not.
pub fn train_decline(
    dir: &Path,
    train: &[EpisodeSpec],
    valid: &[EpisodeSpec],
    opts: &DeclineOptions,
    progress: &mut dyn FnMut(ProgressEvent),
) -> Result<DeclineSearch, String> {
    opts.validate()?;
    if train.is_empty() || valid.is_empty() {
        return Err("the decline head needs training and validation episodes".into());
    }
    if let Some(s) = train
        .iter()
        .chain(valid)
        .find(|s| s.objective() != Objective::Inflation)
    {
        return Err(format!(
            "{}: the decline head is trained and used on inflation episodes only (append \
             `:inflation`)",
            s.name
        ));
    }
    let fallback = &train[0].fallback;
    if let Some(s) = train.iter().chain(valid).find(|s| &s.fallback != fallback) {
        return Err(format!(
            "{}: every episode must run with one fallback ({} here, {fallback} in {})",
            s.name, s.fallback, train[0].name
        ));
    }
    if opts.share_ties && fallback != SHARE_TIES_BASE {
        return Err(format!(
            "share ties break {SHARE_TIES_BASE}'s ties; the fallback here is {fallback}"
        ));
    }
    let artifact = load_policy(dir).map_err(|e| format!("policy model {}: {e}", dir.display()))?;
    let runner = Runner {
        scorer: Arc::new(artifact.scorer),
        gate: Gate {
            margin_threshold: artifact
                .meta
                .margin_threshold_for(fallback)
                .unwrap_or(CLOSED_MARGIN),
            distance_limit: artifact.meta.distance_limit,
        },
        candidates: artifact.meta.candidates,
    };
    let train_eps = episodes(train);
    let without: Vec<f64> = par_map(&train_eps, opts.threads, |(s, i)| runner.run(s, *i, None))
        .into_iter()
        .map(|r| r.map(|(score, _)| score))
        .collect::<Result<_, _>>()?;
    let range = input_range(train);
    // One mix per training trace (its seeds share the pod list).
    let mixes: Vec<[f32; SHARE_TIES_FEATURES]> = train
        .iter()
        .filter_map(|s| {
            let (_, jobs) = s.jobs_by_seed.first()?;
            Some(share_ties_features(&s.topo, WorkloadMix::of(jobs)))
        })
        .collect();
    let head_of = |weights: &[f32]| {
        let mut head = DeclineHead::new(
            weights[..DECLINE_FEATURES].to_vec(),
            range.clone(),
            fallback,
            runner.gate.margin_threshold,
        );
        if opts.share_ties {
            let held: Vec<_> = (mixes.iter().zip(&weights[DECLINE_FEATURES..]))
                .filter(|(_, bit)| **bit >= 0.5)
                .map(|(x, _)| *x)
                .collect();
            head.share_ties = box_around(&held);
        }
        head
    };
    let fitness = |weights: &[f32]| -> Result<(f64, f64), String> {
        let head = head_of(weights);
        let gains: Vec<f64> = train_eps
            .iter()
            .zip(&without)
            .map(|((s, i), w)| {
                runner
                    .run(s, *i, Some(&head))
                    .map(|(ours, _)| gain(*w, ours))
            })
            .collect::<Result<_, _>>()?;
        let worst = gains.iter().copied().fold(f64::INFINITY, f64::min);
        let g = mean(gains.iter().copied());
        Ok((g + 2.0 * worst.min(0.0), g))
    };
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ 0xdec1_1e00);
    let dims = DECLINE_FEATURES + if opts.share_ties { mixes.len() } else { 0 };
    let mut mu = vec![0.0f32; dims];
    // 20 · (pressure − threshold): p = ½ at the threshold, ≈ 0.12 at 0.1 below it.
    mu[7] = 20.0;
    mu[0] = -20.0 * opts.init_threshold;
    // Narrow ranges (one training workload) count as a tenth of the unit range.
    let spread = |[lo, hi]: &[f32; 2]| opts.init_std / (hi - lo).max(0.1);
    let mut sigma: Vec<f32> = range.iter().map(spread).collect();
    sigma[0] = opts.init_std;
    // The bits: `mu` holds each one's probability; `sigma` is unused for them.
    mu[DECLINE_FEATURES..].fill(0.5);
    sigma.resize(dims, 0.0);
    let floor: Vec<f32> = sigma.iter().map(|s| s * 0.05).collect();
    let mut best: Option<(f64, Vec<f32>)> = None;
    let mut curve = Vec::new();
    for iteration in 0..opts.iterations {
        let mut draws: Vec<Vec<f32>> = (0..opts.population)
            .map(|_| {
                (0..dims)
                    .map(|k| {
                        if k < DECLINE_FEATURES {
                            mu[k] + sigma[k] * normal(&mut rng)
                        } else {
                            f32::from(u8::from(rng.random::<f32>() < mu[k]))
                        }
                    })
                    .collect()
            })
            .collect();
        // The current mean competes too (each bit its likelier value), so a search that
        // finds nothing better keeps it.
        draws[0] = (mu.iter().enumerate())
            .map(|(k, &m)| {
                if k < DECLINE_FEATURES {
                    m
                } else {
                    f32::from(u8::from(m >= 0.5))
                }
            })
            .collect();
        let scored: Vec<(f64, f64)> = par_map(&draws, opts.threads, |w| fitness(w))
            .into_iter()
            .collect::<Result<_, _>>()?;
        let mut order: Vec<usize> = (0..draws.len()).collect();
        order.sort_by(|&a, &b| scored[b].0.total_cmp(&scored[a].0).then(a.cmp(&b)));
        let elite: Vec<&Vec<f32>> = order[..opts.elite].iter().map(|&i| &draws[i]).collect();
        for k in 0..dims {
            let m = elite.iter().map(|w| w[k]).sum::<f32>() / elite.len() as f32;
            if k >= DECLINE_FEATURES {
                mu[k] = m.clamp(0.05, 0.95);
                continue;
            }
            let var = elite.iter().map(|w| (w[k] - m).powi(2)).sum::<f32>() / elite.len() as f32;
            mu[k] = m;
            // A floor (5 % of the initial spread) keeps the search from freezing.
            sigma[k] = var.sqrt().max(floor[k]);
        }
        let top = order[0];
        if best.as_ref().is_none_or(|(f, _)| scored[top].0 > *f) {
            best = Some((scored[top].0, draws[top].clone()));
        }
        let row = DeclineIteration {
            iteration,
            best: scored[top].0,
            elite_mean: mean(order[..opts.elite].iter().map(|&i| scored[i].0)),
            mean: mean(scored.iter().map(|s| s.0)),
            best_gain: scored[top].1,
        };
        progress(ProgressEvent {
            phase: "decline",
            done: iteration + 1,
            total: opts.iterations,
            message: format!(
                "best {:+.2} % (gain {:+.2} %), elite {:+.2} %",
                100.0 * row.best,
                100.0 * row.best_gain,
                100.0 * row.elite_mean
            ),
        });
        curve.push(row);
    }
    let (best_fitness, weights) = best.expect("at least one iteration ran");
    let mut head = head_of(&weights);
    let valid_eps = episodes(valid);
    let validation: Vec<DeclineRow> = par_map(&valid_eps, opts.threads, |(s, i)| {
        let (without, _) = runner.run(s, *i, None)?;
        let (with, counts) = runner.run(s, *i, Some(&head))?;
        Ok(DeclineRow {
            episode: format!("{} seed {}", s.name, s.jobs_by_seed[*i].0),
            without,
            with,
            declined: counts.declines,
            sum_of_squares_ties: counts.sum_of_squares_ties,
        })
    })
    .into_iter()
    .collect::<Result<_, String>>()?;
    let worst = validation
        .iter()
        .map(|r| gain(r.without, r.with))
        .fold(f64::INFINITY, f64::min);
    head.training = BTreeMap::from([
        ("seed".to_string(), opts.seed as f64),
        ("iterations".to_string(), opts.iterations as f64),
        ("population".to_string(), opts.population as f64),
        ("elite".to_string(), opts.elite as f64),
        ("init_threshold".to_string(), f64::from(opts.init_threshold)),
        ("init_std".to_string(), f64::from(opts.init_std)),
        ("tolerance".to_string(), opts.tolerance),
        (
            "share_ties".to_string(),
            f64::from(u8::from(opts.share_ties)),
        ),
        ("training_episodes".to_string(), train_eps.len() as f64),
        ("training_fitness".to_string(), best_fitness),
    ]);
    for r in &validation {
        let key = r.episode.replace(' ', "_");
        head.scores.insert(format!("{key}/without"), r.without);
        head.scores.insert(format!("{key}/with"), r.with);
        head.scores
            .insert(format!("{key}/declined"), r.declined as f64);
        if opts.share_ties {
            head.scores.insert(
                format!("{key}/sum_of_squares_ties"),
                r.sum_of_squares_ties as f64,
            );
        }
    }
    let stored = worth_storing(best_fitness, worst, opts.tolerance).then(|| head.clone());
    write_decline_head(dir, stored.clone())
        .map_err(|e| format!("recording the decline head in {}: {e}", dir.display()))?;
    Ok(DeclineSearch {
        training_fitness: best_fitness,
        stored,
        head,
        curve,
        validation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::tiny_artifact;
    use marshal_model::policy::{DeclineVerdict, load_policy};
    use marshal_scheduler::domain::{ClusterSpec, GpuDemand, Job, JobId, Topology};
    use marshal_scheduler::sim::SimConfig;

    /// Shares of 510 milli: no two fit on one GPU.
    const SHARE: u16 = 510;

    /// Shares that leave slivers no other task can use, and one-GPU tasks, on 32 GPUs:
    /// once idle GPUs run short, a share placed is a one-GPU task failed later, so
    /// declining late shares pays (0.51 GPU lost, 1 GPU won).
    fn slivers(seeds: &[u64]) -> EpisodeSpec {
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=8\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        let jobs: Vec<Job> = (0..40)
            .map(|i| {
                let mut j = Job::whole_gpus(JobId(i), 1, 0.0, 0.0);
                j.cpu_milli = 2000;
                if i % 2 == 0 {
                    j.gpu = GpuDemand::Milli(SHARE);
                }
                j
            })
            .collect();
        EpisodeSpec {
            name: "slivers".into(),
            topo: Arc::new(Topology::build(&spec).unwrap()),
            jobs_by_seed: seeds.iter().map(|&s| (s, jobs.clone())).collect(),
            config: SimConfig::inflation(0),
            fallback: "fgd".into(),
        }
    }

    fn options(seed: u64) -> DeclineOptions {
        DeclineOptions {
            seed,
            iterations: 4,
            population: 8,
            elite: 3,
            init_threshold: 0.95,
            threads: 2,
            ..DeclineOptions::default()
        }
    }

    /// A closed-gate artifact: the network never decides, so episodes are FGD's plus
    /// whatever the head declines.
    fn artifact() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        tiny_artifact(tmp.path(), "fgd", 3, 1.5);
        tmp
    }

    #[test]
    fn the_search_finds_a_head_that_declines_where_declining_pays_and_records_it() {
        let tmp = artifact();
        let train = [slivers(&[1000, 1001])];
        let valid = [slivers(&[2000, 2001])];
        let search = train_decline(tmp.path(), &train, &valid, &options(0), &mut |_| {}).unwrap();
        let best = search.curve.iter().map(|r| r.best_gain).fold(0.0, f64::max);
        assert!(best > 0.02, "{:?}", search.curve);
        assert!(
            search
                .validation
                .iter()
                .all(|r| r.with < r.without && r.declined > 0),
            "{:?}",
            search.validation
        );
        let stored = search.stored.clone().expect("it passed validation");
        // Recorded in the artifact, which still loads, with the head it was given.
        let meta = load_policy(tmp.path()).unwrap().meta;
        assert_eq!(meta.decline.as_ref(), Some(&stored));
        assert_eq!(stored.scores.len(), 3 * valid[0].jobs_by_seed.len());
        // With no whole-GPU demand left to come (pressure 0) it places; with the idle
        // GPUs short of the demand to come, it declines.
        let mix = WorkloadMix::of(&train[0].jobs_by_seed[0].1);
        let inputs = |allocated: f32, pressure: f32| {
            [
                1.0,
                allocated,
                allocated,
                1.0 - allocated,
                0.51,
                mix.whole_any_model,
                0.0,
                pressure,
                cpu_pressure(&train[0].topo, mix),
            ]
        };
        assert!(matches!(
            stored.decide(&inputs(0.9, 0.0)),
            DeclineVerdict::Place { .. }
        ));
        assert!(matches!(
            stored.decide(&inputs(0.8, 2.0)),
            DeclineVerdict::Decline { .. }
        ));
    }

    #[test]
    fn the_same_seed_gives_the_same_head_and_another_seed_draws_others() {
        let run = |seed| {
            let tmp = artifact();
            train_decline(
                tmp.path(),
                &[slivers(&[1000])],
                &[slivers(&[2000])],
                &DeclineOptions {
                    iterations: 2,
                    ..options(seed)
                },
                &mut |_| {},
            )
            .unwrap()
        };
        let (a, b, c) = (run(5), run(5), run(6));
        // The whole head, as stored (settings, scores, …), not only its weights.
        assert_eq!(a.head, b.head);
        assert_eq!(a.curve, b.curve);
        assert_ne!(a.curve, c.curve);
    }

    /// `slivers` with every task changed by `change`.
    fn changed(seeds: &[u64], change: impl Fn(&mut Job)) -> EpisodeSpec {
        let mut spec = slivers(seeds);
        for (_, jobs) in &mut spec.jobs_by_seed {
            jobs.iter_mut().for_each(&change);
        }
        spec
    }

    #[test]
    fn a_head_abstains_on_a_workload_unlike_its_training() {
        let tmp = artifact();
        // Every task a share: the workload mix is outside the trained range, so the head
        // abstains (places everything) and is kept.
        let all_shares = changed(&[2000], |j| j.gpu = GpuDemand::Milli(SHARE));
        let search = train_decline(
            tmp.path(),
            &[slivers(&[1000])],
            &[all_shares],
            &options(0),
            &mut |_| {},
        )
        .unwrap();
        let row = &search.validation[0];
        assert_eq!((row.declined, row.with), (0, row.without), "{row:?}");
        assert!(search.stored.is_some(), "{:?}", search.curve);
    }

    #[test]
    fn a_head_is_stored_only_if_it_wins_in_training_and_loses_little_in_validation() {
        assert!(worth_storing(0.01, 0.0, 0.0));
        assert!(worth_storing(0.01, -0.005, 0.01));
        // It loses on a validation episode by more than the tolerance …
        assert!(!worth_storing(0.01, -0.02, 0.01));
        // … or never beat having no head in training.
        assert!(!worth_storing(0.0, 0.0, 0.01));
        assert!(!worth_storing(-0.3, 0.1, 0.01));
    }

    #[test]
    fn a_search_that_finds_nothing_removes_the_earlier_head() {
        let tmp = artifact();
        let pays = train_decline(
            tmp.path(),
            &[slivers(&[1000])],
            &[slivers(&[2000])],
            &options(0),
            &mut |_| {},
        )
        .unwrap();
        assert!(pays.stored.is_some());
        // Declining from a whole-GPU pressure of 0.05 (nearly always), never searched
        // away from (one draw each of a near-zero spread): it loses in training, so
        // nothing is stored.
        let loses = train_decline(
            tmp.path(),
            &[slivers(&[1000])],
            &[slivers(&[2000])],
            &DeclineOptions {
                iterations: 1,
                population: 2,
                elite: 1,
                init_threshold: 0.05,
                init_std: 1e-6,
                ..options(0)
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(loses.curve[0].best < 0.0, "{:?}", loses.curve);
        assert!(loses.stored.is_none());
        assert_eq!(load_policy(tmp.path()).unwrap().meta.decline, None);
    }

    #[test]
    fn the_share_ties_box_is_the_tightest_around_the_workloads_it_holds_widened() {
        assert_eq!(box_around(&[]), None);
        let ties = box_around(&[[0.7, 0.0, 0.07, 0.8], [0.7, 0.0, 0.07, 0.68]]).unwrap();
        let want = [[0.65, 0.75], [-0.05, 0.05], [0.02, 0.12], [0.63, 0.85]];
        for (got, want) in ties.bounds.iter().zip(want) {
            assert!((got[0] - want[0]).abs() < 1e-6 && (got[1] - want[1]).abs() < 1e-6);
        }
        // Between the two CPU pressures: on; multigpu20's multi-GPU share: off.
        assert!(ties.on(&[0.7, 0.0, 0.07, 0.75]));
        assert!(!ties.on(&[0.756, 0.0, 0.204, 0.78]));
    }

    #[test]
    fn a_share_ties_switch_is_searched_with_the_head_and_recorded_with_it() {
        let tmp = artifact();
        let search = train_decline(
            tmp.path(),
            &[slivers(&[1000])],
            &[slivers(&[2000])],
            &DeclineOptions {
                share_ties: true,
                ..options(0)
            },
            &mut |_| {},
        )
        .unwrap();
        // On for the one training workload (the tight box around it) or off; the
        // validation episodes, of the same workload, count its shares accordingly.
        let mix = share_ties_features(
            &slivers(&[1]).topo,
            WorkloadMix::of(&slivers(&[1]).jobs_by_seed[0].1),
        );
        let on = search.head.share_ties.is_some();
        if on {
            assert_eq!(search.head.share_ties, box_around(&[mix]));
        }
        for row in &search.validation {
            assert_eq!(row.sum_of_squares_ties > 0, on, "{row:?}");
        }
        assert_eq!(search.head.training.get("share_ties"), Some(&1.0));
        let stored = search.stored.expect("it passed validation");
        assert_eq!(load_policy(tmp.path()).unwrap().meta.decline, Some(stored));
        // Only FGD's ties are switched.
        let mut other = slivers(&[1]);
        other.fallback = "best-fit".into();
        let err = train_decline(
            tmp.path(),
            std::slice::from_ref(&other),
            &[other.clone()],
            &DeclineOptions {
                share_ties: true,
                ..options(0)
            },
            &mut |_| {},
        )
        .unwrap_err();
        assert!(err.contains("fallback here is best-fit"), "{err}");
    }

    #[test]
    fn replay_episodes_and_bad_settings_are_refused() {
        let tmp = artifact();
        let mut replay = slivers(&[1]);
        replay.config = SimConfig::replay(0);
        replay.name = "tiny-replay".into();
        let err = train_decline(
            tmp.path(),
            &[replay],
            &[slivers(&[2])],
            &options(0),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            err.contains("tiny-replay") && err.contains("inflation"),
            "{err}"
        );
        let bad = DeclineOptions {
            elite: 9,
            ..options(0)
        };
        let err = train_decline(
            tmp.path(),
            &[slivers(&[1])],
            &[slivers(&[2])],
            &bad,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(err.contains("elite 9"), "{err}");
        // A rule at the pressure's cap could never decline (p = ½ there).
        let never = DeclineOptions {
            init_threshold: MAX_WHOLE_GPU_PRESSURE,
            ..options(0)
        };
        let err = train_decline(
            tmp.path(),
            &[slivers(&[1])],
            &[slivers(&[2])],
            &never,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(err.contains("initial threshold"), "{err}");
        // Every episode runs behind one fallback's gate, so they must share it.
        let mut other = slivers(&[2]);
        other.fallback = "best-fit".into();
        other.name = "other".into();
        let err = train_decline(
            tmp.path(),
            &[slivers(&[1])],
            &[other],
            &options(0),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            err.contains("other") && err.contains("one fallback"),
            "{err}"
        );
    }
}
