//! The filter → score → pick placer that Kubernetes-style policies share.

use crate::domain::{ClusterState, GpuDemand, GpuShare, Job, NodeId, Placement, WorkerPlacement};
use crate::framework::{Context, NodeScorer, Placer, Status};

/// The nodes one worker of `job` fits on, in the context's listing order (which breaks
/// score ties), or node-id order without one.
pub fn feasible_nodes(job: &Job, state: &ClusterState, ctx: &Context) -> Vec<NodeId> {
    match ctx.node_order {
        Some(order) => order
            .iter()
            .copied()
            .filter(|&n| state.worker_fits(job, n))
            .collect(),
        None => state.fitting_nodes(job).collect(),
    }
}

/// How to choose among nodes of equal score.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TieBreak {
    /// Lowest node id: deterministic without randomness.
    First,
    /// Uniformly among the best, as the Kubernetes scheduler's `selectHost` does.
    Random,
}

/// Places a gang worker by worker: each worker goes to the best-scoring feasible node,
/// with the earlier workers already applied (as Kubernetes co-scheduling does); the gang
/// is released again before returning so that reserving it stays atomic.
#[derive(Debug)]
pub struct ScoredPlacer<S> {
    pub scorer: S,
    pub tie_break: TieBreak,
}

impl<S: NodeScorer> ScoredPlacer<S> {
    pub fn new(scorer: S, tie_break: TieBreak) -> Self {
        ScoredPlacer { scorer, tie_break }
    }

    fn best_node(&self, job: &Job, state: &ClusterState, ctx: &mut Context) -> Option<NodeId> {
        let feasible = feasible_nodes(job, state, ctx);
        let mut scores = Vec::with_capacity(feasible.len());
        self.scorer
            .score_nodes(job, &feasible, state, ctx, &mut scores);
        let mut best: Option<(f64, NodeId)> = None;
        let mut ties = 0u32;
        for (&node, &score) in feasible.iter().zip(&scores) {
            match best {
                Some((b, _)) if score < b => {}
                Some((b, _)) if score == b => {
                    ties += 1;
                    if self.tie_break == TieBreak::Random
                        && rand::Rng::random_range(ctx.rng, 0..ties + 1) == 0
                    {
                        best = Some((score, node));
                    }
                }
                _ => {
                    best = Some((score, node));
                    ties = 0;
                }
            }
        }
        best.map(|(_, n)| n)
    }
}

impl<S: NodeScorer> Placer for ScoredPlacer<S> {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        place_workers_tentatively(job, state, |state, placed| {
            let node = self.best_node(job, state, ctx).ok_or_else(|| {
                Status::Unschedulable(format!(
                    "no node fits worker {} of {}",
                    placed + 1,
                    job.workers
                ))
            })?;
            let gpus = self
                .scorer
                .pick_gpus(job, node, state, ctx)
                .ok_or_else(|| {
                    Status::Unschedulable(format!("node {} has no GPU that fits", node.0))
                })?;
            Ok(WorkerPlacement { node, gpus })
        })
    }

    fn node_scores(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        ctx: &mut Context,
    ) -> Option<Vec<f64>> {
        let mut scores = Vec::with_capacity(nodes.len());
        self.scorer.score_nodes(job, nodes, state, ctx, &mut scores);
        Some(scores)
    }
}

/// Builds a gang worker by worker: `next_worker` chooses worker `k` (given how many are
/// placed) on the state with the earlier workers applied. Every tentative worker is
/// released before returning, whatever the outcome, so the caller reserves the gang
/// atomically afterwards.
pub fn place_workers_tentatively(
    job: &Job,
    state: &mut ClusterState,
    mut next_worker: impl FnMut(&ClusterState, usize) -> Result<WorkerPlacement, Status>,
) -> Result<Placement, Status> {
    let mut placement = Placement::default();
    let mut outcome = Ok(());
    while placement.workers.len() < job.workers as usize {
        let worker = match next_worker(state, placement.workers.len()) {
            Ok(w) => w,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        };
        if let Err(e) = state.reserve_worker(job, &worker) {
            outcome = Err(Status::Error(e));
            break;
        }
        placement.workers.push(worker);
    }
    for w in placement.workers.iter().rev() {
        state.release_worker(job, w);
    }
    outcome.map(|()| placement)
}

/// For a share: the GPU with the least free capacity that still fits (best fit), lowest
/// index on ties. For whole GPUs: the lowest-indexed idle GPUs.
pub fn pick_gpus_best_fit(job: &Job, node: NodeId, state: &ClusterState) -> Option<Vec<GpuShare>> {
    let gpus = state.topology().node(node).gpu_ids();
    match job.gpu {
        GpuDemand::None => Some(Vec::new()),
        GpuDemand::Whole(k) => {
            let idle: Vec<GpuShare> = gpus
                .filter(|&g| state.gpu_fits(g, GpuDemand::Whole(1)))
                .take(k as usize)
                .map(GpuShare::whole)
                .collect();
            (idle.len() == k as usize).then_some(idle)
        }
        GpuDemand::Milli(_) | GpuDemand::Mig { .. } => gpus
            .filter(|&g| state.gpu_fits(g, job.gpu))
            .min_by_key(|&g| state.free_milli(g))
            .map(|g| vec![GpuShare::for_demand(g, job.gpu)]),
    }
}
