//! The promotion record: what `marshal model promote` writes beside an installed artifact
//! (`<dir>.promotion.json`), and the check `marshal serve` makes with it when
//! `require_promotion` is on — the record must prove that the artifact now in `dir` is the
//! one a promotion installed (same [`artifact_fingerprint`]).
//!
//! The record lives beside the artifact, not in it, so the artifact's own files (and its
//! fingerprint) are the promoted candidate's exactly.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::artifact::artifact_fingerprint;

/// One validation trace, both artifacts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    pub trace: String,
    /// `replay` (mean JCT, s) or `inflation` (unallocated GPUs).
    pub objective: String,
    pub seeds: Vec<u64>,
    /// Mean over the seeds (lower is better).
    pub current: f64,
    pub candidate: f64,
    pub current_fallback: String,
    pub candidate_fallback: String,
    pub current_fallback_rate: f64,
    pub candidate_fallback_rate: f64,
    /// (candidate − current) / current: negative is better.
    pub change: f64,
}

/// What `<dir>.promotion.json` holds: the last promotion decision about `dir`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PromotionRecord {
    pub promoted: bool,
    /// The rule's verdict in words.
    pub reason: String,
    pub max_regression: f64,
    pub candidate: String,
    pub current: String,
    /// Content hashes ([`fingerprint_hex`], the version `marshal serve` reports);
    /// `current_hash` is absent when there was no loadable current artifact.
    pub candidate_hash: String,
    pub current_hash: Option<String>,
    /// The hash of the artifact a promotion installed in `current` and that was still
    /// there after this decision: the candidate's when promoted; after a decision that
    /// promoted nothing, the earlier record's, carried over while `current` is still that
    /// artifact (so a losing candidate does not take the installed one's proof away).
    /// Absent in records of older builds: then `candidate_hash` when promoted.
    #[serde(default)]
    pub installed_hash: Option<String>,
    pub traces: Vec<TraceRow>,
    /// Where the replaced artifact was kept (promoted over an existing one).
    pub previous: Option<String>,
    /// Seconds since the Unix epoch.
    pub decided_at_unix_s: f64,
}

impl PromotionRecord {
    /// The hash of the artifact this record proves was installed by a promotion.
    pub fn installed(&self) -> Option<&str> {
        self.installed_hash
            .as_deref()
            .or(self.promoted.then_some(self.candidate_hash.as_str()))
    }
}

/// A fingerprint as reported and recorded: 16 hex digits.
pub fn fingerprint_hex(fingerprint: u64) -> String {
    format!("{fingerprint:016x}")
}

/// `dir`'s content hash as [`fingerprint_hex`] (`None`: it cannot be read).
pub fn artifact_hash(dir: &Path) -> Option<String> {
    artifact_fingerprint(dir).map(fingerprint_hex)
}

/// Where the record about the artifact in `dir` goes: `<dir>.promotion.json` (`None`
/// when the path has no directory name).
pub fn promotion_record_path(dir: &Path) -> Option<PathBuf> {
    let name = dir.file_name()?.to_string_lossy().into_owned();
    Some(dir.with_file_name(format!("{name}.promotion.json")))
}

/// Reads the record about `dir`: `Ok(None)` when there is none.
pub fn read_promotion_record(dir: &Path) -> Result<Option<PromotionRecord>, String> {
    let Some(path) = promotion_record_path(dir) else {
        return Err(format!("{}: the path has no directory name", dir.display()));
    };
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("promotion record {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("promotion record {}: {e}", path.display())),
    }
}

/// `Ok` iff `<dir>.promotion.json` proves that the artifact in `dir`, whose
/// [`artifact_fingerprint`] is `fingerprint`, was installed by a promotion; the error
/// names the record and what is missing or differs.
pub fn verify_promotion(dir: &Path, fingerprint: u64) -> Result<(), String> {
    let path = promotion_record_path(dir).unwrap_or_else(|| dir.with_extension("promotion.json"));
    let have = fingerprint_hex(fingerprint);
    let record = read_promotion_record(dir)?.ok_or_else(|| {
        format!(
            "not promoted: no promotion record {} (require_promotion is on; install it with `marshal model promote --candidate <copy of it> --current {}`)",
            path.display(),
            dir.display()
        )
    })?;
    match record.installed() {
        None => Err(format!(
            "not promoted: promotion record {} proves no installed artifact ({})",
            path.display(),
            record.reason
        )),
        Some(want) if want != have => Err(format!(
            "promotion record {} was written for artifact {want}, but the artifact is {have} (modified or replaced after its promotion)",
            path.display()
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(promoted: bool, candidate_hash: &str, installed: Option<&str>) -> PromotionRecord {
        PromotionRecord {
            promoted,
            reason: "r".into(),
            max_regression: 0.02,
            candidate: "c".into(),
            current: "m".into(),
            candidate_hash: candidate_hash.into(),
            current_hash: None,
            installed_hash: installed.map(String::from),
            traces: vec![],
            previous: None,
            decided_at_unix_s: 0.0,
        }
    }

    fn write(dir: &Path, r: &PromotionRecord) {
        let path = promotion_record_path(dir).unwrap();
        std::fs::write(path, serde_json::to_vec(r).unwrap()).unwrap();
    }

    #[test]
    fn the_record_must_name_the_installed_artifact() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("model");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("meta.json"), "{}").unwrap();
        let f = artifact_fingerprint(&dir).unwrap();
        let hex = fingerprint_hex(f);
        assert_eq!(
            promotion_record_path(&dir).unwrap(),
            tmp.path().join("model.promotion.json")
        );
        let err = verify_promotion(&dir, f).unwrap_err();
        assert!(err.contains("no promotion record") && err.contains("model.promotion.json"));
        write(&dir, &record(true, &hex, None));
        verify_promotion(&dir, f).unwrap();
        write(&dir, &record(true, "0123456789abcdef", None));
        let err = verify_promotion(&dir, f).unwrap_err();
        assert!(
            err.contains("0123456789abcdef") && err.contains(&hex),
            "{err}"
        );
        // A losing candidate's record carries the installed artifact's proof over.
        write(&dir, &record(false, "0123456789abcdef", Some(&hex)));
        verify_promotion(&dir, f).unwrap();
        write(&dir, &record(false, &hex, None));
        assert!(verify_promotion(&dir, f).unwrap_err().contains("proves no"));
        std::fs::write(promotion_record_path(&dir).unwrap(), "{").unwrap();
        assert!(
            verify_promotion(&dir, f)
                .unwrap_err()
                .contains("promotion record")
        );
    }
}
