//! Candidate generation: deterministic, feasible placements for the network to rank —
//! the fallback's own choice first, then the best few nodes by FGD and by best fit (one
//! worker), or the tightest domain, best-fit and packing gangs (several workers).

use crate::domain::{ClusterState, Job, Placement, WorkerPlacement};
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

/// The decision's choices: `fallback` (if it found one) first, then distinct
/// alternatives, at most `limit` in all.
pub fn generate(
    job: &Job,
    state: &mut ClusterState,
    ctx: &mut Context,
    fgd: &Fgd,
    scores: &NodeScores,
    fallback: Option<Placement>,
    limit: usize,
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
