//! Requests that change state, applied under the scheduler's lock: submit, cancel,
//! agent reports, node registration with reconciliation, drain, cordon, telemetry.

use crate::domain::{JobId, NodeId};
use crate::framework::can_ever_fit;
use crate::service::convert::{job_from_spec, node_counts, node_group};
use crate::service::core::{Event, Inner};
use crate::service::error::ServiceError;
use crate::service::jobs::{JobRecord, JobState};
use crate::service::pb;

/// What a registering agent is told.
#[derive(Debug)]
pub struct Registration {
    pub node: NodeId,
    pub stop: Vec<pb::RunningJob>,
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
    pub fn jobs_on(&self, n: NodeId) -> Vec<u32> {
        let name = &self.topo.node(n).name;
        self.active
            .iter()
            .copied()
            .filter(|id| {
                let r = &self.jobs[id];
                r.placement
                    .as_ref()
                    .is_some_and(|p| p.workers.iter().any(|w| w.node == n))
                    && !r.completed_nodes.contains(name)
            })
            .collect()
    }

    /// START assignments of everything `n` should run now.
    pub fn node_assignments(&self, n: NodeId) -> Vec<pb::Assignment> {
        self.jobs_on(n)
            .into_iter()
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
            jobs: self.jobs_on(n).len() as u32,
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
        let fits = can_ever_fit(&job, &self.topo);
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
            tracing::warn!(node = n.0, reason = %r.reason, "node quarantined");
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
        if req.attempt != 0 && req.attempt != attempts {
            return Err(ServiceError::FailedPrecondition(format!(
                "job {id}: the report is about placement {} but the job is on placement {attempts}",
                req.attempt
            )));
        }
        match crate::service::convert::state_from_pb("state", req.state)? {
            JobState::Running if current == JobState::Running => Ok(id),
            JobState::Running => {
                self.set_state(id, JobState::Running, req.message.clone(), None, false, now)?;
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
        if !r.completed_nodes.contains(&name) {
            r.completed_nodes.push(name);
        }
        let topo = &self.topo;
        let missing = nodes
            .iter()
            .filter(|&&m| !r.completed_nodes.contains(&topo.node(m).name))
            .count();
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
        if group.cpu_milli < inv.cpu_milli || group.memory_mib < inv.memory_mib {
            return Err(ServiceError::FailedPrecondition(format!(
                "node {name} reports {} mCPU / {} MiB, less than the inventory's {} mCPU / {} MiB",
                group.cpu_milli, group.memory_mib, inv.cpu_milli, inv.memory_mib
            )));
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
        self.heard_from(n, now);
        self.mark_node(n);
        Ok(Registration { node: n, stop })
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
    use crate::service::testkit::{TestCore, node_info, register_both, whole_gpu_job};

    use super::*;

    fn report(node: usize, id: u32, state: pb::JobState) -> pb::ReportJobRequest {
        pb::ReportJobRequest {
            node: format!("n-{node}"),
            job_id: id as u64,
            state: state as i32,
            message: String::new(),
            attempt: 0,
        }
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
        let expected: Vec<(u32, Option<crate::domain::Placement>)> = moved
            .iter()
            .chain([&gang])
            .map(|id| (*id, inner.jobs[id].placement.clone()))
            .collect();
        drop(inner);
        let restored = crate::service::core::Core::restore(
            &ServiceConfig {
                db: std::path::PathBuf::from("unused.redb"),
                ..config
            },
            &crate::domain::ClusterSpec::from_toml(crate::service::testkit::TWO_NODES).unwrap(),
            test.core.store.clone(),
            std::sync::Arc::new(crate::service::metrics::Metrics::new()),
            std::sync::Arc::new(NoModel),
        )
        .unwrap();
        let again = restored.lock();
        for (id, placement) in expected {
            assert_eq!(again.jobs[&id].placement, placement, "job {id}");
        }
        assert_eq!(again.state.idle_gpus(), 0);
    }

    /// A 4-GPU data-parallel gang spread 2 + 2 over the nodes: with `[consolidate]`,
    /// once the job beside it on one node ends and it has run long enough for the
    /// predicted gain to exceed the restart, it moves onto that node, recorded with the
    /// prediction in its reason and counted as a migration.
    #[test]
    fn a_consolidation_is_recorded_with_its_prediction() {
        let config = ServiceConfig {
            consolidate: Some(crate::framework::ConsolidateConfig {
                protect_s: 0.0,
                ..Default::default()
            }),
            ..ServiceConfig::default()
        };
        let test = TestCore::new(config);
        let mut inner = test.core.lock();
        let path = NoModel.decision_path("topo-pack");
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
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
        let nodes = |inner: &Inner| {
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
        };
        assert_eq!(nodes(&inner).len(), 2, "spread 2 + 2");
        // The filler on node 0 ends; a cycle right after moves nothing (the gang has run
        // for no time: no predicted gain), one an hour later moves it.
        let on_node0 = fillers
            .iter()
            .copied()
            .find(|id| inner.jobs_on(NodeId(0)).contains(id))
            .unwrap();
        inner.cancel(on_node0, "", t0 + 3).unwrap();
        inner.cycle(t0 + 4, &path);
        assert_eq!(inner.metrics.migrations.get(), 0);
        let later = t0 + 3_600_000_000;
        for n in 0..2 {
            inner.heard_from(NodeId(n), later);
        }
        inner.cycle(later, &path);
        assert_eq!(inner.metrics.migrations.get(), 1);
        assert_eq!(nodes(&inner), vec![NodeId(0)]);
        let r = &inner.jobs[&gang];
        assert_eq!(r.attempts, 2);
        assert!(r.reason.contains("tighter placement"), "{}", r.reason);
        assert!(r.reason.contains("predicted gain"), "{}", r.reason);
        inner.state.check_consistency().unwrap();
    }
}
