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
//! schema). Every decision is counted by path and reason ([`GateStats`]), so a run reports
//! its fallback rate. Queue order and preemption are the fallback policy's.

pub mod candidates;
pub mod features;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use marshal_model::policy::{DecisionFeatures, MAX_CANDIDATES, PolicyScorer, load_policy};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, GpuDemand, Job, Placement};
use crate::framework::{Context, Placer, Policy, Status};
use crate::policies::{Fgd, UnknownPolicy, build};

pub use features::{Choice, NodeScores, featurise};

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
}

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
}

impl GateCounts {
    pub fn decisions(&self) -> u64 {
        self.learned + self.fallbacks()
    }

    pub fn fallbacks(&self) -> u64 {
        self.no_model + self.low_margin + self.out_of_distribution + self.scoring_error
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
    calls: AtomicU64,
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
            calls: AtomicU64::new(0),
        }
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
}

impl Placer for LearnedPlacer {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let fallback = self.fallback.place(job, state, ctx);
        if matches!(fallback, Err(Status::Unresolvable(_) | Status::Error(_))) {
            return fallback;
        }
        let scorer = match (&self.model, self.act) {
            (Ok(s), _) => Some(s.clone()),
            (Err(_), Act::Imitate) => None,
            (Err(_), _) => return self.fall_back(DecisionPath::NoModel, fallback),
        };
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
            MAX_CANDIDATES - usize::from(may_wait),
        );
        if choices.is_empty() {
            // Nothing feasible: no decision to make.
            return fallback;
        }
        if may_wait {
            choices.push(Choice::Wait);
        }
        let features = featurise(job, state, &choices, &scores);
        let scored = match scorer.map(|s| s.score(&features)) {
            Some(Ok(s)) => Some(s),
            Some(Err(_)) => return self.fall_back(DecisionPath::ScoringError, fallback),
            None => None,
        };
        let chosen = match (self.act, scored) {
            (Act::Imitate, _) | (_, None) => choices
                .iter()
                .position(|c| matches!(c, Choice::Place { fallback: true, .. }))
                .unwrap_or(0),
            (Act::Greedy, Some(scored)) => {
                if scored.distance > self.gate.distance_limit {
                    return self.fall_back(DecisionPath::OutOfDistribution, fallback);
                }
                if scored.margin < self.gate.margin_threshold {
                    return self.fall_back(DecisionPath::LowMargin, fallback);
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
        if let Some(rec) = &self.recorder {
            rec.lock().unwrap_or_else(|e| e.into_inner()).push(Record {
                features,
                chosen,
                allocated_milli: state.allocated_milli(),
                call,
            });
        }
        self.stats.count(DecisionPath::Learned);
        match &choices[chosen] {
            Choice::Place { placement, .. } => Ok(placement.clone()),
            Choice::Wait => {
                self.stats.waits.fetch_add(1, Ordering::Relaxed);
                Err(Status::Unschedulable(
                    "learned policy waits: holding capacity for this gang".into(),
                ))
            }
        }
    }
}

/// A loaded learned model and the gate it was shipped with.
#[derive(Debug, Clone)]
pub struct LearnedModel {
    pub scorer: Result<Arc<PolicyScorer>, String>,
    pub gate: Gate,
    /// Fallback heuristic per objective (`replay`, `inflation`) from the artifact.
    pub fallback: std::collections::BTreeMap<String, String>,
}

impl LearnedModel {
    /// Loads `dir`; a missing, corrupt or mismatched artifact becomes a model-less value
    /// whose error says why (the policy then runs on its fallback).
    pub fn load(dir: &Path) -> LearnedModel {
        match load_policy(dir) {
            Ok(a) => LearnedModel {
                scorer: Ok(Arc::new(a.scorer)),
                gate: Gate {
                    margin_threshold: a.meta.margin_threshold,
                    distance_limit: a.meta.distance_limit,
                },
                fallback: a.meta.fallback,
            },
            Err(e) => LearnedModel::missing(format!("policy model {}: {e}", dir.display())),
        }
    }

    pub fn missing(why: String) -> LearnedModel {
        LearnedModel {
            scorer: Err(why),
            gate: Gate {
                margin_threshold: f32::INFINITY,
                distance_limit: 0.0,
            },
            fallback: Default::default(),
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
        },
        stats,
    ))
}

/// Builds `learned` for serving and evaluation: greedy, gated, on `model` (which may be
/// missing, then the fallback decides everything). Returns the policy and its counters.
pub fn build_learned(
    model: &LearnedModel,
    fallback: &str,
    workload: &[Job],
) -> Result<(Policy, Arc<GateStats>), UnknownPolicy> {
    learned_policy(fallback, workload, |placer| {
        LearnedPlacer::new(placer, workload, model.scorer.clone(), model.gate)
    })
}

#[cfg(test)]
mod tests;
