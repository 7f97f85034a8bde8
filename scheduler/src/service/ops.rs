//! Requests that change state, applied under the scheduler's lock: submit, cancel,
//! agent reports, node registration with reconciliation, drain, cordon, telemetry.

use crate::domain::{JobId, NodeId};
use crate::service::convert::{job_from_spec, node_counts, node_group};
use crate::service::core::{Event, Inner};
use crate::service::error::ServiceError;
use crate::service::jobs::{JobRecord, JobState};
use crate::service::pb;
use crate::service::registration::check_mig;

/// What a registering agent is told.
#[derive(Debug)]
pub struct Registration {
    pub node: NodeId,
    pub stop: Vec<pb::RunningJob>,
}

/// The longest stop grace an agent may declare: the agent's own `--stop-grace` limit.
pub(crate) const MAX_STOP_GRACE_MS: u64 = 3_600_000;

/// The stop grace (µs) of an agent that confirms stops; `None` when it does not.
fn confirms_stops_within_us(req: &pb::RegisterNodeRequest) -> Result<Option<i64>, ServiceError> {
    if !req.confirms_stops {
        return Ok(None);
    }
    if req.stop_grace_ms > MAX_STOP_GRACE_MS {
        return Err(ServiceError::invalid(
            "stop_grace_ms",
            format!(
                "{} ms is more than the {MAX_STOP_GRACE_MS} ms a moved job may be held for",
                req.stop_grace_ms
            ),
        ));
    }
    Ok(Some(req.stop_grace_ms as i64 * 1000))
}

impl Inner {
    pub fn node_id(&self, field: &str, name: &str) -> Result<NodeId, ServiceError> {
        if name.is_empty() {
            return Err(ServiceError::invalid(field, "missing"));
        }
        self.node_index.get(name).copied().ok_or_else(|| {
            ServiceError::NotFound(format!(
                "node {name:?} is not in the inventory of cluster {} ({} nodes)",
                self.topo.name,
                self.topo.nodes().len()
            ))
        })
    }

    pub(crate) fn registered_node(&self, field: &str, name: &str) -> Result<NodeId, ServiceError> {
        let n = self.node_id(field, name)?;
        if !self.nodes[n.0 as usize].registered {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} has not registered; call Register first"
            )));
        }
        Ok(n)
    }

    /// Active jobs with workers on `n` that have not finished there yet (a node whose
    /// part of a multi-node job completed no longer runs it, is not asked to start it
    /// again, and does not take the job down with it when drained or lost).
    ///
    /// Read from a cache of [`Inner::jobs_by_node`] kept until a job's placement or
    /// activity changes; debug builds check it against a fresh scan.
    pub fn jobs_on(&self, n: NodeId) -> Vec<u32> {
        let on = self
            .jobs_by_node_cache
            .borrow_mut()
            .get_or_insert_with(|| self.jobs_by_node())[n.0 as usize]
            .clone();
        debug_assert_eq!(
            on,
            self.active
                .iter()
                .copied()
                .filter(|&id| self.runs_on(id, n))
                .collect::<Vec<_>>(),
            "the jobs-by-node cache missed a change"
        );
        on
    }

    /// Forgets [`Inner::jobs_on`]'s cache: after a change to a job's placement, its
    /// activity or the nodes it has finished on made outside [`Inner::set_state`].
    pub fn jobs_changed(&mut self) {
        self.jobs_by_node_cache.get_mut().take();
    }

    /// Whether active job `id` still has unfinished workers on `n` ([`Inner::jobs_on`]).
    pub fn runs_on(&self, id: u32, n: NodeId) -> bool {
        self.active.contains(&id)
            && self.jobs.get(&id).is_some_and(|r| {
                r.placement
                    .as_ref()
                    .is_some_and(|p| p.workers.iter().any(|w| w.node == n))
                    && !r.completed_nodes.contains(&self.topo.node(n).name)
            })
    }

    /// [`Inner::jobs_on`] for every node at once, in one pass over the active jobs (a
    /// call per node would be nodes × active jobs under the state's lock).
    pub fn jobs_by_node(&self) -> Vec<Vec<u32>> {
        let mut by_node = vec![Vec::new(); self.nodes.len()];
        for &id in &self.active {
            let r = &self.jobs[&id];
            let Some(p) = r.placement.as_ref() else {
                continue;
            };
            let mut nodes: Vec<NodeId> = p.workers.iter().map(|w| w.node).collect();
            nodes.sort_unstable();
            nodes.dedup();
            for n in nodes {
                if !r.completed_nodes.contains(&self.topo.node(n).name) {
                    by_node[n.0 as usize].push(id);
                }
            }
        }
        by_node
    }

    /// START assignments of everything `n` should run now.
    pub fn node_assignments(&self, n: NodeId) -> Vec<pb::Assignment> {
        self.jobs_on(n)
            .into_iter()
            // Sent once its stopped workers elsewhere have ended (`stop_waits`).
            .filter(|&id| !self.stop_waits.is_held(id))
            .flat_map(|id| {
                let r = &self.jobs[&id];
                let p = r.placement.as_ref().expect("active jobs hold a placement");
                self.assignments(r, p, pb::AssignmentAction::Start, "")
            })
            .filter(|(node, _)| *node == n)
            .map(|(_, a)| a)
            .collect()
    }

    pub fn node_status(&self, n: NodeId) -> pb::NodeStatus {
        self.node_status_with(n, self.jobs_on(n).len())
    }

    /// [`Inner::node_status`] with the node's job count already known.
    pub fn node_status_with(&self, n: NodeId, jobs: usize) -> pb::NodeStatus {
        let r = &self.nodes[n.0 as usize];
        let (gpus, idle, allocated) = node_counts(&self.state, n);
        pb::NodeStatus {
            name: self.topo.node(n).name.clone(),
            registered: r.registered,
            cordoned: r.cordoned,
            quarantined: r.quarantined,
            gpus,
            idle_gpus: idle,
            allocated_milli: allocated,
            failures: r.failures,
            reason: r.reason.clone(),
            telemetry_samples: r.telemetry_samples,
            jobs: jobs as u32,
            unreachable: r.unreachable,
            last_seen_us: if r.registered { r.last_seen_us } else { 0 },
        }
    }

    pub fn submit(&mut self, spec: Option<&pb::JobSpec>, now: i64) -> Result<u32, ServiceError> {
        if let Some(key) = spec
            .map(|s| s.idempotency_key.as_str())
            .filter(|k| !k.is_empty())
            && let Some(&id) = self.idempotency.get(key)
        {
            return Ok(id);
        }
        let id = self.next_job;
        if id == u32::MAX {
            return Err(ServiceError::Unavailable("job ids are exhausted".into()));
        }
        let (job, key) = job_from_spec(spec, JobId(id), now as f64 / 1e6, &self.topo.catalog)?;
        self.next_job += 1;
        self.dirty.meta = true;
        let fits = self.ever_fits.check(&job, &self.topo);
        let mut record = JobRecord::new(job, key.clone(), now);
        if let Some(key) = key {
            self.idempotency.insert(key, id);
        }
        self.metrics.submitted.inc();
        self.metrics.transition("pending");
        if let Err(why) = fits {
            // Refused at admission: kept (and listed) as rejected with the reason, so a
            // client polling the job learns why rather than waiting forever.
            record.state = JobState::Rejected;
            record.reason = why;
            self.metrics.transition("rejected");
        } else {
            self.queue.insert(id);
            self.needs_cycle = true;
        }
        let event = pb::JobEvent {
            job_id: id as u64,
            state: crate::service::convert::state_to_pb(record.state) as i32,
            reason: record.reason.clone(),
            placement: vec![],
            at_us: now,
            seq: self.next_seq(),
            decision_id: record.decision_id,
        };
        self.push_event(Event::Job(event));
        self.jobs.insert(id, record);
        self.dirty.jobs.insert(id);
        Ok(id)
    }

    pub fn cancel(&mut self, id: u32, reason: &str, now: i64) -> Result<(), ServiceError> {
        let state = self.record(id)?.state;
        if state.is_final() {
            return Err(ServiceError::FailedPrecondition(format!(
                "job {id} is already {state}"
            )));
        }
        let reason = if reason.is_empty() {
            "cancelled by the client".to_string()
        } else {
            format!("cancelled: {reason}")
        };
        self.set_state(id, JobState::Cancelled, reason, None, true, now)
    }

    fn note_failure(&mut self, n: NodeId, why: String) {
        let quarantine_after = self.quarantine_after;
        let r = &mut self.nodes[n.0 as usize];
        r.failures += 1;
        if r.failures >= quarantine_after && !r.quarantined {
            r.quarantined = true;
            r.reason = format!("quarantined after {} failures; last: {why}", r.failures);
            let node = &self.topo.node(n).name;
            tracing::warn!(%node, reason = %r.reason, "node quarantined");
        }
        self.mark_node(n);
    }

    pub fn report(&mut self, req: &pb::ReportJobRequest, now: i64) -> Result<u32, ServiceError> {
        let n = self.registered_node("node", &req.node)?;
        self.heard_from(n, now);
        let id = crate::service::convert::job_id("job_id", req.job_id)?.0;
        let r = self.record(id)?;
        let on_node = r.state.is_active()
            && r.placement
                .as_ref()
                .is_some_and(|p| p.workers.iter().any(|w| w.node == n));
        if !on_node {
            return Err(ServiceError::FailedPrecondition(format!(
                "job {id} is not placed on node {} (it is {})",
                req.node, r.state
            )));
        }
        let attempts = r.attempts;
        let current = r.state;
        let placed_at_s = r.placed_at_s;
        if req.attempt != 0 && req.attempt != attempts {
            return Err(ServiceError::FailedPrecondition(format!(
                "job {id}: the report is about placement {} but the job is on placement {attempts}",
                req.attempt
            )));
        }
        let reported = crate::service::convert::state_from_pb("state", req.state)?;
        let checkpoint = crate::service::checkpoint::reported(
            req.last_checkpoint_unix_s,
            reported,
            placed_at_s,
            now as f64 / 1e6,
        )?;
        match reported {
            JobState::Running => {
                if current != JobState::Running {
                    self.set_state(id, JobState::Running, req.message.clone(), None, false, now)?;
                }
                if let Some(at) = checkpoint {
                    self.note_checkpoint(id, at);
                }
                Ok(id)
            }
            JobState::Completed => {
                let waiting_for = self.note_node_completed(id, n);
                if waiting_for > 0 {
                    if current == JobState::Placed {
                        let why = format!(
                            "workers on {} completed; waiting for {waiting_for} more node(s)",
                            req.node
                        );
                        self.set_state(id, JobState::Running, why, None, false, now)?;
                    }
                    return Ok(id);
                }
                self.set_state(
                    id,
                    JobState::Completed,
                    req.message.clone(),
                    None,
                    true,
                    now,
                )?;
                Ok(id)
            }
            JobState::Failed => {
                let why = format!("failed on {}: {}", req.node, req.message);
                self.note_failure(n, why.clone());
                let (to, reason) = if attempts >= self.max_attempts {
                    (
                        JobState::Failed,
                        format!("{why} (attempt {attempts} of {})", self.max_attempts),
                    )
                } else {
                    (
                        JobState::Requeued,
                        format!(
                            "{why}; requeued (attempt {attempts} of {})",
                            self.max_attempts
                        ),
                    )
                };
                self.set_state(id, to, reason, None, true, now)?;
                Ok(id)
            }
            other => Err(ServiceError::invalid(
                "state",
                format!("{other} cannot be reported; only RUNNING, COMPLETED or FAILED"),
            )),
        }
    }

    /// Keeps the latest checkpoint reported for job `id`'s placement (one agent of a
    /// gang may report after another); persisted with the job.
    fn note_checkpoint(&mut self, id: u32, at: f64) {
        if let Some(r) = self.jobs.get_mut(&id)
            && r.last_checkpoint_s.is_none_or(|c| c < at)
        {
            r.last_checkpoint_s = Some(at);
            self.dirty.jobs.insert(id);
        }
    }

    /// Records that node `n` finished its workers of job `id`; returns how many of the
    /// placement's nodes have not reported completion yet. The job keeps its whole
    /// placement until the last one has: a gang's GPUs are released together.
    fn note_node_completed(&mut self, id: u32, n: NodeId) -> usize {
        let name = self.topo.node(n).name.clone();
        let Some(r) = self.jobs.get_mut(&id) else {
            return 0;
        };
        let Some(p) = &r.placement else {
            return 0;
        };
        let mut nodes: Vec<NodeId> = p.workers.iter().map(|w| w.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let newly = !r.completed_nodes.contains(&name);
        if newly {
            r.completed_nodes.push(name);
        }
        let topo = &self.topo;
        let missing = nodes
            .iter()
            .filter(|&&m| !r.completed_nodes.contains(&topo.node(m).name))
            .count();
        if newly {
            self.jobs_changed();
        }
        if missing > 0 {
            self.dirty.jobs.insert(id);
        }
        missing
    }

    pub fn register(
        &mut self,
        req: &pb::RegisterNodeRequest,
        now: i64,
    ) -> Result<Registration, ServiceError> {
        let group = node_group("node", req.node.as_ref())?;
        let name = &group.names[0];
        let n = self.node_id("node.name", name)?;
        let info = req.node.as_ref().expect("node_group checked it is set");
        let confirms_stops_within_us = confirms_stops_within_us(req)?;
        if let Err(refused) = self.check_hardware(n, &group, info) {
            self.refuse_registration(n, &refused, now);
            return Err(refused);
        }
        let expected = self.jobs_on(n);
        let mut stop = Vec::new();
        let mut reported = Vec::new();
        for r in &req.running {
            let current = u32::try_from(r.job_id)
                .ok()
                .filter(|id| expected.contains(id) && self.jobs[id].attempts == r.attempt);
            match current {
                Some(id) => {
                    reported.push(id);
                    if self.jobs[&id].state == JobState::Placed {
                        self.set_state(
                            id,
                            JobState::Running,
                            format!("running on {name} (reported at registration)"),
                            None,
                            false,
                            now,
                        )?;
                    }
                }
                None => stop.push(*r),
            }
        }
        for id in expected {
            let running = self.jobs[&id].state == JobState::Running;
            if running && !reported.contains(&id) {
                self.set_state(
                    id,
                    JobState::Requeued,
                    format!("the agent on {name} no longer runs it (restarted?)"),
                    None,
                    true,
                    now,
                )?;
            }
        }
        self.nodes[n.0 as usize].registered = true;
        self.nodes[n.0 as usize].refused = false;
        if self.nodes[n.0 as usize].confirms_stops_within_us != confirms_stops_within_us {
            self.nodes[n.0 as usize].confirms_stops_within_us = confirms_stops_within_us;
            self.dirty.stop_graces.insert(n.0);
        }
        // Heard from first: a wait this registration restarts counts from that moment.
        self.heard_from(n, now);
        self.confirm_stops_not_running(n, &req.running, &req.stopping);
        self.mark_node(n);
        Ok(Registration { node: n, stop })
    }

    /// What the agent reports against the inventory's node `n`: the GPU model, count and
    /// NVLink islands, MIG modes and instances, and at least its CPU and memory.
    fn check_hardware(
        &self,
        n: NodeId,
        group: &crate::domain::NodeGroupSpec,
        info: &pb::NodeInfo,
    ) -> Result<(), ServiceError> {
        let name = &group.names[0];
        let inv = self.topo.node(n);
        let reported_model = match &group.gpu_model {
            Some(m) => Some(self.topo.catalog.id(m).ok_or_else(|| {
                ServiceError::invalid("node.gpu_model", format!("unknown GPU model {m:?}"))
            })?),
            None => None,
        };
        let inv_model = inv.model.map(|m| self.topo.catalog.get(m).name.as_str());
        if reported_model != inv.model
            || group.gpus != inv.gpu_count()
            || group.nvlink_domain.max(1) != inv.island_size
        {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} reports {} × {} in NVLink islands of {}; the inventory says {} × {} in islands of {}",
                group.gpus,
                group.gpu_model.as_deref().unwrap_or("no GPU"),
                group.nvlink_domain.max(1),
                inv.gpu_count(),
                inv_model.unwrap_or("no GPU"),
                inv.island_size
            )));
        }
        check_mig(&self.topo, n, group, info)?;
        if group.cpu_milli < inv.cpu_milli || group.memory_mib < inv.memory_mib {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} reports {} mCPU / {} MiB, less than the inventory's {} mCPU / {} MiB",
                group.cpu_milli, group.memory_mib, inv.cpu_milli, inv.memory_mib
            )));
        }
        Ok(())
    }

    /// A node registered before whose agent now describes other hardware than the
    /// inventory (a GPU pulled, another model) is not the node the scheduler places on:
    /// it gets no new work from now, and its jobs are requeued after the grace period,
    /// as for a silent node. Until then it stayed schedulable until its heartbeat timed
    /// out (the refused agent sends none), and jobs placed there meanwhile waited for it.
    fn refuse_registration(&mut self, n: NodeId, why: &ServiceError, now: i64) {
        let steady = now - (self.wall_step)();
        let r = &mut self.nodes[n.0 as usize];
        if !r.registered {
            return;
        }
        r.refused = true;
        if r.unreachable {
            return;
        }
        r.unreachable = true;
        r.unreachable_since_us = now;
        r.unreachable_since_steady_us = steady;
        tracing::warn!(node = %self.topo.node(n).name, error = %why, "registration refused: the node gets no new work, and its jobs are requeued after the grace period");
        self.mark_node(n);
    }

    pub fn drain(&mut self, name: &str, reason: &str, now: i64) -> Result<NodeId, ServiceError> {
        let n = self.node_id("node", name)?;
        let r = &mut self.nodes[n.0 as usize];
        r.cordoned = true;
        r.reason = format!("drained: {reason}");
        self.mark_node(n);
        for id in self.jobs_on(n) {
            self.set_state(
                id,
                JobState::Requeued,
                format!("node {name} drained"),
                None,
                true,
                now,
            )?;
        }
        Ok(n)
    }

    pub fn cordon(
        &mut self,
        name: &str,
        cordon: bool,
        reason: &str,
    ) -> Result<NodeId, ServiceError> {
        let n = self.node_id("node", name)?;
        let r = &mut self.nodes[n.0 as usize];
        if cordon {
            r.cordoned = true;
            r.reason = format!("cordoned: {reason}");
        } else {
            // Uncordoning is the operator's word that the node is fine again.
            r.cordoned = false;
            r.quarantined = false;
            r.failures = 0;
            r.reason.clear();
        }
        self.mark_node(n);
        Ok(n)
    }

    /// Validates and counts one telemetry sample; a failed GPU quarantines its node.
    /// Returns whether durable state changed.
    pub fn telemetry(&mut self, s: &pb::TelemetrySample, now: i64) -> Result<bool, String> {
        let n = self
            .registered_node("node", &s.node)
            .map_err(|e| e.to_string())?;
        // Even a sample refused below shows the agent is alive.
        let back = self.heard_from(n, now);
        let gpus = self.topo.node(n).gpu_count() as u32;
        if s.gpu_index >= gpus {
            return Err(format!(
                "gpu_index {} on a node with {gpus} GPUs",
                s.gpu_index
            ));
        }
        if s.timestamp_us <= 0 {
            return Err(format!("timestamp_us {} is not a time", s.timestamp_us));
        }
        if !(s.sm_util_pct.is_finite() && (0.0..=100.0).contains(&s.sm_util_pct)) {
            return Err(format!("sm_util_pct {} is outside 0..=100", s.sm_util_pct));
        }
        if !(s.temperature_c.is_finite() && s.power_w.is_finite() && s.power_w >= 0.0) {
            return Err("temperature_c and power_w must be finite (power non-negative)".into());
        }
        if s.mem_total_bytes > 0 && s.mem_used_bytes > s.mem_total_bytes {
            return Err(format!(
                "mem_used_bytes {} exceeds mem_total_bytes {}",
                s.mem_used_bytes, s.mem_total_bytes
            ));
        }
        let health = pb::GpuHealth::try_from(s.health)
            .map_err(|_| format!("health: unknown value {}", s.health))?;
        self.nodes[n.0 as usize].telemetry_samples += 1;
        if health == pb::GpuHealth::Failed && !self.nodes[n.0 as usize].quarantined {
            let r = &mut self.nodes[n.0 as usize];
            r.quarantined = true;
            r.reason = format!("quarantined: GPU {} reported failed", s.gpu_index);
            self.mark_node(n);
            return Ok(true);
        }
        Ok(back)
    }
}

#[cfg(test)]
mod tests {
    use crate::service::config::ServiceConfig;
    use crate::service::core::Event;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::records::{MigrationKind, Verdict, WorkerRecord};
    use crate::service::testkit::{TestCore, node_info, register_both, whole_gpu_job};

    use super::*;

    fn report(node: usize, id: u32, state: pb::JobState) -> pb::ReportJobRequest {
        pb::ReportJobRequest {
            node: format!("n-{node}"),
            job_id: id as u64,
            state: state as i32,
            message: String::new(),
            attempt: 0,
            last_checkpoint_unix_s: 0.0,
        }
    }

    /// A registered node whose agent comes back describing other hardware is refused,
    /// gets no new work at once, and loses its jobs after the grace period; a correct
    /// registration brings it back.
    #[test]
    fn a_refused_re_registration_takes_the_node_out_at_once() {
        let test = TestCore::new(ServiceConfig {
            node_timeout_ms: 600_000,
            node_grace_ms: 2_000,
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let path = NoModel.decision_path("topo-pack");
        let first = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        inner.cycle(t0, &path);
        let on = |inner: &Inner, id: u32| {
            let p = inner.jobs[&id].placement.as_ref().unwrap();
            p.workers[0].node
        };
        let node = on(&inner, first);
        // Its agent restarts with half its GPUs gone.
        let pulled = pb::RegisterNodeRequest {
            node: Some(pb::NodeInfo {
                gpus: 4,
                nvlink_domain: 4,
                ..node_info(node.0 as usize)
            }),
            running: vec![],
            ..Default::default()
        };
        let err = inner.register(&pulled, t0 + 1).unwrap_err();
        assert!(matches!(err, ServiceError::FailedPrecondition(_)), "{err}");
        assert!(inner.nodes[node.0 as usize].unreachable);
        // No new work goes there, though the heartbeat timeout is ten minutes away, and
        // what its agent still sends (a heartbeat, a report) does not bring it back.
        assert!(!inner.state.node_is_up(node));
        let name = inner.topo.node(node).name.clone();
        inner.heartbeat(&name, t0 + 2).unwrap();
        assert!(inner.nodes[node.0 as usize].unreachable);
        assert!(!inner.state.node_is_up(node));
        // What the refused agent is told: its jobs go at the end of the grace period,
        // counted from the refusal (give or take the clocks' microseconds).
        let left = inner.requeue_in_us(&name, t0 + 2).unwrap();
        assert!((1_990_000..=2_000_000).contains(&left), "{left}");
        let other = inner.topo.node(NodeId(1 - node.0)).name.clone();
        assert_eq!(inner.requeue_in_us(&other, t0 + 2), None);
        assert_eq!(inner.requeue_in_us("no-such-node", t0 + 2), None);
        // Past the grace period its job is requeued (a second past it: the monotonic
        // clock's reading drifts by microseconds between calls).
        inner.check_heartbeats(t0 + 1 + 3_000_000);
        assert_eq!(inner.jobs[&first].state, JobState::Requeued);
        assert_eq!(inner.requeue_in_us(&name, t0 + 1 + 3_000_000), Some(0));
        // Its hardware restored, it registers and is reachable again.
        let back = pb::RegisterNodeRequest {
            node: Some(node_info(node.0 as usize)),
            running: vec![],
            ..Default::default()
        };
        inner.register(&back, t0 + 4_000_000).unwrap();
        assert!(!inner.nodes[node.0 as usize].unreachable);
        assert_eq!(inner.requeue_in_us(&name, t0 + 4_000_000), None);
    }

    /// A gang of two 8-GPU workers on two 8-GPU nodes: one worker per node.
    fn placed_over_both_nodes(inner: &mut Inner, t0: i64) -> u32 {
        register_both(inner, t0);
        let id = inner.submit(Some(&whole_gpu_job(2, 8)), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("topo-pack"));
        assert_eq!(inner.jobs[&id].state, JobState::Placed);
        id
    }

    #[test]
    fn a_node_reporting_mig_modes_must_match_an_inventory_that_declares_them() {
        let register = |inner: &mut Inner, mig: Option<Vec<u32>>| {
            let req = pb::RegisterNodeRequest {
                node: Some(pb::NodeInfo {
                    mig: mig.map(|gpus| pb::MigModes { gpus }),
                    mig_layout: None,
                    ..node_info(0)
                }),
                running: vec![],
                ..Default::default()
            };
            inner.register(&req, 1).map(|_| ())
        };
        // Left open: an agent that does not know is fine, one that does must be declared.
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        register(&mut inner, None).unwrap();
        let err = register(&mut inner, Some(vec![])).unwrap_err().to_string();
        assert!(
            err.contains("declare mig_gpus = [] in its node group"),
            "{err}"
        );
        drop(inner);

        let declared = crate::service::testkit::TWO_NODES
            .replace("nvlink_domain = 8", "nvlink_domain = 8\nmig_gpus = [1, 5]");
        let test = TestCore::on(ServiceConfig::default(), &declared);
        let mut inner = test.core.lock();
        register(&mut inner, Some(vec![5, 1])).unwrap();
        register(&mut inner, None).unwrap();
        let err = register(&mut inner, Some(vec![1])).unwrap_err();
        assert!(
            err.to_string()
                .contains("node n-0 reports MIG mode on GPUs [1]; the inventory says [1, 5]"),
            "{err}"
        );
        assert!(
            matches!(err, ServiceError::FailedPrecondition(_)),
            "{err:?}"
        );
        let err = register(&mut inner, Some(vec![8])).unwrap_err().to_string();
        assert!(err.contains("node.mig.gpus"), "{err}");
    }

    /// A gang one of whose nodes has finished is neither preempted nor moved: that node's
    /// workers would run again.
    #[test]
    fn a_partly_finished_gang_is_not_preempted() {
        let test = TestCore::new(ServiceConfig {
            policy: "priority".into(),
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let spec = pb::JobSpec {
            preemptible: true,
            ..whole_gpu_job(2, 8)
        };
        let gang = inner.submit(Some(&spec), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("priority"));
        assert_eq!(inner.jobs[&gang].state, JobState::Placed);
        inner
            .report(&report(0, gang, pb::JobState::Running), t0 + 1)
            .unwrap();
        inner
            .report(&report(1, gang, pb::JobState::Running), t0 + 1)
            .unwrap();
        inner
            .report(&report(0, gang, pb::JobState::Completed), t0 + 2)
            .unwrap();
        let urgent = pb::JobSpec {
            priority: 10,
            ..whole_gpu_job(1, 8)
        };
        // An hour later: past the priority policy's shortest run before preemption.
        let later = t0 + 3_600_000_000;
        let id = inner.submit(Some(&urgent), later).unwrap();
        inner.cycle(later, &NoModel.decision_path("priority"));
        assert_eq!(inner.jobs[&gang].state, JobState::Running);
        assert_eq!(inner.jobs[&id].state, JobState::Pending);
        // Once the gang is done, the urgent job starts.
        inner
            .report(&report(1, gang, pb::JobState::Completed), later + 1)
            .unwrap();
        inner.cycle(later + 1, &NoModel.decision_path("priority"));
        assert_eq!(inner.jobs[&id].state, JobState::Placed);
    }

    #[test]
    fn a_multi_node_job_completes_when_every_node_has_reported() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let id = placed_over_both_nodes(&mut inner, t0);

        inner
            .report(&report(0, id, pb::JobState::Completed), t0 + 1)
            .unwrap();
        // Said twice (an acknowledgement lost): counted once.
        inner
            .report(&report(0, id, pb::JobState::Completed), t0 + 2)
            .unwrap();
        let r = &inner.jobs[&id];
        assert_eq!(r.state, JobState::Running);
        assert_eq!(r.completed_nodes, vec!["n-0".to_string()]);
        // The gang keeps all its GPUs until the last node is done.
        assert_eq!(inner.state.allocated_milli(), 16_000);
        // n-0 is done with it: not asked to start it again, and a re-registration that
        // no longer lists it does not requeue it.
        assert!(inner.jobs_on(NodeId(0)).is_empty());
        assert!(inner.node_assignments(NodeId(0)).is_empty());
        assert_eq!(inner.jobs_on(NodeId(1)), vec![id]);
        let again = pb::RegisterNodeRequest {
            node: Some(node_info(0)),
            running: vec![],
            ..Default::default()
        };
        inner.register(&again, t0 + 3).unwrap();
        assert_eq!(inner.jobs[&id].state, JobState::Running);

        inner
            .report(&report(1, id, pb::JobState::Completed), t0 + 4)
            .unwrap();
        assert_eq!(inner.jobs[&id].state, JobState::Completed);
        assert_eq!(inner.state.allocated_milli(), 0);
    }

    #[test]
    fn one_failed_node_ends_a_multi_node_job_and_the_next_placement_starts_afresh() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let id = placed_over_both_nodes(&mut inner, t0);

        inner
            .report(&report(0, id, pb::JobState::Completed), t0 + 1)
            .unwrap();
        inner
            .report(&report(1, id, pb::JobState::Failed), t0 + 2)
            .unwrap();
        assert_eq!(inner.jobs[&id].state, JobState::Requeued);
        assert_eq!(inner.state.allocated_milli(), 0);

        inner.cycle(t0 + 3, &NoModel.decision_path("topo-pack"));
        let r = &inner.jobs[&id];
        assert_eq!((r.state, r.attempts), (JobState::Placed, 2));
        assert!(r.completed_nodes.is_empty());
        // The earlier placement's completion does not count for this one.
        inner
            .report(&report(0, id, pb::JobState::Completed), t0 + 4)
            .unwrap();
        assert_eq!(inner.jobs[&id].state, JobState::Running);
    }

    /// Four one-GPU jobs on each node leave 8 idle GPUs but no idle node: with
    /// `[rebalance]` the four on one node move to the other in the cycle that places
    /// the 8-GPU gang, persisted in that cycle's commit and told to the agents as a stop
    /// on the old node before a start on the new one.
    #[test]
    fn a_migration_is_persisted_and_sent_as_stop_then_start() {
        let config = ServiceConfig {
            rebalance: Some(crate::framework::RebalanceConfig {
                after_wait_s: 0.0,
                max_moves: 4,
                min_runtime_s: 0.0,
                max_lost_s: None,
            }),
            ..ServiceConfig::default()
        };
        let test = TestCore::new(config.clone());
        let mut inner = test.core.lock();
        let path = NoModel.decision_path("topo-pack");
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        // Jobs move only when they say they may be stopped.
        let movable = pb::JobSpec {
            preemptible: true,
            ..whole_gpu_job(1, 1)
        };
        let small: Vec<u32> = (0..16)
            .map(|_| inner.submit(Some(&movable), t0).unwrap())
            .collect();
        inner.cycle(t0, &path);
        for n in 0..2 {
            let on = inner.jobs_on(NodeId(n));
            assert_eq!(on.len(), 8);
            for &id in on.iter().skip(1).step_by(2) {
                inner.cancel(id, "", t0 + 1).unwrap();
            }
        }
        assert_eq!(inner.state.idle_gpus(), 8);
        let before: Vec<(u32, NodeId)> = small
            .iter()
            .filter(|id| inner.jobs[id].state.is_active())
            .map(|&id| {
                (
                    id,
                    inner.jobs[&id].placement.as_ref().unwrap().workers[0].node,
                )
            })
            .collect();
        let _ = inner.take_batch();

        let gang = inner.submit(Some(&whole_gpu_job(1, 8)), t0 + 2).unwrap();
        inner.cycle(t0 + 3, &path);
        assert_eq!(inner.jobs[&gang].state, JobState::Placed);
        let gang_node = inner.jobs[&gang].placement.as_ref().unwrap().workers[0].node;
        let moved: Vec<u32> = before
            .iter()
            .filter(|(_, n)| *n == gang_node)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(moved.len(), 4);
        assert_eq!(inner.metrics.migrations.get(), 4);
        assert_eq!(inner.metrics.preemptions.get(), 0);
        for id in &moved {
            let r = &inner.jobs[id];
            assert_eq!((r.state, r.attempts), (JobState::Placed, 2), "job {id}");
            assert_ne!(r.placement.as_ref().unwrap().workers[0].node, gang_node);
            assert!(r.reason.contains("migrated"), "{}", r.reason);
        }
        inner.state.check_consistency().unwrap();
        assert_eq!(inner.state.idle_gpus(), 0);

        let (_, (batch, _), events) = inner.take_batch();
        let assignment = |e: &Event| match e {
            Event::Assignment { node, assignment } => Some((
                *node,
                assignment.job_id as u32,
                assignment.action,
                assignment.attempt,
            )),
            Event::Job(_) => None,
        };
        let sent: Vec<_> = events.iter().filter_map(assignment).collect();
        let stop = pb::AssignmentAction::Stop as i32;
        let start = pb::AssignmentAction::Start as i32;
        let gang_start = sent
            .iter()
            .position(|a| a.1 == gang && a.2 == start)
            .expect("the gang is started");
        for &id in &moved {
            let stop_at = sent
                .iter()
                .position(|a| *a == (gang_node, id, stop, 1))
                .expect("stopped on its old node");
            let start_at = sent
                .iter()
                .position(|a| a.1 == id && a.2 == start && a.3 == 2 && a.0 != gang_node)
                .expect("started on the other node as attempt 2");
            assert!(stop_at < start_at && stop_at < gang_start);
        }
        // All in one commit: after it, a restarted server sees the moved jobs where they
        // went and the gang where it was placed, with every allocation fitting.
        test.core.store.commit(&batch).unwrap();
        // Each move is a decision that Explain returns: where the job was, where it
        // went, and the gang it made room for; both job events name it.
        let gang_name = inner.topo.node(gang_node).name.clone();
        for &id in &moved {
            let r = &inner.jobs[&id];
            let d = test.core.store.decision(r.decision_id).unwrap().unwrap();
            assert_eq!(d.verdict, Verdict::Migrate);
            assert_eq!(d.job, id.to_string());
            let m = d.migration.as_ref().unwrap();
            assert_eq!(m.kind, MigrationKind::Rebalance);
            assert_eq!(m.for_job, Some(gang.to_string()));
            assert_eq!(m.from.len(), 1);
            assert_eq!(m.from[0].node, gang_name);
            assert_eq!(
                m.cost_s, m.restart_s,
                "no checkpoint reported: nothing lost"
            );
            assert_eq!(
                d.placement,
                WorkerRecord::of(r.placement.as_ref().unwrap(), &inner.topo)
            );
            let explained = d.to_pb(&inner.topo.catalog);
            assert_eq!(explained.verdict, pb::Verdict::Migrate as i32);
            assert_eq!(explained.migration.unwrap().kind, "rebalance");
            let tagged: Vec<i32> = events
                .iter()
                .filter_map(|e| match e {
                    Event::Job(j) if j.job_id == id as u64 => Some((j.state, j.decision_id)),
                    _ => None,
                })
                .filter(|(_, d)| *d == r.decision_id)
                .map(|(s, _)| s)
                .collect();
            let (preempted, placed) = (pb::JobState::Preempted as i32, pb::JobState::Placed as i32);
            assert_eq!(tagged, vec![preempted, placed], "job {id}");
        }
        let expected: Vec<(u32, Option<crate::domain::Placement>)> = moved
            .iter()
            .chain([&gang])
            .map(|id| (*id, inner.jobs[id].placement.clone()))
            .collect();
        drop(inner);
        let restored = test.restart(config);
        let again = restored.lock();
        for (id, placement) in expected {
            assert_eq!(again.jobs[&id].placement, placement, "job {id}");
        }
        assert_eq!(again.state.idle_gpus(), 0);
    }

    /// A 4-GPU data-parallel gang spread 2 + 2 over the nodes, with `[consolidate]`
    /// (no protection) and the 6-GPU job beside it on node 0 ended at `t0 + 3`: a
    /// cycle may move it onto node 0. Returns the gang's id.
    fn spread_gang(inner: &mut Inner, t0: i64) -> u32 {
        let path = NoModel.decision_path("topo-pack");
        register_both(inner, t0);
        let fillers: Vec<u32> = (0..2)
            .map(|_| inner.submit(Some(&whole_gpu_job(1, 6)), t0).unwrap())
            .collect();
        inner.cycle(t0, &path);
        let gang_spec = pb::JobSpec {
            preemptible: true,
            comm: pb::CommPattern::DataParallel as i32,
            ..whole_gpu_job(4, 1)
        };
        let gang = inner.submit(Some(&gang_spec), t0 + 1).unwrap();
        inner.cycle(t0 + 2, &path);
        assert_eq!(gang_nodes(inner, gang).len(), 2, "spread 2 + 2");
        let on_node0 = fillers
            .iter()
            .copied()
            .find(|id| inner.jobs_on(NodeId(0)).contains(id))
            .unwrap();
        inner.cancel(on_node0, "", t0 + 3).unwrap();
        gang
    }

    fn consolidating() -> ServiceConfig {
        ServiceConfig {
            consolidate: Some(crate::framework::ConsolidateConfig {
                protect_s: 0.0,
                ..Default::default()
            }),
            ..ServiceConfig::default()
        }
    }

    fn gang_nodes(inner: &Inner, gang: u32) -> Vec<NodeId> {
        let mut n: Vec<NodeId> = inner.jobs[&gang]
            .placement
            .as_ref()
            .unwrap()
            .workers
            .iter()
            .map(|w| w.node)
            .collect();
        n.sort_unstable();
        n.dedup();
        n
    }

    /// One cycle at `at`, with both agents heard from just before.
    fn cycle_at(inner: &mut Inner, at: i64) {
        for n in 0..2 {
            inner.heard_from(NodeId(n), at);
        }
        inner.cycle(at, &NoModel.decision_path("topo-pack"));
    }

    /// A RUNNING report from node `node` carrying a checkpoint time.
    fn checkpoint_report(node: usize, id: u32, unix_s: f64) -> pb::ReportJobRequest {
        pb::ReportJobRequest {
            last_checkpoint_unix_s: unix_s,
            ..report(node, id, pb::JobState::Running)
        }
    }

    /// Once the job beside the spread gang has ended and the gang has run long enough
    /// for the predicted gain to exceed the restart, it moves onto that node, recorded
    /// with the prediction in its reason, counted as a migration, and as a decision
    /// that Explain returns with both placements and the numbers.
    #[test]
    fn a_consolidation_is_recorded_with_its_prediction() {
        let test = TestCore::new(consolidating());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let gang = spread_gang(&mut inner, t0);
        let from = WorkerRecord::of(inner.jobs[&gang].placement.as_ref().unwrap(), &inner.topo);
        let placed_by = inner.jobs[&gang].decision_id;
        // A cycle right after moves nothing (the gang has run for no time: no
        // predicted gain), one an hour later moves it.
        inner.cycle(t0 + 4, &NoModel.decision_path("topo-pack"));
        assert_eq!(inner.metrics.migrations.get(), 0);
        let _ = inner.take_batch();
        cycle_at(&mut inner, t0 + 3_600_000_000);
        assert_eq!(inner.metrics.migrations.get(), 1);
        assert_eq!(gang_nodes(&inner, gang), vec![NodeId(0)]);
        let r = &inner.jobs[&gang];
        assert_eq!(r.attempts, 2);
        assert!(r.reason.contains("tighter placement"), "{}", r.reason);
        assert!(r.reason.contains("predicted gain"), "{}", r.reason);
        inner.state.check_consistency().unwrap();

        let decision = r.decision_id;
        assert!(decision > placed_by);
        let to = WorkerRecord::of(r.placement.as_ref().unwrap(), &inner.topo);
        let (_, (batch, _), events) = inner.take_batch();
        test.core.store.commit(&batch).unwrap();
        let d = test.core.store.decision(decision).unwrap().unwrap();
        assert_eq!(
            (d.verdict, d.path.as_str()),
            (Verdict::Migrate, "heuristic:consolidate")
        );
        assert_eq!(
            (d.placement.clone(), d.job.clone()),
            (to.clone(), gang.to_string())
        );
        let m = d.migration.clone().unwrap();
        assert_eq!(
            (m.kind, m.from.clone()),
            (MigrationKind::Consolidate, from.clone())
        );
        assert_eq!(m.safety_factor, Some(2.0));
        let gain = m.gain_s.unwrap();
        // No checkpoint reported: the cost is the restart alone.
        assert_eq!((m.cost_s, m.lost_work_s), (m.restart_s, 0.0));
        assert!(gain > m.cost_s * 2.0, "{m:?}");
        assert_eq!(m.to_span.as_deref(), Some("NvlinkIsland"));
        // What Explain answers, and the decision-log row.
        let e = d.to_pb(&inner.topo.catalog);
        assert_eq!(e.verdict, pb::Verdict::Migrate as i32);
        assert_eq!(e.placement, WorkerRecord::to_pb(&to));
        let em = e.migration.unwrap();
        assert_eq!(
            (em.kind.as_str(), em.from),
            ("consolidate", WorkerRecord::to_pb(&from))
        );
        assert_eq!(
            (em.gain_s, em.cost_s, em.safety_factor),
            (Some(gain), m.cost_s, Some(2.0))
        );
        let row = d.log_row();
        assert_eq!(row.verdict, "migrate");
        assert!(
            row.reason.starts_with("consolidate from n-"),
            "{}",
            row.reason
        );
        // The job's events of the move name the decision.
        let named: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Job(j) if j.job_id == gang as u64 => Some(j.decision_id),
                _ => None,
            })
            .collect();
        assert_eq!(named, vec![decision, decision]);
    }

    /// The work since the last reported checkpoint counts in a move's cost: a
    /// checkpoint an hour old makes the move cost more than it gains, a recent one lets
    /// it happen, with the lost work in its record.
    #[test]
    fn a_reported_checkpoint_sets_what_a_consolidation_would_lose() {
        let test = TestCore::new(consolidating());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let gang = spread_gang(&mut inner, t0);
        let start_s = t0 as f64 / 1e6;
        inner
            .report(&checkpoint_report(0, gang, start_s + 1.0), t0 + 4)
            .unwrap();
        assert_eq!(inner.jobs[&gang].state, JobState::Running);
        assert_eq!(inner.jobs[&gang].last_checkpoint_s, Some(start_s + 1.0));
        let later = t0 + 3_600_000_000;
        cycle_at(&mut inner, later);
        assert_eq!(
            inner.metrics.migrations.get(),
            0,
            "an hour of work would be lost"
        );

        let later_s = later as f64 / 1e6;
        inner
            .report(&checkpoint_report(1, gang, later_s - 10.0), later)
            .unwrap();
        // An older report (another node's, late) does not move it back.
        inner
            .report(&checkpoint_report(0, gang, later_s - 20.0), later)
            .unwrap();
        assert_eq!(inner.jobs[&gang].last_checkpoint_s, Some(later_s - 10.0));
        cycle_at(&mut inner, later + 1_000_000);
        assert_eq!(inner.metrics.migrations.get(), 1);
        let r = &inner.jobs[&gang];
        // The new placement has written no checkpoint yet.
        assert_eq!(r.last_checkpoint_s, None);
        let d = inner
            .dirty
            .decisions
            .iter()
            .find(|d| d.id == r.decision_id)
            .unwrap();
        let m = d.migration.as_ref().unwrap();
        assert!((m.lost_work_s - 11.0).abs() < 1e-3, "{m:?}");
        // Those 11 s redone at the faster speed of the tighter placement.
        let redone = m.cost_s - m.restart_s;
        assert!(redone > 5.0 && redone < 11.0, "{m:?}");
    }

    #[test]
    fn a_bad_checkpoint_time_is_refused_and_changes_nothing() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let id = placed_over_both_nodes(&mut inner, t0);
        let now_s = t0 as f64 / 1e6;
        for bad in [f64::NAN, now_s + 3_600.0, now_s - 3_600.0] {
            let err = inner
                .report(&checkpoint_report(0, id, bad), t0 + 1)
                .unwrap_err();
            match err {
                ServiceError::InvalidArgument(m) => {
                    assert!(m.starts_with("last_checkpoint_unix_s"), "{m}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let completed = pb::ReportJobRequest {
            last_checkpoint_unix_s: now_s,
            ..report(0, id, pb::JobState::Completed)
        };
        assert!(matches!(
            inner.report(&completed, t0 + 1),
            Err(ServiceError::InvalidArgument(_))
        ));
        let r = &inner.jobs[&id];
        assert_eq!((r.state, r.last_checkpoint_s), (JobState::Placed, None));
        assert!(r.completed_nodes.is_empty());
    }

    #[test]
    fn a_reported_checkpoint_survives_a_restart() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        let id = placed_over_both_nodes(&mut inner, t0);
        let at = t0 as f64 / 1e6 + 0.5;
        inner.report(&checkpoint_report(1, id, at), t0 + 1).unwrap();
        let (_, (batch, _), _) = inner.take_batch();
        test.core.store.commit(&batch).unwrap();
        drop(inner);
        let restored = test.restart(config);
        let again = restored.lock();
        assert_eq!(again.jobs[&id].last_checkpoint_s, Some(at));
        let pb_job = crate::service::convert::job_to_pb(&again.jobs[&id], &again.topo);
        assert_eq!(pb_job.last_checkpoint_unix_s, at);
    }

    /// A database restored from a snapshot older than its decision log (here: one that
    /// never committed the decisions its log holds) resumes its decision ids above the
    /// log's, so no id joins two jobs' rows; without a log entry above them it keeps its own.
    #[test]
    fn decision_ids_resume_above_the_log_after_a_restore_from_an_older_snapshot() {
        let log_dir = tempfile::tempdir().unwrap();
        let config = ServiceConfig {
            decision_log_dir: Some(log_dir.path().to_path_buf()),
            ..ServiceConfig::default()
        };
        let test = TestCore::new(config.clone());
        let database = test.core.store.load().unwrap().database_id;
        assert_eq!(test.core.lock().next_decision, 1);
        let written =
            crate::decision_log::write_placements(log_dir.path(), Some(database), 1..13, 8192);
        assert_eq!(written.rows_written, 12);
        let restored = test.restart(config.clone());
        let mut inner = restored.lock();
        assert_eq!(inner.next_decision, 13);
        let t0 = crate::service::core::now_us();
        let id = placed_over_both_nodes(&mut inner, t0);
        assert_eq!(inner.jobs[&id].decision_id, 13);
        // The new id is committed with the first epoch, so the next start keeps it.
        let (_, (batch, _), _) = inner.take_batch();
        restored.store.commit(&batch).unwrap();
        drop(inner);
        assert_eq!(test.restart(config).lock().next_decision, 14);
    }

    /// A quota's wait reason written before a restart is cleared after it, as one
    /// written since would be, once the quota no longer holds the job.
    #[test]
    fn a_wait_reason_from_before_a_restart_is_cleared_when_the_wait_ends() {
        let config = ServiceConfig {
            quota: Some(
                crate::framework::QuotaConfig::from_toml("[tenants.vision]\ngpus = 8\n").unwrap(),
            ),
            policy: "priority".into(),
            ..ServiceConfig::default()
        };
        let test = TestCore::new(config.clone());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let path = NoModel.decision_path("priority");
        let of = |tenant: &str, priority: i32| pb::JobSpec {
            tenant: tenant.into(),
            priority,
            ..whole_gpu_job(1, 8)
        };
        let first = inner.submit(Some(&of("vision", 0)), t0).unwrap();
        let second = inner.submit(Some(&of("vision", 0)), t0).unwrap();
        inner.submit(Some(&of("nlp", 0)), t0).unwrap();
        inner.cycle(t0, &path);
        assert!(inner.jobs[&second].reason.starts_with("waiting: tenant"));
        let (_, (batch, _), _) = inner.take_batch();
        test.core.store.commit(&batch).unwrap();
        drop(inner);
        let restored = test.restart(config);
        let mut inner = restored.lock();
        register_both(&mut inner, t0 + 1);
        // Vision's running job ends while an urgent job of another tenant takes its
        // GPUs: the quota no longer holds the waiting job, the full cluster does.
        inner.submit(Some(&of("nlp", 5)), t0 + 2).unwrap();
        inner.cancel(first, "", t0 + 2).unwrap();
        inner.cycle(t0 + 2, &path);
        let r = &inner.jobs[&second];
        assert_eq!(r.state, JobState::Pending);
        assert_eq!(r.reason, "", "the quota no longer holds it");
    }
}
