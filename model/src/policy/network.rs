//! The policy network in burn (training and saving).
//!
//! ```text
//! logit(job, cand) = w₃ · relu(W₂ relu(W₁ [job, cand] + b₁) + b₂) + b₃   per candidate
//! value(job)       = v₂ · relu(V₁ job + c₁) + c₂                         REINFORCE baseline
//! ```
//! Inputs are standardised first ([`super::FeatureStats`]).

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::config::PolicyConfig;
use super::features::{INPUT_FEATURES, JOB_FEATURES};

/// Candidate scorer and value head.
#[derive(Module, Debug)]
pub struct PolicyNetwork {
    pub(crate) hidden1: Linear,
    pub(crate) hidden2: Linear,
    pub(crate) logit: Linear,
    pub(crate) value_hidden: Linear,
    pub(crate) value: Linear,
}

/// A linear layer initialised from our own seeded stream (PyTorch's ±1/√fan_in), so
/// initialisation depends on the seed only, not on burn's process-global RNG.
fn linear(rng: &mut ChaCha8Rng, d_in: usize, d_out: usize, scale: f32, device: &Device) -> Linear {
    let k = scale / (d_in as f32).sqrt();
    let mut uniform =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-k..=k)).collect() };
    let weight = Tensor::from_data(
        TensorData::new(uniform(d_in * d_out), [d_in, d_out]),
        device,
    );
    let bias = Tensor::from_data(TensorData::new(uniform(d_out), [d_out]), device);
    Linear {
        weight: Param::from_tensor(weight),
        bias: Some(Param::from_tensor(bias)),
    }
}

impl PolicyNetwork {
    /// A freshly initialised network on `device`.
    pub fn init(config: &PolicyConfig, rng: &mut ChaCha8Rng, device: &Device) -> Self {
        let h = config.hidden_size;
        PolicyNetwork {
            hidden1: linear(rng, INPUT_FEATURES, h, 1.0, device),
            hidden2: linear(rng, h, h, 1.0, device),
            // Small output weights: an untrained policy is close to uniform.
            logit: linear(rng, h, 1, 0.1, device),
            value_hidden: linear(rng, JOB_FEATURES, h, 1.0, device),
            value: linear(rng, h, 1, 0.1, device),
        }
    }

    /// `[N, INPUT_FEATURES]` standardised inputs → `[N, 1]` logits.
    pub fn logits(&self, inputs: Tensor<2>) -> Tensor<2> {
        let h = relu(self.hidden1.forward(inputs));
        let h = relu(self.hidden2.forward(h));
        self.logit.forward(h)
    }

    /// `[B, JOB_FEATURES]` standardised job features → `[B, 1]` predicted return.
    pub fn value(&self, job: Tensor<2>) -> Tensor<2> {
        self.value.forward(relu(self.value_hidden.forward(job)))
    }
}
