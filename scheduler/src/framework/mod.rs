//! The scheduling framework: DESIGN.md's cycle as one small trait per extension point.
//!
//! A [`Policy`] is a composition of plugins: a [`QueueOrder`] ranks pending jobs, a
//! [`Placer`] turns one job into a [`Placement`] (filtering nodes and scoring them
//! through [`NodeScorer`]s, or searching topology domains), and an optional [`Preemptor`]
//! picks victims when a job ranked above them cannot fit. [`run_cycle`] drives them over a
//! [`ClusterState`]; the simulator and the online service call the same function, so
//! the same policy code decides in both. With a [`ReservationConfig`], a large gang
//! that has waited too long gets nodes held for it (pre-allocation; see `reserve`); with
//! a [`RebalanceConfig`], running jobs are migrated so that a gang blocked only by
//! fragmentation fits (see `rebalance`); with a [`ConsolidateConfig`], a running gang
//! is moved onto a tighter placement when the predicted gain exceeds the move's cost
//! (see `consolidate`).
//!
//! Failure is two-sided, as in the Kubernetes framework: [`Status::Unschedulable`] says
//! "not now" (the job waits), [`Status::Error`] says something is wrong with the inputs or
//! the code and is reported, never silently retried. [`Status::Deferred`] is a placer's
//! choice, not a failure: the job fits but is left to wait, so nothing is preempted,
//! moved or held for it.

mod consolidate;
mod cpu_nodes_first;
mod cycle;
mod placer;
mod quota;
mod rebalance;
mod reserve;

pub use consolidate::{ConsolidateConfig, Consolidation, RemainingEstimate, gain_and_cost};
pub use cpu_nodes_first::CpuNodesFirst;
pub use cycle::{CycleDecisions, EverFitMemo, Pending, Running, can_ever_fit, run_cycle};
pub use placer::{
    ScoredPlacer, TieBreak, feasible_nodes, pick_gpus_best_fit, place_workers_tentatively,
};
pub use quota::{Limits, OverQuota, QuotaConfig, Shortfall, TenantUsage};
pub use rebalance::RebalanceConfig;
pub use reserve::ReservationConfig;

use rand_chacha::ChaCha8Rng;

use crate::domain::{ClusterState, DomainError, GpuShare, Job, NodeId, Placement};
use crate::sim::SpeedModel;

/// The `k` smallest of `keys`, ascending, in one pass and `k + 1` slots: for scans over
/// every node of which only the head of the order is used (most keys lose to the list at
/// once, and nothing the size of the cluster is allocated or sorted).
pub fn smallest_k<K: Ord>(keys: impl IntoIterator<Item = K>, k: usize) -> Vec<K> {
    smallest_k_until(&mut keys.into_iter(), k, |_| false)
}

/// [`smallest_k`] that stops reading `keys` as soon as `settled(list)` says that no key
/// still to come can enter the list (the caller knows how the rest is ordered); the rest
/// of `keys` is left unread. `settled` is asked after every key read.
pub fn smallest_k_until<K: Ord>(
    keys: &mut impl Iterator<Item = K>,
    k: usize,
    mut settled: impl FnMut(&[K]) -> bool,
) -> Vec<K> {
    let mut best: Vec<K> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for key in keys {
        if best.len() < k || best.last().is_some_and(|worst| key < *worst) {
            let at = best.partition_point(|b| *b < key);
            best.insert(at, key);
            best.truncate(k);
        }
        if settled(&best) {
            break;
        }
    }
    best
}

/// What the scheduler knows about a job beyond its spec.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct JobStats {
    /// GPU-seconds of service received so far (Tiresias' attained service).
    pub attained_gpu_s: f64,
    /// Work left, in seconds at speed 1.0 (known only to clairvoyant policies).
    pub remaining_work: f64,
    /// When the job last entered the pending queue.
    pub queued_since: f64,
    /// Seconds it ran in its last run (for starvation promotion).
    pub last_run_s: f64,
}

/// Mutable context of one scheduling cycle.
#[derive(Debug)]
pub struct Context<'a> {
    pub now: f64,
    pub rng: &'a mut ChaCha8Rng,
    /// The order in which placers consider nodes (and so break score ties); `None` is
    /// node-id order. The FGD experiment lists nodes in a seeded random order, as the
    /// published simulator does by prefixing node names with a random permutation.
    pub node_order: Option<&'a [NodeId]>,
    /// The speed model consolidation predicts gains with (the simulator passes the one
    /// that sets its jobs' rates); `None`: the generic [`SpeedModel::default`].
    pub speed: Option<&'a SpeedModel>,
    /// What tenants hold beyond the cycle's running jobs, counted against their quota:
    /// the jobs of a foreign scheduler, whose cluster `Advise` sees as usage only.
    pub held_elsewhere: Option<&'a TenantUsage>,
    /// In the FGD inflation experiment, the GPU milli requested by the episode's
    /// arrivals before this one: how much of the demand up to 100 % arrived load is
    /// still to come (the learned policy's decline head forecasts from it). `None`
    /// everywhere else.
    pub arrived_milli: Option<u64>,
}

impl<'a> Context<'a> {
    pub fn new(now: f64, rng: &'a mut ChaCha8Rng) -> Self {
        Context {
            now,
            rng,
            node_order: None,
            speed: None,
            held_elsewhere: None,
            arrived_milli: None,
        }
    }
}

/// Rank of a job in the queue; smaller goes first. The first component is the priority
/// class (preemption only crosses classes), the second orders within a class.
pub type Rank = (i64, f64);

pub trait QueueOrder: Send + Sync + std::fmt::Debug {
    fn rank(&self, job: &Job, stats: &JobStats, now: f64) -> Rank;

    /// Seconds until a job running on `gpus` GPUs changes rank by itself (Tiresias'
    /// demotions), so that an event-driven caller knows when to run a cycle.
    fn rank_changes_in(&self, job: &Job, stats: &JobStats, gpus: u32) -> Option<f64> {
        let _ = (job, stats, gpus);
        None
    }
}

/// Scores one feasible node for one worker; higher is better.
pub trait NodeScorer: Send + Sync + std::fmt::Debug {
    fn score(&self, job: &Job, node: NodeId, state: &ClusterState, ctx: &mut Context) -> f64;

    /// Scores every node of `nodes` (all feasible), appending to `scores` in order.
    /// Scorers with per-decision setup (a lock, a lookup) override this to pay it once.
    fn score_nodes(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        ctx: &mut Context,
        scores: &mut Vec<f64>,
    ) {
        for &node in nodes {
            scores.push(self.score(job, node, state, ctx));
        }
    }

    /// The GPUs on `node` that the worker takes. The default takes, for a share, the
    /// fullest GPU it fits on, and for whole GPUs the lowest-indexed idle ones.
    fn pick_gpus(
        &self,
        job: &Job,
        node: NodeId,
        state: &ClusterState,
        ctx: &mut Context,
    ) -> Option<Vec<GpuShare>> {
        let _ = ctx;
        pick_gpus_best_fit(job, node, state)
    }
}

/// Turns a job into a placement on the current state, or says why it cannot.
pub trait Placer: Send + Sync + std::fmt::Debug {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status>;

    /// The placer's score for each of `nodes` (feasible for one worker), when it ranks
    /// nodes by one (higher is preferred); `None` when it has no per-node score. For
    /// explanations only: the schedule never depends on it.
    fn node_scores(
        &self,
        _job: &Job,
        _nodes: &[NodeId],
        _state: &ClusterState,
        _ctx: &mut Context,
    ) -> Option<Vec<f64>> {
        None
    }
}

/// A running job a preemptor may consider, with its rank under the policy's order.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub running: Running<'a>,
    pub rank: Rank,
}

/// Picks running jobs to evict so that `job` fits. Works on a scratch copy of the state
/// (checkpoint and rollback); returns the victims and the placement that then fits.
pub trait Preemptor: Send + Sync + std::fmt::Debug {
    /// Seconds a job must have run before it may be evicted. An event-driven caller wakes
    /// up when a protection ends, since that alone can change the decision.
    fn min_runtime_s(&self) -> f64 {
        0.0
    }

    fn select_victims(
        &self,
        job: &Job,
        rank: Rank,
        candidates: &[Candidate<'_>],
        state: &ClusterState,
        placer: &dyn Placer,
        ctx: &mut Context,
    ) -> Option<(Vec<usize>, Placement)>;
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Status {
    /// Fits the cluster in principle, not in its current state.
    #[error("unschedulable now: {0}")]
    Unschedulable(String),
    /// Fits now, but the placer chose to wait (the learned policy's "wait"): the job stays
    /// queued, and the cycle neither preempts, rebalances nor reserves for it, since
    /// those are for jobs that cannot fit (DESIGN: a model only ranks feasible options).
    #[error("deferred by the placer: {0}")]
    Deferred(String),
    /// Can never fit this cluster (too large, no GPU of an allowed model).
    #[error("unschedulable on this cluster: {0}")]
    Unresolvable(String),
    #[error("scheduling error: {0}")]
    Error(#[from] DomainError),
}

/// A named composition of plugins.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    pub order: Box<dyn QueueOrder>,
    pub placer: Box<dyn Placer>,
    pub preemptor: Option<Box<dyn Preemptor>>,
    /// Strict queue: stop at the first job that does not fit (no backfilling).
    pub blocking: bool,
    /// Capacity held for a gang that has waited too long; `None` holds nothing.
    pub reservation: Option<ReservationConfig>,
    /// Running jobs moved for a gang blocked by fragmentation; `None` moves nothing.
    pub rebalance: Option<RebalanceConfig>,
    /// Running gangs moved onto tighter placements when it pays; `None` moves nothing.
    pub consolidate: Option<ConsolidateConfig>,
    /// Per-tenant limits on what running jobs hold; `None` limits nothing.
    pub quota: Option<QuotaConfig>,
}

impl Policy {
    /// The same policy with CPU-only jobs kept off GPU nodes while CPU-only nodes can
    /// take them (see [`CpuNodesFirst`]).
    pub fn with_cpu_nodes_first(self) -> Policy {
        Policy {
            placer: Box::new(CpuNodesFirst::new(self.placer)),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::smallest_k;

    proptest! {
        #[test]
        fn smallest_k_is_the_head_of_a_full_sort(
            keys in proptest::collection::vec((0u8..6, 0u16..50), 0..200),
            k in 0usize..20,
        ) {
            let mut sorted = keys.clone();
            sorted.sort();
            sorted.truncate(k);
            prop_assert_eq!(smallest_k(keys, k), sorted);
        }

        #[test]
        fn smallest_k_until_stops_where_told_and_leaves_the_rest_unread(
            keys in proptest::collection::vec(0u16..100, 0..100),
            k in 1usize..10,
            stop_after in 0usize..120,
        ) {
            let mut it = keys.iter().copied();
            let mut asked = 0usize;
            let best = super::smallest_k_until(&mut it, k, |_| {
                asked += 1;
                asked > stop_after
            });
            let read = (stop_after + 1).min(keys.len());
            prop_assert_eq!(asked, read);
            prop_assert_eq!(it.count(), keys.len() - read);
            let mut sorted = keys[..read].to_vec();
            sorted.sort();
            sorted.truncate(k);
            prop_assert_eq!(best, sorted);
        }
    }
}
