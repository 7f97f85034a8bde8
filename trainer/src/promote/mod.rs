//! Promotion: a candidate policy artifact replaces the current one only if it wins.
//!
//! [`compare`] runs both artifacts — each greedy behind its own gate, with its own
//! fallback for the trace's objective, exactly as `marshal eval` and `marshal serve` would
//! run them — on the same validation episodes and seeds ([`super::policy::run_episode`],
//! the trainer's one episode runner), and scores each trace by its objective: mean JCT in
//! replay, unallocated GPUs at 100 % arrived load in inflation (lower is better), averaged
//! over the seeds. [`decide`] applies the rule:
//!
//! > promote iff on **every** trace the candidate is worse than the current by at most
//! > `max_regression` (relative), and on **at least one** trace it is strictly better.
//!
//! A tie everywhere is not promoted (nothing to gain, and every swap costs a reload). A
//! current artifact that does not load is judged as what a server with it does: its
//! fallback decides everything. [`install`] then swaps the candidate in atomically
//! ([`install`]'s docs), and [`PromotionRecord`] is what `promotion.json` holds.
//!
//! With a signing key ([`promote_signed`]) a promotion's record also carries an Ed25519
//! signature over the installed artifact's SHA-256 digest and fingerprint
//! ([`marshal_model::policy::signed_bytes`]), which a server with `promotion_public_keys`
//! requires. A decision that promotes nothing signs nothing: it carries the installed
//! artifact's proof (fingerprint, digest, signature) over unchanged, as before.

mod install;

pub use install::{PREV_SUFFIX, install, prev_path, record_path, write_record};

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use marshal_model::policy::{PromotionRecord, PromotionSigner, TraceRow, artifact_hash};
use marshal_model::policy::{
    artifact_sha256, load_policy, pending_record_path, promotion_record_path,
    read_promotion_record, replace_file, sign_promotion, sync_dir,
};
use marshal_scheduler::policies::learned::{Act, LearnedModel};
use serde::{Deserialize, Serialize};

use crate::policy::{Driver, EpisodeSpec, run_episode};

/// Why a promotion could not be decided or carried out.
#[derive(Debug, thiserror::Error)]
pub enum PromoteError {
    #[error("candidate {path}: {reason}; nothing was installed")]
    Candidate { path: PathBuf, reason: String },
    #[error("invalid promotion settings: {0}")]
    Settings(String),
    #[error("evaluating {what}: {reason}")]
    Evaluation { what: String, reason: String },
    #[error("installing into {path}: {reason}")]
    Install { path: PathBuf, reason: String },
    #[error("current artifact {path}: {reason}; nothing was installed")]
    Current { path: PathBuf, reason: String },
}

/// The rule's setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromoteOptions {
    /// Largest relative worsening against the current artifact allowed on any trace
    /// (0.02: 2 %).
    pub max_regression: f64,
}

impl Default for PromoteOptions {
    fn default() -> Self {
        PromoteOptions {
            max_regression: 0.02,
        }
    }
}

impl PromoteOptions {
    pub fn validate(&self) -> Result<(), PromoteError> {
        if self.max_regression.is_finite() && self.max_regression >= 0.0 {
            Ok(())
        } else {
            Err(PromoteError::Settings(format!(
                "max_regression must be finite and ≥ 0 (got {})",
                self.max_regression
            )))
        }
    }
}

/// A current artifact this build cannot read because a newer build wrote it is not
/// "missing": the server (that newer build) may well be serving it. Judged as missing,
/// the candidate would be compared with the fallback alone and could replace a better
/// model, which the server would then refuse as another schema. A missing, corrupt or
/// older current artifact is judged as the server judges it: as missing.
fn refuse_newer_current(current: &Path) -> Result<(), PromoteError> {
    match marshal_model::policy::load_policy(current) {
        Err(marshal_model::ModelError::SchemaVersion { found, expected }) if found > expected => {
            Err(PromoteError::Current {
                path: current.to_path_buf(),
                reason: format!(
                    "its policy schema {found} is newer than this build's {expected}; promote with the build that serves it"
                ),
            })
        }
        _ => Ok(()),
    }
}

/// The candidate must load (every check of [`load_policy`]); the error names why not.
pub fn check_candidate(dir: &Path) -> Result<LearnedModel, PromoteError> {
    let refuse = |reason: String| PromoteError::Candidate {
        path: dir.to_path_buf(),
        reason,
    };
    load_policy(dir).map_err(|e| refuse(e.to_string()))?;
    LearnedModel::try_load(dir).map_err(refuse)
}

/// Mean score and fallback rate of `model` on every seed of `spec` (gated greedy, with
/// the model's fallback for the spec's objective and the gate for that fallback).
fn score(model: &LearnedModel, spec: &EpisodeSpec) -> Result<(f64, f64, String), String> {
    let fallback = model.fallback_for(spec.objective().name());
    let (gate, _) = model.gate_for(&fallback);
    let spec = EpisodeSpec {
        fallback: fallback.clone(),
        ..spec.clone()
    };
    let driver = Driver::Learned {
        scorer: model.scorer.as_ref().ok().map(Arc::clone),
        act: Act::Greedy,
        gate,
        candidates: model.candidates,
        // As `marshal eval` serves it: on inflation only, with the fallback and gate it
        // was searched with, and of this build's inputs.
        decline: model
            .decline_for(&fallback, gate.margin_threshold, spec.objective().name())
            .0,
    };
    let n = spec.jobs_by_seed.len();
    let (mut total, mut rate) = (0.0, 0.0);
    for i in 0..n {
        let o = run_episode(&spec, i, &driver)?;
        total += o.score;
        rate += o.counts.fallback_rate();
    }
    Ok((total / n as f64, rate / n as f64, fallback))
}

/// Both artifacts on every spec (every seed). `current` that does not load is run as
/// its fallback, as a server holding it would.
pub fn compare(
    candidate: &LearnedModel,
    current: &LearnedModel,
    specs: &[EpisodeSpec],
    progress: &mut dyn FnMut(&TraceRow),
) -> Result<Vec<TraceRow>, PromoteError> {
    if specs.is_empty() || specs.iter().any(|s| s.jobs_by_seed.is_empty()) {
        return Err(PromoteError::Settings(
            "promotion needs at least one validation trace with at least one seed".into(),
        ));
    }
    let mut rows = Vec::new();
    for spec in specs {
        let eval = |what: &str, m: &LearnedModel| {
            score(m, spec).map_err(|reason| PromoteError::Evaluation {
                what: format!("the {what} on {}", spec.name),
                reason,
            })
        };
        let (cur, cur_rate, cur_fb) = eval("current artifact", current)?;
        let (cand, cand_rate, cand_fb) = eval("candidate", candidate)?;
        let row = TraceRow {
            trace: spec.name.clone(),
            objective: spec.objective().name().to_string(),
            seeds: spec.jobs_by_seed.iter().map(|(s, _)| *s).collect(),
            current: cur,
            candidate: cand,
            current_fallback: cur_fb,
            candidate_fallback: cand_fb,
            current_fallback_rate: cur_rate,
            candidate_fallback_rate: cand_rate,
            change: relative_change(cur, cand),
        };
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// (candidate − current) / current; a non-finite candidate score (a replay without a
/// finished job) counts as infinitely worse unless the current one is non-finite too.
fn relative_change(current: f64, candidate: f64) -> f64 {
    match (current.is_finite(), candidate.is_finite()) {
        (_, false) if !current.is_finite() => 0.0,
        (_, false) => f64::INFINITY,
        (false, true) => f64::NEG_INFINITY,
        (true, true) if current > 0.0 => (candidate - current) / current,
        (true, true) => (candidate - current).signum() * f64::from(candidate != current),
    }
}

/// The rule (module docs): `(promote, why)`.
pub fn decide(rows: &[TraceRow], opts: &PromoteOptions) -> (bool, String) {
    let pct = |x: f64| format!("{:+.2} %", 100.0 * x);
    if let Some(r) = rows
        .iter()
        .filter(|r| r.change > opts.max_regression)
        .max_by(|a, b| a.change.total_cmp(&b.change))
    {
        return (
            false,
            format!(
                "not promoted: the candidate is worse on {} by {} (allowed {})",
                r.trace,
                pct(r.change),
                pct(opts.max_regression)
            ),
        );
    }
    match rows
        .iter()
        .filter(|r| r.candidate < r.current || r.change < 0.0)
        .min_by(|a, b| a.change.total_cmp(&b.change))
    {
        Some(r) => (
            true,
            format!(
                "promoted: within {} of the current artifact on every trace, better on {} ({})",
                pct(opts.max_regression),
                r.trace,
                pct(r.change)
            ),
        ),
        None => (
            false,
            "not promoted: the candidate is better on no trace".to_string(),
        ),
    }
}

/// Checks the candidate, compares it with `current` on `specs`, applies the rule and,
/// if it wins, installs it at `current` ([`install`]); the decision is written to
/// `<current>.promotion.json` either way. A candidate that does not load is refused
/// before anything runs or is written; `current` is never modified unless promoted.
pub fn promote(
    candidate: &Path,
    current: &Path,
    specs: &[EpisodeSpec],
    opts: &PromoteOptions,
    progress: &mut dyn FnMut(&TraceRow),
) -> Result<PromotionRecord, PromoteError> {
    promote_signed(candidate, current, specs, opts, None, progress)
}

/// [`promote`], and with `signer` a promotion's record is signed (module docs). A
/// candidate without a SHA-256 digest (it holds a symlink or a subdirectory) cannot be
/// signed and is refused before anything runs.
pub fn promote_signed(
    candidate: &Path,
    current: &Path,
    specs: &[EpisodeSpec],
    opts: &PromoteOptions,
    signer: Option<&PromotionSigner>,
    progress: &mut dyn FnMut(&TraceRow),
) -> Result<PromotionRecord, PromoteError> {
    opts.validate()?;
    if candidate == current {
        return Err(PromoteError::Settings(
            "the candidate and the current artifact are the same directory".into(),
        ));
    }
    let cand = check_candidate(candidate)?;
    let candidate_hash = artifact_hash(candidate).ok_or_else(|| PromoteError::Candidate {
        path: candidate.to_path_buf(),
        reason: "cannot be read".into(),
    })?;
    // Unsigned, a candidate without a digest is promoted as before (the fingerprint is
    // its proof); signed, the digest is what the signature is about.
    let candidate_sha256 = match (artifact_sha256(candidate), signer) {
        (Ok(d), _) => Some(d),
        (Err(_), None) => None,
        (Err(e), Some(_)) => {
            return Err(PromoteError::Candidate {
                path: candidate.to_path_buf(),
                reason: format!("cannot be signed: {e}"),
            });
        }
    };
    // Hashed before loading, as the server does: the record names what was compared.
    let current_hash = artifact_hash(current);
    refuse_newer_current(current)?;
    let (cur, current_hash) = match LearnedModel::try_load(current) {
        Ok(m) => (m, current_hash),
        Err(why) => (
            LearnedModel::missing(format!("current artifact {}: {why}", current.display())),
            None,
        ),
    };
    let traces = compare(&cand, &cur, specs, progress)?;
    let (promoted, reason) = decide(&traces, opts);
    let record_file = record_path(current)?;
    // The record about what is installed now (kept with it if it is replaced, restored if
    // the install fails) and the artifact it proves was promoted.
    let old_record = fs::read(&record_file).ok();
    let old = read_promotion_record(current).ok().flatten();
    let old_installed = old.as_ref().and_then(|r| r.installed().map(String::from));
    let previous = if promoted && current.exists() {
        Some(prev_path(current)?)
    } else {
        None
    };
    let decided_at_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    // The installed artifact's proof: the candidate's when promoted (signed with a key),
    // else the earlier record's, carried over whole while `current` is still that
    // artifact. A carried digest that no longer matches goes with its signature (the
    // server would refuse it anyway).
    let (installed_hash, installed_sha256, signature) = if promoted {
        let signature = match (signer, &candidate_sha256) {
            (Some(s), Some(sha)) => Some(
                sign_promotion(s, sha, &candidate_hash, decided_at_unix_s).ok_or_else(|| {
                    PromoteError::Candidate {
                        path: candidate.to_path_buf(),
                        reason: "its digests are not in canonical form".into(),
                    }
                })?,
            ),
            _ => None,
        };
        (
            Some(candidate_hash.clone()),
            candidate_sha256.clone(),
            signature,
        )
    } else {
        match old_installed.filter(|h| Some(h) == current_hash.as_ref()) {
            None => (None, None, None),
            Some(h) => {
                let old = old.as_ref();
                let sha = old
                    .and_then(|r| r.installed_sha256.clone())
                    .filter(|d| artifact_sha256(current).ok().as_ref() == Some(d));
                let signature = sha
                    .as_ref()
                    .and_then(|_| old.and_then(|r| r.signature.clone()));
                (Some(h), sha, signature)
            }
        }
    };
    let record = PromotionRecord {
        promoted,
        reason,
        max_regression: opts.max_regression,
        candidate: candidate.display().to_string(),
        current: current.display().to_string(),
        installed_hash,
        candidate_sha256,
        installed_sha256,
        signature,
        candidate_hash,
        current_hash,
        traces,
        previous: previous.as_ref().map(|p| p.display().to_string()),
        decided_at_unix_s,
    };
    if !promoted {
        write_record(current, &record)?;
        return Ok(record);
    }
    // The record waits under its pending name while the artifact is swapped in, then
    // replaces the old one: at every instant (a crash included) the artifact in place is
    // proven by the record or by the pending record, which a server that requires
    // promotion also accepts (`marshal_model::policy::pending_record_path`).
    let pending = write_pending_record(current, &record)?;
    let installed = install(candidate, current);
    if artifact_hash(current).as_deref() != Some(record.candidate_hash.as_str()) {
        // Not installed: the old record stands.
        let _ = fs::remove_file(&pending);
        return Err(installed.err().unwrap_or_else(|| PromoteError::Install {
            path: current.to_path_buf(),
            reason: "the installed artifact is not the candidate".into(),
        }));
    }
    // Installed (an error after the swap still leaves the candidate in place, and then
    // the new record is the right one).
    fs::rename(&pending, &record_file)
        .and_then(|()| sync_dir(record_file.parent().unwrap_or(Path::new("."))))
        .map_err(|e| PromoteError::Install {
            path: record_file.clone(),
            reason: format!(
                "the candidate is installed, but its record stays at {} ({e}); the server accepts it there",
                pending.display()
            ),
        })?;
    if let Ok(Some(prev)) = &installed
        && let Some(prev_record) = promotion_record_path(prev)
    {
        // The replaced artifact's record goes with it (a rollback moves both).
        put_back(&prev_record, old_record.as_deref()).map_err(|e| PromoteError::Install {
            path: prev_record.clone(),
            reason: format!(
                "the candidate is installed and recorded, but the replaced artifact's record was not kept beside it: {e}"
            ),
        })?;
    }
    installed.map(|_| record)
}

/// Writes `record` to the pending record path of `current` (atomically).
fn write_pending_record(current: &Path, record: &PromotionRecord) -> Result<PathBuf, PromoteError> {
    let path = pending_record_path(current).ok_or_else(|| PromoteError::Install {
        path: current.to_path_buf(),
        reason: "the current artifact's path has no directory name".into(),
    })?;
    install::write_record_at(path, record)
}

/// `path` gets `bytes`, or is removed when there are none.
fn put_back(path: &Path, bytes: Option<&[u8]>) -> Result<(), String> {
    match bytes {
        Some(b) => replace_file(path, b).map_err(|e| e.to_string()),
        None if path.exists() => fs::remove_file(path).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
