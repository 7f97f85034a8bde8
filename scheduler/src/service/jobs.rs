//! Job records and their state machine.
//!
//! ```text
//! pending ─► placed ─► running ─► completed
//!    ▲          │         ├─────► failed        (attempts used up)
//!    │          ├─────────┼─────► preempted ─┐  (waits in the queue again)
//!    │          └─────────┴─────► requeued ──┤  (node lost, agent failure with retries left)
//!    └────────────────────────────────────────┘
//! any non-final state ─► cancelled;  waiting ─► rejected (can never fit)
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::domain::{Job, Placement};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Placed,
    Running,
    Completed,
    Failed,
    Preempted,
    Requeued,
    Cancelled,
    Rejected,
}

impl JobState {
    pub const ALL: [JobState; 9] = [
        JobState::Pending,
        JobState::Placed,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Preempted,
        JobState::Requeued,
        JobState::Cancelled,
        JobState::Rejected,
    ];

    /// In the queue, waiting for a placement.
    pub fn is_waiting(self) -> bool {
        matches!(
            self,
            JobState::Pending | JobState::Preempted | JobState::Requeued
        )
    }

    /// Holding an allocation.
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Placed | JobState::Running)
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Rejected
        )
    }

    pub fn can_become(self, next: JobState) -> bool {
        use JobState::*;
        match (self, next) {
            (s, Cancelled) => !s.is_final(),
            (s, Placed | Rejected) => s.is_waiting(),
            (Placed, Running) => true,
            // An agent may report completion without having reported the start.
            (Placed | Running, Completed | Failed | Preempted | Requeued) => true,
            _ => false,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Placed => "placed",
            JobState::Running => "running",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Preempted => "preempted",
            JobState::Requeued => "requeued",
            JobState::Cancelled => "cancelled",
            JobState::Rejected => "rejected",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("job {job} is {from}; it cannot become {to}")]
pub struct InvalidTransition {
    pub job: u32,
    pub from: JobState,
    pub to: JobState,
}

/// Everything the server keeps about a job; persisted as one record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub job: Job,
    pub state: JobState,
    pub reason: String,
    /// Set exactly while the job is placed or running.
    pub placement: Option<Placement>,
    pub submitted_at_us: i64,
    pub updated_at_us: i64,
    pub decision_id: u64,
    pub attempts: u32,
    pub idempotency_key: Option<String>,
    /// Wall-clock seconds (Unix) when the current placement was made.
    pub placed_at_s: f64,
    /// GPU-seconds received in earlier runs (Tiresias' attained service).
    pub attained_gpu_s: f64,
    /// Wall-clock seconds (Unix) when it last entered the queue.
    pub queued_since_s: f64,
    /// Nodes of the current placement whose workers all exited with status 0. A job
    /// spread over several nodes completes when every one of them has said so; one
    /// FAILED report ends it at once. Cleared with each new placement.
    #[serde(default)]
    pub completed_nodes: Vec<String>,
    /// Wall-clock seconds (Unix) of the last checkpoint an agent reported for the
    /// current placement (`service::checkpoint`); `None`: none reported. Cleared with
    /// each new placement, whose run has written none yet.
    #[serde(default)]
    pub last_checkpoint_s: Option<f64>,
}

impl JobRecord {
    pub fn new(job: Job, key: Option<String>, now_us: i64) -> Self {
        JobRecord {
            job,
            state: JobState::Pending,
            reason: String::new(),
            placement: None,
            submitted_at_us: now_us,
            updated_at_us: now_us,
            decision_id: 0,
            attempts: 0,
            idempotency_key: key,
            placed_at_s: 0.0,
            attained_gpu_s: 0.0,
            queued_since_s: now_us as f64 / 1e6,
            completed_nodes: Vec::new(),
            last_checkpoint_s: None,
        }
    }

    /// Moves to `to`, keeping the placement consistent with the state: entering an
    /// active state needs `placement`, leaving one drops it (the caller releases the
    /// resources).
    pub fn transition(
        &mut self,
        to: JobState,
        reason: impl Into<String>,
        placement: Option<Placement>,
        now_us: i64,
    ) -> Result<(), InvalidTransition> {
        if !self.state.can_become(to) {
            return Err(InvalidTransition {
                job: self.job.id.0,
                from: self.state,
                to,
            });
        }
        let now_s = now_us as f64 / 1e6;
        if self.state.is_active() && !to.is_active() {
            self.attained_gpu_s +=
                (now_s - self.placed_at_s).max(0.0) * self.job.gpu_milli() as f64 / 1000.0;
            self.placement = None;
        }
        match to {
            JobState::Placed => {
                self.placement = placement;
                self.placed_at_s = now_s;
                self.attempts += 1;
                self.completed_nodes.clear();
                self.last_checkpoint_s = None;
            }
            s if s.is_waiting() => self.queued_since_s = now_s,
            _ => {}
        }
        self.state = to;
        self.reason = reason.into();
        self.updated_at_us = now_us;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::JobId;

    fn record() -> JobRecord {
        JobRecord::new(Job::whole_gpus(JobId(7), 2, 0.0, 10.0), None, 1_000_000)
    }

    #[test]
    fn the_happy_path_and_requeue_are_allowed() {
        let mut r = record();
        let p = Placement::default();
        r.transition(JobState::Placed, "", Some(p.clone()), 2_000_000)
            .unwrap();
        assert_eq!(r.attempts, 1);
        r.transition(JobState::Running, "", None, 3_000_000)
            .unwrap();
        assert!(r.placement.is_some());
        r.transition(JobState::Requeued, "node lost", None, 4_000_000)
            .unwrap();
        assert!(r.placement.is_none());
        // Placed for 2 s with 2 GPUs.
        assert!((r.attained_gpu_s - 4.0).abs() < 1e-9);
        assert_eq!(r.queued_since_s, 4.0);
        r.transition(JobState::Placed, "", Some(p), 5_000_000)
            .unwrap();
        r.transition(JobState::Completed, "", None, 6_000_000)
            .unwrap();
        assert!(r.state.is_final());
    }

    #[test]
    fn invalid_transitions_are_refused_and_leave_the_record_alone() {
        let mut r = record();
        let before = r.clone();
        let err = r
            .transition(JobState::Running, "", None, 2_000_000)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "job 7 is pending; it cannot become running"
        );
        assert_eq!(r, before);
        r.transition(JobState::Cancelled, "user", None, 2_000_000)
            .unwrap();
        for to in JobState::ALL {
            assert!(!r.state.can_become(to), "cancelled -> {to}");
        }
    }

    #[test]
    fn a_record_stored_before_completed_nodes_existed_still_loads() {
        let mut r = record();
        r.completed_nodes.push("n-0".into());
        let mut json: serde_json::Value = serde_json::to_value(&r).unwrap();
        json.as_object_mut().unwrap().remove("completed_nodes");
        let old: JobRecord = serde_json::from_value(json).unwrap();
        assert!(old.completed_nodes.is_empty());
        assert_eq!(old.job, r.job);
    }

    #[test]
    fn a_record_stored_before_checkpoint_reports_loads_and_a_new_placement_clears_one() {
        let mut r = record();
        r.last_checkpoint_s = Some(1.5);
        let mut json: serde_json::Value = serde_json::to_value(&r).unwrap();
        json.as_object_mut().unwrap().remove("last_checkpoint_s");
        let old: JobRecord = serde_json::from_value(json).unwrap();
        assert_eq!(old.last_checkpoint_s, None);

        r.transition(JobState::Placed, "", Some(Placement::default()), 2_000_000)
            .unwrap();
        assert_eq!(r.last_checkpoint_s, None);
    }
}
