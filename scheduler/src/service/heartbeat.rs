//! Node heartbeats: an agent is alive while it is heard from. Every registration,
//! telemetry sample, Heartbeat call, watch opened and job report counts; a registered node silent for
//! `node_timeout_ms` is marked unreachable (no new work), and once it has stayed so for
//! `node_grace_ms` more its jobs are requeued. Hearing from the agent again makes the
//! node schedulable again; jobs already requeued stay requeued (the agent is told to
//! stop them through its watch or at its next registration).

use crate::domain::NodeId;
use crate::service::core::Inner;
use crate::service::error::ServiceError;
use crate::service::jobs::JobState;

impl Inner {
    /// Notes that node `n`'s agent was heard from at `now`. Returns whether durable state
    /// changed (the node was unreachable and is back).
    pub fn heard_from(&mut self, n: NodeId, now: i64) -> bool {
        let steady = now - (self.wall_step)();
        let r = &mut self.nodes[n.0 as usize];
        // Not `max`: handlers racing for the lock move it back microseconds only.
        r.last_seen_us = now;
        r.last_seen_steady_us = steady;
        // A refused node's telemetry, reports or heartbeats do not bring it back: only
        // a registration that matches the inventory does.
        if !r.unreachable || r.refused {
            return false;
        }
        r.unreachable = false;
        r.unreachable_since_us = 0;
        tracing::info!(node = %self.topo.node(n).name, "node reachable again");
        self.mark_node(n);
        true
    }

    /// The Heartbeat RPC: `node`'s agent is alive. Returns the node and whether it
    /// was unreachable until now (its record changed and must be committed).
    pub fn heartbeat(&mut self, node: &str, now: i64) -> Result<(NodeId, bool), ServiceError> {
        let n = self.registered_node("node", node)?;
        Ok((n, self.heard_from(n, now)))
    }

    /// How long until the jobs of the registered, unreachable node `name` are requeued
    /// (µs, 0 when due); `None` for any other node. What a refused agent is told, so
    /// that it stops their workers then and no job runs here and elsewhere at once.
    pub fn requeue_in_us(&self, name: &str, now: i64) -> Option<i64> {
        let n = *self.node_index.get(name)?;
        let r = &self.nodes[n.0 as usize];
        if !(r.registered && r.unreachable) {
            return None;
        }
        let steady = now - (self.wall_step)();
        Some((r.unreachable_since_steady_us + self.node_grace_us - steady).max(0))
    }

    /// Marks silent nodes unreachable and requeues the jobs of nodes unreachable for
    /// longer than the grace period. Called by the driver before every cycle.
    pub fn check_heartbeats(&mut self, now: i64) {
        // Computed once, and only when some node is past its grace: the check runs
        // before every cycle, and a dead rack would otherwise cost a scan of every
        // active job per node per check.
        let mut jobs_by_node: Option<Vec<Vec<u32>>> = None;
        // Timeouts are measured on the monotonic clock; `now` (the wall clock) only
        // labels what happened.
        let steady = now - (self.wall_step)();
        for i in 0..self.nodes.len() {
            let n = NodeId(i as u32);
            let r = &mut self.nodes[i];
            if !r.registered {
                continue;
            }
            if !r.unreachable {
                if steady - r.last_seen_steady_us < self.node_timeout_us {
                    continue;
                }
                r.unreachable = true;
                r.unreachable_since_us = now;
                r.unreachable_since_steady_us = steady;
                tracing::warn!(
                    node = %self.topo.node(n).name,
                    silent_ms = (steady - r.last_seen_steady_us) / 1000,
                    "node unreachable: no heartbeat"
                );
                self.mark_node(n);
            }
            let since = self.nodes[i].unreachable_since_steady_us;
            if steady - since < self.node_grace_us {
                continue;
            }
            let jobs = jobs_by_node.get_or_insert_with(|| self.jobs_by_node());
            let on_node = std::mem::take(&mut jobs[i]);
            let name = self.topo.node(n).name.clone();
            // A job of two dead nodes was requeued with the first.
            for id in on_node {
                if !self.runs_on(id, n) {
                    continue;
                }
                let reason = format!(
                    "node {name} unreachable for {:.1} s (heartbeat timeout plus grace); requeued",
                    (steady - since) as f64 / 1e6
                );
                match self.set_state(id, JobState::Requeued, reason, None, true, now) {
                    Ok(()) => {
                        self.metrics.node_lost_requeues.inc();
                    }
                    Err(e) => tracing::error!(job = id, error = %e, "requeue not recorded"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::service::config::ServiceConfig;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::testkit::{TestCore, register_both, whole_gpu_job};

    use super::*;

    /// Nodes time out after 1 s of silence and lose their jobs 2 s later.
    fn short_timeouts() -> TestCore {
        TestCore::new(ServiceConfig {
            node_timeout_ms: 1_000,
            node_grace_ms: 2_000,
            ..ServiceConfig::default()
        })
    }

    #[test]
    fn a_nodes_jobs_are_scanned_once_until_a_job_changes() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us();
        register_both(&mut inner, t0);
        let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("topo-pack"));
        let n = inner.jobs[&id].placement.as_ref().unwrap().workers[0].node;
        assert_eq!(inner.node_status(n).jobs, 1);
        // Heartbeats read the cache; they change no job.
        let name = inner.topo.node(n).name.clone();
        for k in 0..3 {
            let (m, _) = inner.heartbeat(&name, t0 + k).unwrap();
            assert_eq!(inner.node_status(m).jobs, 1);
            assert!(inner.jobs_by_node_cache.borrow().is_some());
        }
        // A job's change clears it, and the next question sees the change.
        inner
            .set_state(id, JobState::Completed, String::new(), None, true, t0 + 10)
            .unwrap();
        assert!(inner.jobs_by_node_cache.borrow().is_none());
        assert_eq!(inner.node_status(n).jobs, 0);
    }

    /// The wall clock's step for [`a_step_of_the_wall_clock_neither_hides_a_dead_node_nor_times_out_a_live_one`].
    static STEP_US: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

    fn fake_step() -> i64 {
        STEP_US.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn a_step_of_the_wall_clock_neither_hides_a_dead_node_nor_times_out_a_live_one() {
        use std::sync::atomic::Ordering::SeqCst;
        let test = short_timeouts();
        let mut inner = test.core.lock();
        inner.wall_step = fake_step;
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let (n, other) = (NodeId(0), NodeId(1));
        let reachable = |inner: &Inner, m: NodeId| !inner.nodes[m.0 as usize].unreachable;
        // The wall clock jumps ten minutes forward, no time having passed: nobody is
        // silent (before, both nodes timed out).
        let minutes_10 = 600_000_000;
        STEP_US.store(minutes_10, SeqCst);
        inner.check_heartbeats(t0 + minutes_10);
        assert!(reachable(&inner, n) && reachable(&inner, other));
        // Then twenty minutes back, and 1.5 s pass in which only `other` speaks: `n`
        // times out (before, it was hidden for the ten minutes the clock went back).
        STEP_US.store(-minutes_10, SeqCst);
        let later = t0 - minutes_10 + 1_500_000;
        inner.heard_from(other, later);
        inner.check_heartbeats(later);
        assert!(!reachable(&inner, n) && reachable(&inner, other));
        // Its grace is timed on the same clock: 2 s more, then its jobs would go.
        assert_eq!(inner.nodes[0].unreachable_since_us, later);
        let s = inner.nodes[0].unreachable_since_steady_us;
        assert_eq!(s, t0 + 1_500_000);
        STEP_US.store(0, SeqCst);
    }

    #[test]
    fn a_silent_node_becomes_unreachable_then_loses_its_jobs_after_the_grace() {
        let test = short_timeouts();
        let mut inner = test.core.lock();
        // After the restore, which counts every node as heard from at its start.
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        let path = NoModel.decision_path("topo-pack");
        inner.cycle(t0, &path);
        let n = inner.jobs[&id].placement.as_ref().unwrap().workers[0].node;
        let other = NodeId(1 - n.0);
        // The other node keeps talking; `n` goes silent.
        inner.heard_from(other, t0 + 900_000);
        inner.check_heartbeats(t0 + 900_000);
        assert!(!inner.nodes[n.0 as usize].unreachable);
        inner.heard_from(other, t0 + 1_500_000);
        inner.check_heartbeats(t0 + 1_500_000);
        assert!(inner.nodes[n.0 as usize].unreachable);
        assert!(!inner.state.node_is_up(n));
        assert!(!inner.nodes[other.0 as usize].unreachable);
        assert!(inner.node_status(n).unreachable);
        // Within the grace the job keeps its placement.
        inner.heard_from(other, t0 + 3_000_000);
        inner.check_heartbeats(t0 + 3_000_000);
        assert_eq!(inner.jobs[&id].state, JobState::Placed);
        inner.heard_from(other, t0 + 3_600_000);
        inner.check_heartbeats(t0 + 3_600_000);
        assert_eq!(inner.jobs[&id].state, JobState::Requeued);
        assert!(inner.jobs_on(n).is_empty());
        // Placed again, on the node still reachable.
        inner.cycle(t0 + 3_600_000, &path);
        let p = inner.jobs[&id].placement.as_ref().unwrap();
        assert_eq!(p.workers[0].node, other);
        assert_eq!(inner.jobs[&id].attempts, 2);
        // The silent node comes back: schedulable again.
        assert!(inner.heard_from(n, t0 + 4_000_000));
        assert!(inner.state.node_is_up(n));
        assert!(!inner.node_status(n).unreachable);
    }

    #[test]
    fn a_gang_on_two_silent_nodes_is_requeued_once_and_listed_on_both_until_then() {
        let test = TestCore::new(ServiceConfig {
            node_timeout_ms: 1_000,
            node_grace_ms: 1_000,
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0);
        let gang = inner.submit(Some(&whole_gpu_job(2, 8)), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("topo-pack"));
        let by_node = inner.jobs_by_node();
        assert_eq!(by_node, vec![vec![gang], vec![gang]]);
        for (n, jobs) in by_node.iter().enumerate() {
            assert_eq!(&inner.jobs_on(NodeId(n as u32)), jobs);
        }
        // Both nodes go silent; past the timeout and the grace, one requeue.
        inner.check_heartbeats(t0 + 1_500_000);
        inner.check_heartbeats(t0 + 3_000_000);
        assert_eq!(inner.jobs[&gang].state, JobState::Requeued);
        assert_eq!(inner.metrics.node_lost_requeues.get(), 1);
        assert!(inner.jobs_by_node().iter().all(Vec::is_empty));
    }

    #[test]
    fn after_the_clock_steps_back_a_node_that_falls_silent_is_still_caught() {
        let test = TestCore::new(ServiceConfig {
            node_timeout_ms: 1_000,
            node_grace_ms: 60_000,
            ..ServiceConfig::default()
        });
        let mut inner = test.core.lock();
        let t0 = crate::service::core::now_us() + 1_000_000;
        register_both(&mut inner, t0 + 3_600_000_000);
        // The clock steps back an hour; the node is heard from once more, then dies.
        inner.heard_from(NodeId(0), t0);
        inner.heard_from(NodeId(1), t0);
        inner.check_heartbeats(t0 + 500_000);
        assert!(!inner.nodes[0].unreachable);
        inner.heard_from(NodeId(1), t0 + 1_500_000);
        inner.check_heartbeats(t0 + 1_500_000);
        assert!(
            inner.nodes[0].unreachable,
            "caught a timeout after, not an hour"
        );
        assert!(!inner.nodes[1].unreachable);
    }
}
