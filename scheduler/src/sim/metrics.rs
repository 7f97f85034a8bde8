//! Summary statistics.

/// The `q`-quantile (0..=1) of `values` by linear interpolation between closest ranks
/// (numpy's default), or `None` for no values. Sorts `values`.
pub fn percentile(values: &mut [f64], q: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(values[lo] + (values[hi] - values[lo]) * (pos - lo as f64))
}

pub(crate) fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Rounds to `digits` decimals, halves to even (Python's `round`, which the published
/// FGD analysis uses).
pub(crate) fn round_to(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round_ties_even() / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let mut v = vec![4.0, 1.0, 3.0, 2.0];
        assert_eq!(percentile(&mut v, 0.5), Some(2.5));
        assert_eq!(percentile(&mut v, 0.0), Some(1.0));
        assert_eq!(percentile(&mut v, 1.0), Some(4.0));
        assert_eq!(percentile(&mut [], 0.5), None);
        assert_eq!(mean(&[1.0, 2.0]), Some(1.5));
    }

    #[test]
    fn rounding_sends_halves_to_even() {
        assert_eq!(round_to(100.5, 0), 100.0);
        assert_eq!(round_to(101.5, 0), 102.0);
        assert_eq!(round_to(95.226, 2), 95.23);
    }
}
