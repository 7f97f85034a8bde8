//! Rebalancing: migrating running jobs so that a gang blocked only by fragmentation fits.
//!
//! A whole-GPU gang whose workers each need several GPUs can wait although the cluster
//! has enough idle GPUs in all: they are scattered, a few per node, and no node has
//! enough for one worker. When the first such gang in a cycle's order (the job that
//! cannot start nor preempt its way in, as for a reservation) has waited at least
//! [`RebalanceConfig::after_wait_s`], the cycle looks for a few running jobs to move:
//! on a scratch copy of the state it releases the cheapest movable jobs node by node
//! until the policy's own placer fits the gang, places the gang, and then places every
//! moved job again with the same placer (first back where it was, so that only jobs
//! whose GPUs the gang really took move). All of it fits together, or nothing happens.
//!
//! Design decisions:
//! - *Only when total idle capacity suffices*: migrating cannot create GPUs, only
//!   gather them; a gang short of idle GPUs waits (or gets a reservation).
//! - *Who may move*: running, preemptible jobs of the gang's priority class or a less
//!   important one, asking for fewer GPUs than the gang (never a gang as large), that
//!   have run at least [`RebalanceConfig::min_runtime_s`] in their current placement,
//!   so no job moves twice within that window, and that would lose at most
//!   [`RebalanceConfig::max_lost_s`] of work. The cheapest go first: a move costs the
//!   work since the job's last checkpoint plus its restart, times its GPUs.
//! - *A migration is a checkpoint-restart*: the job is stopped where it runs and
//!   started on its new placement in the same cycle (a new attempt). The simulator
//!   charges it like a preemption plus the restart; the service tells the agents to
//!   stop and start.
//! - *One rebalance per cycle*, at most [`RebalanceConfig::max_moves`] jobs moved.

use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, GpuDemand, Job, NodeId, Placement};
use crate::framework::cycle::workers_on_empty_node;
use crate::framework::{Candidate, Context, JobStats, Placer, Rank};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebalanceConfig {
    /// Seconds a gang must have waited before running jobs are moved for it.
    pub after_wait_s: f64,
    /// Jobs moved for one gang (in one cycle) at most.
    #[serde(default = "default_max_moves")]
    pub max_moves: u32,
    /// Seconds a job must have run in its current placement before it may be moved
    /// (a job just started, or just moved, stays where it is).
    #[serde(default = "default_min_runtime_s")]
    pub min_runtime_s: f64,
    /// A job that would lose more than this many seconds of work (since its last
    /// checkpoint) is not moved; absent: no limit.
    #[serde(default)]
    pub max_lost_s: Option<f64>,
}

fn default_max_moves() -> u32 {
    4
}

fn default_min_runtime_s() -> f64 {
    600.0
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig {
            after_wait_s: 1800.0,
            max_moves: default_max_moves(),
            min_runtime_s: default_min_runtime_s(),
            max_lost_s: None,
        }
    }
}

impl RebalanceConfig {
    pub fn validate(&self) -> Result<(), String> {
        let seconds = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!(
                    "rebalance {name} must be a non-negative number of seconds, not {v}"
                ))
            }
        };
        seconds("after_wait_s", self.after_wait_s)?;
        seconds("min_runtime_s", self.min_runtime_s)?;
        if let Some(m) = self.max_lost_s {
            seconds("max_lost_s", m)?;
        }
        if !(1..=64).contains(&self.max_moves) {
            return Err(format!(
                "rebalance max_moves must be 1..=64, not {}",
                self.max_moves
            ));
        }
        Ok(())
    }

    /// Whether `job`, unable to start at `now`, may have running jobs moved for it:
    /// a whole-GPU job of several GPUs that has waited long enough. (The caller checks
    /// that enough GPUs are idle in all.)
    pub fn applies(&self, job: &Job, stats: &JobStats, now: f64) -> bool {
        matches!(job.gpu, GpuDemand::Whole(_))
            && job.gpu_count() >= 2
            && now - stats.queued_since >= self.after_wait_s
    }

    /// Whether a running job may be moved for a gang of `gang_gpus` GPUs and rank
    /// `gang_rank`.
    fn movable(&self, c: &Candidate<'_>, gang_gpus: u32, gang_rank: Rank, now: f64) -> bool {
        let r = &c.running;
        r.job.preemptible
            && r.job.gpu != GpuDemand::None
            && r.job.gpu_count() < gang_gpus
            && c.rank.0 >= gang_rank.0
            && now - r.started_at >= self.min_runtime_s
            && self.max_lost_s.is_none_or(|m| r.lost_work_s <= m)
    }
}

/// What moving a running job costs, in GPU-seconds: the work since its last checkpoint
/// and its restart, on every GPU it holds.
fn move_cost(c: &Candidate<'_>) -> f64 {
    let r = &c.running;
    (r.lost_work_s + r.job.checkpoint.restart_s) * r.job.gpu_count() as f64
}

/// The moves that let `job` (ranked `rank`) fit, and its placement after them: each
/// move is an index into `candidates` and the job's new placement. `None` when no set
/// of at most `config.max_moves` movable jobs can be moved so that everything fits.
/// `state` is left as it was.
pub(crate) fn plan_moves(
    config: &RebalanceConfig,
    job: &Job,
    rank: Rank,
    candidates: &[Candidate<'_>],
    state: &ClusterState,
    placer: &dyn Placer,
    ctx: &mut Context,
) -> Option<(Vec<(usize, Placement)>, Placement)> {
    let GpuDemand::Whole(per_worker) = job.gpu else {
        return None;
    };
    let per_worker = u32::from(per_worker);
    if state.idle_gpus() < job.gpu_count() {
        return None;
    }
    let now = ctx.now;
    // A job with a worker on a down node is not moved: that worker cannot be told to
    // stop (its node is unreachable, or held), so it would run twice, and a move that
    // fails could not be undone there (the state refuses a down node).
    let mut movable: Vec<usize> = (0..candidates.len())
        .filter(|&i| config.movable(&candidates[i], job.gpu_count(), rank, now))
        .filter(|&i| {
            (candidates[i].running.placement.workers.iter()).all(|w| state.node_is_up(w.node))
        })
        .collect();
    if movable.is_empty() {
        return None;
    }
    movable.sort_by(|&a, &b| {
        move_cost(&candidates[a])
            .total_cmp(&move_cost(&candidates[b]))
            .then(
                candidates[a]
                    .running
                    .job
                    .id
                    .cmp(&candidates[b].running.job.id),
            )
    });
    let topo = state.topology();
    // Nodes that can hold a worker of the gang when empty.
    let nodes: Vec<NodeId> = topo
        .node_ids()
        .filter(|&n| {
            let node = topo.node(n);
            node.model.is_some_and(|m| job.gpu_models.allows(m))
                && workers_on_empty_node(job, topo, node) > 0
        })
        .collect();
    let mut scratch = state.clone();
    let mut taken = vec![false; candidates.len()];
    let mut evicted: Vec<usize> = Vec::new();
    let gang = loop {
        if let Ok(p) = placer.place(job, &mut scratch, ctx) {
            break p;
        }
        // Free room for one more worker on the node where that is cheapest.
        let mut best: Option<(f64, usize, NodeId, Vec<usize>)> = None;
        for &n in &nodes {
            if !scratch.node_is_up(n) {
                continue;
            }
            let idle = scratch.node_idle_gpus(n) as u32;
            let need = per_worker - idle % per_worker;
            let on_node = |i: usize| -> u32 {
                candidates[i]
                    .running
                    .placement
                    .workers
                    .iter()
                    .filter(|w| w.node == n)
                    .map(|w| w.gpus.iter().filter(|s| s.milli == 1000).count() as u32)
                    .sum()
            };
            let mut picked: Vec<(usize, u32)> = Vec::new();
            let mut freed: u32 = 0;
            for &i in &movable {
                if freed >= need {
                    break;
                }
                if taken[i] {
                    continue;
                }
                let g = on_node(i);
                if g > 0 {
                    picked.push((i, g));
                    freed += g;
                }
            }
            if freed < need {
                continue;
            }
            // Spare the most expensive picks that are not needed after all.
            for k in (0..picked.len()).rev() {
                if freed - picked[k].1 >= need {
                    freed -= picked[k].1;
                    picked.remove(k);
                }
            }
            let cost: f64 = picked.iter().map(|&(i, _)| move_cost(&candidates[i])).sum();
            let better = best.as_ref().is_none_or(|(c, len, node, _)| {
                cost.total_cmp(c)
                    .then(picked.len().cmp(len))
                    .then(n.cmp(node))
                    .is_lt()
            });
            if better {
                best = Some((
                    cost,
                    picked.len(),
                    n,
                    picked.iter().map(|&(i, _)| i).collect(),
                ));
            }
        }
        let (_, _, _, picked) = best?;
        for i in picked {
            let r = &candidates[i].running;
            scratch.release(r.job, r.placement);
            taken[i] = true;
            evicted.push(i);
        }
        if evicted.len() > 2 * config.max_moves as usize {
            return None;
        }
    };
    scratch.allocate(job, &gang).ok()?;
    // Jobs the gang did not displace stay where they are; the others are placed again,
    // the largest first.
    let mut displaced = Vec::new();
    for &i in &evicted {
        let r = &candidates[i].running;
        if scratch.allocate(r.job, r.placement).is_err() {
            displaced.push(i);
        }
    }
    if displaced.is_empty() || displaced.len() > config.max_moves as usize {
        return None;
    }
    displaced.sort_by(|&a, &b| {
        let (ja, jb) = (candidates[a].running.job, candidates[b].running.job);
        jb.gpu_count().cmp(&ja.gpu_count()).then(ja.id.cmp(&jb.id))
    });
    let mut moves = Vec::with_capacity(displaced.len());
    for i in displaced {
        let r = &candidates[i].running;
        let to = placer.place(r.job, &mut scratch, ctx).ok()?;
        scratch.allocate(r.job, &to).ok()?;
        moves.push((i, to));
    }
    Some((moves, gang))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{JobId, Placement};
    use crate::framework::Running;

    #[test]
    fn bad_values_are_named() {
        assert!(RebalanceConfig::default().validate().is_ok());
        let bad = |c: RebalanceConfig| c.validate().unwrap_err();
        let base = RebalanceConfig::default();
        assert!(
            bad(RebalanceConfig {
                after_wait_s: f64::NAN,
                ..base
            })
            .contains("after_wait_s")
        );
        assert!(
            bad(RebalanceConfig {
                min_runtime_s: -1.0,
                ..base
            })
            .contains("min_runtime_s")
        );
        assert!(
            bad(RebalanceConfig {
                max_lost_s: Some(f64::INFINITY),
                ..base
            })
            .contains("max_lost_s")
        );
        assert!(
            bad(RebalanceConfig {
                max_moves: 0,
                ..base
            })
            .contains("max_moves")
        );
    }

    #[test]
    fn only_smaller_preemptible_protected_out_jobs_of_no_higher_class_move() {
        let c = RebalanceConfig {
            after_wait_s: 0.0,
            max_moves: 4,
            min_runtime_s: 100.0,
            max_lost_s: Some(50.0),
        };
        let p = Placement::default();
        let job = |gpus: u16| {
            let mut j = Job::whole_gpus(JobId(1), 1, 0.0, 10.0);
            j.gpu = GpuDemand::Whole(gpus);
            j
        };
        let small = job(2);
        let now = 1_000.0;
        let ok = |j: &Job, started: f64, lost: f64, class: i64| {
            let cand = Candidate {
                running: Running {
                    job: j,
                    placement: &p,
                    stats: JobStats::default(),
                    started_at: started,
                    lost_work_s: lost,
                },
                rank: (class, 0.0),
            };
            c.movable(&cand, 8, (0, 0.0), now)
        };
        assert!(ok(&small, 0.0, 0.0, 0));
        assert!(ok(&small, 0.0, 0.0, 1), "a less important class may move");
        assert!(!ok(&small, 0.0, 0.0, -1), "a more important class stays");
        assert!(!ok(&job(8), 0.0, 0.0, 0), "as large as the gang");
        assert!(!ok(&small, 950.0, 0.0, 0), "moved or started 50 s ago");
        assert!(!ok(&small, 0.0, 60.0, 0), "would lose 60 s");
        let mut pinned = small.clone();
        pinned.preemptible = false;
        assert!(!ok(&pinned, 0.0, 0.0, 0));
        // Only whole-GPU gangs of two or more GPUs that waited long enough are served.
        let waited = JobStats {
            queued_since: 0.0,
            ..JobStats::default()
        };
        let c = RebalanceConfig {
            after_wait_s: 600.0,
            ..c
        };
        assert!(c.applies(&job(8), &waited, 600.0));
        assert!(!c.applies(&job(8), &waited, 599.0));
        assert!(!c.applies(&job(1), &waited, 600.0));
        let mut shared = job(1);
        shared.gpu = GpuDemand::Milli(500);
        assert!(!c.applies(&shared, &waited, 600.0));
    }
}
