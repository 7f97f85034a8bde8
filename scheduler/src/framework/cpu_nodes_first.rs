//! Keeps CPU-only jobs off GPU nodes while CPU-only nodes can take them.
//!
//! A CPU-only job on a GPU node takes cores and memory that the node's GPUs need to be
//! usable: on a cluster with CPU nodes beside GPU nodes, that strands GPUs (in the
//! DLRM shadow replay about 850 CPU-only instances landed on GPU nodes under every
//! policy). Kubernetes clusters say the same with a `PreferNoSchedule` taint on GPU
//! nodes. Here it is a placer decorator, so that any policy, heuristic or learned, can
//! take it without knowing: the inner placer is shown only the CPU-only nodes that fit
//! one worker (through [`Context::node_order`], which every placer's filter honours),
//! and the whole cluster when none fits or the gang does not fit on them. Jobs that
//! need GPUs pass through untouched.

use crate::domain::{ClusterState, GpuDemand, Job, NodeId, Placement};
use crate::framework::{Context, Placer, Status};

/// A [`Placer`] that tries CPU-only nodes first for CPU-only jobs.
#[derive(Debug)]
pub struct CpuNodesFirst {
    pub inner: Box<dyn Placer>,
}

impl CpuNodesFirst {
    pub fn new(inner: Box<dyn Placer>) -> Self {
        CpuNodesFirst { inner }
    }
}

/// The CPU-only nodes one worker of `job` fits on, in the context's listing order.
fn cpu_nodes_that_fit(job: &Job, state: &ClusterState, ctx: &Context) -> Vec<NodeId> {
    let topo = state.topology();
    let keep = |&n: &NodeId| topo.node(n).model.is_none() && state.worker_fits(job, n);
    match ctx.node_order {
        Some(order) => order.iter().copied().filter(keep).collect(),
        None => topo.node_ids().filter(keep).collect(),
    }
}

impl Placer for CpuNodesFirst {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        if job.gpu != GpuDemand::None {
            return self.inner.place(job, state, ctx);
        }
        let cpu_nodes = cpu_nodes_that_fit(job, state, ctx);
        if !cpu_nodes.is_empty() {
            let mut narrowed = Context {
                now: ctx.now,
                rng: &mut *ctx.rng,
                node_order: Some(&cpu_nodes),
                speed: ctx.speed,
                held_elsewhere: ctx.held_elsewhere,
                arrived_milli: ctx.arrived_milli,
            };
            match self.inner.place(job, state, &mut narrowed) {
                Err(Status::Unschedulable(_)) => {}
                decided => return decided,
            }
        }
        self.inner.place(job, state, ctx)
    }

    fn node_scores(
        &self,
        job: &Job,
        nodes: &[NodeId],
        state: &ClusterState,
        ctx: &mut Context,
    ) -> Option<Vec<f64>> {
        self.inner.node_scores(job, nodes, state, ctx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::SeedableRng as _;
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::domain::{ClusterSpec, JobId, Topology};
    use crate::policies;

    /// Two 8-GPU nodes of 128 cores (ids 0, 1), then two CPU-only nodes of 64 (ids 2, 3).
    fn mixed_cluster() -> ClusterState {
        let spec = ClusterSpec::from_toml(
            r#"
            name = "mixed"
            [[nodes]]
            count = 2
            gpu_model = "V100M32"
            gpus = 8
            cpu_milli = 128000
            memory_mib = 524288
            [[nodes]]
            count = 2
            cpu_milli = 64000
            memory_mib = 65536
            "#,
        )
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    fn cpu_job(cpu_milli: u32, workers: u32) -> Job {
        let mut j = Job::whole_gpus(JobId(0), 1, 0.0, 1.0);
        (j.workers, j.gpu, j.cpu_milli, j.memory_mib) = (workers, GpuDemand::None, cpu_milli, 1024);
        j
    }

    fn place(
        placer: &dyn Placer,
        job: &Job,
        state: &mut ClusterState,
    ) -> Result<Placement, Status> {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        placer.place(job, state, &mut Context::new(0.0, &mut rng))
    }

    fn nodes(p: &Placement) -> Vec<u32> {
        p.workers.iter().map(|w| w.node.0).collect()
    }

    #[test]
    fn cpu_jobs_go_to_cpu_nodes_that_best_fit_alone_would_not_choose() {
        let mut state = mixed_cluster();
        let bare = policies::build("best-fit", &[]).unwrap().placer;
        // A GPU node whose GPUs are all taken, with a few cores left: best fit's
        // tightest node for a small CPU job, which then keeps those GPUs' next job
        // from getting the cores it needs.
        let mut gpu_job = Job::whole_gpus(JobId(5), 1, 0.0, 1.0);
        (gpu_job.gpu, gpu_job.cpu_milli) = (GpuDemand::Whole(8), 100_000);
        let p = place(bare.as_ref(), &gpu_job, &mut state).unwrap();
        state.allocate(&gpu_job, &p).unwrap();
        let job = cpu_job(4000, 1);
        assert_eq!(nodes(&place(bare.as_ref(), &job, &mut state).unwrap()), [0]);
        let guarded = CpuNodesFirst::new(policies::build("best-fit", &[]).unwrap().placer);
        assert_eq!(nodes(&place(&guarded, &job, &mut state).unwrap()), [2]);
    }

    #[test]
    fn gpu_nodes_are_used_when_no_cpu_node_fits_the_worker_or_the_gang() {
        let mut state = mixed_cluster();
        let guarded = CpuNodesFirst::new(policies::build("best-fit", &[]).unwrap().placer);
        let too_big = cpu_job(96_000, 1);
        assert!(
            nodes(&place(&guarded, &too_big, &mut state).unwrap())[0] < 2,
            "a worker larger than any CPU node goes to a GPU node"
        );
        // Each worker fits a CPU node, but three do not fit the two of them.
        let gang = cpu_job(40_000, 3);
        let p = place(&guarded, &gang, &mut state).unwrap();
        assert_eq!(p.workers.len(), 3);
        assert!(
            nodes(&p).iter().any(|&n| n < 2),
            "the gang spills onto GPU nodes"
        );
    }

    #[test]
    fn gpu_jobs_are_placed_as_the_inner_placer_places_them() {
        let mut state = mixed_cluster();
        let job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        for name in ["best-fit", "topo-pack", "fgd"] {
            let bare = policies::build(name, &[]).unwrap().placer;
            let guarded = CpuNodesFirst::new(policies::build(name, &[]).unwrap().placer);
            assert_eq!(
                place(bare.as_ref(), &job, &mut state),
                place(&guarded, &job, &mut state),
                "{name}"
            );
        }
    }
}
