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
    /// `last_seen_us` on the monotonic clock (µs; see `core::wall_step_us`): what the
    /// timeout is measured with. Not persisted.
    #[serde(skip)]
    pub last_seen_steady_us: i64,
    /// `unreachable_since_us` on the monotonic clock: what the grace is measured with.
    /// Not persisted (derived from `unreachable_since_us` at start).
    #[serde(skip)]
    pub unreachable_since_steady_us: i64,
    /// Telemetry samples accepted since the server started (not persisted).
    #[serde(skip)]
    pub telemetry_samples: u64,
    /// Its last registration was refused (other hardware than the inventory's): it
    /// stays unreachable whatever else its agent sends until a registration succeeds.
    /// Not persisted (after a restart the node is as its stored record says).
    #[serde(skip)]
    pub refused: bool,
    /// Its agent's stop grace (µs) when it confirms that stopped workers ended
    /// (`service::stop_waits`); `None` when it does not. From its last registration;
    /// stored apart (table `stop_graces`), so the record's layout is unchanged.
    #[serde(skip)]
    pub confirms_stops_within_us: Option<i64>,
}

/// A node whose workers of a job's incarnation `attempt` were told to stop and have not
/// yet been confirmed ended (`service::stop_waits`), as stored, so that a restarted
/// scheduler keeps holding the job's next START.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredStopWait {
    pub node: String,
    pub attempt: u32,
    /// The grace-based deadline, µs since the epoch.
    pub until_us: i64,
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
    /// A running job moved to a new placement (primary mode; see [`MigrationRecord`]).
    Migrate,
}

/// What moved a running job.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationKind {
    /// `framework::consolidate`: the gang itself onto a tighter placement.
    Consolidate,
    /// `framework::rebalance`: out of the way of a gang blocked by fragmentation.
    Rebalance,
}

impl MigrationKind {
    pub fn name(self) -> &'static str {
        match self {
            MigrationKind::Consolidate => "consolidate",
            MigrationKind::Rebalance => "rebalance",
        }
    }
}

/// Why and from where a running job moved; the record's `placement` is where it went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MigrationRecord {
    pub kind: MigrationKind,
    /// The placement it left.
    pub from: Vec<WorkerRecord>,
    /// Consolidation: the topology levels the gang spanned before and after.
    pub from_span: Option<String>,
    pub to_span: Option<String>,
    /// Consolidation: predicted seconds saved over the rest of the run.
    pub gain_s: Option<f64>,
    /// Consolidation: the move was made because gain > cost × this.
    pub safety_factor: Option<f64>,
    /// Seconds the move costs the job: restart plus the time since its last checkpoint
    /// (consolidation: that work redone at the new speed).
    pub cost_s: f64,
    pub restart_s: f64,
    /// Wall-clock seconds since the last checkpoint its agent reported: the work the
    /// move throws away (0: none reported, counted as nothing lost).
    pub lost_work_s: f64,
    /// Rebalance: the blocked gang the move made room for (id and name).
    pub for_job: Option<String>,
    pub for_job_name: Option<String>,
}

impl MigrationRecord {
    pub fn to_pb(&self) -> pb::Migration {
        pb::Migration {
            kind: self.kind.name().into(),
            from: WorkerRecord::to_pb(&self.from),
            from_span: self.from_span.clone().unwrap_or_default(),
            to_span: self.to_span.clone().unwrap_or_default(),
            gain_s: self.gain_s,
            safety_factor: self.safety_factor,
            cost_s: self.cost_s,
            restart_s: self.restart_s,
            lost_work_s: self.lost_work_s,
            for_job: self.for_job.clone().unwrap_or_default(),
            for_job_name: self.for_job_name.clone().unwrap_or_default(),
        }
    }

    /// Why it moved, in words: the job history's reason says "migrated to " this.
    pub fn why(&self) -> String {
        match self.kind {
            MigrationKind::Consolidate => format!(
                "a tighter placement ({} → {}): predicted gain {:.0} s > cost {:.0} s × safety {}",
                self.from_span.as_deref().unwrap_or("?"),
                self.to_span.as_deref().unwrap_or("?"),
                self.gain_s.unwrap_or(0.0),
                self.cost_s,
                self.safety_factor.unwrap_or(0.0),
            ),
            MigrationKind::Rebalance => format!(
                "make room for job {} ({}); cost {:.0} s",
                self.for_job.as_deref().unwrap_or("?"),
                self.for_job_name.as_deref().unwrap_or(""),
                self.cost_s,
            ),
        }
    }

    /// The move in words, for the decision log's `reason` column (which has no columns
    /// of its own for it).
    pub fn describe(&self) -> String {
        let from = self
            .from
            .iter()
            .map(|w| {
                let gpus: Vec<String> = w.gpus.iter().map(|g| g.index.to_string()).collect();
                format!("{}:{}", w.node, gpus.join(","))
            })
            .collect::<Vec<_>>()
            .join(";");
        format!(
            "{} from {from} to {} (restart {:.0} s + lost work {:.0} s)",
            self.kind.name(),
            self.why(),
            self.restart_s,
            self.lost_work_s
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateRecord {
    pub node: String,
    pub idle_gpus: u32,
    pub free_milli: u32,
    pub chosen: bool,
    /// The policy's score for the node, when it has one (learned: the network's
    /// probability of the best candidate placement that uses the node).
    pub score: Option<f64>,
}

/// One candidate placement the learned policy ranked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoredCandidateRecord {
    /// The node of each worker; empty for the "wait" action.
    pub nodes: Vec<String>,
    pub wait: bool,
    /// Whether this is the fallback heuristic's placement.
    pub fallback_choice: bool,
    /// Whether this is the placement the decision used.
    pub chosen: bool,
    /// The network's logit and softmax probability (absent when it scored nothing).
    pub logit: Option<f64>,
    pub probability: Option<f64>,
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
    /// Content hash of the model artifact that served the decision (learned policy).
    #[serde(default)]
    pub model_version: Option<String>,
    /// The gate's margin threshold the confidence was compared with.
    #[serde(default)]
    pub gate_threshold: Option<f64>,
    /// What the candidates' scores are, or why there are none.
    #[serde(default)]
    pub score_note: String,
    /// The learned policy's candidate placements with their network scores.
    #[serde(default)]
    pub scored: Vec<ScoredCandidateRecord>,
    /// With [`Verdict::Migrate`]: the move's origin and reasons. Absent from records
    /// stored before migrations were recorded. (Always written: the stored layout is
    /// positional, see `service::codec`.)
    #[serde(default)]
    pub migration: Option<MigrationRecord>,
    /// The featurised decision, for the Parquet decision log only: kept out of the
    /// database (Explain does not need ~1 KB of floats per decision).
    #[serde(skip)]
    pub features: Option<crate::decision_log::LoggedFeatures>,
}

/// At most this many candidates are recorded per decision.
pub const MAX_CANDIDATES: usize = 16;

/// Scores `list` (whose nodes are `ids`) with the placer's own node score, when it has
/// one (a separate random stream: the schedule never depends on it). Returns whether
/// it had one.
pub fn score_candidates(
    placer: &dyn crate::framework::Placer,
    job: &Job,
    state: &crate::domain::ClusterState,
    ids: &[crate::domain::NodeId],
    list: &mut [CandidateRecord],
    now_s: f64,
) -> bool {
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(0);
    let mut ctx = crate::framework::Context::new(now_s, &mut rng);
    match placer.node_scores(job, ids, state, &mut ctx) {
        Some(scores) if scores.len() == list.len() => {
            for (c, s) in list.iter_mut().zip(scores) {
                c.score = s.is_finite().then_some(s);
            }
            true
        }
        _ => false,
    }
}

/// What a heuristic decision's `score_note` says.
pub fn heuristic_score_note(policy: &str, scored: bool) -> String {
    if scored {
        format!(
            "{policy}: the heuristic's node score (higher is preferred; ties broken by its tie-break), on the cluster before the decisions"
        )
    } else {
        format!("no score: the {policy} heuristic exposes no per-candidate score")
    }
}

/// The nodes where one worker of `job` fits on `state`, most idle GPUs first (with
/// their ids, in the same order). With `cpu_nodes_first` (the policy's rule, see
/// [`crate::framework::CpuNodesFirst`]) and a CPU-only job placed on CPU-only nodes
/// only, the placer was shown only those: so are the candidates, and the feasible count.
pub fn candidates(
    job: &Job,
    state: &crate::domain::ClusterState,
    chosen: &Placement,
    cpu_nodes_first: bool,
) -> (u32, Vec<CandidateRecord>, Vec<crate::domain::NodeId>) {
    let topo = state.topology();
    let cpu_nodes_only = cpu_nodes_first
        && job.gpu == crate::domain::GpuDemand::None
        && !chosen.workers.is_empty()
        && chosen
            .workers
            .iter()
            .all(|w| topo.node(w.node).model.is_none());
    let shown = |n: crate::domain::NodeId| !cpu_nodes_only || topo.node(n).model.is_none();
    let is_chosen = |n: crate::domain::NodeId| chosen.workers.iter().any(|w| w.node == n);
    // This runs for every decision, over every node of the cluster. Nodes come in id
    // order, so once the list holds MAX_CANDIDATES unchosen nodes with every GPU idle
    // and no chosen node is still to come, no later node can enter it (its key is at
    // least (unchosen, as idle, larger id)): the rest is only counted, which is what
    // keeps a mostly idle large cluster cheap.
    let most_idle = std::cmp::Reverse(topo.max_node_gpus());
    let last_chosen = chosen.workers.iter().map(|w| w.node).max();
    let read = std::cell::Cell::new((0u32, None::<crate::domain::NodeId>));
    let mut fitting = state.fitting_nodes(job).filter(|&n| shown(n));
    let best = crate::framework::smallest_k_until(
        &mut fitting
            .by_ref()
            .inspect(|&n| read.set((read.get().0 + 1, Some(n))))
            .map(|n| (!is_chosen(n), std::cmp::Reverse(state.node_idle_gpus(n)), n)),
        MAX_CANDIDATES,
        |best| {
            best.len() == MAX_CANDIDATES
                && best
                    .last()
                    .is_some_and(|worst| worst.0 && worst.1 == most_idle)
                && read.get().1 >= last_chosen
        },
    );
    let feasible = read.get().0 + fitting.count() as u32;
    let fit: Vec<crate::domain::NodeId> = best.into_iter().map(|(_, _, n)| n).collect();
    let list = fit
        .iter()
        .map(|&n| CandidateRecord {
            node: topo.node(n).name.clone(),
            idle_gpus: state.node_idle_gpus(n) as u32,
            free_milli: state.node_free_milli(n),
            chosen: chosen.workers.iter().any(|w| w.node == n),
            score: None,
        })
        .collect();
    (feasible, list, fit)
}

/// A traced decision's candidates as records (node names from `topo`); `placement` is
/// the one executed.
pub fn scored_candidates(
    t: &crate::policies::learned::DecisionTrace,
    placement: Option<&Placement>,
    topo: &Topology,
) -> Vec<ScoredCandidateRecord> {
    t.candidates
        .iter()
        .map(|c| ScoredCandidateRecord {
            nodes: c
                .placement
                .as_ref()
                .map(|p| {
                    p.workers
                        .iter()
                        .map(|w| topo.node(w.node).name.clone())
                        .collect()
                })
                .unwrap_or_default(),
            wait: c.placement.is_none(),
            fallback_choice: c.fallback,
            chosen: c.placement.is_some() && c.placement.as_ref() == placement,
            logit: c.logit.map(f64::from),
            probability: c.probability.map(f64::from),
        })
        .collect()
}

/// The learned policy's score note; gives each node in `list` the highest probability
/// among the scored placements that use it.
pub fn learned_score_note(
    list: &mut [CandidateRecord],
    scored: &[ScoredCandidateRecord],
    path_label: &str,
) -> String {
    if !scored.iter().any(|c| c.probability.is_some()) {
        return format!(
            "no score: the network scored no candidate ({path_label}); the fallback decided"
        );
    }
    for c in list {
        c.score = scored
            .iter()
            .filter(|s| s.nodes.contains(&c.node))
            .filter_map(|s| s.probability)
            .reduce(f64::max);
    }
    "learned: a node's score is the network's probability of the best candidate placement using it; scored_candidates has every candidate's logit and probability; confidence is the gate's margin between the two best".to_string()
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
            model_version: self.model_version.clone().unwrap_or_default(),
            gate_threshold: self.gate_threshold,
            score_note: self.score_note.clone(),
            scored_candidates: self
                .scored
                .iter()
                .map(|c| pb::ScoredCandidate {
                    nodes: c.nodes.clone(),
                    wait: c.wait,
                    fallback_choice: c.fallback_choice,
                    chosen: c.chosen,
                    logit: c.logit,
                    probability: c.probability,
                })
                .collect(),
            migration: self.migration.as_ref().map(MigrationRecord::to_pb),
        }
    }

    /// The decision-log row of this decision.
    pub fn log_row(&self) -> crate::decision_log::DecisionRow {
        use crate::domain::{CommPattern, GpuDemand};
        let j = &self.spec;
        let (gpu_kind, per_worker) = match j.gpu {
            GpuDemand::None => ("none", 0),
            GpuDemand::Whole(n) => ("whole", u32::from(n) * 1000),
            GpuDemand::Milli(m) => ("milli", u32::from(m)),
            GpuDemand::Mig { .. } => ("mig", j.gpu.milli()),
        };
        let comm = match j.comm {
            CommPattern::None => "none",
            CommPattern::DataParallel => "data-parallel",
            CommPattern::TensorParallel => "tensor-parallel",
            CommPattern::PipelineParallel => "pipeline-parallel",
        };
        let gpus = self
            .placement
            .iter()
            .map(|w| {
                let list: Vec<String> = w
                    .gpus
                    .iter()
                    .map(|g| {
                        if g.milli >= 1000 || g.milli == 0 {
                            g.index.to_string()
                        } else {
                            format!("{}@{}", g.index, g.milli)
                        }
                    })
                    .collect();
                format!("{}:{}", w.node, list.join(","))
            })
            .collect::<Vec<_>>()
            .join(";");
        crate::decision_log::DecisionRow {
            decision_id: self.id,
            at_us: self.at_us,
            job_id: self.job.clone(),
            job_name: j.name.clone(),
            tenant: j.tenant.clone(),
            priority: j.priority,
            workers: j.workers,
            gpu_kind: gpu_kind.into(),
            gpu_milli_per_worker: per_worker,
            cpu_milli: j.cpu_milli,
            memory_mib: j.memory_mib,
            comm: comm.into(),
            preemptible: j.preemptible,
            queue_depth: self.queue_depth,
            idle_gpus: self.idle_gpus,
            feasible_nodes: self.feasible_nodes,
            verdict: match self.verdict {
                Verdict::Place => "place",
                Verdict::Wait => "wait",
                Verdict::Reject => "reject",
                Verdict::Migrate => "migrate",
            }
            .into(),
            // A migration's origin and numbers have no columns: they go in the reason.
            reason: match &self.migration {
                Some(m) => m.describe(),
                None => self.reason.clone(),
            },
            nodes: self
                .placement
                .iter()
                .map(|w| w.node.as_str())
                .collect::<Vec<_>>()
                .join(","),
            gpus,
            gpu_milli_placed: self
                .placement
                .iter()
                .flat_map(|w| w.gpus.iter())
                .map(|g| u64::from(g.milli))
                .sum(),
            path: self.path.clone(),
            confidence: self.confidence,
            policy: self.policy.clone(),
            model_version: self.model_version.clone(),
            features: self.features.clone(),
        }
    }
}

pub fn verdict_to_pb(v: Verdict) -> pb::Verdict {
    match v {
        Verdict::Place => pb::Verdict::Place,
        Verdict::Wait => pb::Verdict::Wait,
        Verdict::Reject => pb::Verdict::Reject,
        Verdict::Migrate => pb::Verdict::Migrate,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{
        ClusterSpec, ClusterState, GpuDemand, GpuId, GpuShare, JobId, NodeId, Topology,
        WorkerPlacement,
    };

    fn one_worker(id: u32, gpus: u32) -> Job {
        Job {
            workers: 1,
            gpu: GpuDemand::Whole(gpus as _),
            ..Job::whole_gpus(JobId(id), 1, 0.0, 0.0)
        }
    }

    fn forty_h100_nodes() -> Arc<Topology> {
        let spec = ClusterSpec::from_toml(
            "name='c'\n[[nodes]]\ncount=40\ngpu_model='H100'\ngpus=8\ncpu_milli=224000\nmemory_mib=2097152\n",
        )
        .unwrap();
        Arc::new(Topology::build(&spec).unwrap())
    }

    /// 40 nodes of 8 GPUs, node `i` with `(7 * i) % 9` GPUs taken: many ties in idle
    /// GPUs, so the node-id tie-break matters.
    fn uneven_state() -> ClusterState {
        let topo = forty_h100_nodes();
        let mut state = ClusterState::new(topo.clone());
        for i in 0..40u32 {
            let taken = (7 * i) % 9;
            if taken == 0 {
                continue;
            }
            let n = NodeId(i);
            let gpus = topo.node(n).gpus.clone().take(taken as usize);
            let job = one_worker(1000 + i, taken);
            let placement = Placement {
                workers: vec![WorkerPlacement {
                    node: n,
                    gpus: gpus.map(|g| GpuShare::whole(GpuId(g))).collect(),
                }],
            };
            state.allocate(&job, &placement).unwrap();
        }
        state
    }

    #[test]
    fn candidates_are_the_head_of_a_full_sort_chosen_nodes_first() {
        let state = uneven_state();
        let job = one_worker(1, 2);
        let chosen = Placement {
            workers: vec![WorkerPlacement {
                node: NodeId(33),
                gpus: vec![],
            }],
        };
        let (feasible, list, ids) = candidates(&job, &state, &chosen, false);
        let mut reference: Vec<NodeId> = state
            .topology()
            .node_ids()
            .filter(|&n| state.worker_fits(&job, n))
            .collect();
        assert_eq!(feasible as usize, reference.len());
        assert!(reference.len() > MAX_CANDIDATES, "the test needs a cut");
        reference.sort_by_key(|&n| {
            (
                n != NodeId(33),
                std::cmp::Reverse(state.node_idle_gpus(n)),
                n,
            )
        });
        reference.truncate(MAX_CANDIDATES);
        assert_eq!(ids, reference);
        assert_eq!(list.len(), MAX_CANDIDATES);
        assert!(list[0].chosen && list[1..].iter().all(|c| !c.chosen));
        assert!(
            list[1..]
                .windows(2)
                .all(|w| w[0].idle_gpus >= w[1].idle_gpus)
        );
    }

    /// 40 idle nodes of 8 GPUs with `busy` of them partly taken.
    fn mostly_idle(busy: &[u32]) -> ClusterState {
        let topo = forty_h100_nodes();
        let mut state = ClusterState::new(topo.clone());
        for &i in busy {
            let n = NodeId(i);
            let job = one_worker(2000 + i, 3);
            let placement = Placement {
                workers: vec![WorkerPlacement {
                    node: n,
                    gpus: topo
                        .node(n)
                        .gpus
                        .clone()
                        .take(3)
                        .map(|g| GpuShare::whole(GpuId(g)))
                        .collect(),
                }],
            };
            state.allocate(&job, &placement).unwrap();
        }
        state
    }

    /// The early stop (a full list of unchosen, all-idle nodes) gives the same list and
    /// count as a full sort, wherever the chosen nodes are.
    #[test]
    fn candidates_on_a_mostly_idle_cluster_match_a_full_sort_wherever_the_choice_is() {
        let patterns: [&[u32]; 4] = [
            &[],
            &[0, 1, 2, 3, 4, 5],
            &[1, 3, 5, 7, 9, 11, 13, 38],
            &[39],
        ];
        for busy in patterns {
            let state = mostly_idle(busy);
            for chosen_nodes in [
                vec![],
                vec![0],
                vec![17],
                vec![39],
                vec![2, 39],
                vec![38, 39],
            ] {
                let job = one_worker(1, 2);
                let chosen = Placement {
                    workers: chosen_nodes
                        .iter()
                        .map(|&n| WorkerPlacement {
                            node: NodeId(n),
                            gpus: vec![],
                        })
                        .collect(),
                };
                let (feasible, _, ids) = candidates(&job, &state, &chosen, false);
                let mut reference: Vec<NodeId> = state
                    .topology()
                    .node_ids()
                    .filter(|&n| state.worker_fits(&job, n))
                    .collect();
                assert_eq!(
                    feasible as usize,
                    reference.len(),
                    "{busy:?} {chosen_nodes:?}"
                );
                reference.sort_by_key(|&n| {
                    (
                        !chosen_nodes.contains(&n.0),
                        std::cmp::Reverse(state.node_idle_gpus(n)),
                        n,
                    )
                });
                reference.truncate(MAX_CANDIDATES);
                assert_eq!(ids, reference, "{busy:?} {chosen_nodes:?}");
            }
        }
    }
}

#[cfg(test)]
mod cpu_nodes_first_tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{
        ClusterSpec, ClusterState, GpuDemand, JobId, NodeId, Topology, WorkerPlacement,
    };

    /// Two 8-GPU nodes (ids 0, 1), then three CPU-only nodes (ids 2, 3, 4).
    fn mixed() -> ClusterState {
        let spec = ClusterSpec::from_toml(
            "name='m'\n[[nodes]]\ncount=2\ngpu_model='V100M32'\ngpus=8\ncpu_milli=128000\nmemory_mib=524288\n\
             [[nodes]]\ncount=3\ncpu_milli=64000\nmemory_mib=65536\n",
        )
        .unwrap();
        ClusterState::new(Arc::new(Topology::build(&spec).unwrap()))
    }

    fn cpu_job() -> Job {
        let mut j = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        (j.gpu, j.cpu_milli, j.memory_mib) = (GpuDemand::None, 8000, 1024);
        j
    }

    fn on(node: u32) -> Placement {
        Placement {
            workers: vec![WorkerPlacement {
                node: NodeId(node),
                gpus: vec![],
            }],
        }
    }

    #[test]
    fn with_the_rule_a_cpu_job_on_a_cpu_node_lists_only_the_cpu_nodes_it_was_offered() {
        let state = mixed();
        let (feasible, _, ids) = candidates(&cpu_job(), &state, &on(3), true);
        assert_eq!(feasible, 3);
        assert_eq!(ids, vec![NodeId(3), NodeId(2), NodeId(4)]);
        // Without the rule every node that fits is a candidate, GPU nodes first (most
        // idle GPUs).
        let (feasible, _, ids) = candidates(&cpu_job(), &state, &on(3), false);
        assert_eq!(feasible, 5);
        assert_eq!(ids[..3], [NodeId(3), NodeId(0), NodeId(1)]);
        // Spilled over onto a GPU node (the rule's fallback), or not placed: the placer
        // saw the whole cluster.
        assert_eq!(candidates(&cpu_job(), &state, &on(0), true).0, 5);
        assert_eq!(
            candidates(&cpu_job(), &state, &Placement::default(), true).0,
            5
        );
    }
}
