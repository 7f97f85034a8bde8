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

use crate::domain::{
    ClusterState, CommPattern, GpuModel, Job, Placement, TopoLevel, Topology, WorkloadCatalog,
    WorkloadKind,
};

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
    /// Measured kinds; a job with a [`Job::workload`] takes its GPU throughputs,
    /// communication share and co-location speed from here instead of the defaults above.
    #[serde(default)]
    pub workloads: WorkloadCatalog,
    /// Every job runs at speed 1 wherever it is placed: a job's work is its recorded
    /// duration, whatever GPU model, locality or co-tenants it gets. Shadow mode replays
    /// recorded logs this way, so both schedulers' jobs last what the log says.
    #[serde(default)]
    pub recorded_durations: bool,
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
            workloads: WorkloadCatalog::default(),
            recorded_durations: false,
        }
    }
}

impl SpeedModel {
    /// The job's kind, if it has one this model knows.
    pub fn kind(&self, job: &Job) -> Option<&WorkloadKind> {
        job.workload.and_then(|id| self.workloads.get(id))
    }

    fn pattern_share(&self, comm: CommPattern) -> f64 {
        match comm {
            CommPattern::None => 0.0,
            CommPattern::DataParallel => self.data_parallel_comm,
            CommPattern::TensorParallel => self.tensor_parallel_comm,
            CommPattern::PipelineParallel => self.pipeline_parallel_comm,
        }
    }

    /// Communication share of a step of `job` at the reference bandwidth.
    pub fn comm_share(&self, job: &Job) -> f64 {
        if job.comm == CommPattern::None {
            return 0.0;
        }
        let local_batch = job
            .batch_size
            .map(|b| f64::from(b) / f64::from(job.workers.max(1)));
        self.kind(job).map_or_else(
            || self.pattern_share(job.comm),
            |k| k.comm_share_at(local_batch),
        )
    }

    /// Throughput of one worker of `job` on a GPU of `model`, relative to the reference
    /// class: the kind's measurement where there is one, else the catalog's class.
    pub fn gpu_throughput(&self, job: &Job, model: &GpuModel) -> f64 {
        self.kind(job)
            .and_then(|k| k.relative_throughput.get(&model.name).copied())
            .unwrap_or(model.throughput)
    }

    /// Speed of a step with communication share `c` spanning `level`, before normalisation.
    fn level_speed(&self, topo: &Topology, c: f64, level: TopoLevel) -> f64 {
        1.0 / (1.0 - c + c * self.reference_gbps / topo.bandwidth(level))
    }

    /// Locality factor in (0, 1]: 1 when the gang is as tight as the cluster allows.
    pub fn locality(&self, topo: &Topology, job: &Job, span: TopoLevel) -> f64 {
        let c = self.comm_share(job);
        if job.gpu_count() <= 1 || c == 0.0 {
            return 1.0;
        }
        let best = topo
            .tightest_level_for(job.gpu_count())
            .max(TopoLevel::NvlinkIsland);
        let level = span.max(TopoLevel::NvlinkIsland);
        (self.level_speed(topo, c, level) / self.level_speed(topo, c, best)).min(1.0)
    }

    /// Speed factor of a worker sharing its busiest GPU with `tenants - 1` others.
    pub fn interference_factor(&self, job: &Job, tenants: u16) -> f64 {
        let others = tenants.saturating_sub(1);
        let factor = match self.kind(job) {
            Some(k) => k.colocation_speed.powi(others as i32),
            None => 1.0 - self.interference * others as f64,
        };
        factor.max(self.min_interference_factor)
    }

    /// Progress rate of `job` on `placement` given the current co-tenants in `state`.
    pub fn speed(&self, job: &Job, placement: &Placement, state: &ClusterState) -> f64 {
        let topo = state.topology();
        if job.gpu_count() == 0 || self.recorded_durations {
            return 1.0;
        }
        let mut throughput = f64::INFINITY;
        let mut max_tenants = 1u16;
        for gpu in placement.gpu_ids() {
            let model = topo.catalog.get(topo.gpu(gpu).model);
            throughput = throughput.min(self.gpu_throughput(job, model));
            max_tenants = max_tenants.max(state.tenants(gpu));
        }
        throughput
            * self.locality(topo, job, placement.span(topo))
            * self.interference_factor(job, max_tenants)
    }
}

/// The work (reference-GPU seconds) that makes `job`, running alone at `speed` (as
/// [`SpeedModel::speed`] gives it), finish `duration_s` after it starts: the simulator
/// spends the restart delay first and then progresses at the speed times the
/// checkpoint duty cycle. Trace parsers record durations; this turns one into work so
/// that the job's original duration holds on its original hardware.
pub fn work_for_duration(job: &Job, duration_s: f64, speed: f64) -> f64 {
    let c = &job.checkpoint;
    let duty = c.interval_s / (c.interval_s + c.cost_s);
    (duration_s - c.restart_s).max(0.0) * speed * duty
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

    #[test]
    fn a_workload_kind_overrides_class_share_and_interference() {
        use crate::domain::{WorkloadCatalog, WorkloadId, WorkloadKind};
        use std::collections::BTreeMap;
        let mut s = state();
        let kind = WorkloadKind {
            name: "k".into(),
            family: "k".into(),
            comm: CommPattern::DataParallel,
            relative_throughput: BTreeMap::from([("V100M32".into(), 0.8)]),
            comm_share: 0.1,
            comm_share_by_local_batch: vec![],
            colocation_speed: 0.6,
            reference_step_time_s: None,
            memory: vec![],
            source: "test".into(),
        };
        let model = SpeedModel {
            workloads: WorkloadCatalog::new(vec![kind]).unwrap(),
            ..SpeedModel::default()
        };
        let mut job = Job::whole_gpus(JobId(1), 2, 0.0, 1.0);
        let cross_rack = spread(&job, &[0, 16]);
        let generic = model.speed(&job, &cross_rack, &s);
        job.workload = Some(WorkloadId(0));
        let typed = model.speed(&job, &cross_rack, &s);
        // A smaller communication share loses less to the spread, but the kind runs at
        // 0.8 of the class on this GPU.
        let c = 0.1;
        let bw = |l| s.topology().bandwidth(l);
        let span = cross_rack.span(s.topology());
        let expected = 0.8 * (1.0 - c + c * 16.0 / bw(TopoLevel::NvlinkIsland))
            / (1.0 - c + c * 16.0 / bw(span));
        assert!((typed - expected).abs() < 1e-9, "{typed} vs {expected}");
        assert!(typed / 0.8 > generic, "{typed} {generic}");
        // A kind not in the catalog falls back to the generic model.
        job.workload = Some(WorkloadId(3));
        assert_eq!(model.speed(&job, &cross_rack, &s), generic);
        // Co-location: the kind's measured speed per extra tenant.
        let mut single = Job::whole_gpus(JobId(2), 1, 0.0, 1.0);
        single.gpu = GpuDemand::Milli(400);
        single.workload = Some(WorkloadId(0));
        let p = spread(&single, &[0]);
        s.allocate(&single, &p).unwrap();
        s.allocate(&single, &p).unwrap();
        assert!((model.speed(&single, &p, &s) - 0.8 * 0.6).abs() < 1e-12);
    }
}
