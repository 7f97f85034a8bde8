//! Hyper-parameters of the policy network and its training.

use burn::config::Config;

use crate::error::{ModelError, Result};

/// Network shape and optimiser settings. Serialised as `config.json` in a policy artifact.
#[derive(Config, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Width of the two hidden layers of the candidate scorer and of the value head.
    #[config(default = 32)]
    pub hidden_size: usize,
    /// AdamW learning rate for behaviour cloning.
    #[config(default = 3e-3)]
    pub bc_learning_rate: f64,
    /// AdamW learning rate for the policy-gradient phase (smaller: it refines the clone).
    #[config(default = 3e-4)]
    pub pg_learning_rate: f64,
    /// Weight of the entropy bonus in the policy-gradient loss.
    #[config(default = 1e-3)]
    pub entropy_coef: f64,
    /// Decisions per optimiser step.
    #[config(default = 256)]
    pub batch_size: usize,
    /// Seeds weight initialisation and shuffling.
    #[config(default = 0)]
    pub seed: u64,
}

impl PolicyConfig {
    /// Reads a policy artifact's `config.json`, refusing a field this build does not
    /// know (burn's own loader ignores it; see `crate::config::refuse_unknown_keys`).
    pub fn from_artifact_json(bytes: &[u8]) -> std::result::Result<Self, serde_json::Error> {
        let value: serde_json::Value = serde_json::from_slice(bytes)?;
        crate::config::refuse_unknown_keys(&value, &PolicyConfig::new())?;
        serde_json::from_value(value)
    }

    /// Rejects configurations that cannot train.
    pub fn validate(&self) -> Result<()> {
        if self.hidden_size == 0 || self.hidden_size > 512 {
            return Err(ModelError::invalid(
                "config.hidden_size",
                "must be in 1..=512",
            ));
        }
        if self.batch_size == 0 {
            return Err(ModelError::invalid("config.batch_size", "must be > 0"));
        }
        for (name, v) in [
            ("bc_learning_rate", self.bc_learning_rate),
            ("pg_learning_rate", self.pg_learning_rate),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelError::invalid(
                    format!("config.{name}"),
                    "must be finite and > 0",
                ));
            }
        }
        if !(self.entropy_coef.is_finite() && self.entropy_coef >= 0.0) {
            return Err(ModelError::invalid(
                "config.entropy_coef",
                "must be finite and >= 0",
            ));
        }
        Ok(())
    }
}
