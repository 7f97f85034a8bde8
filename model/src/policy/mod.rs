//! The placement policy network: scores each (pending job, candidate placement) pair, plus
//! a "wait / reserve" action, and says how sure it is.
//!
//! # Design decisions
//!
//! - **Scores, never decides feasibility.** The scheduler generates feasible candidates with
//!   deterministic code and fills one [`DecisionFeatures`] per decision (fixed, named slots:
//!   [`JOB_FEATURE_NAMES`], [`CANDIDATE_FEATURE_NAMES`]); the network only ranks them. A bad
//!   model can make a schedule worse, never invalid.
//! - **One MLP per candidate, softmax over candidates.** The input is the job's features
//!   joined with the candidate's (context features such as the cluster's free capacity live
//!   in the job part, so every candidate sees them). A shared MLP gives a logit per
//!   candidate; the policy is the softmax over the decision's candidates. A value head on
//!   the job part is REINFORCE's learned baseline.
//! - **Training in burn, serving in plain Rust.** [`PolicyNetwork`] (burn, autodiff, AdamW)
//!   is what trains and what is saved; [`PolicyScorer`] copies its weights into flat arrays
//!   for decisions, because a tensor library's per-op overhead (tens of µs) would dominate
//!   an MLP over 10 candidates. A test pins the two forward passes to the same numbers.
//! - **Confidence** ([`Scored`]): the probability margin between the two best candidates,
//!   and the distance of the inputs from the training data (RMS of the standardised
//!   features, with the standardisation fitted on the training decisions and saved with the
//!   weights). The gate in the scheduler compares them with thresholds stored in the
//!   artifact.

mod artifact;
mod config;
mod decline;
mod digest;
mod features;
mod keys;
mod network;
mod promotion;
mod scorer;
mod signing;
mod train;

pub use crate::artifact::{replace_file, sync_dir};
pub use artifact::{
    CandidateSet, FallbackGate, POLICY_SCHEMA_VERSION, PolicyArtifact, PolicyMeta,
    artifact_fingerprint, load_policy, save_policy, write_fallback_gate,
};
pub use config::PolicyConfig;
pub use decline::{
    DECLINE_FEATURE_NAMES, DECLINE_FEATURES, DeclineHead, DeclineVerdict, RANGE_SLACK,
    SHARE_TIES_ALTERNATIVE, SHARE_TIES_BASE, SHARE_TIES_FEATURE_NAMES, SHARE_TIES_FEATURES,
    ShareTies, write_decline_head,
};
pub use digest::artifact_sha256;
pub use features::{
    CANDIDATE_FEATURE_NAMES, CANDIDATE_FEATURES, DecisionFeatures, INPUT_FEATURES,
    JOB_FEATURE_NAMES, JOB_FEATURES, MAX_CANDIDATES,
};
pub use keys::{
    PromotionKey, PromotionKeys, PromotionSigner, generate_key_pair, key_id, public_key_path,
    read_public_key, read_signing_key,
};
pub use network::PolicyNetwork;
pub use promotion::{
    PromotionRecord, TraceRow, artifact_hash, fingerprint_hex, pending_record_path,
    promotion_record_path, read_promotion_record, verify_promotion,
};
pub use scorer::{FeatureStats, PolicyScorer, Scored};
pub use signing::{
    PromotionSignature, SIGNATURE_FORMAT, sign_promotion, signed_bytes, verify_signature,
};
pub use train::{PolicyLearner, Sample, StepReport};
