//! Job transitions with their side effects (allocation, events, assignments), and one
//! scheduling cycle: the same `framework::run_cycle` the simulator drives, on the wall
//! clock.

use std::collections::HashMap;

use crate::domain::{ClusterState, GpuDemand, Placement};
use crate::framework::{Context, JobStats, Pending, Running, Shortfall, run_cycle};
use crate::policies::learned::DecisionTrace;
use crate::service::checkpoint::lost_work;
use crate::service::convert::{placement_to_pb, slot_to_pb, state_to_pb};
use crate::service::core::{Event, Inner};
use crate::service::error::ServiceError;
use crate::service::jobs::{JobRecord, JobState};
use crate::service::migrate::MoveContext;

/// How the reason of a job its tenant's quota or the policy holds begins.
pub(crate) const WAITING: &str = "waiting: ";
use crate::service::model::DecisionPath;
use crate::service::pb;
use crate::service::records::{
    DecisionRecord, Verdict, WorkerRecord, candidates, heuristic_score_note, learned_score_note,
    score_candidates, scored_candidates,
};

fn stats(r: &JobRecord, now_s: f64) -> JobStats {
    let running = if r.state.is_active() {
        (now_s - r.placed_at_s).max(0.0) * r.job.gpu_milli() as f64 / 1000.0
    } else {
        0.0
    };
    JobStats {
        attained_gpu_s: r.attained_gpu_s + running,
        remaining_work: r.job.total_work,
        queued_since: r.queued_since_s,
        last_run_s: 0.0,
    }
}

impl Inner {
    pub fn record(&self, id: u32) -> Result<&JobRecord, ServiceError> {
        self.jobs
            .get(&id)
            .ok_or_else(|| ServiceError::NotFound(format!("job {id} does not exist")))
    }

    /// The assignments that start (or stop) every worker of `r` under `placement`.
    pub fn assignments(
        &self,
        r: &JobRecord,
        placement: &Placement,
        action: pb::AssignmentAction,
        reason: &str,
    ) -> Vec<(crate::domain::NodeId, pb::Assignment)> {
        placement
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let gpus: Vec<pb::GpuSlot> =
                    w.gpus.iter().map(|s| slot_to_pb(s, &self.topo)).collect();
                let mut env = HashMap::new();
                if action == pb::AssignmentAction::Start {
                    env.insert("MARSHAL_JOB_ID".into(), r.job.id.0.to_string());
                    env.insert("MARSHAL_JOB_NAME".into(), r.job.name.clone());
                    env.insert("MARSHAL_WORKER".into(), i.to_string());
                    env.insert("MARSHAL_WORLD_SIZE".into(), r.job.workers.to_string());
                    env.insert("MARSHAL_ATTEMPT".into(), r.attempts.to_string());
                    // Worker 0's node, by its inventory name: the rendezvous host of a
                    // multi-worker job where node names resolve.
                    if let Some(w0) = placement.workers.first() {
                        env.insert(
                            "MARSHAL_MASTER_NODE".into(),
                            self.topo.node(w0.node).name.clone(),
                        );
                    }
                    if r.job.total_work > 0.0 {
                        env.insert(
                            "MARSHAL_EXPECTED_RUNTIME_S".into(),
                            r.job.total_work.to_string(),
                        );
                    }
                    let list: Vec<String> = gpus.iter().map(|g| g.index.to_string()).collect();
                    env.insert("CUDA_VISIBLE_DEVICES".into(), list.join(","));
                    match r.job.gpu {
                        GpuDemand::Milli(m) => {
                            env.insert("MARSHAL_GPU_MILLI".into(), m.to_string());
                        }
                        // The agent maps the profile to a MIG instance UUID; the scheduler
                        // does not know the instances' UUIDs.
                        GpuDemand::Mig { compute, memory } => {
                            env.insert(
                                "MARSHAL_MIG_PROFILE".into(),
                                format!("{compute}c/{memory}m"),
                            );
                        }
                        _ => {}
                    }
                }
                (
                    w.node,
                    pb::Assignment {
                        job_id: r.job.id.0 as u64,
                        action: action as i32,
                        worker: i as u32,
                        gpus,
                        env,
                        reason: reason.to_string(),
                        attempt: r.attempts,
                        confirm: false,
                    },
                )
            })
            .collect()
    }

    /// Moves job `id` to `to`, keeping queue, allocations and watchers in step. Leaving
    /// an active state releases the allocation when `release` is set (a cycle has
    /// already released its victims) and tells the job's nodes to stop it.
    pub fn set_state(
        &mut self,
        id: u32,
        to: JobState,
        reason: String,
        placement: Option<Placement>,
        release: bool,
        now: i64,
    ) -> Result<(), ServiceError> {
        self.jobs_changed();
        let record = self
            .jobs
            .get_mut(&id)
            .ok_or_else(|| ServiceError::NotFound(format!("job {id} does not exist")))?;
        let old = record.placement.clone();
        let was_active = record.state.is_active();
        let (queued_since_s, placed_at_s) = (record.queued_since_s, record.placed_at_s);
        record
            .transition(to, reason, placement, now)
            .map_err(|e| ServiceError::FailedPrecondition(e.to_string()))?;
        if to.is_waiting() {
            self.queue.insert(id);
            self.needs_cycle = true;
        } else {
            self.queue.remove(&id);
        }
        if to.is_active() {
            self.active.insert(id);
        } else {
            self.active.remove(&id);
        }
        if to.is_final() {
            // Started nowhere again: nothing to hold a START for.
            self.stop_waits.forget(id);
        }
        if to == JobState::Running {
            // It runs, so its START went out (from a build that did not hold it, say):
            // held still, it would be left out of its own node's snapshot and stopped.
            self.stop_waits.drop_held(id);
        }
        let record = &self.jobs[&id];
        // The decision log's outcome: the placement ended, or the job was rejected.
        let ended = was_active && !to.is_active();
        if self.log_enabled && record.decision_id > 0 && (ended || to == JobState::Rejected) {
            let now_s = now as f64 / 1e6;
            self.dirty.outcomes.push(crate::decision_log::OutcomeRow {
                decision_id: record.decision_id,
                job_id: id.to_string(),
                state: to.name().to_string(),
                at_us: now,
                wait_s: if ended {
                    (placed_at_s - queued_since_s).max(0.0)
                } else {
                    (now_s - queued_since_s).max(0.0)
                },
                run_s: ended.then(|| (now_s - placed_at_s).max(0.0)),
            });
        }
        let mut events = Vec::new();
        if was_active
            && !to.is_active()
            && let Some(p) = &old
        {
            if release {
                self.state.release(&record.job, p);
            }
            self.needs_cycle = true;
            let mut stops = self.assignments(record, p, pb::AssignmentAction::Stop, &record.reason);
            // A placement whose START was still held never ran, so there is nothing of
            // it to wait for; a job that ended for good is started nowhere again.
            let ran = !self.stop_waits.drop_held(id);
            if ran && to.is_waiting() {
                let steady = now - (self.wall_step)();
                let nodes = self.confirming_nodes(p, steady);
                for (node, stop) in &mut stops {
                    stop.confirm = nodes.iter().any(|(n, _)| n == node);
                }
                self.stop_waits
                    .await_stops(id, record.attempts, nodes, steady);
            }
            events.extend(stops);
        }
        if to == JobState::Placed
            && let Some(p) = &record.placement
        {
            let starts = self.assignments(record, p, pb::AssignmentAction::Start, "");
            events.extend(self.stop_waits.hold_or_pass(id, starts));
        }
        let job_event = pb::JobEvent {
            job_id: id as u64,
            state: state_to_pb(to) as i32,
            reason: record.reason.clone(),
            placement: record
                .placement
                .as_ref()
                .map(|p| placement_to_pb(p, &self.topo))
                .unwrap_or_default(),
            at_us: now,
            seq: 0,
            // The decision that made this placement or rejection (a migration's stop
            // half is tagged by `migrate`).
            decision_id: if matches!(to, JobState::Placed | JobState::Rejected) {
                record.decision_id
            } else {
                0
            },
        };
        for (node, assignment) in events {
            self.push_event(Event::Assignment { node, assignment });
        }
        let seq = self.next_seq();
        self.push_event(Event::Job(pb::JobEvent { seq, ..job_event }));
        self.dirty.jobs.insert(id);
        self.metrics.transition(to.name());
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn decide(
        &mut self,
        id: u32,
        verdict: Verdict,
        reason: &str,
        placement: Option<&Placement>,
        before: &ClusterState,
        queue_depth: u32,
        path: &DecisionPath,
        trace: Option<&DecisionTrace>,
        now: i64,
    ) -> u64 {
        let decision = self.next_decision;
        self.next_decision += 1;
        self.dirty.meta = true;
        let job = &self.jobs[&id].job;
        let empty = Placement::default();
        let (feasible, mut list, ids) = candidates(
            job,
            before,
            placement.unwrap_or(&empty),
            self.cpu_nodes_first,
        );
        let learned = self.model_generation > 0;
        let path = match trace {
            Some(t) => DecisionPath {
                kind: if t.path.is_learned() {
                    "learned"
                } else {
                    "fallback"
                },
                label: t.path.label().to_string(),
                confidence: t.margin.map(f64::from),
            },
            None => path.clone(),
        };
        let scored = trace
            .map(|t| scored_candidates(t, placement, &self.topo))
            .unwrap_or_default();
        let score_note = if !learned {
            let scored = score_candidates(
                self.policy.placer.as_ref(),
                job,
                before,
                &ids,
                &mut list,
                now as f64 / 1e6,
            );
            heuristic_score_note(&self.policy.name, scored)
        } else {
            learned_score_note(&mut list, &scored, &path.label)
        };
        let record = DecisionRecord {
            id: decision,
            source: "cycle".into(),
            at_us: now,
            job: id.to_string(),
            spec: job.clone(),
            policy: self.policy.name.clone(),
            path: path.label.clone(),
            confidence: path.confidence,
            verdict,
            reason: reason.to_string(),
            placement: placement
                .map(|p| WorkerRecord::of(p, &self.topo))
                .unwrap_or_default(),
            queue_depth,
            idle_gpus: before.idle_gpus(),
            feasible_nodes: feasible,
            candidates: list,
            model_version: self.model_version.clone(),
            gate_threshold: self.gate_threshold.filter(|_| learned),
            score_note,
            scored,
            migration: None,
            features: trace.and_then(|t| {
                let f = t.features.as_ref()?;
                Some(crate::decision_log::LoggedFeatures::of(f, t.taken?))
            }),
        };
        self.dirty.decisions.push(record);
        self.metrics.decision(path.kind);
        decision
    }

    /// Whether a cycle with an empty queue could still do something: consolidate a
    /// running gang placed looser than it could be onto idle GPUs.
    fn may_consolidate(&self) -> bool {
        self.policy.consolidate.is_some()
            && self.state.idle_gpus() > 0
            && self.active.iter().any(|id| {
                let r = &self.jobs[id];
                // A partly finished gang is never moved (see `cycle_unchecked`).
                r.completed_nodes.is_empty()
                    && r.placement.as_ref().is_some_and(|p| {
                        crate::framework::ConsolidateConfig::is_loose_placement(
                            &r.job,
                            p,
                            &self.state,
                        )
                    })
            })
    }

    /// One scheduling cycle over the whole queue.
    pub fn cycle(&mut self, now: i64, path: &DecisionPath) {
        self.cycle_unchecked(now, path);
        // Debug builds (every test) check the state against the job records after every
        // cycle, as they check the jobs-by-node cache: a path that moves one without the
        // other is caught where it happens, not when a GPU is handed out twice.
        #[cfg(debug_assertions)]
        if let Err(e) = self.allocation_matches_records() {
            panic!("the cluster state no longer matches the job records: {e}");
        }
    }

    /// The state the active job records' placements make on an empty cluster, compared
    /// with the state kept.
    #[cfg(debug_assertions)]
    fn allocation_matches_records(&self) -> Result<(), String> {
        let mut rebuilt = crate::domain::ClusterState::new(self.topo.clone());
        for id in &self.active {
            let r = &self.jobs[id];
            if let Some(p) = &r.placement {
                rebuilt
                    .allocate(&r.job, p)
                    .map_err(|e| format!("job {id}: {e}"))?;
            }
        }
        self.state.same_allocation(&rebuilt)
    }

    /// A waiting job's reason says why it waits, as Slurm's pending reason does: its
    /// tenant's quota holds it (put in words), or the policy chose to wait for it (the
    /// placer's reason: the learned policy holding capacity for a gang). Written only
    /// when it changes, and cleared once it no longer holds (its tenant's job ended, but
    /// the cluster may still be full) unless something else wrote the reason since.
    fn note_wait_reasons(
        &mut self,
        pending_ids: &[u32],
        over_quota: Vec<(usize, Shortfall)>,
        deferred: Vec<(usize, String)>,
    ) {
        let mut reasons: HashMap<u32, String> = HashMap::new();
        for (i, short) in over_quota {
            let id = pending_ids[i];
            if let Some(r) = self.jobs.get(&id) {
                reasons.insert(id, format!("{WAITING}{}", short.describe(&r.job.tenant)));
            }
        }
        for (i, why) in deferred {
            reasons
                .entry(pending_ids[i])
                .or_insert_with(|| format!("{WAITING}{why}"));
        }
        for (&id, reason) in &reasons {
            if self.wait_reasons.get(&id) == Some(reason) {
                continue;
            }
            if let Some(r) = self.jobs.get_mut(&id) {
                r.reason = reason.clone();
                self.dirty.jobs.insert(id);
            }
        }
        let ended: Vec<(u32, String)> = std::mem::take(&mut self.wait_reasons)
            .into_iter()
            .filter(|(id, _)| !reasons.contains_key(id))
            .collect();
        for (id, written) in ended {
            if let Some(r) = self.jobs.get_mut(&id)
                && r.state.is_waiting()
                && r.reason == written
            {
                r.reason.clear();
                self.dirty.jobs.insert(id);
            }
        }
        self.wait_reasons = reasons;
    }

    fn cycle_unchecked(&mut self, now: i64, path: &DecisionPath) {
        self.needs_cycle = false;
        // With an empty queue a cycle can only consolidate: skip it unless a running
        // gang is placed looser than it could be and some GPU is idle. Nothing waits, so
        // nothing is held: the gauge must not go on showing the nodes held for a gang
        // that has left the queue since (cancelled, say).
        if self.queue.is_empty() && !self.may_consolidate() {
            self.metrics.reserved_nodes.set(0);
            return;
        }
        let now_s = now as f64 / 1e6;
        let before = match self.before_cycle.take() {
            Some(mut copy) => {
                copy.refresh_copy_of(&self.state);
                copy
            }
            None => self.state.clone(),
        };
        let queue_depth = self.queue.len() as u32;
        let pending_ids: Vec<u32> = self.queue.iter().copied().collect();
        let running_ids: Vec<u32> = self
            .active
            .iter()
            .copied()
            .filter(|id| self.jobs[id].placement.is_some())
            .collect();
        let decisions = {
            let Inner {
                jobs,
                state,
                policy,
                rng,
                ..
            } = self;
            let pending: Vec<Pending> = pending_ids
                .iter()
                .map(|id| Pending {
                    job: &jobs[id].job,
                    stats: stats(&jobs[id], now_s),
                })
                .collect();
            let speed = crate::sim::SpeedModel::default();
            // A multi-node job some of whose nodes have finished is shown as not
            // preemptible, so it is neither preempted nor moved: its finished workers
            // would run again, for a gain computed on the whole gang.
            let partly_done: HashMap<u32, crate::domain::Job> = running_ids
                .iter()
                .filter(|id| !jobs[id].completed_nodes.is_empty())
                .map(|id| {
                    let job = crate::domain::Job {
                        preemptible: false,
                        ..jobs[id].job.clone()
                    };
                    (*id, job)
                })
                .collect();
            let running: Vec<Running> = running_ids
                .iter()
                .filter_map(|id| {
                    let r = &jobs[id];
                    Some(Running {
                        job: partly_done.get(id).unwrap_or(&r.job),
                        placement: r.placement.as_ref()?,
                        stats: stats(r, now_s),
                        started_at: r.placed_at_s,
                        lost_work_s: lost_work(r, now_s, state, &speed),
                    })
                })
                .collect();
            let mut ctx = Context::new(now_s, rng);
            run_cycle(policy, state, &pending, &running, &mut ctx)
        };
        // The learned placer's report per job: the last one is the decision that stood.
        let traces: HashMap<crate::domain::JobId, DecisionTrace> =
            std::mem::take(&mut *self.trace.lock().unwrap_or_else(|e| e.into_inner()))
                .into_iter()
                .map(|t| (t.job, t))
                .collect();
        let held = decisions.reserved.as_ref().map_or(0, |(i, nodes)| {
            tracing::debug!(
                job = pending_ids[*i],
                nodes = nodes.len(),
                "nodes held for a waiting gang"
            );
            nodes.len()
        });
        self.metrics.reserved_nodes.set(held as i64);
        for k in decisions.preempted {
            let id = running_ids[k];
            self.metrics.preemptions.inc();
            if let Err(e) = self.set_state(
                id,
                JobState::Preempted,
                "preempted for a higher-ranked job".into(),
                None,
                false,
                now,
            ) {
                tracing::error!(job = id, error = %e, "preemption not recorded");
            }
        }
        // A migration is a preemption of the old placement and, at once, a new
        // placement (a new attempt): the agents hear stop on the old node(s), then
        // start on the new one(s), and both land in this cycle's commit, with a
        // decision record for each move (`migrate`).
        let moves = MoveContext {
            before: &before,
            queue_depth,
            path: path.label.clone(),
            now,
        };
        let gang = decisions.rebalanced_for.map(|i| pending_ids[i]);
        for (k, placement) in decisions.migrated {
            let id = running_ids[k];
            self.metrics.migrations.inc();
            let why = self.rebalance_record(id, gang, now_s);
            if let Err(e) = self.migrate(id, placement, why, &moves) {
                tracing::error!(job = id, error = %e, "migration not recorded");
            }
        }
        for c in decisions.consolidated {
            let id = running_ids[c.running];
            self.metrics.migrations.inc();
            let why = self.consolidation_record(id, &c, now_s);
            if let Err(e) = self.migrate(id, c.to, why, &moves) {
                tracing::error!(job = id, error = %e, "consolidation not recorded");
            }
        }
        for (i, placement) in decisions.placed {
            let id = pending_ids[i];
            let d = self.decide(
                id,
                Verdict::Place,
                "",
                Some(&placement),
                &before,
                queue_depth,
                path,
                traces.get(&self.jobs[&id].job.id),
                now,
            );
            let submitted = self.jobs[&id].submitted_at_us;
            if self.jobs[&id].attempts == 0 {
                self.metrics
                    .submit_to_place_seconds
                    .observe((now - submitted).max(0) as f64 / 1e6);
            }
            if let Some(r) = self.jobs.get_mut(&id) {
                r.decision_id = d;
            }
            if let Err(e) = self.set_state(
                id,
                JobState::Placed,
                String::new(),
                Some(placement),
                false,
                now,
            ) {
                tracing::error!(job = id, error = %e, "placement not recorded");
            }
        }
        for (i, why) in decisions.rejected {
            let id = pending_ids[i];
            let d = self.decide(
                id,
                Verdict::Reject,
                &why,
                None,
                &before,
                queue_depth,
                path,
                traces.get(&self.jobs[&id].job.id),
                now,
            );
            if let Some(r) = self.jobs.get_mut(&id) {
                r.decision_id = d;
            }
            if let Err(e) = self.set_state(id, JobState::Rejected, why, None, false, now) {
                tracing::error!(job = id, error = %e, "rejection not recorded");
            }
        }
        for (i, error) in decisions.errors {
            tracing::warn!(job = pending_ids[i], %error, "placement error; the job stays queued");
        }
        self.note_wait_reasons(&pending_ids, decisions.over_quota, decisions.deferred);
        self.before_cycle = Some(before);
    }
}

#[cfg(test)]
mod tests {
    use crate::framework::ReservationConfig;
    use crate::service::config::ServiceConfig;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::testkit::{TestCore, register_both, whole_gpu_job};

    #[test]
    fn the_reserved_nodes_gauge_falls_to_zero_when_the_held_for_gang_leaves_the_queue() {
        let test = TestCore::new(ServiceConfig {
            reservation: Some(ReservationConfig {
                after_wait_s: 0.0,
                min_gpus: 8,
                max_share: 1.0,
            }),
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let path = NoModel.decision_path("topo-pack");
        inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        inner.cycle(t0, &path);
        // A gang of both nodes waits behind the running job: both are held for it.
        let gang = inner.submit(Some(&whole_gpu_job(2, 8)), t0 + 1).unwrap();
        inner.cycle(t0 + 1, &path);
        assert_eq!(inner.metrics.reserved_nodes.get(), 2);
        // Cancelled, it leaves an empty queue: nothing is held any more.
        inner.cancel(gang, "", t0 + 2).unwrap();
        inner.cycle(t0 + 2, &path);
        assert_eq!(inner.metrics.reserved_nodes.get(), 0);
    }

    /// A tenant at its quota: its job waits with the reason in its record (written
    /// once, not at every cycle), another tenant's job runs, and the waiting job starts
    /// once its tenant's running job ends.
    #[test]
    fn a_job_over_its_tenants_quota_waits_with_the_reason_and_starts_when_room_is_made() {
        let test = TestCore::new(ServiceConfig {
            quota: Some(
                crate::framework::QuotaConfig::from_toml("[tenants.vision]\ngpus = 8\n").unwrap(),
            ),
            policy: "priority".into(),
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let path = NoModel.decision_path("priority");
        let of = |tenant: &str| crate::service::pb::JobSpec {
            tenant: tenant.into(),
            ..whole_gpu_job(1, 8)
        };
        let first = inner.submit(Some(&of("vision")), t0).unwrap();
        let second = inner.submit(Some(&of("vision")), t0).unwrap();
        let other = inner.submit(Some(&of("nlp")), t0).unwrap();
        inner.cycle(t0, &path);
        let state = |inner: &crate::service::core::Inner, id| inner.jobs[&id].state;
        assert_eq!(state(&inner, first), crate::service::jobs::JobState::Placed);
        assert_eq!(state(&inner, other), crate::service::jobs::JobState::Placed);
        assert_eq!(
            state(&inner, second),
            crate::service::jobs::JobState::Pending
        );
        assert_eq!(
            inner.jobs[&second].reason,
            "waiting: tenant \"vision\" holds 8 of its 8 GPUs; the job asks 8 more"
        );
        // The same reason is not written again at the next cycle.
        inner.dirty.jobs.clear();
        inner.cycle(t0 + 1, &path);
        assert!(!inner.dirty.jobs.contains(&second));
        // Vision's running job is cancelled while an urgent job of another tenant takes
        // its GPUs: the quota no longer holds the waiting job, the full cluster does, and
        // its reason no longer blames the quota.
        let urgent = inner
            .submit(
                Some(&crate::service::pb::JobSpec {
                    priority: 5,
                    ..of("nlp")
                }),
                t0 + 2,
            )
            .unwrap();
        inner.cancel(first, "", t0 + 2).unwrap();
        inner.cycle(t0 + 2, &path);
        assert_eq!(
            state(&inner, urgent),
            crate::service::jobs::JobState::Placed
        );
        assert_eq!(
            state(&inner, second),
            crate::service::jobs::JobState::Pending
        );
        assert_eq!(inner.jobs[&second].reason, "");
        // Room made: it starts.
        inner.cancel(other, "", t0 + 3).unwrap();
        inner.cycle(t0 + 3, &path);
        assert_eq!(
            state(&inner, second),
            crate::service::jobs::JobState::Placed
        );
    }

    /// Waits whenever anything runs, else places as topo-pack: the learned policy's wait.
    #[derive(Debug)]
    struct WaitsWhileAnythingRuns;

    impl crate::framework::Placer for WaitsWhileAnythingRuns {
        fn place(
            &self,
            job: &crate::domain::Job,
            state: &mut crate::domain::ClusterState,
            ctx: &mut crate::framework::Context,
        ) -> Result<crate::domain::Placement, crate::framework::Status> {
            if state.allocated_milli() > 0 {
                return Err(crate::framework::Status::Deferred(
                    "holding capacity for this gang".into(),
                ));
            }
            crate::framework::Placer::place(&crate::policies::TopoPack, job, state, ctx)
        }
    }

    /// A job the policy chose to wait for says so, with the placer's reason, written
    /// once; the reason goes when the wait ends and another one stands.
    #[test]
    fn a_job_the_policy_waits_for_carries_the_placers_reason() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let path = NoModel.decision_path("topo-pack");
        let first = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        inner.cycle(t0, &path);
        inner.policy.placer = Box::new(WaitsWhileAnythingRuns);
        let waiting = inner.submit(Some(&whole_gpu_job(1, 4)), t0 + 1).unwrap();
        inner.cycle(t0 + 1, &path);
        let r = &inner.jobs[&waiting];
        assert_eq!(r.state, crate::service::jobs::JobState::Pending);
        assert_eq!(r.reason, "waiting: holding capacity for this gang");
        inner.dirty.jobs.clear();
        inner.cycle(t0 + 2, &path);
        assert!(!inner.dirty.jobs.contains(&waiting), "written again");
        // Nothing runs: it is placed, and its reason is its placement's.
        inner.cancel(first, "", t0 + 3).unwrap();
        inner.cycle(t0 + 3, &path);
        let r = &inner.jobs[&waiting];
        assert_eq!(r.state, crate::service::jobs::JobState::Placed);
        assert!(!r.reason.starts_with("waiting"), "{}", r.reason);
        assert!(inner.wait_reasons.is_empty());
    }

    /// The debug check itself: a GPU taken in the state with no job record holding it
    /// is caught at the next cycle.
    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "the cluster state no longer matches the job records")]
    fn a_state_that_drifts_from_the_records_is_caught_at_the_next_cycle() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let stray = crate::domain::Job::whole_gpus(crate::domain::JobId(999), 1, 0.0, 1.0);
        let gpu = inner
            .topo
            .node(crate::domain::NodeId(0))
            .gpu_ids()
            .next()
            .unwrap();
        let placement = crate::domain::Placement {
            workers: vec![crate::domain::WorkerPlacement {
                node: crate::domain::NodeId(0),
                gpus: vec![crate::domain::GpuShare {
                    gpu,
                    milli: 1000,
                    mig_compute: 0,
                    mig_memory: 0,
                }],
            }],
        };
        inner.state.allocate(&stray, &placement).unwrap();
        inner.submit(Some(&whole_gpu_job(1, 1)), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("topo-pack"));
    }
}
