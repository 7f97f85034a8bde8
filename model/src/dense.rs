//! Linear layers as flat arrays, for serving without tensor overhead.
//!
//! burn is for training; at serving time a candidate list is a few dozen small matrix
//! products, where a tensor backend's per-op cost (allocation, dispatch, shape checks)
//! outweighs the arithmetic. Both networks therefore copy their weights into [`Dense`]
//! layers once and compute with plain loops; tests check the two paths agree.

use burn::module::Param;
use burn::nn::Linear;

use crate::error::{ModelError, Result};
use crate::train::to_vec;

/// `y = x W + b` with `W` stored row-major as `[d_in][d_out]` (burn's layout).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Dense {
    w: Vec<f32>,
    b: Vec<f32>,
    d_in: usize,
    d_out: usize,
}

impl Dense {
    /// Copies the weights (and bias, zero when the layer has none) out of `l`.
    pub(crate) fn from_linear(l: &Linear) -> Result<Dense> {
        let [d_in, d_out] = l.weight.val().dims();
        let w = to_vec(l.weight.val())?;
        let b = match &l.bias {
            Some(b) => to_vec::<1>(Param::val(b))?,
            None => vec![0.0; d_out],
        };
        // A checksum proves the file is the one written, not that training wrote
        // numbers: a NaN weight would make every score NaN.
        if let Some(i) = w.iter().chain(&b).position(|v| !v.is_finite()) {
            return Err(ModelError::InvalidInput {
                field: "weights".into(),
                reason: format!("a {d_in}×{d_out} layer's value {i} is not finite"),
            });
        }
        Ok(Dense { w, b, d_in, d_out })
    }

    pub(crate) fn d_out(&self) -> usize {
        self.d_out
    }

    /// One input vector: `out = x W + b`, with ReLU when `relu`.
    pub(crate) fn forward(&self, x: &[f32], out: &mut Vec<f32>, relu: bool) {
        out.clear();
        out.resize(self.d_out, 0.0);
        self.forward_into(x, out, relu);
    }

    /// `rows` input vectors stored back to back in `x`; `out` gets `rows × d_out` values.
    pub(crate) fn forward_rows(&self, x: &[f32], rows: usize, out: &mut Vec<f32>, relu: bool) {
        out.clear();
        out.resize(rows * self.d_out, 0.0);
        for (xr, or) in x
            .chunks_exact(self.d_in)
            .zip(out.chunks_exact_mut(self.d_out))
            .take(rows)
        {
            self.forward_into(xr, or, relu);
        }
    }

    /// Writes `x W + b` into `out` (exactly `d_out` long).
    #[inline]
    pub(crate) fn forward_into(&self, x: &[f32], out: &mut [f32], relu: bool) {
        out.copy_from_slice(&self.b);
        self.accumulate(x, out);
        if relu {
            for o in out.iter_mut() {
                *o = o.max(0.0);
            }
        }
    }

    /// Adds `x W` (no bias) to `out`. Outputs are computed in blocks held in a local array
    /// across the whole input, so the compiler keeps them in vector registers instead of
    /// loading and storing `out` once per input; a block of 32 outputs gives eight
    /// independent SSE accumulator chains, so the loop is bound by throughput rather than
    /// by the latency of one chain.
    #[inline]
    pub(crate) fn accumulate(&self, x: &[f32], out: &mut [f32]) {
        let mut base = 0;
        while base < self.d_out {
            let left = self.d_out - base;
            base += if left >= 32 {
                self.accumulate_block::<32>(x, out, base)
            } else if left >= 8 {
                self.accumulate_block::<8>(x, out, base)
            } else {
                self.accumulate_block::<1>(x, out, base)
            };
        }
    }

    #[inline]
    fn accumulate_block<const L: usize>(&self, x: &[f32], out: &mut [f32], base: usize) -> usize {
        let mut acc = [0.0f32; L];
        for (xi, row) in x.iter().zip(self.w.chunks_exact(self.d_out)) {
            let w: &[f32; L] = row[base..base + L]
                .try_into()
                .expect("a block of L weights");
            for l in 0..L {
                acc[l] += xi * w[l];
            }
        }
        for (o, a) in out[base..base + L].iter_mut().zip(acc) {
            *o += a;
        }
        L
    }
}
