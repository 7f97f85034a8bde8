//! Preemption by rank: a job may evict running jobs of a strictly lower priority class
//! (its rank's first component), choosing the smallest victim set it can find.

use crate::domain::{ClusterState, Job, Placement, WorkerPlacement};
use crate::framework::{Candidate, Context, Placer, Preemptor, Rank, Running};

/// Evicts lower-class, preemptible jobs that have run at least `min_runtime_s`, cheapest
/// first: the least important class, then the least work lost (a job that just
/// checkpointed loses nothing), then the most recently started. Victims are released on a
/// scratch copy of the state until the job fits, and then every victim whose return would
/// still let it fit is spared (KAI-style checkpoint and rollback).
///
/// Only what a victim holds on nodes that are up counts: nothing can be placed on a node
/// marked down (cordoned, unreachable within its grace, held for a reservation), so a
/// job running only there is never a victim, and a gang partly there is released and
/// returned on the scratch state by its workers on up nodes alone. (Returning the whole
/// gang would fail on its down node, and the victim would then be evicted for nothing.)
#[derive(Debug, Clone)]
pub struct PreemptLowerRank {
    pub min_runtime_s: f64,
}

impl Preemptor for PreemptLowerRank {
    fn min_runtime_s(&self) -> f64 {
        self.min_runtime_s
    }

    fn select_victims(
        &self,
        job: &Job,
        rank: Rank,
        candidates: &[Candidate<'_>],
        state: &ClusterState,
        placer: &dyn Placer,
        ctx: &mut Context,
    ) -> Option<(Vec<usize>, Placement)> {
        let now = ctx.now;
        let running: Vec<&Running> = candidates.iter().map(|c| &c.running).collect();
        let mut eligible: Vec<(Rank, usize)> = running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.job.preemptible && now - r.started_at >= self.min_runtime_s)
            .filter(|(_, r)| workers_on_up_nodes(r, state).next().is_some())
            .map(|(i, _)| (candidates[i].rank, i))
            .filter(|(r, _)| r.0 > rank.0)
            .collect();
        // Idle GPUs are a necessary condition only for whole-GPU gangs; a shared task may
        // fit beside others.
        let need = match job.gpu {
            crate::domain::GpuDemand::Whole(_) => job.gpu_count(),
            _ => 0,
        };
        let reclaimable: u32 = eligible
            .iter()
            .map(|&(_, i)| {
                let r = running[i];
                workers_on_up_nodes(r, state).count() as u32 * r.job.gpu.gpu_count() as u32
            })
            .sum();
        if state.idle_gpus() + reclaimable < need {
            return None;
        }
        eligible.sort_by(|(ra, a), (rb, b)| {
            let (a, b) = (&running[*a], &running[*b]);
            rb.0.cmp(&ra.0)
                .then(a.lost_work_s.total_cmp(&b.lost_work_s))
                .then(b.started_at.total_cmp(&a.started_at))
                .then(a.job.id.cmp(&b.job.id))
        });
        let mut scratch = state.clone();
        let mut victims = Vec::new();
        let mut fits = false;
        for &(_, i) in &eligible {
            release_on_up_nodes(running[i], &mut scratch);
            victims.push(i);
            if scratch.idle_gpus() >= need && placer.place(job, &mut scratch, ctx).is_ok() {
                fits = true;
                break;
            }
        }
        if !fits {
            return None;
        }
        for k in (0..victims.len()).rev() {
            let r = running[victims[k]];
            if !return_on_up_nodes(r, &mut scratch) {
                continue;
            }
            if placer.place(job, &mut scratch, ctx).is_ok() {
                victims.remove(k);
            } else {
                release_on_up_nodes(r, &mut scratch);
            }
        }
        let placement = placer.place(job, &mut scratch, ctx).ok()?;
        Some((victims, placement))
    }
}

/// The workers of `r` on nodes that are up in `state`: what evicting it frees that a
/// placer can use.
fn workers_on_up_nodes<'p, 's>(
    r: &Running<'p>,
    state: &'s ClusterState,
) -> impl Iterator<Item = &'p WorkerPlacement> + use<'p, 's> {
    let placement: &'p Placement = r.placement;
    placement
        .workers
        .iter()
        .filter(move |w| state.node_is_up(w.node))
}

/// Releases the workers of `r` on up nodes on the scratch state (the others would free
/// nothing usable).
fn release_on_up_nodes(r: &Running<'_>, scratch: &mut ClusterState) {
    let up: Vec<&WorkerPlacement> = workers_on_up_nodes(r, scratch).collect();
    for w in up.into_iter().rev() {
        scratch.release_worker(r.job, w);
    }
}

/// Puts back what [`release_on_up_nodes`] released, all of it or nothing; whether it could.
fn return_on_up_nodes(r: &Running<'_>, scratch: &mut ClusterState) -> bool {
    let up: Vec<&WorkerPlacement> = workers_on_up_nodes(r, scratch).collect();
    for (done, w) in up.iter().enumerate() {
        if scratch.reserve_worker(r.job, w).is_err() {
            for undo in up[..done].iter().rev() {
                scratch.release_worker(r.job, undo);
            }
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::Arc;

    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use crate::domain::{
        ClusterSpec, GpuDemand, GpuShare, JobId, NodeId, Topology, WorkerPlacement,
    };
    use crate::framework::{Context, JobStats, Pending, Running, run_cycle};
    use crate::policies;

    use super::*;

    /// `nodes` nodes of 8 H100s, one NVLink island each.
    fn cluster(nodes: u32) -> ClusterState {
        let spec = ClusterSpec::from_toml(&format!(
            "name='c'\n[[nodes]]\ncount={nodes}\ngpu_model='H100'\ngpus=8\nnvlink_domain=8\n\
             cpu_milli=64000\nmemory_mib=262144\n"
        ))
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    fn job(id: u32, workers: u32, gpus: u16, priority: i32) -> Job {
        Job {
            workers,
            gpu: GpuDemand::Whole(gpus),
            priority,
            ..Job::whole_gpus(JobId(id), 1, 0.0, 0.0)
        }
    }

    /// A worker on `node` holding the GPUs at positions `gpus` of that node.
    fn worker(state: &ClusterState, node: u32, gpus: Range<usize>) -> WorkerPlacement {
        let ids = state.topology().node(NodeId(node)).gpu_ids();
        WorkerPlacement {
            node: NodeId(node),
            gpus: ids
                .skip(gpus.start)
                .take(gpus.len())
                .map(GpuShare::whole)
                .collect(),
        }
    }

    /// One cycle of the `priority` policy at t = 1000 s, past every protection, with
    /// `high` waiting and `running` (allocated on `state`) running since t = 0: the jobs
    /// it preempts, and where it places `high`.
    fn preempted_for(
        high: &Job,
        running: &[(Job, Placement)],
        state: &mut ClusterState,
    ) -> (Vec<JobId>, Option<Placement>) {
        let policy = policies::build("priority", &[]).unwrap();
        let pending = [Pending {
            job: high,
            stats: JobStats::default(),
        }];
        let running: Vec<Running> = running
            .iter()
            .map(|(job, placement)| Running {
                job,
                placement,
                stats: JobStats::default(),
                started_at: 0.0,
                lost_work_s: 0.0,
            })
            .collect();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut ctx = Context::new(1000.0, &mut rng);
        let d = run_cycle(&policy, state, &pending, &running, &mut ctx);
        assert!(d.errors.is_empty(), "{:?}", d.errors);
        state.check_consistency().unwrap();
        let victims = d.preempted.iter().map(|&k| running[k].job.id).collect();
        (victims, d.placed.into_iter().next().map(|(_, p)| p))
    }

    #[test]
    fn a_job_on_a_down_node_is_not_preempted_since_that_frees_nothing_usable() {
        let mut state = cluster(2);
        // V, the least important, runs on node 0, which is cordoned; W on node 1.
        let v = job(1, 1, 8, -1);
        let w = job(2, 1, 8, 0);
        let running = [
            (
                v.clone(),
                Placement {
                    workers: vec![worker(&state, 0, 0..8)],
                },
            ),
            (
                w.clone(),
                Placement {
                    workers: vec![worker(&state, 1, 0..8)],
                },
            ),
        ];
        for (job, placement) in &running {
            state.allocate(job, placement).unwrap();
        }
        state.set_node_up(NodeId(0), false);
        let high = job(3, 1, 8, 5);
        let (victims, placed) = preempted_for(&high, &running, &mut state);
        assert_eq!(victims, [w.id]);
        assert_eq!(placed.unwrap().workers[0].node, NodeId(1));
    }

    #[test]
    fn a_gang_partly_on_a_down_node_is_spared_when_its_up_part_is_not_needed() {
        let mut state = cluster(3);
        // V, the least important, has a worker on node 0 (cordoned) and one on node 1,
        // beside X, which may not be preempted: what V frees on node 1 is not enough.
        // W fills node 2.
        let v = job(1, 2, 4, -1);
        let mut x = job(2, 1, 4, 0);
        x.preemptible = false;
        let w = job(3, 1, 8, 0);
        let running = [
            (
                v.clone(),
                Placement {
                    workers: vec![worker(&state, 0, 0..4), worker(&state, 1, 4..8)],
                },
            ),
            (
                x,
                Placement {
                    workers: vec![worker(&state, 1, 0..4)],
                },
            ),
            (
                w.clone(),
                Placement {
                    workers: vec![worker(&state, 2, 0..8)],
                },
            ),
        ];
        for (job, placement) in &running {
            state.allocate(job, placement).unwrap();
        }
        state.set_node_up(NodeId(0), false);
        let high = job(4, 1, 8, 5);
        let (victims, placed) = preempted_for(&high, &running, &mut state);
        assert_eq!(victims, [w.id]);
        assert_eq!(placed.unwrap().workers[0].node, NodeId(2));
    }
}
