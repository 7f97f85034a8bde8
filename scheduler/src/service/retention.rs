//! Retention: finished jobs are deleted a configured time after they ended
//! ([`ServiceConfig::finished_job_retention_s`]), as Kubernetes' TTL-after-finished
//! deletes Jobs and slurmdbd purges old records; otherwise every job ever submitted
//! stays in memory and in the database, and is read back at every start.
//!
//! Only the job record goes. Its decision records stay (Explain answers for them), the
//! Parquet decision log keeps its rows, and ids are never reused (the id counter is
//! persisted on its own). An idempotency key is free again once its job is deleted: a
//! retried submit that late creates a new job.
//!
//! Decision records have a retention of their own
//! ([`ServiceConfig::decision_retention_s`]). Their ids grow with time, so each check
//! notes the next id and the time, and once a note is older than the retention every
//! decision below its id is deleted in one range. After a restart the notes start
//! again, so decisions made before it go one retention after the restart: later than
//! due, never earlier.
//!
//! [`ServiceConfig::decision_retention_s`]: crate::service::config::ServiceConfig::decision_retention_s
//!
//! [`ServiceConfig::finished_job_retention_s`]: crate::service::config::ServiceConfig::finished_job_retention_s

use crate::service::core::Inner;

impl Inner {
    /// Deletes the jobs that reached a final state more than the retention ago (none
    /// without one); their deletion goes into the open epoch. Returns how many.
    pub fn purge_finished(&mut self, now_us: i64) -> usize {
        let Some(retention) = self.retention_us else {
            return 0;
        };
        let cutoff = now_us.saturating_sub(retention);
        let expired: Vec<u32> = self
            .jobs
            .iter()
            .filter(|(_, r)| r.state.is_final() && r.updated_at_us < cutoff)
            .map(|(&id, _)| id)
            .collect();
        for id in &expired {
            let Some(record) = self.jobs.remove(id) else {
                continue;
            };
            if let Some(key) = &record.idempotency_key
                && self.idempotency.get(key) == Some(id)
            {
                self.idempotency.remove(key);
            }
            self.dirty.jobs.remove(id);
        }
        if !expired.is_empty() {
            tracing::info!(
                jobs = expired.len(),
                "finished jobs past their retention deleted"
            );
        }
        self.dirty.purged_jobs.extend(&expired);
        expired.len()
    }

    /// Notes the next decision id at `now_us`, and deletes (in the open epoch) every
    /// decision made before the newest note older than the retention. Returns the id
    /// below which decisions go, when it moved.
    pub fn purge_decisions(&mut self, now_us: i64) -> Option<u64> {
        let retention = self.decision_retention_us?;
        // A note for the same id as the last one says less than it: skip it, so an idle
        // server keeps one note, not one per check.
        if self
            .decision_marks
            .back()
            .is_none_or(|&(id, _)| id != self.next_decision)
        {
            self.decision_marks.push_back((self.next_decision, now_us));
        }
        let cutoff = now_us.saturating_sub(retention);
        let mut below = None;
        while let Some(&(id, at)) = self.decision_marks.front()
            && at < cutoff
        {
            below = Some(id);
            self.decision_marks.pop_front();
        }
        let below = below.filter(|&id| self.dirty.decisions_before.is_none_or(|b| id > b))?;
        self.dirty.decisions_before = Some(below);
        tracing::info!(below, "decision records past their retention deleted");
        Some(below)
    }
}

#[cfg(test)]
mod tests {
    use crate::service::config::ServiceConfig;
    use crate::service::jobs::JobState;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::pb;
    use crate::service::testkit::{TestCore, register_both, whole_gpu_job};

    const S: i64 = 1_000_000;

    #[test]
    fn finished_jobs_go_after_the_retention_and_live_ones_stay() {
        let test = TestCore::new(ServiceConfig {
            finished_job_retention_s: Some(60),
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let path = NoModel.decision_path("topo-pack");
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let keyed = pb::JobSpec {
            idempotency_key: "retry-me".into(),
            ..whole_gpu_job(1, 1)
        };
        let cancelled = inner.submit(Some(&keyed), t0).unwrap();
        inner.cancel(cancelled, "not needed", t0 + S).unwrap();
        let running = inner.submit(Some(&whole_gpu_job(1, 2)), t0 + S).unwrap();
        let late = inner.submit(Some(&whole_gpu_job(1, 1)), t0 + S).unwrap();
        inner.cycle(t0 + 2 * S, &path);
        assert_eq!(inner.jobs[&running].state, JobState::Placed);
        inner.cancel(late, "later", t0 + 30 * S).unwrap();
        let (_, (first, _), _) = inner.take_batch();
        test.core.store.commit(&first).unwrap();

        // Not yet: 59 s after the first job ended.
        assert_eq!(inner.purge_finished(t0 + 60 * S), 0);
        // The first job's time is up; the later one and the placed one stay.
        assert_eq!(inner.purge_finished(t0 + 62 * S), 1);
        assert!(!inner.jobs.contains_key(&cancelled));
        assert!(inner.jobs.contains_key(&late) && inner.jobs.contains_key(&running));
        assert!(!inner.idempotency.contains_key("retry-me"));
        let (_, (batch, _), _) = inner.take_batch();
        assert_eq!(batch.deleted_jobs, vec![u64::from(cancelled)]);
        test.core.store.commit(&batch).unwrap();
        let stored: Vec<u32> = test
            .core
            .store
            .load()
            .unwrap()
            .jobs
            .iter()
            .map(|r| r.job.id.0)
            .collect();
        assert_eq!(stored, vec![running, late]);

        // The key is free: a retry this late is a new job, with a new id.
        let again = inner.submit(Some(&keyed), t0 + 63 * S).unwrap();
        assert!(again > late);
        // A placed job is never deleted, however old.
        assert_eq!(inner.purge_finished(t0 + 10_000 * S), 1);
        assert!(inner.jobs.contains_key(&running));
    }

    #[test]
    fn decisions_older_than_their_retention_are_deleted_in_id_order() {
        let test = TestCore::new(ServiceConfig {
            decision_retention_s: Some(100),
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let path = NoModel.decision_path("topo-pack");
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let placed = |inner: &mut crate::service::core::Inner, at: i64| {
            let id = inner.submit(Some(&whole_gpu_job(1, 1)), at).unwrap();
            inner.cycle(at, &path);
            inner.jobs[&id].decision_id
        };
        let old = placed(&mut inner, t0);
        assert_eq!(inner.purge_decisions(t0 + 10 * S), None);
        let newer = placed(&mut inner, t0 + 20 * S);
        assert_eq!(inner.purge_decisions(t0 + 30 * S), None);
        let (_, (batch, _), _) = inner.take_batch();
        test.core.store.commit(&batch).unwrap();
        assert!(test.core.store.decision(old).unwrap().is_some());

        // 111 s: the note of 10 s is past the retention, so everything made before it
        // (the first decision) goes; the one made at 20 s stays.
        assert_eq!(inner.purge_decisions(t0 + 111 * S), Some(newer));
        let (_, (batch, _), _) = inner.take_batch();
        assert_eq!(batch.decisions_before, Some(newer));
        test.core.store.commit(&batch).unwrap();
        assert!(test.core.store.decision(old).unwrap().is_none());
        assert!(test.core.store.decision(newer).unwrap().is_some());
        // Nothing newer is due yet; the job records are untouched, and checks with no
        // decision in between add no note.
        assert_eq!(inner.purge_decisions(t0 + 112 * S), None);
        assert_eq!(inner.purge_decisions(t0 + 113 * S), None);
        assert_eq!(inner.decision_marks.len(), 1);
        assert_eq!(inner.jobs.len(), 2);
        // 131 s: the note of 30 s is due, and with it the second decision.
        assert!(
            inner
                .purge_decisions(t0 + 131 * S)
                .is_some_and(|b| b > newer)
        );
        let (_, (batch, _), _) = inner.take_batch();
        test.core.store.commit(&batch).unwrap();
        assert!(test.core.store.decision(newer).unwrap().is_none());
    }

    #[test]
    fn without_a_retention_nothing_is_deleted() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let id = inner.submit(Some(&whole_gpu_job(1, 1)), t0).unwrap();
        inner.cancel(id, "not needed", t0).unwrap();
        assert_eq!(inner.purge_finished(t0 + 1_000_000 * S), 0);
        assert!(inner.jobs.contains_key(&id));
        assert_eq!(inner.purge_decisions(t0 + 1_000_000 * S), None);
        assert!(inner.decision_marks.is_empty());
    }
}
