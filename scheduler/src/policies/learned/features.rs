//! The one featurisation of a placement decision: (cluster state, job, candidate
//! placements) → [`DecisionFeatures`]. The learned placer calls it when it serves and when
//! it records decisions for training, so the two cannot drift apart.

use marshal_model::policy::{CANDIDATE_FEATURES, DecisionFeatures, JOB_FEATURES, MAX_CANDIDATES};

use crate::domain::{ClusterState, GpuDemand, Job, NodeId, Placement, TopoLevel};
use crate::policies::Fgd;
use crate::sim::SpeedModel;

/// One option for a decision: a placement, or waiting (holding capacity).
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    Place {
        placement: Placement,
        /// Whether this is what the fallback heuristic would do.
        fallback: bool,
    },
    Wait,
}

/// Per-node heuristic scores of the decision's feasible nodes (for one worker), used to
/// give each candidate its scores and ranks.
#[derive(Debug, Default)]
pub struct NodeScores {
    pub nodes: Vec<NodeId>,
    pub fgd: Vec<f64>,
    pub best_fit: Vec<f64>,
}

impl NodeScores {
    fn lookup(&self, node: NodeId) -> Option<usize> {
        self.nodes.iter().position(|&n| n == node)
    }

    /// Share of feasible nodes scoring strictly better than `score` on `scores`.
    fn rank(scores: &[f64], score: f64) -> f32 {
        let better = scores.iter().filter(|&&s| s > score).count();
        better as f32 / scores.len().max(1) as f32
    }
}

fn log2p1(x: f64) -> f32 {
    (x + 1.0).log2() as f32
}

/// The job's features and the cluster context it is placed into.
pub fn job_features(job: &Job, state: &ClusterState, candidates: usize) -> [f32; JOB_FEATURES] {
    let topo = state.topology();
    let speed = SpeedModel::default();
    let healthy = state.healthy_gpus().max(1) as f64;
    [
        log2p1(job.gpu_milli() as f64 / 1000.0),
        log2p1(job.workers as f64),
        f32::from(u8::from(job.gpu.is_shared())),
        job.gpu.milli() as f32 / 1000.0,
        job.cpu_milli as f32 / topo.max_node_cpu_milli().max(1) as f32,
        speed.comm_share(job) as f32,
        topo.tightest_level_for(job.gpu_count().max(1)) as u8 as f32 / 5.0,
        (state.idle_gpus() as f64 / healthy) as f32,
        (state.allocated_milli() as f64 / state.capacity_milli().max(1) as f64) as f32,
        candidates as f32 / MAX_CANDIDATES as f32,
    ]
}

/// What placing `job` on `placement` does, as the candidate feature slots.
pub fn candidate_features(
    job: &Job,
    state: &ClusterState,
    choice: &Choice,
    scores: &NodeScores,
    fgd_scorer: &Fgd,
) -> [f32; CANDIDATE_FEATURES] {
    let mut f = [0.0f32; CANDIDATE_FEATURES];
    let Choice::Place {
        placement,
        fallback,
    } = choice
    else {
        f[0] = 1.0;
        return f;
    };
    let topo = state.topology();
    let speed = SpeedModel::default();
    let span = placement.span(topo);
    let tightest = topo
        .tightest_level_for(job.gpu_count().max(1))
        .max(TopoLevel::NvlinkIsland);
    let mut nodes: Vec<NodeId> = placement.workers.iter().map(|w| w.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let n = nodes.len().max(1) as f32;

    let (mut fgd, mut bf, mut fgd_rank, mut bf_rank) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
    let (mut idle_after, mut cpu_after) = (0.0f32, 0.0f32);
    // A share's FGD score is that of its own GPU: the node's score is FGD's best GPU's,
    // which a candidate on another GPU of the node does not get.
    let share_score = match placement.workers.as_slice() {
        [w] if job.workers == 1 && w.gpus.len() == 1 => {
            fgd_scorer.share_score(job, w.node, w.gpus[0].gpu, state)
        }
        _ => None,
    };
    for &node in &nodes {
        if let Some(i) = scores.lookup(node) {
            let own = share_score.unwrap_or(scores.fgd[i]);
            fgd += own as f32;
            bf += scores.best_fit[i] as f32;
            fgd_rank += NodeScores::rank(&scores.fgd, own);
            bf_rank += NodeScores::rank(&scores.best_fit, scores.best_fit[i]);
        } else {
            fgd_rank += 1.0;
            bf_rank += 1.0;
        }
        let workers = placement.workers.iter().filter(|w| w.node == node);
        let mut newly_busy = 0u32;
        let mut cpu = 0u32;
        for w in workers {
            cpu += job.cpu_milli;
            newly_busy += w.gpus.iter().filter(|s| state.is_idle(s.gpu)).count() as u32;
        }
        let gpus = topo.node(node).gpu_count().max(1) as f32;
        idle_after += (state.node_idle_gpus(node) as f32 - newly_busy as f32) / gpus;
        let node_cpu = topo.node(node).cpu_milli.max(1) as f32;
        cpu_after += state.node_cpu_free(node).saturating_sub(cpu) as f32 / node_cpu;
    }
    let shares: Vec<_> = placement.workers.iter().flat_map(|w| &w.gpus).collect();
    let partly_used = shares
        .iter()
        .filter(|s| state.free_milli(s.gpu) < 1000)
        .count() as f32
        / shares.len().max(1) as f32;
    let max_throughput = topo
        .catalog
        .iter()
        .map(|(_, m)| m.throughput)
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let throughput = shares
        .iter()
        .map(|s| topo.catalog.get(topo.gpu(s.gpu).model).throughput)
        .fold(f64::INFINITY, f64::min);
    let throughput = if throughput.is_finite() {
        throughput / max_throughput
    } else {
        1.0
    };
    let tenants = shares
        .iter()
        .map(|s| state.tenants(s.gpu) + 1)
        .max()
        .unwrap_or(1);
    let predicted =
        speed.locality(topo, job, span) * speed.interference_factor(job, tenants) * throughput;
    let rack_idle_after = nodes.first().map_or(0.0, |&first| {
        let rack = topo.node(first).rack;
        let range = topo.racks()[rack.0 as usize].nodes.clone();
        let rack_gpus: u32 = range
            .clone()
            .map(|i| topo.node(NodeId(i)).gpu_count() as u32)
            .sum();
        let taken = shares
            .iter()
            .filter(|s| topo.node(topo.gpu(s.gpu).node).rack == rack)
            .filter(|s| state.is_idle(s.gpu))
            .count() as u32;
        state.rack_idle_gpus(rack).saturating_sub(taken) as f32 / rack_gpus.max(1) as f32
    });
    f[1] = span as u8 as f32 / 5.0;
    f[2] = f32::from(u8::from(span <= tightest || job.gpu == GpuDemand::None));
    f[3] = log2p1(nodes.len() as f64);
    f[4] = fgd / n;
    f[5] = bf / n;
    f[6] = fgd_rank / n;
    f[7] = bf_rank / n;
    f[8] = idle_after / n;
    f[9] = partly_used;
    f[10] = throughput as f32;
    f[11] = predicted as f32;
    f[12] = rack_idle_after;
    f[13] = cpu_after / n;
    f[14] = f32::from(u8::from(*fallback));
    f
}

/// Features of a whole decision.
pub fn featurise(
    job: &Job,
    state: &ClusterState,
    choices: &[Choice],
    scores: &NodeScores,
    fgd: &Fgd,
) -> DecisionFeatures {
    DecisionFeatures {
        job: job_features(job, state, choices.len()),
        candidates: choices
            .iter()
            .map(|c| candidate_features(job, state, c, scores, fgd))
            .collect(),
    }
}
