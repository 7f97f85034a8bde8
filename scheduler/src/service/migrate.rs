//! A running job's move (rebalancing or consolidation) as the service applies it: a
//! decision record for `Explain` and the decision log, then a preemption of the old
//! placement and at once a new placement, both job events carrying the decision's id.

use crate::domain::{ClusterState, Placement};
use crate::framework::Consolidation;
use crate::service::checkpoint::since_checkpoint_s;
use crate::service::core::{Event, Inner};
use crate::service::error::ServiceError;
use crate::service::jobs::JobState;
use crate::service::records::{
    DecisionRecord, MigrationKind, MigrationRecord, Verdict, WorkerRecord,
};

/// What every move of one cycle shares.
pub(crate) struct MoveContext<'a> {
    /// The cluster at the start of the cycle.
    pub before: &'a ClusterState,
    pub queue_depth: u32,
    /// The cycle's decision path (its placer placed a rebalanced job again).
    pub path: String,
    pub now: i64,
}

impl Inner {
    /// Why job `id` moves out of the way of the blocked gang `gang` (a pending job id).
    pub(crate) fn rebalance_record(
        &self,
        id: u32,
        gang: Option<u32>,
        now_s: f64,
    ) -> MigrationRecord {
        let r = &self.jobs[&id];
        let (lost, restart) = (since_checkpoint_s(r, now_s), r.job.checkpoint.restart_s);
        MigrationRecord {
            kind: MigrationKind::Rebalance,
            from: Vec::new(),
            from_span: None,
            to_span: None,
            gain_s: None,
            safety_factor: None,
            // What the job loses in time: its restart and the work since its checkpoint.
            cost_s: restart + lost,
            restart_s: restart,
            lost_work_s: lost,
            for_job: gang.map(|g| g.to_string()),
            for_job_name: gang.and_then(|g| Some(self.jobs.get(&g)?.job.name.clone())),
        }
    }

    /// Why job `id` moves onto the tighter placement of `c`.
    pub(crate) fn consolidation_record(
        &self,
        id: u32,
        c: &Consolidation,
        now_s: f64,
    ) -> MigrationRecord {
        let r = &self.jobs[&id];
        MigrationRecord {
            kind: MigrationKind::Consolidate,
            from: Vec::new(),
            from_span: Some(format!("{:?}", c.from_span)),
            to_span: Some(format!("{:?}", c.to_span)),
            gain_s: Some(c.gain_s),
            safety_factor: self.policy.consolidate.as_ref().map(|k| k.safety_factor),
            cost_s: c.cost_s,
            restart_s: r.job.checkpoint.restart_s,
            lost_work_s: since_checkpoint_s(r, now_s),
            for_job: None,
            for_job_name: None,
        }
    }

    /// Moves running job `id` to `to` (the cycle has already moved it in the cluster
    /// state) for the reasons in `why`, and records the decision. Returns its id, which
    /// becomes the job's `decision_id`: the decision behind its current placement.
    pub(crate) fn migrate(
        &mut self,
        id: u32,
        to: Placement,
        mut why: MigrationRecord,
        ctx: &MoveContext<'_>,
    ) -> Result<u64, ServiceError> {
        // Taken before the transitions: a failed one leaves a gap, never a reused id.
        let decision = self.next_decision;
        self.next_decision += 1;
        self.dirty.meta = true;
        let r = self.record(id)?;
        why.from = r
            .placement
            .as_ref()
            .map(|p| WorkerRecord::of(p, &self.topo))
            .unwrap_or_default();
        let reason = format!("migrated to {}", why.why());
        let record = DecisionRecord {
            id: decision,
            source: "cycle".into(),
            at_us: ctx.now,
            job: id.to_string(),
            spec: r.job.clone(),
            policy: self.policy.name.clone(),
            // Consolidation's search is topo-pack's, whatever the policy's placer.
            path: match why.kind {
                MigrationKind::Consolidate => "heuristic:consolidate".into(),
                MigrationKind::Rebalance => ctx.path.clone(),
            },
            confidence: None,
            verdict: Verdict::Migrate,
            reason: reason.clone(),
            placement: WorkerRecord::of(&to, &self.topo),
            queue_depth: ctx.queue_depth,
            idle_gpus: ctx.before.idle_gpus(),
            feasible_nodes: 0,
            candidates: Vec::new(),
            model_version: None,
            gate_threshold: None,
            score_note: "no score: a migration; `migration` has where the job was and why it moved"
                .into(),
            scored: Vec::new(),
            migration: Some(why),
            features: None,
        };
        let now = ctx.now;
        self.set_state(id, JobState::Preempted, reason.clone(), None, false, now)?;
        self.tag_last_job_event(decision);
        // Set between the two transitions: the old placement's outcome goes to the
        // decision that made it, the new one's to this one.
        if let Some(r) = self.jobs.get_mut(&id) {
            r.decision_id = decision;
        }
        self.set_state(id, JobState::Placed, reason, Some(to), false, now)?;
        self.dirty.decisions.push(record);
        Ok(decision)
    }

    /// Gives the job event just pushed (a migration's stop half) the decision's id.
    fn tag_last_job_event(&mut self, decision: u64) {
        if let Some(Event::Job(e)) = self
            .dirty
            .events
            .iter_mut()
            .rev()
            .find(|e| matches!(e, Event::Job(_)))
        {
            e.decision_id = decision;
        }
    }
}
