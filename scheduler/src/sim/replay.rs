//! Replay: jobs arrive at their trace times and run to completion.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::domain::{
    ClusterState, DomainError, Job, JobId, NodeId, Placement, TopoLevel, Topology,
};
use crate::framework::{
    ConsolidateConfig, Context, JobStats, Pending, Policy, Running, can_ever_fit, run_cycle,
};
use crate::sim::metrics::{mean, percentile};
use crate::sim::{FAILURE_STREAM, POLICY_STREAM, SimConfig, SimResult};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum EventKind {
    Arrival(u32),
    Finish {
        job: u32,
        epoch: u32,
    },
    RankChange {
        job: u32,
        epoch: u32,
    },
    /// A preemption protection ends; the decision may change.
    Wake,
    NodeDown(u32),
    NodeUp(u32),
}

#[derive(Copy, Clone, Debug)]
struct Event {
    time: f64,
    seq: u64,
    kind: EventKind,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed so that `BinaryHeap` pops the earliest event, first-scheduled on ties.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.seq.cmp(&self.seq))
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    Waiting,
    Pending,
    Running,
    Done,
    Rejected,
}

#[derive(Clone, Debug)]
struct JobRun {
    phase: Phase,
    placement: Option<Placement>,
    work_done: f64,
    work_at_run_start: f64,
    run_start: f64,
    productive_from: f64,
    seg_start: f64,
    speed_eff: f64,
    epoch: u32,
    first_start: Option<f64>,
    attained_gpu_s: f64,
    queued_since: f64,
    last_run_s: f64,
    finish: Option<f64>,
}

/// What happened to a job, in order: the schedule a run produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LogKind {
    Start(Placement),
    Preempt,
    /// Stopped to be moved (`framework::rebalance`); its `Start` on the new placement
    /// follows at the same time.
    Migrate,
    Fail,
    Finish,
    Reject(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub time: f64,
    pub job: JobId,
    pub what: LogKind,
}

#[derive(Copy, Clone, Debug)]
enum Interruption {
    Preemption,
    Failure,
}

/// Job kills by node failures per job after which a replay stops with an error: with
/// failures more frequent than the jobs' checkpoints and restarts allow, jobs never
/// finish and the replay would run (and log) forever.
const MAX_KILLS_PER_JOB: u64 = 1_000;

#[derive(Debug)]
struct Replay<'a> {
    policy: &'a Policy,
    config: &'a SimConfig,
    jobs: &'a [Job],
    state: ClusterState,
    runs: Vec<JobRun>,
    pending: Vec<u32>,
    running: Vec<u32>,
    heap: BinaryHeap<Event>,
    seq: u64,
    now: f64,
    shared_on_gpu: Vec<Vec<u32>>,
    policy_rng: rand_chacha::ChaCha8Rng,
    failure_rng: rand_chacha::ChaCha8Rng,
    log: Vec<LogEntry>,
    alloc_integral: f64,
    events: u64,
    preemptions: u64,
    migrations: u64,
    failures: u64,
    placement_errors: u64,
    lost_gpu_s: f64,
    multi_gpu_starts: u64,
    local_starts: u64,
    finished: usize,
    rejected: usize,
    arrivals_left: usize,
    next_wake: Option<f64>,
}

/// Runs `workload` on `topo` under `policy`, returning the measures and the schedule.
pub fn run_replay(
    policy: &Policy,
    topo: Arc<Topology>,
    workload: &[Job],
    trace: &str,
    config: &SimConfig,
) -> Result<(SimResult, Vec<LogEntry>), DomainError> {
    config.validate()?;
    for job in workload {
        job.validate()?;
    }
    let started = Instant::now();
    let blank = JobRun {
        phase: Phase::Waiting,
        placement: None,
        work_done: 0.0,
        work_at_run_start: 0.0,
        run_start: 0.0,
        productive_from: 0.0,
        seg_start: 0.0,
        speed_eff: 0.0,
        epoch: 0,
        first_start: None,
        attained_gpu_s: 0.0,
        queued_since: 0.0,
        last_run_s: 0.0,
        finish: None,
    };
    let mut sim = Replay {
        policy,
        config,
        jobs: workload,
        state: ClusterState::new(topo.clone()),
        runs: vec![blank; workload.len()],
        pending: Vec::new(),
        running: Vec::new(),
        heap: BinaryHeap::with_capacity(workload.len() * 2),
        seq: 0,
        now: 0.0,
        shared_on_gpu: vec![Vec::new(); topo.gpu_count() as usize],
        policy_rng: config.rng(POLICY_STREAM),
        failure_rng: config.rng(FAILURE_STREAM),
        log: Vec::with_capacity(workload.len() * 3),
        alloc_integral: 0.0,
        events: 0,
        preemptions: 0,
        migrations: 0,
        failures: 0,
        placement_errors: 0,
        lost_gpu_s: 0.0,
        multi_gpu_starts: 0,
        local_starts: 0,
        finished: 0,
        rejected: 0,
        arrivals_left: workload.len(),
        next_wake: None,
    };
    let mut order: Vec<u32> = (0..workload.len() as u32).collect();
    order.sort_by(|&a, &b| {
        workload[a as usize]
            .submit_time
            .total_cmp(&workload[b as usize].submit_time)
    });
    for j in order {
        sim.push(workload[j as usize].submit_time, EventKind::Arrival(j));
    }
    let first_submit = workload
        .iter()
        .map(|j| j.submit_time)
        .fold(f64::INFINITY, f64::min);
    if let Some(f) = config.failures {
        for n in 0..topo.nodes().len() as u32 {
            let t = first_submit.max(0.0) + sim.exponential(f.mtbf_s);
            sim.push(t, EventKind::NodeDown(n));
        }
    }
    sim.run()?;
    Ok((sim.result(trace, first_submit, started), sim.log))
}

impl Replay<'_> {
    fn push(&mut self, time: f64, kind: EventKind) {
        self.seq += 1;
        self.heap.push(Event {
            time,
            seq: self.seq,
            kind,
        });
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        let u: f64 = self.failure_rng.random_range(f64::EPSILON..1.0);
        -mean * u.ln()
    }

    /// Runs every event until each job has finished or been rejected; an error if node
    /// failures kill the jobs so often that they could never finish.
    fn run(&mut self) -> Result<(), DomainError> {
        let total = self.jobs.len();
        let most_kills = MAX_KILLS_PER_JOB * total.max(1) as u64;
        while let Some(event) = self.heap.pop() {
            if self.failures > most_kills {
                let mtbf_h = self
                    .config
                    .failures
                    .map_or(f64::INFINITY, |f| f.mtbf_s / 3600.0);
                return Err(DomainError::Invalid(format!(
                    "node failures (MTBF {mtbf_h} h per node) killed running jobs {} times, \
                     more than {MAX_KILLS_PER_JOB} per job, with {} of {total} jobs still \
                     unfinished at {:.1} simulated hours: the jobs cannot finish between \
                     failures; the replay was stopped",
                    self.failures,
                    total - self.finished - self.rejected,
                    self.now / 3600.0
                )));
            }
            self.advance(event.time);
            let mut dirty = self.handle(event.kind);
            while let Some(next) = self.heap.peek().copied() {
                if next.time != event.time {
                    break;
                }
                self.heap.pop();
                dirty |= self.handle(next.kind);
            }
            if dirty {
                self.cycle();
                self.reject_stuck();
                self.wake_when_decisions_may_change();
            }
            if self.finished + self.rejected == total {
                break;
            }
        }
        Ok(())
    }

    fn advance(&mut self, time: f64) {
        if time > self.now {
            self.alloc_integral += self.state.allocated_milli() as f64 * (time - self.now);
            self.now = time;
        }
    }

    /// Applies one event; returns whether a scheduling cycle may now decide differently.
    fn handle(&mut self, kind: EventKind) -> bool {
        self.events += 1;
        match kind {
            EventKind::Arrival(j) => {
                self.arrivals_left -= 1;
                let job = &self.jobs[j as usize];
                if let Err(why) = can_ever_fit(job, self.state.topology()) {
                    self.reject(j, why);
                    return false;
                }
                let run = &mut self.runs[j as usize];
                run.phase = Phase::Pending;
                run.queued_since = self.now;
                self.pending.push(j);
                true
            }
            EventKind::Finish { job, epoch } => {
                let run = &self.runs[job as usize];
                if run.phase != Phase::Running || run.epoch != epoch {
                    return false;
                }
                self.integrate(job);
                let placement = self.stop(job);
                self.state.release(&self.jobs[job as usize], &placement);
                self.refresh_cotenants(&placement);
                let run = &mut self.runs[job as usize];
                run.phase = Phase::Done;
                run.finish = Some(self.now);
                run.work_done = self.jobs[job as usize].total_work;
                self.finished += 1;
                self.log(job, LogKind::Finish);
                true
            }
            EventKind::RankChange { job, epoch } => {
                let run = &self.runs[job as usize];
                if run.phase != Phase::Running || run.epoch != epoch {
                    return false;
                }
                self.schedule_rank_change(job);
                true
            }
            EventKind::Wake => {
                self.next_wake = None;
                true
            }
            EventKind::NodeDown(n) => {
                let node = NodeId(n);
                self.state.set_node_up(node, false);
                let hit: Vec<u32> = self
                    .running
                    .iter()
                    .copied()
                    .filter(|&j| {
                        self.runs[j as usize]
                            .placement
                            .as_ref()
                            .is_some_and(|p| p.workers.iter().any(|w| w.node == node))
                    })
                    .collect();
                for j in hit {
                    self.interrupt(j, Interruption::Failure);
                    let placement = self.stop(j);
                    self.state.release(&self.jobs[j as usize], &placement);
                    self.refresh_cotenants(&placement);
                    self.requeue(j);
                    self.failures += 1;
                    self.log(j, LogKind::Fail);
                }
                let repair = self.config.failures.map_or(0.0, |f| f.repair_s);
                let t = self.now + self.exponential(repair);
                self.push(t, EventKind::NodeUp(n));
                true
            }
            EventKind::NodeUp(n) => {
                self.state.set_node_up(NodeId(n), true);
                let mtbf = self.config.failures.map_or(f64::INFINITY, |f| f.mtbf_s);
                let t = self.now + self.exponential(mtbf);
                self.push(t, EventKind::NodeDown(n));
                true
            }
        }
    }

    /// Pending jobs may be waiting for a running job's preemption (or migration)
    /// protection to end, or for their own wait to make them owed a rebalance: make
    /// sure a cycle runs then, since nothing else may happen until much later.
    fn wake_when_decisions_may_change(&mut self) {
        let now = self.now;
        let consolidate_at = self.next_consolidation();
        if self.pending.is_empty() {
            if consolidate_at.is_finite() && self.next_wake.is_none_or(|w| consolidate_at < w) {
                self.next_wake = Some(consolidate_at);
                self.push(consolidate_at, EventKind::Wake);
            }
            return;
        }
        let after_protection = |min_runtime: f64| {
            if min_runtime <= 0.0 {
                return f64::INFINITY;
            }
            self.running
                .iter()
                .map(|&j| self.runs[j as usize].run_start + min_runtime)
                .filter(|&t| t > now)
                .fold(f64::INFINITY, f64::min)
        };
        let mut next = self
            .policy
            .preemptor
            .as_ref()
            .map_or(f64::INFINITY, |p| after_protection(p.min_runtime_s()))
            .min(consolidate_at);
        if let Some(rb) = &self.policy.rebalance {
            // Gangs that a rebalance could serve (blocked although enough GPUs are
            // idle): when each becomes owed one, and, once one is, when the next
            // running job may be moved.
            let idle = self.state.idle_gpus();
            let mut owed = false;
            for &j in &self.pending {
                let job = &self.jobs[j as usize];
                if job.gpu_count() > idle {
                    continue;
                }
                let stats = JobStats {
                    queued_since: self.runs[j as usize].queued_since,
                    ..JobStats::default()
                };
                if rb.applies(job, &stats, f64::INFINITY) {
                    let at = stats.queued_since + rb.after_wait_s;
                    if at > now {
                        next = next.min(at);
                    } else {
                        owed = true;
                    }
                }
            }
            if owed {
                next = next.min(after_protection(rb.min_runtime_s));
            }
        }
        if next.is_finite() && self.next_wake.is_none_or(|w| next < w) {
            self.next_wake = Some(next);
            self.push(next, EventKind::Wake);
        }
    }

    /// When the next consolidation pass is due (`framework::consolidate`): a running gang
    /// placed looser than it could be may become worth moving as it runs (the estimated
    /// remaining time grows with the time run) or when its protection ends, with no
    /// other event in between. Every `interval_s` while such a gang runs, and not before
    /// the first one's protection ends; never when none does.
    fn next_consolidation(&self) -> f64 {
        let Some(c) = &self.policy.consolidate else {
            return f64::INFINITY;
        };
        let mut earliest = f64::INFINITY;
        for &j in &self.running {
            let run = &self.runs[j as usize];
            let job = &self.jobs[j as usize];
            let placement = run
                .placement
                .as_ref()
                .expect("running jobs have placements");
            if ConsolidateConfig::is_loose_placement(job, placement, &self.state) {
                earliest = earliest.min((run.run_start + c.protect_s).max(self.now + c.interval_s));
            }
        }
        earliest
    }

    /// With every job arrived, nothing running and every node up, the cluster is as empty
    /// as it will ever be: what still waits can never run (its shape defeats the policy's
    /// placement), so it is rejected rather than waited on forever.
    fn reject_stuck(&mut self) {
        if !self.running.is_empty() || self.pending.is_empty() || self.arrivals_left > 0 {
            return;
        }
        if self.state.healthy_gpus() == self.state.topology().gpu_count() {
            for j in self.pending.clone() {
                self.reject(j, "cannot be placed even on the idle cluster".into());
            }
        }
    }

    fn reject(&mut self, j: u32, why: String) {
        self.runs[j as usize].phase = Phase::Rejected;
        self.rejected += 1;
        self.pending.retain(|&p| p != j);
        self.log(j, LogKind::Reject(why));
    }

    fn log(&mut self, j: u32, what: LogKind) {
        self.log.push(LogEntry {
            time: self.now,
            job: self.jobs[j as usize].id,
            what,
        });
    }

    fn stats(&self, j: u32) -> JobStats {
        let run = &self.runs[j as usize];
        let job = &self.jobs[j as usize];
        let (mut work, mut attained) = (run.work_done, run.attained_gpu_s);
        if run.phase == Phase::Running {
            work += run.speed_eff * (self.now - run.seg_start.max(run.productive_from)).max(0.0);
            attained += job.gpu_count() as f64 * (self.now - run.seg_start);
        }
        JobStats {
            attained_gpu_s: attained,
            remaining_work: (job.total_work - work).max(0.0),
            queued_since: run.queued_since,
            last_run_s: run.last_run_s,
        }
    }

    fn cycle(&mut self) {
        let decisions = {
            let pending_stats: Vec<JobStats> =
                self.pending.iter().map(|&j| self.stats(j)).collect();
            let running_info: Vec<(JobStats, f64)> = self
                .running
                .iter()
                .map(|&j| (self.stats(j), self.lost_if_preempted(j)))
                .collect();
            let (jobs, runs) = (self.jobs, &self.runs);
            let pending: Vec<Pending> = self
                .pending
                .iter()
                .zip(pending_stats)
                .map(|(&j, stats)| Pending {
                    job: &jobs[j as usize],
                    stats,
                })
                .collect();
            let running: Vec<Running> = self
                .running
                .iter()
                .zip(running_info)
                .map(|(&j, (stats, lost_work_s))| {
                    let run = &runs[j as usize];
                    Running {
                        job: &jobs[j as usize],
                        placement: run
                            .placement
                            .as_ref()
                            .expect("running jobs have placements"),
                        stats,
                        started_at: run.run_start,
                        lost_work_s,
                    }
                })
                .collect();
            let mut ctx = Context {
                speed: Some(&self.config.speed),
                ..Context::new(self.now, &mut self.policy_rng)
            };
            let d = run_cycle(self.policy, &mut self.state, &pending, &running, &mut ctx);
            // The job stays queued and is tried again; the count shows the bug.
            self.placement_errors += d.errors.len() as u64;
            let preempted: Vec<u32> = d.preempted.iter().map(|&k| self.running[k]).collect();
            // Consolidations are migrations too: same checkpoint-restart, same count.
            let migrated: Vec<(u32, Placement)> = d
                .migrated
                .into_iter()
                .chain(d.consolidated.into_iter().map(|c| (c.running, c.to)))
                .map(|(k, p)| (self.running[k], p))
                .collect();
            let placed: Vec<(u32, Placement)> = d
                .placed
                .into_iter()
                .map(|(i, p)| (self.pending[i], p))
                .collect();
            let rejected: Vec<(u32, String)> = d
                .rejected
                .into_iter()
                .map(|(i, w)| (self.pending[i], w))
                .collect();
            (preempted, migrated, placed, rejected)
        };
        let (preempted, migrated, placed, rejected) = decisions;
        for j in preempted {
            // The cycle already returned the victim's resources to the state.
            self.interrupt(j, Interruption::Preemption);
            let placement = self.stop(j);
            self.refresh_cotenants(&placement);
            self.requeue(j);
            self.preemptions += 1;
            self.log(j, LogKind::Preempt);
        }
        // A migration is a checkpoint-restart: the job loses what a preemption would
        // (nothing if it checkpoints when stopped, else the work since its last
        // checkpoint) and pays its restart again on the new placement. The cycle
        // already moved its resources.
        for (j, _) in &migrated {
            self.interrupt(*j, Interruption::Preemption);
            let placement = self.stop(*j);
            self.refresh_cotenants(&placement);
            self.migrations += 1;
            self.log(*j, LogKind::Migrate);
        }
        for (j, placement) in migrated {
            self.start(j, placement);
        }
        for (j, why) in rejected {
            self.reject(j, why);
        }
        let started: Vec<u32> = placed.iter().map(|(j, _)| *j).collect();
        self.pending.retain(|j| !started.contains(j));
        for (j, placement) in placed {
            self.start(j, placement);
        }
    }

    /// Progress the current run would keep if stopped now: what the last checkpoint saved.
    fn lost_if_stopped(&self, j: u32) -> f64 {
        let run = &self.runs[j as usize];
        let ckpt = &self.jobs[j as usize].checkpoint;
        let current = run.work_done
            + run.speed_eff * (self.now - run.seg_start.max(run.productive_from)).max(0.0);
        let this_run = current - run.work_at_run_start;
        let productive = (self.now - run.productive_from).max(0.0);
        let checkpoints = (productive / (ckpt.interval_s + ckpt.cost_s)).floor();
        let saved = (checkpoints * ckpt.interval_s * run.speed_eff).min(this_run);
        (this_run - saved).max(0.0)
    }

    /// What a preemption of `j` would lose: nothing for a job that checkpoints when told
    /// to stop, else what a failure would.
    fn lost_if_preempted(&self, j: u32) -> f64 {
        if self.jobs[j as usize].checkpoint.on_preempt {
            0.0
        } else {
            self.lost_if_stopped(j)
        }
    }

    fn integrate(&mut self, j: u32) {
        let gpus = self.jobs[j as usize].gpu_count() as f64;
        let now = self.now;
        let run = &mut self.runs[j as usize];
        let from = run.seg_start.max(run.productive_from);
        if now > from {
            run.work_done += run.speed_eff * (now - from);
        }
        run.attained_gpu_s += gpus * (now - run.seg_start);
        run.seg_start = now;
    }

    /// Rolls the current run back to its last checkpoint (or, for a preemption of a job
    /// that checkpoints when stopped, keeps it all).
    fn interrupt(&mut self, j: u32, why: Interruption) {
        let lost = match why {
            Interruption::Preemption => self.lost_if_preempted(j),
            Interruption::Failure => self.lost_if_stopped(j),
        };
        self.integrate(j);
        let gpus = self.jobs[j as usize].gpu_count() as f64;
        let run = &mut self.runs[j as usize];
        run.work_done = (run.work_done - lost).max(run.work_at_run_start);
        self.lost_gpu_s += lost * gpus;
    }

    /// Takes a job off the running list; returns its placement.
    fn stop(&mut self, j: u32) -> Placement {
        self.running.retain(|&r| r != j);
        let now = self.now;
        let run = &mut self.runs[j as usize];
        run.last_run_s = now - run.run_start;
        run.epoch += 1;
        let placement = run.placement.take().expect("a running job has a placement");
        if self.jobs[j as usize].gpu.is_shared() {
            for g in placement.gpu_ids() {
                self.shared_on_gpu[g.0 as usize].retain(|&o| o != j);
            }
        }
        placement
    }

    fn requeue(&mut self, j: u32) {
        let run = &mut self.runs[j as usize];
        run.phase = Phase::Pending;
        run.queued_since = self.now;
        self.pending.push(j);
    }

    fn start(&mut self, j: u32, placement: Placement) {
        let job = &self.jobs[j as usize];
        let gpus = job.gpu_count();
        if gpus > 1 {
            self.multi_gpu_starts += 1;
            let topo = self.state.topology();
            if placement.span(topo) <= topo.tightest_level_for(gpus).max(TopoLevel::NvlinkIsland) {
                self.local_starts += 1;
            }
        }
        if job.gpu.is_shared() {
            for g in placement.gpu_ids() {
                self.shared_on_gpu[g.0 as usize].push(j);
            }
        }
        let now = self.now;
        let run = &mut self.runs[j as usize];
        run.phase = Phase::Running;
        run.first_start.get_or_insert(now);
        run.run_start = now;
        run.seg_start = now;
        run.productive_from = now + job.checkpoint.restart_s;
        run.work_at_run_start = run.work_done;
        run.placement = Some(placement.clone());
        self.running.push(j);
        self.log(j, LogKind::Start(placement.clone()));
        self.set_speed(j);
        self.refresh_cotenants(&placement);
        self.schedule_rank_change(j);
    }

    /// Recomputes the speed of `j` and its finish time.
    fn set_speed(&mut self, j: u32) {
        let job = &self.jobs[j as usize];
        let run = &self.runs[j as usize];
        let placement = run.placement.as_ref().expect("running");
        let ckpt = &job.checkpoint;
        let speed = self.config.speed.speed(job, placement, &self.state)
            * (ckpt.interval_s / (ckpt.interval_s + ckpt.cost_s));
        self.integrate(j);
        let now = self.now;
        let run = &mut self.runs[j as usize];
        run.speed_eff = speed.max(1e-9);
        run.epoch += 1;
        let remaining = (job.total_work - run.work_done).max(0.0);
        let finish = now.max(run.productive_from) + remaining / run.speed_eff;
        let epoch = run.epoch;
        self.push(finish, EventKind::Finish { job: j, epoch });
    }

    /// Jobs sharing a GPU with `placement` run at a speed that depends on their
    /// co-tenants; re-time them.
    fn refresh_cotenants(&mut self, placement: &Placement) {
        let mut affected: Vec<u32> = placement
            .gpu_ids()
            .flat_map(|g| self.shared_on_gpu[g.0 as usize].iter().copied())
            .collect();
        affected.sort_unstable();
        affected.dedup();
        for j in affected {
            if self.runs[j as usize].phase == Phase::Running {
                self.set_speed(j);
            }
        }
    }

    fn schedule_rank_change(&mut self, j: u32) {
        let job = &self.jobs[j as usize];
        let stats = self.stats(j);
        if let Some(dt) = self
            .policy
            .order
            .rank_changes_in(job, &stats, job.gpu_count())
        {
            let epoch = self.runs[j as usize].epoch;
            self.push(
                self.now + dt.max(1e-6),
                EventKind::RankChange { job: j, epoch },
            );
        }
    }

    fn result(&self, trace: &str, first_submit: f64, started: Instant) -> SimResult {
        let mut jct = Vec::with_capacity(self.finished);
        let mut queue = Vec::with_capacity(self.finished);
        let mut last_finish = first_submit;
        for (job, run) in self.jobs.iter().zip(&self.runs) {
            if let (Some(finish), Some(first)) = (run.finish, run.first_start) {
                jct.push(finish - job.submit_time);
                queue.push(first - job.submit_time);
                last_finish = last_finish.max(finish);
            }
        }
        let makespan = (last_finish - first_submit).max(0.0);
        let capacity = self.state.capacity_milli() as f64;
        let alloc_pct = if makespan > 0.0 {
            self.alloc_integral / (capacity * makespan) * 100.0
        } else {
            0.0
        };
        SimResult {
            policy: self.policy.name.clone(),
            trace: trace.to_string(),
            cluster: self.state.topology().name.clone(),
            seed: self.config.seed,
            mode: "replay".into(),
            jobs: self.jobs.len() as u64,
            gpus: self.state.topology().gpu_count() as u64,
            completed: self.finished as u64,
            rejected: self.rejected as u64,
            jct_mean_s: mean(&jct),
            jct_p50_s: percentile(&mut jct.clone(), 0.5),
            jct_p99_s: percentile(&mut jct, 0.99),
            queue_mean_s: mean(&queue),
            queue_max_s: queue.iter().copied().reduce(f64::max),
            makespan_s: Some(makespan),
            gpu_alloc_pct: alloc_pct,
            locality_pct: (self.multi_gpu_starts > 0)
                .then(|| self.local_starts as f64 / self.multi_gpu_starts as f64 * 100.0),
            preemptions: self.preemptions,
            migrations: self.migrations,
            failures: self.failures,
            placement_errors: self.placement_errors,
            lost_gpu_s: self.lost_gpu_s,
            events: self.events,
            wall_s: started.elapsed().as_secs_f64(),
            alloc_pct_by_arrived: None,
            unallocated_gpus_at_100: None,
            fallback_rate: None,
            declined_shares: None,
            sum_of_squares_ties: None,
        }
    }
}
