//! Holding a moved job's START until its stopped workers have ended.
//!
//! A job that is preempted, requeued or migrated gets a STOP on the nodes it ran on and,
//! often in the same cycle, a START somewhere else. An agent gives a stopped worker a
//! grace (SIGTERM, then SIGKILL), which checkpointing jobs need; but while it lasts the
//! old worker still runs, and a START sent at once would run the job twice: two writers
//! of one checkpoint, two members of one rendezvous. So the START of the next placement
//! is held here until every node the job was stopped on has confirmed that its workers
//! ended (`ReportStopped`), or until that node's stop grace and [`STOP_CONFIRM_MARGIN_US`]
//! have passed, the most the agent takes to end them.
//!
//! Only agents that registered with `confirms_stops` are waited for: one that only
//! writes the job's environment cannot tell when its processes end. A node that is
//! unreachable when its job is stopped cannot hear the STOP: it is waited for until its
//! jobs would have been requeued by the liveness rule, by when an agent that fences
//! (`agent --fence-when-silent`) has stopped its workers. A registration ends the waits
//! on its node for whatever the agent neither runs nor is still stopping; one that
//! still *runs* a stopped incarnation (an agent restarted within the grace adopts the
//! worker as running) is told to stop it again, and the wait's deadline restarts with
//! the fresh grace the agent gives it.
//!
//! The placement itself is made at once, as before: its GPUs are allocated and the job
//! is PLACED; only the agents' START is held.
//!
//! The waits, and each node's stop grace, are persisted (tables `stop_waits` and
//! `stop_graces`), so that a restarted scheduler does not send a held START in its first
//! watch snapshots while the old workers still run. A restored wait keeps its deadline,
//! but, as for a STOP sent to a silent node, the deadline counts only once the node has
//! been heard from since the restart (its registration also says what it still stops);
//! until then the liveness rule bounds it, from when a node stored unreachable was
//! marked. A job the restart itself requeues waits for the nodes it was on as well.

use std::collections::{BTreeSet, HashMap};

use crate::domain::{NodeId, Placement};
use crate::service::core::{Event, Inner};
use crate::service::error::ServiceError;
use crate::service::jobs::JobState;
use crate::service::pb;
use crate::service::records::{NodeRecord, StoredStopWait};

/// What a stop confirmation may take beyond the agent's stop grace: the agent's own wait
/// for the SIGKILL to take effect (12 s), its report interval, and the call.
pub const STOP_CONFIRM_MARGIN_US: i64 = 15_000_000;

/// A node whose workers of one incarnation were told to stop and have not yet been
/// confirmed ended.
#[derive(Clone, Debug)]
struct Unconfirmed {
    node: NodeId,
    attempt: u32,
    /// When the STOP was sent, and the grace-based deadline, on the monotonic clock
    /// (`core::wall_step_us`), as node timeouts are.
    sent_steady_us: i64,
    until_steady_us: i64,
}

/// The jobs waiting for stop confirmations, and the STARTs held for them.
#[derive(Default, Debug)]
pub struct StopWaits {
    unconfirmed: HashMap<u32, Vec<Unconfirmed>>,
    held: HashMap<u32, Vec<(NodeId, pb::Assignment)>>,
    /// Jobs whose waits changed since [`StopWaits::take_changed`]: to persist.
    changed: BTreeSet<u32>,
}

/// What a restart takes up (see [`Inner::restore_stop_waits`]).
#[derive(Debug, Default)]
pub struct RestoredStops {
    /// Per node name, its agent's stop grace (µs).
    pub graces: Vec<(String, i64)>,
    /// Per job id, its stored waits.
    pub waits: Vec<(u64, Vec<StoredStopWait>)>,
    /// Job ids whose stored waits could not be read (deleted).
    pub damaged: Vec<u64>,
    /// Jobs the restore requeued (their placement no longer maps or fits): id, the
    /// attempt that was placed, and those of its nodes the inventory still has.
    pub requeued: Vec<(u32, u32, Vec<NodeId>)>,
}

/// STARTs a confirmation or a deadline released, to send now.
pub type Released = Vec<(NodeId, pb::Assignment)>;

/// What [`StopWaits::expire`] found: a job whose wait ran out on some nodes.
#[derive(Debug)]
pub struct Expired {
    pub job: u32,
    pub nodes: Vec<NodeId>,
    pub released: Released,
}

impl StopWaits {
    /// Waits for `job`'s incarnation `attempt`, whose STOPs went out at
    /// `sent_steady_us`, to be confirmed stopped on each of `nodes`, each with its
    /// grace-based deadline (on the monotonic clock; see [`StopWaits::expire`]).
    pub fn await_stops(
        &mut self,
        job: u32,
        attempt: u32,
        nodes: impl IntoIterator<Item = (NodeId, i64)>,
        sent_steady_us: i64,
    ) {
        let waits = self.unconfirmed.entry(job).or_default();
        for (node, until_steady_us) in nodes {
            if waits.iter().any(|w| w.node == node && w.attempt == attempt) {
                continue;
            }
            self.changed.insert(job);
            waits.push(Unconfirmed {
                node,
                attempt,
                sent_steady_us,
                until_steady_us,
            });
        }
        if waits.is_empty() {
            self.unconfirmed.remove(&job);
        }
    }

    /// Forgets `job`, which ended for good: no START of it is held or will be.
    pub fn forget(&mut self, job: u32) {
        if self.unconfirmed.remove(&job).is_some() {
            self.changed.insert(job);
        }
        self.held.remove(&job);
    }

    /// The STARTs of `job`'s new placement: returned to send now when nothing is
    /// awaited, else held (and an empty list returned).
    pub fn hold_or_pass(&mut self, job: u32, starts: Released) -> Released {
        if self.unconfirmed.contains_key(&job) {
            self.held.entry(job).or_default().extend(starts);
            Vec::new()
        } else {
            starts
        }
    }

    /// Forgets the held STARTs of `job`, whose placement ended before they were sent.
    /// Returns whether any were held: then nothing of that placement ever ran.
    pub fn drop_held(&mut self, job: u32) -> bool {
        self.held.remove(&job).is_some()
    }

    /// Whether `job`'s START is held (its nodes must not be told to run it yet).
    pub fn is_held(&self, job: u32) -> bool {
        self.held.contains_key(&job)
    }

    /// Whether `job` still waits for a node's confirmation.
    #[cfg(test)]
    pub fn awaits(&self, job: u32) -> bool {
        self.unconfirmed.contains_key(&job)
    }

    /// `node` confirmed `job`'s incarnation `attempt` stopped. Returns whether that was
    /// awaited, and the STARTs it released when it was the last one.
    pub fn confirm(&mut self, job: u32, node: NodeId, attempt: u32) -> (bool, Released) {
        let Some(waits) = self.unconfirmed.get_mut(&job) else {
            return (false, Vec::new());
        };
        let before = waits.len();
        waits.retain(|w| !(w.node == node && w.attempt == attempt));
        let awaited = waits.len() < before;
        if awaited {
            self.changed.insert(job);
        }
        if !waits.is_empty() {
            return (awaited, Vec::new());
        }
        self.unconfirmed.remove(&job);
        (awaited, self.held.remove(&job).unwrap_or_default())
    }

    /// `node`'s agent registered saying it runs only `running` (job, attempt): every
    /// wait on it for anything else is over. Returns how many ended and the STARTs that
    /// released.
    pub fn confirm_all_but(
        &mut self,
        node: NodeId,
        running: &std::collections::HashSet<(u32, u32)>,
    ) -> (u64, Released) {
        let mut confirmed = 0;
        let mut released = Vec::new();
        let jobs: Vec<u32> = self.unconfirmed.keys().copied().collect();
        for job in jobs {
            let waits = self.unconfirmed.get_mut(&job).expect("listed");
            let before = waits.len();
            waits.retain(|w| w.node != node || running.contains(&(job, w.attempt)));
            confirmed += (before - waits.len()) as u64;
            if waits.len() < before {
                self.changed.insert(job);
            }
            if waits.is_empty() {
                self.unconfirmed.remove(&job);
                released.extend(self.held.remove(&job).unwrap_or_default());
            }
        }
        (confirmed, released)
    }

    /// `node`'s agent registered saying it still runs the incarnations in `running`:
    /// those it was told to stop it is told again now (`Registration::stop`) and gives a
    /// fresh grace (a restarted agent does not know it had stopped them), so their waits
    /// on it end no earlier than `until_steady_us` and count as sent at `sent_steady_us`.
    /// Returns how many waits were extended.
    pub fn restop(
        &mut self,
        node: NodeId,
        running: &std::collections::HashSet<(u32, u32)>,
        sent_steady_us: i64,
        until_steady_us: i64,
    ) -> usize {
        let mut extended = 0;
        for (&job, waits) in &mut self.unconfirmed {
            for w in waits
                .iter_mut()
                .filter(|w| w.node == node && running.contains(&(job, w.attempt)))
            {
                w.sent_steady_us = w.sent_steady_us.max(sent_steady_us);
                if until_steady_us > w.until_steady_us {
                    w.until_steady_us = until_steady_us;
                    self.changed.insert(job);
                }
                extended += 1;
            }
        }
        extended
    }

    /// Gives up the waits `due` says are over, given each one's node, when its STOP
    /// was sent and its grace-based deadline; releases the STARTs of every job left
    /// waiting for nothing, in job order.
    pub fn expire(&mut self, due: impl Fn(NodeId, i64, i64) -> bool) -> Vec<Expired> {
        let mut expired = Vec::new();
        for (&job, waits) in &mut self.unconfirmed {
            let mut nodes = Vec::new();
            waits.retain(|w| {
                let due = due(w.node, w.sent_steady_us, w.until_steady_us);
                if due {
                    nodes.push(w.node);
                }
                !due
            });
            if !nodes.is_empty() {
                self.changed.insert(job);
                expired.push(Expired {
                    job,
                    nodes,
                    released: Vec::new(),
                });
            }
        }
        self.unconfirmed.retain(|_, w| !w.is_empty());
        expired.sort_by_key(|e| e.job);
        for e in &mut expired {
            if !self.unconfirmed.contains_key(&e.job) {
                e.released = self.held.remove(&e.job).unwrap_or_default();
            }
        }
        expired
    }

    /// Jobs waiting for a confirmation.
    #[cfg(test)]
    pub fn waiting_jobs(&self) -> usize {
        self.unconfirmed.len()
    }

    /// Jobs whose START is held.
    pub fn held_jobs(&self) -> usize {
        self.held.len()
    }

    /// Has the stored waits of `job`, which has none, deleted with the next commit.
    pub fn drop_stored(&mut self, job: u32) {
        self.unconfirmed.remove(&job);
        self.changed.insert(job);
    }

    /// The jobs whose waits changed since the last call, to persist.
    pub fn take_changed(&mut self) -> BTreeSet<u32> {
        std::mem::take(&mut self.changed)
    }

    /// `job`'s waits: each node still to confirm, the incarnation and the deadline (on
    /// the monotonic clock).
    pub fn waits_of(&self, job: u32) -> impl Iterator<Item = (NodeId, u32, i64)> + '_ {
        self.unconfirmed
            .get(&job)
            .into_iter()
            .flatten()
            .map(|w| (w.node, w.attempt, w.until_steady_us))
    }
}

/// When the liveness rule would requeue the jobs of node `r` (on the monotonic clock):
/// its timeout and grace after it was last heard from, or, once it is unreachable, its
/// grace after it was marked, whichever is first. (A restart counts every node as heard
/// from at the restart, but keeps when an unreachable one was marked: a node dead
/// before the restart is not waited for again.)
fn requeue_deadline(r: &NodeRecord, timeout_us: i64, grace_us: i64) -> i64 {
    let by_silence = r.last_seen_steady_us + timeout_us + grace_us;
    if r.unreachable {
        by_silence.min(r.unreachable_since_steady_us + grace_us)
    } else {
        by_silence
    }
}

impl Inner {
    /// The distinct registered nodes of `placement` whose agents confirm stops, each
    /// with its grace-based deadline (its stop grace and the margin from `steady_now`,
    /// on the monotonic clock); not a node silent for so long that the liveness rule
    /// would have requeued its jobs. See [`Inner::expire_stop_waits`] for when a wait
    /// ends without a confirmation.
    pub(crate) fn confirming_nodes(
        &self,
        placement: &Placement,
        steady_now: i64,
    ) -> Vec<(NodeId, i64)> {
        self.confirming_among(placement.workers.iter().map(|w| w.node), steady_now)
    }

    /// [`Inner::confirming_nodes`] of the nodes `among`.
    fn confirming_among(
        &self,
        among: impl IntoIterator<Item = NodeId>,
        steady_now: i64,
    ) -> Vec<(NodeId, i64)> {
        let mut nodes: Vec<(NodeId, i64)> = Vec::new();
        for node in among {
            let r = &self.nodes[node.0 as usize];
            let Some(grace) = r.confirms_stops_within_us else {
                continue;
            };
            if !r.registered || nodes.iter().any(|(n, _)| *n == node) {
                continue;
            }
            // Silent for longer than the liveness rule allows, its jobs would have been
            // requeued: a fencing agent has stopped its workers by now.
            if self.liveness_deadline(node) <= steady_now {
                continue;
            }
            nodes.push((node, steady_now + grace + STOP_CONFIRM_MARGIN_US));
        }
        nodes
    }

    /// The ReportStopped RPC: `node`'s workers of `job_id`'s incarnation `attempt` have
    /// ended. Returns whether that was awaited; the STARTs it released are sent.
    pub fn stop_confirmed(
        &mut self,
        req: &pb::ReportStoppedRequest,
        now: i64,
    ) -> Result<bool, ServiceError> {
        let n = self.registered_node("node", &req.node)?;
        self.heard_from(n, now);
        let id = crate::service::convert::job_id("job_id", req.job_id)?.0;
        if req.attempt == 0 {
            return Err(ServiceError::invalid(
                "attempt",
                "must name the stopped incarnation (Assignment.attempt of its STOP)",
            ));
        }
        let (awaited, released) = self.stop_waits.confirm(id, n, req.attempt);
        if awaited {
            self.metrics
                .stop_waits
                .get_or_create(&vec![("outcome", "confirmed")])
                .inc();
        }
        if !released.is_empty() {
            tracing::info!(job = id, "stopped workers ended; the next placement starts");
        }
        self.send_released(released);
        Ok(awaited)
    }

    /// Gives up the stop confirmations that are overdue (called with the heartbeat
    /// check), starting the jobs they held.
    ///
    /// A wait ends at its grace-based deadline only if the node has been heard from
    /// since the STOP went out (so it could hear the STOP); a node silent since waits
    /// until its jobs would be requeued by the liveness rule (`node_timeout_ms` plus
    /// `node_grace_ms` after it was last heard from), by when an agent that fences
    /// (`--fence-when-silent`) has stopped its workers. That bound also ends any wait
    /// early: a dead machine does not hold a job for an hour-long stop grace.
    pub fn expire_stop_waits(&mut self, now: i64) {
        let steady = now - (self.wall_step)();
        let nodes = &self.nodes;
        let (timeout, grace) = (self.node_timeout_us, self.node_grace_us);
        let due = |n: NodeId, sent: i64, until: i64| {
            let r = &nodes[n.0 as usize];
            (until <= steady && r.last_seen_steady_us >= sent)
                || requeue_deadline(r, timeout, grace) <= steady
        };
        for e in self.stop_waits.expire(due) {
            let names: Vec<&str> = e
                .nodes
                .iter()
                .map(|&n| self.topo.node(n).name.as_str())
                .collect();
            tracing::warn!(
                job = e.job,
                nodes = ?names,
                "no confirmation that the job's stopped workers ended within the nodes' stop grace (or, for a silent node, before its jobs would be requeued); assuming they did"
            );
            self.metrics
                .stop_waits
                .get_or_create(&vec![("outcome", "timed_out")])
                .inc_by(e.nodes.len() as u64);
            self.send_released(e.released);
        }
    }

    /// Ends the waits on `n` for what its agent, registering, neither runs nor is still
    /// stopping ([`StopWaits::confirm_all_but`]): a STOP sent while it was away never
    /// reached it, and nothing of those incarnations is left there to end. (One still
    /// stopping is confirmed when it ends.)
    ///
    /// One it still *runs* (a restarted agent that adopted the worker, or one that never
    /// heard the STOP) is told to stop again and gives the worker a fresh grace, so the
    /// wait's deadline moves to that grace and the margin from when the node was last
    /// heard from (the registration).
    pub(crate) fn confirm_stops_not_running(
        &mut self,
        n: NodeId,
        running: &[pb::RunningJob],
        stopping: &[pb::RunningJob],
    ) {
        let pairs = |list: &[pb::RunningJob]| -> std::collections::HashSet<(u32, u32)> {
            list.iter()
                .filter_map(|r| Some((u32::try_from(r.job_id).ok()?, r.attempt)))
                .collect()
        };
        let still_running = pairs(running);
        let r = &self.nodes[n.0 as usize];
        if let Some(grace) = r.confirms_stops_within_us {
            // The node's own reading: one taken afresh could fall a microsecond after it,
            // and the deadline would then wait for the next heartbeat.
            let steady = r.last_seen_steady_us;
            self.stop_waits.restop(
                n,
                &still_running,
                steady,
                steady + grace + STOP_CONFIRM_MARGIN_US,
            );
        }
        let mut running = still_running;
        running.extend(pairs(stopping));
        let (confirmed, released) = self.stop_waits.confirm_all_but(n, &running);
        if confirmed > 0 {
            self.metrics
                .stop_waits
                .get_or_create(&vec![("outcome", "confirmed")])
                .inc_by(confirmed);
        }
        self.send_released(released);
    }

    /// The stored form of the waits that changed since the last call: per job, its waits,
    /// or `None` when it has none left.
    pub(crate) fn stop_wait_changes(&mut self) -> Vec<(u32, Option<Vec<StoredStopWait>>)> {
        let step = (self.wall_step)();
        self.stop_waits
            .take_changed()
            .into_iter()
            .map(|job| {
                let waits: Vec<StoredStopWait> = self
                    .stop_waits
                    .waits_of(job)
                    .map(|(node, attempt, until_steady_us)| StoredStopWait {
                        node: self.topo.node(node).name.clone(),
                        attempt,
                        until_us: until_steady_us + step,
                    })
                    .collect();
                (job, (!waits.is_empty()).then_some(waits))
            })
            .collect()
    }

    /// Takes up, at a restart, the nodes' stop graces and the waits the last run left,
    /// holding the START of each job still placed. `now` and `steady` are the restart's
    /// wall and monotonic clocks. A wait counts as sent after the restart: its deadline
    /// applies once its node has been heard from since (a registration also ends it when
    /// the agent no longer stops that incarnation); before that, the liveness rule, counted
    /// from the restart, bounds it. Waits of jobs that ended, or on nodes the inventory
    /// no longer has, are dropped (and deleted from the store).
    pub(crate) fn restore_stop_waits(&mut self, restored: RestoredStops, now: i64, steady: i64) {
        for (name, grace) in restored.graces {
            match self.node_index.get(&name) {
                Some(n) => self.nodes[n.0 as usize].confirms_stops_within_us = Some(grace),
                None => {
                    tracing::warn!(node = %name, "stored stop grace of a node not in the inventory; deleted");
                    self.dirty.stale_stop_graces.push(name);
                }
            }
        }
        for job in restored.damaged {
            if let Ok(id) = u32::try_from(job) {
                self.stop_waits.drop_stored(id);
            }
        }
        // Requeued by the restore itself (its allocation no longer fits): its workers may
        // still run where it was, and nothing has told them to stop yet.
        for (id, attempt, nodes) in restored.requeued {
            let nodes = self.confirming_among(nodes, steady);
            self.stop_waits.await_stops(id, attempt, nodes, steady + 1);
        }
        for (job, stored) in restored.waits {
            let live = u32::try_from(job)
                .ok()
                .filter(|id| self.jobs.get(id).is_some_and(|r| !r.state.is_final()));
            let Some(id) = live else {
                if let Ok(id) = u32::try_from(job) {
                    self.stop_waits.drop_stored(id);
                }
                continue;
            };
            let mut by_attempt: Vec<(u32, Vec<(NodeId, i64)>)> = Vec::new();
            for w in stored {
                let Some(&node) = self.node_index.get(&w.node) else {
                    tracing::warn!(job = id, node = %w.node, "stored stop wait on a node not in the inventory; ignored");
                    continue;
                };
                // No later than a full grace from the restart: a wall clock stepped back
                // since the write must not stretch the hold.
                let most = self.nodes[node.0 as usize]
                    .confirms_stops_within_us
                    .unwrap_or(crate::service::ops::MAX_STOP_GRACE_MS as i64 * 1000);
                let until =
                    (w.until_us - (now - steady)).min(steady + most + STOP_CONFIRM_MARGIN_US);
                match by_attempt.iter_mut().find(|(a, _)| *a == w.attempt) {
                    Some((_, nodes)) => nodes.push((node, until)),
                    None => by_attempt.push((w.attempt, vec![(node, until)])),
                }
            }
            if by_attempt.is_empty() {
                self.stop_waits.drop_stored(id);
                continue;
            }
            for (attempt, nodes) in by_attempt {
                self.stop_waits.await_stops(id, attempt, nodes, steady + 1);
            }
            let record = &self.jobs[&id];
            if record.state == JobState::Placed
                && let Some(p) = &record.placement
            {
                let starts = self.assignments(record, p, pb::AssignmentAction::Start, "");
                // Not held (no wait left): the watch snapshots send them, as for any
                // placed job.
                let _ = self.stop_waits.hold_or_pass(id, starts);
            }
            tracing::info!(
                job = id,
                held = self.stop_waits.is_held(id),
                "waits for stopped workers taken up from before the restart"
            );
        }
    }

    /// When `n`'s jobs would be requeued for silence, on the monotonic clock.
    fn liveness_deadline(&self, n: NodeId) -> i64 {
        requeue_deadline(
            &self.nodes[n.0 as usize],
            self.node_timeout_us,
            self.node_grace_us,
        )
    }

    fn send_released(&mut self, released: Released) {
        for (node, assignment) in released {
            self.push_event(Event::Assignment { node, assignment });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(job: u64, node: u32) -> (NodeId, pb::Assignment) {
        (
            NodeId(node),
            pb::Assignment {
                job_id: job,
                action: pb::AssignmentAction::Start as i32,
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_start_passes_when_nothing_is_awaited() {
        let mut waits = StopWaits::default();
        assert_eq!(waits.hold_or_pass(1, vec![start(1, 0)]).len(), 1);
        assert!(!waits.is_held(1));
        assert_eq!(waits.confirm(1, NodeId(0), 1), (false, Vec::new()));
    }

    #[test]
    fn a_start_is_held_until_every_stopped_node_confirms() {
        let mut waits = StopWaits::default();
        waits.await_stops(7, 2, [(NodeId(0), 30_000_000), (NodeId(1), 0)], 0);
        assert!(waits.hold_or_pass(7, vec![start(7, 2)]).is_empty());
        assert!(waits.is_held(7));
        // Another attempt's confirmation, or another job's, releases nothing.
        assert_eq!(waits.confirm(7, NodeId(0), 1), (false, Vec::new()));
        assert_eq!(waits.confirm(8, NodeId(0), 2), (false, Vec::new()));
        let (awaited, released) = waits.confirm(7, NodeId(1), 2);
        assert!(awaited && released.is_empty());
        assert!(waits.is_held(7));
        let (awaited, released) = waits.confirm(7, NodeId(0), 2);
        assert!(awaited);
        assert_eq!(released, vec![start(7, 2)]);
        assert!(!waits.is_held(7) && !waits.awaits(7));
        // A repeated confirmation is accepted and changes nothing.
        assert_eq!(waits.confirm(7, NodeId(0), 2), (false, Vec::new()));
    }

    #[test]
    fn a_wait_ends_at_its_deadline() {
        let mut waits = StopWaits::default();
        let deadline = 1_000_000;
        waits.await_stops(3, 1, [(NodeId(0), deadline)], 0);
        waits.await_stops(4, 1, [(NodeId(1), 60_000_000)], 0);
        waits.hold_or_pass(3, vec![start(3, 5)]);
        waits.hold_or_pass(4, vec![start(4, 6)]);
        assert!(waits.expire(|_, _, until| until < deadline).is_empty());
        let expired = waits.expire(|_, _, until| until <= deadline);
        assert_eq!(expired.len(), 1);
        assert_eq!((expired[0].job, &expired[0].nodes), (3, &vec![NodeId(0)]));
        assert_eq!(expired[0].released, vec![start(3, 5)]);
        assert!(waits.is_held(4) && waits.awaits(4));
        assert_eq!(waits.waiting_jobs(), 1);
    }

    #[test]
    fn a_wait_that_runs_out_on_one_node_still_holds_for_the_other() {
        let mut waits = StopWaits::default();
        waits.await_stops(3, 1, [(NodeId(0), 0), (NodeId(1), 10_000_000)], 0);
        waits.hold_or_pass(3, vec![start(3, 5)]);
        let expired = waits.expire(|_, _, until| until <= 5_000_000);
        assert_eq!(expired.len(), 1);
        assert!(expired[0].released.is_empty());
        assert_eq!(waits.confirm(3, NodeId(1), 1).1, vec![start(3, 5)]);
    }

    #[test]
    fn a_placement_that_ends_before_its_start_drops_it_and_keeps_waiting() {
        let mut waits = StopWaits::default();
        waits.await_stops(9, 1, [(NodeId(0), 0)], 0);
        waits.hold_or_pass(9, vec![start(9, 1)]);
        assert!(waits.drop_held(9));
        assert!(!waits.drop_held(9));
        // The next placement is held as well: the first one's worker may still run.
        assert!(waits.hold_or_pass(9, vec![start(9, 2)]).is_empty());
        assert_eq!(waits.confirm(9, NodeId(0), 1).1, vec![start(9, 2)]);
    }

    #[test]
    fn a_registration_ends_the_waits_on_its_node_for_what_it_does_not_run() {
        let mut waits = StopWaits::default();
        waits.await_stops(1, 1, [(NodeId(0), 0), (NodeId(1), 0)], 0);
        waits.await_stops(2, 3, [(NodeId(0), 0)], 0);
        waits.hold_or_pass(1, vec![start(1, 2)]);
        waits.hold_or_pass(2, vec![start(2, 2)]);
        let running = std::collections::HashSet::from([(2, 3)]);
        let (confirmed, released) = waits.confirm_all_but(NodeId(0), &running);
        assert_eq!((confirmed, released.len()), (1, 0));
        assert!(waits.awaits(1) && waits.awaits(2));
        let (confirmed, released) = waits.confirm_all_but(NodeId(1), &running);
        assert_eq!((confirmed, released), (1, vec![start(1, 2)]));
    }

    #[test]
    fn no_nodes_to_wait_for_hold_nothing() {
        let mut waits = StopWaits::default();
        waits.await_stops(1, 1, [], 0);
        assert!(!waits.awaits(1));
        assert_eq!(waits.hold_or_pass(1, vec![start(1, 0)]).len(), 1);
    }
}

/// The waits as the service runs them: a drained node's job placed on the other node.
#[cfg(test)]
mod service_tests {
    use crate::domain::NodeId;
    use crate::service::config::ServiceConfig;
    use crate::service::core::{Event, Inner, now_us};
    use crate::service::jobs::JobState;
    use crate::service::model::{ModelSlot, NoModel};
    use crate::service::pb;
    use crate::service::store::Store;
    use crate::service::testkit::{TestCore, node_info, whole_gpu_job};

    use super::STOP_CONFIRM_MARGIN_US;

    const GRACE_MS: u64 = 30_000;

    fn register(inner: &mut Inner, t0: i64, confirms: bool) {
        for i in 0..2 {
            let req = pb::RegisterNodeRequest {
                node: Some(node_info(i)),
                confirms_stops: confirms,
                stop_grace_ms: if confirms { GRACE_MS } else { 0 },
                ..Default::default()
            };
            inner.register(&req, t0).unwrap();
        }
    }

    /// (node, job, action, attempt) of each assignment the last epoch sends.
    fn sent(inner: &mut Inner) -> Vec<(u32, u32, i32, u32)> {
        let (_, _, events) = inner.take_batch();
        assignments(&events)
    }

    /// [`sent`], with the epoch committed to `store` as the server's writer would.
    fn committed(store: &Store, inner: &mut Inner) -> Vec<(u32, u32, i32, u32)> {
        let (_, (batch, _), events) = inner.take_batch();
        store.commit(&batch).unwrap();
        assignments(&events)
    }

    fn assignments(events: &[Event]) -> Vec<(u32, u32, i32, u32)> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Assignment { node, assignment } => Some((
                    node.0,
                    assignment.job_id as u32,
                    assignment.action,
                    assignment.attempt,
                )),
                Event::Job(_) => None,
            })
            .collect()
    }

    const START: i32 = pb::AssignmentAction::Start as i32;
    const STOP: i32 = pb::AssignmentAction::Stop as i32;

    /// A job of one 8-GPU worker placed, its node drained and the job placed on the
    /// other node: returns the job, its first node and the second.
    fn moved(inner: &mut Inner, t0: i64) -> (u32, u32, u32) {
        moved_with(inner, t0, sent)
    }

    /// [`moved`] on `test`'s core, its nodes registered as confirming stops at the
    /// returned time: the core's lock, that time, and the job with its two nodes.
    fn moved_on(test: &TestCore) -> (std::sync::MutexGuard<'_, Inner>, i64, (u32, u32, u32)) {
        let mut inner = test.core.lock();
        let t0 = now_us();
        register(&mut inner, t0, true);
        let moved = moved(&mut inner, t0);
        (inner, t0, moved)
    }

    /// [`moved`], each epoch ended by `take` (which returns what it sent).
    fn moved_with(
        inner: &mut Inner,
        t0: i64,
        mut take: impl FnMut(&mut Inner) -> Vec<(u32, u32, i32, u32)>,
    ) -> (u32, u32, u32) {
        let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
        inner.cycle(t0, &NoModel.decision_path("topo-pack"));
        let first = inner.jobs[&id].placement.as_ref().unwrap().workers[0]
            .node
            .0;
        assert_eq!(take(inner), vec![(first, id, START, 1)]);
        let name = inner.topo.node(NodeId(first)).name.clone();
        inner.drain(&name, "maintenance", t0 + 1).unwrap();
        inner.cycle(t0 + 2, &NoModel.decision_path("topo-pack"));
        let r = &inner.jobs[&id];
        assert_eq!((r.state, r.attempts), (JobState::Placed, 2));
        let second = r.placement.as_ref().unwrap().workers[0].node.0;
        assert_ne!(first, second);
        (id, first, second)
    }

    fn confirm(inner: &mut Inner, node: u32, job: u32, attempt: u32, now: i64) -> bool {
        let req = pb::ReportStoppedRequest {
            node: format!("n-{node}"),
            job_id: job as u64,
            attempt,
        };
        inner.stop_confirmed(&req, now).unwrap()
    }

    #[test]
    fn a_moved_job_starts_once_its_old_node_confirms_the_stop() {
        let test = TestCore::new(ServiceConfig::default());
        let (mut inner, t0, (id, first, second)) = moved_on(&test);
        // Stopped where it ran; not started yet, not even in a new watch's snapshot.
        assert_eq!(sent(&mut inner), vec![(first, id, STOP, 1)]);
        assert!(inner.node_assignments(NodeId(second)).is_empty());
        assert_eq!(inner.stop_waits.held_jobs(), 1);
        // The other node's word, or another attempt's, releases nothing.
        assert!(!confirm(&mut inner, second, id, 1, t0 + 3));
        assert!(!confirm(&mut inner, first, id, 2, t0 + 3));
        assert!(sent(&mut inner).is_empty());
        assert!(confirm(&mut inner, first, id, 1, t0 + 4));
        assert_eq!(sent(&mut inner), vec![(second, id, START, 2)]);
        assert_eq!(inner.node_assignments(NodeId(second)).len(), 1);
        assert_eq!(inner.stop_waits.held_jobs(), 0);
        let confirmed = inner
            .metrics
            .stop_waits
            .get_or_create(&vec![("outcome", "confirmed")])
            .get();
        assert_eq!(confirmed, 1);
        // A late repeat is accepted and sends nothing.
        assert!(!confirm(&mut inner, first, id, 1, t0 + 5));
        assert!(sent(&mut inner).is_empty());
    }

    #[test]
    fn without_a_confirmation_the_start_waits_out_the_grace_and_the_margin() {
        let test = TestCore::new(ServiceConfig::default());
        let (mut inner, t0, (id, first, second)) = moved_on(&test);
        sent(&mut inner);
        // Heard from after the STOP went out: it could hear it. (A millisecond after:
        // the clocks' offset is read afresh at each call and may move a microsecond.)
        inner.heard_from(NodeId(first), t0 + 1_000);
        let due = t0 + 1 + GRACE_MS as i64 * 1000 + STOP_CONFIRM_MARGIN_US;
        // A second either side: the clocks' offset is read afresh at each call.
        inner.expire_stop_waits(due - 1_000_000);
        assert!(sent(&mut inner).is_empty());
        inner.expire_stop_waits(due + 1_000_000);
        assert_eq!(sent(&mut inner), vec![(second, id, START, 2)]);
        let timed_out = inner
            .metrics
            .stop_waits
            .get_or_create(&vec![("outcome", "timed_out")])
            .get();
        assert_eq!(timed_out, 1);
    }

    #[test]
    fn an_agent_that_does_not_confirm_stops_gets_the_start_at_once() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = now_us();
        register(&mut inner, t0, false);
        let (id, first, second) = moved(&mut inner, t0);
        assert_eq!(
            sent(&mut inner),
            vec![(first, id, STOP, 1), (second, id, START, 2)]
        );
    }

    #[test]
    fn a_job_cancelled_while_held_is_never_started() {
        let test = TestCore::new(ServiceConfig::default());
        let (mut inner, t0, (id, first, _)) = moved_on(&test);
        sent(&mut inner);
        inner.cancel(id, "no longer needed", t0 + 3).unwrap();
        assert_eq!(inner.stop_waits.held_jobs(), 0);
        sent(&mut inner);
        // Ended for good: nothing waits for its stop any more.
        assert!(!confirm(&mut inner, first, id, 1, t0 + 4));
        assert!(
            sent(&mut inner).iter().all(|a| a.2 != START),
            "a cancelled job's START must stay unsent"
        );
        inner.expire_stop_waits(t0 + 3_600_000_000);
        assert!(sent(&mut inner).is_empty());
    }

    /// A node not heard from since its job was stopped (gone silent, unreachable) may
    /// not have heard the STOP: the job starts elsewhere once the node's jobs would have
    /// been requeued by the liveness rule, by when a fencing agent has stopped its
    /// workers, not at the grace's end; at once when that time has passed.
    #[test]
    fn a_silent_node_is_waited_for_until_its_jobs_would_be_requeued() {
        for silent_for_long in [false, true] {
            let test = TestCore::new(ServiceConfig::default());
            let mut inner = test.core.lock();
            let t0 = now_us();
            register(&mut inner, t0, true);
            let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            sent(&mut inner);
            let first = inner.jobs[&id].placement.as_ref().unwrap().workers[0].node;
            let liveness = inner.node_timeout_us + inner.node_grace_us;
            // A millisecond before the STOP at least: the clocks' offset is read afresh
            // at each call and may move a microsecond.
            let last_seen = if silent_for_long {
                t0 - 2 * liveness
            } else {
                t0 - 1_000
            };
            let steady_last_seen = last_seen - (inner.wall_step)();
            let r = &mut inner.nodes[first.0 as usize];
            r.last_seen_steady_us = steady_last_seen;
            r.unreachable = silent_for_long;
            let name = inner.topo.node(first).name.clone();
            inner.drain(&name, "lost", t0 + 1).unwrap();
            inner.cycle(t0 + 2, &NoModel.decision_path("topo-pack"));
            let started = |sent: Vec<(u32, u32, i32, u32)>| {
                sent.iter().any(|a| a.0 != first.0 && a.2 == START)
            };
            if silent_for_long {
                assert!(started(sent(&mut inner)));
                continue;
            }
            assert!(!started(sent(&mut inner)));
            let grace_end = t0 + 1 + GRACE_MS as i64 * 1000 + STOP_CONFIRM_MARGIN_US;
            inner.expire_stop_waits(grace_end + 1_000_000);
            assert!(!started(sent(&mut inner)), "released at the grace's end");
            inner.expire_stop_waits(last_seen + liveness - 1_000_000);
            assert!(!started(sent(&mut inner)));
            inner.expire_stop_waits(last_seen + liveness + 1_000_000);
            assert!(started(sent(&mut inner)));
        }
    }

    /// An agent that registers again (restarted, or back from a partition) without the
    /// stopped incarnation ends the wait on its node: the STOP went to a watch that was
    /// gone. One still listing it (a worker within its grace) keeps it, and is told to
    /// stop it.
    #[test]
    fn a_registration_without_the_stopped_incarnation_ends_the_wait() {
        let test = TestCore::new(ServiceConfig::default());
        let (mut inner, t0, (id, first, second)) = moved_on(&test);
        sent(&mut inner);
        let again =
            |running: Vec<pb::RunningJob>, stopping: Vec<pb::RunningJob>| pb::RegisterNodeRequest {
                node: Some(node_info(first as usize)),
                running,
                confirms_stops: true,
                stop_grace_ms: GRACE_MS,
                stopping,
            };
        let old = pb::RunningJob {
            job_id: id as u64,
            attempt: 1,
        };
        // Still running there (the STOP never arrived): told to stop it; still waited on.
        let reg = inner.register(&again(vec![old], vec![]), t0 + 3).unwrap();
        assert_eq!(reg.stop, vec![old]);
        assert!(sent(&mut inner).is_empty(), "released while it still runs");
        // Stopping, within its grace: still waited on, and not told again.
        let reg = inner.register(&again(vec![], vec![old]), t0 + 4).unwrap();
        assert!(reg.stop.is_empty());
        assert!(sent(&mut inner).is_empty(), "released while it still stops");
        // Gone.
        inner.register(&again(vec![], vec![]), t0 + 5).unwrap();
        assert_eq!(sent(&mut inner), vec![(second, id, START, 2)]);
    }

    /// A confirmation naming no attempt or no job, an unknown node, or a job id beyond
    /// any job's is refused, naming what is wrong; one from a node that has not
    /// registered too. (One about a job nobody waits for is accepted: see above.)
    #[test]
    fn a_malformed_confirmation_is_refused_by_field() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let t0 = now_us();
        let req = |node: &str, job_id: u64, attempt: u32| pb::ReportStoppedRequest {
            node: node.into(),
            job_id,
            attempt,
        };
        let refused = |inner: &mut Inner, r: pb::ReportStoppedRequest| {
            inner
                .stop_confirmed(&r, t0)
                .expect_err("refused")
                .to_string()
        };
        assert!(refused(&mut inner, req("n-0", 1, 1)).contains("has not registered"));
        register(&mut inner, t0, true);
        let (id, first, _) = moved(&mut inner, t0);
        let node = format!("n-{first}");
        assert!(refused(&mut inner, req(&node, id as u64, 0)).starts_with("attempt"));
        assert!(refused(&mut inner, req("no-such-node", id as u64, 1)).contains("no-such-node"));
        assert!(refused(&mut inner, req(&node, 0, 1)).starts_with("job_id"));
        assert!(refused(&mut inner, req(&node, u64::MAX, 1)).contains("does not exist"));
        // None of it released the held START.
        assert_eq!(inner.stop_waits.held_jobs(), 1);
    }

    #[test]
    fn a_stop_grace_beyond_an_hour_is_refused() {
        let test = TestCore::new(ServiceConfig::default());
        let mut inner = test.core.lock();
        let req = pb::RegisterNodeRequest {
            node: Some(node_info(0)),
            confirms_stops: true,
            stop_grace_ms: 3_600_001,
            ..Default::default()
        };
        let Err(e) = inner.register(&req, now_us()) else {
            panic!("a stop grace of an hour and a millisecond was accepted");
        };
        assert!(e.to_string().contains("stop_grace_ms"), "{e}");
        assert!(!inner.nodes[0].registered);
    }

    /// A moved job whose START is held, committed as the server would: returns the
    /// job, its first node and its second.
    fn moved_and_committed(test: &TestCore, t0: i64) -> (u32, u32, u32) {
        let mut inner = test.core.lock();
        register(&mut inner, t0, true);
        let store = test.core.store.clone();
        let (id, first, second) = moved_with(&mut inner, t0, |i| committed(&store, i));
        assert_eq!(committed(&store, &mut inner), vec![(first, id, STOP, 1)]);
        assert_eq!(inner.stop_waits.held_jobs(), 1);
        (id, first, second)
    }

    fn registration(node: u32, stopping: Vec<pb::RunningJob>) -> pb::RegisterNodeRequest {
        pb::RegisterNodeRequest {
            node: Some(node_info(node as usize)),
            confirms_stops: true,
            stop_grace_ms: GRACE_MS,
            stopping,
            ..Default::default()
        }
    }

    /// A scheduler restarted while a moved job's START is held keeps holding it: the
    /// new server's watch snapshots leave it out until the old node confirms (here after
    /// registering again with the worker still within its grace), and a confirmed wait
    /// is not taken up by the next restart.
    #[test]
    fn a_held_start_stays_held_across_a_restart_until_the_old_node_confirms() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        let (id, first, second) = moved_and_committed(&test, now_us());
        let restored = test.restart(config.clone());
        let mut inner = restored.lock();
        assert_eq!(inner.jobs[&id].state, JobState::Placed);
        assert!(inner.node_assignments(NodeId(second)).is_empty());
        assert_eq!(inner.stop_waits.held_jobs(), 1);
        // The nodes' stop graces came back too.
        assert_eq!(
            inner.nodes[first as usize].confirms_stops_within_us,
            Some(GRACE_MS as i64 * 1000)
        );
        let t1 = now_us() + 1_000;
        let old = pb::RunningJob {
            job_id: id as u64,
            attempt: 1,
        };
        inner.register(&registration(first, vec![old]), t1).unwrap();
        assert!(sent(&mut inner).is_empty(), "released while it still stops");
        assert!(confirm(&mut inner, first, id, 1, t1 + 1));
        assert_eq!(
            committed(&restored.store, &mut inner),
            vec![(second, id, START, 2)]
        );
        drop(inner);
        let again = test.restart(config);
        let inner = again.lock();
        assert_eq!(inner.stop_waits.held_jobs(), 0);
        assert_eq!(inner.node_assignments(NodeId(second)).len(), 1);
        assert!(again.store.load().unwrap().stop_waits.is_empty());
    }

    /// A restored wait's deadline (the STOP's grace and margin) counts only once its node
    /// has been heard from since the restart; a node not heard from is waited for until
    /// the liveness rule, counted from the restart, would requeue its jobs. A node that
    /// registers again without the stopped incarnation ends the wait at once.
    #[test]
    fn a_restored_wait_ends_by_its_deadline_once_heard_from_else_by_the_liveness_rule() {
        for case in ["heard from", "silent", "registered without it"] {
            let config = ServiceConfig::default();
            let test = TestCore::new(config.clone());
            let t0 = now_us();
            let (id, first, second) = moved_and_committed(&test, t0);
            let restored = test.restart(config);
            let mut inner = restored.lock();
            let restart = now_us();
            let liveness = inner.node_timeout_us + inner.node_grace_us;
            let grace_end = t0 + 1 + GRACE_MS as i64 * 1000 + STOP_CONFIRM_MARGIN_US;
            let started = vec![(second, id, START, 2)];
            match case {
                "heard from" => {
                    inner.expire_stop_waits(grace_end + 1_000_000);
                    assert!(sent(&mut inner).is_empty(), "{case}: released unheard");
                    inner.heard_from(NodeId(first), restart + 1_000);
                    inner.expire_stop_waits(grace_end - 1_000_000);
                    assert!(sent(&mut inner).is_empty(), "{case}: released early");
                    inner.expire_stop_waits(grace_end + 1_000_000);
                    assert_eq!(sent(&mut inner), started, "{case}");
                }
                "silent" => {
                    inner.expire_stop_waits(restart + liveness - 1_000_000);
                    assert!(sent(&mut inner).is_empty(), "{case}: released early");
                    inner.expire_stop_waits(restart + liveness + 1_000_000);
                    assert_eq!(sent(&mut inner), started, "{case}");
                }
                _ => {
                    inner
                        .register(&registration(first, vec![]), restart + 1_000)
                        .unwrap();
                    assert_eq!(sent(&mut inner), started, "{case}");
                }
            }
        }
    }

    /// After a restart, before any agent registers again, a STOP still goes out to be
    /// confirmed and holds the next START: the nodes' stop graces are stored.
    #[test]
    fn a_job_moved_right_after_a_restart_waits_for_its_old_node() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        {
            let mut inner = test.core.lock();
            let t0 = now_us();
            register(&mut inner, t0, true);
            let store = test.core.store.clone();
            inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            committed(&store, &mut inner);
        }
        let restored = test.restart(config);
        let mut inner = restored.lock();
        let t1 = now_us() + 1_000;
        let (&id, record) = inner.jobs.iter().next().unwrap();
        let first = record.placement.as_ref().unwrap().workers[0].node;
        let name = inner.topo.node(first).name.clone();
        inner.drain(&name, "maintenance", t1).unwrap();
        inner.cycle(t1 + 1, &NoModel.decision_path("topo-pack"));
        let (_, _, events) = inner.take_batch();
        let confirmed_stop = events.iter().any(|e| {
            matches!(e, Event::Assignment { node, assignment }
                if *node == first && assignment.job_id == id as u64 && assignment.confirm)
        });
        assert!(confirmed_stop, "the STOP asks for no confirmation");
        assert!(
            assignments(&events).iter().all(|a| a.2 != START),
            "started before the old node confirmed"
        );
        assert_eq!(inner.stop_waits.held_jobs(), 1);
    }

    /// An agent restarted in the middle of a stop grace adopts the stopping worker as
    /// running and, told to stop it again, gives it a fresh grace: the wait's deadline
    /// moves to that grace's end, so the START is not released while the worker may
    /// still be checkpointing. (One registering it as stopping keeps the first deadline.)
    #[test]
    fn a_registration_still_running_the_stopped_incarnation_restarts_the_deadline() {
        for still in ["running", "stopping"] {
            let test = TestCore::new(ServiceConfig::default());
            let (mut inner, t0, (id, first, second)) = moved_on(&test);
            sent(&mut inner);
            let old = pb::RunningJob {
                job_id: id as u64,
                attempt: 1,
            };
            let t1 = t0 + 20_000_000;
            let (running, stopping) = match still {
                "running" => (vec![old], vec![]),
                _ => (vec![], vec![old]),
            };
            let req = pb::RegisterNodeRequest {
                running,
                ..registration(first, stopping)
            };
            let reg = inner.register(&req, t1).unwrap();
            assert_eq!(reg.stop.len(), usize::from(still == "running"), "{still}");
            let grace = GRACE_MS as i64 * 1000 + STOP_CONFIRM_MARGIN_US;
            let (first_end, second_end) = (t0 + 1 + grace, t1 + grace);
            inner.expire_stop_waits(first_end + 1_000_000);
            let released = !sent(&mut inner).is_empty();
            assert_eq!(
                released,
                still == "stopping",
                "{still}: at the first deadline"
            );
            if still == "running" {
                inner.expire_stop_waits(second_end - 1_000_000);
                assert!(sent(&mut inner).is_empty(), "released early");
                inner.expire_stop_waits(second_end + 1_000_000);
                assert_eq!(sent(&mut inner), vec![(second, id, START, 2)]);
            }
        }
    }

    /// A job the restart itself requeues (its node now has fewer GPUs than its placement
    /// used) may still run there, and nothing has told it to stop: its next START waits
    /// for that node too. Cancelled, its stored wait is deleted.
    #[test]
    fn a_job_requeued_by_the_restart_waits_for_its_old_node() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        let t0 = now_us();
        let upper = {
            let mut inner = test.core.lock();
            register(&mut inner, t0, true);
            let jobs = [0, 1].map(|_| inner.submit(Some(&whole_gpu_job(1, 4)), t0).unwrap());
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            committed(&test.core.store, &mut inner);
            let on = |id: u32| inner.jobs[&id].placement.clone().unwrap().workers[0].clone();
            let (a, b) = (on(jobs[0]), on(jobs[1]));
            assert_eq!(a.node, b.node, "packed on one node");
            let high = |w: &crate::domain::WorkerPlacement| {
                w.gpus.iter().all(|g| inner.topo.gpu(g.gpu).index >= 4)
            };
            if high(&a) { jobs[0] } else { jobs[1] }
        };
        let smaller = crate::service::testkit::TWO_NODES
            .replace("gpus = 8", "gpus = 4")
            .replace("nvlink_domain = 8", "nvlink_domain = 4");
        let restored = crate::service::core::Core::restore(
            &ServiceConfig {
                db: "unused.redb".into(),
                accept_inventory_change: true,
                ..config
            },
            &crate::domain::ClusterSpec::from_toml(&smaller).unwrap(),
            test.core.store.clone(),
            std::sync::Arc::new(crate::service::metrics::Metrics::new()),
            std::sync::Arc::new(NoModel),
        )
        .unwrap();
        let mut inner = restored.lock();
        assert_eq!(inner.jobs[&upper].state, JobState::Requeued);
        let t1 = now_us() + 1_000;
        inner.cycle(t1, &NoModel.decision_path("topo-pack"));
        let r = &inner.jobs[&upper];
        assert_eq!((r.state, r.attempts), (JobState::Placed, 2));
        assert!(
            sent(&mut inner).iter().all(|a| a.2 != START),
            "started before its old node confirmed"
        );
        assert_eq!(inner.stop_waits.held_jobs(), 1);
        inner.cancel(upper, "not needed", t1 + 1).unwrap();
        committed(&restored.store, &mut inner);
        assert!(restored.store.load().unwrap().stop_waits.is_empty());
    }

    /// A node stored unreachable since long before the restart is not waited for
    /// again: the restart counts every node as heard from, but keeps when an
    /// unreachable one was marked.
    #[test]
    fn a_node_dead_before_the_restart_is_not_waited_for() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        let t0 = now_us();
        let (id, first) = {
            let mut inner = test.core.lock();
            register(&mut inner, t0, true);
            let id = inner.submit(Some(&whole_gpu_job(1, 8)), t0).unwrap();
            inner.cycle(t0, &NoModel.decision_path("topo-pack"));
            let first = inner.jobs[&id].placement.as_ref().unwrap().workers[0].node;
            let r = &mut inner.nodes[first.0 as usize];
            r.unreachable = true;
            r.unreachable_since_us = t0 - 600_000_000;
            inner.mark_node(first);
            committed(&test.core.store, &mut inner);
            (id, first)
        };
        let restored = test.restart(config);
        let mut inner = restored.lock();
        let t1 = now_us() + 1_000;
        let name = inner.topo.node(first).name.clone();
        inner.drain(&name, "dead", t1).unwrap();
        inner.cycle(t1 + 1, &NoModel.decision_path("topo-pack"));
        let started = sent(&mut inner)
            .iter()
            .any(|a| a.1 == id && a.0 != first.0 && a.2 == START);
        assert!(started, "held for a node dead since before the restart");
    }

    /// A job whose restored START is held but which its node reports running (an older
    /// build sent the START) is no longer held: held, it would be left out of its own
    /// node's snapshot, and the agent would stop it.
    #[test]
    fn a_held_job_reported_running_is_held_no_more() {
        let config = ServiceConfig::default();
        let test = TestCore::new(config.clone());
        let (id, _, second) = moved_and_committed(&test, now_us());
        let restored = test.restart(config);
        let mut inner = restored.lock();
        assert_eq!(inner.stop_waits.held_jobs(), 1);
        let req = pb::RegisterNodeRequest {
            running: vec![pb::RunningJob {
                job_id: id as u64,
                attempt: 2,
            }],
            ..registration(second, vec![])
        };
        inner.register(&req, now_us() + 1_000).unwrap();
        assert_eq!(inner.jobs[&id].state, JobState::Running);
        assert_eq!(inner.stop_waits.held_jobs(), 0);
        assert_eq!(inner.node_assignments(NodeId(second)).len(), 1);
    }
}
