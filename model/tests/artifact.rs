//! Artifact save/load round trip and every load failure.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use marshal_model::artifact::{self, FOLDS_DIR, LINEAR_RESIDUAL_FILE, META_FILE, WEIGHTS_FILE};
use marshal_model::{
    ARTIFACT_SCHEMA_VERSION, ArtifactInfo, DEFAULT_RIDGE, LinearResidual, ModelError,
    PlacementGraph, PredictorConfig, TrainedPredictor, fit, synthetic,
};

fn trained() -> (TrainedPredictor, Vec<PlacementGraph>) {
    let data = synthetic::dataset(48, 9, 0.05);
    let config = PredictorConfig::new()
        .with_hidden_size(8)
        .with_edge_hidden_size(4)
        .with_max_epochs(2)
        .with_seed(3);
    let predictor = fit(&data[..32], &data[32..], &config, &mut |_| {})
        .unwrap()
        .calibrate(&data[32..])
        .unwrap()
        .with_extrapolation(Some((0.5, 0.0)), &[(2.0, 1.0); 12])
        .unwrap();
    assert_eq!(predictor.calibration().extrapolation.slope, 1.0);
    let graphs = data[32..].iter().map(|(g, _)| g.clone()).collect();
    (predictor, graphs)
}

fn info() -> ArtifactInfo {
    ArtifactInfo {
        training_data_hash: "sha256:abc".into(),
        eval_scores: [("holdout_step_time_mape".to_string(), 12.5)].into(),
        attachments: BTreeMap::new(),
    }
}

fn saved() -> (tempfile::TempDir, TrainedPredictor, Vec<PlacementGraph>) {
    let dir = tempfile::tempdir().unwrap();
    let (predictor, graphs) = trained();
    artifact::save(dir.path(), &predictor, &info()).unwrap();
    (dir, predictor, graphs)
}

fn edit_meta(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(META_FILE);
    let mut meta: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut meta);
    fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap()).unwrap();
}

#[test]
fn round_trip_preserves_predictions_and_metadata() {
    let (dir, predictor, graphs) = saved();
    for file in [
        "weights.bpk",
        "config.json",
        "normalization.json",
        "meta.json",
    ] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let loaded = artifact::load(dir.path()).unwrap();
    assert_eq!(loaded.meta.schema_version, ARTIFACT_SCHEMA_VERSION);
    assert_eq!(loaded.meta.training_data_hash, "sha256:abc");
    assert_eq!(loaded.meta.eval_scores["holdout_step_time_mape"], 12.5);
    assert_eq!(loaded.predictor.config(), predictor.config());
    assert_eq!(loaded.predictor.normalization(), predictor.normalization());
    assert_eq!(loaded.predictor.summary(), predictor.summary());
    assert_eq!(loaded.predictor.calibration(), predictor.calibration());
    assert_eq!(loaded.meta.calibration, *predictor.calibration());
    assert_eq!(
        predictor.calibration().seen_residuals + predictor.calibration().novel_residuals,
        16
    );
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        predictor.predict(&graphs).unwrap()
    );
}

#[test]
fn missing_files_are_named() {
    for file in [
        "weights.bpk",
        "config.json",
        "normalization.json",
        "meta.json",
    ] {
        let (dir, _, _) = saved();
        fs::remove_file(dir.path().join(file)).unwrap();
        match artifact::load(dir.path()) {
            Err(ModelError::MissingFile { path }) => assert!(path.ends_with(file)),
            other => panic!("{file}: expected MissingFile, got {other:?}"),
        }
    }
}

#[test]
fn truncated_or_corrupt_weights_are_rejected() {
    let (dir, _, _) = saved();
    let weights = dir.path().join(WEIGHTS_FILE);
    let bytes = fs::read(&weights).unwrap();
    fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let err = artifact::load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptFile { .. }), "{err}");

    let mut flipped = bytes.clone();
    let mid = flipped.len() - 10;
    flipped[mid] ^= 0xff;
    fs::write(&weights, &flipped).unwrap();
    let err = artifact::load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptFile { .. }), "{err}");

    // Garbage with a matching checksum still fails cleanly inside burn's reader.
    fs::write(&weights, b"not a burnpack").unwrap();
    let sum = {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in b"not a burnpack" {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    };
    edit_meta(dir.path(), |m| m["weights_fnv1a64"] = sum.into());
    let err = artifact::load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptFile { .. }), "{err}");
}

#[test]
fn weights_of_a_different_shape_are_rejected() {
    let (dir, _, _) = saved();
    // A config whose hidden size disagrees with the stored weights.
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["hidden_size"] = 12.into();
    fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let err = artifact::load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::CorruptFile { .. }), "{err}");
}

#[test]
fn corrupt_json_is_rejected() {
    for file in ["config.json", "normalization.json", "meta.json"] {
        let (dir, _, _) = saved();
        fs::write(dir.path().join(file), b"{ truncated").unwrap();
        match artifact::load(dir.path()) {
            Err(ModelError::CorruptFile { path, .. }) => assert!(path.ends_with(file)),
            other => panic!("{file}: expected CorruptFile, got {other:?}"),
        }
    }
    let (dir, _, _) = saved();
    let path = dir.path().join("normalization.json");
    let mut norm: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    norm["gpu"]["std"][0] = (-1.0).into();
    fs::write(&path, serde_json::to_vec(&norm).unwrap()).unwrap();
    assert!(matches!(
        artifact::load(dir.path()),
        Err(ModelError::CorruptFile { .. })
    ));
}

#[test]
fn schema_version_mismatch_is_rejected() {
    let (dir, _, _) = saved();
    edit_meta(dir.path(), |m| m["schema_version"] = 999.into());
    match artifact::load(dir.path()) {
        Err(ModelError::SchemaVersion { found, expected }) => {
            assert_eq!((found, expected), (999, ARTIFACT_SCHEMA_VERSION));
        }
        other => panic!("expected SchemaVersion, got {other:?}"),
    }
}

#[test]
fn feature_count_and_layout_mismatches_are_rejected() {
    let (dir, _, _) = saved();
    edit_meta(dir.path(), |m| m["gpu_features"] = 11.into());
    match artifact::load(dir.path()) {
        Err(ModelError::FeatureCount { kind, found, .. }) => assert_eq!((kind, found), ("gpu", 11)),
        other => panic!("expected FeatureCount, got {other:?}"),
    }
    let (dir, _, _) = saved();
    edit_meta(dir.path(), |m| {
        m["job_feature_names"][3] = "something_else".into()
    });
    match artifact::load(dir.path()) {
        Err(ModelError::FeatureLayout { kind, .. }) => assert_eq!(kind, "job"),
        other => panic!("expected FeatureLayout, got {other:?}"),
    }
}

/// A named way of damaging `meta.json`.
type Damage = (&'static str, fn(&mut serde_json::Value));

#[test]
fn missing_or_corrupt_calibration_is_rejected() {
    let cases: [Damage; 7] = [
        ("extrapolation.weights", |m| {
            m["calibration"]["extrapolation"]["weights"] = serde_json::json!([0.5, 2.0])
        }),
        ("extrapolation.slope", |m| {
            m["calibration"]["extrapolation"]["slope"] = (-1.0).into()
        }),
        ("seen_multiplier", |m| {
            m["calibration"]["seen_multiplier"] = (-1.0).into()
        }),
        ("novel_multiplier", |m| {
            m["calibration"]["novel_multiplier"] = 0.0.into()
        }),
        ("training_shapes", |m| {
            m["calibration"]["training_shapes"] = serde_json::json!([])
        }),
        ("calibration", |m| {
            m.as_object_mut().unwrap().remove("calibration");
        }),
        ("seen_multiplier", |m| {
            m["calibration"]
                .as_object_mut()
                .unwrap()
                .remove("seen_multiplier");
        }),
    ];
    for (field, edit) in cases {
        let (dir, _, _) = saved();
        edit_meta(dir.path(), edit);
        match artifact::load(dir.path()) {
            Err(ModelError::CorruptFile { path, reason }) => {
                assert!(path.ends_with(META_FILE), "{}", path.display());
                assert!(reason.contains(field), "{field}: {reason}");
            }
            other => panic!("{field}: expected a corrupt meta.json, got {other:?}"),
        }
    }
}

/// An artifact written before the interval widened beyond the trained range loads and
/// means what it meant: no widening.
#[test]
fn an_artifact_without_an_extrapolation_record_loads_without_widening() {
    let (dir, predictor, graphs) = saved();
    edit_meta(dir.path(), |m| {
        m["calibration"]
            .as_object_mut()
            .unwrap()
            .remove("extrapolation");
    });
    let loaded = artifact::load(dir.path()).unwrap();
    let c = loaded.predictor.calibration();
    assert_eq!(c.extrapolation, Default::default());
    assert_eq!(
        (c.seen_multiplier, c.novel_multiplier),
        (
            predictor.calibration().seen_multiplier,
            predictor.calibration().novel_multiplier
        )
    );
    assert!(loaded.predictor.predict(&graphs).is_ok());
}

#[test]
fn normalization_without_training_ranges_is_rejected() {
    let (dir, _, _) = saved();
    let path = dir.path().join("normalization.json");
    let mut norm: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    norm["job"].as_object_mut().unwrap().remove("max");
    fs::write(&path, serde_json::to_vec(&norm).unwrap()).unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, .. }) => {
            assert!(path.ends_with("normalization.json"))
        }
        other => panic!("expected a corrupt normalization.json, got {other:?}"),
    }
}

/// A field this build does not know in `config.json`, `normalization.json` (at either
/// level) or `linear_residual.json` could change what the file means: refused, naming the
/// file and the field. `meta.json` is the forward-compatible file: an unknown field there
/// is ignored.
#[test]
fn unknown_fields_are_refused_except_in_meta_json() {
    let (dir, predictor, graphs) = saved_stacked();
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 4] = [
        ("config.json", |v| v["attention_heads"] = 4.into()),
        ("normalization.json", |v| v["log_inputs"] = true.into()),
        ("normalization.json", |v| {
            v["job"]["median"] = vec![0.0].into()
        }),
        (LINEAR_RESIDUAL_FILE, |v| {
            v["intercept_in_log2"] = true.into()
        }),
    ];
    for (file, edit) in edits {
        let path = dir.path().join(file);
        let original = fs::read(&path).unwrap();
        let mut value: serde_json::Value = serde_json::from_slice(&original).unwrap();
        edit(&mut value);
        fs::write(&path, serde_json::to_vec_pretty(&value).unwrap()).unwrap();
        match artifact::load(dir.path()) {
            Err(ModelError::CorruptFile { path, reason }) => {
                assert!(path.ends_with(file), "{file}: {}", path.display());
                assert!(reason.contains("unknown field"), "{file}: {reason}");
            }
            other => panic!("{file}: expected an unknown field refused, got {other:?}"),
        }
        fs::write(&path, original).unwrap();
    }
    edit_meta(dir.path(), |m| {
        m["added_later"] = "informational".into();
        m["calibration"]["added_later"] = 1.into();
    });
    let loaded = artifact::load(dir.path()).unwrap();
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        predictor.predict(&graphs).unwrap()
    );
}

/// A predictor with a linear residual and both novel weights, saved and damaged.
fn saved_stacked() -> (tempfile::TempDir, TrainedPredictor, Vec<PlacementGraph>) {
    let dir = tempfile::tempdir().unwrap();
    let (predictor, graphs) = trained();
    let data = synthetic::dataset(48, 9, 0.05);
    let linear = LinearResidual::fit(&data[..32], DEFAULT_RIDGE).unwrap();
    let predictor = predictor
        .with_linear_residual(linear)
        .unwrap()
        .with_novel_weights(0.4, 0.6)
        .unwrap();
    artifact::save(dir.path(), &predictor, &info()).unwrap();
    (dir, predictor, graphs)
}

#[test]
fn a_linear_residual_round_trips_and_its_absence_or_damage_is_named() {
    let (dir, predictor, graphs) = saved_stacked();
    let loaded = artifact::load(dir.path()).unwrap();
    assert_eq!(
        loaded.predictor.linear_residual(),
        predictor.linear_residual()
    );
    assert_eq!(loaded.predictor.calibration().novel_linear_weight, 0.6);
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        predictor.predict(&graphs).unwrap()
    );

    // Damaged: refused, naming the file.
    let file = dir.path().join(LINEAR_RESIDUAL_FILE);
    fs::write(&file, b"{\"weights\": [1.0").unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, .. }) => assert!(path.ends_with(LINEAR_RESIDUAL_FILE)),
        other => panic!("expected a corrupt linear residual, got {other:?}"),
    }
    let mut short: serde_json::Value =
        serde_json::to_value(predictor.linear_residual().unwrap()).unwrap();
    short["weights"].as_array_mut().unwrap().pop();
    fs::write(&file, serde_json::to_vec(&short).unwrap()).unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, reason }) => {
            assert!(path.ends_with(LINEAR_RESIDUAL_FILE));
            assert!(reason.contains("weights"), "{reason}");
        }
        other => panic!("expected a short linear residual refused, got {other:?}"),
    }

    // Missing while meta.json gives it a weight: refused, naming the weight.
    fs::remove_file(&file).unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, reason }) => {
            assert!(path.ends_with(META_FILE));
            assert!(reason.contains("novel_linear_weight"), "{reason}");
        }
        other => panic!("expected a missing linear residual refused, got {other:?}"),
    }

    // A predictor without one, saved over the directory, leaves no stale file behind.
    let (dir, _, _) = saved_stacked();
    let (plain, graphs) = trained();
    artifact::save(dir.path(), &plain, &info()).unwrap();
    assert!(!dir.path().join(LINEAR_RESIDUAL_FILE).exists());
    let loaded = artifact::load(dir.path()).unwrap();
    assert!(loaded.predictor.linear_residual().is_none());
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        plain.predict(&graphs).unwrap()
    );
}

/// A predictor keeping two fold networks (trained on halves of the training side).
fn saved_with_folds() -> (tempfile::TempDir, TrainedPredictor, Vec<PlacementGraph>) {
    let dir = tempfile::tempdir().unwrap();
    let (predictor, graphs) = trained();
    let data = synthetic::dataset(48, 9, 0.05);
    let fold = |train: &[(PlacementGraph, marshal_model::Targets)], seed| {
        let config = PredictorConfig::new()
            .with_hidden_size(8)
            .with_edge_hidden_size(4)
            .with_max_epochs(2)
            .with_seed(seed);
        fit(train, &data[32..], &config, &mut |_| {})
            .unwrap()
            .calibrate(&data[32..])
            .unwrap()
    };
    let predictor = predictor
        .with_fold_networks(vec![
            (
                fold(&data[..16], 4),
                (1..=12).map(|i| i as f32 / 4.0).collect(),
            ),
            (fold(&data[16..32], 5), vec![0.7; 12]),
        ])
        .unwrap();
    artifact::save(dir.path(), &predictor, &info()).unwrap();
    (dir, predictor, graphs)
}

#[test]
fn fold_networks_round_trip_and_a_missing_or_damaged_fold_is_named() {
    let (dir, predictor, graphs) = saved_with_folds();
    assert!(
        dir.path()
            .join(FOLDS_DIR)
            .join("1")
            .join(WEIGHTS_FILE)
            .exists()
    );
    let loaded = artifact::load(dir.path()).unwrap();
    assert_eq!(loaded.predictor.fold_networks().len(), 2);
    assert_eq!(
        loaded.meta.calibration.fold_ratios,
        predictor.calibration().fold_ratios
    );
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        predictor.predict(&graphs).unwrap()
    );

    // A fold's weights damaged: refused, naming that fold's file.
    let weights = dir.path().join(FOLDS_DIR).join("1").join(WEIGHTS_FILE);
    let bytes = fs::read(&weights).unwrap();
    fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, .. }) => assert_eq!(path, weights),
        other => panic!("expected a truncated fold refused, got {other:?}"),
    }
    // A fold missing: refused, naming its metadata.
    fs::remove_dir_all(dir.path().join(FOLDS_DIR).join("1")).unwrap();
    match artifact::load(dir.path()) {
        Err(ModelError::MissingFile { path }) => {
            assert!(
                path.ends_with(Path::new(FOLDS_DIR).join("1").join(META_FILE)),
                "{path:?}"
            )
        }
        other => panic!("expected a missing fold refused, got {other:?}"),
    }
    // Residual lists that are not residuals: refused by the calibration's check.
    let (dir, _, _) = saved_with_folds();
    edit_meta(dir.path(), |m| {
        m["calibration"]["fold_ratios"][0][3] = (-1.0).into()
    });
    match artifact::load(dir.path()) {
        Err(ModelError::CorruptFile { path, reason }) => {
            assert!(path.ends_with(META_FILE));
            assert!(reason.contains("fold_ratios[0]"), "{reason}");
        }
        other => panic!("expected negative residuals refused, got {other:?}"),
    }

    // Saved over by a predictor without folds: no stale fold directory, and the artifact
    // loads as one without folds (an older artifact's `meta.json` has no `fold_ratios`).
    let (dir, _, _) = saved_with_folds();
    let (plain, graphs) = trained();
    artifact::save(dir.path(), &plain, &info()).unwrap();
    assert!(!dir.path().join(FOLDS_DIR).exists());
    let loaded = artifact::load(dir.path()).unwrap();
    assert!(loaded.predictor.fold_networks().is_empty());
    assert_eq!(
        loaded.predictor.predict(&graphs).unwrap(),
        plain.predict(&graphs).unwrap()
    );
}

#[test]
fn attachments_are_checked_with_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (predictor, _) = trained();
    let with_history = ArtifactInfo {
        attachments: [("history.json".to_string(), b"[1, 2]".to_vec())].into(),
        ..info()
    };
    artifact::save(dir.path(), &predictor, &with_history).unwrap();
    assert_eq!(
        fs::read(dir.path().join("history.json")).unwrap(),
        b"[1, 2]"
    );
    artifact::load(dir.path()).unwrap();
    // Another run's history beside these weights (a retrain cut off halfway).
    fs::write(dir.path().join("history.json"), b"[3]").unwrap();
    let err = artifact::load(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("history.json") && err.contains("another training run"),
        "{err}"
    );
    fs::remove_file(dir.path().join("history.json")).unwrap();
    let err = artifact::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("history.json"), "{err}");
    // An attachment may not be a path, nor take an artifact file's name.
    for bad in [
        "../history.json",
        "meta.json",
        "sub/history.json",
        "linear_residual.json",
        "folds",
        ".history.json.tmp",
        "..",
        "",
    ] {
        let info = ArtifactInfo {
            attachments: [(bad.to_string(), b"x".to_vec())].into(),
            ..info()
        };
        let err = artifact::save(dir.path(), &predictor, &info)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a plain file name"), "{bad}: {err}");
    }
    // Nor may a meta.json name one, so a crafted artifact reads nothing outside it.
    let good = tempfile::tempdir().unwrap();
    artifact::save(good.path(), &predictor, &with_history).unwrap();
    fs::write(dir.path().join("outside.json"), b"[1, 2]").unwrap();
    let meta_path = good.path().join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
    let sum = meta["attachments_fnv1a64"]["history.json"].clone();
    let outside = dir.path().join("outside.json");
    meta["attachments_fnv1a64"] = serde_json::json!({ outside.to_str().unwrap(): sum });
    fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
    let err = artifact::load(good.path()).unwrap_err().to_string();
    assert!(
        err.contains("meta.json") && err.contains("not a plain file name"),
        "{err}"
    );
}
