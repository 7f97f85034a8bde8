//! How fast a job runs on a placement.
//!
//! A step is compute plus communication; communication time scales with the inverse
//! bandwidth of the slowest level the gang spans. With `c` the communication share of a
//! step over a link of `reference_gbps`, the speed at level `l` is
//! `1 / (1 - c + c · reference / bw(l))`, normalised by the speed at the tightest level
//! that could hold the gang on this cluster, so a trace job packed as tightly as the
//! hardware allows runs at its recorded speed. GPU models scale speed by their throughput
//! class (the slowest GPU of the gang sets the pace), and every extra worker sharing a GPU
//! costs `interference` of its speed.
//!
//! The data-parallel share is calibrated: it is the median, over the Pollux placement
//! profiles (6 models × batch sizes, T4 on AWS g4dn, 16 GB/s PCIe inside a node and
//! 6.25 GB/s between nodes), of the share that reproduces each measured spread/packed
//! step-time ratio; `marshal-datasets`' calibration test fails if this default drifts
//! from the data. The tensor- and pipeline-parallel shares and the interference are
//! estimates: no redistributable profile of them is bundled (Sia's pipeline profiles and
//! Lucid's co-location measurements carry no licence that allows it).

use serde::{Deserialize, Serialize};

use crate::domain::{ClusterState, CommPattern, Job, Placement, TopoLevel, Topology};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpeedModel {
    /// Bandwidth, GB/s, at which the communication shares below are measured.
    pub reference_gbps: f64,
    /// Communication share of a data-parallel step (gradient all-reduce).
    pub data_parallel_comm: f64,
    /// Tensor parallelism all-reduces activations every layer.
    pub tensor_parallel_comm: f64,
    /// Pipeline parallelism sends activations between stages.
    pub pipeline_parallel_comm: f64,
    /// Speed lost per additional worker sharing a GPU.
    pub interference: f64,
    /// Floor of the interference factor.
    pub min_interference_factor: f64,
}

impl Default for SpeedModel {
    fn default() -> Self {
        SpeedModel {
            reference_gbps: 16.0,
            data_parallel_comm: 0.345,
            tensor_parallel_comm: 0.6,
            pipeline_parallel_comm: 0.2,
            interference: 0.10,
            min_interference_factor: 0.5,
        }
    }
}

impl SpeedModel {
    fn comm_share(&self, comm: CommPattern) -> f64 {
        match comm {
            CommPattern::None => 0.0,
            CommPattern::DataParallel => self.data_parallel_comm,
            CommPattern::TensorParallel => self.tensor_parallel_comm,
            CommPattern::PipelineParallel => self.pipeline_parallel_comm,
        }
    }

    /// Speed of a `comm` job spanning `level`, before normalisation.
    fn level_speed(&self, topo: &Topology, comm: CommPattern, level: TopoLevel) -> f64 {
        let c = self.comm_share(comm);
        1.0 / (1.0 - c + c * self.reference_gbps / topo.bandwidth(level))
    }

    /// Locality factor in (0, 1]: 1 when the gang is as tight as the cluster allows.
    pub fn locality(&self, topo: &Topology, job: &Job, span: TopoLevel) -> f64 {
        if job.gpu_count() <= 1 || job.comm == CommPattern::None {
            return 1.0;
        }
        let best = topo
            .tightest_level_for(job.gpu_count())
            .max(TopoLevel::NvlinkIsland);
        let level = span.max(TopoLevel::NvlinkIsland);
        (self.level_speed(topo, job.comm, level) / self.level_speed(topo, job.comm, best)).min(1.0)
    }

    /// Progress rate of `job` on `placement` given the current co-tenants in `state`.
    pub fn speed(&self, job: &Job, placement: &Placement, state: &ClusterState) -> f64 {
        let topo = state.topology();
        if job.gpu_count() == 0 {
            return 1.0;
        }
        let mut throughput = f64::INFINITY;
        let mut max_tenants = 1u16;
        for gpu in placement.gpu_ids() {
            throughput = throughput.min(topo.catalog.get(topo.gpu(gpu).model).throughput);
            max_tenants = max_tenants.max(state.tenants(gpu));
        }
        let interference =
            (1.0 - self.interference * (max_tenants - 1) as f64).max(self.min_interference_factor);
        throughput * self.locality(topo, job, placement.span(topo)) * interference
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::domain::{ClusterSpec, GpuDemand, GpuId, GpuShare, JobId, NodeId, WorkerPlacement};

    fn state() -> ClusterState {
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=4\ngpu_model='V100M32'\ngpus=8\n\
             nvlink_domain=8\ncpu_milli=1\nmemory_mib=1\n",
        )
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    fn spread(job: &Job, gpus: &[u32]) -> Placement {
        Placement {
            workers: gpus
                .iter()
                .map(|&g| WorkerPlacement {
                    node: NodeId(g / 8),
                    gpus: vec![GpuShare::for_demand(GpuId(g), job.gpu)],
                })
                .collect(),
        }
    }

    #[test]
    fn spreading_costs_more_the_more_a_job_communicates() {
        let s = state();
        let model = SpeedModel::default();
        let mut job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        let packed = spread(&job, &[0, 1]);
        let cross_rack = spread(&job, &[0, 16]);
        assert_eq!(model.speed(&job, &packed, &s), 1.0);
        let dp = model.speed(&job, &cross_rack, &s);
        job.comm = CommPattern::TensorParallel;
        let tp = model.speed(&job, &cross_rack, &s);
        assert!(tp < dp && dp < 1.0, "tp {tp} dp {dp}");
        job.comm = CommPattern::None;
        assert_eq!(model.speed(&job, &cross_rack, &s), 1.0);
    }

    #[test]
    fn a_gang_larger_than_a_node_is_not_penalised_for_leaving_it() {
        let s = state();
        let model = SpeedModel::default();
        let job = Job::whole_gpus(JobId(1), 16, 0.0, 1.0);
        let one_rack: Vec<u32> = (0..16).collect();
        assert_eq!(model.speed(&job, &spread(&job, &one_rack), &s), 1.0);
    }

    #[test]
    fn sharing_a_gpu_slows_its_tenants() {
        let mut s = state();
        let model = SpeedModel::default();
        let mut job = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        job.gpu = GpuDemand::Milli(400);
        let p = spread(&job, &[0]);
        s.allocate(&job, &p).unwrap();
        assert_eq!(model.speed(&job, &p, &s), 1.0);
        s.allocate(&job, &p).unwrap();
        assert!((model.speed(&job, &p, &s) - 0.9).abs() < 1e-12);
    }
}
