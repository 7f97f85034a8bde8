//! Model artifacts: one directory per version.
//!
//! ```text
//! <dir>/weights.bpk          burn's burnpack weights (Module::save_file)
//! <dir>/config.json          PredictorConfig
//! <dir>/normalization.json   Normalization
//! <dir>/meta.json            ArtifactMeta: schema version, feature layout, data hash,
//!                            evaluation scores, training summary, interval
//!                            calibration, weights checksum
//! <dir>/linear_residual.json LinearResidual, when the predictor has one (optional:
//!                            without it the calibration's linear weight must be 0)
//! <dir>/folds/<k>/           the fold networks, each an artifact of this layout (without
//!                            folds of its own), one per `calibration.fold_ratios` list
//! ```
//!
//! [`load`] trusts nothing: every file must exist and parse, the schema version and feature
//! layout must match this build, and the weights must match the checksum recorded at save
//! time before burn reads them (burnpack maps tensor data lazily, so a truncated file would
//! otherwise fail late).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::module::Module;
use burn::tensor::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::calibration::Calibration;
use crate::config::PredictorConfig;
use crate::error::{ModelError, Result};
use crate::features::{
    GPU_FEATURE_NAMES, GPU_FEATURES, JOB_FEATURE_NAMES, JOB_FEATURES, LINK_FEATURE_NAMES,
    LINK_FEATURES, MEM_PHASE_NAMES, MEM_PHASES,
};
use crate::inference::TrainedPredictor;
use crate::network::PredictorNetwork;
use crate::normalize::Normalization;
use crate::residual::LinearResidual;
use crate::train::TrainingSummary;

/// Version of the artifact layout written and read by this build. Bump it whenever the
/// network architecture, a feature layout or a file format changes meaning.
pub const ARTIFACT_SCHEMA_VERSION: u32 = 3;

/// Weights file name.
pub const WEIGHTS_FILE: &str = "weights.bpk";
/// Configuration file name.
pub const CONFIG_FILE: &str = "config.json";
/// Normalisation file name.
pub const NORMALIZATION_FILE: &str = "normalization.json";
/// Metadata file name.
pub const META_FILE: &str = "meta.json";
/// Linear residual file name (optional).
pub const LINEAR_RESIDUAL_FILE: &str = "linear_residual.json";
/// Directory of the fold networks (optional), `folds/0`, `folds/1`, …
pub const FOLDS_DIR: &str = "folds";

/// What the caller knows about a model that the model itself does not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ArtifactInfo {
    /// Hash of the training data (computed by the caller over its inputs).
    pub training_data_hash: String,
    /// Evaluation scores by name, e.g. `"holdout_step_time_mape": 7.5`.
    pub eval_scores: BTreeMap<String, f64>,
    /// Files the caller keeps in the artifact (a plain file name → its bytes), such as
    /// the trainer's step history: written before `meta.json`, which records their
    /// checksums, and checked by [`load`], so that a file from another training run
    /// (a retrain into the same directory cut off halfway) is refused, not used.
    pub attachments: BTreeMap<String, Vec<u8>>,
}

/// Contents of `meta.json`.
///
/// Unlike the artifact's other files, `meta.json` (with [`Calibration`], [`TrainingSummary`]
/// and the calibration's [`crate::Extrapolation`]) ignores fields it does not know, on
/// purpose: it is the forward-compatible file. A field that keeps what the others mean
/// is added without a schema bump, optional, so that an older build ignores it (as
/// `attachments_fnv1a64`, and `novel_rule` and `novel_folds` in the calibration, were);
/// a change of meaning bumps [`ARTIFACT_SCHEMA_VERSION`], which [`load`] checks before
/// anything else is used. `config.json`, `normalization.json` and `linear_residual.json`
/// refuse unknown fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactMeta {
    /// [`ARTIFACT_SCHEMA_VERSION`] at save time.
    pub schema_version: u32,
    /// Version of this crate that wrote it.
    pub crate_version: String,
    /// Number of per-GPU features.
    pub gpu_features: usize,
    /// Number of per-link features.
    pub link_features: usize,
    /// Number of per-job features.
    pub job_features: usize,
    /// Number of memory phases.
    pub mem_phases: usize,
    /// Per-GPU feature names (for humans and layout checks).
    pub gpu_feature_names: Vec<String>,
    /// Per-link feature names.
    pub link_feature_names: Vec<String>,
    /// Per-job feature names.
    pub job_feature_names: Vec<String>,
    /// Memory phase names.
    pub mem_phase_names: Vec<String>,
    /// The caller's hash of the training data.
    pub training_data_hash: String,
    /// The caller's evaluation scores.
    pub eval_scores: BTreeMap<String, f64>,
    /// What training achieved.
    pub training: TrainingSummary,
    /// The step-time interval's calibration and the training shape classes.
    pub calibration: Calibration,
    /// FNV-1a 64 of `weights.bpk`, hex.
    pub weights_fnv1a64: String,
    /// FNV-1a 64 of each attachment ([`ArtifactInfo::attachments`]), hex, by file name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attachments_fnv1a64: BTreeMap<String, String>,
}

/// A loaded artifact.
#[derive(Debug, Clone)]
pub struct LoadedArtifact {
    /// The predictor, on the CPU (`flex`) device; see [`TrainedPredictor::to_device`].
    pub predictor: TrainedPredictor,
    /// Its metadata.
    pub meta: ArtifactMeta,
}

/// An attachment is a plain file name (no directory, not hidden, no `..`) that no file
/// or directory of the artifact itself uses, nor a temporary file while it is written.
fn check_attachment_name(name: &str) -> Result<(), String> {
    let plain = !name.starts_with('.') && Path::new(name).file_name().is_some_and(|n| n == name);
    let reserved = [
        META_FILE,
        CONFIG_FILE,
        WEIGHTS_FILE,
        NORMALIZATION_FILE,
        LINEAR_RESIDUAL_FILE,
        FOLDS_DIR,
    ]
    .contains(&name);
    if plain && !reserved {
        Ok(())
    } else {
        Err(format!(
            "attachment {name:?} is not a plain file name of its own"
        ))
    }
}

pub(crate) fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// FNV-1a 64-bit: a dependency-free checksum against truncation and bit rot (not security).
pub fn fnv1a64(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// Writes `predictor` to `dir` (created if needed; existing files are replaced).
pub fn save(dir: &Path, predictor: &TrainedPredictor, info: &ArtifactInfo) -> Result<ArtifactMeta> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let weights = dir.join(WEIGHTS_FILE);
    predictor
        .network()
        .clone()
        .save_file(&weights)
        .map_err(|e| ModelError::Backend(format!("writing {}: {e}", weights.display())))?;
    let bytes = fs::read(&weights).map_err(io_err(&weights))?;
    let meta = ArtifactMeta {
        schema_version: ARTIFACT_SCHEMA_VERSION,
        crate_version: env!("CARGO_PKG_VERSION").to_string(),
        gpu_features: GPU_FEATURES,
        link_features: LINK_FEATURES,
        job_features: JOB_FEATURES,
        mem_phases: MEM_PHASES,
        gpu_feature_names: names(&GPU_FEATURE_NAMES),
        link_feature_names: names(&LINK_FEATURE_NAMES),
        job_feature_names: names(&JOB_FEATURE_NAMES),
        mem_phase_names: names(&MEM_PHASE_NAMES),
        training_data_hash: info.training_data_hash.clone(),
        eval_scores: info.eval_scores.clone(),
        training: predictor.summary().clone(),
        calibration: predictor.calibration().clone(),
        weights_fnv1a64: fnv1a64(&bytes),
        attachments_fnv1a64: info
            .attachments
            .iter()
            .map(|(name, bytes)| (name.clone(), fnv1a64(bytes)))
            .collect(),
    };
    for (name, bytes) in &info.attachments {
        check_attachment_name(name).map_err(ModelError::Backend)?;
        replace_file(&dir.join(name), bytes)?;
    }
    let config = dir.join(CONFIG_FILE);
    predictor.config().save(&config).map_err(io_err(&config))?;
    write_json(&dir.join(NORMALIZATION_FILE), predictor.normalization())?;
    let linear = dir.join(LINEAR_RESIDUAL_FILE);
    match predictor.linear_residual() {
        Some(l) => write_json(&linear, l)?,
        // A directory reused for a new version must not keep the old one's residual.
        None if linear.exists() => fs::remove_file(&linear).map_err(io_err(&linear))?,
        None => {}
    }
    // A directory reused for a new version must not keep the old one's folds.
    let folds = dir.join(FOLDS_DIR);
    if folds.exists() {
        fs::remove_dir_all(&folds).map_err(io_err(&folds))?;
    }
    let fold_info = ArtifactInfo {
        attachments: BTreeMap::new(),
        ..info.clone()
    };
    for (k, fold) in predictor.fold_networks().iter().enumerate() {
        save(&folds.join(k.to_string()), fold, &fold_info)?;
    }
    write_json(&dir.join(META_FILE), &meta)?;
    Ok(meta)
}

pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::Backend(format!("serialising {}: {e}", path.display())))?;
    replace_file(path, text.as_bytes())
}

/// Writes `bytes` to `path` through a hidden temporary file in the same directory and a
/// rename (atomic on one file system). Hidden, so a directory fingerprint taken meanwhile
/// ignores it.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    if let Err(e) = write() {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io_err(path)(e)
    })?;
    sync_dir(path.parent().unwrap_or(Path::new("."))).map_err(io_err(path))
}

/// `fsync`s a directory so that a rename in it survives a power loss. File systems that
/// cannot sync a directory (they say "invalid argument" or "unsupported") have nothing
/// more to do.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    // A bare file name's parent is the empty path: the current directory.
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    match fs::File::open(dir).and_then(|d| d.sync_all()) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

/// Largest artifact file read, in bytes (the shipped policy is about 36 KB, predictors a
/// few MB).
pub const MAX_ARTIFACT_FILE_BYTES: u64 = 256 << 20;

/// Reads `path` if it is a regular file of at most [`MAX_ARTIFACT_FILE_BYTES`]. A FIFO
/// would block the reader forever and a device such as `/dev/zero` never ends, so
/// anything else is refused before it is opened (`InvalidData`, saying why).
///
/// A `.json` file's leading UTF-8 byte-order mark is dropped: editors on Windows add
/// one when a gate threshold is edited by hand, and serde_json refuses it as "expected
/// value at line 1 column 1", which does not say why.
pub fn read_regular_file(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = read_limited(path)?;
    if path.extension().is_some_and(|e| e == "json") && bytes.starts_with(UTF8_BOM) {
        bytes.drain(..UTF8_BOM.len());
    }
    Ok(bytes)
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

fn read_limited(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
    let meta = fs::metadata(path)?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    if meta.len() > MAX_ARTIFACT_FILE_BYTES {
        return Err(refuse(format!(
            "{} bytes, more than the {MAX_ARTIFACT_FILE_BYTES} an artifact file may hold",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    fs::File::open(path)?
        .take(MAX_ARTIFACT_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_ARTIFACT_FILE_BYTES {
        return Err(refuse("grew past the size limit while being read".into()));
    }
    Ok(bytes)
}

pub(crate) fn read(path: PathBuf) -> Result<(PathBuf, Vec<u8>)> {
    match read_regular_file(&path) {
        Ok(bytes) => Ok((path, bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(ModelError::MissingFile { path }),
        Err(source) => Err(ModelError::Io { path, source }),
    }
}

fn parse_json<T: for<'de> Deserialize<'de>>(path: &Path, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| ModelError::CorruptFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// (kind, count in the artifact, count in this build, names in the artifact, names here).
type Layout<'a> = (
    &'static str,
    usize,
    usize,
    &'a [String],
    &'static [&'static str],
);

fn check_layout(meta: &ArtifactMeta) -> Result<()> {
    if meta.schema_version != ARTIFACT_SCHEMA_VERSION {
        return Err(ModelError::SchemaVersion {
            found: meta.schema_version,
            expected: ARTIFACT_SCHEMA_VERSION,
        });
    }
    let layouts: [Layout<'_>; 4] = [
        (
            "gpu",
            meta.gpu_features,
            GPU_FEATURES,
            &meta.gpu_feature_names,
            &GPU_FEATURE_NAMES,
        ),
        (
            "link",
            meta.link_features,
            LINK_FEATURES,
            &meta.link_feature_names,
            &LINK_FEATURE_NAMES,
        ),
        (
            "job",
            meta.job_features,
            JOB_FEATURES,
            &meta.job_feature_names,
            &JOB_FEATURE_NAMES,
        ),
        (
            "memory-phase",
            meta.mem_phases,
            MEM_PHASES,
            &meta.mem_phase_names,
            &MEM_PHASE_NAMES,
        ),
    ];
    for (kind, found, expected, found_names, expected_names) in layouts {
        if found != expected {
            return Err(ModelError::FeatureCount {
                kind,
                found,
                expected,
            });
        }
        check_slots(kind, found_names, expected_names)?;
    }
    Ok(())
}

/// Checks that an artifact's feature slots are this build's, by count and by name (shared
/// by the predictor and the policy artifacts).
pub(crate) fn check_slots(kind: &'static str, found: &[String], expected: &[&str]) -> Result<()> {
    if found.len() != expected.len() {
        return Err(ModelError::FeatureCount {
            kind,
            found: found.len(),
            expected: expected.len(),
        });
    }
    if let Some(i) = (0..expected.len()).find(|&i| found[i] != expected[i]) {
        return Err(ModelError::FeatureLayout {
            kind,
            detail: format!(
                "slot {i} is `{}` in the artifact, `{}` in this build",
                found[i], expected[i]
            ),
        });
    }
    Ok(())
}

/// Reads and checks an artifact directory written by [`save`].
pub fn load(dir: &Path) -> Result<LoadedArtifact> {
    // Metadata first: a version or layout mismatch is reported before anything else is read.
    let (meta_path, meta_bytes) = read(dir.join(META_FILE))?;
    let meta: ArtifactMeta = parse_json(&meta_path, &meta_bytes)?;
    check_layout(&meta)?;
    meta.calibration
        .validate()
        .map_err(|e| ModelError::CorruptFile {
            path: meta_path.clone(),
            reason: e.to_string(),
        })?;

    let (config_path, config_bytes) = read(dir.join(CONFIG_FILE))?;
    let config = PredictorConfig::from_artifact_json(&config_bytes).map_err(|e| {
        ModelError::CorruptFile {
            path: config_path.clone(),
            reason: e.to_string(),
        }
    })?;
    config.validate().map_err(|e| ModelError::CorruptFile {
        path: config_path,
        reason: e.to_string(),
    })?;

    let (norm_path, norm_bytes) = read(dir.join(NORMALIZATION_FILE))?;
    let normalization: Normalization = parse_json(&norm_path, &norm_bytes)?;
    normalization
        .validate()
        .map_err(|e| ModelError::CorruptFile {
            path: norm_path,
            reason: e.to_string(),
        })?;

    let (weights_path, weights_bytes) = read(dir.join(WEIGHTS_FILE))?;
    let checksum = fnv1a64(&weights_bytes);
    if checksum != meta.weights_fnv1a64 {
        return Err(ModelError::CorruptFile {
            path: weights_path,
            reason: format!(
                "checksum {checksum} differs from {} recorded in meta.json (truncated or modified)",
                meta.weights_fnv1a64
            ),
        });
    }
    for (name, want) in &meta.attachments_fnv1a64 {
        // A crafted meta.json must not make the loader read outside the directory.
        check_attachment_name(name).map_err(|reason| ModelError::CorruptFile {
            path: dir.join(META_FILE),
            reason,
        })?;
        let (path, bytes) = read(dir.join(name))?;
        let have = fnv1a64(&bytes);
        if &have != want {
            return Err(ModelError::CorruptFile {
                path,
                reason: format!(
                    "checksum {have} differs from {want} recorded in meta.json (from another training run, or modified)"
                ),
            });
        }
    }
    let device = Device::flex();
    // The seed is irrelevant: every parameter is overwritten by the loaded record.
    let skeleton = PredictorNetwork::init(&config, &mut ChaCha8Rng::seed_from_u64(0), &device);
    let network = skeleton
        .try_load_file(&weights_path)
        .map_err(|e| ModelError::CorruptFile {
            path: weights_path,
            reason: e.to_string(),
        })?;
    let mut predictor = TrainedPredictor::from_parts(
        config,
        normalization,
        network,
        meta.training.clone(),
        meta.calibration.clone(),
        device,
    )?;
    let linear_path = dir.join(LINEAR_RESIDUAL_FILE);
    if linear_path.exists() {
        let (path, bytes) = read(linear_path)?;
        let linear: LinearResidual = parse_json(&path, &bytes)?;
        predictor =
            predictor
                .with_linear_residual(linear)
                .map_err(|e| ModelError::CorruptFile {
                    path,
                    reason: e.to_string(),
                })?;
    }
    predictor
        .check_linear()
        .map_err(|e| ModelError::CorruptFile {
            path: dir.join(META_FILE),
            reason: e.to_string(),
        })?;
    let folds = (0..meta.calibration.fold_ratios.len())
        .map(|k| {
            let dir = dir.join(FOLDS_DIR).join(k.to_string());
            let fold = load(&dir)?.predictor;
            predictor
                .check_fold(k, &fold)
                .map_err(|e| ModelError::CorruptFile {
                    path: dir.join(META_FILE),
                    reason: e.to_string(),
                })?;
            Ok(fold)
        })
        .collect::<Result<Vec<_>>>()?;
    let predictor = predictor.with_loaded_folds(folds)?;
    Ok(LoadedArtifact { predictor, meta })
}
