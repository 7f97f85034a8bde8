//! Candidate generation: deterministic, feasible placements for the network to rank —
//! the fallback's own choice first, then the best few nodes by FGD and by best fit (one
//! worker), or the tightest domain, best-fit and packing gangs (several workers).
//!
//! With [`CandidateSet::Wide`] a one-worker job's remaining slots are filled with places
//! far down those rankings: the feasible nodes fall into classes — for a share, (the
//! GPU's free capacity, the node's idle GPUs, GPU model); for whole GPUs, (the node's idle
//! GPUs, its partly used GPUs, its free CPU in 8-core steps, GPU model) — and the first
//! node of each class, tightest classes first, becomes a candidate: places the rankings
//! miss, such as a share on the GPU whose free capacity it fills exactly. One-step
//! rollout planning over them left about 10 GPUs fewer unallocated than FGD on openb,
//! over the ranked candidates 7, but a network trained to rank them gained no more than
//! one trained on the ranked set (README, "The rollout planner's ceiling" and "Training
//! on the wide candidates"); the set is there for the next learner to try.

use std::collections::BTreeMap;

use marshal_model::policy::CandidateSet;

use crate::domain::{ClusterState, GpuDemand, GpuShare, Job, NodeId, Placement, WorkerPlacement};
use crate::framework::{Context, NodeScorer, Placer, ScoredPlacer, TieBreak, feasible_nodes};
use crate::policies::{BestFit, Fgd, GpuPacking, TopoPack};

use super::features::{Choice, NodeScores};

/// Alternatives taken from each node ranking for a single-worker job.
const TOP_NODES: usize = 4;

/// Scores every feasible node with FGD and best fit (once per decision).
pub fn node_scores(job: &Job, state: &ClusterState, ctx: &mut Context, fgd: &Fgd) -> NodeScores {
    let nodes = feasible_nodes(job, state, ctx);
    let mut fgd_scores = Vec::with_capacity(nodes.len());
    fgd.score_nodes(job, &nodes, state, ctx, &mut fgd_scores);
    let mut bf = Vec::with_capacity(nodes.len());
    BestFit.score_nodes(job, &nodes, state, ctx, &mut bf);
    NodeScores {
        nodes,
        fgd: fgd_scores,
        best_fit: bf,
    }
}

/// Indices of the `k` best scores, first listed on ties (as `TieBreak::First`).
fn top_k(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// A canonical form for deduplication: two placements on the same GPU shares are one.
fn key(p: &Placement) -> Vec<(u32, u32, u16)> {
    let mut k: Vec<(u32, u32, u16)> = p
        .workers
        .iter()
        .flat_map(|w| w.gpus.iter().map(move |s| (w.node.0, s.gpu.0, s.milli)))
        .collect();
    k.sort_unstable();
    k
}

/// The decision's choices from `set`: `fallback` (if it found one) first, then distinct
/// alternatives, at most `limit` in all.
pub fn generate(
    job: &Job,
    state: &mut ClusterState,
    ctx: &mut Context,
    fgd: &Fgd,
    scores: &NodeScores,
    fallback: Option<Placement>,
    (limit, set): (usize, CandidateSet),
) -> Vec<Choice> {
    let mut out: Vec<Choice> = Vec::new();
    let mut seen: Vec<Vec<(u32, u32, u16)>> = Vec::new();
    let mut push = |p: Placement, is_fallback: bool, out: &mut Vec<Choice>| {
        let k = key(&p);
        if out.len() < limit && !seen.contains(&k) {
            seen.push(k);
            out.push(Choice::Place {
                placement: p,
                fallback: is_fallback,
            });
        }
    };
    if let Some(p) = fallback {
        push(p, true, &mut out);
    }
    if job.workers == 1 {
        let mut picks = top_k(&scores.fgd, TOP_NODES);
        for i in top_k(&scores.best_fit, TOP_NODES) {
            if !picks.contains(&i) {
                picks.push(i);
            }
        }
        for i in picks {
            let node = scores.nodes[i];
            if let Some(gpus) = fgd.pick_gpus(job, node, state, ctx) {
                push(
                    Placement {
                        workers: vec![WorkerPlacement { node, gpus }],
                    },
                    false,
                    &mut out,
                );
            }
        }
        if set == CandidateSet::Wide {
            for (node, gpus) in class_firsts(job, state, ctx, fgd, &scores.nodes, limit) {
                if out.len() == limit {
                    break;
                }
                push(
                    Placement {
                        workers: vec![WorkerPlacement { node, gpus }],
                    },
                    false,
                    &mut out,
                );
            }
        }
    } else {
        let placers: [&dyn Placer; 3] = [
            &TopoPack,
            &ScoredPlacer::new(BestFit, TieBreak::First),
            &ScoredPlacer::new(GpuPacking, TieBreak::First),
        ];
        for placer in placers {
            if let Ok(p) = placer.place(job, state, ctx) {
                push(p, false, &mut out);
            }
        }
    }
    out
}

/// A class of place, ordered tightest first.
type ClassKey = (u32, u32, u32, u32);

/// The first of `nodes` in each class of place for a one-worker `job` (module docs), with
/// its GPUs, tightest class first; at most `limit` of them. Empty for a MIG or CPU-only
/// worker. (Public for the rollout planner's study, which goes past the slot limit.)
pub fn class_firsts(
    job: &Job,
    state: &mut ClusterState,
    ctx: &mut Context,
    fgd: &Fgd,
    nodes: &[NodeId],
    limit: usize,
) -> Vec<(NodeId, Vec<GpuShare>)> {
    // Keyed so that iteration runs from the tightest class: least free capacity (or
    // fewest idle GPUs) first. Whole GPUs are picked (by FGD) only for the classes used.
    let mut firsts: BTreeMap<ClassKey, (NodeId, Option<GpuShare>)> = BTreeMap::new();
    for &node in nodes {
        let topo_node = state.topology().node(node);
        let model = topo_node.model.map_or(u32::MAX, |m| u32::from(m.0));
        let idle = u32::from(state.node_idle_gpus(node));
        match job.gpu {
            GpuDemand::Milli(_) => {
                for gpu in topo_node.gpu_ids() {
                    if state.gpu_fits(gpu, job.gpu) {
                        let free = u32::from(state.free_milli(gpu));
                        firsts
                            .entry((free, idle, 0, model))
                            .or_insert((node, Some(GpuShare::for_demand(gpu, job.gpu))));
                    }
                }
            }
            GpuDemand::Whole(_) => {
                let partly = topo_node
                    .gpu_ids()
                    .filter(|&g| (1..1000).contains(&state.free_milli(g)))
                    .count() as u32;
                let cpu = state.node_cpu_free(node) / 8000;
                firsts
                    .entry((idle, partly, cpu, model))
                    .or_insert((node, None));
            }
            // MIG instances and CPU-only workers have no classes of place worth widening.
            GpuDemand::Mig { .. } | GpuDemand::None => return Vec::new(),
        }
    }
    firsts
        .into_values()
        .filter_map(|(node, share)| match share {
            Some(share) => Some((node, vec![share])),
            None => fgd
                .pick_gpus(job, node, state, ctx)
                .map(|gpus| (node, gpus)),
        })
        .take(limit)
        .collect()
}
