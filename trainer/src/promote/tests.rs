use std::collections::BTreeMap;
use std::fs;

use super::*;
use crate::testkit::{inflation_spec, tiny_artifact};
use marshal_model::policy::{
    POLICY_SCHEMA_VERSION, PromotionKeys, artifact_fingerprint, artifact_sha256, generate_key_pair,
};

/// Unsigned verification (no `promotion_public_keys`).
fn verify_promotion(dir: &Path, fingerprint: u64) -> Result<(), String> {
    marshal_model::policy::verify_promotion(dir, fingerprint, &PromotionKeys::default())
}

fn artifact(dir: &Path, inflation_fallback: &str, seed: u64) {
    // A closed gate: the artifact schedules exactly as its inflation fallback.
    tiny_artifact(dir, inflation_fallback, seed, 1.5);
}

/// `promote` on the one inflation trace with the default options, no progress report.
fn promote_on_inflation(candidate: &Path, current: &Path) -> Result<PromotionRecord, PromoteError> {
    promote(
        candidate,
        current,
        &[inflation_spec()],
        &PromoteOptions::default(),
        &mut |_| {},
    )
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// A record that proves the artifact now in `dir` was promoted.
fn record_proving(dir: &Path) -> PromotionRecord {
    let hash = artifact_hash(dir);
    PromotionRecord {
        promoted: true,
        reason: "earlier".into(),
        max_regression: 0.02,
        candidate: "earlier".into(),
        current: dir.display().to_string(),
        candidate_hash: hash.clone().unwrap(),
        current_hash: None,
        installed_hash: hash,
        candidate_sha256: None,
        installed_sha256: None,
        signature: None,
        traces: vec![],
        previous: None,
        decided_at_unix_s: 0.0,
    }
}

#[test]
fn a_promotion_cut_off_between_its_swap_and_its_record_still_proves_the_new_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "random", 1);
    artifact(&candidate, "fgd", 2);
    write_record(&current, &record_proving(&current)).unwrap();
    let proven = |dir: &Path| verify_promotion(dir, artifact_fingerprint(dir).unwrap());
    // What `promote` does, stopped where a crash would stop it: the pending record
    // written, the swap done, the rename not.
    write_pending_record(&current, &record_proving(&candidate)).unwrap();
    proven(&current).unwrap();
    install(&candidate, &current).unwrap();
    proven(&current).unwrap();
    // The old record alone does not prove the new artifact; a pending record about a
    // third artifact proves nothing either.
    let pending = pending_record_path(&current).unwrap();
    fs::remove_file(&pending).unwrap();
    let refused = proven(&current).unwrap_err();
    assert!(refused.contains("modified or replaced"), "{refused}");
    write_pending_record(&current, &record_proving(&tmp.path().join("current.prev"))).unwrap();
    assert!(proven(&current).is_err());
}

#[test]
fn a_losing_candidate_is_not_installed_and_current_is_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "fgd", 1);
    artifact(&candidate, "random", 2);
    let before = snapshot(&current);
    let mut seen = 0;
    let record = promote(
        &candidate,
        &current,
        &[inflation_spec()],
        &PromoteOptions::default(),
        &mut |_| seen += 1,
    )
    .unwrap();
    assert_eq!(seen, 1);
    let row = &record.traces[0];
    assert!(row.candidate > row.current * 1.02, "{row:?}");
    assert_eq!(row.seeds, [2000, 2001]);
    assert_eq!(
        (
            row.current_fallback.as_str(),
            row.candidate_fallback.as_str()
        ),
        ("fgd", "random")
    );
    assert!(
        !record.promoted && record.reason.contains("worse"),
        "{record:?}"
    );
    assert_eq!(snapshot(&current), before, "current is byte-identical");
    assert!(!tmp.path().join("current.prev").exists());
    // The decision is recorded beside it, with both hashes.
    let saved: PromotionRecord =
        serde_json::from_slice(&fs::read(tmp.path().join("current.promotion.json")).unwrap())
            .unwrap();
    assert_eq!(saved, record);
    assert_eq!(saved.current_hash, artifact_hash(&current));
    assert_eq!(Some(saved.candidate_hash), artifact_hash(&candidate));
}

#[test]
fn a_tie_is_not_promoted() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "fgd", 1);
    artifact(&candidate, "fgd", 2);
    let before = snapshot(&current);
    let record = promote_on_inflation(&candidate, &current).unwrap();
    assert_eq!(record.traces[0].change, 0.0);
    assert!(!record.promoted && record.reason.contains("better on no trace"));
    assert_eq!(snapshot(&current), before);
}

#[test]
fn a_winning_candidate_is_installed_atomically_loads_and_the_old_one_is_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "random", 1);
    artifact(&candidate, "fgd", 2);
    let old = snapshot(&current);
    let old_hash = artifact_hash(&current);
    // The current artifact was promoted once (its record proves it).
    write_record(&current, &record_proving(&current)).unwrap();
    let record = promote_on_inflation(&candidate, &current).unwrap();
    assert!(record.promoted, "{record:?}");
    assert!(!pending_record_path(&current).unwrap().exists());
    // A server that requires promotion accepts the installed artifact, and the replaced
    // one's record went with it (a rollback moves both).
    let proven = |dir: &Path| verify_promotion(dir, artifact_fingerprint(dir).unwrap());
    assert_eq!(record.installed_hash, Some(record.candidate_hash.clone()));
    proven(&current).unwrap();
    proven(&tmp.path().join("current.prev")).unwrap();
    assert!(record.traces[0].change < 0.0);
    // The installed artifact is the candidate's files exactly, so its version (the hash
    // `marshal serve`'s poll compares) changed to the candidate's, and it loads.
    assert_eq!(snapshot(&current), snapshot(&candidate));
    assert_eq!(artifact_hash(&current), Some(record.candidate_hash.clone()));
    assert_ne!(artifact_hash(&current), old_hash);
    let loaded = LearnedModel::try_load(&current).unwrap();
    assert_eq!(loaded.fallback_for("inflation"), "fgd");
    // The replaced artifact is kept for rollback, and no staging directory is left.
    let prev = tmp.path().join("current.prev");
    assert_eq!(record.previous.as_deref(), Some(prev.to_str().unwrap()));
    assert_eq!(snapshot(&prev), old);
    let hidden: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
    // Promoting again over it replaces the older `.prev`.
    artifact(&candidate, "random", 3);
    let record = promote_on_inflation(&candidate, &current).unwrap();
    assert!(!record.promoted);
    // A losing candidate's record keeps the installed artifact's proof.
    assert_eq!(record.installed_hash, artifact_hash(&current));
    proven(&current).unwrap();
}

#[test]
fn a_signed_promotion_writes_a_record_that_its_public_key_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "random", 1);
    artifact(&candidate, "fgd", 2);
    let signer = generate_key_pair(&tmp.path().join("promo.key")).unwrap();
    let keys = PromotionKeys::new(vec![signer.public()]);
    let signed = |candidate: &Path| {
        promote_signed(
            candidate,
            &current,
            &[inflation_spec()],
            &PromoteOptions::default(),
            Some(&signer),
            &mut |_| {},
        )
    };
    let record = signed(&candidate).unwrap();
    assert!(record.promoted, "{record:?}");
    let sig = record
        .signature
        .clone()
        .expect("a promotion with a key is signed");
    assert_eq!(sig.key_id, signer.key_id());
    assert_eq!(sig.decided_at_unix_s, record.decided_at_unix_s);
    let digest = artifact_sha256(&current).unwrap();
    assert_eq!(record.installed_sha256.as_deref(), Some(digest.as_str()));
    assert_eq!(record.candidate_sha256, record.installed_sha256);
    // What was written is what was returned, and a server trusting the key loads it.
    let saved: PromotionRecord =
        serde_json::from_slice(&fs::read(record_path(&current).unwrap()).unwrap()).unwrap();
    assert_eq!(saved, record);
    let f = artifact_fingerprint(&current).unwrap();
    marshal_model::policy::verify_promotion(&current, f, &keys).unwrap();
    let stranger = generate_key_pair(&tmp.path().join("other.key")).unwrap();
    let e = marshal_model::policy::verify_promotion(
        &current,
        f,
        &PromotionKeys::new(vec![stranger.public()]),
    )
    .unwrap_err();
    assert!(e.contains("unknown key"), "{e}");
    // A losing candidate afterwards, signed or not, keeps the promotion's signature.
    artifact(&candidate, "random", 3);
    for key in [Some(&signer), None] {
        let lost = promote_signed(
            &candidate,
            &current,
            &[inflation_spec()],
            &PromoteOptions::default(),
            key,
            &mut |_| {},
        )
        .unwrap();
        assert!(!lost.promoted);
        assert_eq!(lost.signature.as_ref(), Some(&sig));
        assert_eq!(lost.installed_sha256.as_deref(), Some(digest.as_str()));
        marshal_model::policy::verify_promotion(&current, f, &keys).unwrap();
    }
    // A candidate with no digest cannot be signed: refused before anything is written.
    #[cfg(unix)]
    {
        let before = fs::read(record_path(&current).unwrap()).unwrap();
        std::os::unix::fs::symlink(candidate.join("meta.json"), candidate.join("extra")).unwrap();
        let e = signed(&candidate).unwrap_err().to_string();
        assert!(
            e.contains("cannot be signed") && e.contains("a symlink"),
            "{e}"
        );
        assert_eq!(fs::read(record_path(&current).unwrap()).unwrap(), before);
    }
}

#[test]
fn a_first_install_needs_no_current_artifact() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&candidate, "fgd", 2);
    // No current artifact: a server would run its default fallback (FGD) everywhere, so
    // the candidate is judged against FGD; one that schedules as FGD is no better.
    let record = promote_on_inflation(&candidate, &current).unwrap();
    assert_eq!(record.current_hash, None);
    assert_eq!(record.traces[0].current_fallback, "fgd");
    assert!(!record.promoted);
    assert!(!current.exists());
    // Installing into an empty place is a plain rename.
    assert_eq!(install(&candidate, &current).unwrap(), None);
    assert_eq!(snapshot(&current), snapshot(&candidate));
}

#[test]
fn a_current_artifact_of_a_newer_schema_is_not_judged_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "random", 1);
    artifact(&candidate, "fgd", 2);
    let meta = current.join("meta.json");
    let text = fs::read_to_string(&meta).unwrap();
    let newer = text.replace(
        &format!("\"schema_version\": {POLICY_SCHEMA_VERSION}"),
        "\"schema_version\": 99",
    );
    assert_ne!(newer, text);
    fs::write(&meta, newer).unwrap();
    let before = snapshot(&current);
    let err = promote_on_inflation(&candidate, &current).unwrap_err();
    assert!(
        matches!(err, PromoteError::Current { .. })
            && err.to_string().contains("policy schema 99 is newer"),
        "{err}"
    );
    assert_eq!(snapshot(&current), before);
    // An older schema is what the server cannot load either: judged as missing.
    fs::write(
        &meta,
        text.replace(
            &format!("\"schema_version\": {POLICY_SCHEMA_VERSION}"),
            "\"schema_version\": 0",
        ),
    )
    .unwrap();
    let record = promote_on_inflation(&candidate, &current).unwrap();
    assert_eq!(record.current_hash, None);
}

#[test]
fn a_corrupt_candidate_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (current, candidate) = (tmp.path().join("current"), tmp.path().join("candidate"));
    artifact(&current, "random", 1);
    artifact(&candidate, "fgd", 2);
    let w = candidate.join("weights.bpk");
    let bytes = fs::read(&w).unwrap();
    fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let before = snapshot(&current);
    let err = promote_on_inflation(&candidate, &current).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, PromoteError::Candidate { .. })
            && text.contains("checksum")
            && text.contains("nothing was installed"),
        "{text}"
    );
    assert_eq!(snapshot(&current), before);
    assert!(!tmp.path().join("current.promotion.json").exists());
    // Installing it directly is refused too, and leaves no staging directory.
    assert!(install(&candidate, &current).is_err());
    assert_eq!(snapshot(&current), before);
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 2);
    // Bad settings are refused.
    let bad = PromoteOptions {
        max_regression: -0.1,
    };
    assert!(matches!(bad.validate(), Err(PromoteError::Settings(_))));
}

#[test]
fn the_rule_needs_no_regression_beyond_the_limit_and_one_gain() {
    let row = |current: f64, candidate: f64| TraceRow {
        trace: format!("t{current}"),
        objective: "replay".into(),
        seeds: vec![1],
        current,
        candidate,
        current_fallback: "topo-pack".into(),
        candidate_fallback: "topo-pack".into(),
        current_fallback_rate: 0.0,
        candidate_fallback_rate: 0.0,
        change: relative_change(current, candidate),
    };
    let opts = PromoteOptions::default();
    assert!(decide(&[row(100.0, 99.0), row(200.0, 203.9)], &opts).0);
    assert!(!decide(&[row(100.0, 99.0), row(200.0, 204.1)], &opts).0);
    assert!(!decide(&[row(100.0, 100.0), row(200.0, 200.0)], &opts).0);
    assert!(!decide(&[row(100.0, f64::NAN)], &opts).0);
    assert!(decide(&[row(0.0, 0.0), row(10.0, 9.0)], &opts).0);
    assert!(!decide(&[row(0.0, 1.0), row(10.0, 9.0)], &opts).0);
}
