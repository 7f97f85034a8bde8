//! The baselines a learned predictor must beat on step time.

use std::collections::BTreeMap;

use ndarray::{Array1, Array2};

use crate::examples::median;
use crate::{StepExample, TrainerError};

/// Mean absolute percentage error of `predicted` against `truth`, in percent.
pub fn mape(predicted: &[f64], truth: &[f64]) -> f64 {
    let terms: Vec<f64> = predicted
        .iter()
        .zip(truth)
        .filter(|(_, t)| **t > 0.0)
        .map(|(p, t)| (p - t).abs() / t)
        .collect();
    if terms.is_empty() {
        return f64::NAN;
    }
    terms.iter().sum::<f64>() / terms.len() as f64 * 100.0
}

fn collapse<K: Ord>(m: BTreeMap<K, Vec<f64>>) -> BTreeMap<K, f64> {
    m.into_iter()
        .map(|(k, v)| (k, median(v).unwrap_or(f64::NAN)))
        .collect()
}

/// Median step time per (model, GPU type, GPU count), falling back to (model, GPU type),
/// then the model, then everything.
#[derive(Clone, Debug, PartialEq)]
pub struct LookupBaseline {
    exact: BTreeMap<(String, String, u32), f64>,
    by_type: BTreeMap<(String, String), f64>,
    by_model: BTreeMap<String, f64>,
    global: f64,
}

impl LookupBaseline {
    pub fn fit(train: &[StepExample]) -> Result<Self, TrainerError> {
        if train.is_empty() {
            return Err(TrainerError::Invalid("no training examples".into()));
        }
        let mut exact: BTreeMap<(String, String, u32), Vec<f64>> = BTreeMap::new();
        let mut by_type: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
        let mut by_model: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for e in train {
            exact
                .entry((e.model.clone(), e.gpu_type.clone(), e.num_gpus))
                .or_default()
                .push(e.step_time_s);
            by_type
                .entry((e.model.clone(), e.gpu_type.clone()))
                .or_default()
                .push(e.step_time_s);
            by_model
                .entry(e.model.clone())
                .or_default()
                .push(e.step_time_s);
        }
        Ok(LookupBaseline {
            exact: collapse(exact),
            by_type: collapse(by_type),
            by_model: collapse(by_model),
            global: median(train.iter().map(|e| e.step_time_s).collect()).unwrap_or(f64::NAN),
        })
    }

    pub fn predict(&self, e: &StepExample) -> f64 {
        self.exact
            .get(&(e.model.clone(), e.gpu_type.clone(), e.num_gpus))
            .or_else(|| self.by_type.get(&(e.model.clone(), e.gpu_type.clone())))
            .or_else(|| self.by_model.get(&e.model))
            .copied()
            .unwrap_or(self.global)
    }
}

/// Ridge regression on log step time over one-hot model, GPU type, span and
/// communication pattern, and log GPU count, nodes, GPUs per node, batch size and
/// co-tenancy.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearBaseline {
    vocab: BTreeMap<(u8, String), usize>,
    weights: Array1<f64>,
    numeric_start: usize,
}

const NUMERIC: usize = 6;

impl LinearBaseline {
    fn categories(e: &StepExample) -> [(u8, &str); 4] {
        [(0, &e.model), (1, &e.gpu_type), (2, &e.span), (3, &e.comm)]
    }

    fn row(&self, e: &StepExample) -> Array1<f64> {
        let mut x = Array1::zeros(self.weights.len());
        for (field, value) in Self::categories(e) {
            if let Some(&i) = self.vocab.get(&(field, value.to_string())) {
                x[i] = 1.0;
            }
        }
        let n = self.numeric_start;
        x[n] = f64::from(e.num_gpus).log2();
        x[n + 1] = f64::from(e.nodes).log2();
        x[n + 2] = f64::from(e.gpus_per_node).log2();
        x[n + 3] = e.batch_size.map_or(0.0, |b| f64::from(b).log2());
        x[n + 4] = f64::from(e.tenants);
        x[n + 5] = 1.0; // bias
        x
    }

    pub fn fit(train: &[StepExample], ridge: f64) -> Result<Self, TrainerError> {
        if train.is_empty() {
            return Err(TrainerError::Invalid("no training examples".into()));
        }
        let mut vocab = BTreeMap::new();
        for e in train {
            for (field, value) in Self::categories(e) {
                let next = vocab.len();
                vocab.entry((field, value.to_string())).or_insert(next);
            }
        }
        let numeric_start = vocab.len();
        let dim = numeric_start + NUMERIC;
        let mut model = LinearBaseline {
            vocab,
            weights: Array1::zeros(dim),
            numeric_start,
        };
        let mut x = Array2::zeros((train.len(), dim));
        let mut y = Array1::zeros(train.len());
        for (i, e) in train.iter().enumerate() {
            x.row_mut(i).assign(&model.row(e));
            y[i] = e.step_time_s.ln();
        }
        let mut a = x.t().dot(&x);
        for i in 0..dim {
            a[[i, i]] += ridge;
        }
        let b = x.t().dot(&y);
        model.weights = solve_spd(a, b).ok_or_else(|| {
            TrainerError::Invalid("the ridge system is not positive definite".into())
        })?;
        Ok(model)
    }

    pub fn predict(&self, e: &StepExample) -> f64 {
        self.row(e).dot(&self.weights).exp()
    }
}

/// Solves `a x = b` for a symmetric positive-definite `a` ([`marshal_model::solve_spd`]).
pub(crate) fn solve_spd(a: Array2<f64>, b: Array1<f64>) -> Option<Array1<f64>> {
    let row_major: Vec<f64> = a.iter().copied().collect();
    marshal_model::solve_spd(row_major, b.to_vec()).map(Array1::from)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A one-row example for tests.
    pub(crate) fn ex(
        job: &str,
        model: &str,
        gpus: u32,
        nodes: u32,
        span: &str,
        t: f64,
    ) -> StepExample {
        StepExample {
            job_id: job.into(),
            model: model.into(),
            gpu_type: "V100M32".into(),
            num_gpus: gpus,
            nodes,
            gpus_per_node: gpus / nodes,
            span: span.into(),
            batch_size: Some(64 * gpus),
            comm: "data-parallel".into(),
            tenants: 1,
            step_time_s: t,
            gpu_util_pct: None,
            peak_mem_gib: [None; 4],
            rows: 1,
        }
    }

    #[test]
    fn mape_is_the_mean_relative_error() {
        assert!((mape(&[1.1, 1.8], &[1.0, 2.0]) - 10.0).abs() < 1e-9);
        assert!(mape(&[], &[]).is_nan());
    }

    #[test]
    fn cholesky_solves_a_small_system() {
        let a = ndarray::arr2(&[[4.0, 2.0], [2.0, 3.0]]);
        let x = solve_spd(a, ndarray::arr1(&[2.0, 1.0])).unwrap();
        assert!((x[0] - 0.5).abs() < 1e-12 && x[1].abs() < 1e-12);
        assert!(solve_spd(ndarray::arr2(&[[0.0]]), ndarray::arr1(&[1.0])).is_none());
    }

    #[test]
    fn lookup_falls_back_and_linear_extrapolates_spread_placements() {
        // Step time doubles when a gang leaves its node; the lookup cannot see placement.
        let train = vec![
            ex("a", "m", 8, 1, "nvlink-island", 0.2),
            ex("b", "m", 16, 2, "rack", 0.4),
            ex("c", "m", 4, 1, "nvlink-island", 0.2),
            ex("d", "n", 8, 1, "nvlink-island", 0.5),
            ex("e", "n", 16, 2, "rack", 1.0),
        ];
        let lookup = LookupBaseline::fit(&train).unwrap();
        assert_eq!(
            lookup.predict(&ex("x", "m", 8, 1, "nvlink-island", 0.0)),
            0.2
        );
        // An unseen GPU count falls back to the model's median.
        assert_eq!(lookup.predict(&ex("x", "n", 32, 4, "rack", 0.0)), 0.75);
        assert_eq!(lookup.predict(&ex("x", "unknown", 1, 1, "gpu", 0.0)), 0.4);
        let linear = LinearBaseline::fit(&train, 1e-3).unwrap();
        let spread = linear.predict(&ex("y", "m", 8, 2, "rack", 0.0));
        let packed = linear.predict(&ex("y", "m", 8, 1, "nvlink-island", 0.0));
        assert!(spread > 1.5 * packed, "{spread} vs {packed}");
    }
}
