//! The graph network.
//!
//! ```text
//! h⁰_i   = relu(W_n x_i)                                  node encoder
//! e_ij   = relu(W_e x_ij)                                 edge encoder (once)
//! m_ij   = relu(A_r h_i + B_r h_j + C_r e_ij + b_r)·adj_ij   message MLP over [h_i, h_j, e_ij]
//! a_i    = Σ_j m_ij / max(1, deg_i)                       masked mean aggregation
//! hʳ⁺¹_i = (hʳ_i + relu(U_r hʳ_i + V_r a_i))·mask_i       residual update, r = 1..K
//! z      = [masked mean_i h_i, masked max_i h_i, relu(W_j job)]
//! t      = relu(W_t z)
//! heads  = (μ, log σ²) of standardised ln step time; 4 peak-memory values; utilisation
//! μ     += w_s · job + prior                               linear skip, and the prior
//! ```
//!
//! `prior` is the featuriser's analytic estimate of `ln(step time)`
//! ([`crate::PRIOR_JOB_SLOT`]) in the mean's standardised units, added with weight 1 and
//! unclamped: the network learns the residual around it. Every *input* is held within its
//! training range ([`crate::Standardizer::input`]), so an unseen interconnect or gang size
//! cannot drive untrained weights; it moves the prediction only through the prior.
//!
//! The skip exists because the step time of a placement is, to first order, the job's own
//! history (the `log_history_step_s` job feature) and the graph explains the rest: a linear
//! path lets the network carry that history to the output unchanged, also for values outside
//! the range it was trained on, where a ReLU trunk would saturate.
//!
//! The message layer on the concatenation `[h_i, h_j, e_ij]` is computed as the sum of three
//! linear maps (`A h_i + B h_j + C e_ij`), which is the same function but avoids materialising
//! the `B×N×N×(2H+E)` concatenation: only the `B×N×N×H` pre-activation is built, once per round.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::batch::GraphBatch;
use crate::config::PredictorConfig;
use crate::features::{GPU_FEATURES, JOB_FEATURES, LINK_FEATURES, MEM_PHASES};

/// Bounds on the predicted log-variance (standardised units) that keep the NLL stable.
pub(crate) const LOG_VAR_MIN: f32 = -9.0;
pub(crate) const LOG_VAR_MAX: f32 = 4.0;

/// One message-passing round.
#[derive(Module, Debug)]
pub struct MessageRound {
    pub(crate) msg_self: Linear,
    pub(crate) msg_neighbour: Linear,
    pub(crate) msg_edge: Linear,
    pub(crate) update_self: Linear,
    pub(crate) update_agg: Linear,
}

/// The predictor network (see the module docs for the equations).
#[derive(Module, Debug)]
pub struct PredictorNetwork {
    pub(crate) node_encoder: Linear,
    pub(crate) edge_encoder: Linear,
    pub(crate) job_encoder: Linear,
    pub(crate) rounds: Vec<MessageRound>,
    pub(crate) trunk: Linear,
    pub(crate) step_head: Linear,
    pub(crate) step_skip: Linear,
    pub(crate) mem_head: Linear,
    pub(crate) util_head: Linear,
}

/// Raw network outputs in standardised units.
#[derive(Debug, Clone)]
pub struct NetworkOutput {
    /// `[B, 1]` mean of standardised `ln(step_time_s)`.
    pub step_mean: Tensor<2>,
    /// `[B, 1]` log-variance of the same, clamped to a stable range.
    pub step_log_var: Tensor<2>,
    /// `[B, MEM_PHASES]` standardised peak memory.
    pub peak_mem: Tensor<2>,
    /// `[B, 1]` standardised utilisation.
    pub util: Tensor<2>,
}

/// A linear layer initialised from `rng`, uniform in ±1/√fan_in (PyTorch's default), so that
/// initialisation depends on the seed only — not on burn's process-global backend RNG, which
/// concurrently running trainings (e.g. parallel tests) would share.
fn linear(rng: &mut ChaCha8Rng, d_in: usize, d_out: usize, bias: bool, device: &Device) -> Linear {
    let k = 1.0 / (d_in as f32).sqrt();
    let mut uniform =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-k..k)).collect() };
    let weight = Tensor::from_data(
        TensorData::new(uniform(d_in * d_out), [d_in, d_out]),
        device,
    );
    let bias = bias.then(|| {
        Param::from_tensor(Tensor::from_data(
            TensorData::new(uniform(d_out), [d_out]),
            device,
        ))
    });
    Linear {
        weight: Param::from_tensor(weight),
        bias,
    }
}

impl PredictorNetwork {
    /// A freshly initialised network on `device`.
    pub fn init(config: &PredictorConfig, rng: &mut ChaCha8Rng, device: &Device) -> Self {
        let h = config.hidden_size;
        let eh = config.edge_hidden_size;
        let node_encoder = linear(rng, GPU_FEATURES, h, true, device);
        let edge_encoder = linear(rng, LINK_FEATURES, eh, true, device);
        let job_encoder = linear(rng, JOB_FEATURES, h, true, device);
        let rounds = (0..config.rounds)
            .map(|_| MessageRound {
                msg_self: linear(rng, h, h, true, device),
                msg_neighbour: linear(rng, h, h, false, device),
                msg_edge: linear(rng, eh, h, false, device),
                update_self: linear(rng, h, h, true, device),
                update_agg: linear(rng, h, h, false, device),
            })
            .collect();
        Self {
            node_encoder,
            edge_encoder,
            job_encoder,
            rounds,
            trunk: linear(rng, 3 * h, h, true, device),
            step_head: linear(rng, h, 2, true, device),
            step_skip: linear(rng, JOB_FEATURES, 1, false, device),
            mem_head: linear(rng, h, MEM_PHASES, true, device),
            util_head: linear(rng, h, 1, true, device),
        }
    }

    /// Forward pass over a padded batch.
    pub fn forward(&self, batch: &GraphBatch) -> NetworkOutput {
        let [b, n] = batch.node_mask.dims();
        let mask3: Tensor<3> = batch.node_mask.clone().unsqueeze_dim(2); // [B,N,1]
        let adj4: Tensor<4> = batch.adjacency.clone().unsqueeze_dim(3); // [B,N,N,1]
        let degree = batch.adjacency.clone().sum_dim(2).clamp_min(1.0); // [B,N,1]

        let mut h = relu(self.node_encoder.forward(batch.nodes.clone())) * mask3.clone();
        let e = relu(self.edge_encoder.forward(batch.edges.clone()));
        for round in &self.rounds {
            let from_i: Tensor<4> = round.msg_self.forward(h.clone()).unsqueeze_dim(2);
            let from_j: Tensor<4> = round.msg_neighbour.forward(h.clone()).unsqueeze_dim(1);
            let from_e = round.msg_edge.forward(e.clone());
            let messages = relu(from_e + from_i + from_j) * adj4.clone(); // [B,N,N,H]
            let hidden = messages.dims()[3];
            let agg = messages.sum_dim(2).reshape([b, n, hidden]) / degree.clone();
            let update = relu(round.update_self.forward(h.clone()) + round.update_agg.forward(agg));
            h = (h + update) * mask3.clone();
        }

        let hidden = h.dims()[2];
        let count = batch.node_mask.clone().sum_dim(1).clamp_min(1.0); // [B,1]
        let mean = h.clone().sum_dim(1).reshape([b, hidden]) / count;
        // Padded nodes get a large negative value so they never win the max.
        let max = (h + mask3.sub_scalar(1.0).mul_scalar(1e9))
            .max_dim(1)
            .reshape([b, hidden]);
        let job = relu(self.job_encoder.forward(batch.job.clone()));
        let z = Tensor::cat(vec![mean, max, job], 1);
        let t = relu(self.trunk.forward(z));

        let step = self.step_head.forward(t.clone());
        NetworkOutput {
            step_mean: step.clone().narrow(1, 0, 1)
                + self.step_skip.forward(batch.job.clone())
                + batch.prior.clone(),
            step_log_var: step.narrow(1, 1, 1).clamp(LOG_VAR_MIN, LOG_VAR_MAX),
            peak_mem: self.mem_head.forward(t.clone()),
            util: self.util_head.forward(t),
        }
    }
}
