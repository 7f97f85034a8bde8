//! Queue orders.

use crate::domain::Job;
use crate::framework::{JobStats, QueueOrder, Rank};

/// Arrival order.
#[derive(Debug, Default)]
pub struct Fifo;

impl QueueOrder for Fifo {
    fn rank(&self, job: &Job, _: &JobStats, _: f64) -> Rank {
        (0, job.submit_time)
    }
}

/// Priority class first (higher priority first), then age.
#[derive(Debug, Default)]
pub struct PriorityAge;

impl QueueOrder for PriorityAge {
    fn rank(&self, job: &Job, _: &JobStats, _: f64) -> Rank {
        (-(job.priority as i64), job.submit_time)
    }
}

/// Shortest remaining time first, with the true remaining work: the clairvoyant reference.
#[derive(Debug, Default)]
pub struct ShortestRemaining;

impl QueueOrder for ShortestRemaining {
    fn rank(&self, _: &Job, stats: &JobStats, _: f64) -> Rank {
        (0, stats.remaining_work)
    }
}

/// Tiresias' discretised two-dimensional least-attained-service order (Gu et al.,
/// "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", NSDI'19, §3.2):
/// attained service is GPUs × time run; a job sits in queue `k` while its service is
/// below `thresholds[k]`; lower queues go first, FIFO by arrival within a queue. A job
/// that has waited longer than `starve_factor` × its last run is promoted to the top
/// queue (the paper's PROMOTEKNOB).
#[derive(Debug, Clone)]
pub struct DiscretizedLas {
    /// Queue boundaries in GPU-seconds, ascending.
    pub thresholds: Vec<f64>,
    /// `None` disables promotion.
    pub starve_factor: Option<f64>,
}

impl Default for DiscretizedLas {
    /// Two boundaries, at one and at ten GPU-hours: Philly's median multi-GPU job
    /// crosses the first within its first hour, so short jobs overtake it quickly.
    fn default() -> Self {
        DiscretizedLas {
            thresholds: vec![3_600.0, 36_000.0],
            starve_factor: None,
        }
    }
}

impl DiscretizedLas {
    pub fn queue_of(&self, attained_gpu_s: f64) -> usize {
        self.thresholds
            .iter()
            .take_while(|&&t| attained_gpu_s >= t)
            .count()
    }

    /// GPU-seconds of service at which a job at `attained_gpu_s` moves down a queue.
    pub fn next_threshold(&self, attained_gpu_s: f64) -> Option<f64> {
        self.thresholds
            .iter()
            .copied()
            .find(|&t| attained_gpu_s < t)
    }
}

impl QueueOrder for DiscretizedLas {
    fn rank(&self, job: &Job, stats: &JobStats, now: f64) -> Rank {
        let starving = self.starve_factor.is_some_and(|f| {
            stats.last_run_s > 0.0 && now - stats.queued_since >= f * stats.last_run_s
        });
        let queue = if starving {
            0
        } else {
            self.queue_of(stats.attained_gpu_s)
        };
        (queue as i64, job.submit_time)
    }

    fn rank_changes_in(&self, _: &Job, stats: &JobStats, gpus: u32) -> Option<f64> {
        let next = self.next_threshold(stats.attained_gpu_s)?;
        (gpus > 0).then(|| (next - stats.attained_gpu_s) / gpus as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::JobId;

    #[test]
    fn las_demotes_at_thresholds_and_promotes_starving_jobs() {
        let las = DiscretizedLas {
            thresholds: vec![100.0, 1000.0],
            starve_factor: Some(2.0),
        };
        let job = Job::whole_gpus(JobId(1), 4, 5.0, 1.0);
        let stats = |attained, queued_since, last_run_s| JobStats {
            attained_gpu_s: attained,
            queued_since,
            last_run_s,
            ..JobStats::default()
        };
        assert_eq!(las.rank(&job, &stats(0.0, 0.0, 0.0), 10.0), (0, 5.0));
        assert_eq!(las.rank(&job, &stats(100.0, 0.0, 0.0), 10.0).0, 1);
        assert_eq!(las.rank(&job, &stats(5000.0, 9.0, 10.0), 10.0).0, 2);
        assert_eq!(
            las.rank(&job, &stats(5000.0, 0.0, 10.0), 20.0).0,
            0,
            "waited 2x its run"
        );
        assert_eq!(las.next_threshold(150.0), Some(1000.0));
        assert_eq!(las.next_threshold(1000.0), None);
    }

    #[test]
    fn priority_outranks_age() {
        let mut old = Job::whole_gpus(JobId(1), 1, 0.0, 1.0);
        let mut young = Job::whole_gpus(JobId(2), 1, 50.0, 1.0);
        old.priority = 0;
        young.priority = 5;
        let s = JobStats::default();
        assert!(PriorityAge.rank(&young, &s, 0.0) < PriorityAge.rank(&old, &s, 0.0));
        assert!(Fifo.rank(&old, &s, 0.0) < Fifo.rank(&young, &s, 0.0));
    }
}
