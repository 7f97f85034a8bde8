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
    /// β of the β-NLL step-time loss (Seitzer et al., ICLR 2022): each example's Gaussian
    /// NLL is weighted by its own predicted variance to the power β, held constant in the
    /// gradient. 0 is the plain NLL, which lets the network explain a hard example by a
    /// wide variance instead of fitting its mean; 1 gives the mean the gradient of a plain
    /// squared error.
    #[config(default = 0.5)]
    pub nll_beta: f64,
    /// Seeds weight initialisation, shuffling and the backend RNG.
    #[config(default = 0)]
    pub seed: u64,
}

impl PredictorConfig {
    /// Reads an artifact's `config.json`. A config written before `nll_beta` existed
    /// was trained with the plain NLL, so the field reads as 0 there rather than as
    /// today's default.
    pub fn from_artifact_json(bytes: &[u8]) -> std::result::Result<Self, serde_json::Error> {
        let mut value: serde_json::Value = serde_json::from_slice(bytes)?;
        refuse_unknown_keys(&value, &PredictorConfig::new())?;
        if let Some(fields) = value.as_object_mut() {
            fields
                .entry("nll_beta")
                .or_insert(serde_json::Value::from(0.0));
        }
        serde_json::from_value(value)
    }

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
        if !(self.nll_beta.is_finite() && (0.0..=1.0).contains(&self.nll_beta)) {
            return Err(ModelError::invalid("config.nll_beta", "must lie in [0, 1]"));
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

/// Refuses a key of an artifact's `config.json` that this build's configuration
/// (`defaults`, serialised) lacks. burn's `Config` derive writes its own serde code,
/// which ignores unknown fields and takes no `#[serde(deny_unknown_fields)]`, so the
/// check is made here: a setting this build does not know (another layer, another
/// activation) would build a network that reads the weights differently.
pub(crate) fn refuse_unknown_keys(
    value: &serde_json::Value,
    defaults: &impl serde::Serialize,
) -> std::result::Result<(), serde_json::Error> {
    let (Some(fields), serde_json::Value::Object(known)) =
        (value.as_object(), serde_json::to_value(defaults)?)
    else {
        // Not an object: deserialising it says so.
        return Ok(());
    };
    match fields.keys().find(|k| !known.contains_key(*k)) {
        None => Ok(()),
        Some(key) => {
            let expected: Vec<String> = known.keys().map(|k| format!("`{k}`")).collect();
            Err(<serde_json::Error as serde::de::Error>::custom(format!(
                "unknown field `{key}` (written by a newer build?), expected one of {}",
                expected.join(", ")
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field_that_cannot_train() {
        assert!(PredictorConfig::new().validate().is_ok());
        for (config, field) in [
            (PredictorConfig::new().with_hidden_size(0), "hidden_size"),
            (
                PredictorConfig::new().with_learning_rate(f64::NAN),
                "learning_rate",
            ),
            (PredictorConfig::new().with_nll_beta(1.5), "nll_beta"),
            (PredictorConfig::new().with_nll_beta(-0.1), "nll_beta"),
            (PredictorConfig::new().with_nll_beta(f64::NAN), "nll_beta"),
        ] {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn an_artifact_config_without_beta_was_trained_with_the_plain_nll() {
        let old = r#"{"hidden_size":32,"edge_hidden_size":16,"rounds":2,"learning_rate":0.003,
            "weight_decay":0.0001,"batch_size":32,"max_epochs":200,"patience":20,"seed":0}"#;
        let config = PredictorConfig::from_artifact_json(old.as_bytes()).unwrap();
        assert_eq!(config.nll_beta, 0.0);
        assert_eq!(config.max_epochs, 200);
        let new = serde_json::to_vec(&PredictorConfig::new().with_nll_beta(0.25)).unwrap();
        assert_eq!(
            PredictorConfig::from_artifact_json(&new).unwrap(),
            PredictorConfig::new().with_nll_beta(0.25)
        );
        assert!(PredictorConfig::from_artifact_json(b"{\"hidden_size\":").is_err());
    }

    #[test]
    fn an_artifact_config_with_a_setting_this_build_does_not_know_is_refused() {
        let mut value = serde_json::to_value(PredictorConfig::new()).unwrap();
        value["attention_heads"] = serde_json::Value::from(4);
        let err = PredictorConfig::from_artifact_json(value.to_string().as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `attention_heads`"), "{err}");
    }
}
