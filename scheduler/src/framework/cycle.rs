//! One scheduling cycle: order the queue, place what fits, preempt where a policy allows.

use crate::domain::{ClusterState, GpuDemand, GpuModelSet, Job, Node, NodeId, Placement, Topology};
use crate::framework::consolidate::{Consolidation, consolidate};
use crate::framework::quota::{OverQuota, Shortfall, TenantUsage};
use crate::framework::rebalance::plan_moves;
use crate::framework::reserve::nodes_to_hold;
use crate::framework::{Candidate, Context, JobStats, Policy, Rank, Status};

#[derive(Debug, Clone, Copy)]
pub struct Pending<'a> {
    pub job: &'a Job,
    pub stats: JobStats,
}

#[derive(Debug, Clone, Copy)]
pub struct Running<'a> {
    pub job: &'a Job,
    pub placement: &'a Placement,
    pub stats: JobStats,
    /// When the current run started.
    pub started_at: f64,
    /// Seconds of progress that preempting it now would throw away.
    pub lost_work_s: f64,
}

/// What a cycle decided. Indices refer to the `pending` and `running` slices it was given.
#[derive(Debug, Default)]
pub struct CycleDecisions {
    pub placed: Vec<(usize, Placement)>,
    pub preempted: Vec<usize>,
    /// Jobs that can never run on this cluster, with the reason.
    pub rejected: Vec<(usize, String)>,
    /// Jobs whose placement failed with an error (they stay queued).
    pub errors: Vec<(usize, String)>,
    /// Jobs not tried because their tenant is at its quota (`framework::quota`), with
    /// the limit they do not fit under: they stay queued.
    pub over_quota: Vec<(usize, Shortfall)>,
    /// Jobs the placer chose to hold back although they fit (`Status::Deferred`), with
    /// its reason: they stay queued.
    pub deferred: Vec<(usize, String)>,
    /// The starving gang capacity was held for in this cycle, and the nodes held
    /// (`framework::reserve`): no job ranked after it was placed on them.
    pub reserved: Option<(usize, Vec<NodeId>)>,
    /// Running jobs moved to make room for a gang (`framework::rebalance`), with their
    /// new placements: the state already has them moved (old placement released, new
    /// one allocated); the caller stops each and starts it again on the new placement.
    pub migrated: Vec<(usize, Placement)>,
    /// The gang the moves were for (an index into `pending`; it is also in `placed`).
    pub rebalanced_for: Option<usize>,
    /// Running gangs moved onto a tighter placement (`framework::consolidate`), with
    /// the predicted gain and cost behind each move: like `migrated`, the state already
    /// has them moved and the caller stops and restarts each.
    pub consolidated: Vec<Consolidation>,
}

/// Runs one cycle of `policy`. `state` is updated in place: placed gangs are allocated
/// and victims released; the caller applies the same decisions to its own job records.
pub fn run_cycle(
    policy: &Policy,
    state: &mut ClusterState,
    pending: &[Pending<'_>],
    running: &[Running<'_>],
    ctx: &mut Context,
) -> CycleDecisions {
    let mut decisions = CycleDecisions::default();
    let mut order: Vec<(Rank, usize)> = pending
        .iter()
        .enumerate()
        .map(|(i, p)| (policy.order.rank(p.job, &p.stats, ctx.now), i))
        .collect();
    order.sort_by(|(ra, ia), (rb, ib)| {
        let (a, b) = (pending[*ia].job, pending[*ib].job);
        ra.0.cmp(&rb.0)
            .then(ra.1.total_cmp(&rb.1))
            .then(a.submit_time.total_cmp(&b.submit_time))
            .then(a.id.cmp(&b.id))
    });
    let mut evicted = vec![false; running.len()];
    let running_ranks: Vec<Rank> = running
        .iter()
        .map(|r| policy.order.rank(r.job, &r.stats, ctx.now))
        .collect();
    let lowest_victim_class = |evicted: &[bool]| {
        running
            .iter()
            .zip(&running_ranks)
            .zip(evicted)
            .filter(|((r, _), gone)| r.job.preemptible && !**gone)
            .map(|((_, rank), _)| rank.0)
            .max()
    };
    let mut victim_class = lowest_victim_class(&evicted);
    // Within a cycle the state only fills up (until a preemption frees something), so a
    // job shape that found no room once finds none again: later jobs of that shape and
    // priority class are skipped. This keeps deep queues cheap.
    let mut no_room: Vec<(JobShape, i64)> = Vec::new();
    let mut usage = policy.quota.as_ref().map(|_| {
        let mut usage = TenantUsage::of(running.iter().map(|r| r.job));
        if let Some(elsewhere) = ctx.held_elsewhere {
            usage.merge(elsewhere);
        }
        usage
    });
    for (rank, i) in order {
        let job = pending[i].job;
        // Quota before room: a tenant at its limit is not short of room, so nothing is
        // preempted, moved or held for it, and the queue goes on past it.
        if let (Some(quota), Some(usage)) = (&policy.quota, &usage) {
            match usage.admits(quota, job) {
                Ok(()) => {}
                Err(OverQuota::Wait(short)) => {
                    decisions.over_quota.push((i, short));
                    continue;
                }
                Err(OverQuota::Never(short)) => {
                    decisions.rejected.push((i, short.describe(&job.tenant)));
                    continue;
                }
            }
        }
        let (placed_before, preempted_before) = (decisions.placed.len(), decisions.preempted.len());
        let shape = JobShape::of(job);
        // The shortcut is not taken for a job owed a reservation while none is made: the
        // job of its shape that found no room may not have been owed one (it was just
        // requeued, or ranks by another measure than its wait), and skipping this one
        // would leave a starving gang without the nodes held for it.
        let owed_reservation = decisions.reserved.is_none()
            && policy.reservation.as_ref().is_some_and(|r| {
                r.applies(
                    job,
                    &pending[i].stats,
                    ctx.now,
                    state.topology().gpu_count(),
                )
            });
        if no_room.contains(&(shape, rank.0)) && !owed_reservation {
            if policy.blocking {
                break;
            }
            continue;
        }
        let whole_gpus_short =
            matches!(job.gpu, GpuDemand::Whole(_)) && state.idle_gpus() < job.gpu_count();
        let attempt = if whole_gpus_short {
            Err(Status::Unschedulable("not enough idle GPUs".into()))
        } else {
            policy.placer.place(job, state, ctx)
        };
        match attempt {
            Ok(placement) => match state.allocate(job, &placement) {
                Ok(()) => decisions.placed.push((i, placement)),
                Err(e) => decisions.errors.push((i, e.to_string())),
            },
            Err(Status::Unschedulable(_)) => {
                let may_preempt = victim_class.is_some_and(|c| c > rank.0);
                let victims = policy
                    .preemptor
                    .as_ref()
                    .filter(|_| may_preempt)
                    .and_then(|p| {
                        let (index, candidates) = still_running(running, &running_ranks, &evicted);
                        p.select_victims(job, rank, &candidates, state, policy.placer.as_ref(), ctx)
                            .map(|(v, placement)| {
                                (
                                    v.into_iter().map(|k| index[k]).collect::<Vec<_>>(),
                                    placement,
                                )
                            })
                    });
                match victims {
                    Some((victims, placement)) => {
                        match evict_and_place(state, job, &placement, &victims, running) {
                            Ok(()) => {
                                for &k in &victims {
                                    evicted[k] = true;
                                    decisions.preempted.push(k);
                                }
                                victim_class = lowest_victim_class(&evicted);
                                no_room.clear();
                                decisions.placed.push((i, placement));
                            }
                            Err(e) => decisions.errors.push((
                                i,
                                format!(
                                    "placement after preemption refused, nothing preempted: {e}"
                                ),
                            )),
                        }
                    }
                    None if rebalance(
                        policy,
                        state,
                        pending,
                        i,
                        rank,
                        running,
                        &running_ranks,
                        &mut evicted,
                        &mut decisions,
                        ctx,
                    ) =>
                    {
                        victim_class = lowest_victim_class(&evicted);
                        no_room.clear();
                    }
                    None if policy.blocking => break,
                    None => {
                        if decisions.reserved.is_none()
                            && let Some(r) = &policy.reservation
                            && r.applies(
                                job,
                                &pending[i].stats,
                                ctx.now,
                                state.topology().gpu_count(),
                            )
                            && let Some(nodes) =
                                nodes_to_hold(job, state, &oldest_starts(state, running, &evicted))
                        {
                            // Held by marking the nodes down for the rest of the cycle
                            // (undone below): every placer and preemptor skips them.
                            for &n in &nodes {
                                state.set_node_up(n, false);
                            }
                            decisions.reserved = Some((i, nodes));
                        }
                        no_room.push((shape, rank.0));
                    }
                }
            }
            // The placer chose to wait although the job fits: nothing is preempted,
            // moved or held for it, since none of that is needed. As for a job that found
            // no room, a strict queue stops here, and later jobs of its shape and class
            // are not offered the room it waits for.
            Err(Status::Deferred(why)) => {
                decisions.deferred.push((i, why));
                if policy.blocking {
                    break;
                }
                no_room.push((shape, rank.0));
            }
            Err(Status::Unresolvable(why)) => decisions.rejected.push((i, why)),
            Err(Status::Error(e)) => decisions.errors.push((i, e.to_string())),
        }
        if let Some(usage) = &mut usage {
            for &k in &decisions.preempted[preempted_before..] {
                usage.remove(running[k].job);
            }
            if decisions.placed.len() > placed_before {
                usage.add(job);
            }
        }
    }
    // After the queue: idle capacity goes to waiting jobs first, and what is left may
    // tighten running gangs (whose old GPUs free up in exchange). Nodes held for a gang
    // are still marked down here, so consolidation does not take them either.
    if let Some(config) = &policy.consolidate {
        let (index, candidates) = still_running(running, &running_ranks, &evicted);
        decisions.consolidated = consolidate(config, &candidates, &index, state, ctx);
    }
    if let Some((_, nodes)) = &decisions.reserved {
        for &n in nodes {
            state.set_node_up(n, true);
        }
    }
    decisions
}

/// Releases `victims` (indices into `running`) and allocates `job` on `placement`, all or
/// nothing: it is tried on a copy first, so that a placement the state refuses (a placer's
/// or preemptor's bug) leaves every victim running. Putting them back after a failure
/// could fail in turn, since a victim may run partly on a node marked down, where nothing
/// can be allocated.
fn evict_and_place(
    state: &mut ClusterState,
    job: &Job,
    placement: &Placement,
    victims: &[usize],
    running: &[Running<'_>],
) -> Result<(), crate::domain::DomainError> {
    let mut after = state.clone();
    for &k in victims {
        after.release(running[k].job, running[k].placement);
    }
    after.allocate(job, placement)?;
    *state = after;
    Ok(())
}

/// Moves running jobs so that the blocked gang `pending[i]` fits (`framework::rebalance`), when
/// the policy rebalances, none was done in this cycle and no capacity is held; applies
/// the moves and the gang's placement to `state` and `decisions`. Returns whether it
/// did.
#[allow(clippy::too_many_arguments)]
fn rebalance(
    policy: &Policy,
    state: &mut ClusterState,
    pending: &[Pending<'_>],
    i: usize,
    rank: Rank,
    running: &[Running<'_>],
    running_ranks: &[Rank],
    evicted: &mut [bool],
    decisions: &mut CycleDecisions,
    ctx: &mut Context,
) -> bool {
    let Some(config) = &policy.rebalance else {
        return false;
    };
    let p = &pending[i];
    if decisions.rebalanced_for.is_some()
        || decisions.reserved.is_some()
        || !config.applies(p.job, &p.stats, ctx.now)
        || state.idle_gpus() < p.job.gpu_count()
    {
        return false;
    }
    let (index, candidates) = still_running(running, running_ranks, evicted);
    let Some((moves, placement)) = plan_moves(
        config,
        p.job,
        rank,
        &candidates,
        state,
        policy.placer.as_ref(),
        ctx,
    ) else {
        return false;
    };
    // Applied to a copy, in the order the plan was checked in, and kept only if every
    // step holds: the plan says each will, and a failure (a GPU that failed under a
    // moved job since) then leaves the state as it was instead of half moved, with no
    // rollback that could itself fail. Rebalancing happens at most once a cycle.
    let moved: Vec<(usize, Placement)> = moves.into_iter().map(|(c, to)| (index[c], to)).collect();
    let mut after = state.clone();
    for (k, _) in &moved {
        after.release(running[*k].job, running[*k].placement);
    }
    let fits = after.allocate(p.job, &placement).is_ok()
        && moved
            .iter()
            .all(|(k, to)| after.allocate(running[*k].job, to).is_ok());
    if !fits {
        return false;
    }
    *state = after;
    // A moved job is no longer a candidate for anything else in this cycle.
    for (k, _) in &moved {
        evicted[*k] = true;
    }
    decisions.migrated.extend(moved);
    decisions.placed.push((i, placement));
    decisions.rebalanced_for = Some(i);
    true
}

/// The jobs not evicted in this cycle, as preemption and rebalancing candidates, with
/// their indices in `running`.
fn still_running<'a>(
    running: &[Running<'a>],
    ranks: &[Rank],
    evicted: &[bool],
) -> (Vec<usize>, Vec<Candidate<'a>>) {
    let index: Vec<usize> = (0..running.len()).filter(|k| !evicted[*k]).collect();
    let candidates = index
        .iter()
        .map(|&k| Candidate {
            running: running[k],
            rank: ranks[k],
        })
        .collect();
    (index, candidates)
}

/// When the longest-running job still on each node started (`None`: none runs there).
fn oldest_starts(
    state: &ClusterState,
    running: &[Running<'_>],
    evicted: &[bool],
) -> Vec<Option<f64>> {
    let mut oldest: Vec<Option<f64>> = vec![None; state.topology().nodes().len()];
    for (r, _) in running.iter().zip(evicted).filter(|(_, gone)| !**gone) {
        for w in &r.placement.workers {
            let slot = &mut oldest[w.node.0 as usize];
            *slot = Some(slot.map_or(r.started_at, |s| s.min(r.started_at)));
        }
    }
    oldest
}

/// Whether `job` could run on an empty, healthy `topo` at all. Callers check this once,
/// at admission, and reject a job that fails it with the reason instead of letting it
/// wait forever.
pub fn can_ever_fit(job: &Job, topo: &Topology) -> Result<(), String> {
    let per_worker_gpus = job.gpu.gpu_count();
    let mut nodes_fit = 0u64;
    let mut workers_fit = 0u64;
    for node in topo.nodes() {
        if node.cpu_milli < job.cpu_milli || node.memory_mib < job.memory_mib {
            continue;
        }
        if job.gpu != GpuDemand::None {
            let Some(model) = node.model else { continue };
            if !job.gpu_models.allows(model) {
                continue;
            }
        }
        let on_node = workers_on_empty_node(job, topo, node);
        // A MIG worker needs an instance of its size; the others, enough GPUs.
        let one_fits = match job.gpu {
            GpuDemand::Mig { .. } => on_node > 0,
            _ => node.non_mig_gpus() >= per_worker_gpus,
        };
        if !one_fits {
            continue;
        }
        nodes_fit += 1;
        workers_fit = workers_fit.saturating_add(on_node);
    }
    if nodes_fit == 0 {
        return Err(format!(
            "no node can hold one worker ({:?}, {} mCPU, {} MiB, models {:?})",
            job.gpu,
            job.cpu_milli,
            job.memory_mib,
            job.gpu_models
                .ids()
                .map(|id| topo.catalog.get(id).name.clone())
                .collect::<Vec<_>>()
        ));
    }
    if workers_fit < job.workers as u64 {
        return Err(format!(
            "{} workers of {:?} exceed what the cluster can ever hold ({workers_fit})",
            job.workers, job.gpu
        ));
    }
    Ok(())
}

/// How many workers of `job` an empty `node` holds by its GPUs, CPU and memory (whether
/// its GPU model is allowed is the caller's question).
pub(crate) fn workers_on_empty_node(job: &Job, topo: &Topology, node: &Node) -> u64 {
    let by_gpu = match job.gpu {
        GpuDemand::Whole(k) => (node.non_mig_gpus() / k) as u64,
        GpuDemand::None => u64::MAX,
        GpuDemand::Milli(m) => node.non_mig_gpus() as u64 * (1000 / m as u64),
        GpuDemand::Mig { compute, memory } => topo.mig_workers_on_empty_node(node, compute, memory),
    };
    let by_cpu = node
        .cpu_milli
        .checked_div(job.cpu_milli)
        .map_or(u64::MAX, u64::from);
    let by_memory = node
        .memory_mib
        .checked_div(job.memory_mib)
        .unwrap_or(u64::MAX);
    by_gpu.min(by_cpu).min(by_memory)
}

/// [`can_ever_fit`] remembered per job shape, for one topology (the inventory a server
/// was started with): a submit then costs a hash lookup, not a walk over every node.
/// Bounded: past [`EverFitMemo::CAPACITY`] shapes it starts over, so a client sending
/// ever-new shapes cannot grow it without limit.
#[derive(Debug, Default)]
pub struct EverFitMemo {
    answers: std::collections::HashMap<JobShape, Result<(), String>>,
}

impl EverFitMemo {
    pub const CAPACITY: usize = 4096;

    /// [`can_ever_fit`]`(job, topo)`; `topo` must be the same on every call.
    pub fn check(&mut self, job: &Job, topo: &Topology) -> Result<(), String> {
        let shape = JobShape::of(job);
        if let Some(answer) = self.answers.get(&shape) {
            return answer.clone();
        }
        if self.answers.len() >= Self::CAPACITY {
            self.answers.clear();
        }
        let answer = can_ever_fit(job, topo);
        self.answers.insert(shape, answer.clone());
        answer
    }
}

/// What decides whether a job fits: two jobs of one shape fit in exactly the same places.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct JobShape {
    workers: u32,
    gpu: GpuDemand,
    cpu_milli: u32,
    memory_mib: u64,
    gpu_models: GpuModelSet,
}

impl JobShape {
    fn of(job: &Job) -> Self {
        JobShape {
            workers: job.workers,
            gpu: job.gpu,
            cpu_milli: job.cpu_milli,
            memory_mib: job.memory_mib,
            gpu_models: job.gpu_models,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{ClusterSpec, JobId};

    fn topo() -> Topology {
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=2\ngpu_model='H100'\ngpus=8\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        Topology::build(&spec).unwrap()
    }

    fn job(id: u32, workers: u32, gpus: u16, cpu_milli: u32) -> Job {
        Job {
            workers,
            gpu: GpuDemand::Whole(gpus),
            cpu_milli,
            ..Job::whole_gpus(JobId(id), 1, 0.0, 0.0)
        }
    }

    #[test]
    fn the_memo_answers_as_can_ever_fit_does_per_shape_and_stays_bounded() {
        let topo = topo();
        let mut memo = EverFitMemo::default();
        let shapes = [
            job(1, 1, 8, 1000),
            job(2, 2, 8, 1000),
            job(3, 3, 8, 1000),  // three full nodes on a two-node cluster
            job(4, 1, 16, 1000), // more GPUs than a node has
            job(5, 1, 1, 128_000),
        ];
        for j in &shapes {
            assert_eq!(
                memo.check(j, &topo),
                can_ever_fit(j, &topo),
                "job {:?}",
                j.id
            );
        }
        assert!(memo.check(&shapes[0], &topo).is_ok());
        assert!(memo.check(&shapes[2], &topo).is_err());
        // Another job of a remembered shape gets the remembered answer.
        assert_eq!(
            memo.check(&job(9, 3, 8, 1000), &topo),
            can_ever_fit(&shapes[2], &topo)
        );
        assert_eq!(memo.answers.len(), shapes.len());
        for cpu in 0..(EverFitMemo::CAPACITY as u32 + 10) {
            let j = job(100, 1, 1, cpu + 1);
            assert_eq!(memo.check(&j, &topo), can_ever_fit(&j, &topo));
        }
        assert!(memo.answers.len() <= EverFitMemo::CAPACITY);
    }

    #[test]
    fn gpus_in_mig_mode_count_for_mig_jobs_only() {
        let spec = |mig: &str| {
            let text = format!(
                "name='c'\n[[nodes]]\ncount=2\ngpu_model='A100-80'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n{mig}\n"
            );
            Topology::build(&ClusterSpec::from_toml(&text).unwrap()).unwrap()
        };
        let slice = |workers| Job {
            workers,
            gpu: GpuDemand::Mig {
                compute: 3,
                memory: 4,
            },
            ..job(1, 1, 1, 1000)
        };
        let (open, one_each, none) = (spec(""), spec("mig_gpus=[3]"), spec("mig_gpus=[]"));
        // Four whole GPUs per node fit only where none is in MIG mode.
        assert!(can_ever_fit(&job(1, 2, 4, 1000), &open).is_ok());
        let err = can_ever_fit(&job(1, 1, 4, 1000), &one_each).unwrap_err();
        assert!(err.contains("no node can hold one worker"), "{err}");
        assert!(can_ever_fit(&job(1, 2, 3, 1000), &one_each).is_ok());
        // Two 3g instances per MIG GPU: 4 on the cluster with one MIG GPU per node.
        assert!(can_ever_fit(&slice(4), &one_each).is_ok());
        let err = can_ever_fit(&slice(5), &one_each).unwrap_err();
        assert!(err.contains("ever hold (4)"), "{err}");
        assert!(can_ever_fit(&slice(16), &open).is_ok());
        assert!(can_ever_fit(&slice(1), &none).is_err());
        // Fixed layouts hold the instances they list, whatever slices are left.
        let fixed = spec(
            "mig_gpus=[2, 3]\n[[nodes.mig_layout]]\ngpus=[2, 3]\ninstances=['3g.40gb', '2g.20gb', '1g.10gb', '1g.10gb']",
        );
        assert!(can_ever_fit(&slice(4), &fixed).is_ok());
        let err = can_ever_fit(&slice(5), &fixed).unwrap_err();
        assert!(err.contains("ever hold (4)"), "{err}");
        let four_g = Job {
            gpu: GpuDemand::Mig {
                compute: 4,
                memory: 4,
            },
            ..slice(1)
        };
        let err = can_ever_fit(&four_g, &fixed).unwrap_err();
        assert!(err.contains("no node can hold one worker"), "{err}");
        assert!(can_ever_fit(&four_g, &one_each).is_ok());
    }

    /// Finds room where a placer would, then answers with a placement that the state
    /// refuses (no workers at all): a placer's bug.
    #[derive(Debug)]
    struct RefusedPlacement;

    impl crate::framework::Placer for RefusedPlacement {
        fn place(
            &self,
            job: &Job,
            state: &mut ClusterState,
            _: &mut Context,
        ) -> Result<Placement, Status> {
            if state.idle_gpus() < job.gpu_count() {
                return Err(Status::Unschedulable("no room".into()));
            }
            Ok(Placement::default())
        }
    }

    /// Waits whenever anything runs, and otherwise places as topo-pack does: the learned
    /// policy's "wait", which it offers only while something runs.
    #[derive(Debug)]
    struct WaitsWhileAnythingRuns;

    impl crate::framework::Placer for WaitsWhileAnythingRuns {
        fn place(
            &self,
            job: &Job,
            state: &mut ClusterState,
            ctx: &mut Context,
        ) -> Result<Placement, Status> {
            if state.allocated_milli() > 0 {
                return Err(Status::Deferred("waits".into()));
            }
            crate::framework::Placer::place(&crate::policies::TopoPack, job, state, ctx)
        }
    }

    /// Priority order with preemption, placing with `placer`.
    fn preempting(placer: Box<dyn crate::framework::Placer>) -> Policy {
        Policy {
            name: "test".into(),
            order: Box::new(crate::policies::PriorityAge),
            placer,
            preemptor: Some(Box::new(crate::policies::PreemptLowerRank {
                min_runtime_s: 0.0,
            })),
            blocking: false,
            reservation: None,
            rebalance: None,
            consolidate: None,
            quota: None,
        }
    }

    #[test]
    fn a_placement_the_state_refuses_after_preempting_leaves_the_victims_running() {
        use rand::SeedableRng as _;
        let mut state = ClusterState::new(Arc::new(topo()));
        let low = job(1, 2, 8, 1000);
        let whole_cluster = Placement {
            workers: (0..2)
                .map(|n| crate::domain::WorkerPlacement {
                    node: NodeId(n),
                    gpus: state
                        .topology()
                        .node(NodeId(n))
                        .gpu_ids()
                        .map(crate::domain::GpuShare::whole)
                        .collect(),
                })
                .collect(),
        };
        state.allocate(&low, &whole_cluster).unwrap();
        let high = Job {
            priority: 5,
            ..job(2, 1, 8, 1000)
        };
        let pending = [Pending {
            job: &high,
            stats: JobStats::default(),
        }];
        let running = [Running {
            job: &low,
            placement: &whole_cluster,
            stats: JobStats::default(),
            started_at: 0.0,
            lost_work_s: 0.0,
        }];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut ctx = Context::new(1000.0, &mut rng);
        let policy = preempting(Box::new(RefusedPlacement));
        let d = run_cycle(&policy, &mut state, &pending, &running, &mut ctx);
        assert!(d.preempted.is_empty(), "{:?}", d.preempted);
        assert!(d.placed.is_empty());
        assert_eq!(d.errors.len(), 1, "{:?}", d.errors);
        assert_eq!(d.errors[0].0, 0);
        assert!(d.errors[0].1.contains("0 workers"), "{:?}", d.errors);
        // The victim still holds the whole cluster.
        assert_eq!(state.idle_gpus(), 0);
        state.check_consistency().unwrap();
    }

    #[test]
    fn a_deferred_job_stays_queued_and_nothing_is_preempted_moved_or_held_for_it() {
        use rand::SeedableRng as _;
        let mut state = ClusterState::new(Arc::new(topo()));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let low = job(1, 1, 1, 1000);
        let on_one_gpu = crate::framework::Placer::place(
            &crate::policies::TopoPack,
            &low,
            &mut state,
            &mut Context::new(0.0, &mut rng),
        )
        .unwrap();
        state.allocate(&low, &on_one_gpu).unwrap();
        // A gang of eight GPUs that the fifteen idle ones hold, ranked above `low`, and
        // owed a rebalance and a reservation at once.
        let gang = Job {
            priority: 5,
            ..job(2, 2, 4, 1000)
        };
        let mut policy = preempting(Box::new(WaitsWhileAnythingRuns));
        policy.reservation = Some(crate::framework::ReservationConfig {
            after_wait_s: 0.0,
            min_gpus: 1,
            max_share: 1.0,
        });
        policy.rebalance = Some(crate::framework::RebalanceConfig {
            after_wait_s: 0.0,
            max_moves: 4,
            min_runtime_s: 0.0,
            max_lost_s: None,
        });
        let pending = [Pending {
            job: &gang,
            stats: JobStats::default(),
        }];
        let running = [Running {
            job: &low,
            placement: &on_one_gpu,
            stats: JobStats::default(),
            started_at: 0.0,
            lost_work_s: 0.0,
        }];
        let mut ctx = Context::new(1000.0, &mut rng);
        let d = run_cycle(&policy, &mut state, &pending, &running, &mut ctx);
        assert!(d.preempted.is_empty(), "{:?}", d.preempted);
        assert!(d.migrated.is_empty(), "{:?}", d.migrated);
        assert_eq!(d.reserved, None);
        assert!(d.placed.is_empty() && d.errors.is_empty() && d.rejected.is_empty());
        assert_eq!(d.deferred, [(0, "waits".to_string())]);
        assert_eq!(state.allocated_milli(), 1000);
        assert!(state.topology().node_ids().all(|n| state.node_is_up(n)));
    }

    /// A tenant at its quota waits with the reason and does not stop a strict queue;
    /// what the cycle places counts against the quota at once; a job larger than its
    /// tenant's whole quota is refused.
    #[test]
    fn a_tenant_at_its_quota_waits_and_the_queue_goes_on_past_it() {
        use rand::SeedableRng as _;
        let mut state = ClusterState::new(Arc::new(topo()));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let of = |tenant: &str, j: Job| Job {
            tenant: tenant.into(),
            ..j
        };
        // Vision holds 2 GPUs with a low-priority, preemptible job.
        let running_job = of("vision", job(1, 1, 2, 1000));
        let placement = crate::framework::Placer::place(
            &crate::policies::TopoPack,
            &running_job,
            &mut state,
            &mut Context::new(0.0, &mut rng),
        )
        .unwrap();
        state.allocate(&running_job, &placement).unwrap();
        let mut policy = preempting(Box::new(crate::policies::TopoPack));
        policy.blocking = true;
        policy.quota =
            Some(toml::from_str("[tenants.vision]\ngpus = 4\n[tenants.nlp]\ngpus = 2\n").unwrap());
        let urgent = |id, tenant: &str, gpus| Job {
            priority: 5,
            ..of(tenant, job(id, 1, gpus, 1000))
        };
        // Ranked first to last (by priority, then submission): vision's 2 fit its quota
        // (2 + 2 = 4), its next 1 does not once they are placed; nlp's 4 can never fit
        // in 2; nlp's 2 fit.
        let jobs = [
            urgent(2, "vision", 2),
            urgent(3, "vision", 1),
            urgent(4, "nlp", 4),
            urgent(5, "nlp", 2),
        ];
        let pending: Vec<Pending> = jobs
            .iter()
            .map(|job| Pending {
                job,
                stats: JobStats::default(),
            })
            .collect();
        let running = [Running {
            job: &running_job,
            placement: &placement,
            stats: JobStats::default(),
            started_at: 0.0,
            lost_work_s: 0.0,
        }];
        let mut ctx = Context::new(1000.0, &mut rng);
        let d = run_cycle(&policy, &mut state, &pending, &running, &mut ctx);
        let placed: Vec<usize> = d.placed.iter().map(|(i, _)| *i).collect();
        assert_eq!(placed, [0, 3]);
        assert_eq!(d.over_quota.len(), 1);
        assert_eq!(d.over_quota[0].0, 1);
        let why = d.over_quota[0].1.describe("vision");
        assert!(why.contains("holds 4 of its 4 GPUs"), "{why}");
        assert_eq!(d.rejected.len(), 1);
        assert_eq!(d.rejected[0].0, 2);
        assert!(
            d.rejected[0].1.contains("alone asks 4"),
            "{}",
            d.rejected[0].1
        );
    }

    /// Two gangs of one shape and class: the first in the queue's order found no room but
    /// is owed no reservation (it was just requeued), the second has waited past the
    /// threshold. The second still gets the nodes held for it.
    #[test]
    fn a_starving_gang_behind_one_of_its_shape_that_is_not_owed_a_reservation_gets_one() {
        use rand::SeedableRng as _;
        let mut state = ClusterState::new(Arc::new(topo()));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        // One GPU busy on each node: no 8-GPU worker fits anywhere.
        let small = job(1, 2, 1, 1000);
        let on_both = Placement {
            workers: (0..2)
                .map(|n| crate::domain::WorkerPlacement {
                    node: NodeId(n),
                    gpus: vec![crate::domain::GpuShare {
                        gpu: state.topology().node(NodeId(n)).gpu_ids().next().unwrap(),
                        milli: 1000,
                        mig_compute: 0,
                        mig_memory: 0,
                    }],
                })
                .collect(),
        };
        state.allocate(&small, &on_both).unwrap();
        let mut policy = preempting(Box::new(crate::policies::TopoPack));
        policy.preemptor = None;
        policy.reservation = Some(crate::framework::ReservationConfig {
            after_wait_s: 600.0,
            min_gpus: 8,
            max_share: 1.0,
        });
        // Submitted first, so ranked first; requeued a minute ago.
        let requeued = Job {
            submit_time: 0.0,
            ..job(2, 1, 8, 1000)
        };
        let starving = Job {
            submit_time: 10.0,
            ..job(3, 1, 8, 1000)
        };
        let now = 5000.0;
        let pending = [
            Pending {
                job: &requeued,
                stats: JobStats {
                    queued_since: now - 60.0,
                    ..JobStats::default()
                },
            },
            Pending {
                job: &starving,
                stats: JobStats {
                    queued_since: 10.0,
                    ..JobStats::default()
                },
            },
        ];
        let running = [Running {
            job: &small,
            placement: &on_both,
            stats: JobStats::default(),
            started_at: 0.0,
            lost_work_s: 0.0,
        }];
        let mut ctx = Context::new(now, &mut rng);
        let d = run_cycle(&policy, &mut state, &pending, &running, &mut ctx);
        assert!(d.placed.is_empty());
        assert_eq!(
            d.reserved.map(|(i, _)| i),
            Some(1),
            "the starving gang got no reservation"
        );
    }
}
