//! The decline head: whether to leave a GPU share unplaced rather than open an idle GPU
//! for it, keeping that GPU whole for a whole-GPU task still to come.
//!
//! # Design decisions
//!
//! - **A separate, tiny head, not a candidate of the network.** Whether declining pays is
//!   decided by what arrives hundreds of arrivals later, far past the rollout horizon the
//!   network's labels come from and too weak a signal for a per-decision policy gradient
//!   (README, "Declining shares"). A logistic score over a handful of named inputs can be
//!   searched on whole-episode returns (cross-entropy method, `marshal train decline`),
//!   which is the signal that reaches that far.
//! - **Inputs describe the moment and the workload.** The allocated share of the cluster
//!   and of the share's GPU model, the idle share of that model's GPUs, the share's
//!   size, the target workload's mix (GPU demand of whole-GPU tasks that accept any
//!   model, and of those that ask for specific models) — the same target-workload
//!   knowledge FGD uses — and the *whole-GPU pressure*: the whole-GPU demand that mix
//!   forecasts for the arrivals still to come, over the idle GPUs; and the workload's
//!   CPU per GPU over the cluster's. Without the forecast no head generalised across
//!   openb workloads (README, "The decline head"): declining pays only while the idle
//!   GPUs will not hold the whole-GPU tasks to come, which the allocated share alone
//!   cannot tell (on `gpuspec` workloads tasks that ask for scarce models fail and leave
//!   idle GPUs behind); and it costs where CPU runs out with the GPUs (`cpu250`), since
//!   the GPU kept whole then sits on a node without cores for a whole-GPU task.
//! - **Its own gate.** It declines only when the decline probability's margin clears a
//!   threshold and every input lies within the range seen in training (plus
//!   [`RANGE_SLACK`]); otherwise the share is placed, as the policy without a head would.
//! - **Stored in `meta.json`** (`decline`, optional): no schema bump; an artifact without
//!   it never declines. A build before the decline head ignores it; the builds of the
//!   seven-input head (before the pressures) refuse a nine-input head and with it the
//!   artifact. This build keeps a head of other inputs in the file without using it (a
//!   warning says so) and `marshal train decline` replaces it.
//! - **Share ties ([`ShareTies`], optional, searched with the head).** With FGD as the
//!   fallback, the head may carry a switch that, per share, hands the placement to FGD
//!   with its ties broken by the sum-of-squares rule of bin packing (`fgd-sumsq`) instead
//!   of the network. That rule saves many GPUs on some workloads and loses up to a
//!   quarter on others (README, "The sum-of-squares tie-break once more"), so it is
//!   switched by the workload's mix, and searched jointly with the head
//!   whose declines it changes. It is on while the workload's mix (four inputs, the
//!   share of multi-GPU demand among them) lies in a box: the tightest box around the
//!   training workloads it was searched to be on for, widened by [`RANGE_SLACK`]. A
//!   half-space, tried first, cannot pick out a workload whose mix lies *between*
//!   others (`default` lies between `gpushare80` and `multigpu40` on the whole-GPU
//!   share and on the CPU pressure), and without the multi-GPU share `default` and
//!   `multigpu20` are hardly apart. A build before the switch ignores the field and runs
//!   the head without it, which is not what the head was searched with.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::artifact::{META_FILE, load_policy};
use crate::artifact::replace_file;
use crate::error::{ModelError, Result};

/// The head's inputs, in order. `bias` is always 1.
pub const DECLINE_FEATURE_NAMES: [&str; DECLINE_FEATURES] = [
    "bias",
    "cluster_allocated",
    "gpu_model_allocated",
    "gpu_model_idle",
    "share",
    "workload_whole_any_model",
    "workload_whole_given_models",
    "whole_gpu_pressure",
    "workload_cpu_pressure",
];
pub const DECLINE_FEATURES: usize = 9;

/// The share-ties switch's inputs, in order: the workload's mix (what tells `default`,
/// where the sum-of-squares ties pay, from `multigpu`, `gpushare` and `gpuspec`
/// workloads, where they lose).
pub const SHARE_TIES_FEATURE_NAMES: [&str; SHARE_TIES_FEATURES] = [
    "workload_whole_any_model",
    "workload_whole_given_models",
    "workload_multi_gpu",
    "workload_cpu_pressure",
];
pub const SHARE_TIES_FEATURES: usize = 4;

/// The heuristic whose ties the switch may break differently, and the one it then
/// follows (FGD with sum-of-squares ties).
pub const SHARE_TIES_BASE: &str = "fgd";
pub const SHARE_TIES_ALTERNATIVE: &str = "fgd-sumsq";

/// How far outside the trained range (in the inputs' own units: fractions in [0, 1],
/// the pressures ratios around 1) an input may lie before the head abstains.
pub const RANGE_SLACK: f32 = 0.05;

/// A trained decline head (`meta.json`'s `decline`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeclineHead {
    /// [`DECLINE_FEATURE_NAMES`] when trained; checked on load.
    pub feature_names: Vec<String>,
    /// Logit = weights · inputs.
    pub weights: Vec<f32>,
    /// Per input, the least and greatest value met in training.
    pub input_range: Vec<[f32; 2]>,
    /// Declines only when |2p − 1| is at least this.
    pub margin_threshold: f32,
    /// The fallback heuristic the head was searched with (it declines shares that
    /// heuristic, or the network behind that heuristic's gate, would place).
    pub fallback: String,
    /// The network's gate margin threshold during the search: a head is used only
    /// with the fallback and gate it was searched with.
    pub network_margin_threshold: f32,
    /// Settings and summary of the search (iterations, population, seconds, …).
    pub training: BTreeMap<String, f64>,
    /// Validation episodes and their scores (`<episode>/without`, `/with`, `/declined`).
    pub scores: BTreeMap<String, f64>,
    /// The share-ties switch searched with the head, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_ties: Option<ShareTies>,
}

/// A switch: whether FGD with its ties broken by the sum-of-squares rule (`fgd-sumsq`)
/// places the shares rather than the network. On while the workload's mix lies in a box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareTies {
    /// [`SHARE_TIES_FEATURE_NAMES`] when trained; checked on load.
    pub feature_names: Vec<String>,
    /// Per input, the box it must lie in: `[lower, upper]`.
    pub bounds: Vec<[f32; 2]>,
}

impl ShareTies {
    pub fn new(bounds: Vec<[f32; 2]>) -> ShareTies {
        ShareTies {
            feature_names: SHARE_TIES_FEATURE_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            bounds,
        }
    }

    /// Whether the workload's `inputs` lie in the box (never for an input that could not
    /// be computed, nor for a switch of another layout).
    pub fn on(&self, inputs: &[f32; SHARE_TIES_FEATURES]) -> bool {
        self.bounds.len() == SHARE_TIES_FEATURES
            && inputs
                .iter()
                .zip(&self.bounds)
                .all(|(x, [lo, hi])| *x >= *lo && *x <= *hi)
    }

    /// Why this build cannot use the switch, if it was made for other inputs.
    fn layout_error(&self) -> Option<String> {
        if self.feature_names != SHARE_TIES_FEATURE_NAMES {
            return Some(format!(
                "share-ties inputs {:?} differ from this build's {:?}",
                self.feature_names, SHARE_TIES_FEATURE_NAMES
            ));
        }
        if self.bounds.len() != SHARE_TIES_FEATURES {
            return Some(format!(
                "share ties have {} bounds; {SHARE_TIES_FEATURES} expected",
                self.bounds.len()
            ));
        }
        None
    }

    /// That every bound is usable (damage: the artifact is refused, like a damaged head).
    fn validate(&self) -> std::result::Result<(), String> {
        if let Some([lo, hi]) = self
            .bounds
            .iter()
            .find(|[lo, hi]| !(lo.is_finite() && hi.is_finite() && lo <= hi))
        {
            return Err(format!("share-ties bounds [{lo}, {hi}] are not a range"));
        }
        Ok(())
    }
}

/// What the head says about one share.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum DeclineVerdict {
    /// Leave it unplaced; `probability` of declining.
    Decline { probability: f32 },
    /// Place it.
    Place { probability: f32 },
    /// An input is outside the trained range: place it.
    OutOfRange,
}

impl DeclineHead {
    /// A head with `weights` and `input_range`, searched with `fallback` behind a network
    /// gate of `network_margin_threshold`, for the trainer to fill in.
    pub fn new(
        weights: Vec<f32>,
        input_range: Vec<[f32; 2]>,
        fallback: &str,
        network_margin_threshold: f32,
    ) -> DeclineHead {
        DeclineHead {
            feature_names: DECLINE_FEATURE_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            weights,
            input_range,
            margin_threshold: 0.0,
            fallback: fallback.to_string(),
            network_margin_threshold,
            training: BTreeMap::new(),
            scores: BTreeMap::new(),
            share_ties: None,
        }
    }

    /// Why this build cannot use the head, if it was trained on other inputs (another
    /// build's, e.g. the seven inputs before the pressures): such a head is kept in
    /// `meta.json` but never used, and the next `marshal train decline` replaces it.
    pub fn layout_error(&self) -> Option<String> {
        if self.feature_names != DECLINE_FEATURE_NAMES {
            return Some(format!(
                "decline head inputs {:?} differ from this build's {:?}",
                self.feature_names, DECLINE_FEATURE_NAMES
            ));
        }
        if self.weights.len() != DECLINE_FEATURES || self.input_range.len() != DECLINE_FEATURES {
            return Some(format!(
                "decline head has {} weights and {} input ranges; {DECLINE_FEATURES} each \
                 expected",
                self.weights.len(),
                self.input_range.len()
            ));
        }
        self.share_ties.as_ref().and_then(ShareTies::layout_error)
    }

    /// Checks the layout and that every number is usable.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(e) = self.layout_error() {
            return Err(e);
        }
        if let Some(w) = self.weights.iter().find(|w| !w.is_finite()) {
            return Err(format!("decline head weight {w} is not a finite number"));
        }
        if let Some([lo, hi]) = self
            .input_range
            .iter()
            .find(|[lo, hi]| !(lo.is_finite() && hi.is_finite() && lo <= hi))
        {
            return Err(format!(
                "decline head input range [{lo}, {hi}] is not a range"
            ));
        }
        if !self.network_margin_threshold.is_finite() {
            return Err(format!(
                "decline head network margin threshold {} is not a finite number",
                self.network_margin_threshold
            ));
        }
        if !(self.margin_threshold.is_finite() && self.margin_threshold >= 0.0) {
            return Err(format!(
                "decline head margin threshold {} must be a finite number, at least 0",
                self.margin_threshold
            ));
        }
        if let Some(ties) = &self.share_ties {
            if self.fallback != SHARE_TIES_BASE {
                return Err(format!(
                    "share ties switch between {SHARE_TIES_BASE} and {SHARE_TIES_ALTERNATIVE}, \
                     but the head was searched with fallback {}",
                    self.fallback
                ));
            }
            ties.validate()?;
        }
        Ok(())
    }

    /// The probability of declining, before any gate.
    pub fn probability(&self, inputs: &[f32; DECLINE_FEATURES]) -> f32 {
        let logit: f32 = self.weights.iter().zip(inputs).map(|(w, x)| w * x).sum();
        1.0 / (1.0 + (-logit).exp())
    }

    /// The gated verdict for one share (a head of another layout never declines).
    pub fn decide(&self, inputs: &[f32; DECLINE_FEATURES]) -> DeclineVerdict {
        if self.weights.len() != DECLINE_FEATURES || self.input_range.len() != DECLINE_FEATURES {
            return DeclineVerdict::OutOfRange;
        }
        let inside = inputs
            .iter()
            .zip(&self.input_range)
            .all(|(x, [lo, hi])| *x >= lo - RANGE_SLACK && *x <= hi + RANGE_SLACK);
        if !inside {
            return DeclineVerdict::OutOfRange;
        }
        let probability = self.probability(inputs);
        if probability > 0.5 && (2.0 * probability - 1.0) >= self.margin_threshold {
            DeclineVerdict::Decline { probability }
        } else {
            DeclineVerdict::Place { probability }
        }
    }
}

/// Records `head` as the decline head of the artifact in `dir` (replacing any), or
/// removes it (`None`). The artifact is checked first and `meta.json` is replaced
/// atomically, as [`super::write_fallback_gate`] does.
pub fn write_decline_head(dir: &Path, head: Option<DeclineHead>) -> Result<()> {
    if let Some(h) = &head {
        h.validate().map_err(|reason| ModelError::InvalidInput {
            field: "decline".into(),
            reason,
        })?;
    }
    let mut meta = load_policy(dir)?.meta;
    meta.decline = head;
    let text = serde_json::to_string_pretty(&meta)
        .map_err(|e| ModelError::Backend(format!("serialising meta.json: {e}")))?;
    replace_file(&dir.join(META_FILE), text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> DeclineHead {
        // Declines once the cluster is more than 86 % allocated.
        let mut w = vec![0.0; DECLINE_FEATURES];
        w[0] = -86.0;
        w[1] = 100.0;
        DeclineHead::new(w, vec![[0.0, 1.0]; DECLINE_FEATURES], "fgd", 0.0)
    }

    fn inputs(allocated: f32) -> [f32; DECLINE_FEATURES] {
        [1.0, allocated, allocated, 0.1, 0.5, 0.7, 0.0, 1.0, 0.8]
    }

    #[test]
    fn declines_past_its_threshold_and_places_before() {
        let h = head();
        assert!(matches!(
            h.decide(&inputs(0.9)),
            DeclineVerdict::Decline { probability } if probability > 0.9
        ));
        assert!(matches!(
            h.decide(&inputs(0.8)),
            DeclineVerdict::Place { .. }
        ));
    }

    #[test]
    fn a_low_margin_or_an_input_outside_the_trained_range_places() {
        let mut h = head();
        h.margin_threshold = 0.99;
        // p ≈ 0.98 at 0.864: margin 0.96 < 0.99.
        assert!(matches!(
            h.decide(&inputs(0.864)),
            DeclineVerdict::Place { .. }
        ));
        let mut h = head();
        h.input_range[5] = [0.2, 0.3];
        assert_eq!(h.decide(&inputs(0.95)), DeclineVerdict::OutOfRange);
        // An input that could not be computed (NaN) abstains too.
        let mut unknown = inputs(0.95);
        unknown[7] = f32::NAN;
        assert_eq!(head().decide(&unknown), DeclineVerdict::OutOfRange);
        h.input_range[5] = [0.2, 0.66];
        assert!(matches!(
            h.decide(&inputs(0.95)),
            DeclineVerdict::Decline { .. }
        ));
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let mut h = head();
        h.weights[2] = f32::NAN;
        assert!(h.validate().unwrap_err().contains("weight NaN"));
        let mut h = head();
        h.feature_names[1] = "load".into();
        assert!(h.validate().unwrap_err().contains("differ"));
        let mut h = head();
        h.input_range.pop();
        assert!(h.validate().unwrap_err().contains("8 input ranges"));
        let mut h = head();
        h.input_range[0] = [1.0, 0.0];
        assert!(h.validate().unwrap_err().contains("not a range"));
        let mut h = head();
        h.margin_threshold = -0.1;
        assert!(h.validate().unwrap_err().contains("margin threshold"));
        assert!(head().validate().is_ok());
    }

    fn ties() -> ShareTies {
        ShareTies::new(vec![[0.6, 0.8], [0.0, 0.05], [0.0, 0.1], [0.6, 0.9]])
    }

    #[test]
    fn the_share_ties_switch_is_on_inside_its_box_only() {
        assert!(ties().on(&[0.715, 0.0, 0.073, 0.815]));
        // multigpu20: too many multi-GPU tasks; gpuspec10: too many given models.
        assert!(!ties().on(&[0.756, 0.0, 0.204, 0.78]));
        assert!(!ties().on(&[0.632, 0.084, 0.073, 0.815]));
        assert!(!ties().on(&[0.715, 0.0, f32::NAN, 0.815]));
    }

    #[test]
    fn a_share_ties_switch_needs_fgd_and_its_own_layout() {
        let mut h = head();
        h.share_ties = Some(ties());
        assert!(h.validate().is_ok());
        let text = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<DeclineHead>(&text).unwrap(), h);
        // A head without the switch writes no field, as before the switch.
        assert!(
            !serde_json::to_string(&head())
                .unwrap()
                .contains("share_ties")
        );
        let mut other = h.clone();
        other.fallback = "best-fit".into();
        assert!(other.validate().unwrap_err().contains("fallback best-fit"));
        let mut short = h.clone();
        short.share_ties.as_mut().unwrap().bounds.pop();
        assert!(short.validate().unwrap_err().contains("3 bounds"));
        let mut empty = h;
        empty.share_ties.as_mut().unwrap().bounds[2] = [0.2, 0.1];
        assert!(empty.validate().unwrap_err().contains("not a range"));
    }
}
