//! The sum-of-squares rule of online bin packing (Csirik, Johnson, Kenyon, Orlin, Shor
//! and Weber, JACM 2006) for GPU shares, as a tie-break of another scorer (`fgd-sumsq`:
//! FGD's ties).
//!
//! With N(h) the number of partly used GPUs whose free capacity is h milli (per GPU
//! model by default; GPUs a share cannot use, such as MIG-partitioned ones, are not
//! counted), a share of size s goes where it lowers Σ N(h)² most; idle and full GPUs are
//! not counted. The rule keeps the population of gaps even, so that later shares find a
//! gap of their size. Among nodes it breaks the inner scorer's ties (its gain, weighted
//! by 1e-5, stays below one of FGD's integer score steps while |gain| < 10⁵); inside the
//! chosen node it picks the GPU by the gain alone (the first on ties), not by the inner
//! scorer. Whole-GPU tasks change no partly used GPU and are left to the inner scorer.
//!
//! On openb it is no policy of its own: it saves GPUs on some workloads and loses up to
//! a quarter on others (README, "The sum-of-squares tie-break once more"). The learned
//! policy's share-ties switch turns it on where its search found it pays.

use std::collections::BTreeMap;

use crate::domain::{ClusterState, GpuDemand, GpuId, GpuModelId, GpuShare, Job, NodeId};
use crate::framework::{Context, NodeScorer};

/// `inner`'s score plus `weight` times the sum-of-squares gain of a share.
#[derive(Debug)]
pub struct SumOfSquares<T> {
    pub inner: T,
    /// 1e-5 makes the rule a tie-break of an integer score such as FGD's.
    pub weight: f64,
    /// Counts gaps per GPU model (else over the whole cluster).
    pub per_model: bool,
    /// Among equal scores, a node whose GPUs are all idle comes last (the rule alone
    /// breaks up nodes that multi-GPU tasks need whole).
    pub spare_idle_nodes: bool,
}

impl<T> SumOfSquares<T> {
    /// The rule as a tie-break of `inner`'s integer scores, gaps counted per GPU model.
    pub fn tie_break_of(inner: T) -> SumOfSquares<T> {
        SumOfSquares {
            inner,
            weight: 1e-5,
            per_model: true,
            spare_idle_nodes: false,
        }
    }
}

/// N(h) for h in 0..=1000 over the GPUs of `model` (all GPUs for `None`); idle and full
/// GPUs are not counted.
pub fn gap_counts(state: &ClusterState, model: Option<GpuModelId>) -> Vec<i64> {
    let mut counts = vec![0i64; 1001];
    for n in state.topology().node_ids() {
        let node = state.topology().node(n);
        if model.is_some() && node.model != model {
            continue;
        }
        for g in node
            .gpu_ids()
            .filter(|&g| state.gpu_fits(g, GpuDemand::Milli(1)))
        {
            counts[usize::from(state.free_milli(g))] += 1;
        }
    }
    counts[0] = 0;
    counts[1000] = 0;
    counts
}

/// −ΔΣN² of putting a share of `s` milli on a GPU with `h` free (higher is better);
/// `counts` as [`gap_counts`] gives them, `s ≤ h ≤ 1000`.
pub fn sum_of_squares_gain(counts: &[i64], h: u16, s: u16) -> i64 {
    debug_assert!(s <= h && h <= 1000 && counts.len() > 1000, "h {h}, s {s}");
    if s == 0 {
        return 0;
    }
    let (from, to) = (usize::from(h), usize::from(h - s));
    // N(h) − 1 and N(h − s) + 1; the partly used GPUs only.
    let leaves = if from != 1000 {
        1 - 2 * counts[from]
    } else {
        0
    };
    let joins = if to != 0 { 2 * counts[to] + 1 } else { 0 };
    -(leaves + joins)
}

impl<T: NodeScorer> SumOfSquares<T> {
    fn counts(&self, node: NodeId, state: &ClusterState) -> Vec<i64> {
        let model = state.topology().node(node).model;
        gap_counts(state, if self.per_model { model } else { None })
    }

    /// The best gain on `node` for a share `job`, and the GPU's index within the node.
    fn best_gpu(
        &self,
        job: &Job,
        node: NodeId,
        state: &ClusterState,
        counts: &[i64],
    ) -> Option<(i64, usize)> {
        let GpuDemand::Milli(s) = job.gpu else {
            return None;
        };
        let mut best: Option<(i64, usize)> = None;
        for (i, g) in state.topology().node(node).gpu_ids().enumerate() {
            if !state.gpu_fits(g, job.gpu) {
                continue;
            }
            let h = state.free_milli(g);
            let v = sum_of_squares_gain(counts, h, s);
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, i));
            }
        }
        best
    }
}

impl<T: NodeScorer> NodeScorer for SumOfSquares<T> {
    fn score(&self, job: &Job, node: NodeId, state: &ClusterState, ctx: &mut Context) -> f64 {
        let mut scores = Vec::with_capacity(1);
        self.score_nodes(job, &[node], state, ctx, &mut scores);
        scores[0]
    }

    fn score_nodes(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        ctx: &mut Context,
        scores: &mut Vec<f64>,
    ) {
        let start = scores.len();
        self.inner.score_nodes(job, nodes, state, ctx, scores);
        if !matches!(job.gpu, GpuDemand::Milli(_)) {
            return;
        }
        // The gap counts are taken once per GPU model per decision.
        let mut by_model: BTreeMap<Option<u8>, Vec<i64>> = BTreeMap::new();
        for (k, &node) in nodes.iter().enumerate() {
            let topo_node = state.topology().node(node);
            let key = if self.per_model {
                topo_node.model.map(|m| m.0)
            } else {
                None
            };
            let counts = by_model
                .entry(key)
                .or_insert_with(|| self.counts(node, state));
            if let Some((v, _)) = self.best_gpu(job, node, state, counts) {
                scores[start + k] += v as f64 * self.weight;
            }
            if self.spare_idle_nodes
                && usize::from(state.node_idle_gpus(node)) == topo_node.gpu_ids().count()
            {
                // Below every tied node, above every lower integer score.
                scores[start + k] -= 0.5;
            }
        }
    }

    fn pick_gpus(
        &self,
        job: &Job,
        node: NodeId,
        state: &ClusterState,
        ctx: &mut Context,
    ) -> Option<Vec<GpuShare>> {
        let counts = self.counts(node, state);
        match self.best_gpu(job, node, state, &counts) {
            Some((_, i)) => {
                let g = GpuId(state.topology().node(node).gpus.start + i as u32);
                Some(vec![GpuShare::for_demand(g, job.gpu)])
            }
            None => self.inner.pick_gpus(job, node, state, ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ΣN² over the partly used gaps, the definition the gain is a difference of.
    fn sum_of_squares(counts: &[i64]) -> i64 {
        counts[1..1000].iter().map(|c| c * c).sum()
    }

    #[test]
    fn the_gain_is_the_drop_in_the_sum_of_squares() {
        let mut counts = vec![0i64; 1001];
        for (h, c) in [(100, 3), (300, 5), (500, 1), (700, 2), (900, 4)] {
            counts[h] = c;
        }
        for (h, s) in [
            (1000u16, 300u16),
            (1000, 1000),
            (700, 400),
            (500, 500),
            (900, 600),
            (300, 200),
            (1000, 900),
        ] {
            let mut after = counts.clone();
            if h != 1000 {
                after[usize::from(h)] -= 1;
            }
            if h - s != 0 {
                after[usize::from(h - s)] += 1;
            }
            assert_eq!(
                sum_of_squares_gain(&counts, h, s),
                sum_of_squares(&counts) - sum_of_squares(&after),
                "h {h}, s {s}"
            );
        }
    }
}
