//! The topology tree: cluster → spine → rack → node → NVLink island → GPU.
//!
//! Nodes, racks and spines are stored in flat arrays in tree order, so every domain is a
//! contiguous range of its children; "distance" between two GPUs is the level of their
//! lowest common ancestor, computed from ids without walking the tree.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::domain::{
    ClusterSpec, DomainError, GpuCatalog, GpuDemand, GpuModel, GpuModelId, LinkSpec,
    MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MigInstanceShape, NodeGroupSpec,
};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RackId(pub u32);
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SpineId(pub u32);

/// Levels of the tree, tightest first. The distance between two GPUs is the level of
/// their lowest common ancestor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TopoLevel {
    Gpu = 0,
    NvlinkIsland = 1,
    Node = 2,
    Rack = 3,
    Spine = 4,
    Cluster = 5,
}

impl TopoLevel {
    pub const ALL: [TopoLevel; 6] = [
        TopoLevel::Gpu,
        TopoLevel::NvlinkIsland,
        TopoLevel::Node,
        TopoLevel::Rack,
        TopoLevel::Spine,
        TopoLevel::Cluster,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TopoLevel::Gpu => "gpu",
            TopoLevel::NvlinkIsland => "nvlink",
            TopoLevel::Node => "node",
            TopoLevel::Rack => "rack",
            TopoLevel::Spine => "spine",
            TopoLevel::Cluster => "cluster",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub rack: RackId,
    pub spine: SpineId,
    pub gpus: Range<u32>,
    pub model: Option<GpuModelId>,
    /// GPUs per NVLink island (1 = PCIe only).
    pub island_size: u16,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// GPUs in [`MigMode::On`]: they take MIG instances only.
    pub mig_on_gpus: u16,
    /// GPUs that can hold MIG instances ([`MigMode::On`] or [`MigMode::Open`]).
    pub mig_capable_gpus: u16,
    /// The node's fixed MIG instances, in [`Topology::mig_instances`].
    pub mig_instances: Range<u32>,
}

impl Node {
    pub fn gpu_count(&self) -> u16 {
        (self.gpus.end - self.gpus.start) as u16
    }

    /// GPUs that can take whole-GPU and shared (milli) workers: those not in MIG mode.
    pub fn non_mig_gpus(&self) -> u16 {
        self.gpu_count() - self.mig_on_gpus
    }

    pub fn gpu_ids(&self) -> impl Iterator<Item = GpuId> + use<> {
        self.gpus.clone().map(GpuId)
    }
}

#[derive(Clone, Debug)]
pub struct Gpu {
    pub node: NodeId,
    /// Index within its node (what CUDA_VISIBLE_DEVICES names).
    pub index: u16,
    /// Global id of its NVLink island.
    pub island: u32,
    pub model: GpuModelId,
    pub mig: MigMode,
    /// Its fixed MIG instances (static MIG), in [`Topology::mig_instances`]; `None` when
    /// the scheduler partitions it as MIG workers come (or it takes none).
    pub mig_layout: Option<Range<u32>>,
}

/// One MIG instance an administrator made: a MIG worker of exactly its size can take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigInstanceSlot {
    pub gpu: GpuId,
    /// The profile as the inventory names it (`3g.40gb`, `1c.2g.20gb`).
    pub profile: String,
    pub compute: u8,
    pub memory: u8,
}

/// Whether a GPU is partitioned into MIG instances.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigMode {
    /// The inventory does not say (dynamic MIG): the GPU holds MIG instances while no
    /// whole or shared worker holds it, and those workers while it holds no instance.
    Open,
    /// In MIG mode: MIG instances only.
    On,
    /// Not in MIG mode, or a model without MIG: never a MIG instance.
    Off,
}

impl MigMode {
    /// Whether a GPU in this mode can ever hold `demand`, capacity aside.
    pub fn admits(self, demand: GpuDemand) -> bool {
        match (self, demand) {
            (MigMode::Open, _) | (_, GpuDemand::None) => true,
            (mode, GpuDemand::Mig { .. }) => mode == MigMode::On,
            (mode, _) => mode == MigMode::Off,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Rack {
    pub spine: SpineId,
    pub nodes: Range<u32>,
}

#[derive(Clone, Debug)]
pub struct Spine {
    pub racks: Range<u32>,
}

#[derive(Clone, Debug)]
pub struct Topology {
    pub name: String,
    pub catalog: GpuCatalog,
    pub links: LinkSpec,
    nodes: Vec<Node>,
    /// Each node's GPU model, in node order: `Node::model` packed for scans over every
    /// node (a `Node` is several cache lines' worth of fields apart from its neighbour).
    node_models: Vec<Option<GpuModelId>>,
    gpus: Vec<Gpu>,
    mig_instances: Vec<MigInstanceSlot>,
    racks: Vec<Rack>,
    spines: Vec<Spine>,
    max_node_cpu_milli: u32,
    max_node_gpus: u16,
    /// Whether any GPU is in MIG mode ([`MigMode::On`]): scorers skip a per-node check
    /// on the (common) clusters where none is.
    any_gpu_in_mig_mode: bool,
    level_capacity: [u32; 6],
}

impl Topology {
    pub fn build(spec: &ClusterSpec) -> Result<Topology, DomainError> {
        spec.validate()?;
        let mut catalog = GpuCatalog::default();
        for m in &spec.gpu_models {
            catalog.add(m.clone())?;
        }
        let mut nodes = Vec::with_capacity(spec.node_count() as usize);
        let mut gpus = Vec::with_capacity(spec.gpu_count() as usize);
        let mut mig_instances: Vec<MigInstanceSlot> = Vec::new();
        let mut racks: Vec<Rack> = Vec::new();
        let mut spines: Vec<Spine> = Vec::new();
        let mut islands = 0u32;
        for (group_index, group) in spec.node_groups.iter().enumerate() {
            let model = group
                .gpu_model
                .as_deref()
                .filter(|_| group.gpus > 0)
                .map(|name| catalog.require(name))
                .transpose()?;
            let island_size = group.nvlink_domain.max(1);
            let supports_mig = model.is_some_and(|m| catalog.get(m).supports_mig());
            if let Some(mig) = group.mig_gpus.as_ref().filter(|m| !m.is_empty())
                && !supports_mig
            {
                return Err(DomainError::Invalid(format!(
                    "cluster {}: node group {group_index}: mig_gpus {mig:?} on {}, a model without MIG",
                    spec.name,
                    group.gpu_model.as_deref().unwrap_or("no GPU")
                )));
            }
            let mig_mode = |index: u16| match &group.mig_gpus {
                _ if !supports_mig => MigMode::Off,
                None => MigMode::Open,
                Some(on) if on.contains(&index) => MigMode::On,
                Some(_) => MigMode::Off,
            };
            let layouts = match model {
                Some(m) => resolve_mig_layouts(group, catalog.get(m)).map_err(|why| {
                    DomainError::Invalid(format!(
                        "cluster {}: node group {group_index}: {why}",
                        spec.name
                    ))
                })?,
                None => Vec::new(),
            };
            let mig_on_gpus = (0..group.gpus)
                .filter(|&i| mig_mode(i) == MigMode::On)
                .count() as u16;
            let mig_capable_gpus = (0..group.gpus)
                .filter(|&i| mig_mode(i) != MigMode::Off)
                .count() as u16;
            for n in 0..group.count {
                let id = nodes.len() as u32;
                if id.is_multiple_of(spec.nodes_per_rack) {
                    let rack_id = racks.len() as u32;
                    if rack_id.is_multiple_of(spec.racks_per_spine) {
                        spines.push(Spine {
                            racks: rack_id..rack_id,
                        });
                    }
                    let spine = SpineId(spines.len() as u32 - 1);
                    spines[spine.0 as usize].racks.end = rack_id + 1;
                    racks.push(Rack {
                        spine,
                        nodes: id..id,
                    });
                }
                let rack = RackId(racks.len() as u32 - 1);
                racks[rack.0 as usize].nodes.end = id + 1;
                let name = group.node_name(n, id);
                let first_gpu = gpus.len() as u32;
                let first_instance = mig_instances.len() as u32;
                for index in 0..group.gpus {
                    if index % island_size == 0 {
                        islands += 1;
                    }
                    let gpu = GpuId(gpus.len() as u32);
                    let mig_layout =
                        layouts
                            .get(index as usize)
                            .and_then(Option::as_ref)
                            .map(|layout| {
                                let start = mig_instances.len() as u32;
                                mig_instances.extend(layout.iter().map(|(profile, shape)| {
                                    MigInstanceSlot {
                                        gpu,
                                        profile: profile.clone(),
                                        compute: shape.compute,
                                        memory: shape.memory,
                                    }
                                }));
                                start..mig_instances.len() as u32
                            });
                    gpus.push(Gpu {
                        node: NodeId(id),
                        index,
                        island: islands - 1,
                        model: model.expect("validated: GPUs imply a model"),
                        mig: mig_mode(index),
                        mig_layout,
                    });
                }
                nodes.push(Node {
                    name,
                    rack,
                    spine: racks[rack.0 as usize].spine,
                    gpus: first_gpu..gpus.len() as u32,
                    model,
                    island_size,
                    cpu_milli: group.cpu_milli,
                    memory_mib: group.memory_mib,
                    mig_on_gpus,
                    mig_capable_gpus,
                    mig_instances: first_instance..mig_instances.len() as u32,
                });
            }
        }
        let mut topo = Topology {
            level_capacity: [0; 6],
            max_node_cpu_milli: nodes.iter().map(|n| n.cpu_milli).max().unwrap_or(0),
            max_node_gpus: nodes.iter().map(|n| n.gpu_count()).max().unwrap_or(0),
            any_gpu_in_mig_mode: nodes.iter().any(|n| n.mig_on_gpus > 0),
            name: spec.name.clone(),
            catalog,
            links: spec.links.clone(),
            node_models: nodes.iter().map(|n| n.model).collect(),
            nodes,
            gpus,
            mig_instances,
            racks,
            spines,
        };
        topo.level_capacity = TopoLevel::ALL.map(|l| topo.count_max_gpus_within(l));
        Ok(topo)
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Each node's GPU model (`None` for a CPU-only node), in node order.
    pub fn node_models(&self) -> &[Option<GpuModelId>] {
        &self.node_models
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    pub fn gpu(&self, id: GpuId) -> &Gpu {
        &self.gpus[id.0 as usize]
    }

    /// Every fixed MIG instance, node by node and GPU by GPU.
    pub fn mig_instances(&self) -> &[MigInstanceSlot] {
        &self.mig_instances
    }

    /// The fixed MIG instances of `gpu`; `None` when it has no fixed layout.
    pub fn gpu_mig_instances(&self, gpu: GpuId) -> Option<&[MigInstanceSlot]> {
        let r = self.gpu(gpu).mig_layout.as_ref()?;
        Some(&self.mig_instances[r.start as usize..r.end as usize])
    }

    /// How many MIG workers of `compute` and `memory` slices `node` holds when empty:
    /// its fixed instances of that size, and as many as fit on each GPU it partitions
    /// as workers come.
    pub fn mig_workers_on_empty_node(&self, node: &Node, compute: u8, memory: u8) -> u64 {
        let dynamic = (MIG_COMPUTE_SLICES / compute.max(1)).min(MIG_MEMORY_SLICES / memory.max(1));
        node.gpus
            .clone()
            .map(|g| match self.gpu_mig_instances(GpuId(g)) {
                Some(fixed) => fixed
                    .iter()
                    .filter(|i| (i.compute, i.memory) == (compute, memory))
                    .count() as u64,
                None if self.gpus[g as usize].mig == MigMode::Off => 0,
                None => dynamic as u64,
            })
            .sum()
    }

    pub fn racks(&self) -> &[Rack] {
        &self.racks
    }

    pub fn spines(&self) -> &[Spine] {
        &self.spines
    }

    /// CPU of the largest node, in milli-cores.
    pub fn max_node_cpu_milli(&self) -> u32 {
        self.max_node_cpu_milli
    }

    /// GPUs of the largest node.
    pub fn max_node_gpus(&self) -> u16 {
        self.max_node_gpus
    }

    /// Whether any GPU of the cluster is in MIG mode.
    pub fn any_gpu_in_mig_mode(&self) -> bool {
        self.any_gpu_in_mig_mode
    }

    pub fn gpu_count(&self) -> u32 {
        self.gpus.len() as u32
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + use<> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    /// Level of the lowest common ancestor of two GPUs.
    pub fn distance(&self, a: GpuId, b: GpuId) -> TopoLevel {
        if a == b {
            return TopoLevel::Gpu;
        }
        let (ga, gb) = (self.gpu(a), self.gpu(b));
        if ga.island == gb.island && self.node(ga.node).island_size > 1 {
            return TopoLevel::NvlinkIsland;
        }
        if ga.node == gb.node {
            return TopoLevel::Node;
        }
        let (na, nb) = (self.node(ga.node), self.node(gb.node));
        if na.rack == nb.rack {
            TopoLevel::Rack
        } else if na.spine == nb.spine {
            TopoLevel::Spine
        } else {
            TopoLevel::Cluster
        }
    }

    /// Smallest domain that holds all of `gpus` (the level of their common ancestor).
    pub fn span(&self, gpus: impl IntoIterator<Item = GpuId>) -> TopoLevel {
        let mut iter = gpus.into_iter();
        let Some(first) = iter.next() else {
            return TopoLevel::Gpu;
        };
        iter.map(|g| self.distance(first, g))
            .max()
            .unwrap_or(TopoLevel::Gpu)
    }

    /// Bandwidth, in GB/s, of the slowest link crossed at `level`.
    pub fn bandwidth(&self, level: TopoLevel) -> f64 {
        let l = &self.links;
        match level {
            TopoLevel::Gpu | TopoLevel::NvlinkIsland => l.nvlink_gbps,
            TopoLevel::Node => l.pcie_gbps,
            TopoLevel::Rack => l.rack_gbps,
            TopoLevel::Spine | TopoLevel::Cluster => l.spine_gbps,
        }
    }

    /// Largest number of GPUs in any single domain of `level`; used to tell whether a
    /// placement is as tight as the hardware allows.
    pub fn max_gpus_within(&self, level: TopoLevel) -> u32 {
        self.level_capacity[level as usize]
    }

    fn count_max_gpus_within(&self, level: TopoLevel) -> u32 {
        let node_gpus = |r: &Range<u32>| -> u32 {
            self.nodes[r.start as usize..r.end as usize]
                .iter()
                .map(|n| n.gpu_count() as u32)
                .sum()
        };
        match level {
            TopoLevel::Gpu => 1,
            TopoLevel::NvlinkIsland => self
                .nodes
                .iter()
                .map(|n| n.island_size.min(n.gpu_count()) as u32)
                .max()
                .unwrap_or(0),
            TopoLevel::Node => self
                .nodes
                .iter()
                .map(|n| n.gpu_count() as u32)
                .max()
                .unwrap_or(0),
            TopoLevel::Rack => self
                .racks
                .iter()
                .map(|r| node_gpus(&r.nodes))
                .max()
                .unwrap_or(0),
            TopoLevel::Spine => self
                .spines
                .iter()
                .map(|s| {
                    self.racks[s.racks.start as usize..s.racks.end as usize]
                        .iter()
                        .map(|r| node_gpus(&r.nodes))
                        .sum::<u32>()
                })
                .max()
                .unwrap_or(0),
            TopoLevel::Cluster => self.gpu_count(),
        }
    }

    /// Tightest level whose largest domain could hold `gpus` GPUs on an empty cluster.
    pub fn tightest_level_for(&self, gpus: u32) -> TopoLevel {
        TopoLevel::ALL[1..]
            .iter()
            .copied()
            .find(|&l| self.max_gpus_within(l) >= gpus)
            .unwrap_or(TopoLevel::Cluster)
    }
}

/// Each GPU's fixed MIG layout (by index in the group), its names resolved on `model`
/// and checked to fit one GPU.
type ResolvedLayout = Vec<(String, MigInstanceShape)>;

fn resolve_mig_layouts(
    group: &NodeGroupSpec,
    model: &GpuModel,
) -> Result<Vec<Option<ResolvedLayout>>, String> {
    let mut per_gpu = vec![None; group.gpus as usize];
    for layout in &group.mig_layout {
        let mut resolved = Vec::with_capacity(layout.instances.len());
        for profile in &layout.instances {
            let shape = model.mig_instance(profile).ok_or_else(|| {
                format!(
                    "mig_layout for GPUs {:?}: {} has no MIG profile {profile:?} (it has {})",
                    layout.gpus,
                    model.name,
                    model
                        .mig_profiles
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            resolved.push((profile.clone(), shape));
        }
        let compute: u32 = resolved
            .iter()
            .map(|(_, s)| s.gpu_instance_compute as u32)
            .sum();
        let memory: u32 = resolved.iter().map(|(_, s)| s.memory as u32).sum();
        if compute > MIG_COMPUTE_SLICES as u32 || memory > MIG_MEMORY_SLICES as u32 {
            return Err(format!(
                "mig_layout for GPUs {:?}: {:?} take {compute} compute and {memory} memory slices; a GPU has {MIG_COMPUTE_SLICES} and {MIG_MEMORY_SLICES}",
                layout.gpus, layout.instances
            ));
        }
        for &gpu in &layout.gpus {
            per_gpu[gpu as usize] = Some(resolved.clone());
        }
    }
    Ok(per_gpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn two_racks() -> Topology {
        let group = |count, gpus, island| NodeGroupSpec {
            count,
            name_prefix: None,
            names: vec![],
            gpu_model: Some("H100".into()),
            gpus,
            nvlink_domain: island,
            cpu_milli: 64_000,
            memory_mib: 512 * 1024,
            mig_gpus: None,
            mig_layout: Vec::new(),
        };
        let spec = ClusterSpec {
            name: "t".into(),
            nodes_per_rack: 2,
            racks_per_spine: 1,
            links: LinkSpec::default(),
            gpu_models: vec![],
            node_groups: vec![group(3, 8, 4), group(1, 2, 0)],
        };
        Topology::build(&spec).unwrap()
    }

    #[test]
    fn distance_is_the_level_of_the_lowest_common_ancestor() {
        let t = two_racks();
        assert_eq!(t.gpu_count(), 26);
        assert_eq!(t.racks().len(), 2);
        assert_eq!(t.spines().len(), 2);
        assert_eq!(t.distance(GpuId(0), GpuId(0)), TopoLevel::Gpu);
        assert_eq!(t.distance(GpuId(0), GpuId(3)), TopoLevel::NvlinkIsland);
        assert_eq!(t.distance(GpuId(0), GpuId(4)), TopoLevel::Node);
        assert_eq!(t.distance(GpuId(0), GpuId(8)), TopoLevel::Rack);
        assert_eq!(t.distance(GpuId(0), GpuId(16)), TopoLevel::Cluster);
        // PCIe-only node: GPUs share a node but no island.
        assert_eq!(t.distance(GpuId(24), GpuId(25)), TopoLevel::Node);
        assert_eq!(t.span([GpuId(1), GpuId(2), GpuId(9)]), TopoLevel::Rack);
    }

    #[test]
    fn domain_capacities_follow_the_tree() {
        let t = two_racks();
        assert_eq!(t.max_gpus_within(TopoLevel::NvlinkIsland), 4);
        assert_eq!(t.max_gpus_within(TopoLevel::Node), 8);
        assert_eq!(t.max_gpus_within(TopoLevel::Rack), 16);
        assert_eq!(t.tightest_level_for(4), TopoLevel::NvlinkIsland);
        assert_eq!(t.tightest_level_for(12), TopoLevel::Rack);
        assert_eq!(t.tightest_level_for(20), TopoLevel::Cluster);
    }

    #[test]
    fn unknown_gpu_model_is_a_clear_error() {
        let mut spec = ClusterSpec::from_toml(
            "name='x'\n[[nodes]]\ngpu_model='Z9'\ngpus=1\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        assert!(matches!(
            Topology::build(&spec),
            Err(DomainError::UnknownGpuModel(m)) if m == "Z9"
        ));
        spec.node_groups[0].gpu_model = Some("T4".into());
        assert!(Topology::build(&spec).is_ok());
    }
}
