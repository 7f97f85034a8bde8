//! Cluster state: what is free where, kept incrementally so that the scheduler can ask
//! "how many idle GPUs in this rack" in O(1) and apply or undo a gang atomically.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::domain::{
    DomainError, GpuDemand, GpuId, Job, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, MigMode, NodeId,
    TopoLevel, Topology,
};

/// What one worker holds on one GPU.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuShare {
    pub gpu: GpuId,
    /// Thousandths of the GPU (1000 for a whole GPU; a MIG instance counts its SM share).
    pub milli: u16,
    /// MIG compute and memory slices; zero for non-MIG shares.
    pub mig_compute: u8,
    pub mig_memory: u8,
}

impl GpuShare {
    pub fn whole(gpu: GpuId) -> Self {
        GpuShare {
            gpu,
            milli: 1000,
            mig_compute: 0,
            mig_memory: 0,
        }
    }

    /// The share that `demand` (one GPU's worth) takes of `gpu`.
    pub fn for_demand(gpu: GpuId, demand: GpuDemand) -> Self {
        match demand {
            GpuDemand::Mig { compute, memory } => GpuShare {
                gpu,
                milli: (compute as u32 * 1000 / MIG_COMPUTE_SLICES as u32) as u16,
                mig_compute: compute,
                mig_memory: memory,
            },
            GpuDemand::Milli(m) => GpuShare {
                gpu,
                milli: m,
                mig_compute: 0,
                mig_memory: 0,
            },
            GpuDemand::Whole(_) | GpuDemand::None => GpuShare::whole(gpu),
        }
    }

    fn is_mig(&self) -> bool {
        self.mig_compute > 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerPlacement {
    pub node: NodeId,
    pub gpus: Vec<GpuShare>,
}

/// Where every worker of a gang runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub workers: Vec<WorkerPlacement>,
}

impl Placement {
    pub fn gpu_ids(&self) -> impl Iterator<Item = GpuId> + '_ {
        self.workers
            .iter()
            .flat_map(|w| w.gpus.iter().map(|s| s.gpu))
    }

    pub fn span(&self, topo: &Topology) -> TopoLevel {
        topo.span(self.gpu_ids())
    }

    pub fn node_count(&self) -> usize {
        let mut nodes: Vec<NodeId> = self.workers.iter().map(|w| w.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }
}

/// A process-unique id for a state object. Cloning yields a new id: a clone can diverge
/// from its original, so caches keyed on one must not serve the other.
#[derive(Debug)]
struct StateInstance(u64);

impl StateInstance {
    fn fresh() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        StateInstance(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Clone for StateInstance {
    fn clone(&self) -> Self {
        StateInstance::fresh()
    }
}

/// Number of distinct [`worker_kind`]s.
pub const WORKER_KINDS: usize = 11;

/// Class of a GPU worker by what it holds: 0 for a shared GPU (milli or MIG), `k` for
/// `k` whole GPUs (10 for ten or more). CPU-only workers have no kind. Affinity-based
/// scorers (gpu-clustering) group workers of a kind on the same nodes.
pub fn worker_kind(demand: GpuDemand) -> Option<usize> {
    match demand {
        GpuDemand::None => None,
        GpuDemand::Milli(_) | GpuDemand::Mig { .. } => Some(0),
        GpuDemand::Whole(k) => Some((k as usize).min(WORKER_KINDS - 1)),
    }
}

#[derive(Debug)]
pub struct ClusterState {
    topo: Arc<Topology>,
    free_milli: Vec<u16>,
    mig_compute_free: Vec<u8>,
    mig_memory_free: Vec<u8>,
    /// Milli of each GPU held by MIG instances: the rest of what is not free is held by
    /// shared (`Milli`) workers, which cannot run beside MIG instances.
    mig_milli: Vec<u16>,
    /// Whether each fixed MIG instance ([`Topology::mig_instances`]) is held.
    mig_instance_held: Vec<bool>,
    /// Number of workers holding a share of each GPU (interference is per co-tenant).
    tenants: Vec<u16>,
    node_cpu_free: Vec<u32>,
    node_mem_free: Vec<u64>,
    node_idle_gpus: Vec<u16>,
    node_free_milli: Vec<u32>,
    node_up: Vec<bool>,
    /// Bumped on every change to a node, so scorers can cache per node state.
    node_version: Vec<u32>,
    instance: StateInstance,
    /// The instance this state is an unchanged copy of, if it is one: then the nodes
    /// whose versions still match the source's are equal to them (see
    /// [`ClusterState::refresh_copy_of`]). Any change to this state clears it.
    copy_of: Option<u64>,
    node_worker_kinds: Vec<[u16; WORKER_KINDS]>,
    rack_idle_gpus: Vec<u32>,
    spine_idle_gpus: Vec<u32>,
    idle_gpus: u32,
    allocated_milli: u64,
    capacity_milli: u64,
}

/// `clone_from` reuses the destination's buffers: the service copies the state at the
/// start of every cycle (decision records are taken against it), and a fresh
/// allocation of every per-GPU vector each time cost more than the copy itself.
impl Clone for ClusterState {
    fn clone(&self) -> Self {
        let mut copy = ClusterState {
            topo: self.topo.clone(),
            free_milli: Vec::new(),
            mig_compute_free: Vec::new(),
            mig_memory_free: Vec::new(),
            mig_milli: Vec::new(),
            mig_instance_held: Vec::new(),
            tenants: Vec::new(),
            node_cpu_free: Vec::new(),
            node_mem_free: Vec::new(),
            node_idle_gpus: Vec::new(),
            node_free_milli: Vec::new(),
            node_up: Vec::new(),
            node_version: Vec::new(),
            instance: StateInstance::fresh(),
            copy_of: None,
            node_worker_kinds: Vec::new(),
            rack_idle_gpus: Vec::new(),
            spine_idle_gpus: Vec::new(),
            idle_gpus: 0,
            allocated_milli: 0,
            capacity_milli: 0,
        };
        copy.clone_from(self);
        copy
    }

    fn clone_from(&mut self, source: &Self) {
        // Destructured so that a new field cannot be forgotten here.
        let ClusterState {
            topo,
            free_milli,
            mig_compute_free,
            mig_memory_free,
            mig_milli,
            mig_instance_held,
            tenants,
            node_cpu_free,
            node_mem_free,
            node_idle_gpus,
            node_free_milli,
            node_up,
            node_version,
            instance,
            copy_of: _,
            node_worker_kinds,
            rack_idle_gpus,
            spine_idle_gpus,
            idle_gpus,
            allocated_milli,
            capacity_milli,
        } = source;
        self.topo.clone_from(topo);
        self.free_milli.clone_from(free_milli);
        self.mig_compute_free.clone_from(mig_compute_free);
        self.mig_memory_free.clone_from(mig_memory_free);
        self.mig_milli.clone_from(mig_milli);
        self.mig_instance_held.clone_from(mig_instance_held);
        self.tenants.clone_from(tenants);
        self.node_cpu_free.clone_from(node_cpu_free);
        self.node_mem_free.clone_from(node_mem_free);
        self.node_idle_gpus.clone_from(node_idle_gpus);
        self.node_free_milli.clone_from(node_free_milli);
        self.node_up.clone_from(node_up);
        self.node_version.clone_from(node_version);
        // A copy can diverge from its source: never the source's id (nor its own old one,
        // since its contents just changed).
        self.instance = instance.clone();
        self.copy_of = Some(instance.0);
        self.node_worker_kinds.clone_from(node_worker_kinds);
        self.rack_idle_gpus.clone_from(rack_idle_gpus);
        self.spine_idle_gpus.clone_from(spine_idle_gpus);
        self.idle_gpus = *idle_gpus;
        self.allocated_milli = *allocated_milli;
        self.capacity_milli = *capacity_milli;
    }
}

impl ClusterState {
    pub fn new(topo: Arc<Topology>) -> Self {
        let g = topo.gpu_count() as usize;
        let mig_slices = |full: u8| -> Vec<u8> {
            topo.gpus()
                .iter()
                .map(|gpu| if gpu.mig == MigMode::Off { 0 } else { full })
                .collect()
        };
        // A GPU in MIG mode is never idle: idle GPUs are what whole-GPU workers count.
        let node_idle_gpus: Vec<u16> = topo.nodes().iter().map(|n| n.non_mig_gpus()).collect();
        let rack_idle_gpus = topo
            .racks()
            .iter()
            .map(|r| {
                r.nodes
                    .clone()
                    .map(|n| node_idle_gpus[n as usize] as u32)
                    .sum()
            })
            .collect::<Vec<u32>>();
        let spine_idle_gpus = topo
            .spines()
            .iter()
            .map(|s| s.racks.clone().map(|r| rack_idle_gpus[r as usize]).sum())
            .collect();
        let idle_gpus = node_idle_gpus.iter().map(|&n| n as u32).sum();
        ClusterState {
            free_milli: vec![1000; g],
            mig_compute_free: mig_slices(MIG_COMPUTE_SLICES),
            mig_memory_free: mig_slices(MIG_MEMORY_SLICES),
            mig_milli: vec![0; g],
            mig_instance_held: vec![false; topo.mig_instances().len()],
            tenants: vec![0; g],
            node_cpu_free: topo.nodes().iter().map(|n| n.cpu_milli).collect(),
            node_mem_free: topo.nodes().iter().map(|n| n.memory_mib).collect(),
            node_free_milli: topo
                .nodes()
                .iter()
                .map(|n| n.gpu_count() as u32 * 1000)
                .collect(),
            node_idle_gpus,
            node_up: vec![true; topo.nodes().len()],
            node_version: vec![0; topo.nodes().len()],
            instance: StateInstance::fresh(),
            copy_of: None,
            node_worker_kinds: vec![[0; WORKER_KINDS]; topo.nodes().len()],
            rack_idle_gpus,
            spine_idle_gpus,
            idle_gpus,
            allocated_milli: 0,
            capacity_milli: g as u64 * 1000,
            topo,
        }
    }

    /// Makes this state equal to `source` again, copying only the nodes that changed
    /// since this state was last made a copy of it (their versions differ); a full copy
    /// when it is not an unchanged copy of `source`. The service refreshes its pre-cycle
    /// copy this way before every cycle: a cycle changes a few nodes, and copying every
    /// per-GPU vector each time grew with the cluster (a tenth of the server's CPU at
    /// 40,000 GPUs).
    pub fn refresh_copy_of(&mut self, source: &ClusterState) {
        if self.copy_of != Some(source.instance.0)
            || !Arc::ptr_eq(&self.topo, &source.topo)
            || self.node_version.len() != source.node_version.len()
        {
            self.clone_from(source);
            return;
        }
        for (n, node) in self.topo.clone().nodes().iter().enumerate() {
            if self.node_version[n] == source.node_version[n] {
                continue;
            }
            self.node_cpu_free[n] = source.node_cpu_free[n];
            self.node_mem_free[n] = source.node_mem_free[n];
            self.node_idle_gpus[n] = source.node_idle_gpus[n];
            self.node_free_milli[n] = source.node_free_milli[n];
            self.node_up[n] = source.node_up[n];
            self.node_version[n] = source.node_version[n];
            self.node_worker_kinds[n] = source.node_worker_kinds[n];
            let gpus = node.gpus.start as usize..node.gpus.end as usize;
            self.free_milli[gpus.clone()].copy_from_slice(&source.free_milli[gpus.clone()]);
            self.mig_compute_free[gpus.clone()]
                .copy_from_slice(&source.mig_compute_free[gpus.clone()]);
            self.mig_memory_free[gpus.clone()]
                .copy_from_slice(&source.mig_memory_free[gpus.clone()]);
            self.mig_milli[gpus.clone()].copy_from_slice(&source.mig_milli[gpus.clone()]);
            self.tenants[gpus.clone()].copy_from_slice(&source.tenants[gpus]);
            let instances = node.mig_instances.start as usize..node.mig_instances.end as usize;
            self.mig_instance_held[instances.clone()]
                .copy_from_slice(&source.mig_instance_held[instances]);
        }
        self.rack_idle_gpus.clone_from(&source.rack_idle_gpus);
        self.spine_idle_gpus.clone_from(&source.spine_idle_gpus);
        self.idle_gpus = source.idle_gpus;
        self.allocated_milli = source.allocated_milli;
        self.capacity_milli = source.capacity_milli;
        // New contents: caches keyed on the old instance must not serve them.
        self.instance = StateInstance::fresh();
    }

    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    pub fn topology_arc(&self) -> &Arc<Topology> {
        &self.topo
    }

    pub fn free_milli(&self, gpu: GpuId) -> u16 {
        self.free_milli[gpu.0 as usize]
    }

    /// What `demand` can ever use of `gpu`'s free capacity: all of it, except none of
    /// a GPU in MIG mode for a whole or shared worker and none of a GPU out of MIG mode
    /// for a MIG instance. Scorers that weigh free capacity (FGD's fragmentation,
    /// packing) read this, so that a GPU the job can never use does not look like room.
    pub fn free_milli_for(&self, gpu: GpuId, demand: GpuDemand) -> u16 {
        if self.topo.gpu(gpu).mig.admits(demand) {
            self.free_milli[gpu.0 as usize]
        } else {
            0
        }
    }

    pub fn tenants(&self, gpu: GpuId) -> u16 {
        self.tenants[gpu.0 as usize]
    }

    pub fn mig_free(&self, gpu: GpuId) -> (u8, u8) {
        (
            self.mig_compute_free[gpu.0 as usize],
            self.mig_memory_free[gpu.0 as usize],
        )
    }

    pub fn node_cpu_free(&self, node: NodeId) -> u32 {
        self.node_cpu_free[node.0 as usize]
    }

    pub fn node_mem_free(&self, node: NodeId) -> u64 {
        self.node_mem_free[node.0 as usize]
    }

    pub fn node_idle_gpus(&self, node: NodeId) -> u16 {
        self.node_idle_gpus[node.0 as usize]
    }

    pub fn node_free_milli(&self, node: NodeId) -> u32 {
        self.node_free_milli[node.0 as usize]
    }

    /// [`ClusterState::node_free_milli`] counting only GPUs whose MIG mode admits
    /// `demand` ([`ClusterState::free_milli_for`]): the node's room as the best-fit and
    /// dot-product scorers weigh it. The counter itself where every GPU qualifies.
    #[inline]
    pub fn node_free_milli_for(&self, node: NodeId, demand: GpuDemand) -> u32 {
        // The common case, without a node lookup: scorers call this for every node.
        if !self.topo.any_gpu_in_mig_mode() && !matches!(demand, GpuDemand::Mig { .. }) {
            return self.node_free_milli[node.0 as usize];
        }
        self.node_free_milli_by_mig_mode(node, demand)
    }

    #[inline(never)]
    fn node_free_milli_by_mig_mode(&self, node: NodeId, demand: GpuDemand) -> u32 {
        let n = self.topo.node(node);
        let every_gpu_admits = match demand {
            GpuDemand::Mig { .. } => n.mig_capable_gpus == n.gpu_count(),
            _ => n.mig_on_gpus == 0,
        };
        if every_gpu_admits {
            return self.node_free_milli[node.0 as usize];
        }
        n.gpu_ids()
            .map(|g| self.free_milli_for(g, demand) as u32)
            .sum()
    }

    /// How many GPU workers of each [`worker_kind`] run on `node`.
    pub fn node_worker_kinds(&self, node: NodeId) -> &[u16; WORKER_KINDS] {
        &self.node_worker_kinds[node.0 as usize]
    }

    /// Changes whenever anything on `node` changes. Together with [`ClusterState::instance`]
    /// it identifies a node's state, so per-node caches stay valid until it moves.
    pub fn node_version(&self, node: NodeId) -> u32 {
        self.node_version[node.0 as usize]
    }

    /// Identifies this state object; a clone is a different instance, since it may diverge.
    pub fn instance(&self) -> u64 {
        self.instance.0
    }

    pub fn node_is_up(&self, node: NodeId) -> bool {
        self.node_up[node.0 as usize]
    }

    /// Idle (wholly free) GPUs on healthy nodes inside the domain of `level` that holds `gpu`.
    pub fn idle_gpus_around(&self, gpu: GpuId, level: TopoLevel) -> u32 {
        let g = self.topo.gpu(gpu);
        let node = self.topo.node(g.node);
        match level {
            TopoLevel::Gpu => (self.free_milli[gpu.0 as usize] == 1000) as u32,
            TopoLevel::NvlinkIsland => self
                .topo
                .node(g.node)
                .gpu_ids()
                .filter(|&o| self.topo.gpu(o).island == g.island && self.is_idle(o))
                .count() as u32,
            TopoLevel::Node => self.node_idle_gpus[g.node.0 as usize] as u32,
            TopoLevel::Rack => self.rack_idle_gpus[node.rack.0 as usize],
            TopoLevel::Spine => self.spine_idle_gpus[node.spine.0 as usize],
            TopoLevel::Cluster => self.idle_gpus,
        }
    }

    pub fn rack_idle_gpus(&self, rack: crate::domain::RackId) -> u32 {
        self.rack_idle_gpus[rack.0 as usize]
    }

    pub fn spine_idle_gpus(&self, spine: crate::domain::SpineId) -> u32 {
        self.spine_idle_gpus[spine.0 as usize]
    }

    /// Idle GPUs on healthy nodes.
    pub fn idle_gpus(&self) -> u32 {
        self.idle_gpus
    }

    /// Whether `gpu` is free for a whole-GPU worker: nothing on it, on a healthy node,
    /// and not in MIG mode.
    pub fn is_idle(&self, gpu: GpuId) -> bool {
        let info = self.topo.gpu(gpu);
        self.free_milli[gpu.0 as usize] == 1000
            && info.mig != MigMode::On
            && self.node_up[info.node.0 as usize]
    }

    pub fn allocated_milli(&self) -> u64 {
        self.allocated_milli
    }

    pub fn capacity_milli(&self) -> u64 {
        self.capacity_milli
    }

    /// GPUs on nodes that are up.
    pub fn healthy_gpus(&self) -> u32 {
        self.topo
            .nodes()
            .iter()
            .zip(&self.node_up)
            .filter(|(_, up)| **up)
            .map(|(n, _)| n.gpu_count() as u32)
            .sum()
    }

    /// Whether `gpu` can take a share of one GPU for `demand` right now.
    pub fn gpu_fits(&self, gpu: GpuId, demand: GpuDemand) -> bool {
        let i = gpu.0 as usize;
        let mig = self.topo.gpu(gpu).mig;
        let mig_untouched = self.mig_compute_free[i] == MIG_COMPUTE_SLICES || mig == MigMode::Off;
        match demand {
            GpuDemand::None => true,
            GpuDemand::Whole(_) => self.free_milli[i] == 1000 && mig.admits(demand),
            GpuDemand::Milli(m) => self.free_milli[i] >= m && mig_untouched && mig.admits(demand),
            GpuDemand::Mig { compute, memory } => {
                if self.topo.gpu(gpu).mig_layout.is_some() {
                    return self.free_mig_instance(gpu, compute, memory).is_some();
                }
                // Exact, not a rounding tolerance: a 1-milli shared worker must keep a
                // MIG instance off its GPU as surely as a large one.
                let no_milli_tenants = self.free_milli[i] + self.mig_milli[i] == 1000;
                self.mig_compute_free[i] >= compute
                    && self.mig_memory_free[i] >= memory
                    && no_milli_tenants
            }
        }
    }

    /// The first of `gpu`'s fixed MIG instances of exactly this size that is
    /// free (held: that is held), as an index into [`Topology::mig_instances`].
    fn mig_instance_where(&self, gpu: GpuId, compute: u8, memory: u8, held: bool) -> Option<usize> {
        let range = self.topo.gpu(gpu).mig_layout.clone()?;
        let instances = self.topo.mig_instances();
        range.map(|i| i as usize).find(|&i| {
            let slot = &instances[i];
            (slot.compute, slot.memory) == (compute, memory) && self.mig_instance_held[i] == held
        })
    }

    fn free_mig_instance(&self, gpu: GpuId, compute: u8, memory: u8) -> Option<usize> {
        self.mig_instance_where(gpu, compute, memory, false)
    }

    /// How many of `gpu`'s fixed MIG instances are held; `None` when it has no fixed
    /// layout.
    pub fn mig_instances_held(&self, gpu: GpuId) -> Option<usize> {
        let range = self.topo.gpu(gpu).mig_layout.clone()?;
        Some(
            self.mig_instance_held[range.start as usize..range.end as usize]
                .iter()
                .filter(|&&h| h)
                .count(),
        )
    }

    /// Whether one worker of `job` fits on `node`: health, GPU model, CPU, memory and GPUs.
    ///
    /// Inlined with the whole-GPU case first: decision records and placers call it for
    /// every node of the cluster, and the call itself cost as much as the checks.
    #[inline]
    pub fn worker_fits(&self, job: &Job, node: NodeId) -> bool {
        let n = node.0 as usize;
        if !self.node_up[n]
            || self.node_cpu_free[n] < job.cpu_milli
            || self.node_mem_free[n] < job.memory_mib
        {
            return false;
        }
        match job.gpu {
            GpuDemand::None => true,
            GpuDemand::Whole(k) => self.node_idle_gpus[n] >= k && self.model_allowed(job, node),
            GpuDemand::Milli(_) | GpuDemand::Mig { .. } => self.share_fits(job, node),
        }
    }

    /// The nodes where one worker of `job` fits, in id order: the same as filtering
    /// every node with [`ClusterState::worker_fits`], with the job's checks hoisted out
    /// of the loop and the per-node values read from packed arrays in step. The
    /// decision record's candidate list runs this over every node for every decision,
    /// and on 5,000 nodes it was the largest part of a cycle.
    pub fn fitting_nodes<'a>(&'a self, job: &'a Job) -> impl Iterator<Item = NodeId> + 'a {
        let (cpu, mem, gpu) = (job.cpu_milli, job.memory_mib, job.gpu);
        let basics = self
            .node_up
            .iter()
            .zip(&self.node_cpu_free)
            .zip(&self.node_mem_free)
            .zip(&self.node_idle_gpus)
            .zip(self.topo.node_models())
            .enumerate();
        basics.filter_map(
            move |(n, ((((&up, &cpu_free), &mem_free), &idle), &model))| {
                let node = NodeId(n as u32);
                let fits = up
                    && cpu_free >= cpu
                    && mem_free >= mem
                    && match gpu {
                        GpuDemand::None => true,
                        GpuDemand::Whole(k) => {
                            idle >= k && model.is_some_and(|m| job.gpu_models.allows(m))
                        }
                        GpuDemand::Milli(_) | GpuDemand::Mig { .. } => self.share_fits(job, node),
                    };
                fits.then_some(node)
            },
        )
    }

    #[inline]
    fn model_allowed(&self, job: &Job, node: NodeId) -> bool {
        matches!(self.topo.node(node).model, Some(model) if job.gpu_models.allows(model))
    }

    /// [`ClusterState::worker_fits`] for a shared-GPU worker, past the node checks.
    #[inline(never)]
    fn share_fits(&self, job: &Job, node: NodeId) -> bool {
        if !self.model_allowed(job, node) {
            return false;
        }
        let n = node.0 as usize;
        if let GpuDemand::Milli(m) = job.gpu
            && self.node_free_milli[n] < m as u32
        {
            return false;
        }
        self.topo
            .node(node)
            .gpu_ids()
            .any(|g| self.gpu_fits(g, job.gpu))
    }

    /// Applies a placement for `job` atomically: all workers or none.
    pub fn allocate(&mut self, job: &Job, placement: &Placement) -> Result<(), DomainError> {
        if placement.workers.len() != job.workers as usize {
            return Err(DomainError::Allocation(format!(
                "job {}: placement has {} workers, the gang has {}",
                job.name,
                placement.workers.len(),
                job.workers
            )));
        }
        for (done, worker) in placement.workers.iter().enumerate() {
            if let Err(e) = self.apply_worker(job, worker) {
                for undo in placement.workers[..done].iter().rev() {
                    self.release_worker(job, undo);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Returns a placement's resources. The placement must have been allocated.
    pub fn release(&mut self, job: &Job, placement: &Placement) {
        for worker in placement.workers.iter().rev() {
            self.release_worker(job, worker);
        }
    }

    /// Applies one worker of `job` (a tentative step of building a gang); undo it with
    /// [`ClusterState::release_worker`].
    pub fn reserve_worker(
        &mut self,
        job: &Job,
        worker: &WorkerPlacement,
    ) -> Result<(), DomainError> {
        self.apply_worker(job, worker)
    }

    fn apply_worker(&mut self, job: &Job, worker: &WorkerPlacement) -> Result<(), DomainError> {
        let fail = |why: String| {
            Err(DomainError::Allocation(format!(
                "job {}: node {}: {why}",
                job.name, worker.node.0
            )))
        };
        let n = worker.node.0 as usize;
        if n >= self.node_up.len() {
            return fail("no such node".into());
        }
        if !self.node_up[n] {
            return fail("node is down".into());
        }
        if self.node_cpu_free[n] < job.cpu_milli || self.node_mem_free[n] < job.memory_mib {
            return fail("not enough CPU or memory".into());
        }
        let node = self.topo.node(worker.node);
        if worker.gpus.len() != job.gpu.gpu_count() as usize {
            return fail(format!(
                "{} GPU shares for a demand of {:?}",
                worker.gpus.len(),
                job.gpu
            ));
        }
        for (i, share) in worker.gpus.iter().enumerate() {
            if !node.gpus.contains(&share.gpu.0) {
                return fail(format!("GPU {} is not on this node", share.gpu.0));
            }
            if worker.gpus[..i].iter().any(|s| s.gpu == share.gpu) {
                return fail(format!("GPU {} listed twice", share.gpu.0));
            }
            if *share != GpuShare::for_demand(share.gpu, job.gpu) {
                return fail(format!(
                    "share {share:?} does not match demand {:?}",
                    job.gpu
                ));
            }
            if !job.gpu_models.allows(self.topo.gpu(share.gpu).model) {
                return fail(format!(
                    "GPU {} is of a model the job does not allow",
                    share.gpu.0
                ));
            }
            if !self.gpu_fits(share.gpu, job.gpu) {
                return fail(format!("GPU {} lacks capacity", share.gpu.0));
            }
        }
        self.node_cpu_free[n] -= job.cpu_milli;
        self.node_mem_free[n] -= job.memory_mib;
        self.node_version[n] = self.node_version[n].wrapping_add(1);
        self.copy_of = None;
        if let Some(kind) = worker_kind(job.gpu) {
            self.node_worker_kinds[n][kind] += 1;
        }
        for share in &worker.gpus {
            self.take(share);
        }
        Ok(())
    }

    /// Returns one worker's resources, reserved with [`ClusterState::reserve_worker`].
    ///
    /// Releasing what was not held (a worker released twice) corrupts the counters. A
    /// whole GPU released twice is caught below at once, but a CPU-only worker or a share
    /// beside other tenants can leave counters that still look possible; debug builds
    /// (and so the tests) check what can be checked per node and per GPU and panic.
    pub fn release_worker(&mut self, job: &Job, worker: &WorkerPlacement) {
        let n = worker.node.0 as usize;
        self.node_cpu_free[n] += job.cpu_milli;
        self.node_mem_free[n] += job.memory_mib;
        let node = self.topo.node(worker.node);
        debug_assert!(
            self.node_cpu_free[n] <= node.cpu_milli && self.node_mem_free[n] <= node.memory_mib,
            "job {}: node {n} has more CPU or memory free than it has: released twice?",
            job.name
        );
        self.node_version[n] = self.node_version[n].wrapping_add(1);
        self.copy_of = None;
        if let Some(kind) = worker_kind(job.gpu) {
            debug_assert!(
                self.node_worker_kinds[n][kind] > 0,
                "job {}: no worker of its kind on node {n}: released twice?",
                job.name
            );
            self.node_worker_kinds[n][kind] -= 1;
        }
        for share in &worker.gpus {
            self.give_back(share);
        }
    }

    fn take(&mut self, share: &GpuShare) {
        let g = share.gpu.0 as usize;
        let info = self.topo.gpu(share.gpu);
        let (node, mig, fixed_layout) = (info.node, info.mig, info.mig_layout.is_some());
        if self.free_milli[g] == 1000 && mig != MigMode::On {
            self.adjust_idle(node, -1);
        }
        self.free_milli[g] -= share.milli;
        if share.is_mig() {
            self.mig_compute_free[g] -= share.mig_compute;
            self.mig_memory_free[g] -= share.mig_memory;
            self.mig_milli[g] += share.milli;
            if fixed_layout {
                let i = self
                    .free_mig_instance(share.gpu, share.mig_compute, share.mig_memory)
                    .expect("checked by gpu_fits: a free instance of the share's size");
                self.mig_instance_held[i] = true;
            }
        }
        self.tenants[g] += 1;
        self.node_free_milli[node.0 as usize] -= share.milli as u32;
        self.allocated_milli += share.milli as u64;
    }

    fn give_back(&mut self, share: &GpuShare) {
        let g = share.gpu.0 as usize;
        let info = self.topo.gpu(share.gpu);
        let (node, mig, fixed_layout) = (info.node, info.mig, info.mig_layout.is_some());
        self.free_milli[g] += share.milli;
        assert!(
            self.free_milli[g] <= 1000,
            "released more than was allocated"
        );
        if share.is_mig() {
            self.mig_compute_free[g] += share.mig_compute;
            self.mig_memory_free[g] += share.mig_memory;
            debug_assert!(
                self.mig_milli[g] >= share.milli,
                "GPU {g}: a MIG instance released that was not held"
            );
            self.mig_milli[g] -= share.milli;
            if fixed_layout {
                let i = self
                    .mig_instance_where(share.gpu, share.mig_compute, share.mig_memory, true)
                    .expect("released a MIG instance that was not held");
                self.mig_instance_held[i] = false;
            }
        }
        debug_assert!(self.tenants[g] > 0, "GPU {g} released with no tenants");
        self.tenants[g] -= 1;
        self.node_free_milli[node.0 as usize] += share.milli as u32;
        self.allocated_milli -= share.milli as u64;
        if self.free_milli[g] == 1000 && mig != MigMode::On {
            self.adjust_idle(node, 1);
        }
        self.debug_check_gpu(share.gpu);
    }

    /// What a release of a share not held leaves behind on `gpu`, where it shows: every
    /// tenant holds at least one milli (shares are 1..=999 milli or a MIG instance, whole
    /// GPUs 1000), and no more MIG slices are free than the GPU has. Debug builds only.
    fn debug_check_gpu(&self, gpu: GpuId) {
        let g = gpu.0 as usize;
        debug_assert!(
            self.free_milli[g] as u32 + self.tenants[g] as u32 <= 1000,
            "GPU {g}: {} milli free beside {} tenants: a share released twice?",
            self.free_milli[g],
            self.tenants[g]
        );
        debug_assert!(
            (self.tenants[g] == 0) == (self.free_milli[g] == 1000),
            "GPU {g}: {} tenants but {} milli free: a share released twice?",
            self.tenants[g],
            self.free_milli[g]
        );
        debug_assert!(
            self.mig_compute_free[g] <= MIG_COMPUTE_SLICES
                && self.mig_memory_free[g] <= MIG_MEMORY_SLICES,
            "GPU {g}: more MIG slices free than it has: an instance released twice?"
        );
    }

    fn adjust_idle(&mut self, node: NodeId, delta: i32) {
        let n = node.0 as usize;
        self.node_idle_gpus[n] = (self.node_idle_gpus[n] as i32 + delta) as u16;
        if self.node_up[n] {
            self.adjust_domains(node, delta);
        }
    }

    fn adjust_domains(&mut self, node: NodeId, delta: i32) {
        let topo_node = self.topo.node(node);
        let (rack, spine) = (topo_node.rack.0 as usize, topo_node.spine.0 as usize);
        self.rack_idle_gpus[rack] = (self.rack_idle_gpus[rack] as i32 + delta) as u32;
        self.spine_idle_gpus[spine] = (self.spine_idle_gpus[spine] as i32 + delta) as u32;
        self.idle_gpus = (self.idle_gpus as i32 + delta) as u32;
    }

    /// Marks a node failed or repaired. Its idle GPUs leave (or rejoin) the domain counts;
    /// the caller evicts the workers that ran there.
    pub fn set_node_up(&mut self, node: NodeId, up: bool) {
        let n = node.0 as usize;
        if self.node_up[n] == up {
            return;
        }
        let idle = self.node_idle_gpus[n] as i32;
        self.node_version[n] = self.node_version[n].wrapping_add(1);
        self.copy_of = None;
        if up {
            self.node_up[n] = true;
            self.adjust_domains(node, idle);
        } else {
            self.adjust_domains(node, -idle);
            self.node_up[n] = false;
        }
    }

    /// `Ok` if `self` and `other` (over the same topology) hold the same things: every
    /// GPU's free share, MIG slices, instances and tenants, and every node's free CPU
    /// and memory. The service checks its state against one rebuilt from its job
    /// records this way (debug builds), so a path that changes one without the other
    /// is caught where it happens. Node health is not compared, nor which of a GPU's
    /// fixed MIG instances of one size is held: records do not say, and a rebuild takes
    /// the first free one (the slices they hold are compared).
    pub fn same_allocation(&self, other: &ClusterState) -> Result<(), String> {
        let differ = |what: &str, i: usize| Err(format!("{what} {i} differs"));
        let gpu_fields: [(&str, bool); 5] = [
            ("free share of GPU", self.free_milli != other.free_milli),
            (
                "free MIG compute of GPU",
                self.mig_compute_free != other.mig_compute_free,
            ),
            (
                "free MIG memory of GPU",
                self.mig_memory_free != other.mig_memory_free,
            ),
            ("MIG share of GPU", self.mig_milli != other.mig_milli),
            ("tenants of GPU", self.tenants != other.tenants),
        ];
        for (what, differs) in gpu_fields {
            if differs {
                let i = (0..self.free_milli.len())
                    .find(|&i| {
                        (
                            self.free_milli[i],
                            self.mig_compute_free[i],
                            self.mig_memory_free[i],
                            self.mig_milli[i],
                            self.tenants[i],
                        ) != (
                            other.free_milli[i],
                            other.mig_compute_free[i],
                            other.mig_memory_free[i],
                            other.mig_milli[i],
                            other.tenants[i],
                        )
                    })
                    .unwrap_or(0);
                return differ(what, i);
            }
        }
        if let Some(i) = (0..self.node_cpu_free.len()).find(|&i| {
            (self.node_cpu_free[i], self.node_mem_free[i])
                != (other.node_cpu_free[i], other.node_mem_free[i])
        }) {
            return differ("free CPU or memory of node", i);
        }
        Ok(())
    }

    /// Checks every counter against a recount from per-GPU state; used by property tests.
    pub fn check_consistency(&self) -> Result<(), String> {
        let topo = &self.topo;
        let mut total_idle = 0;
        let mut allocated = 0u64;
        for node in topo.node_ids() {
            let n = node.0 as usize;
            let gpus: Vec<GpuId> = topo.node(node).gpu_ids().collect();
            let idle = gpus
                .iter()
                .filter(|g| {
                    self.free_milli[g.0 as usize] == 1000 && topo.gpu(**g).mig != MigMode::On
                })
                .count();
            let free: u32 = gpus
                .iter()
                .map(|g| self.free_milli[g.0 as usize] as u32)
                .sum();
            if idle != self.node_idle_gpus[n] as usize || free != self.node_free_milli[n] {
                return Err(format!("node {n}: counters disagree with GPUs"));
            }
            if self.node_cpu_free[n] > topo.node(node).cpu_milli
                || self.node_mem_free[n] > topo.node(node).memory_mib
            {
                return Err(format!("node {n}: more CPU or memory free than exists"));
            }
            for &g in &gpus {
                let Some(instances) = topo.gpu_mig_instances(g) else {
                    continue;
                };
                let first = topo.gpu(g).mig_layout.as_ref().map_or(0, |r| r.start) as usize;
                let (mut compute, mut memory) = (0u8, 0u8);
                for (k, slot) in instances.iter().enumerate() {
                    if self.mig_instance_held[first + k] {
                        compute += slot.compute;
                        memory += slot.memory;
                    }
                }
                let i = g.0 as usize;
                if (compute, memory)
                    != (
                        MIG_COMPUTE_SLICES - self.mig_compute_free[i],
                        MIG_MEMORY_SLICES - self.mig_memory_free[i],
                    )
                {
                    return Err(format!(
                        "GPU {i}: its held MIG instances disagree with its slice counters"
                    ));
                }
            }
            if self.node_up[n] {
                total_idle += idle as u32;
            }
            allocated += gpus
                .iter()
                .map(|g| 1000 - self.free_milli[g.0 as usize] as u64)
                .sum::<u64>();
        }
        if total_idle != self.idle_gpus || allocated != self.allocated_milli {
            return Err("cluster counters disagree with GPUs".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ClusterSpec, GpuModelSet, JobId};

    fn cluster() -> ClusterState {
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=4\ngpu_model='A100-40'\ngpus=4\n\
             nvlink_domain=4\ncpu_milli=32000\nmemory_mib=262144\n",
        )
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    fn worker(node: u32, gpus: &[u32], demand: GpuDemand) -> WorkerPlacement {
        WorkerPlacement {
            node: NodeId(node),
            gpus: gpus
                .iter()
                .map(|&g| GpuShare::for_demand(GpuId(g), demand))
                .collect(),
        }
    }

    #[test]
    fn gang_allocation_updates_every_level_and_releases_cleanly() {
        let mut s = cluster();
        let mut job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        job.gpu = GpuDemand::Whole(2);
        let p = Placement {
            workers: vec![worker(0, &[0, 1], job.gpu), worker(2, &[8, 9], job.gpu)],
        };
        s.allocate(&job, &p).unwrap();
        assert_eq!(s.idle_gpus(), 12);
        assert_eq!(s.idle_gpus_around(GpuId(0), TopoLevel::Rack), 6);
        assert_eq!(s.idle_gpus_around(GpuId(0), TopoLevel::NvlinkIsland), 2);
        assert_eq!(p.span(s.topology()), TopoLevel::Spine);
        s.check_consistency().unwrap();
        s.release(&job, &p);
        assert_eq!(s.idle_gpus(), 16);
        s.check_consistency().unwrap();
    }

    #[test]
    fn a_failing_worker_rolls_back_the_whole_gang() {
        let mut s = cluster();
        let mut job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        job.gpu = GpuDemand::Whole(1);
        let bad = Placement {
            workers: vec![worker(0, &[0], job.gpu), worker(0, &[9], job.gpu)],
        };
        let err = s.allocate(&job, &bad).unwrap_err().to_string();
        assert!(err.contains("not on this node"), "{err}");
        assert_eq!(s.idle_gpus(), 16);
        s.check_consistency().unwrap();
    }

    #[test]
    fn shares_never_exceed_a_gpu_and_mig_excludes_milli() {
        let mut s = cluster();
        let mut a = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        a.gpu = GpuDemand::Milli(600);
        let on_gpu0 = Placement {
            workers: vec![worker(0, &[0], a.gpu)],
        };
        s.allocate(&a, &on_gpu0).unwrap();
        assert!(s.allocate(&a, &on_gpu0).is_err(), "600 + 600 > 1000");
        let mut b = a.clone();
        b.gpu = GpuDemand::Milli(400);
        s.allocate(
            &b,
            &Placement {
                workers: vec![worker(0, &[0], b.gpu)],
            },
        )
        .unwrap();
        assert_eq!(s.free_milli(GpuId(0)), 0);
        assert_eq!(s.tenants(GpuId(0)), 2);
        let mut m = a.clone();
        m.gpu = GpuDemand::Mig {
            compute: 3,
            memory: 4,
        };
        assert!(!s.gpu_fits(GpuId(0), m.gpu));
        assert!(!s.gpu_fits(
            GpuId(1),
            GpuDemand::Mig {
                compute: 7,
                memory: 9
            }
        ));
        let on_gpu1 = Placement {
            workers: vec![worker(0, &[1], m.gpu)],
        };
        s.allocate(&m, &on_gpu1).unwrap();
        s.allocate(&m, &on_gpu1).unwrap();
        assert!(s.allocate(&m, &on_gpu1).is_err(), "only 7 compute slices");
        assert!(
            !s.gpu_fits(GpuId(1), GpuDemand::Milli(100)),
            "MIG GPU takes no milli shares"
        );
        s.check_consistency().unwrap();
    }

    #[test]
    fn a_one_milli_tenant_keeps_every_mig_instance_off_its_gpu() {
        // Found by the invariants property test: the old check allowed a rounding
        // tolerance of 7 milli, so a 7g instance beside a 1-milli worker was let in and
        // `take` underflowed.
        let mut s = cluster();
        let mut tiny = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        tiny.gpu = GpuDemand::Milli(1);
        s.allocate(
            &tiny,
            &Placement {
                workers: vec![worker(0, &[2], tiny.gpu)],
            },
        )
        .unwrap();
        let mut full = tiny.clone();
        full.gpu = GpuDemand::Mig {
            compute: 7,
            memory: 8,
        };
        for mig in [
            full.gpu,
            GpuDemand::Mig {
                compute: 1,
                memory: 1,
            },
        ] {
            assert!(!s.gpu_fits(GpuId(2), mig), "{mig:?}");
        }
        let err = s
            .allocate(
                &full,
                &Placement {
                    workers: vec![worker(0, &[2], full.gpu)],
                },
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("lacks capacity"), "{err}");
        // Seven 1g instances (7 × 142 = 994 milli) fill a GPU exactly as MIG counts it.
        let mut one = tiny.clone();
        one.gpu = GpuDemand::Mig {
            compute: 1,
            memory: 1,
        };
        let on_gpu3 = Placement {
            workers: vec![worker(0, &[3], one.gpu)],
        };
        for _ in 0..7 {
            s.allocate(&one, &on_gpu3).unwrap();
        }
        assert!(!s.gpu_fits(GpuId(3), GpuDemand::Milli(1)));
        assert!(!s.gpu_fits(GpuId(3), one.gpu));
        s.check_consistency().unwrap();
    }

    #[test]
    fn gpus_in_mig_mode_take_only_mig_instances_and_are_never_idle() {
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=1\ngpu_model='A100-40'\ngpus=4\nmig_gpus=[1, 3]\n\
             cpu_milli=32000\nmemory_mib=262144\n",
        )
        .unwrap();
        let mut s = ClusterState::new(Arc::new(Topology::build(&spec).unwrap()));
        let slice = GpuDemand::Mig {
            compute: 3,
            memory: 4,
        };
        let fitting = |s: &ClusterState, demand| {
            (0..4)
                .filter(|&g| s.gpu_fits(GpuId(g), demand))
                .collect::<Vec<_>>()
        };
        assert_eq!(fitting(&s, GpuDemand::Whole(1)), [0, 2]);
        assert_eq!(fitting(&s, GpuDemand::Milli(500)), [0, 2]);
        assert_eq!(fitting(&s, slice), [1, 3]);
        // Idle GPUs are what whole-GPU workers count.
        assert_eq!((s.node_idle_gpus(NodeId(0)), s.idle_gpus()), (2, 2));
        assert!(!s.is_idle(GpuId(1)) && s.is_idle(GpuId(2)));
        let mut three = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        three.gpu = GpuDemand::Whole(3);
        assert!(!s.worker_fits(&three, NodeId(0)));
        three.gpu = GpuDemand::Whole(2);
        assert!(s.worker_fits(&three, NodeId(0)));
        let err = s
            .allocate(
                &three,
                &Placement {
                    workers: vec![worker(0, &[0, 1], three.gpu)],
                },
            )
            .unwrap_err();
        assert!(err.to_string().contains("GPU 1 lacks capacity"), "{err}");
        let mut m = three.clone();
        m.gpu = slice;
        let on_gpu1 = Placement {
            workers: vec![worker(0, &[1], slice)],
        };
        s.allocate(&m, &on_gpu1).unwrap();
        assert_eq!((s.node_idle_gpus(NodeId(0)), s.idle_gpus()), (2, 2));
        s.check_consistency().unwrap();
        s.release(&m, &on_gpu1);
        assert_eq!((s.node_idle_gpus(NodeId(0)), s.idle_gpus()), (2, 2));
        s.check_consistency().unwrap();
        // A model without MIG cannot be put in MIG mode.
        let v100 = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ngpu_model='V100M32'\ngpus=4\nmig_gpus=[0]\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        let err = Topology::build(&v100).unwrap_err().to_string();
        assert!(err.contains("a model without MIG"), "{err}");
    }

    #[test]
    fn a_fixed_mig_layout_takes_only_its_own_instances() {
        let toml = |layout: &str| {
            format!(
                "name='c'\n[[nodes]]\ncount=2\ngpu_model='A100-80'\ngpus=3\nmig_gpus=[0, 1, 2]\n\
                 cpu_milli=32000\nmemory_mib=262144\n{layout}"
            )
        };
        let layouts = "[[nodes.mig_layout]]\ngpus=[0]\ninstances=[\"1g.10gb\", \"1g.10gb\", \"1g.10gb\", \
             \"1g.10gb\", \"1g.10gb\", \"1g.10gb\", \"1g.10gb\"]\n\
             [[nodes.mig_layout]]\ngpus=[1]\ninstances=[\"3g.40gb\", \"1c.2g.20gb\"]\n";
        let topo =
            Arc::new(Topology::build(&ClusterSpec::from_toml(&toml(layouts)).unwrap()).unwrap());
        assert_eq!(topo.mig_instances().len(), 18);
        assert_eq!(topo.node(NodeId(1)).mig_instances, 9..18);
        let mut s = ClusterState::new(topo.clone());
        let mig = |compute, memory| GpuDemand::Mig { compute, memory };
        let fitting = |s: &ClusterState, demand| {
            (0..3)
                .filter(|&g| s.gpu_fits(GpuId(g), demand))
                .collect::<Vec<_>>()
        };
        // GPU 2 has no layout: the scheduler partitions it, by slices.
        assert_eq!(fitting(&s, mig(1, 1)), [0, 2]);
        assert_eq!(fitting(&s, mig(3, 4)), [1, 2]);
        assert_eq!(fitting(&s, mig(1, 2)), [1, 2]);
        // GPU 1 has the slices for a 2g.20gb, but no such instance.
        assert_eq!(fitting(&s, mig(2, 2)), [2]);
        assert_eq!(
            topo.mig_workers_on_empty_node(topo.node(NodeId(0)), 1, 1),
            7 + 7
        );
        assert_eq!(
            topo.mig_workers_on_empty_node(topo.node(NodeId(0)), 2, 2),
            3
        );
        assert_eq!(
            topo.mig_workers_on_empty_node(topo.node(NodeId(0)), 3, 4),
            1 + 2
        );

        let mut job = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        job.gpu = mig(1, 1);
        let on_gpu0 = Placement {
            workers: vec![worker(0, &[0], job.gpu)],
        };
        let before = s.clone();
        for held in 1..=7 {
            s.allocate(&job, &on_gpu0).unwrap();
            assert_eq!(s.mig_instances_held(GpuId(0)), Some(held));
        }
        let err = s.allocate(&job, &on_gpu0).unwrap_err().to_string();
        assert!(err.contains("GPU 0 lacks capacity"), "{err}");
        s.check_consistency().unwrap();
        // A copy refreshed node by node carries the instances held.
        let mut copy = before.clone();
        copy.refresh_copy_of(&s);
        assert_eq!(copy.mig_instances_held(GpuId(0)), Some(7));
        assert!(!copy.gpu_fits(GpuId(0), job.gpu));
        s.release(&job, &on_gpu0);
        assert_eq!(s.mig_instances_held(GpuId(0)), Some(6));
        assert_eq!(fitting(&s, mig(1, 1)), [0, 2]);
        job.gpu = mig(1, 2);
        let on_gpu1 = Placement {
            workers: vec![worker(0, &[1], job.gpu)],
        };
        s.allocate(&job, &on_gpu1).unwrap();
        assert_eq!(s.mig_instances_held(GpuId(1)), Some(1));
        assert_eq!(fitting(&s, mig(1, 2)), [2]);
        assert_eq!(s.mig_instances_held(GpuId(2)), None);
        s.check_consistency().unwrap();

        for (layout, says) in [
            (
                "instances=[\"3g.20gb\"]",
                "A100-80 has no MIG profile \"3g.20gb\" (it has 1g.10gb, 1g.20gb",
            ),
            (
                "instances=[\"4g.40gb\", \"4g.40gb\"]",
                "take 8 compute and 8 memory slices; a GPU has 7 and 8",
            ),
            (
                "instances=[\"1c.3g.40gb\", \"3g.40gb\", \"1g.10gb\"]",
                "take 7 compute and 9 memory slices",
            ),
        ] {
            let spec = toml(&format!("[[nodes.mig_layout]]\ngpus=[1]\n{layout}\n"));
            let err = Topology::build(&ClusterSpec::from_toml(&spec).unwrap()).unwrap_err();
            assert!(err.to_string().contains(says), "{layout}: {err}");
        }
    }

    #[test]
    fn node_versions_move_with_every_change_and_clones_are_new_instances() {
        let mut s = cluster();
        let job = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        let p = Placement {
            workers: vec![worker(1, &[4], job.gpu)],
        };
        let before = (s.node_version(NodeId(1)), s.node_version(NodeId(0)));
        s.allocate(&job, &p).unwrap();
        assert_ne!(s.node_version(NodeId(1)), before.0);
        assert_eq!(s.node_version(NodeId(0)), before.1);
        let clone = s.clone();
        assert_ne!(clone.instance(), s.instance());
    }

    #[test]
    fn clone_from_over_a_diverged_copy_is_the_source_again_under_a_new_instance() {
        let mut source = cluster();
        let job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        source
            .allocate(
                &job,
                &Placement {
                    workers: vec![worker(1, &[4], job.gpu), worker(1, &[5], job.gpu)],
                },
            )
            .unwrap();
        source.set_node_up(NodeId(2), false);
        let mut copy = cluster();
        let other = Job::whole_gpus(JobId(2), 1, 0.0, 1.0);
        copy.allocate(
            &other,
            &Placement {
                workers: vec![worker(0, &[0], other.gpu)],
            },
        )
        .unwrap();
        let (old_instance, old_allocated) = (copy.instance(), copy.allocated_milli());
        copy.clone_from(&source);
        assert_ne!(copy.instance(), source.instance());
        assert_ne!(copy.instance(), old_instance);
        assert_ne!(copy.allocated_milli(), old_allocated);
        assert_eq!(copy.allocated_milli(), source.allocated_milli());
        assert_eq!(copy.idle_gpus(), source.idle_gpus());
        assert_eq!(copy.healthy_gpus(), source.healthy_gpus());
        for n in source.topology().node_ids() {
            assert_eq!(copy.node_idle_gpus(n), source.node_idle_gpus(n));
            assert_eq!(copy.node_free_milli(n), source.node_free_milli(n));
            assert_eq!(copy.node_is_up(n), source.node_is_up(n));
            assert_eq!(copy.node_version(n), source.node_version(n));
            assert_eq!(copy.node_worker_kinds(n), source.node_worker_kinds(n));
        }
        for g in 0..source.topology().gpu_count() {
            assert_eq!(copy.free_milli(GpuId(g)), source.free_milli(GpuId(g)));
        }
        copy.check_consistency().unwrap();
    }

    /// Every field but the instance ids.
    fn same_contents(a: &ClusterState, b: &ClusterState) -> bool {
        a.free_milli == b.free_milli
            && a.mig_compute_free == b.mig_compute_free
            && a.mig_memory_free == b.mig_memory_free
            && a.mig_milli == b.mig_milli
            && a.tenants == b.tenants
            && a.node_cpu_free == b.node_cpu_free
            && a.node_mem_free == b.node_mem_free
            && a.node_idle_gpus == b.node_idle_gpus
            && a.node_free_milli == b.node_free_milli
            && a.node_up == b.node_up
            && a.node_version == b.node_version
            && a.node_worker_kinds == b.node_worker_kinds
            && a.rack_idle_gpus == b.rack_idle_gpus
            && a.spine_idle_gpus == b.spine_idle_gpus
            && a.idle_gpus == b.idle_gpus
            && a.allocated_milli == b.allocated_milli
            && a.capacity_milli == b.capacity_milli
    }

    /// One step of the refresh property test.
    #[derive(Clone, Debug)]
    enum Step {
        /// Allocate a job of this many whole GPUs (or 250 milli when 0) on a node.
        Allocate {
            node: u32,
            gpus: u16,
        },
        /// Release the i-th (modulo) live allocation.
        Release(usize),
        SetUp {
            node: u32,
            up: bool,
        },
        /// Refresh the copy from the source and compare.
        Refresh,
        /// Change the copy itself (it must then be copied in full).
        TouchCopy {
            node: u32,
        },
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u32..4, 0u16..4).prop_map(|(node, gpus)| Step::Allocate { node, gpus }),
            2 => (0usize..16).prop_map(Step::Release),
            1 => (0u32..4, any::<bool>()).prop_map(|(node, up)| Step::SetUp { node, up }),
            3 => Just(Step::Refresh),
            1 => (0u32..4).prop_map(|node| Step::TouchCopy { node }),
        ]
    }

    fn try_allocate(
        s: &mut ClusterState,
        id: u32,
        node: u32,
        gpus: u16,
    ) -> Option<(Job, Placement)> {
        try_allocate_with_cpu(s, id, node, gpus, 0)
    }

    /// [`try_allocate`] for a job that also takes `cpu_milli` of the node's CPU.
    fn try_allocate_with_cpu(
        s: &mut ClusterState,
        id: u32,
        node: u32,
        gpus: u16,
        cpu_milli: u32,
    ) -> Option<(Job, Placement)> {
        let mut job = Job::whole_gpus(JobId(id), 1, 0.0, 1.0);
        job.cpu_milli = cpu_milli;
        job.gpu = match gpus {
            0 => GpuDemand::Milli(250),
            5 => GpuDemand::Mig {
                compute: 1,
                memory: 1,
            },
            _ => GpuDemand::Whole(gpus),
        };
        let free: Vec<GpuId> = s
            .topology()
            .node(NodeId(node))
            .gpu_ids()
            .filter(|&g| s.gpu_fits(g, job.gpu))
            .take(job.gpu.gpu_count() as usize)
            .collect();
        if free.len() != job.gpu.gpu_count() as usize {
            return None;
        }
        let p = Placement {
            workers: vec![WorkerPlacement {
                node: NodeId(node),
                gpus: free
                    .iter()
                    .map(|&g| GpuShare::for_demand(g, job.gpu))
                    .collect(),
            }],
        };
        s.allocate(&job, &p).ok().map(|()| (job, p))
    }

    proptest::proptest! {
        #[test]
        fn a_refreshed_copy_equals_its_source(steps in proptest::collection::vec(step(), 1..60)) {
            let mut source = cluster();
            let mut copy = source.clone();
            let mut live: Vec<(Job, Placement)> = Vec::new();
            let mut copy_live: Vec<(Job, Placement)> = Vec::new();
            for (i, step) in steps.into_iter().enumerate() {
                match step {
                    Step::Allocate { node, gpus } => {
                        live.extend(try_allocate(&mut source, i as u32, node, gpus));
                    }
                    Step::Release(k) if !live.is_empty() => {
                        let (job, p) = live.remove(k % live.len());
                        source.release(&job, &p);
                    }
                    Step::Release(_) => {}
                    Step::SetUp { node, up } => source.set_node_up(NodeId(node), up),
                    Step::Refresh => {
                        copy.refresh_copy_of(&source);
                        copy_live.clear();
                        proptest::prop_assert!(same_contents(&copy, &source));
                        proptest::prop_assert_ne!(copy.instance(), source.instance());
                        copy.check_consistency().unwrap();
                    }
                    Step::TouchCopy { node } => {
                        copy_live.extend(try_allocate(&mut copy, 1000 + i as u32, node, 1));
                    }
                }
            }
            copy.refresh_copy_of(&source);
            proptest::prop_assert!(same_contents(&copy, &source));
        }
    }

    /// Two A100 nodes, an A100-80 node (MIG mode left open), two CPU-only nodes and an
    /// A100-80 node with two of its four GPUs in MIG mode.
    fn mixed_cluster() -> ClusterState {
        let spec = ClusterSpec::from_toml(
            "name='m'\n[[nodes]]\ncount=2\ngpu_model='A100-40'\ngpus=4\nnvlink_domain=4\n\
             cpu_milli=32000\nmemory_mib=262144\n\
             [[nodes]]\ncount=1\ngpu_model='A100-80'\ngpus=8\nnvlink_domain=8\n\
             cpu_milli=64000\nmemory_mib=524288\n\
             [[nodes]]\ncount=2\ncpu_milli=16000\nmemory_mib=65536\n\
             [[nodes]]\ncount=1\ngpu_model='A100-80'\ngpus=4\nmig_gpus=[1, 2]\n\
             cpu_milli=64000\nmemory_mib=524288\n",
        )
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    proptest::proptest! {
        #[test]
        fn fitting_nodes_is_worker_fits_over_every_node(
            allocations in proptest::collection::vec((0u32..6, 0u16..6, 0u32..20_000), 0..30),
            down in proptest::collection::vec(0u32..6, 0..3),
            probe_gpus in 0u16..9,
            probe_kind in 0u8..4,
            probe_cpu in 0u32..40_000,
            probe_mem in 0u64..600_000,
            probe_model in 0u8..3,
        ) {
            let mut s = mixed_cluster();
            for (i, (node, gpus, cpu)) in allocations.into_iter().enumerate() {
                try_allocate_with_cpu(&mut s, i as u32, node, gpus, cpu);
            }
            for n in down {
                s.set_node_up(NodeId(n), false);
            }
            s.check_consistency().unwrap();
            let catalog = &s.topology().catalog;
            let mut probe = Job::whole_gpus(JobId(9999), 1, 0.0, 1.0);
            probe.cpu_milli = probe_cpu;
            probe.memory_mib = probe_mem;
            probe.gpu = match probe_kind {
                0 => GpuDemand::None,
                1 => GpuDemand::Whole(probe_gpus.max(1)),
                2 => GpuDemand::Milli(125 * (probe_gpus + 1)),
                _ => GpuDemand::Mig { compute: (probe_gpus as u8 % 7) + 1, memory: 1 },
            };
            probe.gpu_models = match probe_model {
                0 => GpuModelSet::ANY,
                1 => GpuModelSet::of(catalog.id("A100-40")),
                _ => GpuModelSet::of(catalog.id("A100-80")),
            };
            let fast: Vec<NodeId> = s.fitting_nodes(&probe).collect();
            let reference: Vec<NodeId> = s
                .topology()
                .node_ids()
                .filter(|&n| s.worker_fits(&probe, n))
                .collect();
            proptest::prop_assert_eq!(fast, reference);
        }
    }

    #[test]
    fn a_refresh_gives_new_contents_a_new_instance() {
        let mut source = cluster();
        let mut copy = source.clone();
        let first = copy.instance();
        try_allocate(&mut source, 1, 0, 2).unwrap();
        copy.refresh_copy_of(&source);
        assert_ne!(copy.instance(), first);
        assert_eq!(copy.node_idle_gpus(NodeId(0)), 2);
        // A different state of the same shape is never taken for the source.
        let other = cluster();
        copy.refresh_copy_of(&other);
        assert!(same_contents(&copy, &other));
    }

    #[test]
    fn a_down_node_leaves_the_free_counts() {
        let mut s = cluster();
        s.set_node_up(NodeId(1), false);
        assert_eq!(s.idle_gpus(), 12);
        assert_eq!(s.healthy_gpus(), 12);
        let job = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        assert!(!s.worker_fits(&job, NodeId(1)));
        s.set_node_up(NodeId(1), true);
        assert_eq!(s.idle_gpus(), 16);
        s.check_consistency().unwrap();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "more CPU or memory free than it has")]
    fn releasing_a_cpu_only_worker_twice_panics_in_debug_builds() {
        let mut s = cluster();
        let mut job = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        job.gpu = GpuDemand::None;
        job.cpu_milli = 1000;
        let p = Placement {
            workers: vec![worker(0, &[], job.gpu)],
        };
        s.allocate(&job, &p).unwrap();
        s.release(&job, &p);
        s.release(&job, &p);
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "tenants")]
    fn releasing_a_shared_worker_twice_beside_another_tenant_panics_in_debug_builds() {
        let mut s = cluster();
        let mut a = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        a.gpu = GpuDemand::Milli(300);
        let mut b = a.clone();
        b.gpu = GpuDemand::Milli(600);
        let (on_a, on_b) = (
            Placement {
                workers: vec![worker(0, &[0], a.gpu)],
            },
            Placement {
                workers: vec![worker(0, &[0], b.gpu)],
            },
        );
        s.allocate(&a, &on_a).unwrap();
        s.allocate(&b, &on_b).unwrap();
        // 300 of the GPU's 1000 milli come back twice: 700 free, which is no more than
        // the GPU has, but `b` still holds 600 of it.
        s.release(&a, &on_a);
        s.release(&a, &on_a);
    }
}
