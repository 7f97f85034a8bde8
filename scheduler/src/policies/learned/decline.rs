//! The inputs of the decline head (`marshal_model::policy::DeclineHead`): what the
//! learned placer knows when a GPU share's placement would open an idle GPU.

use marshal_model::policy::{DECLINE_FEATURES, SHARE_TIES_FEATURES};

use crate::domain::{ClusterState, GpuDemand, GpuId, Job, Placement, Topology};

/// The whole-GPU pressure input is capped here: beyond it, idle GPUs are scarce
/// whatever the exact figure (and the last idle GPUs would make it unbounded).
pub const MAX_WHOLE_GPU_PRESSURE: f32 = 3.0;

/// The target workload's GPU demand by kind, as shares of all its GPU demand.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct WorkloadMix {
    /// Whole-GPU tasks that accept any GPU model.
    pub whole_any_model: f32,
    /// Whole-GPU tasks that ask for specific models.
    pub whole_given_models: f32,
    /// CPU milli requested per GPU requested (all tasks, CPU-only ones included).
    pub cpu_milli_per_gpu: f32,
    /// Whole-GPU jobs of more than one GPU (in one worker or several).
    pub multi_gpu: f32,
}

impl WorkloadMix {
    /// The mix of `workload` (all zero for a workload without GPU demand).
    pub fn of(workload: &[Job]) -> WorkloadMix {
        let (mut any, mut given, mut all, mut cpu, mut multi) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for job in workload {
            let milli = job.gpu_milli();
            all += milli;
            cpu += u64::from(job.cpu_milli) * u64::from(job.workers);
            if matches!(job.gpu, GpuDemand::Whole(_)) && job.gpu_count() > 1 {
                multi += milli;
            }
            if matches!(job.gpu, GpuDemand::Whole(_)) {
                if job.gpu_models.is_any() {
                    any += milli;
                } else {
                    given += milli;
                }
            }
        }
        let share = |x: u64| (x as f64 / all.max(1) as f64) as f32;
        WorkloadMix {
            whole_any_model: share(any),
            whole_given_models: share(given),
            cpu_milli_per_gpu: (cpu as f64 / (all.max(1) as f64 / 1000.0)) as f32,
            multi_gpu: share(multi),
        }
    }
}

/// The idle GPU `placement` would open for `job`, if `job` is a GPU share and it would.
pub fn opened_idle_gpu(job: &Job, state: &ClusterState, placement: &Placement) -> Option<GpuId> {
    if !matches!(job.gpu, GpuDemand::Milli(_)) {
        return None;
    }
    placement.gpu_ids().find(|&g| state.free_milli(g) == 1000)
}

/// The whole-GPU demand the workload's mix forecasts for the arrivals still to come
/// before 100 % arrived load, over the idle GPUs (capped at
/// [`MAX_WHOLE_GPU_PRESSURE`]): above 1, the idle GPUs will not hold the whole-GPU
/// tasks to come unless shares are kept off them. NaN without `arrived_milli` (outside
/// the inflation experiment), which makes the head abstain.
pub fn whole_gpu_pressure(
    state: &ClusterState,
    arrived_milli: Option<u64>,
    mix: WorkloadMix,
) -> f32 {
    let Some(arrived) = arrived_milli else {
        return f32::NAN;
    };
    let to_come = state.capacity_milli().saturating_sub(arrived) as f64 / 1000.0;
    let whole = f64::from(mix.whole_any_model + mix.whole_given_models);
    let pressure = to_come * whole / f64::from(state.idle_gpus().max(1));
    (pressure as f32).min(MAX_WHOLE_GPU_PRESSURE)
}

/// The workload's CPU per GPU requested over the cluster's CPU per GPU: near or above
/// 1, CPU runs out with the GPUs, and an idle GPU kept whole may sit on a node without
/// the cores a whole-GPU task needs. Both sides count everything: CPU-only tasks and
/// CPU-only nodes too (the openb cluster has none; on a cluster with many, the
/// pressure on GPU nodes is higher than this says, which a head trained elsewhere
/// meets as an input outside its range only if the total moves too).
pub fn cpu_pressure(topo: &Topology, mix: WorkloadMix) -> f32 {
    let cpu: u64 = topo.nodes().iter().map(|n| u64::from(n.cpu_milli)).sum();
    let per_gpu = cpu as f64 / f64::from(topo.gpu_count().max(1));
    (f64::from(mix.cpu_milli_per_gpu) / per_gpu.max(1.0)) as f32
}

/// The share-ties switch's inputs (order: `marshal_model::policy::SHARE_TIES_FEATURE_NAMES`).
pub fn share_ties_features(topo: &Topology, mix: WorkloadMix) -> [f32; SHARE_TIES_FEATURES] {
    [
        mix.whole_any_model,
        mix.whole_given_models,
        mix.multi_gpu,
        cpu_pressure(topo, mix),
    ]
}

/// The head's inputs for a share that would open `gpu` (order:
/// `marshal_model::policy::DECLINE_FEATURE_NAMES`); `arrived_milli` as in
/// [`crate::framework::Context::arrived_milli`].
pub fn decline_features(
    job: &Job,
    state: &ClusterState,
    gpu: GpuId,
    mix: WorkloadMix,
    arrived_milli: Option<u64>,
) -> [f32; DECLINE_FEATURES] {
    let topo = state.topology();
    let model = topo.gpu(gpu).model;
    let (mut used, mut idle, mut all) = (0u64, 0u64, 0u64);
    for (i, g) in topo.gpus().iter().enumerate() {
        if g.model == model {
            let id = GpuId(i as u32);
            used += u64::from(1000 - state.free_milli(id));
            idle += u64::from(state.is_idle(id));
            all += 1;
        }
    }
    let all = all.max(1) as f64;
    [
        1.0,
        (state.allocated_milli() as f64 / state.capacity_milli().max(1) as f64) as f32,
        (used as f64 / 1000.0 / all) as f32,
        (idle as f64 / all) as f32,
        job.gpu.milli() as f32 / 1000.0,
        mix.whole_any_model,
        mix.whole_given_models,
        whole_gpu_pressure(state, arrived_milli, mix),
        cpu_pressure(topo, mix),
    ]
}
