//! Hyper-parameters of the predictor and of its training.

use burn::config::Config;

use crate::error::{ModelError, Result};

/// Network shape and training settings. Serialised as `config.json` in an artifact.
#[derive(Config, Debug, PartialEq)]
pub struct PredictorConfig {
    /// Width of node, job and trunk embeddings.
    #[config(default = 32)]
    pub hidden_size: usize,
    /// Width of the edge (link) embedding.
    #[config(default = 16)]
    pub edge_hidden_size: usize,
    /// Message-passing rounds (the receptive field in hops).
    #[config(default = 2)]
    pub rounds: usize,
    /// AdamW learning rate.
    #[config(default = 3e-3)]
    pub learning_rate: f64,
    /// AdamW decoupled weight decay.
    #[config(default = 1e-4)]
    pub weight_decay: f64,
    /// Graphs per optimiser step.
    #[config(default = 32)]
    pub batch_size: usize,
    /// Upper bound on training epochs.
    #[config(default = 200)]
    pub max_epochs: usize,
    /// Stop after this many epochs without a better validation loss.
    #[config(default = 20)]
    pub patience: usize,
    /// Seeds weight initialisation, shuffling and the backend RNG.
    #[config(default = 0)]
    pub seed: u64,
}

impl PredictorConfig {
    /// Rejects configurations that cannot train (zero sizes, non-positive learning rate...).
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("edge_hidden_size", self.edge_hidden_size),
            ("batch_size", self.batch_size),
            ("max_epochs", self.max_epochs),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(ModelError::invalid(format!("config.{name}"), "must be > 0"));
            }
        }
        if self.hidden_size > 1024 || self.edge_hidden_size > 1024 {
            return Err(ModelError::invalid("config.hidden_size", "must be <= 1024"));
        }
        if self.rounds > 8 {
            return Err(ModelError::invalid("config.rounds", "must be <= 8"));
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(ModelError::invalid(
                "config.learning_rate",
                "must be finite and > 0",
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(ModelError::invalid(
                "config.weight_decay",
                "must be finite and >= 0",
            ));
        }
        Ok(())
    }
}
