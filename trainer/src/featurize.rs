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

use std::collections::BTreeMap;

use marshal_model::{
    GpuNodeFeatures, JobFeatures, LinkFeatures, LinkKind, MAX_GPUS_PER_GRAPH, PlacementGraph,
    Targets,
};
use marshal_scheduler::domain::{TopoLevel, Topology, WorkloadCatalog};

use crate::{StepExample, StepHistory};

/// What the featuriser needs of a cluster.
#[derive(Clone, Debug)]
pub struct ClusterContext {
    /// GB/s per level: NVLink island, node (PCIe), rack, spine.
    bandwidth: [f64; 4],
    memory_gib: BTreeMap<String, f64>,
    island: BTreeMap<String, u16>,
    kinds: WorkloadCatalog,
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
        _ => (100.0, 1.0),
    }
}

impl ClusterContext {
    pub fn new(topo: &Topology, kinds: WorkloadCatalog) -> Self {
        let mut memory_gib = BTreeMap::new();
        let mut island = BTreeMap::new();
        for node in topo.nodes() {
            if let Some(m) = node.model {
                let model = topo.catalog.get(m);
                memory_gib.insert(model.name.clone(), model.memory_gib);
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
        let n = (e.nodes * e.gpus_per_node) as usize;
        if n == 0 || n > MAX_GPUS_PER_GRAPH {
            return None;
        }
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
        let kind = self.kinds.id(&e.model).and_then(|id| self.kinds.get(id));
        let family = kind.map_or(e.model.as_str(), |k| k.family.as_str());
        let params = PARAMS
            .iter()
            .find(|(f, _)| *f == family)
            .map_or(30e6, |p| p.1);
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
                recalled.map_or(0.0, |r| r.step_time_s.ln() as f32),
                recalled.map_or(0.0, |r| f32::from(r.level)),
            ],
        };
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
