//! What the server persists besides jobs: node records and decision records.

use serde::{Deserialize, Serialize};

use crate::domain::{Job, Placement, Topology};
use crate::service::pb;

/// A node's scheduling status. Its hardware comes from the inventory, not from here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub registered: bool,
    pub cordoned: bool,
    pub quarantined: bool,
    /// Job failures (and failed-GPU reports) since the last uncordon.
    pub failures: u32,
    pub reason: String,
    /// Its agent has not been heard from for `node_timeout_ms`: no new work goes there.
    /// Persisted, so a restarted scheduler keeps the node out until its agent is back
    /// and keeps counting the grace period from `unreachable_since_us`.
    #[serde(default)]
    pub unreachable: bool,
    /// When the node was marked unreachable (µs since the epoch); 0 while reachable.
    #[serde(default)]
    pub unreachable_since_us: i64,
    /// When its agent was last heard from (µs since the epoch). Not persisted: a
    /// restarted scheduler counts from its start.
    #[serde(skip)]
    pub last_seen_us: i64,
    /// Telemetry samples accepted since the server started (not persisted).
    #[serde(skip)]
    pub telemetry_samples: u64,
}

/// One GPU a worker holds, by its index on the node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlotRecord {
    pub index: u32,
    pub milli: u32,
    pub mig_compute: u32,
    pub mig_memory: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub node: String,
    pub gpus: Vec<SlotRecord>,
}

impl WorkerRecord {
    pub fn of(p: &Placement, topo: &Topology) -> Vec<WorkerRecord> {
        p.workers
            .iter()
            .map(|w| WorkerRecord {
                node: topo.node(w.node).name.clone(),
                gpus: w
                    .gpus
                    .iter()
                    .map(|s| SlotRecord {
                        index: topo.gpu(s.gpu).index as u32,
                        milli: s.milli as u32,
                        mig_compute: s.mig_compute as u32,
                        mig_memory: s.mig_memory as u32,
                    })
                    .collect(),
            })
            .collect()
    }

    pub fn to_pb(list: &[WorkerRecord]) -> Vec<pb::WorkerPlacement> {
        list.iter()
            .enumerate()
            .map(|(i, w)| pb::WorkerPlacement {
                worker: i as u32,
                node: w.node.clone(),
                gpus: w
                    .gpus
                    .iter()
                    .map(|s| pb::GpuSlot {
                        index: s.index,
                        milli: s.milli,
                        mig_compute: s.mig_compute,
                        mig_memory: s.mig_memory,
                    })
                    .collect(),
            })
            .collect()
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    Place,
    Wait,
    Reject,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    pub node: String,
    pub idle_gpus: u32,
    pub free_milli: u32,
    pub chosen: bool,
    pub score: Option<f64>,
}

/// Why one job was placed, left waiting or rejected: what Explain returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub id: u64,
    /// "cycle" or "advise".
    pub source: String,
    pub at_us: i64,
    /// The job's id: ours in primary mode, the caller's in Advise.
    pub job: String,
    pub spec: Job,
    pub policy: String,
    /// "heuristic:<policy>", "learned:<model>" or "fallback:<policy>".
    pub path: String,
    pub confidence: Option<f64>,
    pub verdict: Verdict,
    pub reason: String,
    pub placement: Vec<WorkerRecord>,
    pub queue_depth: u32,
    pub idle_gpus: u32,
    pub feasible_nodes: u32,
    pub candidates: Vec<CandidateRecord>,
}

/// At most this many candidates are recorded per decision.
pub const MAX_CANDIDATES: usize = 16;

/// The nodes where one worker of `job` fits on `state`, most idle GPUs first.
pub fn candidates(
    job: &Job,
    state: &crate::domain::ClusterState,
    chosen: &Placement,
) -> (u32, Vec<CandidateRecord>) {
    let topo = state.topology();
    let mut fit: Vec<crate::domain::NodeId> = topo
        .node_ids()
        .filter(|&n| state.worker_fits(job, n))
        .collect();
    let feasible = fit.len() as u32;
    fit.sort_by_key(|&n| {
        (
            !chosen.workers.iter().any(|w| w.node == n),
            std::cmp::Reverse(state.node_idle_gpus(n)),
            n,
        )
    });
    let list = fit
        .into_iter()
        .take(MAX_CANDIDATES)
        .map(|n| CandidateRecord {
            node: topo.node(n).name.clone(),
            idle_gpus: state.node_idle_gpus(n) as u32,
            free_milli: state.node_free_milli(n),
            chosen: chosen.workers.iter().any(|w| w.node == n),
            score: None,
        })
        .collect();
    (feasible, list)
}

impl DecisionRecord {
    pub fn to_pb(&self, catalog: &crate::domain::GpuCatalog) -> pb::Explanation {
        pb::Explanation {
            decision_id: self.id,
            source: self.source.clone(),
            at_us: self.at_us,
            job: self.job.clone(),
            spec: Some(crate::service::convert::spec_to_pb(
                &self.spec, catalog, None,
            )),
            policy: self.policy.clone(),
            path: self.path.clone(),
            confidence: self.confidence,
            verdict: verdict_to_pb(self.verdict) as i32,
            reason: self.reason.clone(),
            placement: WorkerRecord::to_pb(&self.placement),
            queue_depth: self.queue_depth,
            idle_gpus: self.idle_gpus,
            feasible_nodes: self.feasible_nodes,
            candidates: self
                .candidates
                .iter()
                .map(|c| pb::Candidate {
                    node: c.node.clone(),
                    idle_gpus: c.idle_gpus,
                    free_milli: c.free_milli,
                    chosen: c.chosen,
                    score: c.score,
                })
                .collect(),
        }
    }
}

pub fn verdict_to_pb(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Place => pb::Verdict::Place,
        Verdict::Wait => pb::Verdict::Wait,
        Verdict::Reject => pb::Verdict::Reject,
    }
}
