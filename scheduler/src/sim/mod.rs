//! The discrete-event simulator.
//!
//! Two experiments over the same policies and cluster state:
//! - **replay**: jobs arrive at their trace times, run at the speed their placement
//!   allows, can be preempted (losing work since their last checkpoint) or hit by node
//!   failures, and complete; the result is JCT, queueing and utilisation.
//! - **inflation**: the FGD experiment. Tasks of a trace arrive one after another with no
//!   departures until the requested GPUs reach a multiple of capacity; the result is the
//!   allocation ratio against arrived load.
//!
//! Every random choice draws from ChaCha8 streams seeded by the run's seed: stream 0 for
//! the policy, stream 1 for failures, stream 2 for workload sampling, stream 3 for the
//! order in which nodes are listed, so that policies
//! compared on one seed see the same failures and the same workload.

mod inflation;
mod metrics;
mod replay;
mod speed;

pub use inflation::{ArrivalCurve, InflationRun, inflation_arrivals, run_inflation};
pub use metrics::percentile;
pub use replay::{LogEntry, LogKind, run_replay};
pub use speed::{SpeedModel, work_for_duration};

use std::collections::BTreeMap;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::domain::DomainError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Mode {
    Replay,
    /// Arrive tasks until requested GPUs reach `max_arrived_pct` % of capacity.
    Inflation {
        max_arrived_pct: f64,
    },
}

/// Node failures: each node fails after an exponential time with mean `mtbf_s`, and is
/// repaired after an exponential time with mean `repair_s`.
#[derive(Copy, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureModel {
    pub mtbf_s: f64,
    pub repair_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    pub seed: u64,
    pub mode: Mode,
    pub speed: SpeedModel,
    pub failures: Option<FailureModel>,
}

impl SimConfig {
    pub fn replay(seed: u64) -> Self {
        SimConfig {
            seed,
            mode: Mode::Replay,
            speed: SpeedModel::default(),
            failures: None,
        }
    }

    pub fn inflation(seed: u64) -> Self {
        SimConfig {
            mode: Mode::Inflation {
                max_arrived_pct: 130.0,
            },
            ..SimConfig::replay(seed)
        }
    }

    pub fn validate(&self) -> Result<(), DomainError> {
        if let Mode::Inflation { max_arrived_pct } = self.mode
            && !(max_arrived_pct.is_finite() && max_arrived_pct > 0.0 && max_arrived_pct <= 1000.0)
        {
            return Err(DomainError::Invalid(format!(
                "inflation target {max_arrived_pct} % must be in (0, 1000]"
            )));
        }
        if let Some(f) = self.failures {
            // Under a second, failures come faster than the clock can tell times apart
            // late in a long replay, and the run never advances; past 10¹² s the
            // arithmetic of times loses whole seconds.
            for (what, s) in [("MTBF", f.mtbf_s), ("repair time", f.repair_s)] {
                if !(s.is_finite() && (1.0..=1e12).contains(&s)) {
                    return Err(DomainError::Invalid(format!(
                        "failure {what} {} h must be between 1 s and 10^12 s",
                        s / 3600.0
                    )));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn rng(&self, stream: u64) -> ChaCha8Rng {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(stream);
        rng
    }
}

pub(crate) const POLICY_STREAM: u64 = 0;
pub(crate) const FAILURE_STREAM: u64 = 1;
pub(crate) const WORKLOAD_STREAM: u64 = 2;
pub(crate) const NODE_ORDER_STREAM: u64 = 3;

/// One run's measures. Keys are stable: tools parse them. Measures that a mode does not
/// produce are `null`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SimResult {
    pub policy: String,
    pub trace: String,
    pub cluster: String,
    pub seed: u64,
    pub mode: String,
    /// Jobs (replay) or tasks (inflation) that arrived.
    pub jobs: u64,
    pub gpus: u64,
    pub completed: u64,
    /// Jobs that could never fit the cluster (replay) or failed to place (inflation).
    pub rejected: u64,
    pub jct_mean_s: Option<f64>,
    pub jct_p50_s: Option<f64>,
    pub jct_p99_s: Option<f64>,
    pub queue_mean_s: Option<f64>,
    /// The longest wait before a first start (starvation shows here first).
    #[serde(default)]
    pub queue_max_s: Option<f64>,
    pub makespan_s: Option<f64>,
    /// Replay: time-averaged share of GPU capacity allocated. Inflation: at the end.
    pub gpu_alloc_pct: f64,
    /// Multi-GPU placements as tight as the cluster allows, in percent.
    pub locality_pct: Option<f64>,
    pub preemptions: u64,
    /// Running jobs moved to make room for a gang (`framework::rebalance`); each is a
    /// checkpoint-restart, its lost work counted in `lost_gpu_s`.
    #[serde(default)]
    pub migrations: u64,
    pub failures: u64,
    /// Replay: placements that failed with an error in a cycle (the job stayed queued), a
    /// bug in a policy; the invariant tests require none.
    #[serde(default)]
    pub placement_errors: u64,
    /// Work thrown away by preemptions and failures, in GPU-seconds.
    pub lost_gpu_s: f64,
    pub events: u64,
    pub wall_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_pct_by_arrived: Option<BTreeMap<String, f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unallocated_gpus_at_100: Option<f64>,
    /// The learned policy only: share of its placement decisions the fallback heuristic
    /// made (set by the caller, which holds the policy's counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_rate: Option<f64>,
    /// For `learned` with a decline head: GPU shares it left unplaced rather than open an
    /// idle GPU for them (set by the caller, like `fallback_rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declined_shares: Option<u64>,
    /// For `learned` with a share-ties switch: GPU shares placed by FGD with
    /// sum-of-squares ties instead of the network (set by the caller, like
    /// `fallback_rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum_of_squares_ties: Option<u64>,
}
