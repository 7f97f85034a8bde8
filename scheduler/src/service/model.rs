//! The slot a learned placement model plugs into, for the admin service and for
//! labelling decisions. Heuristic policies have no model; [`NoModel`] says so instead
//! of pretending otherwise.

use std::path::Path;

/// What decided a placement: the label for metrics and the path shown by Explain.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionPath {
    /// "heuristic", "learned" or "fallback".
    pub kind: &'static str,
    /// e.g. "heuristic:topo-pack".
    pub label: String,
    pub confidence: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStatus {
    pub loaded: bool,
    pub name: String,
    pub version: String,
    pub path: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Nothing can load models in this server (no learned policy configured).
    #[error("{0}")]
    Unsupported(String),
    /// The artifact was refused; the current model (if any) stays.
    #[error("artifact {path}: {reason}; the current model is kept")]
    Rejected { path: String, reason: String },
}

pub trait ModelSlot: Send + Sync + std::fmt::Debug {
    fn status(&self, policy: &str) -> ModelStatus;
    fn reload(&self, path: Option<&Path>, policy: &str) -> Result<ModelStatus, ModelError>;
    fn decision_path(&self, policy: &str) -> DecisionPath;
}

/// No learned model: the configured heuristic policy decides every placement.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoModel;

impl ModelSlot for NoModel {
    fn status(&self, policy: &str) -> ModelStatus {
        ModelStatus {
            loaded: false,
            detail: format!(
                "no learned model is loaded: policy {policy} (a heuristic) decides every placement"
            ),
            ..ModelStatus::default()
        }
    }

    fn reload(&self, path: Option<&Path>, policy: &str) -> Result<ModelStatus, ModelError> {
        let what = path.map_or("the configured artifact".to_string(), |p| {
            p.display().to_string()
        });
        Err(ModelError::Unsupported(format!(
            "cannot load {what}: policy {policy} uses no learned model and this server has no model loader"
        )))
    }

    fn decision_path(&self, policy: &str) -> DecisionPath {
        DecisionPath {
            kind: "heuristic",
            label: format!("heuristic:{policy}"),
            confidence: None,
        }
    }
}
