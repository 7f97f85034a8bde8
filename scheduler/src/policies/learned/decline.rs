//! The inputs of the decline head (`marshal_model::policy::DeclineHead`): what the
//! learned placer knows when a GPU share's placement would open an idle GPU.

use marshal_model::policy::DECLINE_FEATURES;

use crate::domain::{ClusterState, GpuDemand, GpuId, Job, Placement};

/// The target workload's GPU demand by kind, as shares of all its GPU demand.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct WorkloadMix {
    /// Whole-GPU tasks that accept any GPU model.
    pub whole_any_model: f32,
    /// Whole-GPU tasks that ask for specific models.
    pub whole_given_models: f32,
}

impl WorkloadMix {
    /// The mix of `workload` (all zero for a workload without GPU demand).
    pub fn of(workload: &[Job]) -> WorkloadMix {
        let (mut any, mut given, mut all) = (0u64, 0u64, 0u64);
        for job in workload {
            let milli = job.gpu_milli();
            all += milli;
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

/// The head's inputs for a share that would open `gpu` (order:
/// `marshal_model::policy::DECLINE_FEATURE_NAMES`).
pub fn decline_features(
    job: &Job,
    state: &ClusterState,
    gpu: GpuId,
    mix: WorkloadMix,
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
    ]
}
