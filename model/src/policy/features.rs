//! The policy's input layout: named slots the scheduler's featuriser fills.

use crate::error::{ModelError, Result};

/// Per-decision features: the job and the cluster context it is placed into.
pub const JOB_FEATURE_NAMES: [&str; 10] = [
    "log2_gpus",
    "log2_workers",
    "shared_gpu",
    "gpu_fraction_per_worker",
    "cpu_share_of_largest_node",
    "comm_intensity",
    "tightest_level",
    "cluster_idle_gpu_frac",
    "cluster_alloc_frac",
    "candidates_frac",
];
/// Number of job/context features.
pub const JOB_FEATURES: usize = JOB_FEATURE_NAMES.len();

/// Per-candidate features: what placing the job there would do.
pub const CANDIDATE_FEATURE_NAMES: [&str; 15] = [
    "wait",
    "span_level",
    "span_is_tightest",
    "log2_nodes",
    "fgd_score",
    "bestfit_score",
    "fgd_rank",
    "bestfit_rank",
    "node_idle_frac_after",
    "partly_used_gpu_frac",
    "gpu_throughput",
    "predicted_speed",
    "rack_idle_frac_after",
    "cpu_free_frac_after",
    "fallback_choice",
];
/// Number of candidate features.
pub const CANDIDATE_FEATURES: usize = CANDIDATE_FEATURE_NAMES.len();
/// Width of the network's input: job features joined with one candidate's.
pub const INPUT_FEATURES: usize = JOB_FEATURES + CANDIDATE_FEATURES;
/// Most candidates one decision may carry (the wait action included).
pub const MAX_CANDIDATES: usize = 16;

/// One decision: the job (with context) and its feasible candidates, in the order the
/// scheduler generated them.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionFeatures {
    pub job: [f32; JOB_FEATURES],
    pub candidates: Vec<[f32; CANDIDATE_FEATURES]>,
}

impl DecisionFeatures {
    /// Rejects decisions a network cannot score: no or too many candidates, a NaN or
    /// infinite feature (named by slot).
    pub fn validate(&self) -> Result<()> {
        if self.candidates.is_empty() || self.candidates.len() > MAX_CANDIDATES {
            return Err(ModelError::invalid(
                "decision.candidates",
                format!(
                    "{} candidates; between 1 and {MAX_CANDIDATES} are scored",
                    self.candidates.len()
                ),
            ));
        }
        if let Some(i) = self.job.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::invalid(
                format!("decision.job[{i}] ({})", JOB_FEATURE_NAMES[i]),
                "not finite",
            ));
        }
        for (c, cand) in self.candidates.iter().enumerate() {
            if let Some(i) = cand.iter().position(|v| !v.is_finite()) {
                return Err(ModelError::invalid(
                    format!(
                        "decision.candidates[{c}][{i}] ({})",
                        CANDIDATE_FEATURE_NAMES[i]
                    ),
                    "not finite",
                ));
            }
        }
        Ok(())
    }

    /// The network input of candidate `c`: job features, then the candidate's.
    pub fn input(&self, c: usize) -> [f32; INPUT_FEATURES] {
        let mut x = [0.0; INPUT_FEATURES];
        x[..JOB_FEATURES].copy_from_slice(&self.job);
        x[JOB_FEATURES..].copy_from_slice(&self.candidates[c]);
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_slot() {
        let mut d = DecisionFeatures {
            job: [0.0; JOB_FEATURES],
            candidates: vec![[0.0; CANDIDATE_FEATURES]],
        };
        assert!(d.validate().is_ok());
        d.candidates[0][4] = f32::NAN;
        let err = d.validate().unwrap_err().to_string();
        assert!(err.contains("fgd_score"), "{err}");
        d.candidates.clear();
        assert!(d.validate().is_err());
        let x = DecisionFeatures {
            job: [1.0; JOB_FEATURES],
            candidates: vec![[2.0; CANDIDATE_FEATURES]],
        }
        .input(0);
        assert_eq!(x[0], 1.0);
        assert_eq!(x[INPUT_FEATURES - 1], 2.0);
    }
}
