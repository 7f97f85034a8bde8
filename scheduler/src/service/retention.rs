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
    fn without_a_retention_nothing_is_deleted() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let id = inner.submit(Some(&whole_gpu_job(1, 1)), t0).unwrap();
        inner.cancel(id, "not needed", t0).unwrap();
        assert_eq!(inner.purge_finished(t0 + 1_000_000 * S), 0);
        assert!(inner.jobs.contains_key(&id));
    }
}
