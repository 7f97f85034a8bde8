//! The slot a learned placement model plugs into, for the admin service and for
//! labelling decisions. Heuristic policies have no model; [`NoModel`] says so instead
//! of pretending otherwise. [`LearnedSlot`] holds the `learned` policy's model and
//! reloads it (Admin `ReloadModel`, or when the artifact directory's content changes);
//! the cycle driver picks a new model up between cycles ([`ModelSlot::policy_update`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::policies::learned::{LearnedModel, LearnedSetup};
use crate::service::metrics::Metrics;

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
    /// The heuristic that decides when the model does not (learned policy).
    pub fallback: String,
    pub reloads: u64,
    pub rejected_reloads: u64,
    /// Why the last rejected reload (or the first load) failed.
    pub last_error: String,
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

/// A learned model for the cycle driver to build its policy on.
#[derive(Clone, Debug)]
pub struct ModelUpdate {
    /// Changes with every successful (re)load.
    pub generation: u64,
    pub setup: LearnedSetup,
    /// Content hash of the artifact (absent when no model is usable).
    pub version: Option<String>,
}

impl ModelUpdate {
    /// The gate's margin threshold, when a model is usable.
    pub fn gate_threshold(&self) -> Option<f64> {
        self.setup
            .model
            .scorer
            .is_ok()
            .then_some(f64::from(self.setup.gate.margin_threshold))
    }
}

pub trait ModelSlot: Send + Sync + std::fmt::Debug {
    fn status(&self, policy: &str) -> ModelStatus;
    fn reload(&self, path: Option<&Path>, policy: &str) -> Result<ModelStatus, ModelError>;
    fn decision_path(&self, policy: &str) -> DecisionPath;
    /// The learned policy's current setup, when its generation differs from `have`
    /// (the cycle driver rebuilds its policy from it between cycles). `None`: no change,
    /// or no learned model at all.
    fn policy_update(&self, _have: u64) -> Option<ModelUpdate> {
        None
    }
    /// Reloads the artifact if its directory changed (automatic reload).
    fn poll(&self) {}
    /// Where reload outcomes are counted.
    fn attach_metrics(&self, _metrics: Arc<Metrics>) {}
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

/// The artifact's content hash (see [`marshal_model::policy::artifact_fingerprint`]:
/// `marshal model promote` records the same value).
pub use marshal_model::policy::artifact_fingerprint;

#[derive(Debug)]
struct Current {
    setup: LearnedSetup,
    /// Bumped on every successful load, so the driver rebuilds its policy.
    generation: u64,
    /// The artifact directory serving decisions (or tried first, when none is loaded).
    dir: PathBuf,
    version: String,
    /// The directory automatic reloading watches.
    watched: PathBuf,
    /// Its fingerprint when last loaded or tried.
    seen: Option<u64>,
    reloads: u64,
    rejected: u64,
    last_error: Option<String>,
}

/// The `learned` policy's model: loaded at start (a missing or bad artifact leaves the
/// fallback deciding everything, and [`ModelSlot::status`] says why), reloaded on
/// request or when the watched directory's content changes. A rejected artifact keeps
/// the current model.
#[derive(Debug)]
pub struct LearnedSlot {
    /// The configured fallback (absent: the artifact's choice).
    fallback: Option<String>,
    current: Mutex<Current>,
    metrics: OnceLock<Arc<Metrics>>,
}

/// The objective whose fallback the service uses: the online scheduler is judged on
/// JCT, as trace replay is.
const OBJECTIVE: &str = "replay";

impl LearnedSlot {
    /// Loads `dir`; never fails.
    pub fn open(dir: &Path, fallback: Option<&str>) -> LearnedSlot {
        let seen = artifact_fingerprint(dir);
        let (model, last_error) = match LearnedModel::try_load(dir) {
            Ok(m) => (m, None),
            Err(why) => {
                tracing::warn!(model = %dir.display(), %why, "learned policy: no usable model; the fallback decides every placement");
                (LearnedModel::missing(why.clone()), Some(why))
            }
        };
        let setup = LearnedSetup::with_model(model, fallback, OBJECTIVE);
        if let Some(w) = &setup.gate_warning {
            tracing::warn!(model = %dir.display(), "learned policy: {w}");
        }
        LearnedSlot {
            fallback: fallback.map(String::from),
            current: Mutex::new(Current {
                version: if last_error.is_none() {
                    version(seen)
                } else {
                    String::new()
                },
                setup,
                generation: 1,
                dir: dir.to_path_buf(),
                watched: dir.to_path_buf(),
                seen,
                reloads: 0,
                rejected: 0,
                last_error,
            }),
            metrics: OnceLock::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, outcome: &'static str) {
        if let Some(m) = self.metrics.get() {
            m.model_reloads
                .get_or_create(&vec![("outcome", outcome)])
                .inc();
        }
    }

    /// Loads `dir` and installs it, or keeps the current model and says why.
    fn load(&self, dir: &Path, watch: bool) -> Result<ModelStatus, ModelError> {
        let fingerprint = artifact_fingerprint(dir);
        let loaded = LearnedModel::try_load(dir);
        let mut c = self.lock();
        if watch || c.watched == dir {
            c.seen = fingerprint;
        }
        match loaded {
            Ok(model) => {
                c.setup = LearnedSetup {
                    trace: None,
                    ..LearnedSetup::with_model(model, self.fallback.as_deref(), OBJECTIVE)
                };
                if let Some(w) = &c.setup.gate_warning {
                    tracing::warn!(model = %dir.display(), "learned policy: {w}");
                }
                c.generation += 1;
                c.dir = dir.to_path_buf();
                c.watched = dir.to_path_buf();
                c.seen = fingerprint;
                c.version = version(fingerprint);
                c.reloads += 1;
                c.last_error = None;
                tracing::info!(model = %dir.display(), version = %c.version, "learned policy: model loaded");
                drop(c);
                self.count("loaded");
                Ok(self.status(crate::policies::learned::LEARNED))
            }
            Err(reason) => {
                c.rejected += 1;
                c.last_error = Some(format!("{}: {reason}", dir.display()));
                tracing::warn!(model = %dir.display(), %reason, "learned policy: artifact rejected; the current model is kept");
                drop(c);
                self.count("rejected");
                Err(ModelError::Rejected {
                    path: dir.display().to_string(),
                    reason,
                })
            }
        }
    }
}

fn version(fingerprint: Option<u64>) -> String {
    fingerprint.map_or_else(String::new, |f| format!("{f:016x}"))
}

impl ModelSlot for LearnedSlot {
    fn status(&self, policy: &str) -> ModelStatus {
        let c = self.lock();
        let loaded = c.setup.model.scorer.is_ok();
        let gate = c.setup.gate;
        let detail = if loaded {
            let mut d = format!(
                "policy {policy}: model {} ({}) ranks placements; the fallback {} decides when the margin is below {:.3} or the input distance above {:.2}",
                c.dir.display(),
                c.version,
                c.setup.fallback,
                gate.margin_threshold,
                gate.distance_limit
            );
            if let Some(w) = &c.setup.gate_warning {
                d.push_str(&format!("; {w}"));
            }
            if let Some(e) = &c.last_error {
                d.push_str(&format!("; last reload rejected ({e}), this model is kept"));
            }
            d
        } else {
            let why = c
                .setup
                .model
                .scorer
                .as_ref()
                .err()
                .cloned()
                .unwrap_or_default();
            format!(
                "policy {policy}: no usable model ({why}); the fallback {} decides every placement",
                c.setup.fallback
            )
        };
        ModelStatus {
            loaded,
            name: c
                .dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            version: if loaded {
                c.version.clone()
            } else {
                String::new()
            },
            path: c.dir.display().to_string(),
            detail,
            fallback: c.setup.fallback.clone(),
            reloads: c.reloads,
            rejected_reloads: c.rejected,
            last_error: c.last_error.clone().unwrap_or_default(),
        }
    }

    fn reload(&self, path: Option<&Path>, _policy: &str) -> Result<ModelStatus, ModelError> {
        let dir = match path {
            Some(p) => p.to_path_buf(),
            None => self.lock().watched.clone(),
        };
        self.load(&dir, false)
    }

    fn decision_path(&self, _policy: &str) -> DecisionPath {
        // Used for decisions the learned placer did not rank (nothing feasible to rank,
        // or the fallback found the job can never fit): the fallback's verdict stands.
        DecisionPath {
            kind: "fallback",
            label: "fallback:no-candidates".into(),
            confidence: None,
        }
    }

    fn policy_update(&self, have: u64) -> Option<ModelUpdate> {
        let c = self.lock();
        (c.generation != have).then(|| ModelUpdate {
            generation: c.generation,
            setup: c.setup.clone(),
            version: (c.setup.model.scorer.is_ok() && !c.version.is_empty())
                .then(|| c.version.clone()),
        })
    }

    fn poll(&self) {
        let (watched, seen) = {
            let c = self.lock();
            (c.watched.clone(), c.seen)
        };
        let now = artifact_fingerprint(&watched);
        if now != seen {
            // A half-copied artifact fails its checksum and is rejected; the copy's
            // completion changes the fingerprint again and the next poll loads it.
            let _ = self.load(&watched, true);
        }
    }

    fn attach_metrics(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }
}

/// The model slot for `config`: [`LearnedSlot`] on `model_dir` for the learned policy,
/// else [`NoModel`].
pub fn model_slot(config: &crate::service::ServiceConfig, model_dir: &Path) -> Arc<dyn ModelSlot> {
    if config.policy == crate::policies::learned::LEARNED {
        Arc::new(LearnedSlot::open(model_dir, config.fallback.as_deref()))
    } else {
        Arc::new(NoModel)
    }
}
