//! Reservation (pre-allocation) for a gang that has waited too long.
//!
//! With backfilling, a large whole-GPU gang can wait for ever: each GPU that frees up
//! goes at once to a smaller job queued behind it, so the gang never sees enough idle
//! GPUs at one time. When the highest-ranked job that cannot start in a cycle is such a
//! gang, has waited at least [`ReservationConfig::after_wait_s`] and cannot preempt its
//! way in, the cycle holds a set of nodes for it: no job after it in that cycle is placed
//! there, so the GPUs that free up on those nodes accumulate until the gang fits. It is
//! then placed by the policy's own placer, wherever it fits best.
//!
//! Design decisions:
//! - *Recomputed every cycle from the state alone*: nothing to persist, restore after a
//!   restart, or expire. The nodes chosen are the ones expected to drain soonest
//!   ([`nodes_to_hold`]), which held nodes stay (they only lose jobs), so the choice is
//!   stable from cycle to cycle.
//! - *No backfilling onto held nodes*: EASY backfilling would let a job use them if it
//!   ends before the gang could start, which needs run-time estimates that a
//!   non-clairvoyant scheduler does not have.
//! - *One reservation per cycle*, for the highest-ranked starving gang: holding capacity
//!   for several would idle more GPUs than it can help.

use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, GpuDemand, Job, NodeId};
use crate::framework::JobStats;
use crate::framework::cycle::workers_on_empty_node;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReservationConfig {
    /// Seconds a gang must have waited in the queue before capacity is held for it.
    pub after_wait_s: f64,
    /// Only jobs asking for at least this many whole GPUs in all get a reservation.
    pub min_gpus: u32,
    /// ... and at most this share of the cluster's GPUs: holding most of a cluster
    /// for one gang idles it for everyone else for as long as the slowest node drains.
    #[serde(default = "default_max_share")]
    pub max_share: f64,
}

fn default_max_share() -> f64 {
    0.25
}

impl Default for ReservationConfig {
    fn default() -> Self {
        ReservationConfig {
            after_wait_s: 1800.0,
            min_gpus: 8,
            max_share: default_max_share(),
        }
    }
}

impl ReservationConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.after_wait_s.is_finite() && self.after_wait_s >= 0.0) {
            return Err(format!(
                "reservation after_wait_s must be a non-negative number of seconds, not {}",
                self.after_wait_s
            ));
        }
        if !(self.max_share > 0.0 && self.max_share <= 1.0) {
            return Err(format!(
                "reservation max_share must be in (0, 1], not {}",
                self.max_share
            ));
        }
        if self.min_gpus == 0 {
            return Err("reservation min_gpus must be at least 1".into());
        }
        Ok(())
    }

    /// Whether `job`, unable to start at `now` on a cluster of `cluster_gpus`, is owed
    /// a reservation.
    pub fn applies(&self, job: &Job, stats: &JobStats, now: f64, cluster_gpus: u32) -> bool {
        matches!(job.gpu, GpuDemand::Whole(_))
            && job.gpu_count() >= self.min_gpus
            && job.gpu_count() as f64 <= self.max_share * cluster_gpus as f64
            && now - stats.queued_since >= self.after_wait_s
    }
}

/// The nodes to hold for `job`: up, able to hold its workers when empty, and together
/// able to hold all of them; `None` when the nodes up now cannot. `oldest_start[n]` is
/// when the longest-running job on node `n` started (`None`: nothing runs there).
///
/// Nodes are taken in order of how soon they should drain: idle ones first, then by the
/// start of their longest-running job, latest first. Run times of deep-learning jobs are
/// heavy-tailed (Tiresias' observation, and why it ranks by attained service), so the
/// longer a job has run the longer it is likely still to run; a node is free only when
/// its oldest job ends. Ties go to the node with more idle GPUs, then the lower id.
pub(crate) fn nodes_to_hold(
    job: &Job,
    state: &ClusterState,
    oldest_start: &[Option<f64>],
) -> Option<Vec<NodeId>> {
    let topo = state.topology();
    let per_worker = job.gpu.gpu_count();
    let workers = job.workers as u64;
    // (node, workers it can hold when empty)
    let mut pool: Vec<(NodeId, u64)> = topo
        .node_ids()
        .filter(|&n| state.node_is_up(n))
        .filter_map(|n| {
            let node = topo.node(n);
            let model = node.model?;
            if !job.gpu_models.allows(model) || per_worker == 0 {
                return None;
            }
            let slots = workers_on_empty_node(job, topo, node);
            (slots > 0).then_some((n, slots))
        })
        .collect();
    let started = |n: NodeId| oldest_start.get(n.0 as usize).copied().flatten();
    pool.sort_by(|&(a, _), &(b, _)| {
        let (sa, sb) = (started(a), started(b));
        // None (idle) first, then the latest start first.
        sa.is_some()
            .cmp(&sb.is_some())
            .then(sb.unwrap_or(0.0).total_cmp(&sa.unwrap_or(0.0)))
            .then(state.node_idle_gpus(b).cmp(&state.node_idle_gpus(a)))
            .then(a.cmp(&b))
    });
    let mut held = Vec::new();
    let mut slots = 0;
    for (n, s) in pool {
        held.push(n);
        slots += s;
        if slots >= workers {
            return Some(held);
        }
    }
    None
}
