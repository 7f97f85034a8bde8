//! Tiny episodes and artifacts for tests (seconds, not minutes): the trainer's, and the
//! root package's end-to-end tests of promotion. Not an API.

use std::path::Path;
use std::sync::Arc;

use marshal_model::policy::{
    CANDIDATE_FEATURES, DecisionFeatures, FeatureStats, JOB_FEATURES, PolicyConfig, PolicyLearner,
    PolicyMeta, save_policy,
};
use marshal_scheduler::domain::{ClusterSpec, GpuDemand, Job, JobId, Topology};
use marshal_scheduler::sim::SimConfig;

use crate::policy::EpisodeSpec;

/// FGD-experiment episodes (two seeds) of 40 mixed tasks on 6 four-GPU nodes.
pub fn inflation_spec() -> EpisodeSpec {
    let spec = ClusterSpec::from_toml(
        "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=6\ngpu_model='T4'\ngpus=4\ncpu_milli=64000\nmemory_mib=262144\n",
    )
    .unwrap();
    let jobs: Vec<Job> = (0..40)
        .map(|i| {
            let mut j = Job::whole_gpus(JobId(i), 1, 0.0, 0.0);
            j.cpu_milli = 4000;
            j.gpu = match i % 4 {
                0 => GpuDemand::Milli(600),
                1 => GpuDemand::Whole(1),
                2 => GpuDemand::Milli(300),
                _ => GpuDemand::Whole(2),
            };
            j
        })
        .collect();
    EpisodeSpec {
        name: "tiny-inflation".into(),
        topo: Arc::new(Topology::build(&spec).unwrap()),
        jobs_by_seed: vec![(2000, jobs.clone()), (2001, jobs)],
        config: SimConfig::inflation(0),
        fallback: "fgd".into(),
    }
}

/// A tiny artifact with an untrained network (seeded), the trained `threshold` and the
/// given inflation fallback (topo-pack in replay). A threshold above 1 closes the gate:
/// the artifact then schedules exactly as its fallback.
pub fn tiny_artifact(dir: &Path, inflation_fallback: &str, seed: u64, threshold: f32) {
    let d = DecisionFeatures {
        job: [0.0; JOB_FEATURES],
        candidates: vec![[0.0; CANDIDATE_FEATURES]],
    };
    let mut stats = FeatureStats::fit(&[&d]);
    stats.distance_p999 = 1.0;
    let config = PolicyConfig::new().with_hidden_size(8).with_seed(seed);
    let learner = PolicyLearner::new(config.clone(), stats.clone()).unwrap();
    let mut meta = PolicyMeta::new(threshold, 1e6);
    meta.fallback
        .insert("inflation".into(), inflation_fallback.into());
    meta.fallback.insert("replay".into(), "topo-pack".into());
    save_policy(dir, &learner.network(), &config, &stats, meta).unwrap();
}
