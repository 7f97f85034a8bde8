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
    /// `require_promotion` is on and no promotion record proves the artifact was
    /// promoted; the current model (if any) stays.
    #[error("artifact {path}: {reason}; the current model is kept")]
    Unpromoted { path: String, reason: String },
    /// `ReloadModel` named a directory outside `model_reload_roots`; nothing was read.
    #[error("artifact {path}: {reason}")]
    Forbidden { path: String, reason: String },
    /// The directory kept changing while it was loaded (a copy in progress): try
    /// again; the current model is kept.
    #[error("artifact {path}: {reason}; the current model is kept")]
    Unsettled { path: String, reason: String },
}

impl ModelError {
    fn reason(&self) -> &str {
        match self {
            ModelError::Unsupported(m) => m,
            ModelError::Rejected { reason, .. }
            | ModelError::Unpromoted { reason, .. }
            | ModelError::Forbidden { reason, .. }
            | ModelError::Unsettled { reason, .. } => reason,
        }
    }
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
use marshal_model::policy::{
    PromotionKeys, fingerprint_hex, promotion_record_path, verify_promotion,
};

/// What an artifact needs besides being valid to be loaded (`require_promotion`,
/// `promotion_public_keys`).
#[derive(Clone, Debug, Default)]
pub struct PromotionPolicy {
    /// Only artifacts whose promotion record proves them promoted.
    pub required: bool,
    /// Non-empty: the record must also be signed by one of these keys over the
    /// artifact's SHA-256 digest.
    pub keys: PromotionKeys,
    /// The configured keys could not be read when the slot was made (they were checked
    /// at start, so a file vanished or changed since): every artifact is refused with
    /// this reason rather than loaded unsigned.
    pub key_error: Option<String>,
}

impl PromotionPolicy {
    /// Any valid artifact loads.
    pub fn off() -> Self {
        PromotionPolicy::default()
    }

    /// A promotion record must prove the artifact (unsigned records suffice).
    pub fn unsigned() -> Self {
        PromotionPolicy {
            required: true,
            ..PromotionPolicy::default()
        }
    }

    /// A promotion record signed by one of `keys` must prove the artifact.
    pub fn signed(keys: PromotionKeys) -> Self {
        PromotionPolicy {
            required: true,
            keys,
            key_error: None,
        }
    }

    /// From `require_promotion` and `promotion_public_keys` (reading the key files).
    pub fn from_config(config: &crate::service::ServiceConfig) -> Self {
        match PromotionKeys::read(&config.promotion_public_keys) {
            Ok(keys) => PromotionPolicy {
                required: config.require_promotion,
                keys,
                key_error: None,
            },
            Err(e) => PromotionPolicy {
                required: true,
                keys: PromotionKeys::default(),
                key_error: Some(format!("promotion_public_keys: {e}")),
            },
        }
    }

    /// `Ok` iff the artifact in `dir` with fingerprint `f` may be loaded as far as
    /// promotion goes. The SHA-256 digest (signed mode) is computed here, so only when a
    /// load is tried — the poll does that only when the fingerprint or the record changed.
    fn check(&self, dir: &Path, f: u64) -> Result<(), String> {
        if let Some(e) = &self.key_error {
            return Err(e.clone());
        }
        if !self.required {
            return Ok(());
        }
        verify_promotion(dir, f, &self.keys)
    }
}

/// Loads the artifact in `dir`, whose fingerprint is `fingerprint`, if `promotion`
/// allows it ([`verify_promotion`]).
fn load_artifact(
    dir: &Path,
    fingerprint: Option<u64>,
    promotion: &PromotionPolicy,
) -> Result<LearnedModel, ModelError> {
    let path = dir.display().to_string();
    // An unreadable directory (no fingerprint) is refused by the loader, which says why.
    if let Some(f) = fingerprint {
        promotion
            .check(dir, f)
            .map_err(|reason| ModelError::Unpromoted {
                path: path.clone(),
                reason,
            })?;
    }
    LearnedModel::try_load(dir).map_err(|reason| ModelError::Rejected { path, reason })
}

/// Tries to load a directory whose content did not change while it was loaded.
const LOAD_TRIES: usize = 3;

/// `load(fingerprint)` of `dir`, with the fingerprint and promotion record it was
/// loaded under: the fingerprint is taken again after the load, and a directory swapped
/// in between (a copy or `promote` finishing) is loaded again, so a model is never
/// served under the previous content's version. Still changing after [`LOAD_TRIES`]:
/// refused with no fingerprint, which the next poll retries.
fn load_unchanged(
    dir: &Path,
    mut load: impl FnMut(Option<u64>) -> Result<LearnedModel, ModelError>,
) -> (
    Option<u64>,
    Option<Vec<u8>>,
    Result<LearnedModel, ModelError>,
) {
    for _ in 0..LOAD_TRIES {
        let before = artifact_fingerprint(dir);
        let record = record_bytes(dir);
        let loaded = load(before);
        if artifact_fingerprint(dir) == before && record_bytes(dir) == record {
            return (before, record, loaded);
        }
    }
    let refused = ModelError::Unsettled {
        path: dir.display().to_string(),
        reason: format!("its content changed while it was loaded, {LOAD_TRIES} times in a row"),
    };
    (None, None, Err(refused))
}

/// The promotion record's content (`None`: absent or unreadable); a change makes the
/// poll retry a refused artifact.
fn record_bytes(dir: &Path) -> Option<Vec<u8>> {
    std::fs::read(promotion_record_path(dir)?).ok()
}

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
    /// Its promotion record's content then (`require_promotion` only).
    seen_record: Option<Vec<u8>>,
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
    /// What a promotion record must prove before an artifact loads.
    promotion: PromotionPolicy,
    /// Where `ReloadModel` may name an artifact ([`LearnedSlot::with_reload_roots`]).
    reload_roots: Vec<PathBuf>,
    current: Mutex<Current>,
    metrics: OnceLock<Arc<Metrics>>,
}

/// The objective whose fallback the service uses: the online scheduler is judged on
/// JCT, as trace replay is.
const OBJECTIVE: &str = "replay";

impl LearnedSlot {
    /// Loads `dir`; never fails. When `promotion` requires it, an artifact without a
    /// (signed) promotion record proving it was promoted is refused like a corrupt one:
    /// the fallback decides until a promoted one is installed.
    pub fn open(dir: &Path, fallback: Option<&str>, promotion: PromotionPolicy) -> LearnedSlot {
        let (seen, seen_record, loaded) =
            load_unchanged(dir, |f| load_artifact(dir, f, &promotion));
        let (model, last_error) = match loaded {
            Ok(m) => (m, None),
            Err(e) => {
                let why = e.reason().to_string();
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
            promotion,
            reload_roots: vec![parent_dir(dir)],
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
                seen_record,
                reloads: 0,
                rejected: 0,
                last_error,
            }),
            metrics: OnceLock::new(),
        }
    }

    /// `ReloadModel` may name artifacts under `roots` only (after symbolic links are
    /// resolved); empty keeps the default, the directory holding the configured artifact.
    /// A client token must not make the server read any directory it can name.
    pub fn with_reload_roots(mut self, roots: &[PathBuf]) -> Self {
        if !roots.is_empty() {
            self.reload_roots = roots.to_vec();
        }
        self
    }

    /// `path` resolved (links followed), iff it lies under a reload root; checked before
    /// anything in it is read. The resolved path is what is loaded and then watched, so
    /// a link under a root changed later cannot lead the poll elsewhere.
    fn check_reload_root(&self, path: &Path) -> Result<PathBuf, ModelError> {
        if let Some(real) = resolved(path)
            && self
                .reload_roots
                .iter()
                .filter_map(|r| std::fs::canonicalize(r).ok())
                .any(|root| real.starts_with(root))
        {
            return Ok(real);
        }
        let roots: Vec<String> = self
            .reload_roots
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        tracing::warn!(path = %path.display(), "ReloadModel: refused a path outside model_reload_roots");
        Err(ModelError::Forbidden {
            path: path.display().to_string(),
            reason: format!(
                "outside the directories ReloadModel may load from ({}; model_reload_roots in the server's configuration); nothing was read",
                roots.join(", ")
            ),
        })
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
        let (fingerprint, record, loaded) =
            load_unchanged(dir, |f| load_artifact(dir, f, &self.promotion));
        let mut c = self.lock();
        if watch || c.watched == dir {
            c.seen = fingerprint;
            c.seen_record = record.clone();
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
                c.seen_record = record;
                c.version = version(fingerprint);
                c.reloads += 1;
                c.last_error = None;
                tracing::info!(model = %dir.display(), version = %c.version, "learned policy: model loaded");
                drop(c);
                self.count("loaded");
                Ok(self.status(crate::policies::learned::LEARNED))
            }
            Err(e) => {
                let reason = e.reason();
                c.rejected += 1;
                c.last_error = Some(format!("{}: {reason}", dir.display()));
                tracing::warn!(model = %dir.display(), %reason, "learned policy: artifact rejected; the current model is kept");
                drop(c);
                self.count("rejected");
                Err(e)
            }
        }
    }
}

/// The directory holding `dir` (`.` for a bare name).
fn parent_dir(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `path` made absolute with symbolic links resolved as far as it exists; `None` when
/// the part that does not exist climbs (`..`), which could lead anywhere.
fn resolved(path: &Path) -> Option<PathBuf> {
    let absolute = std::path::absolute(path).ok()?;
    for existing in absolute.ancestors() {
        let Ok(mut real) = std::fs::canonicalize(existing) else {
            continue;
        };
        for part in absolute.strip_prefix(existing).ok()?.components() {
            match part {
                std::path::Component::Normal(name) => real.push(name),
                std::path::Component::CurDir => {}
                _ => return None,
            }
        }
        return Some(real);
    }
    None
}

fn version(fingerprint: Option<u64>) -> String {
    fingerprint.map_or_else(String::new, fingerprint_hex)
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
            Some(p) => self.check_reload_root(p)?,
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
        let (watched, seen, serving) = {
            let c = self.lock();
            let serving =
                (c.setup.model.scorer.is_ok() && c.dir == c.watched).then(|| c.version.clone());
            (c.watched.clone(), c.seen, serving)
        };
        let now = artifact_fingerprint(&watched);
        // With `require_promotion`, a changed record is a reason to retry too (the record
        // that proves a refused artifact may come after it), unless the artifact it is
        // about is already the one serving.
        let record_changed = self.promotion.required
            && serving != Some(version(now))
            && record_bytes(&watched) != self.lock().seen_record;
        if now != seen || record_changed {
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
        Arc::new(
            LearnedSlot::open(
                model_dir,
                config.fallback.as_deref(),
                PromotionPolicy::from_config(config),
            )
            .with_reload_roots(&config.model_reload_roots),
        )
    } else {
        Arc::new(NoModel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::learned::LEARNED;
    use marshal_model::policy::artifact_hash;

    fn copy_shipped(to: &Path) {
        let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/policy-default");
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    /// A slot on a copy of the shipped model (in the returned temporary directory).
    fn open_copy(require_promotion: bool) -> (tempfile::TempDir, PathBuf, LearnedSlot) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        copy_shipped(&dir);
        let promotion = if require_promotion {
            PromotionPolicy::unsigned()
        } else {
            PromotionPolicy::off()
        };
        let slot = LearnedSlot::open(&dir, None, promotion);
        (tmp, dir, slot)
    }

    /// Another valid artifact: the same weights with another gate threshold.
    fn set_margin_threshold(dir: &Path, t: f64) {
        let path = dir.join("meta.json");
        let mut meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        meta["margin_threshold"] = serde_json::json!(t);
        std::fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
    }

    /// What `marshal model promote` writes beside `dir` (decision and installed hash).
    fn write_record(dir: &Path, promoted: bool, candidate_hash: &str) {
        let record = serde_json::json!({
            "promoted": promoted, "reason": "test", "max_regression": 0.02,
            "candidate": "c", "current": dir, "candidate_hash": candidate_hash,
            "current_hash": null, "traces": [], "previous": null, "decided_at_unix_s": 0.0,
        });
        let path = promotion_record_path(dir).unwrap();
        std::fs::write(path, serde_json::to_vec(&record).unwrap()).unwrap();
    }

    fn refused_unpromoted(r: Result<ModelStatus, ModelError>, why: &str) {
        match r {
            Err(ModelError::Unpromoted { reason, .. }) => {
                assert!(reason.contains(why), "{reason}");
                assert!(reason.contains(".promotion.json"), "{reason}");
            }
            other => panic!("expected a refusal for want of promotion, got {other:?}"),
        }
    }

    #[test]
    fn a_directory_swapped_during_a_load_is_loaded_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        copy_shipped(&dir);
        let first = artifact_fingerprint(&dir);
        // The first load sees the old content; the directory changes before it returns.
        let mut calls = Vec::new();
        let (f, _, loaded) = load_unchanged(&dir, |f| {
            calls.push(f);
            if calls.len() == 1 {
                set_margin_threshold(&dir, 0.25);
            }
            load_artifact(&dir, f, &PromotionPolicy::off())
        });
        let now = artifact_fingerprint(&dir);
        assert_ne!(first, now);
        assert_eq!(calls, [first, now]);
        assert_eq!(f, now);
        assert_eq!(loaded.unwrap().gate.margin_threshold, 0.25);
        // A directory that never settles is refused, for the next poll to retry.
        let mut t = 0.3;
        let (f, record, loaded) = load_unchanged(&dir, |f| {
            t += 0.01;
            set_margin_threshold(&dir, t);
            load_artifact(&dir, f, &PromotionPolicy::off())
        });
        assert_eq!((f, record), (None, None));
        let e = loaded.unwrap_err();
        assert!(matches!(e, ModelError::Unsettled { .. }), "{e:?}");
        assert!(e.to_string().contains("changed while it was loaded"), "{e}");
    }

    fn forbidden(r: Result<ModelStatus, ModelError>) -> String {
        match r {
            Err(ModelError::Forbidden { reason, .. }) => reason,
            other => panic!("expected a path outside the reload roots, got {other:?}"),
        }
    }

    #[test]
    fn reload_by_path_stays_within_the_reload_roots() {
        let (tmp, _dir, slot) = open_copy(false);
        // Beside the configured artifact (the default root): loads.
        let sibling = tmp.path().join("b");
        copy_shipped(&sibling);
        assert_eq!(slot.reload(Some(&sibling), LEARNED).unwrap().reloads, 1);
        // A nonexistent directory under the root is read, and refused as no artifact.
        let missing = slot.reload(Some(&tmp.path().join("nope")), LEARNED);
        assert!(
            matches!(missing, Err(ModelError::Rejected { .. })),
            "{missing:?}"
        );
        // Elsewhere, by a plain path, by climbing out, by a link out, or by a
        // nonexistent path that climbs: refused before anything is read.
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().join("m");
        copy_shipped(&outside);
        let why = forbidden(slot.reload(Some(&outside), LEARNED));
        assert!(why.contains("model_reload_roots"), "{why}");
        assert!(why.contains(&tmp.path().display().to_string()), "{why}");
        let climbing = tmp
            .path()
            .join("b/../..")
            .join(elsewhere.path().strip_prefix("/").unwrap())
            .join("m");
        forbidden(slot.reload(Some(&climbing), LEARNED));
        #[cfg(unix)]
        {
            let link = tmp.path().join("link");
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            forbidden(slot.reload(Some(&link), LEARNED));
        }
        forbidden(slot.reload(Some(&tmp.path().join("nope/../../x")), LEARNED));
        forbidden(slot.reload(Some(Path::new("/etc")), LEARNED));
        let s = slot.status(LEARNED);
        assert_eq!((s.reloads, s.rejected_reloads), (1, 1), "{s:?}");
        assert!(s.path.ends_with("/b"), "{s:?}");
        // A link under the root is loaded, and watched, as what it points to: pointed
        // elsewhere later, it does not lead the poll out of the roots.
        #[cfg(unix)]
        {
            let current = tmp.path().join("current");
            std::os::unix::fs::symlink(&sibling, &current).unwrap();
            let s = slot.reload(Some(&current), LEARNED).unwrap();
            let real = std::fs::canonicalize(&sibling).unwrap();
            assert_eq!(s.path, real.display().to_string());
            std::fs::remove_file(&current).unwrap();
            std::os::unix::fs::symlink(&outside, &current).unwrap();
            slot.poll();
            assert_eq!(slot.status(LEARNED).path, real.display().to_string());
        }
        // Configured roots replace the default; an empty path reloads the watched one.
        let slot = slot.with_reload_roots(&[elsewhere.path().to_path_buf()]);
        let before = slot.status(LEARNED).reloads;
        assert_eq!(
            slot.reload(Some(&outside), LEARNED).unwrap().reloads,
            before + 1
        );
        forbidden(slot.reload(Some(&sibling), LEARNED));
        assert_eq!(slot.reload(None, LEARNED).unwrap().reloads, before + 2);
    }

    #[test]
    fn with_require_promotion_only_a_promoted_unmodified_artifact_loads() {
        // No record (the shipped model has none): refused at start, the fallback decides.
        let (tmp, dir, slot) = open_copy(true);
        let s = slot.status(LEARNED);
        assert!(!s.loaded, "{s:?}");
        assert!(
            s.detail.contains("no promotion record") && s.detail.contains("marshal model promote"),
            "{}",
            s.detail
        );
        refused_unpromoted(slot.reload(None, LEARNED), "no promotion record");
        assert!(!slot.status(LEARNED).loaded);
        // A record of a decision that promoted nothing proves nothing.
        let hash = artifact_hash(&dir).unwrap();
        write_record(&dir, false, &hash);
        refused_unpromoted(slot.reload(None, LEARNED), "proves no installed artifact");
        // Promoted: the poll sees the record change and loads it.
        write_record(&dir, true, &hash);
        slot.poll();
        let s = slot.status(LEARNED);
        assert!(s.loaded, "{s:?}");
        assert_eq!(
            (s.version.as_str(), s.reloads, s.rejected_reloads),
            (hash.as_str(), 1, 2)
        );
        // Modified after its promotion: refused, the promoted model is kept.
        set_margin_threshold(&dir, 0.0);
        slot.poll();
        let s = slot.status(LEARNED);
        assert!(s.loaded && s.version == hash, "{s:?}");
        assert_eq!(s.rejected_reloads, 3);
        assert!(s.last_error.contains("was written for artifact"), "{s:?}");
        assert!(s.detail.contains("last reload rejected"), "{}", s.detail);
        refused_unpromoted(slot.reload(None, LEARNED), "modified or replaced");
        // One warning per change: an unchanged directory is not tried again.
        slot.poll();
        assert_eq!(slot.status(LEARNED).rejected_reloads, 4);
        // Another directory, promoted, loads by path.
        let other = tmp.path().join("other");
        copy_shipped(&other);
        set_margin_threshold(&other, 0.5);
        let other_hash = artifact_hash(&other).unwrap();
        refused_unpromoted(slot.reload(Some(&other), LEARNED), "no promotion record");
        write_record(&other, true, &other_hash);
        let s = slot.reload(Some(&other), LEARNED).unwrap();
        assert_eq!((s.version, s.reloads), (other_hash, 2));
    }

    #[test]
    fn without_require_promotion_every_valid_artifact_loads() {
        let (_tmp, dir, slot) = open_copy(false);
        assert!(slot.status(LEARNED).loaded);
        // A record that does not match is ignored.
        write_record(&dir, false, "0123456789abcdef");
        set_margin_threshold(&dir, 0.0);
        slot.poll();
        let s = slot.status(LEARNED);
        assert_eq!(
            (s.loaded, s.version, s.reloads, s.rejected_reloads),
            (true, artifact_hash(&dir).unwrap(), 1, 0)
        );
        // A corrupt one is still refused as invalid.
        std::fs::write(dir.join("weights.bpk"), b"truncated").unwrap();
        assert!(matches!(
            slot.reload(None, LEARNED),
            Err(ModelError::Rejected { .. })
        ));
    }

    #[test]
    fn with_keys_only_a_signed_promotion_loads_and_unreadable_keys_refuse_everything() {
        use marshal_model::policy::{
            PromotionKeys, artifact_sha256, generate_key_pair, read_promotion_record,
            sign_promotion,
        };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        copy_shipped(&dir);
        let signer = generate_key_pair(&tmp.path().join("promo.key")).unwrap();
        let keys = PromotionKeys::new(vec![signer.public()]);
        let slot = LearnedSlot::open(&dir, None, PromotionPolicy::signed(keys));
        assert!(!slot.status(LEARNED).loaded);
        // Promoted, unsigned: refused, and the reason is reported.
        let hash = artifact_hash(&dir).unwrap();
        write_record(&dir, true, &hash);
        refused_unpromoted(slot.reload(None, LEARNED), "is not signed");
        assert!(slot.status(LEARNED).last_error.contains("is not signed"));
        // Signed: the poll sees the record change and loads it.
        let mut record = read_promotion_record(&dir).unwrap().unwrap();
        let sha = artifact_sha256(&dir).unwrap();
        record.signature = sign_promotion(&signer, &sha, &hash, 1.0);
        record.installed_sha256 = Some(sha);
        let path = promotion_record_path(&dir).unwrap();
        std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        slot.poll();
        let s = slot.status(LEARNED);
        assert!(s.loaded && s.version == hash, "{s:?}");
        assert_eq!((s.reloads, s.rejected_reloads), (1, 1));
        // Key files that went bad after start: nothing loads, the reason says why.
        let broken = LearnedSlot::open(
            &dir,
            None,
            PromotionPolicy {
                key_error: Some("promotion_public_keys: key file k.pub: gone".into()),
                ..PromotionPolicy::off()
            },
        );
        let s = broken.status(LEARNED);
        assert!(!s.loaded && s.last_error.contains("k.pub: gone"), "{s:?}");
    }
}
