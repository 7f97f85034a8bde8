//! The setting every decision-latency benchmark shares (`benches/scheduler.rs`'s
//! `decision/<policy>` and `benches/learned.rs`): a 10,000-GPU cluster about 60 % allocated
//! and churned, and 1,000 pending jobs of a mixed shape. Included by path in each bench,
//! so each uses a subset of it.
#![allow(dead_code)]

use std::sync::Arc;

use marshal_scheduler::domain::{
    ClusterSpec, ClusterState, CommPattern, GpuDemand, Job, JobId, LinkSpec, NodeGroupSpec,
    Placement, Topology,
};
use marshal_scheduler::framework::Context;
use marshal_scheduler::policies;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seeds every stream below.
pub const SEED: u64 = 42;

/// Pending jobs the decisions cycle through.
pub const PENDING_JOBS: usize = 1_000;
/// Share of GPU capacity allocated before decisions are measured.
pub const TARGET_ALLOCATION: f64 = 0.60;
/// Departures-and-arrivals rounds after the initial fill, per running job. Filling an
/// empty cluster with best fit and no departures packs the low node ids solid and leaves
/// the rest idle, which is the easiest state to score; a running cluster has holes
/// everywhere, so jobs leave at random and new ones are placed until the state looks
/// like that.
pub const CHURN_PER_RUNNING_JOB: usize = 2;

/// ChaCha8 streams of [`SEED`], one per purpose, so that changing how one is drawn does
/// not change the others.
pub const PENDING_STREAM: u64 = 0;
pub const PREFILL_STREAM: u64 = 1;
pub const POLICY_STREAM: u64 = 2;

pub fn rng(stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    rng.set_stream(stream);
    rng
}

/// 1,250 DGX H100-class nodes (8 GPUs in one NVLink island, 224 cores, 2 TiB): 10,000
/// GPUs in 79 racks under 10 spines.
pub fn decision_cluster() -> ClusterSpec {
    ClusterSpec {
        name: "bench-h100-10k".into(),
        nodes_per_rack: 16,
        racks_per_spine: 8,
        links: LinkSpec::default(),
        gpu_models: Vec::new(),
        node_groups: vec![NodeGroupSpec {
            count: 1_250,
            name_prefix: Some("h100".into()),
            names: Vec::new(),
            gpu_model: Some("H100".into()),
            gpus: 8,
            nvlink_domain: 8,
            cpu_milli: 224_000,
            memory_mib: 2 * 1024 * 1024,
            mig_gpus: None,
            mig_layout: Vec::new(),
        }],
    }
}

/// One job of a mixed GPU-sharing/training workload: 40 % GPU shares, 58 % single-node
/// whole-GPU jobs of 1–8 GPUs, 2 % multi-node gangs of 2–4 full nodes; 2–16 cores and
/// 8–64 GiB per worker.
///
/// Sizes come from coarse menus (shares in tenths of a GPU, cores and memory in steps of
/// 2 and 8), as people request them; openb, for one, has 91 distinct task shapes in 8,152
/// pods. Uniform values over the ranges would make nearly every job a shape of its own,
/// and `fgd`, whose target workload is the set of shapes covering 95 % of the jobs and
/// whose cost grows with it, would then score against ~950 shapes instead of tens.
pub fn mixed_job(id: u32, rng: &mut ChaCha8Rng) -> Job {
    let (workers, gpu) = match rng.random_range(0..100u32) {
        0..40 => (1, GpuDemand::Milli(100 * rng.random_range(1..=9))),
        40..75 => (1, GpuDemand::Whole(1)),
        75..85 => (1, GpuDemand::Whole(2)),
        85..93 => (1, GpuDemand::Whole(4)),
        93..98 => (1, GpuDemand::Whole(8)),
        _ => (rng.random_range(2..=4), GpuDemand::Whole(8)),
    };
    let mut job = Job::whole_gpus(JobId(id), workers, 0.0, 3_600.0);
    job.workers = workers;
    job.gpu = gpu;
    job.cpu_milli = 2_000 * rng.random_range(1..=8);
    job.memory_mib = 8 * 1024 * rng.random_range(1..=8);
    job.comm = if job.gpu_count() > 1 {
        CommPattern::DataParallel
    } else {
        CommPattern::None
    };
    job
}

/// The cluster, its pre-filled state and the pending jobs every policy decides on.
#[derive(Debug)]
pub struct DecisionSetup {
    pub state: ClusterState,
    pub pending: Vec<Job>,
}

impl DecisionSetup {
    pub fn new() -> DecisionSetup {
        let topo = Arc::new(Topology::build(&decision_cluster()).expect("valid bench cluster"));
        let mut pending_rng = rng(PENDING_STREAM);
        let pending: Vec<Job> = (0..PENDING_JOBS as u32)
            .map(|id| mixed_job(id, &mut pending_rng))
            .collect();
        let state = prefill(ClusterState::new(topo));
        DecisionSetup { state, pending }
    }
}

/// Brings `state` to about [`TARGET_ALLOCATION`] with jobs of the same mix, placed by
/// `best-fit` and allocated, then churns it (random departures, new arrivals) so that
/// free capacity is scattered over the cluster.
pub fn prefill(mut state: ClusterState) -> ClusterState {
    let placer = policies::build("best-fit", &[])
        .expect("best-fit exists")
        .placer;
    let mut rng = rng(PREFILL_STREAM);
    let target = (state.capacity_milli() as f64 * TARGET_ALLOCATION) as u64;
    let mut running: Vec<(Job, Placement)> = Vec::new();
    // Ids above the pending jobs' so that no two jobs share one.
    let mut next_id = PENDING_JOBS as u32;
    let mut fill =
        |state: &mut ClusterState, running: &mut Vec<(Job, Placement)>, rng: &mut ChaCha8Rng| {
            let mut misses = 0;
            while state.allocated_milli() < target {
                let job = mixed_job(next_id, rng);
                next_id += 1;
                let mut ctx = Context::new(0.0, rng);
                match placer.place(&job, state, &mut ctx) {
                    Ok(placement) => {
                        state
                            .allocate(&job, &placement)
                            .expect("a placement the placer returned fits");
                        running.push((job, placement));
                    }
                    // Near the target, large gangs may not fit; a bounded number of misses
                    // keeps a pathological mix from looping forever.
                    Err(_) => {
                        misses += 1;
                        assert!(
                            misses < 10_000,
                            "cannot reach {TARGET_ALLOCATION} allocation"
                        );
                    }
                }
            }
        };
    fill(&mut state, &mut running, &mut rng);
    for _ in 0..running.len() * CHURN_PER_RUNNING_JOB {
        let (job, placement) = running.swap_remove(rng.random_range(0..running.len()));
        state.release(&job, &placement);
        fill(&mut state, &mut running, &mut rng);
    }
    state
        .check_consistency()
        .expect("pre-filled state is consistent");
    state
}
