//! Helpers shared by the simulator's scenario tests.

use std::sync::Arc;

use marshal_scheduler::domain::{Checkpointing, ClusterSpec, GpuDemand, Job, JobId, Topology};
use marshal_scheduler::sim::{LogEntry, LogKind};

/// `nodes` V100 nodes of `gpus` GPUs in one NVLink domain each, two nodes per rack.
pub fn cluster(nodes: u32, gpus: u16) -> Arc<Topology> {
    let spec = ClusterSpec::from_toml(&format!(
        "name='t'\nnodes_per_rack=2\n[[nodes]]\ncount={nodes}\ngpu_model='V100M32'\ngpus={gpus}\n\
         nvlink_domain={gpus}\ncpu_milli=64000\nmemory_mib=262144\n"
    ))
    .unwrap();
    Arc::new(Topology::build(&spec).unwrap())
}

/// A job of `gpus` whole GPUs on one worker, no periodic checkpoints nor restart cost.
pub fn job(id: u32, gpus: u16, submit: f64, work: f64) -> Job {
    let mut j = Job::whole_gpus(JobId(id), 1, submit, work);
    j.gpu = GpuDemand::Whole(gpus);
    j.checkpoint = Checkpointing {
        interval_s: 1e9,
        cost_s: 0.0,
        restart_s: 0.0,
        on_preempt: false,
    };
    j
}

/// When job `id` first started.
pub fn start_time(log: &[LogEntry], id: u32) -> f64 {
    log.iter()
        .find(|e| e.job == JobId(id) && matches!(e.what, LogKind::Start(_)))
        .map(|e| e.time)
        .expect("job started")
}
