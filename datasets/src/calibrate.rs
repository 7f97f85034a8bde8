//! Calibration of the simulator's speed model from measured profiles.
//!
//! - **Data-parallel communication share**: for every (model, batch size) of the Pollux
//!   placement profiles with both a packed and a spread placement of the same gang
//!   (`4` vs `1111`, `2` vs `11`: one node vs one GPU per node), the share `c` for which
//!   the speed model's ratio `(1 - c + c·ref/bw(rack)) / (1 - c + c·ref/bw(node))`
//!   equals the measured spread/packed step-time ratio, on the testbed's links (AWS
//!   g4dn: 16 GB/s PCIe inside a node, 50 Gb/s between nodes). The calibrated value is
//!   the median over all such points.
//! - **GPU throughput classes**: for each of Gavel's GPU types, the geometric mean over
//!   its job types of the measured single-GPU throughput relative to a V100.
//!
//! `SpeedModel::default()` and the default GPU catalog carry the calibrated values as
//! constants (the scheduler does not depend on this crate); the tests here fail when the
//! constants and the data disagree.

use marshal_scheduler::domain::{LinkSpec, TopoLevel};

use crate::links::g4dn;
use crate::{GavelThroughputs, PlacementProfiles};

/// One measured spread/packed comparison and the communication share that explains it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommFitPoint {
    pub model: String,
    pub local_bsz: u32,
    pub gpus: u32,
    /// Measured step time spread (one GPU per node) over packed (one node).
    pub ratio: f64,
    /// The share that reproduces `ratio` exactly.
    pub share: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CommFit {
    pub reference_gbps: f64,
    pub points: Vec<CommFitPoint>,
    /// Median of the points' shares: the calibrated value.
    pub share: f64,
    /// Median relative error of the ratios predicted with `share`.
    pub median_ratio_error: f64,
}

/// Ratio of step times at `spread` and `packed` links for share `c`.
pub fn predicted_ratio(c: f64, reference_gbps: f64, packed_gbps: f64, spread_gbps: f64) -> f64 {
    (1.0 - c + c * reference_gbps / spread_gbps) / (1.0 - c + c * reference_gbps / packed_gbps)
}

fn bandwidth(links: &LinkSpec, level: TopoLevel) -> f64 {
    match level {
        TopoLevel::Node => links.pcie_gbps,
        TopoLevel::Rack => links.rack_gbps,
        _ => links.spine_gbps,
    }
}

/// Fits the data-parallel communication share to the Pollux profiles (GPU type `aws`).
/// `None` when the profiles hold no packed/spread pair.
pub fn fit_data_parallel_share(
    profiles: &PlacementProfiles,
    reference_gbps: f64,
) -> Option<CommFit> {
    let links = g4dn();
    let (packed_bw, spread_bw) = (
        bandwidth(&links, TopoLevel::Node),
        bandwidth(&links, TopoLevel::Rack),
    );
    let (kp, ks) = (reference_gbps / packed_bw, reference_gbps / spread_bw);
    let mut points = Vec::new();
    for model in profiles.models() {
        for (packed, spread, gpus) in [("4", "1111", 4), ("2", "11", 2)] {
            for p in profiles.lookup(model, "aws", packed) {
                let Some(s) = profiles.get(model, "aws", spread, p.local_bsz) else {
                    continue;
                };
                let ratio = s.step_time_s / p.step_time_s;
                // ratio · (1 - c + c·kp) = 1 - c + c·ks, solved for c.
                let share = (ratio - 1.0) / ((ks - 1.0) - ratio * (kp - 1.0));
                if share.is_finite() {
                    points.push(CommFitPoint {
                        model: model.to_string(),
                        local_bsz: p.local_bsz,
                        gpus,
                        ratio,
                        share,
                    });
                }
            }
        }
    }
    let share = median(points.iter().map(|p| p.share).collect())?;
    let errors = points
        .iter()
        .map(|p| {
            (predicted_ratio(share, reference_gbps, packed_bw, spread_bw) - p.ratio).abs() / p.ratio
        })
        .collect();
    Some(CommFit {
        reference_gbps,
        share,
        median_ratio_error: median(errors)?,
        points,
    })
}

impl CommFit {
    /// The median share of each model's points: a per-model calibration, which the
    /// workload kinds use (one scalar cannot fit six models).
    pub fn share_by_model(&self) -> std::collections::BTreeMap<String, f64> {
        let mut by_model: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
        for p in &self.points {
            by_model.entry(p.model.clone()).or_default().push(p.share);
        }
        by_model
            .into_iter()
            .filter_map(|(model, shares)| Some((model, median(shares)?)))
            .collect()
    }

    /// Each model's share by per-GPU batch: the mean over the model's packed/spread pairs
    /// at each batch size, clamped to [0, 0.95] (a spread placement measured faster than
    /// a packed one is noise, not negative communication).
    pub fn share_curves(&self) -> std::collections::BTreeMap<String, Vec<(f64, f64)>> {
        let mut sums: std::collections::BTreeMap<
            String,
            std::collections::BTreeMap<u32, (f64, usize)>,
        > = Default::default();
        for p in &self.points {
            let e = sums
                .entry(p.model.clone())
                .or_default()
                .entry(p.local_bsz)
                .or_insert((0.0, 0));
            e.0 += p.share;
            e.1 += 1;
        }
        sums.into_iter()
            .map(|(model, by_bsz)| {
                let curve = by_bsz
                    .into_iter()
                    .map(|(b, (sum, n))| (f64::from(b), (sum / n as f64).clamp(0.0, 0.95)))
                    .collect();
                (model, curve)
            })
            .collect()
    }

    /// Median relative error of the ratios predicted with each model's share curve at
    /// each point's batch size.
    pub fn curve_ratio_error(&self) -> Option<f64> {
        let curves = self.share_curves();
        self.ratio_error(|p| {
            curves[&p.model]
                .iter()
                .find(|(b, _)| *b == f64::from(p.local_bsz))
                .map_or(0.0, |&(_, c)| c)
        })
    }

    /// Median relative error of the ratios predicted with each model's own share.
    pub fn per_model_ratio_error(&self) -> Option<f64> {
        let shares = self.share_by_model();
        self.ratio_error(|p| shares[&p.model])
    }

    /// Median relative error of the ratios predicted with the share `share_of` gives
    /// each point.
    fn ratio_error(&self, share_of: impl Fn(&CommFitPoint) -> f64) -> Option<f64> {
        let links = g4dn();
        let (packed, spread) = (
            bandwidth(&links, TopoLevel::Node),
            bandwidth(&links, TopoLevel::Rack),
        );
        let errors = self
            .points
            .iter()
            .map(|p| {
                let predicted = predicted_ratio(share_of(p), self.reference_gbps, packed, spread);
                (predicted - p.ratio).abs() / p.ratio
            })
            .collect();
        median(errors)
    }
}

/// Throughput class of each Gavel GPU type relative to `v100`: the geometric mean over
/// job types measured on both of single-GPU throughput ratios. Zero entries (cannot run)
/// are left out.
pub fn gavel_gpu_classes(gavel: &GavelThroughputs) -> Vec<(String, f64, usize)> {
    let mut classes = Vec::new();
    for gpu in gavel.gpu_types() {
        if gpu.ends_with("_unconsolidated") {
            continue;
        }
        let logs: Vec<f64> = gavel
            .job_types()
            .into_iter()
            .filter_map(|job| {
                let a = gavel.single(gpu, job, 1)?;
                let b = gavel.single("v100", job, 1)?;
                (a > 0.0 && b > 0.0).then(|| (a / b).ln())
            })
            .collect();
        if !logs.is_empty() {
            let mean = logs.iter().sum::<f64>() / logs.len() as f64;
            classes.push((gpu.to_string(), mean.exp(), logs.len()));
        }
    }
    classes
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    marshal_scheduler::sim::percentile(&mut values, 0.5)
}

#[cfg(test)]
mod tests {
    use marshal_scheduler::domain::GpuCatalog;
    use marshal_scheduler::sim::SpeedModel;

    use super::*;
    use crate::{gavel_throughputs, pollux_placement_profiles};

    #[test]
    fn the_default_data_parallel_share_is_the_one_the_pollux_profiles_give() {
        let (profiles, _) = pollux_placement_profiles().unwrap();
        let model = SpeedModel::default();
        let fit = fit_data_parallel_share(&profiles, model.reference_gbps).unwrap();
        assert!(fit.points.len() >= 50, "{} points", fit.points.len());
        assert!(
            (fit.share - model.data_parallel_comm).abs() < 0.005,
            "calibrated {:.4} vs default {}",
            fit.share,
            model.data_parallel_comm
        );
        // One scalar cannot fit six models, but it reproduces the typical ratio.
        assert!(fit.median_ratio_error < 0.3, "{}", fit.median_ratio_error);
        // Each point's own share reproduces its measurement exactly.
        let links = g4dn();
        for p in &fit.points {
            let r = predicted_ratio(
                p.share,
                fit.reference_gbps,
                links.pcie_gbps,
                links.rack_gbps,
            );
            assert!((r - p.ratio).abs() < 1e-9);
        }
    }

    #[test]
    fn default_gpu_classes_are_gavels_measurements() {
        let (gavel, _) = gavel_throughputs().unwrap();
        let classes = gavel_gpu_classes(&gavel);
        let catalog = GpuCatalog::default();
        for (gavel_name, ours) in [("k80", "K80"), ("p100", "P100"), ("v100", "V100M16")] {
            let (_, measured, n) = classes.iter().find(|(g, _, _)| g == gavel_name).unwrap();
            assert!(*n >= 20, "{gavel_name}: {n} job types");
            let default = catalog.get(catalog.id(ours).unwrap()).throughput;
            assert!(
                (measured - default).abs() < 0.005,
                "{ours}: measured {measured:.4}, default {default}"
            );
        }
    }

    #[test]
    fn per_model_shares_reproduce_the_profiles_better_than_one_scalar() {
        let (profiles, _) = pollux_placement_profiles().unwrap();
        let fit = fit_data_parallel_share(&profiles, SpeedModel::default().reference_gbps).unwrap();
        let shares = fit.share_by_model();
        assert_eq!(shares.len(), 6);
        assert!(
            shares.values().all(|c| (0.0..1.0).contains(c)),
            "{shares:?}"
        );
        let per_model = fit.per_model_ratio_error().unwrap();
        eprintln!(
            "spread/packed ratio error: one share {:.3}, per model {per_model:.3}; {shares:?}",
            fit.median_ratio_error
        );
        assert!(
            per_model < fit.median_ratio_error,
            "{per_model} vs {}",
            fit.median_ratio_error
        );
        assert!(per_model < 0.15, "{per_model}");
        // The share falls with the per-GPU batch; a curve per model follows it.
        let curve = fit.curve_ratio_error().unwrap();
        eprintln!("per model and batch size: {curve:.3}");
        assert!(curve < 0.08, "{curve}");
        let cifar = &fit.share_curves()["cifar10"];
        assert!(
            cifar.first().unwrap().1 > 0.5 && cifar.last().unwrap().1 < 0.05,
            "{cifar:?}"
        );
    }
}
