//! The domain: GPU models, the topology tree, cluster specs and state, jobs and
//! placements. Plain data and arithmetic only: no async runtime, RPC or tensors here.

mod gpu;
mod job;
mod spec;
mod state;
mod topology;
mod workload;

pub use gpu::{
    GpuCatalog, GpuModel, GpuModelId, GpuModelSet, MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES,
    MigInstanceShape, MigProfile,
};
pub use job::{Checkpointing, CommPattern, Elastic, GpuDemand, Job, JobId};
pub use spec::{ClusterSpec, LinkSpec, MAX_GPUS, MigLayoutSpec, NodeGroupSpec};
pub use state::{ClusterState, GpuShare, Placement, WORKER_KINDS, WorkerPlacement, worker_kind};
pub use topology::{
    Gpu, GpuId, MigInstanceSlot, MigMode, Node, NodeId, Rack, RackId, Spine, SpineId, TopoLevel,
    Topology,
};
pub use workload::{MemPhase, MemPhaseKind, WorkloadCatalog, WorkloadId, WorkloadKind};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DomainError {
    #[error("unknown GPU model {0:?}")]
    UnknownGpuModel(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("allocation refused: {0}")]
    Allocation(String),
}
