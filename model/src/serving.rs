//! The predictor's forward pass in plain Rust, one graph at a time, for serving.
//!
//! The same function as [`PredictorNetwork::forward`] (a test compares them on random
//! graphs of mixed sizes), computed without padding and with two savings the tensor path
//! cannot make:
//!
//! - **No padding.** Each graph costs its own `n` GPUs and its own links, not the batch's
//!   largest graph and every `N × N` cell.
//! - **Edges are encoded once per distinct link.** The links of a placement come in a few
//!   kinds (NVLink within a board, PCIe, InfiniBand between nodes), so the edge encoder and
//!   each round's edge map run on the distinct link feature vectors only, and every link
//!   reads its kind's result.

use std::collections::HashMap;

use crate::dense::Dense;
use crate::error::Result;
use crate::features::{LINK_FEATURES, MEM_PHASES, PlacementGraph};
use crate::network::{LOG_VAR_MAX, LOG_VAR_MIN, PredictorNetwork};
use crate::normalize::Normalization;

/// No link between two GPUs.
const NO_LINK: u32 = u32::MAX;

/// Link kinds looked up by comparison; a graph with more is indexed by a hash map.
const SCANNED_KINDS: usize = 16;

/// Raw outputs for one graph, in standardised units (as [`crate::network::NetworkOutput`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RawOutput {
    pub step_mean: f32,
    pub step_log_var: f32,
    pub peak_mem: [f32; MEM_PHASES],
    pub util: f32,
}

#[derive(Debug, Clone, PartialEq)]
struct Round {
    msg_self: Dense,
    msg_neighbour: Dense,
    msg_edge: Dense,
    update_self: Dense,
    update_agg: Dense,
}

/// The predictor's weights as flat arrays.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PlainNetwork {
    node_encoder: Dense,
    edge_encoder: Dense,
    job_encoder: Dense,
    rounds: Vec<Round>,
    trunk: Dense,
    step_head: Dense,
    step_skip: Dense,
    mem_head: Dense,
    util_head: Dense,
    hidden: usize,
}

/// Buffers reused from graph to graph.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    input: Vec<f32>,
    h: Vec<f32>,
    from_i: Vec<f32>,
    from_j: Vec<f32>,
    agg: Vec<f32>,
    update: Vec<f32>,
    edge_of: Vec<u32>,
    degree: Vec<f32>,
    kinds: HashMap<[u32; LINK_FEATURES], u32>,
    kind_values: Vec<[u32; LINK_FEATURES]>,
    edges: Vec<f32>,
    from_e: Vec<f32>,
    job: Vec<f32>,
    z: Vec<f32>,
    t: Vec<f32>,
    out: Vec<f32>,
}

impl PlainNetwork {
    pub(crate) fn new(net: &PredictorNetwork) -> Result<PlainNetwork> {
        let rounds = net
            .rounds
            .iter()
            .map(|r| {
                Ok(Round {
                    msg_self: Dense::from_linear(&r.msg_self)?,
                    msg_neighbour: Dense::from_linear(&r.msg_neighbour)?,
                    msg_edge: Dense::from_linear(&r.msg_edge)?,
                    update_self: Dense::from_linear(&r.update_self)?,
                    update_agg: Dense::from_linear(&r.update_agg)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let node_encoder = Dense::from_linear(&net.node_encoder)?;
        Ok(PlainNetwork {
            hidden: node_encoder.d_out(),
            node_encoder,
            edge_encoder: Dense::from_linear(&net.edge_encoder)?,
            job_encoder: Dense::from_linear(&net.job_encoder)?,
            rounds,
            trunk: Dense::from_linear(&net.trunk)?,
            step_head: Dense::from_linear(&net.step_head)?,
            step_skip: Dense::from_linear(&net.step_skip)?,
            mem_head: Dense::from_linear(&net.mem_head)?,
            util_head: Dense::from_linear(&net.util_head)?,
        })
    }

    /// The network's outputs for one validated graph.
    pub(crate) fn forward(
        &self,
        g: &PlacementGraph,
        norm: &Normalization,
        s: &mut Scratch,
    ) -> RawOutput {
        let n = g.gpus.len();
        let hd = self.hidden;

        s.input.clear();
        for gpu in &g.gpus {
            s.input.extend(
                gpu.values
                    .iter()
                    .enumerate()
                    .map(|(f, v)| norm.gpu.input(f, *v)),
            );
        }
        self.node_encoder.forward_rows(&s.input, n, &mut s.h, true);

        self.link_kinds(g, norm, s);
        s.degree.clear();
        s.degree.extend(s.edge_of.chunks_exact(n).map(|row| {
            let linked = row.iter().filter(|k| **k != NO_LINK).count();
            1.0 / linked.max(1) as f32
        }));

        for round in &self.rounds {
            let kinds = s.kind_values.len();
            round
                .msg_edge
                .forward_rows(&s.edges, kinds, &mut s.from_e, false);
            round.msg_self.forward_rows(&s.h, n, &mut s.from_i, false);
            round
                .msg_neighbour
                .forward_rows(&s.h, n, &mut s.from_j, false);
            s.agg.clear();
            s.agg.resize(n * hd, 0.0);
            for i in 0..n {
                let agg = &mut s.agg[i * hd..(i + 1) * hd];
                let from_i = &s.from_i[i * hd..(i + 1) * hd];
                for (j, kind) in s.edge_of[i * n..(i + 1) * n].iter().enumerate() {
                    if *kind == NO_LINK {
                        continue;
                    }
                    let k = *kind as usize;
                    let from_e = &s.from_e[k * hd..(k + 1) * hd];
                    let from_j = &s.from_j[j * hd..(j + 1) * hd];
                    // Zipped slices, so the loop compiles without bounds checks, to
                    // vector instructions.
                    for (a, ((e, fi), fj)) in
                        agg.iter_mut().zip(from_e.iter().zip(from_i).zip(from_j))
                    {
                        *a += (e + fi + fj).max(0.0);
                    }
                }
                let scale = s.degree[i];
                for a in agg.iter_mut() {
                    *a *= scale;
                }
            }
            round
                .update_self
                .forward_rows(&s.h, n, &mut s.update, false);
            for (agg, update) in s.agg.chunks_exact(hd).zip(s.update.chunks_exact_mut(hd)) {
                round.update_agg.accumulate(agg, update);
            }
            for (h, u) in s.h.iter_mut().zip(&s.update) {
                *h += u.max(0.0);
            }
        }

        // Readout: [mean_i h_i, max_i h_i, relu(W_j job)].
        s.z.clear();
        s.z.resize(3 * hd, 0.0);
        let (mean, rest) = s.z.split_at_mut(hd);
        let (max, job_slot) = rest.split_at_mut(hd);
        max.fill(f32::NEG_INFINITY);
        for row in s.h.chunks_exact(hd) {
            for d in 0..hd {
                mean[d] += row[d];
                max[d] = max[d].max(row[d]);
            }
        }
        for m in mean.iter_mut() {
            *m /= n as f32;
        }
        s.job.clear();
        s.job.extend(
            g.job
                .values
                .iter()
                .enumerate()
                .map(|(f, v)| norm.job.input(f, *v)),
        );
        self.job_encoder.forward_into(&s.job, job_slot, true);
        self.trunk.forward(&s.z, &mut s.t, true);

        self.step_head.forward(&s.t, &mut s.out, false);
        let (mean_head, log_var) = (s.out[0], s.out[1]);
        self.step_skip.forward(&s.job, &mut s.out, false);
        let step_mean = mean_head + s.out[0] + norm.prior_offset(&g.job.values);
        self.mem_head.forward(&s.t, &mut s.out, false);
        let mut peak_mem = [0.0; MEM_PHASES];
        peak_mem.copy_from_slice(&s.out[..MEM_PHASES]);
        self.util_head.forward(&s.t, &mut s.out, false);
        RawOutput {
            step_mean,
            step_log_var: log_var.clamp(LOG_VAR_MIN, LOG_VAR_MAX),
            peak_mem,
            util: s.out[0],
        }
    }

    /// Fills `edge_of` (the link kind of each ordered GPU pair, or [`NO_LINK`]) and the
    /// encoded features of each kind. A later duplicate of a pair overrides an earlier one,
    /// as in [`crate::batch::GraphBatch`].
    fn link_kinds(&self, g: &PlacementGraph, norm: &Normalization, s: &mut Scratch) {
        let n = g.gpus.len();
        s.edge_of.clear();
        s.edge_of.resize(n * n, NO_LINK);
        s.kinds.clear();
        s.kind_values.clear();
        for (a, c, link) in &g.links {
            let key = link.values.map(f32::to_bits);
            let next = s.kind_values.len() as u32;
            // A placement's links come in a handful of kinds: comparing with each is
            // cheaper than hashing, until a graph with many kinds makes it quadratic.
            let kind = if s.kind_values.len() < SCANNED_KINDS {
                s.kind_values
                    .iter()
                    .position(|k| *k == key)
                    .map_or(next, |k| k as u32)
            } else {
                if s.kinds.is_empty() {
                    s.kinds.extend(
                        s.kind_values
                            .iter()
                            .enumerate()
                            .map(|(k, v)| (*v, k as u32)),
                    );
                }
                *s.kinds.entry(key).or_insert(next)
            };
            if kind == next {
                s.kind_values.push(key);
            }
            let (a, c) = (usize::from(*a), usize::from(*c));
            s.edge_of[a * n + c] = kind;
            s.edge_of[c * n + a] = kind;
        }
        s.input.clear();
        for key in &s.kind_values {
            s.input.extend(
                key.iter()
                    .enumerate()
                    .map(|(f, v)| norm.link.input(f, f32::from_bits(*v))),
            );
        }
        self.edge_encoder
            .forward_rows(&s.input, s.kind_values.len(), &mut s.edges, true);
    }
}
