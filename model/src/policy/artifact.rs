//! Policy artifacts: one directory per version.
//!
//! ```text
//! <dir>/weights.bpk          burn's burnpack weights of the PolicyNetwork
//! <dir>/config.json          PolicyConfig
//! <dir>/normalization.json   FeatureStats (standardisation + distance percentile)
//! <dir>/meta.json            PolicyMeta: schema version, feature layout, gate thresholds
//!                            (the trained one and any per-fallback ones), fallback
//!                            heuristics, data hash, evaluation scores, checksum
//! ```
//! [`load_policy`] trusts nothing: every file must exist and parse, the schema version and
//! the feature layout must match this build, and the weights must match their checksum.
//!
//! Per-fallback thresholds (`gates`, written by [`write_fallback_gate`]) were added without
//! a schema bump: the field is optional, so an artifact without it loads and means what
//! it always meant (its one threshold serves the fallbacks it was trained with), and an
//! older build ignores the field.
//!
//! So was `candidates`, the candidate set the network was trained to rank: absent means
//! [`CandidateSet::Ranked`], the only set before it, and an older build, which ignores the
//! field, would serve a `wide` model with ranked candidates only (a subset of what it was
//! trained on, so still a valid ranking, not a different meaning).
//!
//! So was `decline`, the decline head (module `decline`): absent means the policy never
//! declines a share, as before it; a build before it ignores it, and a head of other
//! inputs than this build's is kept but not used (module `decline` says more).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::config::Config;
use burn::module::Module;
use burn::tensor::Device;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::config::PolicyConfig;
use super::decline::DeclineHead;
use super::features::{CANDIDATE_FEATURE_NAMES, JOB_FEATURE_NAMES};
use super::network::PolicyNetwork;
use super::scorer::{FeatureStats, PolicyScorer};
use crate::artifact::{fnv1a64, io_err, names, read, replace_file, write_json};
use crate::error::{ModelError, Result};

/// Layout version of policy artifacts. Bump when the network, a feature slot or a file
/// changes meaning.
pub const POLICY_SCHEMA_VERSION: u32 = 1;

pub(crate) const WEIGHTS_FILE: &str = "weights.bpk";
const CONFIG_FILE: &str = "config.json";
const STATS_FILE: &str = "normalization.json";
pub(crate) const META_FILE: &str = "meta.json";

/// Contents of `meta.json`. Fields it does not know are ignored, on purpose: `meta.json`
/// is the forward-compatible file (`gates` and `candidates` were added without a schema
/// bump, module docs), and a change of meaning bumps [`POLICY_SCHEMA_VERSION`], which
/// [`load_policy`] reads and checks first. `config.json` and `normalization.json` refuse
/// unknown fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyMeta {
    pub schema_version: u32,
    pub crate_version: String,
    pub job_feature_names: Vec<String>,
    pub candidate_feature_names: Vec<String>,
    /// The gate sends a decision to the fallback when the probability margin is below this
    /// (chosen on validation traces by the trainer).
    pub margin_threshold: f32,
    /// … or when the input distance exceeds this.
    pub distance_limit: f32,
    /// Fallback heuristic per objective (`"replay"`, `"inflation"`).
    pub fallback: BTreeMap<String, String>,
    /// Hash of the traces and settings trained on (computed by the caller).
    pub training_data_hash: String,
    /// Evaluation scores by name.
    pub eval_scores: BTreeMap<String, f64>,
    /// Training settings and summary (episodes, seconds, …) by name.
    pub training: BTreeMap<String, f64>,
    /// FNV-1a 64 of `weights.bpk`, hex.
    pub weights_fnv1a64: String,
    /// Margin thresholds chosen afterwards for other fallback heuristics (`marshal train
    /// gate`), by heuristic name. Takes precedence over `margin_threshold`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gates: BTreeMap<String, FallbackGate>,
    /// Which candidate placements the network was trained to rank; the scheduler serves it
    /// with the same set.
    #[serde(default, skip_serializing_if = "CandidateSet::is_ranked")]
    pub candidates: CandidateSet,
    /// The decline head (`marshal train decline`), when one was trained: whether to leave
    /// a GPU share unplaced rather than open an idle GPU for it (inflation only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline: Option<DeclineHead>,
}

/// The candidate placements the scheduler generates for the network to rank (module
/// `policies::learned::candidates` of the scheduler says how).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CandidateSet {
    /// The fallback's choice, then the best few nodes by FGD and by best fit (one
    /// worker), or the tightest-domain, best-fit and packing gangs (several workers).
    #[default]
    Ranked,
    /// `Ranked`, then, for a one-worker job, the first node of each further class of place
    /// it could go (GPU model, free capacity, idle GPUs, …) until every candidate slot is
    /// used: places far down FGD's and best fit's rankings.
    Wide,
}

impl CandidateSet {
    pub fn is_ranked(&self) -> bool {
        *self == CandidateSet::Ranked
    }

    /// The set's name in `meta.json` and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CandidateSet::Ranked => "ranked",
            CandidateSet::Wide => "wide",
        }
    }
}

impl std::str::FromStr for CandidateSet {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ranked" => Ok(CandidateSet::Ranked),
            "wide" => Ok(CandidateSet::Wide),
            other => Err(format!(
                "unknown candidate set {other:?}: expected `ranked` or `wide`"
            )),
        }
    }
}

/// A margin threshold chosen on validation episodes for one fallback heuristic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FallbackGate {
    /// The gate's margin threshold with this fallback (above 1: always fall back, since
    /// no threshold was within the tolerance).
    pub margin_threshold: f32,
    /// Largest relative worsening against the fallback that was allowed per episode.
    pub tolerance: f64,
    /// The validation episodes (`TRACE seed N`) it was chosen on.
    pub episodes: Vec<String>,
    /// Their scores with the chosen threshold: `<episode>/fallback`, `/gated`, `/ungated`,
    /// `/fallback_rate`, as in `eval_scores`.
    pub scores: BTreeMap<String, f64>,
}

/// A loaded policy.
#[derive(Debug, Clone)]
pub struct PolicyArtifact {
    pub scorer: PolicyScorer,
    pub config: PolicyConfig,
    pub meta: PolicyMeta,
}

/// Writes a policy to `dir`. `meta`'s layout, version and checksum fields are filled here.
pub fn save_policy(
    dir: &Path,
    network: &PolicyNetwork,
    config: &PolicyConfig,
    stats: &FeatureStats,
    mut meta: PolicyMeta,
) -> Result<PolicyMeta> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let weights = dir.join(WEIGHTS_FILE);
    network
        .clone()
        .save_file(&weights)
        .map_err(|e| ModelError::Backend(format!("writing {}: {e}", weights.display())))?;
    let bytes = fs::read(&weights).map_err(io_err(&weights))?;
    meta.schema_version = POLICY_SCHEMA_VERSION;
    meta.crate_version = env!("CARGO_PKG_VERSION").to_string();
    meta.job_feature_names = names(&JOB_FEATURE_NAMES);
    meta.candidate_feature_names = names(&CANDIDATE_FEATURE_NAMES);
    meta.weights_fnv1a64 = fnv1a64(&bytes);
    let config_path = dir.join(CONFIG_FILE);
    config.save(&config_path).map_err(io_err(&config_path))?;
    write_json(&dir.join(STATS_FILE), stats)?;
    write_json(&dir.join(META_FILE), &meta)?;
    Ok(meta)
}

impl PolicyMeta {
    /// Metadata with the caller's fields; layout fields are filled by [`save_policy`].
    pub fn new(margin_threshold: f32, distance_limit: f32) -> PolicyMeta {
        PolicyMeta {
            schema_version: POLICY_SCHEMA_VERSION,
            crate_version: String::new(),
            job_feature_names: Vec::new(),
            candidate_feature_names: Vec::new(),
            margin_threshold,
            distance_limit,
            fallback: BTreeMap::new(),
            training_data_hash: String::new(),
            eval_scores: BTreeMap::new(),
            training: BTreeMap::new(),
            weights_fnv1a64: String::new(),
            gates: BTreeMap::new(),
            candidates: CandidateSet::Ranked,
            decline: None,
        }
    }

    /// The margin threshold chosen for `fallback`: its own entry in `gates`, else the
    /// trained threshold when `fallback` is one the artifact was trained with (a value of
    /// `fallback`), else `None` — nobody chose a threshold for that heuristic.
    pub fn margin_threshold_for(&self, fallback: &str) -> Option<f32> {
        if let Some(g) = self.gates.get(fallback) {
            return Some(g.margin_threshold);
        }
        self.fallback
            .values()
            .any(|f| f == fallback)
            .then_some(self.margin_threshold)
    }
}

fn corrupt(path: &Path, reason: impl ToString) -> ModelError {
    ModelError::CorruptFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Reads and checks a policy directory written by [`save_policy`].
pub fn load_policy(dir: &Path) -> Result<PolicyArtifact> {
    load_policy_and_weights(dir).map(|(artifact, _)| artifact)
}

/// [`load_policy`], and the weights file's bytes it checked: a network built from them
/// is the one checked (reading the file again could meet a newer artifact written
/// meanwhile, beside the older configuration).
pub(crate) fn load_policy_and_weights(dir: &Path) -> Result<(PolicyArtifact, Vec<u8>)> {
    let (meta_path, meta_bytes) = read(dir.join(META_FILE))?;
    // The version is read on its own first: a model from another schema may lack fields
    // this build expects, and should be refused as "other version", not as "corrupt".
    #[derive(Deserialize)]
    struct Version {
        schema_version: u32,
    }
    let version: Version =
        serde_json::from_slice(&meta_bytes).map_err(|e| corrupt(&meta_path, e))?;
    if version.schema_version != POLICY_SCHEMA_VERSION {
        return Err(ModelError::SchemaVersion {
            found: version.schema_version,
            expected: POLICY_SCHEMA_VERSION,
        });
    }
    let meta: PolicyMeta =
        serde_json::from_slice(&meta_bytes).map_err(|e| corrupt(&meta_path, e))?;
    crate::artifact::check_slots("policy job", &meta.job_feature_names, &JOB_FEATURE_NAMES)?;
    crate::artifact::check_slots(
        "policy candidate",
        &meta.candidate_feature_names,
        &CANDIDATE_FEATURE_NAMES,
    )?;
    // A margin is never negative, so a negative threshold would turn the gate off
    // without a word; 0 (never hand over on the margin) is a choice training can make.
    let usable_margin = |t: f32| t.is_finite() && t >= 0.0;
    if !(usable_margin(meta.margin_threshold)
        && meta.distance_limit.is_finite()
        && meta.distance_limit > 0.0)
    {
        return Err(corrupt(
            &meta_path,
            format!(
                "gate thresholds must be finite, the margin threshold at least 0 and the \
                 distance limit positive (margin {}, distance {})",
                meta.margin_threshold, meta.distance_limit
            ),
        ));
    }
    if let Some((name, g)) = meta
        .gates
        .iter()
        .find(|(_, g)| !usable_margin(g.margin_threshold))
    {
        return Err(corrupt(
            &meta_path,
            format!(
                "the gate threshold for fallback {name} is {}; it must be a finite number, \
                 at least 0",
                g.margin_threshold
            ),
        ));
    }
    // A head of another build's inputs is kept but never used (`layout_error`); one of
    // this build's inputs must be usable.
    if let Some(head) = meta.decline.as_ref().filter(|h| h.layout_error().is_none()) {
        head.validate().map_err(|e| corrupt(&meta_path, e))?;
    }
    let (config_path, config_bytes) = read(dir.join(CONFIG_FILE))?;
    let config =
        PolicyConfig::from_artifact_json(&config_bytes).map_err(|e| corrupt(&config_path, e))?;
    config.validate().map_err(|e| corrupt(&config_path, e))?;
    let (stats_path, stats_bytes) = read(dir.join(STATS_FILE))?;
    let stats: FeatureStats =
        serde_json::from_slice(&stats_bytes).map_err(|e| corrupt(&stats_path, e))?;
    stats.validate().map_err(|e| corrupt(&stats_path, e))?;
    let (weights_path, weights_bytes) = read(dir.join(WEIGHTS_FILE))?;
    let checksum = fnv1a64(&weights_bytes);
    if checksum != meta.weights_fnv1a64 {
        return Err(corrupt(
            &weights_path,
            format!(
                "checksum {checksum} differs from {} recorded in meta.json (truncated or modified)",
                meta.weights_fnv1a64
            ),
        ));
    }
    let network = load_network(
        &weights_path,
        weights_bytes.clone(),
        &config,
        &Device::flex(),
    )?;
    // The statistics were checked above: what is left to refuse is in the weights.
    let scorer = PolicyScorer::new(&network, stats).map_err(|e| corrupt(&weights_path, e))?;
    Ok((
        PolicyArtifact {
            scorer,
            config,
            meta,
        },
        weights_bytes,
    ))
}

/// Records `gate` as the threshold for `fallback` in the artifact in `dir`, replacing any
/// earlier one for that heuristic. The artifact is checked first ([`load_policy`]), and
/// `meta.json` is replaced atomically (written to a hidden sibling, synced, renamed), so
/// a reader — `marshal serve` polling the directory — sees the old or the new file,
/// never a half-written one. Returns the new metadata.
pub fn write_fallback_gate(dir: &Path, fallback: &str, gate: FallbackGate) -> Result<PolicyMeta> {
    if !gate.margin_threshold.is_finite() {
        return Err(ModelError::InvalidInput {
            field: format!("gates.{fallback}.margin_threshold"),
            reason: "must be finite".into(),
        });
    }
    let mut meta = load_policy(dir)?.meta;
    meta.gates.insert(fallback.to_string(), gate);
    let text = serde_json::to_string_pretty(&meta)
        .map_err(|e| ModelError::Backend(format!("serialising meta.json: {e}")))?;
    replace_file(&dir.join(META_FILE), text.as_bytes())?;
    Ok(meta)
}

/// FNV-1a 64 over the names, sizes and contents of the regular, non-hidden files in
/// `dir` (an artifact is a few small files); `None` when it cannot be read. This is the
/// artifact's version: `marshal serve` reloads when it changes and reports it, and
/// `marshal model promote` records it.
pub fn artifact_fingerprint(dir: &Path) -> Option<u64> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for f in files {
        let bytes = crate::artifact::read_regular_file(&f).ok()?;
        eat(f.file_name()?.to_string_lossy().as_bytes());
        eat(&(bytes.len() as u64).to_le_bytes());
        eat(&bytes);
    }
    Some(h)
}

/// The weights of the policy in `dir` on `device` (an autodiff device to go on training).
/// Call after [`load_policy`] has checked the directory.
/// The network whose weights file (read from `weights_path`) holds `bytes`.
pub(crate) fn load_network(
    weights_path: &Path,
    bytes: Vec<u8>,
    config: &PolicyConfig,
    device: &Device,
) -> Result<PolicyNetwork> {
    // Every parameter is overwritten by the loaded record; the seed is irrelevant.
    let skeleton = PolicyNetwork::init(config, &mut ChaCha8Rng::seed_from_u64(0), device);
    let record = burn::store::ModuleRecord::from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
        .map_err(|e| corrupt(weights_path, e))?;
    skeleton
        .try_load_record(record)
        .map_err(|e| corrupt(weights_path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::features::{CANDIDATE_FEATURES, DecisionFeatures, JOB_FEATURES};

    fn saved(dir: &Path) -> PolicyScorer {
        let d = DecisionFeatures {
            job: [1.0; JOB_FEATURES],
            candidates: vec![[0.5; CANDIDATE_FEATURES], [2.0; CANDIDATE_FEATURES]],
        };
        let stats = FeatureStats::fit(&[&d]);
        let config = PolicyConfig::new().with_hidden_size(8);
        let net = PolicyNetwork::init(&config, &mut ChaCha8Rng::seed_from_u64(3), &Device::flex());
        let mut meta = PolicyMeta::new(0.2, 5.0);
        meta.fallback.insert("replay".into(), "topo-pack".into());
        save_policy(dir, &net, &config, &stats, meta).unwrap();
        PolicyScorer::new(&net, stats).unwrap()
    }

    #[test]
    fn a_decline_head_is_recorded_kept_and_a_damaged_one_refuses_the_artifact_but_an_older_one_is_only_unused()
     {
        use crate::policy::decline::{DECLINE_FEATURES, DeclineHead, write_decline_head};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        assert_eq!(load_policy(&dir).unwrap().meta.decline, None);
        let head = DeclineHead::new(
            vec![0.5; DECLINE_FEATURES],
            vec![[0.0, 1.0]; DECLINE_FEATURES],
            "fgd",
            0.2,
        );
        write_decline_head(&dir, Some(head.clone())).unwrap();
        let meta = load_policy(&dir).unwrap().meta;
        assert_eq!(meta.decline, Some(head.clone()));
        // The rest of meta.json is as it was.
        assert_eq!(meta.margin_threshold, 0.2);
        // A head that does not validate is refused before anything is written …
        let mut nan = head.clone();
        nan.weights[1] = f32::NAN;
        assert!(write_decline_head(&dir, Some(nan)).is_err());
        assert_eq!(load_policy(&dir).unwrap().meta.decline, Some(head.clone()));
        // … and one damaged in the file refuses the whole artifact, naming meta.json.
        let path = dir.join(META_FILE);
        let text = fs::read_to_string(&path).unwrap();
        let mut damaged: serde_json::Value = serde_json::from_str(&text).unwrap();
        damaged["decline"]["input_range"][2] = serde_json::json!([1.0, 0.0]);
        fs::write(&path, damaged.to_string()).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(
            err.contains("meta.json") && err.contains("not a range"),
            "{err}"
        );
        // A head of another build's inputs (the seven before the pressures) is kept,
        // not used, and replaced by the next head written.
        let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
        for key in ["feature_names", "weights", "input_range"] {
            older["decline"][key].as_array_mut().unwrap().truncate(7);
        }
        // (Its numbers are not checked: it is never used.)
        older["decline"]["input_range"][1] = serde_json::json!([1.0, 0.0]);
        fs::write(&path, older.to_string()).unwrap();
        let kept = load_policy(&dir).unwrap().meta.decline.unwrap();
        assert!(kept.layout_error().unwrap().contains("differ"), "{kept:?}");
        assert_eq!(
            kept.decide(&[1.0; DECLINE_FEATURES]),
            crate::policy::DeclineVerdict::OutOfRange
        );
        write_decline_head(&dir, Some(head.clone())).unwrap();
        assert_eq!(load_policy(&dir).unwrap().meta.decline, Some(head.clone()));
        // A share-ties switch with a damaged bound refuses the artifact too; one of
        // another build's inputs leaves the head unused, kept.
        let mut with_ties = head.clone();
        with_ties.share_ties = Some(crate::policy::ShareTies::new(vec![[0.0, 1.0]; 4]));
        write_decline_head(&dir, Some(with_ties.clone())).unwrap();
        assert_eq!(load_policy(&dir).unwrap().meta.decline, Some(with_ties));
        let text = fs::read_to_string(&path).unwrap();
        let mut damaged: serde_json::Value = serde_json::from_str(&text).unwrap();
        damaged["decline"]["share_ties"]["bounds"][1] = serde_json::json!([0.2, 0.1]);
        fs::write(&path, damaged.to_string()).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(
            err.contains("meta.json") && err.contains("share-ties bounds"),
            "{err}"
        );
        let mut older: serde_json::Value = serde_json::from_str(&text).unwrap();
        older["decline"]["share_ties"]["bounds"]
            .as_array_mut()
            .unwrap()
            .truncate(3);
        fs::write(&path, older.to_string()).unwrap();
        let kept = load_policy(&dir).unwrap().meta.decline.unwrap();
        assert!(
            kept.layout_error().unwrap().contains("3 bounds"),
            "{kept:?}"
        );
        // Removing it leaves an artifact that never declines.
        write_decline_head(&dir, None).unwrap();
        assert_eq!(load_policy(&dir).unwrap().meta.decline, None);
    }

    #[test]
    fn round_trip_and_every_kind_of_damage_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let scorer = saved(&dir);
        let loaded = load_policy(&dir).unwrap();
        assert_eq!(loaded.scorer, scorer);
        assert_eq!(loaded.meta.fallback["replay"], "topo-pack");

        // Missing directory.
        let err = load_policy(&tmp.path().join("nope")).unwrap_err();
        assert!(matches!(err, ModelError::MissingFile { .. }), "{err}");
        // Truncated weights.
        let w = dir.join(WEIGHTS_FILE);
        let bytes = fs::read(&w).unwrap();
        fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        fs::write(&w, &bytes).unwrap();
        // Another schema.
        let m = dir.join(META_FILE);
        let text = fs::read_to_string(&m).unwrap();
        fs::write(
            &m,
            text.replace("\"schema_version\": 1", "\"schema_version\": 99"),
        )
        .unwrap();
        let err = load_policy(&dir).unwrap_err();
        assert!(
            matches!(err, ModelError::SchemaVersion { found: 99, .. }),
            "{err}"
        );
        // Another feature layout.
        fs::write(&m, text.replace("fgd_score", "something_else")).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(err.contains("fgd_score"), "{err}");
        fs::write(&m, &text).unwrap();
        // A non-finite per-fallback threshold.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["gates"] = serde_json::json!({"tiresias": {"margin_threshold": null,
            "tolerance": 0.01, "episodes": [], "scores": {}}});
        fs::write(&m, v.to_string()).unwrap();
        assert!(load_policy(&dir).is_err());
        // Garbage metadata.
        fs::write(&m, "{not json").unwrap();
        assert!(matches!(
            load_policy(&dir).unwrap_err(),
            ModelError::CorruptFile { .. }
        ));
    }

    #[test]
    fn weights_that_are_not_numbers_are_refused_though_their_checksum_matches() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let d = DecisionFeatures {
            job: [1.0; JOB_FEATURES],
            candidates: vec![[0.5; CANDIDATE_FEATURES], [2.0; CANDIDATE_FEATURES]],
        };
        let config = PolicyConfig::new().with_hidden_size(8);
        let mut net =
            PolicyNetwork::init(&config, &mut ChaCha8Rng::seed_from_u64(3), &Device::flex());
        net.hidden2.weight = net.hidden2.weight.map(|w| w.mul_scalar(f32::NAN));
        let meta = PolicyMeta::new(0.2, 5.0);
        save_policy(&dir, &net, &config, &FeatureStats::fit(&[&d]), meta).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(
            err.contains(WEIGHTS_FILE) && err.contains("not finite"),
            "{err}"
        );
    }

    #[test]
    fn a_negative_or_infinite_gate_threshold_is_refused_not_a_silent_open_gate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        let text = fs::read_to_string(dir.join(META_FILE)).unwrap();
        let set = |from: &str, to: &str| {
            assert!(text.contains(from), "{text}");
            fs::write(dir.join(META_FILE), text.replace(from, to)).unwrap();
            load_policy(&dir).map(|_| ()).map_err(|e| e.to_string())
        };
        let err = set("\"margin_threshold\": 0.2", "\"margin_threshold\": -5.0").unwrap_err();
        assert!(err.contains("margin -5"), "{err}");
        let err = set("\"distance_limit\": 5.0", "\"distance_limit\": 0.0").unwrap_err();
        assert!(err.contains("distance 0"), "{err}");
        set("\"margin_threshold\": 0.2", "\"margin_threshold\": 0.0").unwrap();
        let gated = text.replace(
            "\"margin_threshold\": 0.2",
            "\"margin_threshold\": 0.2, \"gates\": {\"tiresias\": {\"margin_threshold\": -1.0, \
             \"tolerance\": 0.02, \"episodes\": [], \"scores\": {}}}",
        );
        fs::write(dir.join(META_FILE), gated).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(err.contains("fallback tiresias is -1"), "{err}");
    }

    #[test]
    fn json_files_saved_with_a_byte_order_mark_load_as_without_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        let before = load_policy(&dir).unwrap();
        for file in [META_FILE, CONFIG_FILE, STATS_FILE] {
            let text = fs::read(dir.join(file)).unwrap();
            fs::write(dir.join(file), [b"\xEF\xBB\xBF".as_slice(), &text].concat()).unwrap();
        }
        let after = load_policy(&dir).unwrap();
        assert_eq!(after.meta, before.meta);
        // A mark anywhere else is still damage.
        let text = fs::read(dir.join(META_FILE)).unwrap();
        fs::write(
            dir.join(META_FILE),
            [&text, b"\xEF\xBB\xBF".as_slice()].concat(),
        )
        .unwrap();
        assert!(matches!(
            load_policy(&dir).unwrap_err(),
            ModelError::CorruptFile { .. }
        ));
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_device_in_place_of_a_file_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        fs::remove_file(dir.join(META_FILE)).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(dir.join(META_FILE))
            .status();
        if status.is_ok_and(|s| s.success()) {
            let err = load_policy(&dir).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
            fs::remove_file(dir.join(META_FILE)).unwrap();
        }
        std::os::unix::fs::symlink("/dev/zero", dir.join(META_FILE)).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
    }

    #[test]
    fn unknown_fields_are_refused_in_config_and_normalization_but_not_in_meta() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        let scorer = saved(&dir);
        for file in [CONFIG_FILE, STATS_FILE] {
            let path = dir.join(file);
            let original = fs::read(&path).unwrap();
            let mut value: serde_json::Value = serde_json::from_slice(&original).unwrap();
            value["residual_connection"] = true.into();
            fs::write(&path, value.to_string()).unwrap();
            match load_policy(&dir) {
                Err(ModelError::CorruptFile { path, reason }) => {
                    assert!(path.ends_with(file), "{file}: {}", path.display());
                    assert!(
                        reason.contains("unknown field `residual_connection`"),
                        "{file}: {reason}"
                    );
                }
                other => panic!("{file}: expected an unknown field refused, got {other:?}"),
            }
            fs::write(&path, original).unwrap();
        }
        // meta.json is forward-compatible: a later optional field is ignored.
        let m = dir.join(META_FILE);
        let mut meta: serde_json::Value = serde_json::from_slice(&fs::read(&m).unwrap()).unwrap();
        meta["added_later"] = "informational".into();
        fs::write(&m, meta.to_string()).unwrap();
        assert_eq!(load_policy(&dir).unwrap().scorer, scorer);
    }

    #[test]
    fn a_meta_without_per_fallback_gates_loads_and_keeps_its_meaning() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        let text = fs::read_to_string(dir.join(META_FILE)).unwrap();
        // What an artifact written before per-fallback gates looks like.
        assert!(!text.contains("\"gates\""), "{text}");
        let meta = load_policy(&dir).unwrap().meta;
        assert!(meta.gates.is_empty());
        assert_eq!(meta.margin_threshold_for("topo-pack"), Some(0.2));
        assert_eq!(meta.margin_threshold_for("tiresias"), None);
    }

    #[test]
    fn the_candidate_set_is_recorded_kept_and_absent_means_ranked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        let text = fs::read_to_string(dir.join(META_FILE)).unwrap();
        // An artifact of the ranked set is written as before the field existed.
        assert!(!text.contains("\"candidates\""), "{text}");
        assert_eq!(
            load_policy(&dir).unwrap().meta.candidates,
            CandidateSet::Ranked
        );
        let mut meta = load_policy(&dir).unwrap().meta;
        meta.candidates = CandidateSet::Wide;
        replace_file(
            &dir.join(META_FILE),
            serde_json::to_string_pretty(&meta).unwrap().as_bytes(),
        )
        .unwrap();
        let text = fs::read_to_string(dir.join(META_FILE)).unwrap();
        assert!(text.contains("\"candidates\": \"wide\""), "{text}");
        assert_eq!(
            load_policy(&dir).unwrap().meta.candidates,
            CandidateSet::Wide
        );
        // A later per-fallback gate keeps it.
        let gate = FallbackGate {
            margin_threshold: 0.3,
            tolerance: 0.01,
            episodes: Vec::new(),
            scores: BTreeMap::new(),
        };
        write_fallback_gate(&dir, "tiresias", gate).unwrap();
        assert_eq!(
            load_policy(&dir).unwrap().meta.candidates,
            CandidateSet::Wide
        );
        // A set this build does not know is a corrupt meta.json, named as such.
        let unknown = text.replace("\"wide\"", "\"widest\"");
        fs::write(dir.join(META_FILE), unknown).unwrap();
        let err = load_policy(&dir).unwrap_err().to_string();
        assert!(err.contains("meta.json") && err.contains("widest"), "{err}");
        assert_eq!("wide".parse(), Ok(CandidateSet::Wide));
        assert_eq!("ranked".parse(), Ok(CandidateSet::Ranked));
        assert!(
            "all"
                .parse::<CandidateSet>()
                .unwrap_err()
                .contains("`ranked` or `wide`")
        );
    }

    #[test]
    fn a_per_fallback_gate_is_added_atomically_and_takes_precedence() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("p");
        saved(&dir);
        let before = load_policy(&dir).unwrap();
        let weights = fs::read(dir.join(WEIGHTS_FILE)).unwrap();
        let gate = |m: f32| FallbackGate {
            margin_threshold: m,
            tolerance: 0.01,
            episodes: vec!["t seed 2000".into()],
            scores: BTreeMap::from([("t_seed_2000/gated".to_string(), 1.0)]),
        };
        let meta = write_fallback_gate(&dir, "tiresias", gate(0.6)).unwrap();
        let after = load_policy(&dir).unwrap();
        assert_eq!(after.meta, meta);
        assert_eq!(after.scorer, before.scorer);
        assert_eq!(fs::read(dir.join(WEIGHTS_FILE)).unwrap(), weights);
        assert_eq!(after.meta.margin_threshold_for("tiresias"), Some(0.6));
        // The trained threshold still serves the trained fallback.
        assert_eq!(after.meta.margin_threshold_for("topo-pack"), Some(0.2));
        // An entry for a trained fallback replaces its threshold; the rest is kept.
        write_fallback_gate(&dir, "topo-pack", gate(0.4)).unwrap();
        let m = load_policy(&dir).unwrap().meta;
        assert_eq!(m.margin_threshold_for("topo-pack"), Some(0.4));
        assert_eq!(m.margin_threshold_for("tiresias"), Some(0.6));
        assert_eq!(m.gates["tiresias"].episodes, ["t seed 2000"]);
        // No temporary file is left behind, and nothing is written to a damaged artifact.
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{names:?}");
        let w = dir.join(WEIGHTS_FILE);
        fs::write(&w, &weights[..weights.len() / 2]).unwrap();
        let meta_before = fs::read(dir.join(META_FILE)).unwrap();
        assert!(write_fallback_gate(&dir, "fifo", gate(0.1)).is_err());
        assert_eq!(fs::read(dir.join(META_FILE)).unwrap(), meta_before);
        // A non-finite threshold is refused before anything is written.
        fs::write(&w, &weights).unwrap();
        assert!(write_fallback_gate(&dir, "fifo", gate(f32::NAN)).is_err());
        assert_eq!(fs::read(dir.join(META_FILE)).unwrap(), meta_before);
    }
}
