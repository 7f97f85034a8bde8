//! Padding a slice of placement graphs into dense tensors.
//!
//! A batch of `B` graphs is padded to `N` = its largest graph's GPU count (not to
//! [`MAX_GPUS_PER_GRAPH`](crate::MAX_GPUS_PER_GRAPH)), so batches of 8-GPU placements cost
//! 8×8 edges each. Padded nodes have zero features and mask 0; absent links have zero features
//! and adjacency 0, so neither sends messages nor enters a pooled readout.

use burn::tensor::{Device, Tensor, TensorData};

use crate::features::{
    GPU_FEATURES, JOB_FEATURES, LINK_FEATURES, MEM_PHASES, PlacementGraph, Targets,
};
use crate::normalize::Normalization;

/// Network inputs for `B` graphs padded to `N` GPUs.
#[derive(Debug, Clone)]
pub struct GraphBatch {
    /// `[B, N, GPU_FEATURES]`, standardised.
    pub nodes: Tensor<3>,
    /// `[B, N, N, LINK_FEATURES]`, standardised, symmetric; zero where there is no link.
    pub edges: Tensor<4>,
    /// `[B, N, N]`: 1 where a link exists.
    pub adjacency: Tensor<3>,
    /// `[B, N]`: 1 for real GPUs, 0 for padding.
    pub node_mask: Tensor<2>,
    /// `[B, JOB_FEATURES]`, standardised.
    pub job: Tensor<2>,
    /// `[B, 1]`: the prior ([`crate::PRIOR_JOB_SLOT`]) in standardised step-time units,
    /// unclamped.
    pub prior: Tensor<2>,
}

impl GraphBatch {
    /// Builds the tensors. The graphs must already be validated.
    pub fn new(graphs: &[&PlacementGraph], norm: &Normalization, device: &Device) -> Self {
        let b = graphs.len();
        let n = graphs
            .iter()
            .map(|g| g.gpus.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut nodes = vec![0f32; b * n * GPU_FEATURES];
        let mut edges = vec![0f32; b * n * n * LINK_FEATURES];
        let mut adjacency = vec![0f32; b * n * n];
        let mut node_mask = vec![0f32; b * n];
        let mut job = vec![0f32; b * JOB_FEATURES];
        let mut prior = Vec::with_capacity(b);
        for (gi, g) in graphs.iter().enumerate() {
            for (ni, gpu) in g.gpus.iter().enumerate() {
                let base = (gi * n + ni) * GPU_FEATURES;
                for (f, v) in gpu.values.iter().enumerate() {
                    nodes[base + f] = norm.gpu.input(f, *v);
                }
                node_mask[gi * n + ni] = 1.0;
            }
            for (a, c, link) in &g.links {
                let (a, c) = (usize::from(*a), usize::from(*c));
                for (i, j) in [(a, c), (c, a)] {
                    let cell = (gi * n + i) * n + j;
                    adjacency[cell] = 1.0;
                    for (f, v) in link.values.iter().enumerate() {
                        edges[cell * LINK_FEATURES + f] = norm.link.input(f, *v);
                    }
                }
            }
            for (f, v) in g.job.values.iter().enumerate() {
                job[gi * JOB_FEATURES + f] = norm.job.input(f, *v);
            }
            prior.push(norm.prior_offset(&g.job.values));
        }
        Self {
            nodes: Tensor::from_data(TensorData::new(nodes, [b, n, GPU_FEATURES]), device),
            edges: Tensor::from_data(TensorData::new(edges, [b, n, n, LINK_FEATURES]), device),
            adjacency: Tensor::from_data(TensorData::new(adjacency, [b, n, n]), device),
            node_mask: Tensor::from_data(TensorData::new(node_mask, [b, n]), device),
            job: Tensor::from_data(TensorData::new(job, [b, JOB_FEATURES]), device),
            prior: Tensor::from_data(TensorData::new(prior, [b, 1]), device),
        }
    }
}

/// Standardised training targets for `B` graphs, with masks for unknown values.
#[derive(Debug, Clone)]
pub struct TargetBatch {
    /// `[B, 1]` standardised `ln(step_time_s)`.
    pub log_step: Tensor<2>,
    /// `[B, MEM_PHASES]` standardised peak memory, 0 where unknown.
    pub peak_mem: Tensor<2>,
    /// `[B, MEM_PHASES]`: 1 where known.
    pub peak_mem_mask: Tensor<2>,
    /// Number of known memory values (≥ 1 to keep the mean finite).
    pub peak_mem_count: f32,
    /// `[B, 1]` standardised utilisation, 0 where unknown.
    pub util: Tensor<2>,
    /// `[B, 1]`: 1 where known.
    pub util_mask: Tensor<2>,
    /// Number of known utilisation values (≥ 1).
    pub util_count: f32,
}

impl TargetBatch {
    /// Builds the tensors. The targets must already be validated.
    pub fn new(targets: &[&Targets], norm: &Normalization, device: &Device) -> Self {
        let b = targets.len();
        let mut log_step = Vec::with_capacity(b);
        let mut mem = vec![0f32; b * MEM_PHASES];
        let mut mem_mask = vec![0f32; b * MEM_PHASES];
        let mut util = vec![0f32; b];
        let mut util_mask = vec![0f32; b];
        for (i, t) in targets.iter().enumerate() {
            log_step.push(norm.log_step_time.apply(0, t.step_time_s.ln()));
            for (p, v) in t.peak_mem_gib.iter().enumerate() {
                if !v.is_nan() {
                    mem[i * MEM_PHASES + p] = norm.peak_mem.apply(p, *v);
                    mem_mask[i * MEM_PHASES + p] = 1.0;
                }
            }
            if !t.gpu_util_pct.is_nan() {
                util[i] = norm.gpu_util.apply(0, t.gpu_util_pct);
                util_mask[i] = 1.0;
            }
        }
        let mem_count = mem_mask.iter().sum::<f32>().max(1.0);
        let util_count = util_mask.iter().sum::<f32>().max(1.0);
        let t2 = |v: Vec<f32>, w: usize| Tensor::from_data(TensorData::new(v, [b, w]), device);
        Self {
            log_step: t2(log_step, 1),
            peak_mem: t2(mem, MEM_PHASES),
            peak_mem_mask: t2(mem_mask, MEM_PHASES),
            peak_mem_count: mem_count,
            util: t2(util, 1),
            util_mask: t2(util_mask, 1),
            util_count,
        }
    }
}
