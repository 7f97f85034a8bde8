//! `learned`: placement ranked by the policy network, behind a confidence gate.
//!
//! For each job the placer (1) asks the fallback heuristic for its placement, (2) generates
//! a few more feasible candidates deterministically ([`candidates`]), plus "wait" for a
//! whole-GPU gang while something is running (holding capacity until it frees), (3)
//! featurises them ([`features`], the one featuriser that training also records through)
//! and (4) lets the network rank them. The gate hands the decision back to the fallback
//! when the probability margin between the two best candidates is below the artifact's
//! threshold, when the inputs are further from the training data than the artifact
//! allows, when scoring fails, or when there is no usable model (missing, corrupt, another
//! schema). In the inflation experiment, a decline head may leave a share unplaced, and
//! its share-ties switch may hand the shares of a workload whose mix lies in its box to
//! FGD with sum-of-squares ties (`marshal_model::policy::ShareTies`, path
//! `fallback:share-ties`). Every decision is counted by path and reason ([`GateStats`]), so a run reports
//! its fallback rate. Queue order and preemption are the fallback policy's. A wait comes
//! back as [`Status::Deferred`]: the gang could start now, so the cycle does not preempt,
//! move jobs or reserve nodes for it.

pub mod candidates;
pub mod decline;
pub mod features;
pub mod setup;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use marshal_model::policy::{
    CandidateSet, DecisionFeatures, DeclineHead, DeclineVerdict, MAX_CANDIDATES, PolicyScorer,
    SHARE_TIES_ALTERNATIVE, ShareTies, load_policy,
};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, GpuDemand, Job, JobId, Placement};
use crate::framework::{Context, Placer, Policy, Status};
use crate::policies::{Fgd, UnknownPolicy, build};

pub use features::{Choice, NodeScores, featurise};
pub use setup::{LearnedSetup, PolicyError, build_policy, check_name};

/// Name of the learned policy.
pub const LEARNED: &str = "learned";

/// Which path decided, and why.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DecisionPath {
    /// The network's choice was used.
    Learned,
    /// No usable model: the fallback decided.
    NoModel,
    /// The margin was below the threshold.
    LowMargin,
    /// The inputs were unlike the training data.
    OutOfDistribution,
    /// Scoring failed (a non-finite feature or logit).
    ScoringError,
    /// A share the decline head's share-ties switch handed to FGD with sum-of-squares
    /// ties.
    ShareTies,
}

impl DecisionPath {
    /// The label decisions carry: `learned` or `fallback:<reason>`.
    pub fn label(self) -> &'static str {
        match self {
            DecisionPath::Learned => "learned",
            DecisionPath::NoModel => "fallback:no-model",
            DecisionPath::LowMargin => "fallback:low-margin",
            DecisionPath::OutOfDistribution => "fallback:out-of-distribution",
            DecisionPath::ScoringError => "fallback:scoring-error",
            DecisionPath::ShareTies => "fallback:share-ties",
        }
    }

    pub fn is_learned(self) -> bool {
        self == DecisionPath::Learned
    }
}

/// One candidate of a traced decision, with the network's scores when it scored them.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedCandidate {
    /// `None` for the "wait" action.
    pub placement: Option<Placement>,
    /// Whether this is the fallback heuristic's choice.
    pub fallback: bool,
    /// The network's logit and softmax probability (absent when nothing was scored).
    pub logit: Option<f32>,
    pub probability: Option<f32>,
}

/// What one `place` call of the learned placer decided and why: the service reads
/// these to label each decision (path, confidence) and to explain its candidates.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionTrace {
    pub job: JobId,
    pub path: DecisionPath,
    /// The gate's confidence: the probability margin between the two best candidates.
    pub margin: Option<f32>,
    /// The input distance from the training data.
    pub distance: Option<f32>,
    /// Index of the candidate the network chose (when it decided).
    pub chosen: Option<usize>,
    pub candidates: Vec<TracedCandidate>,
    /// The featurised decision (absent when nothing was featurised), so that the
    /// decision log can be retrained from.
    pub features: Option<DecisionFeatures>,
    /// Index of the candidate that was executed: the network's choice on the learned
    /// path, the fallback heuristic's on a fallback path.
    pub taken: Option<usize>,
}

/// Where a placer appends its [`DecisionTrace`]s; the owner drains it (the service does
/// after every cycle, so it holds at most one cycle's decisions).
pub type TraceSink = Arc<Mutex<Vec<DecisionTrace>>>;

/// How the placer picks among scored candidates.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// The best candidate, behind the gate (serving and evaluation).
    Greedy,
    /// A draw from the softmax, no gate (policy-gradient training).
    Sample,
    /// The fallback's choice, recorded for behaviour cloning.
    Imitate,
}

/// A decision recorded for training.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub features: DecisionFeatures,
    pub chosen: usize,
    /// GPU capacity allocated (milli) when the decision was made.
    pub allocated_milli: u64,
    /// How many `place` calls this placer had answered before (in the FGD experiment,
    /// the task's arrival index).
    pub call: u64,
}

/// Decisions by path. Shared with the caller through an `Arc`.
#[derive(Debug, Default)]
pub struct GateStats {
    learned: AtomicU64,
    no_model: AtomicU64,
    low_margin: AtomicU64,
    out_of_distribution: AtomicU64,
    scoring_error: AtomicU64,
    waits: AtomicU64,
    declines: AtomicU64,
    decline_out_of_range: AtomicU64,
    sum_of_squares_ties: AtomicU64,
}

/// A snapshot of [`GateStats`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GateCounts {
    pub learned: u64,
    pub no_model: u64,
    pub low_margin: u64,
    pub out_of_distribution: u64,
    pub scoring_error: u64,
    /// Learned decisions that chose to wait.
    pub waits: u64,
    /// Shares the decline head left unplaced (counted besides the decision's path).
    #[serde(default)]
    pub declines: u64,
    /// Shares the decline head abstained on: an input outside its trained range.
    #[serde(default)]
    pub decline_out_of_range: u64,
    /// Shares placed by FGD with its ties broken by the sum-of-squares rule, not the
    /// network (the decline head's share-ties switch was on for the workload): fallback
    /// decisions.
    #[serde(default)]
    pub sum_of_squares_ties: u64,
}

impl GateCounts {
    pub fn decisions(&self) -> u64 {
        self.learned + self.fallbacks()
    }

    pub fn fallbacks(&self) -> u64 {
        self.no_model
            + self.low_margin
            + self.out_of_distribution
            + self.scoring_error
            + self.sum_of_squares_ties
    }

    /// Share of decisions the fallback made (0 when there were none).
    pub fn fallback_rate(&self) -> f64 {
        self.fallbacks() as f64 / self.decisions().max(1) as f64
    }
}

impl GateStats {
    fn count(&self, path: DecisionPath) {
        let c = match path {
            DecisionPath::Learned => &self.learned,
            DecisionPath::NoModel => &self.no_model,
            DecisionPath::LowMargin => &self.low_margin,
            DecisionPath::OutOfDistribution => &self.out_of_distribution,
            DecisionPath::ScoringError => &self.scoring_error,
            DecisionPath::ShareTies => &self.sum_of_squares_ties,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> GateCounts {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        GateCounts {
            learned: r(&self.learned),
            no_model: r(&self.no_model),
            low_margin: r(&self.low_margin),
            out_of_distribution: r(&self.out_of_distribution),
            scoring_error: r(&self.scoring_error),
            waits: r(&self.waits),
            declines: r(&self.declines),
            decline_out_of_range: r(&self.decline_out_of_range),
            sum_of_squares_ties: r(&self.sum_of_squares_ties),
        }
    }
}

/// The gate's thresholds.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Gate {
    /// Below this probability margin the fallback decides.
    pub margin_threshold: f32,
    /// Above this input distance the fallback decides.
    pub distance_limit: f32,
}

/// The learned placer.
#[derive(Debug)]
pub struct LearnedPlacer {
    fallback: Box<dyn Placer>,
    fgd: Fgd,
    model: Result<Arc<PolicyScorer>, String>,
    pub gate: Gate,
    pub act: Act,
    stats: Arc<GateStats>,
    recorder: Option<Arc<Mutex<Vec<Record>>>>,
    trace: Option<TraceSink>,
    calls: AtomicU64,
    candidates: CandidateSet,
    decline: Option<Arc<DeclineHead>>,
    /// The decline head's share-ties switch and the placer it hands shares to
    /// (`fgd-sumsq`).
    share_ties: Option<(ShareTies, Box<dyn Placer>)>,
    mix: decline::WorkloadMix,
}

impl LearnedPlacer {
    /// `model` is the scorer or why there is none (then every decision falls back).
    pub fn new(
        fallback: Box<dyn Placer>,
        workload: &[Job],
        model: Result<Arc<PolicyScorer>, String>,
        gate: Gate,
    ) -> LearnedPlacer {
        LearnedPlacer {
            fallback,
            fgd: Fgd::from_workload(workload),
            model,
            gate,
            act: Act::Greedy,
            stats: Arc::default(),
            recorder: None,
            trace: None,
            calls: AtomicU64::new(0),
            candidates: CandidateSet::Ranked,
            decline: None,
            share_ties: None,
            mix: decline::WorkloadMix::of(workload),
        }
    }

    /// Lets `head` (when there is one) leave a share unplaced rather than open an idle GPU
    /// for it: the placement comes back as [`Status::Deferred`]. Only for the inflation
    /// objective, which it was trained on (in a replay or the service a declined share
    /// would wait with nothing to bound its wait). A head with a share-ties switch also
    /// hands a share to FGD with sum-of-squares ties, not the network, where the switch
    /// says so (`workload` is the trace being scheduled, as for [`LearnedPlacer::new`];
    /// the switch needs FGD as the fallback, which [`LearnedModel::decline_for`] checks).
    pub fn with_decline(mut self, head: Option<Arc<DeclineHead>>, workload: &[Job]) -> Self {
        self.share_ties = head
            .as_ref()
            .and_then(|h| h.share_ties.clone())
            .zip(build(SHARE_TIES_ALTERNATIVE, workload).ok())
            .map(|(ties, alternative)| (ties, alternative.placer));
        self.decline = head;
        self
    }

    /// FGD with sum-of-squares ties, if the share-ties switch hands `job` to it.
    fn share_ties_placer(
        &self,
        job: &Job,
        state: &ClusterState,
        ctx: &Context,
    ) -> Option<&dyn Placer> {
        let (ties, alternative) = self.share_ties.as_ref()?;
        // Like the decline head, only inside the inflation experiment it was searched on.
        let on = matches!(job.gpu, GpuDemand::Milli(_))
            && ctx.arrived_milli.is_some()
            && ties.on(&decline::share_ties_features(state.topology(), self.mix));
        on.then_some(alternative.as_ref())
    }

    /// Ranks `set`'s candidates (default [`CandidateSet::Ranked`]): the set the model was
    /// trained on.
    pub fn with_candidates(mut self, set: CandidateSet) -> Self {
        self.candidates = set;
        self
    }

    pub fn stats(&self) -> Arc<GateStats> {
        self.stats.clone()
    }

    /// Records every scored decision into `recorder` (training).
    pub fn with_recorder(mut self, act: Act, recorder: Arc<Mutex<Vec<Record>>>) -> Self {
        self.act = act;
        self.recorder = Some(recorder);
        self
    }

    /// Reports every gated decision into `sink` (the service's per-decision paths).
    pub fn with_trace(mut self, sink: TraceSink) -> Self {
        self.trace = Some(sink);
        self
    }

    /// Why there is no model, if there is none.
    pub fn model_error(&self) -> Option<&str> {
        self.model.as_ref().err().map(String::as_str)
    }

    fn fall_back(
        &self,
        path: DecisionPath,
        fallback: Result<Placement, Status>,
    ) -> Result<Placement, Status> {
        self.stats.count(path);
        fallback
    }

    /// Appends a decision to the trace sink, if there is one.
    fn trace(
        &self,
        job: &Job,
        path: DecisionPath,
        choices: &[Choice],
        scored: Option<&marshal_model::policy::Scored>,
        chosen: Option<usize>,
        features: Option<&DecisionFeatures>,
    ) {
        let Some(sink) = &self.trace else { return };
        let taken = chosen.or_else(|| fallback_index(choices));
        let candidates = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let (placement, fallback) = match c {
                    Choice::Place {
                        placement,
                        fallback,
                    } => (Some(placement.clone()), *fallback),
                    Choice::Wait => (None, false),
                };
                TracedCandidate {
                    placement,
                    fallback,
                    logit: scored.and_then(|s| s.logits.get(i).copied()),
                    probability: scored.and_then(|s| s.probs.get(i).copied()),
                }
            })
            .collect();
        sink.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(DecisionTrace {
                job: job.id,
                path,
                margin: scored.map(|s| s.margin),
                distance: scored.map(|s| s.distance),
                chosen,
                candidates,
                features: features.cloned(),
                taken,
            });
    }

    fn tracing(&self) -> bool {
        self.trace.is_some()
    }
}

/// Index of the fallback heuristic's placement among `choices`.
fn fallback_index(choices: &[Choice]) -> Option<usize> {
    choices
        .iter()
        .position(|c| matches!(c, Choice::Place { fallback: true, .. }))
}

impl LearnedPlacer {
    /// The decision the network ranks for `job`, given the fallback's answer: the
    /// candidate choices (the fallback's first, "wait" last when offered) and their
    /// features; `None` when nothing is feasible. The placer serves and records through
    /// this, and the rollout labeller of training asks it for the same candidates.
    pub fn decision(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
        fallback: &Result<Placement, Status>,
    ) -> Option<(Vec<Choice>, DecisionFeatures)> {
        let scores = candidates::node_scores(job, state, ctx, &self.fgd);
        // Waiting is offered to whole-GPU gangs only, and only while something runs, so a
        // wait always ends when capacity frees.
        let may_wait = matches!(job.gpu, GpuDemand::Whole(_))
            && job.gpu_count() > 1
            && state.allocated_milli() > 0;
        let mut choices = candidates::generate(
            job,
            state,
            ctx,
            &self.fgd,
            &scores,
            fallback.as_ref().ok().cloned(),
            (MAX_CANDIDATES - usize::from(may_wait), self.candidates),
        );
        if choices.is_empty() {
            return None;
        }
        if may_wait {
            choices.push(Choice::Wait);
        }
        let features = featurise(job, state, &choices, &scores, &self.fgd);
        Some((choices, features))
    }

    /// The fallback heuristic's answer for `job` (what [`Placer::place`] asks first).
    pub fn fallback_place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        self.fallback.place(job, state, ctx)
    }
}

impl Placer for LearnedPlacer {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let placement = self.place_ranked(job, state, ctx)?;
        if let Some(head) = &self.decline
            && let Some(gpu) = decline::opened_idle_gpu(job, state, &placement)
        {
            let inputs = decline::decline_features(job, state, gpu, self.mix, ctx.arrived_milli);
            match head.decide(&inputs) {
                DeclineVerdict::Decline { probability } => {
                    self.stats.declines.fetch_add(1, Ordering::Relaxed);
                    return Err(Status::Deferred(format!(
                        "learned policy declines this share for now: it would open an idle \
                         GPU, kept whole for a whole-GPU task (decline probability \
                         {probability:.2})"
                    )));
                }
                DeclineVerdict::OutOfRange => {
                    self.stats
                        .decline_out_of_range
                        .fetch_add(1, Ordering::Relaxed);
                }
                DeclineVerdict::Place { .. } => {}
            }
        }
        Ok(placement)
    }
}

impl LearnedPlacer {
    /// The placement the ranking (or its fallback) chose, before the decline head.
    fn place_ranked(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(sum_of_squares) = self.share_ties_placer(job, state, ctx) {
            let placement = sum_of_squares.place(job, state, ctx);
            // Counted as a decision only when there was one to make, as on the other paths.
            if matches!(placement, Ok(_) | Err(Status::Deferred(_))) {
                self.trace(job, DecisionPath::ShareTies, &[], None, None, None);
                self.stats.count(DecisionPath::ShareTies);
            }
            return placement;
        }
        let fallback = self.fallback.place(job, state, ctx);
        if matches!(fallback, Err(Status::Unresolvable(_) | Status::Error(_))) {
            return fallback;
        }
        let scorer = match (&self.model, self.act) {
            (Ok(s), _) => Some(s.clone()),
            (Err(_), Act::Imitate) => None,
            (Err(_), _) => {
                // Featurised only when traced: a service without a model still logs
                // decisions the trainer can clone from.
                let decision = if self.tracing() {
                    self.decision(job, state, ctx, &fallback)
                } else {
                    None
                };
                let (choices, features) =
                    decision.map_or((Vec::new(), None), |(c, f)| (c, Some(f)));
                self.trace(
                    job,
                    DecisionPath::NoModel,
                    &choices,
                    None,
                    None,
                    features.as_ref(),
                );
                return self.fall_back(DecisionPath::NoModel, fallback);
            }
        };
        let Some((choices, features)) = self.decision(job, state, ctx, &fallback) else {
            // Nothing feasible: no decision to make.
            return fallback;
        };
        let scored = match scorer.map(|s| s.score(&features)) {
            Some(Ok(s)) => Some(s),
            Some(Err(_)) => {
                self.trace(
                    job,
                    DecisionPath::ScoringError,
                    &choices,
                    None,
                    None,
                    Some(&features),
                );
                return self.fall_back(DecisionPath::ScoringError, fallback);
            }
            None => None,
        };
        let chosen = match (self.act, &scored) {
            (Act::Imitate, _) | (_, None) => fallback_index(&choices).unwrap_or(0),
            (Act::Greedy, Some(scored)) => {
                if scored.distance > self.gate.distance_limit {
                    let path = DecisionPath::OutOfDistribution;
                    self.trace(job, path, &choices, Some(scored), None, Some(&features));
                    return self.fall_back(path, fallback);
                }
                if scored.margin < self.gate.margin_threshold {
                    let path = DecisionPath::LowMargin;
                    self.trace(job, path, &choices, Some(scored), None, Some(&features));
                    return self.fall_back(path, fallback);
                }
                scored.best
            }
            (Act::Sample, Some(scored)) => {
                let u: f32 = ctx.rng.random();
                let mut acc = 0.0;
                let mut pick = scored.probs.len() - 1;
                for (i, p) in scored.probs.iter().enumerate() {
                    acc += p;
                    if u < acc {
                        pick = i;
                        break;
                    }
                }
                pick
            }
        };
        self.stats.count(DecisionPath::Learned);
        self.trace(
            job,
            DecisionPath::Learned,
            &choices,
            scored.as_ref(),
            Some(chosen),
            Some(&features),
        );
        if let Some(rec) = &self.recorder {
            rec.lock().unwrap_or_else(|e| e.into_inner()).push(Record {
                features,
                chosen,
                allocated_milli: state.allocated_milli(),
                call,
            });
        }
        match &choices[chosen] {
            Choice::Place { placement, .. } => Ok(placement.clone()),
            Choice::Wait => {
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
                Err(Status::Deferred(
                    "learned policy waits: holding capacity for this gang".into(),
                ))
            }
        }
    }
}

/// A loaded learned model and its gates.
#[derive(Debug, Clone)]
pub struct LearnedModel {
    pub scorer: Result<Arc<PolicyScorer>, String>,
    /// The gate chosen in training, for the artifact's own fallbacks.
    pub gate: Gate,
    /// Fallback heuristic per objective (`replay`, `inflation`) from the artifact.
    pub fallback: std::collections::BTreeMap<String, String>,
    /// Margin threshold per fallback heuristic that one was chosen for: the trained one
    /// for the artifact's fallbacks, overridden by `marshal train gate`'s entries.
    pub thresholds: std::collections::BTreeMap<String, f32>,
    /// The candidate set the network was trained to rank.
    pub candidates: CandidateSet,
    /// The decline head, when the artifact has one (used for the inflation objective).
    pub decline: Option<Arc<DeclineHead>>,
}

/// A margin threshold no margin reaches (margins lie in [0, 1]): the gate always falls
/// back. The trainer stores it when no threshold is safe on validation.
pub const CLOSED_MARGIN: f32 = 1.5;

impl LearnedModel {
    /// Loads `dir`; a missing, corrupt or mismatched artifact becomes a model-less value
    /// whose error says why (the policy then runs on its fallback).
    pub fn load(dir: &Path) -> LearnedModel {
        LearnedModel::try_load(dir).unwrap_or_else(|e| {
            LearnedModel::missing(format!("policy model {}: {e}", dir.display()))
        })
    }

    /// Loads `dir`, or says why it cannot be used (without naming `dir`).
    pub fn try_load(dir: &Path) -> Result<LearnedModel, String> {
        let a = load_policy(dir).map_err(|e| e.to_string())?;
        // A heuristic this build cannot run would only fail later, when the policy is
        // built: refuse it now, so that the policy runs on its default fallback.
        let named = (a.meta.fallback.iter())
            .map(|(objective, name)| (format!("the {objective} fallback"), name))
            .chain(a.meta.gates.keys().map(|name| ("a gate".to_string(), name)));
        for (role, name) in named {
            if name == LEARNED {
                return Err(format!("meta.json: {role} is the learned policy itself"));
            }
            build(name, &[]).map_err(|e| format!("meta.json: {role}: {e}"))?;
        }
        let mut thresholds: std::collections::BTreeMap<String, f32> = a
            .meta
            .fallback
            .values()
            .map(|f| (f.clone(), a.meta.margin_threshold))
            .collect();
        thresholds.extend(
            a.meta
                .gates
                .iter()
                .map(|(f, g)| (f.clone(), g.margin_threshold)),
        );
        Ok(LearnedModel {
            scorer: Ok(Arc::new(a.scorer)),
            gate: Gate {
                margin_threshold: a.meta.margin_threshold,
                distance_limit: a.meta.distance_limit,
            },
            fallback: a.meta.fallback,
            thresholds,
            candidates: a.meta.candidates,
            decline: a.meta.decline.map(Arc::new),
        })
    }

    /// The decline head to use for `objective` behind `fallback`'s gate of
    /// `margin_threshold`, or why the model's head is not used: only for the inflation
    /// objective (what it was trained on; elsewhere a declined share would wait
    /// unboundedly), only with the fallback and gate it was searched with, and only if
    /// it was trained on this build's inputs.
    pub fn decline_for(
        &self,
        fallback: &str,
        margin_threshold: f32,
        objective: &str,
    ) -> (Option<Arc<DeclineHead>>, Option<String>) {
        let Some(head) = self.decline.as_ref().filter(|_| objective == "inflation") else {
            return (None, None);
        };
        let why = if let Some(layout) = head.layout_error() {
            format!("{layout}; no share is declined (search it again with `marshal train decline`)")
        } else if head.fallback != fallback {
            format!(
                "the decline head was searched with fallback {}, not {fallback}; no share is \
                 declined",
                head.fallback
            )
        } else if head.network_margin_threshold != margin_threshold {
            format!(
                "the decline head was searched behind a gate margin of {}, the gate is now \
                 {margin_threshold}; no share is declined (search it again with `marshal \
                 train decline`)",
                head.network_margin_threshold
            )
        } else {
            return (Some(head.clone()), None);
        };
        (None, Some(why))
    }

    pub fn missing(why: String) -> LearnedModel {
        LearnedModel {
            scorer: Err(why),
            gate: Gate {
                margin_threshold: f32::INFINITY,
                distance_limit: 0.0,
            },
            fallback: Default::default(),
            thresholds: Default::default(),
            candidates: CandidateSet::Ranked,
            decline: None,
        }
    }

    /// The fallback for an objective: the artifact's choice, else the best heuristic
    /// measured in this repository (FGD for allocation, topo-pack for JCT).
    pub fn fallback_for(&self, objective: &str) -> String {
        self.fallback.get(objective).cloned().unwrap_or_else(|| {
            if objective == "inflation" {
                "fgd"
            } else {
                "topo-pack"
            }
            .to_string()
        })
    }

    /// The gate to use with `fallback`, and a warning when the artifact has no threshold
    /// for it. Then the gate is closed ([`CLOSED_MARGIN`]: every decision falls back):
    /// a threshold chosen for another heuristic says nothing about this one (the shipped
    /// model's, used with Tiresias on ITP cluster03, was 9 % worse than Tiresias), and a
    /// closed gate schedules exactly as the fallback does, so it can never be worse.
    pub fn gate_for(&self, fallback: &str) -> (Gate, Option<String>) {
        if self.scorer.is_err() {
            // No model: every decision falls back anyway, and the load error says why.
            return (self.gate, None);
        }
        match self.thresholds.get(fallback) {
            Some(&margin_threshold) => (
                Gate {
                    margin_threshold,
                    distance_limit: self.gate.distance_limit,
                },
                None,
            ),
            None => (
                Gate {
                    margin_threshold: CLOSED_MARGIN,
                    distance_limit: self.gate.distance_limit,
                },
                Some(format!(
                    "the model has no gate threshold for fallback {fallback} (it has {}); \
                     every decision falls back to {fallback} (choose one with `marshal train \
                     gate --fallback {fallback}`)",
                    if self.thresholds.is_empty() {
                        "none".to_string()
                    } else {
                        self.thresholds
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                )),
            ),
        }
    }
}

/// A learned policy: the `fallback` policy's queue order and preemption, with the placer
/// `make` builds around the fallback's placer.
pub fn learned_policy(
    fallback: &str,
    workload: &[Job],
    make: impl FnOnce(Box<dyn Placer>) -> LearnedPlacer,
) -> Result<(Policy, Arc<GateStats>), UnknownPolicy> {
    let base = build(fallback, workload)?;
    let placer = make(base.placer);
    let stats = placer.stats();
    Ok((
        Policy {
            name: LEARNED.into(),
            order: base.order,
            placer: Box::new(placer),
            preemptor: base.preemptor,
            blocking: base.blocking,
            reservation: base.reservation,
            rebalance: base.rebalance,
            consolidate: base.consolidate,
            quota: base.quota,
        },
        stats,
    ))
}

/// Builds `learned` for serving and evaluation: greedy, gated with `model`'s gate for
/// `fallback` ([`LearnedModel::gate_for`]), on `model` (which may be missing, then the
/// fallback decides everything). Returns the policy and its counters.
pub fn build_learned(
    model: &LearnedModel,
    fallback: &str,
    workload: &[Job],
) -> Result<(Policy, Arc<GateStats>), UnknownPolicy> {
    let (gate, _) = model.gate_for(fallback);
    learned_policy(fallback, workload, |placer| {
        LearnedPlacer::new(placer, workload, model.scorer.clone(), gate)
            .with_candidates(model.candidates)
    })
}

#[cfg(test)]
mod tests;
