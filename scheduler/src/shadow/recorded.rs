//! The incumbent's side: its recorded decisions as a policy the simulator can replay.

use std::collections::HashMap;

use crate::domain::{
    Checkpointing, ClusterState, DomainError, Job, JobId, NodeId, Placement, Topology,
    WorkerPlacement,
};
use crate::framework::{
    Context, JobStats, Placer, Policy, QueueOrder, Rank, Status, pick_gpus_best_fit,
};

/// Name of the incumbent's replay in reports.
pub const INCUMBENT: &str = "incumbent";

/// What the incumbent did with one job, in the trace's clock (that of
/// [`Job::submit_time`], which is the job's creation).
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// When it started; `None`: never scheduled.
    pub scheduled: Option<f64>,
    /// When it ended (deleted, finished).
    pub ended: f64,
    /// The node it ran on, when the log says.
    pub node: Option<String>,
}

/// The jobs both replays run: those the incumbent scheduled.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Arriving at their recorded start.
    pub incumbent: Vec<Job>,
    /// Arriving at their creation.
    pub marshal: Vec<Job>,
    /// Index in the log of each replayed job (same order as the two lists).
    pub index: Vec<usize>,
    /// Recorded node of each replayed job.
    pub nodes: Vec<Option<String>>,
}

impl Prepared {
    /// Log index of each replayed job id.
    pub fn by_id(&self) -> HashMap<JobId, usize> {
        self.marshal
            .iter()
            .zip(&self.index)
            .map(|(j, &i)| (j.id, i))
            .collect()
    }
}

/// The checkpointing of a replayed job: no restart delay and no checkpoint stalls, so
/// that it runs exactly its recorded time; periodic checkpoints every half hour still
/// bound what a preemption loses.
fn replay_checkpointing() -> Checkpointing {
    Checkpointing {
        interval_s: 1800.0,
        cost_s: 0.0,
        restart_s: 0.0,
        on_preempt: false,
    }
}

/// Splits the log into the two replays' job lists. Each scheduled job's work is its
/// recorded run time (`ended − scheduled`, at speed 1). Job ids must be unique.
pub fn shadow_jobs(jobs: &[Job], recorded: &[Recorded]) -> Result<Prepared, DomainError> {
    let mut seen = std::collections::HashSet::new();
    let mut p = Prepared {
        incumbent: Vec::new(),
        marshal: Vec::new(),
        index: Vec::new(),
        nodes: Vec::new(),
    };
    for (i, (job, rec)) in jobs.iter().zip(recorded).enumerate() {
        if !seen.insert(job.id) {
            return Err(DomainError::Invalid(format!("job id {} repeats", job.id.0)));
        }
        let Some(start) = rec.scheduled else {
            continue;
        };
        if !(start.is_finite() && rec.ended.is_finite() && start >= job.submit_time) {
            return Err(DomainError::Invalid(format!(
                "job {}: recorded start {start} is before its creation {} or not finite",
                job.name, job.submit_time
            )));
        }
        let mut m = job.clone();
        m.total_work = (rec.ended - start).max(0.0);
        m.checkpoint = replay_checkpointing();
        let mut inc = m.clone();
        inc.submit_time = start;
        p.marshal.push(m);
        p.incumbent.push(inc);
        p.index.push(i);
        p.nodes.push(rec.node.clone());
    }
    Ok(p)
}

/// Places a job on its recorded node when the log names one (the fullest GPUs there
/// that fit), else as `fallback` does. A recorded node without room now is
/// "unschedulable now": the job waits for room on that node.
#[derive(Debug)]
pub struct RecordedPlacer {
    nodes: HashMap<JobId, NodeId>,
    fallback: Box<dyn Placer>,
}

impl RecordedPlacer {
    pub fn new(nodes: HashMap<JobId, NodeId>, fallback: Box<dyn Placer>) -> Self {
        RecordedPlacer { nodes, fallback }
    }
}

impl Placer for RecordedPlacer {
    fn place(
        &self,
        job: &Job,
        state: &mut ClusterState,
        ctx: &mut Context,
    ) -> Result<Placement, Status> {
        let Some(&node) = self.nodes.get(&job.id).filter(|_| job.workers == 1) else {
            return self.fallback.place(job, state, ctx);
        };
        let name = &state.topology().node(node).name;
        if !state.worker_fits(job, node) {
            return Err(Status::Unschedulable(format!(
                "recorded node {name} has no room now"
            )));
        }
        let gpus = pick_gpus_best_fit(job, node, state).ok_or_else(|| {
            Status::Unschedulable(format!("recorded node {name} has no GPU that fits now"))
        })?;
        Ok(Placement {
            workers: vec![WorkerPlacement { node, gpus }],
        })
    }
}

/// Recorded-start order, each job in a priority class of its own. The cycle skips a job
/// whose shape and class already found no room in the same cycle, which is right when
/// placement depends on the shape alone but not when jobs are bound to recorded nodes:
/// one full node must not hold up a same-shaped job recorded on another. (Classes only
/// matter for preemption, and the incumbent replay preempts nothing.)
#[derive(Debug)]
pub struct RecordedOrder {
    position: HashMap<JobId, i64>,
}

impl RecordedOrder {
    /// `jobs` arrive at their recorded start (their `submit_time`).
    pub fn new(jobs: &[Job]) -> Self {
        let mut order: Vec<&Job> = jobs.iter().collect();
        order.sort_by(|a, b| {
            a.submit_time
                .total_cmp(&b.submit_time)
                .then(a.id.cmp(&b.id))
        });
        RecordedOrder {
            position: order
                .iter()
                .enumerate()
                .map(|(i, j)| (j.id, i as i64))
                .collect(),
        }
    }
}

impl QueueOrder for RecordedOrder {
    fn rank(&self, job: &Job, _: &JobStats, _: f64) -> Rank {
        let position = self.position.get(&job.id).copied().unwrap_or(i64::MAX);
        (position, job.submit_time)
    }
}

/// The incumbent's replay policy and the name of the heuristic behind it.
#[derive(Debug)]
pub struct IncumbentPolicy {
    pub policy: Policy,
    /// `recorded-node+<placer>`.
    pub placer_name: String,
}

/// The incumbent's recorded decisions as a policy: jobs (which arrive at their recorded
/// start) go in arrival order with backfilling, so one that finds no room does not hold
/// up later ones; nobody is preempted; each goes to its recorded node, else where
/// `placer`'s placer puts it. Returns how many recorded nodes the cluster does not have
/// (those jobs are placed by `placer`).
pub fn recorded_policy(topo: &Topology, jobs: &Prepared, placer: Policy) -> (IncumbentPolicy, u64) {
    let by_name: HashMap<&str, NodeId> = topo
        .node_ids()
        .map(|n| (topo.node(n).name.as_str(), n))
        .collect();
    let mut nodes = HashMap::new();
    let mut unknown = 0;
    for (job, node) in jobs.incumbent.iter().zip(&jobs.nodes) {
        if let Some(name) = node {
            match by_name.get(name.as_str()) {
                Some(&n) => {
                    nodes.insert(job.id, n);
                }
                None => unknown += 1,
            }
        }
    }
    let placer_name = format!("recorded-node+{}", placer.name);
    (
        IncumbentPolicy {
            policy: Policy {
                name: INCUMBENT.into(),
                order: Box::new(RecordedOrder::new(&jobs.incumbent)),
                placer: Box::new(RecordedPlacer::new(nodes, placer.placer)),
                preemptor: None,
                blocking: false,
                reservation: None,
                rebalance: None,
                consolidate: None,
                quota: None,
            },
            placer_name,
        },
        unknown,
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::{ClusterSpec, GpuDemand};
    use crate::sim::{LogKind, SimConfig, SpeedModel, run_replay};

    fn topo() -> Arc<Topology> {
        let spec = ClusterSpec::from_toml(
            "name='c'\nnodes_per_rack=2\n[[nodes]]\ncount=2\ngpu_model='V100M32'\ngpus=2\n\
             nvlink_domain=0\ncpu_milli=64000\nmemory_mib=262144\n",
        )
        .unwrap();
        Arc::new(Topology::build(&spec).unwrap())
    }

    fn job(id: u32, gpus: u32, created: f64) -> Job {
        let mut j = Job::whole_gpus(JobId(id), gpus, created, 0.0);
        j.name = format!("j{id}");
        j
    }

    fn rec(scheduled: Option<f64>, ended: f64, node: Option<&str>) -> Recorded {
        Recorded {
            scheduled,
            ended,
            node: node.map(String::from),
        }
    }

    fn replay(jobs: &[Job], recs: &[Recorded]) -> (Vec<crate::sim::LogEntry>, u64) {
        let topo = topo();
        let prepared = shadow_jobs(jobs, recs).unwrap();
        let fallback = crate::policies::build("best-fit", &[]).unwrap();
        let (policy, unknown) = recorded_policy(&topo, &prepared, fallback);
        let config = SimConfig {
            speed: SpeedModel {
                recorded_durations: true,
                ..SpeedModel::default()
            },
            ..SimConfig::replay(1)
        };
        let (_, log) = run_replay(&policy.policy, topo, &prepared.incumbent, "t", &config).unwrap();
        (log, unknown)
    }

    fn starts(log: &[crate::sim::LogEntry]) -> Vec<(u32, f64, String)> {
        log.iter()
            .filter_map(|e| match &e.what {
                LogKind::Start(p) => Some((e.job.0, e.time, format!("n{}", p.workers[0].node.0))),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn jobs_start_at_their_recorded_time_for_their_recorded_run_time() {
        let jobs = [job(0, 1, 0.0), job(1, 2, 5.0), job(2, 1, 7.0)];
        let recs = [
            rec(Some(10.0), 110.0, None),
            rec(Some(20.0), 50.0, None),
            rec(None, 9.0, None),
        ];
        let (log, _) = replay(&jobs, &recs);
        let s = starts(&log);
        assert_eq!(
            s.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            [(0, 10.0), (1, 20.0)]
        );
        let finish: Vec<(u32, f64)> = log
            .iter()
            .filter(|e| e.what == LogKind::Finish)
            .map(|e| (e.job.0, e.time))
            .collect();
        assert_eq!(
            finish,
            [(1, 50.0), (0, 110.0)],
            "runs last ended − scheduled"
        );
    }

    #[test]
    fn recorded_nodes_are_honoured_and_a_full_one_delays_the_start() {
        // Job 1 was recorded on node 0 while job 0 still held both its GPUs there: our
        // model cannot start it then, so it starts when job 0 ends, never earlier.
        let jobs = [job(0, 2, 0.0), job(1, 1, 0.0), job(2, 1, 0.0)];
        let recs = [
            rec(Some(0.0), 100.0, Some("node-0")),
            rec(Some(10.0), 20.0, Some("node-0")),
            rec(Some(10.0), 20.0, Some("nowhere")),
        ];
        let (log, unknown) = replay(&jobs, &recs);
        assert_eq!(unknown, 1);
        let s = starts(&log);
        assert_eq!(s[0], (0, 0.0, "n0".into()));
        assert_eq!(
            s[1].0, 2,
            "the unknown node's job is placed by the fallback"
        );
        assert_eq!((s[1].1, s[1].2.as_str()), (10.0, "n1"));
        assert_eq!(s[2], (1, 100.0, "n0".into()));
    }

    #[test]
    fn unscheduled_jobs_are_left_out_and_bad_records_are_errors() {
        let jobs = [job(0, 1, 0.0), job(1, 1, 3.0)];
        let p = shadow_jobs(&jobs, &[rec(None, 5.0, None), rec(Some(4.0), 6.0, None)]).unwrap();
        assert_eq!(p.index, [1]);
        assert_eq!(
            (p.marshal[0].submit_time, p.incumbent[0].submit_time),
            (3.0, 4.0)
        );
        assert_eq!(p.marshal[0].total_work, 2.0);
        assert!(p.marshal[0].gpu == GpuDemand::Whole(1));
        let err = shadow_jobs(&jobs, &[rec(None, 5.0, None), rec(Some(1.0), 6.0, None)]);
        assert!(err.unwrap_err().to_string().contains("before its creation"));
    }
}
