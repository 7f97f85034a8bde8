//! Marshal's neural networks (burn): the graph-network resource predictors, with artifact
//! save/load, and the placement policy network ([`policy`]).
//!
//! # What it predicts
//!
//! For one job on one candidate placement — a [`PlacementGraph`] whose nodes are the GPUs and
//! whose edges are the communication paths between them — a [`TrainedPredictor`] returns a
//! [`Prediction`]: the step time with a 90 % interval, the peak memory per GPU in four phases
//! and the GPU utilisation. The scheduler uses the step time to rank placements and the
//! interval width as its confidence: a wide interval sends the decision to the heuristic.
//!
//! # Design decisions
//!
//! - **No domain types.** The crate knows features, not clusters: the featuriser in another
//!   crate fills the fixed, named slots of [`GpuNodeFeatures`], [`LinkFeatures`] and
//!   [`JobFeatures`] ([`GPU_FEATURE_NAMES`] etc.). The names are stored in every artifact and
//!   checked on load, so a featuriser and a model that disagree fail loudly.
//! - **Dense, padded graphs.** Placements are small (1–64 GPUs, typically ≤ 16), so a batch is
//!   padded to its largest graph and processed as `B×N×F` node and `B×N×N×E` edge tensors
//!   with masks. That is a handful of large tensor ops instead of many tiny scatter/gather ops —
//!   what a CPU backend is fastest at for training.
//! - **Serving is plain Rust.** At inference a candidate list is a few dozen small products,
//!   where a tensor backend's per-op overhead dominates, so [`TrainedPredictor::predict`]
//!   copies the weights into flat arrays once and runs each graph unpadded, encoding each
//!   distinct kind of link once (module `serving`); `predict_on_device` keeps the burn path for
//!   GPU devices, and a test holds the two to the same outputs.
//! - **Message passing** ([`network`]): node/edge encoders, `rounds` rounds of an MLP over
//!   `[h_i, h_j, e_ij]` (computed as a sum of three linear maps, never concatenated) with
//!   masked mean aggregation and a residual update, then masked mean + max pooling joined with
//!   the encoded job features.
//! - **Uncertainty** comes from a heteroscedastic Gaussian head on standardised `ln(step time)`
//!   (mean and log-variance), so the interval is log-normal and always positive. It is
//!   trained with the β-NLL ([`PredictorConfig::nll_beta`], β = 0.5): the plain Gaussian NLL
//!   lets the network explain a hard example by a wide variance instead of fitting its
//!   mean, which cost step-time accuracy on measured data. Early stopping reads the plain
//!   NLL. Memory and utilisation use MSE with NaN targets masked out, because telemetry
//!   often lacks some phases.
//! - **Novel shapes are stacked** ([`LinearResidual`], [`choose_novel_weights`]): on a
//!   placement shape never trained on, the mean is the prior plus a weighted share of the
//!   network's residual and of a ridge regression's residual on a graph summary, the
//!   weights chosen on networks trained with shape classes held out. Trained shapes keep
//!   the network.
//! - **Novel shapes get the folds' own interval** ([`TrainedPredictor::with_fold_networks`]):
//!   the networks trained with shape classes held out are kept in the artifact, and on a
//!   novel shape within the trained range the interval is their cross-validation+ (CV+)
//!   interval and the median the mean of theirs and the main network's, because scaling
//!   the main network's σ by the folds' misses assumed it misses as they do, which on
//!   measured data it did not (module `cross_conformal`).
//! - **Normalisation is part of the model.** Mean/std per feature and per target are fitted on
//!   the training set and saved next to the weights; raw units go in, raw units come out.
//! - **Determinism.** Weights are initialised from a ChaCha8 stream seeded by
//!   [`PredictorConfig::seed`], not from burn's process-global backend RNG (which parallel
//!   trainings would share); shuffling uses a second ChaCha8 stream. On the single-threaded
//!   `flex` backend the same seed and data give bit-identical weights.
//! - **Backends.** burn 0.22 puts the backend in the [`Device`](burn::tensor::Device), not in
//!   a type parameter. Everything runs on the pure-Rust `flex` CPU backend by default; the
//!   `cuda`, `wgpu` and `tch` cargo features add GPU/LibTorch devices ([`device`]) and are
//!   never needed by tests.
//! - **No `burn-train`.** The loop in [`train`] is ~100 lines: AdamW, early stopping on the
//!   validation loss, a progress callback. The `train` feature would pull a metrics/TUI stack.
//! - **Untrusted inputs never panic.** NaN/inf features, empty or oversized graphs, bad link
//!   indices, missing or corrupt artifact files each return a [`ModelError`] naming the field or
//!   file; artifacts carry a schema version and a weights checksum.

pub mod artifact;
mod batch;
pub mod calibration;
mod config;
mod cross_conformal;
mod dense;
pub mod device;
mod error;
mod extrapolation;
mod features;
mod inference;
pub mod network;
mod normalize;
pub mod policy;
mod residual;
mod serving;
pub mod synthetic;
pub mod train;

pub use artifact::{ARTIFACT_SCHEMA_VERSION, ArtifactInfo, ArtifactMeta, LoadedArtifact};
/// burn's device handle (its backend included), so callers need not depend on burn.
pub use burn::tensor::Device;
pub use calibration::{
    Calibration, GraphCalibration, HeldOutLogStep, NovelRule, choose_novel_weights,
};
pub use config::PredictorConfig;
pub use error::{ModelError, Result};
pub use extrapolation::Extrapolation;
pub use features::{
    GPU_FEATURE_NAMES, GPU_FEATURES, GpuNodeFeatures, JOB_FEATURE_NAMES, JOB_FEATURES, JobFeatures,
    LINK_FEATURE_NAMES, LINK_FEATURES, LinkFeatures, LinkKind, MAX_GPUS_PER_GRAPH, MEM_PHASE_NAMES,
    MEM_PHASES, PRIOR_JOB_SLOT, PlacementGraph, ShapeClass, Targets,
};
pub use inference::{Prediction, TrainedPredictor};
pub use normalize::{Normalization, Standardizer};
pub use residual::{DEFAULT_RIDGE, LinearResidual, SUMMARY_FEATURES, solve_spd};
pub use train::{EpochReport, TrainingSummary, fit, fit_on};
