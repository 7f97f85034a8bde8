//! Preemption by rank: a job may evict running jobs of a strictly lower priority class
//! (its rank's first component), choosing the smallest victim set it can find.

use crate::domain::{ClusterState, Job, Placement};
use crate::framework::{Candidate, Context, Placer, Preemptor, Rank, Running};

/// Evicts lower-class, preemptible jobs that have run at least `min_runtime_s`, cheapest
/// first: the least important class, then the least work lost (a job that just
/// checkpointed loses nothing), then the most recently started. Victims are released on a
/// scratch copy of the state until the job fits, and then every victim whose return would
/// still let it fit is spared (KAI-style checkpoint and rollback).
#[derive(Debug, Clone)]
pub struct PreemptLowerRank {
    pub min_runtime_s: f64,
}

impl Preemptor for PreemptLowerRank {
    fn min_runtime_s(&self) -> f64 {
        self.min_runtime_s
    }

    fn select_victims(
        &self,
        job: &Job,
        rank: Rank,
        candidates: &[Candidate<'_>],
        state: &ClusterState,
        placer: &dyn Placer,
        ctx: &mut Context,
    ) -> Option<(Vec<usize>, Placement)> {
        let now = ctx.now;
        let running: Vec<&Running> = candidates.iter().map(|c| &c.running).collect();
        let mut eligible: Vec<(Rank, usize)> = running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.job.preemptible && now - r.started_at >= self.min_runtime_s)
            .map(|(i, _)| (candidates[i].rank, i))
            .filter(|(r, _)| r.0 > rank.0)
            .collect();
        // Idle GPUs are a necessary condition only for whole-GPU gangs; a shared task may
        // fit beside others.
        let need = match job.gpu {
            crate::domain::GpuDemand::Whole(_) => job.gpu_count(),
            _ => 0,
        };
        let reclaimable: u32 = eligible
            .iter()
            .map(|&(_, i)| running[i].job.gpu_count())
            .sum();
        if state.idle_gpus() + reclaimable < need {
            return None;
        }
        eligible.sort_by(|(ra, a), (rb, b)| {
            let (a, b) = (&running[*a], &running[*b]);
            rb.0.cmp(&ra.0)
                .then(a.lost_work_s.total_cmp(&b.lost_work_s))
                .then(b.started_at.total_cmp(&a.started_at))
                .then(a.job.id.cmp(&b.job.id))
        });
        let mut scratch = state.clone();
        let mut victims = Vec::new();
        let mut fits = false;
        for &(_, i) in &eligible {
            scratch.release(running[i].job, running[i].placement);
            victims.push(i);
            if scratch.idle_gpus() >= need && placer.place(job, &mut scratch, ctx).is_ok() {
                fits = true;
                break;
            }
        }
        if !fits {
            return None;
        }
        for k in (0..victims.len()).rev() {
            let r = &running[victims[k]];
            if scratch.allocate(r.job, r.placement).is_err() {
                continue;
            }
            if placer.place(job, &mut scratch, ctx).is_ok() {
                victims.remove(k);
            } else {
                scratch.release(r.job, r.placement);
            }
        }
        let placement = placer.place(job, &mut scratch, ctx).ok()?;
        Some((victims, placement))
    }
}
