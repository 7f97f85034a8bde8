//! `topo-pack`: the tightest topology domain first, like Slurm's topology/tree plugin
//! (SchedMD, "Topology Guide": choose the lowest-level switch whose subtree satisfies
//! the request, best fit among such switches), refined to NVLink islands inside a node.

use crate::domain::{
    ClusterState, GpuDemand, GpuId, GpuShare, Job, NodeId, Placement, TopoLevel, WorkerPlacement,
};
use crate::framework::{
    Context, Placer, ScoredPlacer, Status, TieBreak, place_workers_tentatively, smallest_k,
};
use crate::policies::scorers::BestFit;

/// Domains tried per level before moving to a looser level; bounds decision time on
/// large clusters, and the best-fit order puts the likeliest first.
const DOMAINS_PER_LEVEL: usize = 16;

#[derive(Debug, Default)]
pub struct TopoPack;

impl Placer for TopoPack {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        if job.gpu.is_shared() || job.gpu == GpuDemand::None {
            return place_single_best_fit(job, state, ctx);
        }
        let need = job.gpu_count();
        let topo = state.topology_arc().clone();
        for level in [
            TopoLevel::Node,
            TopoLevel::Rack,
            TopoLevel::Spine,
            TopoLevel::Cluster,
        ] {
            // (idle GPUs, domain id) of every domain with room: only the first few in
            // that order are tried, so only they are kept (the node level walks every
            // node, and this runs for every placement).
            let with_room: Vec<(u32, u32)> = match level {
                TopoLevel::Node => smallest_k(
                    topo.node_ids()
                        .filter(|&n| state.node_is_up(n))
                        .map(|n| (state.node_idle_gpus(n) as u32, n.0))
                        .filter(|&(idle, _)| idle >= need),
                    DOMAINS_PER_LEVEL,
                ),
                TopoLevel::Rack => smallest_k(
                    (0..topo.racks().len() as u32)
                        .map(|i| (state.rack_idle_gpus(crate::domain::RackId(i)), i))
                        .filter(|&(idle, _)| idle >= need),
                    DOMAINS_PER_LEVEL,
                ),
                TopoLevel::Spine => smallest_k(
                    (0..topo.spines().len() as u32)
                        .map(|i| (state.spine_idle_gpus(crate::domain::SpineId(i)), i))
                        .filter(|&(idle, _)| idle >= need),
                    DOMAINS_PER_LEVEL,
                ),
                _ if state.idle_gpus() >= need => vec![(state.idle_gpus(), 0)],
                _ => vec![],
            };
            let nodes_of = |id: u32| -> std::ops::Range<u32> {
                match level {
                    TopoLevel::Node => id..id + 1,
                    TopoLevel::Rack => topo.racks()[id as usize].nodes.clone(),
                    TopoLevel::Spine => {
                        let s = &topo.spines()[id as usize];
                        let racks = &topo.racks()[s.racks.start as usize..s.racks.end as usize];
                        racks.first().map_or(0, |r| r.nodes.start)
                            ..racks.last().map_or(0, |r| r.nodes.end)
                    }
                    _ => 0..topo.nodes().len() as u32,
                }
            };
            for nodes in with_room.into_iter().map(|(_, id)| nodes_of(id)) {
                if let Some(p) = fill_domain(job, state, nodes) {
                    return Ok(p);
                }
            }
        }
        Err(Status::Unschedulable(format!(
            "no domain has {need} idle GPUs that fit"
        )))
    }
}

/// Places the gang inside one domain using as few nodes as possible: while no single
/// node can take the rest, take the node with the most idle GPUs; then the node that fits
/// the rest most tightly.
fn fill_domain(
    job: &Job,
    state: &mut ClusterState,
    nodes: std::ops::Range<u32>,
) -> Option<Placement> {
    let GpuDemand::Whole(per_worker) = job.gpu else {
        return None;
    };
    place_workers_tentatively(job, state, |state, placed| {
        let no_room = || Status::Unschedulable("domain is full".into());
        let remaining_gpus = (job.workers as usize - placed) as u32 * per_worker as u32;
        let candidates = nodes
            .clone()
            .map(NodeId)
            .filter(|&n| state.worker_fits(job, n));
        let tight = candidates
            .clone()
            .filter(|&n| state.node_idle_gpus(n) as u32 >= remaining_gpus)
            .min_by_key(|&n| (state.node_idle_gpus(n), n));
        let node = tight
            .or_else(|| candidates.max_by_key(|&n| (state.node_idle_gpus(n), std::cmp::Reverse(n))))
            .ok_or_else(no_room)?;
        let gpus = pick_island_gpus(state, node, per_worker).ok_or_else(no_room)?;
        Ok(WorkerPlacement { node, gpus })
    })
    .ok()
}

/// `count` idle GPUs on `node`, inside one NVLink island when one has room (the island
/// with the fewest idle GPUs that suffices), else from the emptiest islands first.
fn pick_island_gpus(state: &ClusterState, node: NodeId, count: u16) -> Option<Vec<GpuShare>> {
    let topo = state.topology();
    let mut islands: Vec<(u32, Vec<GpuId>)> = Vec::new();
    for g in topo
        .node(node)
        .gpu_ids()
        .filter(|&g| state.gpu_fits(g, GpuDemand::Whole(1)))
    {
        let island = topo.gpu(g).island;
        match islands.last_mut() {
            Some((i, gpus)) if *i == island => gpus.push(g),
            _ => islands.push((island, vec![g])),
        }
    }
    if let Some((_, gpus)) = islands
        .iter()
        .filter(|(_, gpus)| gpus.len() >= count as usize)
        .min_by_key(|(i, gpus)| (gpus.len(), *i))
    {
        return Some(
            gpus[..count as usize]
                .iter()
                .map(|&g| GpuShare::whole(g))
                .collect(),
        );
    }
    islands.sort_by_key(|(i, gpus)| (std::cmp::Reverse(gpus.len()), *i));
    let picked: Vec<GpuShare> = islands
        .iter()
        .flat_map(|(_, gpus)| gpus.iter())
        .take(count as usize)
        .map(|&g| GpuShare::whole(g))
        .collect();
    (picked.len() == count as usize).then_some(picked)
}

/// Shared-GPU and CPU-only workers have no topology to exploit: best fit by node.
fn place_single_best_fit(
    job: &Job,
    state: &mut ClusterState,
    ctx: &mut Context,
) -> Result<Placement, Status> {
    ScoredPlacer::new(BestFit, TieBreak::First).place(job, state, ctx)
}
