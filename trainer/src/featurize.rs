//! Step-profile examples as the predictor's placement graphs.
//!
//! A step profile records a placement's shape (`<nodes>x<GPUs per node>`), the GPU type,
//! the widest level it spans and the job's kind and batch. With the cluster's topology
//! (link bandwidths per level, GPU memory, NVLink island size) that is enough to rebuild
//! the placement subgraph the network reads: one vertex per GPU, one edge per GPU pair
//! (NVLink inside an island, PCIe inside a node, InfiniBand inside the rack or across
//! the spine), and the job's features.
//!
//! Values no table measures are named estimates: parameter counts per architecture
//! (published sizes, rounded) and the GPUs' datasheet FP16 throughput and memory
//! bandwidth.
//!
//! # The prior
//!
//! Every example also carries an analytic estimate of its step time (the model's
//! `log_prior_step_s` slot; the network learns the residual around it), built only from
//! what is known before the job runs:
//!
//! - a step is compute plus communication. With `c` the kind's communication share of a
//!   step over the reference link (the workload catalog's measurement, at the local batch
//!   size; 0 for one GPU or no communication), a gang whose slowest link is `bw` takes
//!   `1 − c + c·ref/bw` of a step on the reference link: the gradient all-reduce's bytes
//!   are the same, their time scales with the bottleneck link. Relative to the tightest
//!   placement the cluster allows for that GPU count, that is the placement's
//!   *slowdown*; a step is further slowed by the GPU type's throughput class and by
//!   co-tenants (the kind's measured co-location speed per extra tenant);
//! - the scale comes from history: the step times of *other* training jobs of the same
//!   kind, each divided by its own placement's slowdown factors (so a job measured spread
//!   and one measured packed tell the same packed, unshared time), then multiplied by this
//!   placement's. Only when the kind was never seen does a FLOP count stand in
//!   (`6 · parameters · local batch` at 40 % of the datasheet FP16 rate).
//!
//! No ring factor `2(n − 1)/n` is applied: the catalog's communication shares are
//! measured on gangs of the job's own size, so the volume is already in `c`.
//!
//! A second form takes over where a [`SyncFit`] has been fitted
//! ([`ClusterContext::with_sync`]) and covers the example: the step is the kind's
//! measured single-GPU compute time *plus* a fitted synchronisation time of this
//! placement, growing with log2 of the gang (see [`crate::SyncFit`]). It is for
//! measured data, where the share form misses what spreading costs; the simulator's
//! telemetry follows the share form exactly, and `marshal train predictor` keeps it
//! there.

use std::collections::BTreeMap;

use marshal_model::PRIOR_JOB_SLOT;
use marshal_model::{
    GpuNodeFeatures, JobFeatures, LinkFeatures, LinkKind, MAX_GPUS_PER_GRAPH, PlacementGraph,
    Targets,
};
use marshal_scheduler::domain::{TopoLevel, Topology, WorkloadCatalog, WorkloadKind};
use marshal_scheduler::sim::SpeedModel;

use crate::{StepExample, StepHistory, SyncFit};

/// What the featuriser needs of a cluster.
#[derive(Clone, Debug)]
pub struct ClusterContext {
    /// GB/s per level: NVLink island, node (PCIe), rack, spine.
    bandwidth: [f64; 4],
    memory_gib: BTreeMap<String, f64>,
    island: BTreeMap<String, u16>,
    kinds: WorkloadCatalog,
    /// GB/s of every [`TopoLevel`] (indexed by its number).
    level_gbps: [f64; 6],
    /// Most GPUs within each [`TopoLevel`] (indexed by its number).
    level_capacity: [u32; 6],
    /// Catalog throughput class per GPU model name.
    throughput: BTreeMap<String, f64>,
    /// Bandwidth (GB/s) the catalog's communication shares are measured at, and the
    /// shares and interference used for a job without a kind.
    speed: SpeedModel,
    /// Fitted synchronisation times ([`SyncFit`]); empty unless set with
    /// [`ClusterContext::with_sync`].
    sync: SyncFit,
}

/// The placement-dependent factors of one example's speed (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacementSpeed {
    /// GPU type's throughput class relative to the reference GPU.
    pub throughput: f64,
    /// Speed on this placement relative to the tightest one, in (0, 1].
    pub locality: f64,
    /// Speed left by co-tenants, in (0, 1].
    pub interference: f64,
}

impl PlacementSpeed {
    /// The product of the three factors.
    pub fn factor(&self) -> f64 {
        self.throughput * self.locality * self.interference
    }
}

/// Level a step profile's span names.
pub(crate) fn parse_level(span: &str) -> Option<TopoLevel> {
    Some(match span {
        "gpu" => TopoLevel::Gpu,
        "nvlink-island" => TopoLevel::NvlinkIsland,
        "node" => TopoLevel::Node,
        "rack" => TopoLevel::Rack,
        "spine" => TopoLevel::Spine,
        "cluster" => TopoLevel::Cluster,
        _ => return None,
    })
}

/// Approximate parameter counts of the architectures the workload kinds name.
const PARAMS: [(&str, f64); 12] = [
    ("ResNet-50", 25.6e6),
    ("imagenet", 25.6e6),
    ("ResNet-18", 11.7e6),
    ("cifar10", 11.2e6),
    ("Transformer", 65e6),
    ("bert", 110e6),
    ("LM", 20e6),
    ("deepspeech2", 38e6),
    ("Recommendation", 10e6),
    ("ncf", 10e6),
    ("CycleGAN", 11.4e6),
    ("yolov3", 62e6),
];

/// Datasheet dense FP16 TFLOP/s and memory TB/s per GPU model.
fn datasheet(gpu: &str) -> (f32, f32) {
    let g = gpu.to_ascii_uppercase();
    match () {
        _ if g.starts_with("H200") => (989.0, 4.8),
        _ if g.starts_with("H100") => (989.0, 3.35),
        _ if g.starts_with("A100") => (312.0, 1.6),
        _ if g.starts_with("V100") => (125.0, 0.9),
        _ if g.starts_with("T4") => (65.0, 0.32),
        _ if g.starts_with("P100") => (18.7, 0.73),
        _ if g.starts_with("K80") => (8.7, 0.48),
        _ if g.starts_with("A10") => (125.0, 0.6),
        _ if g.starts_with("L4") => (121.0, 0.3),
        // FP16 tensor rate with FP32 accumulation (GeForce: half of FP16 accumulation).
        _ if g.starts_with("RTX2080TI") => (53.8, 0.62),
        // Quadro: FP32 accumulation at the full FP16 tensor rate.
        _ if g.starts_with("RTX6000") => (130.5, 0.67),
        _ => (100.0, 1.0),
    }
}

impl ClusterContext {
    pub fn new(topo: &Topology, kinds: WorkloadCatalog) -> Self {
        let mut memory_gib = BTreeMap::new();
        let mut island = BTreeMap::new();
        let mut throughput = BTreeMap::new();
        for node in topo.nodes() {
            if let Some(m) = node.model {
                let model = topo.catalog.get(m);
                memory_gib.insert(model.name.clone(), model.memory_gib);
                throughput.insert(model.name.clone(), model.throughput);
                island.entry(model.name.clone()).or_insert(node.island_size);
            }
        }
        ClusterContext {
            bandwidth: [
                topo.bandwidth(TopoLevel::NvlinkIsland),
                topo.bandwidth(TopoLevel::Node),
                topo.bandwidth(TopoLevel::Rack),
                topo.bandwidth(TopoLevel::Spine),
            ],
            memory_gib,
            island,
            kinds,
            level_gbps: TopoLevel::ALL.map(|l| topo.bandwidth(l)),
            level_capacity: TopoLevel::ALL.map(|l| topo.max_gpus_within(l)),
            throughput,
            speed: SpeedModel::default(),
            sync: SyncFit::default(),
        }
    }

    /// Whether the cluster has GPUs of this model (the catalog's name): only then does
    /// the featuriser know its memory, NVLink island and throughput.
    pub fn has_gpu_type(&self, gpu_type: &str) -> bool {
        self.memory_gib.contains_key(gpu_type)
    }

    /// The GPU models the cluster has, in name order.
    pub fn gpu_types(&self) -> impl Iterator<Item = &str> {
        self.memory_gib.keys().map(String::as_str)
    }

    /// The same cluster with another workload catalog, e.g. one whose communication
    /// shares were fitted to a training split only (see [`crate::fit_comm_catalog`]).
    pub fn with_kinds(&self, kinds: WorkloadCatalog) -> Self {
        ClusterContext {
            kinds,
            ..self.clone()
        }
    }

    /// The same cluster whose prior takes the synchronisation time from `sync` wherever
    /// it has a fit for the example (the prior's second form, see the module docs).
    pub fn with_sync(&self, sync: SyncFit) -> Self {
        ClusterContext {
            sync,
            ..self.clone()
        }
    }

    /// [`SyncFit::fit`] on `train`, with the model families of this context's catalog.
    pub fn fit_sync(&self, train: &[StepExample]) -> SyncFit {
        SyncFit::fit(train, |e| self.family(e).to_string())
    }

    /// The model family of an example's kind (its kind name when the catalog does not
    /// know it).
    fn family<'a>(&'a self, e: &'a StepExample) -> &'a str {
        self.kinds
            .id(&e.model)
            .and_then(|id| self.kinds.get(id))
            .map_or(e.model.as_str(), |k| k.family.as_str())
    }

    /// The fitted (compute, step) times of the example's placement, where there are.
    fn fitted_step_s(&self, e: &StepExample) -> Option<(f64, f64)> {
        self.sync.step_s(self.family(e), e)
    }

    /// The history of `train` ([`StepHistory::fit_with_priors`]): each entry's speed
    /// factor and its prior on this context, so that the prior carries the history's
    /// offsets.
    pub fn history(&self, train: &[StepExample]) -> StepHistory {
        StepHistory::fit_with_priors(
            train,
            |e| self.history_speed(e),
            |e, h| self.prior_step_s(e, h),
        )
    }

    /// The factor that turns a measured step time into the history's packed, unshared
    /// step time on the reference GPU (`step × factor`): the placement's speed factors in
    /// the share form; with a fitted synchronisation line, the fitted compute time over
    /// the fitted step time in place of the locality factor.
    pub fn history_speed(&self, e: &StepExample) -> f64 {
        let speed = self.placement_speed(e);
        match self.fitted_step_s(e) {
            Some((compute, step)) => compute / step * speed.throughput * speed.interference,
            None => speed.factor(),
        }
    }

    /// Bandwidth of `level`, GB/s.
    pub(crate) fn level_gbps(&self, level: TopoLevel) -> f64 {
        self.level_gbps[level as usize]
    }

    /// Bandwidth the communication shares are stated at, GB/s.
    pub(crate) fn reference_gbps(&self) -> f64 {
        self.speed.reference_gbps
    }

    /// The example's communication share at the reference bandwidth: the kind's
    /// (at its local batch), else the default of the job's pattern; 0 for one GPU or a
    /// job that does not communicate.
    fn comm_share(&self, e: &StepExample) -> f64 {
        if e.num_gpus <= 1 || e.comm == "none" {
            return 0.0;
        }
        let local_batch = e
            .batch_size
            .map(|b| f64::from(b) / f64::from(e.num_gpus.max(1)));
        match self.kinds.id(&e.model).and_then(|id| self.kinds.get(id)) {
            Some(k) => k.comm_share_at(local_batch),
            None => match e.comm.as_str() {
                "data-parallel" => self.speed.data_parallel_comm,
                "tensor-parallel" => self.speed.tensor_parallel_comm,
                "pipeline-parallel" => self.speed.pipeline_parallel_comm,
                _ => 0.0,
            },
        }
    }

    /// Speed factors of the example's placement (see the module docs); every factor is
    /// finite and positive.
    pub fn placement_speed(&self, e: &StepExample) -> PlacementSpeed {
        let kind = self.kinds.id(&e.model).and_then(|id| self.kinds.get(id));
        let throughput = kind
            .and_then(|k| k.relative_throughput.get(&e.gpu_type).copied())
            .or_else(|| self.throughput.get(&e.gpu_type).copied())
            .filter(|t| t.is_finite() && *t > 0.0)
            .unwrap_or(1.0);
        let c = self.comm_share(e).clamp(0.0, 0.99);
        let locality = if c == 0.0 {
            1.0
        } else {
            let tightest = TopoLevel::ALL[1..]
                .iter()
                .copied()
                .find(|&l| self.level_capacity[l as usize] >= e.num_gpus)
                .unwrap_or(TopoLevel::Cluster)
                .max(TopoLevel::NvlinkIsland);
            let level = parse_level(&e.span)
                .unwrap_or(if e.nodes > 1 {
                    TopoLevel::Rack
                } else {
                    TopoLevel::Node
                })
                .max(TopoLevel::NvlinkIsland);
            let time = |l: TopoLevel| {
                let bw = self.level_gbps[l as usize].max(1e-6);
                1.0 - c + c * self.speed.reference_gbps / bw
            };
            (time(tightest) / time(level)).min(1.0)
        };
        let others = e.tenants.saturating_sub(1);
        let interference = match kind {
            Some(k) => k.colocation_speed.powi(i32::from(others)),
            None => 1.0 - self.speed.interference * f64::from(others),
        }
        .max(self.speed.min_interference_factor);
        PlacementSpeed {
            throughput,
            locality,
            interference,
        }
    }

    /// The example's workload kind, when the catalog knows it, and the parameter count
    /// of its model family (a named estimate; 30 M for an unknown family).
    fn kind_and_params(&self, e: &StepExample) -> (Option<&WorkloadKind>, f64) {
        let kind = self.kinds.id(&e.model).and_then(|id| self.kinds.get(id));
        let family = self.family(e);
        let params = PARAMS
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(30e6, |p| p.1);
        (kind, params)
    }

    /// The example's analytic step time, seconds (finite and positive): the history's
    /// packed, unshared step time of other jobs of its kind (or a FLOP count when the kind
    /// has no history) over this placement's speed factor; where a [`SyncFit`] covers the
    /// example, its fitted step time over the interference factor instead. Either is
    /// multiplied by the history's offset for the kind on this locality
    /// ([`StepHistory::prior_offset`]).
    pub fn prior_step_s(&self, e: &StepExample, history: &StepHistory) -> f64 {
        let speed = self.placement_speed(e);
        let factor = speed.factor();
        let packed = match history.recall(e) {
            Some(r) => r.packed_step_s,
            None => {
                let (_, params) = self.kind_and_params(e);
                let local_batch = e
                    .batch_size
                    .map_or(32.0, |b| f64::from(b) / f64::from(e.num_gpus.max(1)));
                let (tflops, _) = datasheet(&e.gpu_type);
                // On the GPU's own datasheet rate, so undo the throughput class below.
                6.0 * params * local_batch / (f64::from(tflops) * 1e12 * 0.4) * speed.throughput
            }
        };
        let prior = match self.fitted_step_s(e) {
            Some((_, step)) => step / speed.interference,
            None => packed / factor,
        } * history.prior_offset(e).exp();
        if prior.is_finite() && prior > 0.0 {
            prior.clamp(1e-9, 1e9)
        } else {
            1.0
        }
    }

    /// The example's graph and targets; `None` when the placement has more GPUs than a
    /// graph may hold. `history` supplies the job's history features (see
    /// [`StepHistory`]).
    pub fn featurize(
        &self,
        e: &StepExample,
        history: &StepHistory,
    ) -> Option<(PlacementGraph, Targets)> {
        // In u64: a profile row's shape is input, and the u32 product can wrap to a
        // small graph.
        let n = u64::from(e.nodes) * u64::from(e.gpus_per_node);
        if n == 0 || n > MAX_GPUS_PER_GRAPH as u64 {
            return None;
        }
        let n = n as usize;
        let memory = self.memory_gib.get(&e.gpu_type).copied().unwrap_or(16.0) as f32;
        let island = self.island.get(&e.gpu_type).copied().unwrap_or(1).max(1);
        let (tflops, tbps) = datasheet(&e.gpu_type);
        let gpu = GpuNodeFeatures {
            values: [
                memory,
                memory,
                0.0,
                tflops,
                tbps,
                1.0,
                f32::from(e.tenants.saturating_sub(1)),
                0.0,
                50.0,
                f32::from(island),
            ],
        };
        let across = if matches!(e.span.as_str(), "spine" | "cluster") {
            (LinkKind::IbSpine, self.bandwidth[3], 4u8)
        } else {
            (LinkKind::IbRack, self.bandwidth[2], 3u8)
        };
        let mut links = Vec::new();
        let per_node = e.gpus_per_node as usize;
        for a in 0..n {
            for b in a + 1..n {
                let (kind, gbps, level) = if a / per_node != b / per_node {
                    across
                } else if (a % per_node) / island as usize == (b % per_node) / island as usize
                    && island > 1
                {
                    (LinkKind::NvLink, self.bandwidth[0], 1)
                } else {
                    (LinkKind::Pcie, self.bandwidth[1], 2)
                };
                links.push((
                    a as u16,
                    b as u16,
                    LinkFeatures::new(kind, (gbps * 8.0) as f32, level),
                ));
            }
        }
        let (kind, params) = self.kind_and_params(e);
        let local_batch = e
            .batch_size
            .map(|b| f64::from(b) / f64::from(e.num_gpus.max(1)));
        let comm = kind.map_or(0.0, |k| k.comm_share_at(local_batch));
        let parallel = match e.comm.as_str() {
            "data-parallel" => [1.0, 0.0, 0.0, 0.0],
            "tensor-parallel" => [0.0, 1.0, 0.0, 0.0],
            "pipeline-parallel" => [0.0, 0.0, 1.0, 0.0],
            _ => [0.0, 0.0, 0.0, 1.0],
        };
        let recalled = history.recall(e);
        let job = JobFeatures {
            values: [
                (e.num_gpus.max(1) as f32).log2(),
                params.log10() as f32,
                e.batch_size.map_or(0.0, |b| (b as f32).log2()),
                0.0,
                parallel[0],
                parallel[1],
                parallel[2],
                parallel[3],
                4.0,
                0.0,
                (comm / (1.0 - comm).max(1e-3)) as f32,
                recalled.map_or(0.0, |r| r.packed_step_s.ln() as f32),
                recalled.map_or(0.0, |r| f32::from(r.level)),
                self.prior_step_s(e, history).ln() as f32,
            ],
        };
        debug_assert!(job.values[PRIOR_JOB_SLOT].is_finite());
        let mem = e.peak_mem_gib.map(|m| m.map_or(f32::NAN, |v| v as f32));
        Some((
            PlacementGraph {
                gpus: vec![gpu; n],
                links,
                job,
            },
            Targets {
                step_time_s: e.step_time_s as f32,
                peak_mem_gib: mem,
                gpu_util_pct: e.gpu_util_pct.map_or(f32::NAN, |u| u as f32),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baselines::tests::ex;
    use marshal_scheduler::domain::ClusterSpec;

    fn ctx() -> ClusterContext {
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=4\ngpu_model='V100M32'\ngpus=8\n\
             nvlink_domain=4\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        ClusterContext::new(&Topology::build(&spec).unwrap(), WorkloadCatalog::default())
    }

    #[test]
    fn the_prior_is_finite_for_every_shape() {
        let ctx = ctx();
        let empty = StepHistory::default();
        let history = StepHistory::fit(&[ex("h", "bert", 4, 1, "node", 2.0)], |e| {
            ctx.placement_speed(e).factor()
        });
        let spans = [
            "gpu",
            "nvlink-island",
            "node",
            "rack",
            "spine",
            "cluster",
            "?",
        ];
        for span in spans {
            for (gpus, nodes) in [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 4), (32, 4)] {
                for tenants in [1, 2, 9] {
                    for comm in ["none", "data-parallel", "tensor-parallel", "odd"] {
                        let mut e = ex("j", "bert", gpus, nodes, span, 1.0);
                        e.tenants = tenants;
                        e.comm = comm.into();
                        for h in [&empty, &history] {
                            let prior = ctx.prior_step_s(&e, h);
                            assert!(prior.is_finite() && prior > 0.0, "{e:?}: {prior}");
                            let (g, _) = ctx.featurize(&e, h).unwrap();
                            let v = g.job.values[PRIOR_JOB_SLOT];
                            assert!(v.is_finite() && (f64::from(v) - prior.ln()).abs() < 1e-4);
                            g.validate("g").unwrap();
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_shape_whose_gpu_count_overflows_is_no_graph() {
        let ctx = ctx();
        // 2^31 + 1 nodes of 2 GPUs: the u32 product wraps to 2.
        let mut e = ex("j", "bert", 2, 1, "spine", 1.0);
        (e.nodes, e.gpus_per_node) = ((1 << 31) + 1, 2);
        assert!(ctx.featurize(&e, &StepHistory::default()).is_none());
    }

    #[test]
    fn spreading_a_communicating_gang_slows_the_prior_down() {
        let ctx = ctx();
        let island = ex("a", "bert", 4, 1, "nvlink-island", 1.0);
        let node = ex("a", "bert", 4, 1, "node", 1.0);
        let rack = ex("a", "bert", 4, 2, "rack", 1.0);
        let spine = ex("a", "bert", 4, 4, "spine", 1.0);
        let locality = |e: &StepExample| ctx.placement_speed(e).locality;
        assert_eq!(locality(&island), 1.0);
        assert!(locality(&node) < 1.0);
        assert!(locality(&rack) < locality(&node));
        assert!(locality(&spine) <= locality(&rack));
        // One GPU, or no communication: placement does not matter.
        assert_eq!(locality(&ex("a", "bert", 1, 1, "spine", 1.0)), 1.0);
        let mut quiet = spine.clone();
        quiet.comm = "none".into();
        assert_eq!(locality(&quiet), 1.0);
        // A co-tenant slows it down.
        let mut shared = island.clone();
        shared.tenants = 2;
        assert!(ctx.placement_speed(&shared).interference < 1.0);
    }

    #[test]
    fn history_measured_spread_predicts_packed_through_the_prior() {
        let ctx = ctx();
        // Job b was measured spread across racks; its packed equivalent is what a new
        // packed job of the kind gets as its prior, and vice versa.
        let spread = ex("b", "bert", 4, 2, "rack", 3.0);
        let history = StepHistory::fit(std::slice::from_ref(&spread), |e| {
            ctx.placement_speed(e).factor()
        });
        let packed = ex("new", "bert", 4, 1, "nvlink-island", 0.0);
        let expected =
            3.0 * ctx.placement_speed(&spread).factor() / ctx.placement_speed(&packed).factor();
        assert!((ctx.prior_step_s(&packed, &history) - expected).abs() < 1e-12);
        assert!(expected < 3.0);
        let again = ex("new", "bert", 4, 2, "rack", 0.0);
        assert!((ctx.prior_step_s(&again, &history) - 3.0).abs() < 1e-12);
    }

    /// One GPU 1.0 s; gangs pay 0.2 s within a node and 0.5 + 0.2·log2(K/2) across.
    fn sync_train() -> Vec<StepExample> {
        vec![
            ex("one", "bert", 1, 1, "gpu", 1.0),
            ex("two", "bert", 2, 1, "node", 1.2),
            ex("four", "bert", 4, 1, "node", 1.2),
            ex("wide2", "bert", 2, 2, "rack", 1.5),
            ex("wide4", "bert", 4, 4, "rack", 1.7),
        ]
    }

    #[test]
    fn a_fitted_sync_line_adds_to_the_kinds_single_gpu_time() {
        let ctx = ctx();
        // One GPU 1.0 s; gangs pay 0.2 s within a node and 0.5 + 0.2·log2(K/2) across.
        let train = sync_train();
        let fitted = ctx.with_sync(ctx.fit_sync(&train));
        let history = StepHistory::fit(&train, |e| fitted.history_speed(e));
        // The kind's single-GPU time is 1.0 s, so a new 8-GPU gang over 8 nodes (a
        // shape never measured) is 1.0 + 0.5 + 0.2·2 s.
        let wide8 = ex("new", "bert", 8, 8, "rack", 0.0);
        let prior = fitted.prior_step_s(&wide8, &history);
        assert!((prior - 1.9).abs() < 1e-6, "{prior}");
        // The share form has no such growth: every multi-node 8-GPU gang is its
        // history's packed time over the rack's locality.
        let plain = StepHistory::fit(&train, |e| ctx.history_speed(e));
        let share = ctx.prior_step_s(&wide8, &plain);
        assert!((share - prior).abs() > 0.1, "{share} vs {prior}");
        // A kind with no fit keeps the share form.
        let other = ex("o", "gpt", 8, 8, "rack", 2.0);
        assert_eq!(fitted.history_speed(&other), ctx.history_speed(&other));
        assert_eq!(
            fitted.prior_step_s(&other, &history),
            ctx.prior_step_s(&other, &history)
        );
    }

    #[test]
    fn the_prior_carries_the_historys_offset_for_the_kind_on_its_locality() {
        let ctx = ctx();
        // Spread over two nodes, bert runs about 3× its packed time, which the share
        // form's locality factor does not say; a new spread gang's prior carries the miss.
        let train = vec![
            ex("p1", "bert", 4, 1, "node", 1.0),
            ex("p2", "bert", 4, 1, "node", 1.1),
            ex("s1", "bert", 4, 2, "rack", 3.0),
            ex("s2", "bert", 4, 2, "rack", 3.3),
        ];
        let plain = StepHistory::fit(&train, |e| ctx.history_speed(e));
        let with = ctx.history(&train);
        let new = ex("new", "bert", 4, 2, "rack", 0.0);
        let offset = with.prior_offset(&new);
        assert!(offset.abs() > 0.01, "{offset}");
        let (a, b) = (
            ctx.prior_step_s(&new, &plain),
            ctx.prior_step_s(&new, &with),
        );
        assert!((b - a * offset.exp()).abs() < 1e-9, "{a} {b} {offset}");
        // The offset is the spread examples' misses against a new job's prior without
        // offsets, shrunk: Σ ln(step / prior) / (2 + 1). The packed ones have their own.
        let miss: f64 = train[2..]
            .iter()
            .map(|e| {
                let as_new = StepExample {
                    job_id: "(new job 0)".into(),
                    ..e.clone()
                };
                (e.step_time_s / ctx.prior_step_s(&as_new, &plain)).ln()
            })
            .sum();
        assert!((offset - miss / 3.0).abs() < 1e-9, "{offset} {miss}");
        let packed = ex("new", "bert", 4, 1, "node", 0.0);
        assert!((with.prior_offset(&packed) - offset).abs() > 0.01);
    }
}
