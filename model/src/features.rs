//! Plain feature structs: the model's whole input vocabulary.
//!
//! The featuriser (in another crate) turns a cluster snapshot plus a job and a candidate
//! placement into a [`PlacementGraph`]: one node per GPU of the placement, one edge per pair of
//! those GPUs that communicate, and the job's own features. The layouts below are the contract
//! between the two; the `*_NAMES` constants give every slot a name so both sides index by the
//! same meaning. Raw units are fine: the predictor standardises every feature with statistics
//! fitted on its training set (see [`crate::Normalization`]).

use crate::error::{ModelError, Result};

/// Number of per-GPU features.
pub const GPU_FEATURES: usize = 10;
/// Names of the per-GPU features, in slot order.
pub const GPU_FEATURE_NAMES: [&str; GPU_FEATURES] = [
    "mem_total_gib",      // device memory capacity
    "mem_free_gib",       // memory free before this job lands
    "util_pct",           // current SM utilisation by co-located work, 0..100
    "peak_tflops_fp16",   // GPU type's dense FP16/BF16 throughput
    "mem_bandwidth_tbps", // GPU type's HBM bandwidth
    "allocated_fraction", // fraction of the GPU given to the job (1 = whole, MIG/fraction < 1)
    "colocated_jobs",     // other jobs sharing this GPU
    "degraded",           // 0 healthy, 1 degraded (ECC, throttling, XID history)
    "temperature_c",      // current temperature
    "nvlink_domain_size", // GPUs in this GPU's NVLink/NVSwitch island
];

/// Number of per-link (edge) features.
pub const LINK_FEATURES: usize = 6;
/// Names of the per-link features, in slot order.
pub const LINK_FEATURE_NAMES: [&str; LINK_FEATURES] = [
    "kind_nvlink",         // one-hot: NVLink / NVSwitch path
    "kind_pcie",           // one-hot: PCIe (same node, no NVLink)
    "kind_ib_rack",        // one-hot: InfiniBand inside a leaf/rack
    "kind_ib_spine",       // one-hot: InfiniBand across the spine
    "log2_bandwidth_gbps", // log2 of the path's bottleneck bandwidth in Gbit/s
    "topology_level",      // level of the lowest common ancestor (0 = same NVLink domain, ...)
];

/// Number of per-job features.
pub const JOB_FEATURES: usize = 14;
/// Names of the per-job features, in slot order.
pub const JOB_FEATURE_NAMES: [&str; JOB_FEATURES] = [
    "log2_num_gpus", // log2 of the gang size (log, so larger gangs than trained on stay in range)
    "log10_params",  // log10 of the model's parameter count
    "log2_global_batch", // log2 of the global batch size
    "log2_seq_len",  // log2 of the sequence length (0 when not a sequence model)
    "parallel_data", // one-hot parallelism: data parallel
    "parallel_tensor", // one-hot parallelism: tensor parallel
    "parallel_pipeline", // one-hot parallelism: pipeline parallel
    "parallel_none", // one-hot parallelism: single worker / none
    "precision_bytes", // bytes per parameter of the compute precision (2 = bf16)
    "is_inference",  // 1 for inference/serving, 0 for training
    "comm_compute_ratio", // profiled or estimated communication / compute time
    "log_history_packed_step_s", // ln of the step time other jobs of the same kind took, normalised to a packed, unshared placement (0 = none)
    "history_level", // how specific that history is: 0 none, 1 kind, 2 + GPU type, 3 + GPU count
    "log_prior_step_s", // ln of the featuriser's analytic step-time estimate for this placement (required)
];

/// Slot of [`JOB_FEATURE_NAMES`] that holds `ln` of the featuriser's analytic step-time
/// estimate (the *prior*). The network predicts the residual `ln(step) − ln(prior)`: the
/// prior enters the step-time mean unclamped and with weight 1, so a placement outside the
/// trained range (an interconnect or a gang size never seen) extrapolates through the
/// featuriser's physics, not through untrained weights. A featuriser without a physical
/// model may put any finite constant there (the network then learns the whole step time).
pub const PRIOR_JOB_SLOT: usize = 13;

/// Most GPUs one placement graph may have. Larger gangs are summarised by the featuriser
/// (e.g. one node per NVLink domain) rather than fed GPU by GPU.
pub const MAX_GPUS_PER_GRAPH: usize = 64;

/// Features of one GPU of a candidate placement; slots named by [`GPU_FEATURE_NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct GpuNodeFeatures {
    /// Raw feature values.
    pub values: [f32; GPU_FEATURES],
}

/// Kind of interconnect on the path between two GPUs (one-hot in [`LinkFeatures`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// NVLink / NVSwitch.
    NvLink,
    /// PCIe within a node.
    Pcie,
    /// InfiniBand within a leaf/rack.
    IbRack,
    /// InfiniBand across the spine.
    IbSpine,
}

/// Features of the communication path between two GPUs; slots named by
/// [`LINK_FEATURE_NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkFeatures {
    /// Raw feature values.
    pub values: [f32; LINK_FEATURES],
}

impl LinkFeatures {
    /// Encodes a link: one-hot kind, `log2(bandwidth_gbps)` (bandwidth clamped to ≥ 1e-3),
    /// and the topology level of the two GPUs' lowest common ancestor.
    pub fn new(kind: LinkKind, bandwidth_gbps: f32, topology_level: u8) -> Self {
        let mut values = [0.0; LINK_FEATURES];
        let slot = match kind {
            LinkKind::NvLink => 0,
            LinkKind::Pcie => 1,
            LinkKind::IbRack => 2,
            LinkKind::IbSpine => 3,
        };
        values[slot] = 1.0;
        values[4] = bandwidth_gbps.max(1e-3).log2();
        values[5] = f32::from(topology_level);
        Self { values }
    }
}

/// Features of the job being placed; slots named by [`JOB_FEATURE_NAMES`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JobFeatures {
    /// Raw feature values.
    pub values: [f32; JOB_FEATURES],
}

/// One candidate placement of one job, as a graph: GPUs are nodes, communication paths are
/// undirected edges `(a, b, features)` between node indices (each pair once; a later duplicate
/// overrides an earlier one).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlacementGraph {
    /// The GPUs of the placement (1 ..= [`MAX_GPUS_PER_GRAPH`]).
    pub gpus: Vec<GpuNodeFeatures>,
    /// Undirected links between GPUs, by index into `gpus`.
    pub links: Vec<(u16, u16, LinkFeatures)>,
    /// The job.
    pub job: JobFeatures,
}

/// A placement's shape class as the predictor sees it: `(GPU count, widest link level)`,
/// the widest level being the largest `topology_level` of its links (0 without links).
/// Calibration uses it to tell shapes seen in training from novel ones.
pub type ShapeClass = (u32, u32);

impl PlacementGraph {
    /// The graph's [`ShapeClass`].
    pub fn shape_class(&self) -> ShapeClass {
        let widest = self
            .links
            .iter()
            .map(|l| l.2.values[5])
            .filter(|v| v.is_finite())
            .fold(0f32, f32::max);
        (self.gpus.len() as u32, widest.round().max(0.0) as u32)
    }

    /// The machines the placement spans: groups of GPUs joined by NVLink or PCIe links
    /// (union-find over the links; at least 1).
    pub fn node_count(&self) -> usize {
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let mut parent: Vec<usize> = (0..self.gpus.len()).collect();
        for (a, b, link) in &self.links {
            let within_node = link.values[0] > 0.5 || link.values[1] > 0.5;
            let (a, b) = (usize::from(*a), usize::from(*b));
            if within_node && a < parent.len() && b < parent.len() {
                let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                parent[ra] = rb;
            }
        }
        (0..parent.len())
            .filter(|&i| root(&mut parent, i) == i)
            .count()
            .max(1)
    }

    /// Checks the graph: 1 ..= [`MAX_GPUS_PER_GRAPH`] GPUs, every value finite, every link
    /// between two distinct existing GPUs. `label` prefixes field names in errors
    /// (e.g. `graph[7]`).
    pub fn validate(&self, label: &str) -> Result<()> {
        if self.gpus.is_empty() {
            return Err(ModelError::invalid(
                format!("{label}.gpus"),
                "a placement graph needs at least one GPU",
            ));
        }
        if self.gpus.len() > MAX_GPUS_PER_GRAPH {
            return Err(ModelError::invalid(
                format!("{label}.gpus"),
                format!(
                    "{} GPUs exceed the maximum of {MAX_GPUS_PER_GRAPH} per graph",
                    self.gpus.len()
                ),
            ));
        }
        for (g, gpu) in self.gpus.iter().enumerate() {
            check_finite(&gpu.values, &GPU_FEATURE_NAMES, || {
                format!("{label}.gpus[{g}]")
            })?;
        }
        for (l, (a, b, link)) in self.links.iter().enumerate() {
            let n = self.gpus.len();
            if usize::from(*a) >= n || usize::from(*b) >= n {
                return Err(ModelError::invalid(
                    format!("{label}.links[{l}]"),
                    format!("endpoint ({a}, {b}) out of range for {n} GPUs"),
                ));
            }
            if a == b {
                return Err(ModelError::invalid(
                    format!("{label}.links[{l}]"),
                    format!("self-loop on GPU {a}"),
                ));
            }
            check_finite(&link.values, &LINK_FEATURE_NAMES, || {
                format!("{label}.links[{l}]")
            })?;
        }
        check_finite(&self.job.values, &JOB_FEATURE_NAMES, || {
            format!("{label}.job")
        })
    }
}

fn check_finite(values: &[f32], names: &[&str], prefix: impl Fn() -> String) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ModelError::invalid(
            format!("{}.values[{i}] ({})", prefix(), names[i]),
            format!("non-finite value {}", values[i]),
        )),
    }
}

/// Number of memory phases in [`Targets::peak_mem_gib`].
pub const MEM_PHASES: usize = 4;
/// Names of the memory phases, in slot order.
pub const MEM_PHASE_NAMES: [&str; MEM_PHASES] = ["warmup", "steady", "eval", "checkpoint"];

/// What the predictor learns for one placement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Targets {
    /// Measured seconds per training step (or per request batch for inference); > 0.
    pub step_time_s: f32,
    /// Peak memory per GPU per phase ([`MEM_PHASE_NAMES`]); NaN = not observed (masked in
    /// the loss).
    pub peak_mem_gib: [f32; MEM_PHASES],
    /// Mean GPU utilisation in percent; NaN = not observed (masked in the loss).
    pub gpu_util_pct: f32,
}

impl Targets {
    /// Checks the targets: step time finite and positive, the others NaN (unknown) or finite
    /// and non-negative.
    pub fn validate(&self, label: &str) -> Result<()> {
        if !(self.step_time_s.is_finite() && self.step_time_s > 0.0) {
            return Err(ModelError::invalid(
                format!("{label}.step_time_s"),
                format!("must be finite and > 0, got {}", self.step_time_s),
            ));
        }
        for (p, v) in self.peak_mem_gib.iter().enumerate() {
            if !unknown_or_non_negative(*v) {
                return Err(ModelError::invalid(
                    format!("{label}.peak_mem_gib[{p}] ({})", MEM_PHASE_NAMES[p]),
                    format!("must be NaN (unknown) or finite and >= 0, got {v}"),
                ));
            }
        }
        let u = self.gpu_util_pct;
        if !unknown_or_non_negative(u) {
            return Err(ModelError::invalid(
                format!("{label}.gpu_util_pct"),
                format!("must be NaN (unknown) or finite and >= 0, got {u}"),
            ));
        }
        Ok(())
    }
}

/// NaN (not observed) or a finite, non-negative measurement.
fn unknown_or_non_negative(v: f32) -> bool {
    v.is_nan() || (v.is_finite() && v >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph() -> PlacementGraph {
        PlacementGraph {
            gpus: vec![GpuNodeFeatures::default(); 2],
            links: vec![(0, 1, LinkFeatures::new(LinkKind::NvLink, 900.0, 0))],
            job: JobFeatures::default(),
        }
    }

    #[test]
    fn valid_graph_passes() {
        graph().validate("g").unwrap();
    }

    #[test]
    fn nan_feature_is_named() {
        let mut g = graph();
        g.gpus[1].values[1] = f32::NAN;
        let err = g.validate("graph[3]").unwrap_err().to_string();
        assert!(
            err.contains("graph[3].gpus[1].values[1] (mem_free_gib)"),
            "{err}"
        );
        let mut g = graph();
        g.links[0].2.values[4] = f32::INFINITY;
        let err = g.validate("g").unwrap_err().to_string();
        assert!(
            err.contains("g.links[0].values[4] (log2_bandwidth_gbps)"),
            "{err}"
        );
        let mut g = graph();
        g.job.values[0] = f32::NEG_INFINITY;
        assert!(
            g.validate("g")
                .unwrap_err()
                .to_string()
                .contains("g.job.values[0] (log2_num_gpus)")
        );
    }

    #[test]
    fn structural_errors() {
        let mut g = graph();
        g.gpus.clear();
        assert!(g.validate("g").is_err());
        let mut g = graph();
        g.gpus = vec![GpuNodeFeatures::default(); MAX_GPUS_PER_GRAPH + 1];
        assert!(g.validate("g").is_err());
        let mut g = graph();
        g.links.push((0, 2, LinkFeatures::default()));
        assert!(g.validate("g").is_err());
        let mut g = graph();
        g.links.push((1, 1, LinkFeatures::default()));
        assert!(g.validate("g").is_err());
    }

    #[test]
    fn prior_slot_is_named() {
        assert_eq!(JOB_FEATURE_NAMES[PRIOR_JOB_SLOT], "log_prior_step_s");
    }

    #[test]
    fn shape_class_is_gpu_count_and_widest_level() {
        assert_eq!(graph().shape_class(), (2, 0));
        let mut g = graph();
        g.gpus.push(GpuNodeFeatures::default());
        g.links
            .push((0, 2, LinkFeatures::new(LinkKind::IbSpine, 400.0, 4)));
        assert_eq!(g.shape_class(), (3, 4));
        g.links.clear();
        assert_eq!(g.shape_class(), (3, 0));
    }

    #[test]
    fn link_encoding() {
        let l = LinkFeatures::new(LinkKind::IbSpine, 400.0, 3);
        assert_eq!(&l.values[..4], &[0.0, 0.0, 0.0, 1.0]);
        assert!((l.values[4] - 400f32.log2()).abs() < 1e-6);
        assert_eq!(l.values[5], 3.0);
    }

    #[test]
    fn targets_validation() {
        let t = Targets {
            step_time_s: 0.5,
            peak_mem_gib: [f32::NAN, 10.0, f32::NAN, 12.0],
            gpu_util_pct: f32::NAN,
        };
        t.validate("t").unwrap();
        assert!(
            Targets {
                step_time_s: 0.0,
                ..t
            }
            .validate("t")
            .is_err()
        );
        assert!(
            Targets {
                step_time_s: f32::NAN,
                ..t
            }
            .validate("t")
            .is_err()
        );
        let mut bad = t;
        bad.peak_mem_gib[2] = f32::INFINITY;
        assert!(
            bad.validate("t")
                .unwrap_err()
                .to_string()
                .contains("(eval)")
        );
    }
}
