//! The confidence gate's margin threshold, chosen on validation episodes: by training
//! for the artifact's own fallbacks ([`super::train_policy`]) and afterwards for any other
//! fallback heuristic ([`regate`], `marshal train gate`). Both go through
//! [`select_gate`], so a threshold means the same thing whoever chose it.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use marshal_model::policy::{
    CandidateSet, FallbackGate, PolicyMeta, PolicyScorer, load_policy, write_fallback_gate,
};
use marshal_scheduler::policies::learned::{Act, CLOSED_MARGIN, Gate};

use super::{Driver, EpisodeSpec, Outcome, ProgressEvent, ValidationRow, gain, mean, run_episode};

/// A validation episode (one seed of a spec) with the fallback's outcome on it.
#[derive(Debug)]
pub struct ValidationRef {
    pub spec: EpisodeSpec,
    /// Index into `spec.jobs_by_seed`.
    pub seed_index: usize,
    pub fallback: Outcome,
}

impl ValidationRef {
    /// `TRACE seed N`.
    pub fn episode(&self) -> String {
        format!(
            "{} seed {}",
            self.spec.name, self.spec.jobs_by_seed[self.seed_index].0
        )
    }
}

/// The fallback's run on every seed of every validation spec (each spec's own fallback).
pub fn fallback_references(valid: &[EpisodeSpec]) -> Result<Vec<ValidationRef>, String> {
    let mut refs = Vec::new();
    for spec in valid {
        for seed_index in 0..spec.jobs_by_seed.len() {
            refs.push(ValidationRef {
                fallback: run_episode(spec, seed_index, &Driver::Fallback)?,
                spec: spec.clone(),
                seed_index,
            });
        }
    }
    Ok(refs)
}

/// Per validation episode: (fallback score, learned score, fallback rate).
pub(super) type ValidationRun = Vec<(f64, f64, f64)>;

/// Greedy runs of `scorer` behind `gate` on every validation episode.
pub(super) fn validate(
    valid: &[ValidationRef],
    scorer: &Arc<PolicyScorer>,
    gate: Gate,
    candidates: CandidateSet,
) -> Result<ValidationRun, String> {
    valid
        .iter()
        .map(|r| {
            let o = run_episode(
                &r.spec,
                r.seed_index,
                &Driver::Learned {
                    scorer: Some(scorer.clone()),
                    act: Act::Greedy,
                    gate,
                    candidates,
                    decline: None,
                },
            )?;
            Ok((r.fallback.score, o.score, o.counts.fallback_rate()))
        })
        .collect()
}

/// The chosen gate and how it did.
#[derive(Clone, Debug, PartialEq)]
pub struct GateChoice {
    pub gate: Gate,
    /// Every validation episode with the chosen gate (and without one).
    pub validation: Vec<ValidationRow>,
    /// False when no tried threshold was within the tolerance: the gate is then closed
    /// ([`CLOSED_MARGIN`]) and the policy is its fallback.
    pub within_tolerance: bool,
}

/// Among `margins`, the threshold with the best mean gain over the fallback of those
/// whose gated policy is nowhere worse than the fallback by more than `tolerance`
/// (relative, per validation episode); none such: a closed gate (always fall back).
pub fn select_gate(
    valid: &[ValidationRef],
    scorer: &Arc<PolicyScorer>,
    candidates: CandidateSet,
    distance_limit: f32,
    margins: &[f32],
    tolerance: f64,
    progress: &mut dyn FnMut(ProgressEvent),
) -> Result<GateChoice, String> {
    if valid.is_empty() {
        return Err("choosing a gate needs at least one validation episode".into());
    }
    let ungated = validate(
        valid,
        scorer,
        Gate {
            margin_threshold: 0.0,
            distance_limit,
        },
        candidates,
    )?;
    let mut chosen: Option<(f64, Gate, ValidationRun)> = None;
    for (k, &m) in margins.iter().enumerate() {
        let gate = Gate {
            margin_threshold: m,
            distance_limit,
        };
        let rows = validate(valid, scorer, gate, candidates)?;
        let worst = rows
            .iter()
            .map(|(fb, ours, _)| gain(*fb, *ours))
            .fold(f64::INFINITY, f64::min);
        let g = mean(rows.iter().map(|(fb, ours, _)| gain(*fb, *ours)));
        progress(ProgressEvent {
            phase: "gate",
            done: k + 1,
            total: margins.len(),
            message: format!(
                "margin {m}: mean {:+.2} %, worst {:+.2} %",
                100.0 * g,
                100.0 * worst
            ),
        });
        if worst >= -tolerance && chosen.as_ref().is_none_or(|(b, _, _)| g > *b) {
            chosen = Some((g, gate, rows));
        }
    }
    let within_tolerance = chosen.is_some();
    let (gate, rows) = match chosen {
        Some((_, gate, rows)) => (gate, rows),
        None => {
            let gate = Gate {
                margin_threshold: CLOSED_MARGIN,
                distance_limit,
            };
            let rows = validate(valid, scorer, gate, candidates)?;
            (gate, rows)
        }
    };
    let validation = valid
        .iter()
        .zip(rows.iter().zip(&ungated))
        .map(|(r, ((fb, gated, rate), (_, ug, _)))| ValidationRow {
            episode: r.episode(),
            fallback: *fb,
            gated: *gated,
            ungated: *ug,
            fallback_rate: *rate,
        })
        .collect();
    Ok(GateChoice {
        gate,
        validation,
        within_tolerance,
    })
}

/// Validation rows as score entries: `<episode>/fallback`, `/gated`, `/ungated`,
/// `/fallback_rate` (spaces become `_`), the layout of `meta.json`'s `eval_scores`.
pub fn validation_scores(rows: &[ValidationRow]) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for row in rows {
        let key = row.episode.replace(' ', "_");
        m.insert(format!("{key}/fallback"), row.fallback);
        m.insert(format!("{key}/gated"), row.gated);
        m.insert(format!("{key}/ungated"), row.ungated);
        m.insert(format!("{key}/fallback_rate"), row.fallback_rate);
    }
    m
}

/// Re-runs the threshold selection for the artifact in `dir` with `fallback` deciding
/// in its place (every spec of `valid` is run with `fallback`, on all its seeds), and
/// records the threshold in the artifact (`meta.json`'s `gates`, replaced atomically).
/// The network, its distance limit and the trained threshold are unchanged.
pub fn regate(
    dir: &Path,
    fallback: &str,
    valid: &[EpisodeSpec],
    margins: &[f32],
    tolerance: f64,
    progress: &mut dyn FnMut(ProgressEvent),
) -> Result<(GateChoice, PolicyMeta), String> {
    if !(tolerance.is_finite() && tolerance >= 0.0) {
        return Err(format!(
            "the tolerance must be finite and ≥ 0 (got {tolerance})"
        ));
    }
    if margins.is_empty() || margins.iter().any(|m| !m.is_finite()) {
        return Err("at least one finite margin threshold must be tried".into());
    }
    let artifact = load_policy(dir).map_err(|e| format!("policy model {}: {e}", dir.display()))?;
    let valid: Vec<EpisodeSpec> = valid
        .iter()
        .map(|s| EpisodeSpec {
            fallback: fallback.to_string(),
            ..s.clone()
        })
        .collect();
    let refs = fallback_references(&valid)?;
    let scorer = Arc::new(artifact.scorer);
    let choice = select_gate(
        &refs,
        &scorer,
        artifact.meta.candidates,
        artifact.meta.distance_limit,
        margins,
        tolerance,
        progress,
    )?;
    let entry = FallbackGate {
        margin_threshold: choice.gate.margin_threshold,
        tolerance,
        episodes: choice
            .validation
            .iter()
            .map(|r| r.episode.clone())
            .collect(),
        scores: validation_scores(&choice.validation),
    };
    let meta = write_fallback_gate(dir, fallback, entry)
        .map_err(|e| format!("recording the gate in {}: {e}", dir.display()))?;
    Ok((choice, meta))
}
