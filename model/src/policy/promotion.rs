//! The promotion record: what `marshal model promote` writes beside an installed artifact
//! (`<dir>.promotion.json`), and the check `marshal serve` makes with it when
//! `require_promotion` is on — the record must prove that the artifact now in `dir` is the
//! one a promotion installed (same [`artifact_fingerprint`]).
//!
//! The record lives beside the artifact, not in it, so the artifact's own files (and its
//! fingerprint) are the promoted candidate's exactly.
//!
//! Unsigned, the record guards against mistakes (an artifact copied in by hand, a
//! half-finished install), not against someone who can write the directory. With
//! `promotion_public_keys` the server also requires the record's [`PromotionSignature`]
//! from a trusted key over the installed artifact's SHA-256 digest ([`artifact_sha256`]),
//! and that digest to match the directory (module `signing`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::artifact::artifact_fingerprint;
use super::digest::artifact_sha256;
use super::keys::PromotionKeys;
use super::signing::{PromotionSignature, verify_signature};

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
    /// SHA-256 content digests ([`artifact_sha256`]) of the candidate and of the installed
    /// artifact (carried over with `installed_hash`). Absent in records of older builds,
    /// and for a candidate that has no digest (an unsigned promotion of an artifact
    /// holding a symlink).
    #[serde(default)]
    pub candidate_sha256: Option<String>,
    #[serde(default)]
    pub installed_sha256: Option<String>,
    /// The signature over the installed artifact's promotion (`--signing-key`; carried
    /// over with the proof by a decision that promotes nothing); absent: unsigned.
    #[serde(default)]
    pub signature: Option<PromotionSignature>,
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

/// Where a promotion's record waits while its artifact is swapped in:
/// `<dir>.promotion.json.pending`. `promote` writes it, swaps, then renames it over the
/// record, so a crash between the swap and the rename leaves the new artifact beside
/// the old record and this one, and [`verify_promotion`] accepts the artifact that the
/// pending record proves (without it, the server would refuse its model at the next
/// start and the fallback would decide everything until someone promoted again).
pub fn pending_record_path(dir: &Path) -> Option<PathBuf> {
    let path = promotion_record_path(dir)?;
    let mut name = path.file_name()?.to_os_string();
    name.push(".pending");
    Some(path.with_file_name(name))
}

/// Reads the record about `dir`: `Ok(None)` when there is none.
pub fn read_promotion_record(dir: &Path) -> Result<Option<PromotionRecord>, String> {
    let Some(path) = promotion_record_path(dir) else {
        return Err(format!("{}: the path has no directory name", dir.display()));
    };
    read_record_at(&path)
}

fn read_record_at(path: &Path) -> Result<Option<PromotionRecord>, String> {
    match crate::artifact::read_regular_file(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("promotion record {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("promotion record {}: {e}", path.display())),
    }
}

/// `Ok` iff `<dir>.promotion.json` proves that the artifact in `dir`, whose
/// [`artifact_fingerprint`] is `fingerprint`, was installed by a promotion; the error
/// names the record and what is missing or differs. With `keys`, the proof must also be
/// signed by one of them and the artifact's SHA-256 digest must be the signed one (the
/// digest is computed only then, after every cheaper check passed).
pub fn verify_promotion(dir: &Path, fingerprint: u64, keys: &PromotionKeys) -> Result<(), String> {
    let verdict = verify_record(dir, fingerprint, keys);
    if verdict.is_ok() {
        return verdict;
    }
    // A promotion interrupted between its swap and its record's rename (module docs of
    // `pending_record_path`): the pending record may prove the artifact now in place.
    if let Some(pending) = pending_record_path(dir)
        && let Ok(Some(record)) = read_record_at(&pending)
        && record.installed() == Some(fingerprint_hex(fingerprint).as_str())
        && check_record(dir, &pending, &record, fingerprint, keys).is_ok()
    {
        return Ok(());
    }
    verdict
}

fn verify_record(dir: &Path, fingerprint: u64, keys: &PromotionKeys) -> Result<(), String> {
    let path = promotion_record_path(dir).unwrap_or_else(|| dir.with_extension("promotion.json"));
    let record = read_promotion_record(dir)?.ok_or_else(|| {
        format!(
            "not promoted: no promotion record {} (require_promotion is on; install it with `marshal model promote --candidate <copy of it> --current {}`)",
            path.display(),
            dir.display()
        )
    })?;
    check_record(dir, &path, &record, fingerprint, keys)
}

/// Whether `record` (read from `path`) proves the artifact in `dir`.
fn check_record(
    dir: &Path,
    path: &Path,
    record: &PromotionRecord,
    fingerprint: u64,
    keys: &PromotionKeys,
) -> Result<(), String> {
    let have = fingerprint_hex(fingerprint);
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
        Some(_) if keys.is_empty() => Ok(()),
        Some(fnv) => verify_signed(dir, path, record, fnv, keys),
    }
}

/// The signed part of [`verify_promotion`]: `record` proves `fnv` installed.
fn verify_signed(
    dir: &Path,
    path: &Path,
    record: &PromotionRecord,
    fnv: &str,
    keys: &PromotionKeys,
) -> Result<(), String> {
    let Some(sig) = &record.signature else {
        return Err(format!(
            "promotion record {} is not signed (promotion_public_keys is set: promote with `marshal model promote --signing-key`)",
            path.display()
        ));
    };
    let Some(signed) = record.installed_sha256.as_deref() else {
        return Err(format!(
            "promotion record {} is signed but names no installed_sha256",
            path.display()
        ));
    };
    verify_signature(sig, signed, fnv, keys, &path.display().to_string())?;
    let have = artifact_sha256(dir).map_err(|e| e.to_string())?;
    if have != signed {
        return Err(format!(
            "artifact content (sha256 {}…) differs from the signed sha256 {}… in promotion record {} (the artifact was changed after its promotion; its FNV fingerprint still matches, so deliberately)",
            short(&have),
            short(signed),
            path.display()
        ));
    }
    Ok(())
}

/// The first 12 digits of a digest, for messages.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
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
            candidate_sha256: None,
            installed_sha256: None,
            signature: None,
            traces: vec![],
            previous: None,
            decided_at_unix_s: 0.0,
        }
    }

    fn write(dir: &Path, r: &PromotionRecord) {
        let path = promotion_record_path(dir).unwrap();
        std::fs::write(path, serde_json::to_vec(r).unwrap()).unwrap();
    }

    fn unsigned() -> PromotionKeys {
        PromotionKeys::default()
    }

    fn verify_promotion(dir: &Path, f: u64) -> Result<(), String> {
        super::verify_promotion(dir, f, &unsigned())
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

    /// An artifact, its fingerprint and a record of its promotion signed by a new key.
    fn signed_artifact(
        tmp: &Path,
    ) -> (
        PathBuf,
        u64,
        PromotionRecord,
        crate::policy::PromotionSigner,
    ) {
        let dir = tmp.join("model");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("meta.json"), "{}").unwrap();
        std::fs::write(dir.join("weights.bpk"), [1u8, 2, 3]).unwrap();
        let f = artifact_fingerprint(&dir).unwrap();
        let signer = crate::policy::generate_key_pair(&tmp.join("key")).unwrap();
        let sha = artifact_sha256(&dir).unwrap();
        let mut r = record(true, &fingerprint_hex(f), Some(&fingerprint_hex(f)));
        r.decided_at_unix_s = 1_700_000_000.25;
        r.installed_sha256 = Some(sha.clone());
        r.candidate_sha256 = Some(sha.clone());
        r.signature =
            crate::policy::sign_promotion(&signer, &sha, &fingerprint_hex(f), r.decided_at_unix_s);
        write(&dir, &r);
        (dir, f, r, signer)
    }

    #[test]
    fn with_keys_only_a_signed_record_over_the_same_content_proves_promotion() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, f, signed, signer) = signed_artifact(tmp.path());
        let keys = PromotionKeys::new(vec![signer.public()]);
        let check = |keys: &PromotionKeys| super::verify_promotion(&dir, f, keys);
        check(&keys).unwrap();
        check(&unsigned()).unwrap();
        let refused = |r: &PromotionRecord, why: &str| {
            write(&dir, r);
            let e = check(&keys).unwrap_err();
            assert!(e.contains(why) && e.contains("model.promotion.json"), "{e}");
        };
        // Unsigned: refused with keys, fine without.
        refused(
            &PromotionRecord {
                signature: None,
                ..signed.clone()
            },
            "is not signed",
        );
        check(&unsigned()).unwrap();
        // A covered field changed after signing.
        let mut other = signed.clone();
        other.installed_sha256 = Some("ab".repeat(32));
        refused(&other, "signature does not verify");
        let mut other = signed.clone();
        if let Some(s) = other.signature.as_mut() {
            s.decided_at_unix_s += 1.0;
        }
        refused(&other, "signature does not verify");
        let mut other = signed.clone();
        other.installed_sha256 = None;
        refused(&other, "names no installed_sha256");
        // Uncovered fields are informational.
        write(
            &dir,
            &PromotionRecord {
                reason: "edited".into(),
                ..signed.clone()
            },
        );
        check(&keys).unwrap();
        // Signed by a key the server does not trust.
        let stranger = crate::policy::generate_key_pair(&tmp.path().join("k2")).unwrap();
        let e = check(&PromotionKeys::new(vec![stranger.public()])).unwrap_err();
        assert!(
            e.contains(&format!("signed by unknown key {}", signer.key_id())),
            "{e}"
        );
        // The artifact changed after signing while its fingerprint (taken before the
        // change here; an FNV collision in an attack) still matches: the digest catches it.
        write(&dir, &signed);
        std::fs::write(dir.join("weights.bpk"), [1u8, 2, 4]).unwrap();
        let e = check(&keys).unwrap_err();
        let now = artifact_sha256(&dir).unwrap();
        let was = signed.installed_sha256.as_deref().unwrap();
        assert!(
            e.contains(&format!("artifact content (sha256 {}", &now[..12]))
                && e.contains(&format!("differs from the signed sha256 {}", &was[..12])),
            "{e}"
        );
        // Its fingerprint moved too: the cheap check refuses first.
        let e =
            super::verify_promotion(&dir, artifact_fingerprint(&dir).unwrap(), &keys).unwrap_err();
        assert!(e.contains("was written for artifact"), "{e}");
    }

    #[test]
    fn records_of_older_builds_still_prove_promotion_without_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, f, _, signer) = signed_artifact(tmp.path());
        let old = serde_json::json!({
            "promoted": true, "reason": "r", "max_regression": 0.02, "candidate": "c",
            "current": "m", "candidate_hash": fingerprint_hex(f), "current_hash": null,
            "traces": [], "previous": null, "decided_at_unix_s": 0.0,
        });
        std::fs::write(promotion_record_path(&dir).unwrap(), old.to_string()).unwrap();
        let r = read_promotion_record(&dir).unwrap().unwrap();
        assert_eq!((r.installed_sha256, r.signature), (None, None));
        verify_promotion(&dir, f).unwrap();
        let keys = PromotionKeys::new(vec![signer.public()]);
        let e = super::verify_promotion(&dir, f, &keys).unwrap_err();
        assert!(e.contains("is not signed"), "{e}");
    }
}
