//! Building a policy by name, `learned` included: the one code path that `marshal sim`,
//! `eval`, `demo` and `marshal serve` share.

use std::path::Path;
use std::sync::Arc;

use marshal_model::policy::DeclineHead;

use crate::domain::Job;
use crate::framework::Policy;
use crate::policies::{self, UnknownPolicy};

use super::{Gate, GateStats, LEARNED, LearnedModel, LearnedPlacer, TraceSink, learned_policy};

/// The learned policy's model and fallback, resolved once per experiment or server.
#[derive(Debug, Clone)]
pub struct LearnedSetup {
    pub model: LearnedModel,
    /// The heuristic that decides when the gate does not trust the model.
    pub fallback: String,
    /// The gate for that fallback ([`LearnedModel::gate_for`]).
    pub gate: Gate,
    /// Why the gate is closed although a model loaded: the artifact has no threshold
    /// for this fallback (callers print it).
    pub gate_warning: Option<String>,
    /// Where the placer reports each decision's path and scores (the service sets it;
    /// simulations leave it `None`).
    pub trace: Option<TraceSink>,
    /// The model's decline head, for the inflation objective only (what it was trained
    /// on; elsewhere a declined share would wait unboundedly), and only with the
    /// fallback and network gate it was searched with.
    pub decline: Option<Arc<DeclineHead>>,
    /// Why the model's decline head is not used although the objective is inflation
    /// (callers print it).
    pub decline_warning: Option<String>,
}

impl LearnedSetup {
    /// Loads the model in `dir` (never fails: a missing or bad model is kept as the
    /// reason in `model.scorer`, and the policy then runs on its fallback) and picks the
    /// fallback: `fallback` when given, else the artifact's for `objective` (`replay`
    /// or `inflation`).
    pub fn load(dir: &Path, fallback: Option<&str>, objective: &str) -> LearnedSetup {
        LearnedSetup::with_model(LearnedModel::load(dir), fallback, objective)
    }

    /// As [`LearnedSetup::load`] with a model already loaded.
    pub fn with_model(model: LearnedModel, fallback: Option<&str>, objective: &str) -> Self {
        let fallback = fallback.map_or_else(|| model.fallback_for(objective), String::from);
        let (gate, gate_warning) = model.gate_for(&fallback);
        let (decline, decline_warning) =
            model.decline_for(&fallback, gate.margin_threshold, objective);
        LearnedSetup {
            decline,
            decline_warning,
            model,
            fallback,
            gate,
            gate_warning,
            trace: None,
        }
    }
}

/// Why a policy could not be built.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("{0}, {LEARNED}")]
    Unknown(UnknownPolicy),
    #[error("the learned policy's fallback {fallback}: {source}")]
    Fallback {
        fallback: String,
        source: UnknownPolicy,
    },
    #[error("the learned policy needs a model setup")]
    NoSetup,
}

/// Checks a policy name (`learned` or a heuristic).
pub fn check_name(name: &str) -> Result<(), PolicyError> {
    if name != LEARNED {
        policies::build(name, &[]).map_err(PolicyError::Unknown)?;
    }
    Ok(())
}

/// Builds a policy by name; `learned` (greedy, gated, on `learned.model`, which may be
/// missing: then the fallback decides everything) comes with its decision counters.
pub fn build_policy(
    name: &str,
    jobs: &[Job],
    learned: Option<&LearnedSetup>,
) -> Result<(Policy, Option<Arc<GateStats>>), PolicyError> {
    if name != LEARNED {
        return Ok((
            policies::build(name, jobs).map_err(PolicyError::Unknown)?,
            None,
        ));
    }
    let setup = learned.ok_or(PolicyError::NoSetup)?;
    let (policy, stats) = learned_policy(&setup.fallback, jobs, |placer| {
        let placer = LearnedPlacer::new(placer, jobs, setup.model.scorer.clone(), setup.gate)
            .with_candidates(setup.model.candidates)
            .with_decline(setup.decline.clone(), jobs);
        match &setup.trace {
            Some(sink) => placer.with_trace(sink.clone()),
            None => placer,
        }
    })
    .map_err(|source| PolicyError::Fallback {
        fallback: setup.fallback.clone(),
        source,
    })?;
    Ok((policy, Some(stats)))
}
