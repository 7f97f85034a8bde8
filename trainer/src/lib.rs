//! Offline training and evaluation of Marshal's predictors.
//!
//! What exists (issue 5, part 1): the training examples read from Parquet step
//! profiles ([`load_step_examples`]), splits by job with no leakage and splits that hold
//! out whole placement shapes ([`split_by_job`], [`split_unseen_placements`]), and the
//! two baselines a learned predictor must beat ([`LookupBaseline`], [`LinearBaseline`])
//! with the error measure they are judged by ([`mape`]).
//! Measured step times (e.g. Pollux's profiles) become examples too
//! ([`measured_examples`]), with folds that hold a shape class or a model out of the
//! prior's calibration and the training alike ([`leave_one_class_out`],
//! [`leave_one_model_out`], [`MeasuredFold::prior_catalog`]), or test on a second set
//! of measurements ([`test_on_other_set`]); on them the prior can take a second form,
//! fitted synchronisation lines ([`SyncFit`], [`fit_measured_prior`]).
//! The placement policy's training, its per-fallback gate thresholds ([`policy`]) and
//! the promotion of a policy artifact only if it wins on validation traces ([`promote`]).
//!
//! # Design decisions
//!
//! - **One example per (job, placement run, co-tenancy)**, not per telemetry row: the
//!   rows of one run repeat the same answer, so counting them would weight long jobs by
//!   their length and leak a job into both sides of a split.
//! - **Splits are by job id hash**, seeded, so every row of a job lands on one side.
//! - **Baselines are honest**: the lookup table falls back from (model, GPU type, GPUs)
//!   to (model, GPU type) scaled by GPU count, then to the model, so it always answers;
//!   the linear model is ridge regression on log step time over the same features the
//!   network sees in summary form.

mod baselines;
mod error;
mod examples;
mod featurize;
mod history;
mod measured;
pub mod policy;
pub mod promote;
mod split;
mod sync;
#[doc(hidden)]
pub mod testkit;

pub use baselines::{LinearBaseline, LookupBaseline, mape};
pub use error::TrainerError;
pub use examples::{RowsLeftOut, StepExample, StepScanReport, load_step_examples};
pub use featurize::{ClusterContext, PlacementSpeed};
pub use history::{HISTORY_FILE, HistoryEntry, Locality, Recalled, StepHistory};
pub use measured::{
    MeasuredFold, MeasuredStep, PriorForm, fit_comm_catalog, fit_measured_prior,
    leave_one_class_out, leave_one_model_out, measured_examples, measured_kind, test_on_other_set,
};
pub use split::{Split, split_by_job, split_holding_out, split_unseen_placements};
pub use sync::{SyncBasis, SyncFit, SyncUnit};
