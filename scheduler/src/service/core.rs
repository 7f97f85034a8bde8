//! The scheduler's in-memory state, its recovery from the store, and the driver that
//! runs cycles and group-commits every change before anyone hears of it.
//!
//! Ordering rule: a change becomes visible (reply, job event, assignment to an agent)
//! only after the transaction holding it is durable. So after `kill -9` nothing an
//! agent or client was told is missing from the database, and nothing in the database
//! is duplicated: allocations are re-applied to a fresh cluster state and checked
//! against capacity on restart.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::{Notify, broadcast, watch};

use crate::decision_log::{DecisionLog, LogBatch, LogCounts, LogOptions, OutcomeRow};
use crate::domain::{ClusterSpec, ClusterState, GpuModelSet, NodeId, Topology};
use crate::framework::Policy;
use crate::policies::learned::{LEARNED, LearnedSetup, TraceSink, build_policy};
use crate::service::codec;
use crate::service::config::ServiceConfig;
use crate::service::error::{ServiceError, StartError};
use crate::service::inventory::{self, Inventory, Remap};
use crate::service::jobs::{JobRecord, JobState};
use crate::service::metrics::Metrics;
use crate::service::model::{ModelSlot, ModelUpdate};
use crate::service::pb;
use crate::service::records::{DecisionRecord, NodeRecord, StoredStopWait};
use crate::service::stop_waits::RestoredStops;
use crate::service::store::{Batch, META_NEXT_DECISION, META_NEXT_JOB, Store};

/// Capacity of the event fan-out; a watcher that falls further behind is cut off and
/// told to re-list (assignment watchers get the full state again on reconnect).
pub const EVENT_BUFFER: usize = 1 << 16;

/// How often the driver looks for nodes whose heartbeat timed out.
const HEARTBEAT_CHECK_EVERY: Duration = Duration::from_millis(50);
/// How often retention runs (`service::retention`): finished jobs are found by a scan of
/// every job; decisions by a note of the next id.
const PURGE_CHECK_EVERY: Duration = Duration::from_secs(10);

/// A configured number of seconds as microseconds, saturating.
fn seconds_to_us(s: u64) -> i64 {
    s.saturating_mul(1_000_000).min(i64::MAX as u64) as i64
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// How far the wall clock has been stepped since the process first asked, in µs
/// (forward positive): its advance minus the monotonic clock's. Slewing moves both.
pub fn wall_step_us() -> i64 {
    static ANCHOR: std::sync::OnceLock<(Instant, i64)> = std::sync::OnceLock::new();
    let (steady, wall) = *ANCHOR.get_or_init(|| (Instant::now(), now_us()));
    let steady_us = steady.elapsed().as_micros().min(i64::MAX as u128) as i64;
    (now_us() - wall) - steady_us
}

/// Resolves once `rx` reads `true` (or its sender is gone).
pub async fn stopped(mut rx: watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Something watchers hear about, after it is durable.
#[derive(Debug, Clone)]
pub enum Event {
    Job(pb::JobEvent),
    Assignment {
        node: NodeId,
        assignment: pb::Assignment,
    },
}

#[derive(Debug, Default)]
pub(crate) struct Dirty {
    pub jobs: BTreeSet<u32>,
    pub nodes: BTreeSet<u32>,
    pub decisions: Vec<DecisionRecord>,
    pub events: Vec<Event>,
    pub meta: bool,
    /// Ended placements (and rejections) for the decision log.
    pub outcomes: Vec<OutcomeRow>,
    /// Finished jobs past their retention, to delete from the store.
    pub purged_jobs: Vec<u32>,
    /// Decision records with a smaller id are past their retention.
    pub decisions_before: Option<u64>,
    /// Nodes whose agent's stop grace changed (`service::stop_waits`).
    pub stop_graces: BTreeSet<u32>,
    /// Stored stop graces of nodes no longer in the inventory, to delete.
    pub stale_stop_graces: Vec<String>,
}

/// The last durable epoch, or why persisting stopped.
#[derive(Debug, Clone, Default)]
pub struct Committed {
    pub epoch: u64,
    pub error: Option<String>,
}

#[derive(Debug)]
pub struct Inner {
    pub topo: Arc<Topology>,
    pub state: ClusterState,
    pub(crate) policy: Policy,
    pub(crate) rng: ChaCha8Rng,
    pub jobs: BTreeMap<u32, JobRecord>,
    /// Waiting jobs (pending, preempted, requeued).
    pub queue: BTreeSet<u32>,
    /// Placed and running jobs.
    pub active: BTreeSet<u32>,
    pub nodes: Vec<NodeRecord>,
    pub node_index: HashMap<String, NodeId>,
    pub(crate) idempotency: HashMap<String, u32>,
    /// Submit's "can it ever fit" answers per job shape (the inventory is fixed).
    pub(crate) ever_fits: crate::framework::EverFitMemo,
    pub(crate) next_job: u32,
    pub(crate) next_decision: u64,
    pub(crate) event_seq: u64,
    /// The epoch that changes made now belong to.
    pub(crate) epoch: u64,
    pub(crate) dirty: Dirty,
    pub(crate) needs_cycle: bool,
    pub(crate) require_registration: bool,
    pub(crate) max_attempts: u32,
    pub(crate) quarantine_after: u32,
    /// See [`ServiceConfig::node_timeout_ms`] and [`ServiceConfig::node_grace_ms`].
    pub(crate) node_timeout_us: i64,
    /// [`wall_step_us`]: node liveness is timed on the monotonic clock, so that a step
    /// of the wall clock neither hides a dead node nor times out every live one (tests
    /// put a fake step here).
    pub(crate) wall_step: fn() -> i64,
    pub(crate) node_grace_us: i64,
    /// See [`ServiceConfig::finished_job_retention_s`].
    pub(crate) retention_us: Option<i64>,
    /// See [`ServiceConfig::decision_retention_s`].
    pub(crate) decision_retention_us: Option<i64>,
    /// `(next decision id, when)`, noted at each retention check that saw new decisions:
    /// every decision below the id was made before the time (`service::retention`).
    pub(crate) decision_marks: std::collections::VecDeque<(u64, i64)>,
    pub(crate) metrics: Arc<Metrics>,
    /// The learned placer's per-decision reports (drained after every cycle).
    pub(crate) trace: TraceSink,
    /// The learned model the policy was built with (generation, content version, gate
    /// margin threshold); generation 0 for heuristics.
    pub(crate) model_generation: u64,
    pub(crate) model_version: Option<String>,
    pub(crate) gate_threshold: Option<f64>,
    /// Whether decision-log rows are produced.
    pub(crate) log_enabled: bool,
    /// Whether the policy, rebuilt on every model reload, keeps CPU-only jobs on CPU
    /// nodes first ([`ServiceConfig::cpu_nodes_first`]).
    pub(crate) cpu_nodes_first: bool,
    /// The copy of `state` that a cycle's decision records are taken against, kept
    /// between cycles so that its buffers are reused.
    pub(crate) before_cycle: Option<ClusterState>,
    /// The reasons the last cycle wrote on waiting jobs that its tenant's quota or the
    /// policy held (`cycle::note_wait_reasons`).
    pub(crate) wait_reasons: HashMap<u32, String>,
    /// Moved jobs whose START waits for their stopped workers to end.
    pub(crate) stop_waits: crate::service::stop_waits::StopWaits,
    /// Whether a node's status changed since the node gauges were last counted.
    pub(crate) node_gauges_stale: bool,
    /// [`Inner::jobs_by_node`] as of the last change to a job's placement or activity
    /// (`None`: changed since): every agent's Heartbeat, watch and registration asks
    /// for its node's jobs, and a scan of all active jobs each time was O(active jobs)
    /// under the state's lock. Cleared by [`Inner::jobs_changed`].
    pub(crate) jobs_by_node_cache: std::cell::RefCell<Option<Vec<Vec<u32>>>>,
}

#[derive(Debug)]
pub struct Core {
    inner: Mutex<Inner>,
    wake: Notify,
    committed: watch::Sender<Committed>,
    /// Job events, for `WatchEvents`.
    pub events: broadcast::Sender<Arc<pb::JobEvent>>,
    /// Assignment watches by node, for `WatchAssignments`.
    pub watchers: crate::service::watchers::NodeWatchers,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub model: Arc<dyn ModelSlot>,
    pub policy_name: String,
    /// `cpu_nodes_first` and `[quota]`, which `Advise` applies to each call's policy.
    pub advise: crate::service::advisor::AdviseOptions,
    /// `max_concurrent_advise`.
    pub advise_slots: Arc<tokio::sync::Semaphore>,
    cycle_interval: Duration,
    log: Mutex<Option<DecisionLog>>,
    log_seen: Mutex<LogCounts>,
}

/// Moves the next decision id above every id the decision log holds for this database
/// (`decision_log::highest_logged_decision`): ids the log has seen would join other
/// jobs' outcomes to these decisions.
fn resume_above_the_log(inner: &mut Inner, dir: &std::path::Path, database: u64) {
    match crate::decision_log::highest_logged_decision(dir, database) {
        Ok(crate::decision_log::HighestLogged { found, skipped }) => {
            for file in &skipped {
                tracing::warn!(%file, "decision log: a file not read while looking for the highest decision id");
            }
            if let Some((id, file)) = found
                && id >= inner.next_decision
            {
                tracing::warn!(
                    next_decision = inner.next_decision,
                    logged = id,
                    %file,
                    "the decision log holds decision ids this database would give again (it was restored from an older snapshot, or lost its last changes with durable_commits = false); resuming above them"
                );
                // An id the writer could never have reached (a forged file) leaves the
                // ids where they are rather than wrap them round.
                match id.checked_add(1) {
                    Some(next) => inner.next_decision = next,
                    None => return,
                }
                inner.dirty.meta = true;
            }
        }
        Err(error) => tracing::warn!(
            %error,
            "decision log: cannot look for the highest decision id; new decisions may repeat ids in the log"
        ),
    }
}

impl Core {
    /// Builds the state from the inventory and whatever the store holds.
    pub fn restore(
        config: &ServiceConfig,
        spec: &ClusterSpec,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        model: Arc<dyn ModelSlot>,
    ) -> Result<Core, StartError> {
        let topo = Arc::new(Topology::build(spec).map_err(|e| StartError::Cluster(e.to_string()))?);
        let trace = TraceSink::default();
        let update = if config.policy == LEARNED {
            Some(model.policy_update(0).ok_or_else(|| {
                StartError::Policy(
                    "policy learned needs a learned-model slot (service::model::LearnedSlot)"
                        .into(),
                )
            })?)
        } else {
            None
        };
        let setup = update.as_ref().map(|u| LearnedSetup {
            trace: Some(trace.clone()),
            ..u.setup.clone()
        });
        let (mut policy, _) = build_policy(&config.policy, &[], setup.as_ref())
            .map_err(|e| StartError::Policy(e.to_string()))?;
        policy.reservation = config.reservation;
        policy.rebalance = config.rebalance;
        policy.consolidate = config.consolidate;
        policy.quota = config.quota.clone();
        if config.cpu_nodes_first {
            policy = policy.with_cpu_nodes_first();
        }
        let loaded = store.load().map_err(|e| StartError::Database {
            path: config.db.display().to_string(),
            message: e.to_string(),
        })?;
        if let Some(stored) = &loaded.inventory {
            let unfinished = loaded.jobs.iter().filter(|r| !r.state.is_final()).count();
            let current = Inventory::of(&topo);
            inventory::check_same_cluster(stored, &current, &config.cluster, unfinished).map_err(
                |message| StartError::Database {
                    path: config.db.display().to_string(),
                    message,
                },
            )?;
        }
        let new_database = loaded.jobs.is_empty() && loaded.next_decision <= 1;
        let database_id = loaded.database_id;
        if let Some(dir) = &config.decision_log_dir
            && new_database
            && holds_decision_files(dir)
        {
            // Decision ids start again at 1, so the log's rows of the earlier database and
            // of this one share ids, and joining decisions to outcomes by id (training
            // from the log) would pair rows of different jobs.
            tracing::warn!(
                database = %config.db.display(),
                decision_log_dir = %dir.display(),
                "a new database beside a decision log that holds an earlier one's files: decision ids start again at 1; training from the log reads only the files of the database with the latest rows (each file names its database), but the earlier files that name none are still read beside a single named database; give this database its own decision_log_dir"
            );
        }
        let node_index: HashMap<String, NodeId> = topo
            .node_ids()
            .map(|n| (topo.node(n).name.clone(), n))
            .collect();
        let mut inner = Inner {
            state: ClusterState::new(topo.clone()),
            topo: topo.clone(),
            policy,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            jobs: BTreeMap::new(),
            queue: BTreeSet::new(),
            active: BTreeSet::new(),
            nodes: vec![NodeRecord::default(); topo.nodes().len()],
            node_index,
            idempotency: HashMap::new(),
            ever_fits: Default::default(),
            next_job: loaded.next_job.clamp(1, u32::MAX as u64) as u32,
            next_decision: loaded.next_decision.max(1),
            event_seq: 0,
            epoch: 1,
            dirty: Dirty::default(),
            needs_cycle: true,
            require_registration: config.require_registration,
            max_attempts: config.max_attempts,
            quarantine_after: config.quarantine_after,
            node_timeout_us: config.node_timeout_ms.saturating_mul(1000) as i64,
            wall_step: wall_step_us,
            node_grace_us: config.node_grace_ms.saturating_mul(1000) as i64,
            retention_us: config.finished_job_retention_s.map(seconds_to_us),
            decision_retention_us: config.decision_retention_s.map(seconds_to_us),
            decision_marks: Default::default(),
            metrics: metrics.clone(),
            trace,
            model_generation: update.as_ref().map_or(0, |u| u.generation),
            model_version: update.as_ref().and_then(|u| u.version.clone()),
            gate_threshold: update.as_ref().and_then(|u| u.gate_threshold()),
            log_enabled: config.decision_log_dir.is_some(),
            cpu_nodes_first: config.cpu_nodes_first,
            before_cycle: None,
            wait_reasons: HashMap::new(),
            stop_waits: Default::default(),
            node_gauges_stale: true,
            jobs_by_node_cache: Default::default(),
        };
        for (name, record) in loaded.nodes {
            match inner.node_index.get(&name) {
                Some(n) => inner.nodes[n.0 as usize] = record,
                None => {
                    tracing::warn!(node = %name, "stored node is not in the inventory; ignored")
                }
            }
        }
        let now = now_us();
        let steady = now - wall_step_us();
        // Every agent gets a full timeout from the (re)start to be heard from, and a
        // node unreachable before it its grace from when it was marked.
        for r in &mut inner.nodes {
            r.last_seen_us = now;
            r.last_seen_steady_us = steady;
            r.unreachable_since_steady_us = r.unreachable_since_us - (now - steady);
        }
        // The job records' ids are positions in the inventory they were written under.
        let remap = Remap::between(loaded.inventory.as_ref(), &topo);
        let moved = inventory::jobs_a_change_would_move(&remap, &loaded.jobs, &topo);
        inventory::check_accepted_change(&moved, config.accept_inventory_change).map_err(
            |message| StartError::Database {
                path: config.db.display().to_string(),
                message,
            },
        )?;
        for line in &moved {
            tracing::warn!(change = %line, "accepted inventory change");
        }
        let mut remapped = Vec::new();
        let mut requeued_at_restore = Vec::new();
        for mut record in loaded.jobs {
            let id = record.job.id.0;
            inner.next_job = inner.next_job.max(id.saturating_add(1));
            let before = (record.job.gpu_models, record.placement.clone());
            // Where its workers may still run, should it not be restored.
            let nodes_now = record
                .placement
                .as_ref()
                .map(|p| remap.nodes_now(p))
                .unwrap_or_default();
            let unmapped = remap.job(&mut record, &topo);
            if record.state.is_active() {
                let attempt = record.attempts;
                // Re-applying every allocation to an empty state is the capacity check:
                // two stored jobs claiming one GPU cannot both be restored.
                let restored = match (unmapped.placement, &record.placement) {
                    (Some(why), _) => Err(why),
                    (None, Some(p)) => inner
                        .state
                        .allocate(&record.job, p)
                        .map_err(|e| e.to_string()),
                    (None, None) => Err("no placement stored".to_string()),
                };
                if let Err(why) = restored {
                    tracing::warn!(job = id, %why, "allocation not restored; job requeued");
                    requeued_at_restore.push((id, attempt, nodes_now));
                    let _ = record.transition(
                        JobState::Requeued,
                        format!("allocation could not be restored after a restart: {why}"),
                        None,
                        now,
                    );
                    inner.dirty.jobs.insert(id);
                }
            }
            // (A job still active was constrained to its nodes' models by `Remap::job`.)
            if let Some(why) = unmapped.models
                && !record.state.is_active()
            {
                // Its stored ids would name other models now; the reason names its own.
                record.job.gpu_models = GpuModelSet::ANY;
                let why = format!("after a restart with another inventory: {why}");
                if record.state.is_waiting() {
                    tracing::warn!(job = id, %why, "job rejected");
                    let _ = record.transition(JobState::Rejected, why, None, now);
                } else {
                    // A finished job's history stays as it ended.
                    let sep = if record.reason.is_empty() { "" } else { "; " };
                    record.reason = format!("{}{sep}{why}", record.reason);
                }
                inner.dirty.jobs.insert(id);
            }
            if (record.job.gpu_models, &record.placement) != (before.0, &before.1) {
                remapped.push(id);
            }
            if record.state.is_waiting() {
                inner.queue.insert(id);
                // A wait reason the last run wrote is cleared, like one written now, once
                // the quota or the policy no longer holds the job.
                if record.reason.starts_with(crate::service::cycle::WAITING) {
                    inner.wait_reasons.insert(id, record.reason.clone());
                }
            } else if record.state.is_active() {
                inner.active.insert(id);
            }
            if let Some(key) = &record.idempotency_key {
                inner.idempotency.insert(key.clone(), id);
            }
            inner.jobs.insert(id, record);
        }
        inner.jobs_changed();
        if !remap.stored_is_current() {
            // The mapped records and the inventory they now refer to go down together: a
            // crash between the two would leave ids read under the wrong inventory.
            if !remap.is_identity() {
                tracing::warn!(
                    jobs = remapped.len(),
                    "the inventory changed since the database was written; stored jobs mapped to it by node and model name"
                );
            }
            let mut batch = Changes {
                jobs: remapped
                    .iter()
                    .filter_map(|id| Some((*id, inner.jobs.get(id)?.clone())))
                    .collect(),
                ..Changes::default()
            }
            .serialise();
            batch.inventory =
                Some(
                    codec::encode(remap.current()).map_err(|message| StartError::Database {
                        path: config.db.display().to_string(),
                        message: format!("inventory not serialisable: {message}"),
                    })?,
                );
            store.commit(&batch).map_err(|e| StartError::Database {
                path: config.db.display().to_string(),
                message: e.to_string(),
            })?;
        }
        inner.restore_stop_waits(
            RestoredStops {
                graces: loaded.stop_graces,
                waits: loaded.stop_waits,
                damaged: loaded.damaged_stop_waits,
                requeued: requeued_at_restore,
            },
            now,
            steady,
        );
        for n in topo.node_ids() {
            inner.refresh_node(n);
        }
        if let Some(dir) = &config.decision_log_dir {
            resume_above_the_log(&mut inner, dir, database_id);
        }
        metrics
            .capacity_milli
            .set(inner.state.capacity_milli() as i64);
        let (committed, _) = watch::channel(Committed::default());
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        Ok(Core {
            inner: Mutex::new(inner),
            wake: Notify::new(),
            committed,
            events,
            watchers: Default::default(),
            store,
            metrics,
            model,
            policy_name: config.policy.clone(),
            advise: crate::service::advisor::AdviseOptions::of(config),
            advise_slots: crate::service::advisor::advise_slots(config.max_concurrent_advise),
            cycle_interval: Duration::from_millis(config.cycle_interval_ms),
            log: Mutex::new(config.decision_log_dir.as_ref().map(|dir| {
                DecisionLog::open(
                    dir,
                    LogOptions {
                        file_rows: config.decision_log_file_rows,
                        flush_ms: config.decision_log_flush_ms,
                        retention: config.decision_log_retention_s.map(Duration::from_secs),
                        database: Some(database_id),
                        ..LogOptions::default()
                    },
                )
            })),
            log_seen: Mutex::new(LogCounts::default()),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is a bug; the state it guards is still the
        // best information there is, so keep serving rather than poison every call.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the state, then waits until its changes are durable.
    pub async fn mutate<T>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, ServiceError>,
    ) -> Result<T, ServiceError> {
        self.check_writable()?;
        let (out, epoch) = {
            let mut inner = self.lock();
            let out = f(&mut inner)?;
            (out, inner.epoch)
        };
        self.wake.notify_one();
        self.wait_durable(epoch).await?;
        Ok(out)
    }

    pub fn check_writable(&self) -> Result<(), ServiceError> {
        match &self.committed.borrow().error {
            Some(e) => Err(ServiceError::Unavailable(format!(
                "the scheduler stopped accepting changes after a storage failure ({e}); restart it"
            ))),
            None => Ok(()),
        }
    }

    /// Called with the scheduling loop's result when its task ends. A panic there (a
    /// bug) would otherwise leave every write waiting for a commit that never comes and
    /// health still SERVING; instead all changes stop with the reason, as after a
    /// failed commit: writes are refused `UNAVAILABLE`, health says NOT_SERVING.
    pub fn driver_ended(&self, result: Result<(), tokio::task::JoinError>) {
        let Err(e) = result else {
            return;
        };
        let why = if e.is_panic() {
            let payload = e.into_panic();
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into())
        } else {
            "cancelled".into()
        };
        let error = format!("the scheduling loop stopped ({why})");
        tracing::error!(%error, "refusing further changes");
        self.committed.send_modify(|c| {
            c.error.get_or_insert(error);
        });
    }

    pub async fn wait_durable(&self, epoch: u64) -> Result<(), ServiceError> {
        let mut rx = self.committed.subscribe();
        loop {
            {
                let c = rx.borrow_and_update();
                if let Some(e) = &c.error {
                    return Err(ServiceError::Unavailable(format!("not persisted: {e}")));
                }
                if c.epoch >= epoch {
                    return Ok(());
                }
            }
            if rx.changed().await.is_err() {
                return Err(ServiceError::Unavailable(
                    "the server is shutting down".into(),
                ));
            }
        }
    }

    /// The open epoch, read under a lock the caller already holds.
    pub fn current_epoch_locked(&self, inner: &Inner) -> u64 {
        inner.epoch
    }

    pub fn committed(&self) -> watch::Receiver<Committed> {
        self.committed.subscribe()
    }

    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The driver: waits for an event or the cycle interval, runs a cycle when something
    /// changed, commits the batch, then publishes it. Returns after a final commit once
    /// `shutdown` flips.
    ///
    /// Cycles overlap the disk: while one batch is being written and fsynced, events
    /// still run cycles (placements are made, under the lock, as they would be), but
    /// their changes stay in the open epoch. When the write finishes, the epoch is closed
    /// and the next batch starts at once, holding everything changed meanwhile. So
    /// batches stay as large as the disk's latency allows (each commit costs CPU of its
    /// own: the fsync, the write-out, redb's page bookkeeping), and an epoch is published
    /// only once it and every epoch before it are durable, in order.
    pub async fn drive(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut last_cycle = Instant::now();
        let mut last_heartbeat_check = Instant::now();
        let mut last_purge = Instant::now();
        let mut in_flight: Option<InFlight> = None;
        loop {
            let stopping = tokio::select! {
                _ = self.wake.notified() => false,
                _ = tokio::time::sleep(self.cycle_interval) => false,
                r = shutdown.changed() => r.is_err() || *shutdown.borrow(),
                done = async { (&mut in_flight.as_mut().expect("guarded").task).await },
                    if in_flight.is_some() =>
                {
                    let flight = in_flight.take().expect("guarded");
                    if !self.publish(flight.closed, done) {
                        return;
                    }
                    false
                }
            };
            if stopping && let Some(mut flight) = in_flight.take() {
                let done = (&mut flight.task).await;
                if !self.publish(flight.closed, done) {
                    return;
                }
            }
            let closing = in_flight.is_none();
            let taken = {
                let mut inner = self.lock();
                // Timeouts are seconds long; scanning every node on every event (a
                // cycle can run per submit under load) would cost more than it tells.
                if last_heartbeat_check.elapsed() >= HEARTBEAT_CHECK_EVERY {
                    last_heartbeat_check = Instant::now();
                    inner.check_heartbeats(now_us());
                    inner.expire_stop_waits(now_us());
                }
                if last_purge.elapsed() >= PURGE_CHECK_EVERY {
                    last_purge = Instant::now();
                    inner.purge_finished(now_us());
                    inner.purge_decisions(now_us());
                }
                // A reloaded model takes over here, between cycles: every decision of a
                // cycle is made by one model.
                if let Some(update) = self.model.policy_update(inner.model_generation) {
                    inner.install_model(update);
                }
                if inner.needs_cycle || last_cycle.elapsed() >= self.cycle_interval {
                    last_cycle = Instant::now();
                    let started = Instant::now();
                    let path = self.model.decision_path(&self.policy_name);
                    inner.cycle(now_us(), &path);
                    self.metrics
                        .cycle_seconds
                        .observe(started.elapsed().as_secs_f64());
                }
                inner.update_gauges(&self.metrics);
                closing.then(|| inner.take_changes())
            };
            let Some((epoch, changes, log_rows, events)) = taken else {
                continue;
            };
            let closed = ClosedEpoch {
                epoch,
                log_rows,
                events,
            };
            if changes.is_empty() {
                // Nothing to write, and every earlier epoch is durable already.
                if !self.publish(closed, Ok(Ok(None))) || stopping {
                    return;
                }
                continue;
            }
            let mut flight = self.start_commit(changes, closed);
            if stopping {
                let done = (&mut flight.task).await;
                self.publish(flight.closed, done);
                return;
            }
            in_flight = Some(flight);
        }
    }

    /// Serialises and writes one epoch's changes on the blocking pool.
    fn start_commit(&self, changes: Changes, closed: ClosedEpoch) -> InFlight {
        let store = self.store.clone();
        let task = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            store
                .commit(&changes.serialise())
                .map(|()| Some(started.elapsed()))
        });
        InFlight { task, closed }
    }

    /// Publishes a finished commit: the epoch, its decision-log rows and its events.
    /// False when it failed: the driver stops, and every later change is refused.
    fn publish(
        &self,
        closed: ClosedEpoch,
        done: Result<CommitResult, tokio::task::JoinError>,
    ) -> bool {
        let error = match done {
            Ok(Ok(took)) => {
                if let Some(took) = took {
                    self.metrics.commit_seconds.observe(took.as_secs_f64());
                }
                None
            }
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("commit task: {e}")),
        };
        if let Some(error) = error {
            tracing::error!(%error, "commit failed; refusing further changes");
            self.committed.send_modify(|c| c.error = Some(error));
            return false;
        }
        self.committed.send_modify(|c| c.epoch = closed.epoch);
        self.log_rows(closed.log_rows);
        for event in closed.events {
            match event {
                // No receiver is not an error: nobody is watching.
                Event::Job(e) => drop(self.events.send(Arc::new(e))),
                Event::Assignment { node, assignment } => {
                    self.watchers.publish(node, &assignment);
                }
            }
        }
        true
    }
}

/// What a commit task returns: how long the write took (`None` when there was nothing
/// to write).
type CommitResult = Result<Option<Duration>, crate::service::store::StoreError>;

/// What an epoch publishes once it is durable.
struct ClosedEpoch {
    epoch: u64,
    log_rows: LogBatch,
    events: Vec<Event>,
}

/// A batch being written, with what to publish once it is durable.
struct InFlight {
    task: tokio::task::JoinHandle<CommitResult>,
    closed: ClosedEpoch,
}

impl Core {
    /// Hands committed rows to the decision-log writer (never blocks) and brings the
    /// log's counters into the metrics.
    fn log_rows(&self, rows: LogBatch) {
        let guard = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let Some(log) = guard.as_ref() else { return };
        log.send(rows);
        let now = log.stats();
        drop(guard);
        self.account_log(now);
    }

    fn account_log(&self, now: LogCounts) {
        let mut seen = self.log_seen.lock().unwrap_or_else(|e| e.into_inner());
        let m = &self.metrics;
        m.decision_log_rows
            .get_or_create(&vec![("outcome", "written")])
            .inc_by(now.rows_written.saturating_sub(seen.rows_written));
        m.decision_log_rows
            .get_or_create(&vec![("outcome", "lost")])
            .inc_by(now.rows_lost.saturating_sub(seen.rows_lost));
        m.decision_log_errors
            .inc_by(now.write_errors.saturating_sub(seen.write_errors));
        m.decision_log_pruned
            .inc_by(now.files_pruned.saturating_sub(seen.files_pruned));
        *seen = now;
    }

    /// The decision log's counters (zero without a log).
    pub fn decision_log_stats(&self) -> LogCounts {
        let guard = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let now = guard.as_ref().map(DecisionLog::stats).unwrap_or_default();
        drop(guard);
        if now != LogCounts::default() {
            self.account_log(now);
        }
        now
    }

    /// Writes the decision log's buffered rows and stops its writer (at shutdown,
    /// after the driver's last commit).
    pub fn finish_decision_log(&self) -> Option<LogCounts> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        let counts = log.finish();
        self.account_log(counts);
        Some(counts)
    }
}

/// Whether the decision log at `dir` holds any decision file.
fn holds_decision_files(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir.join(crate::decision_log::DECISIONS_DIR)).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "parquet"))
    })
}

impl Inner {
    /// Rebuilds the learned policy on a newly loaded model (between cycles).
    pub(crate) fn install_model(&mut self, update: ModelUpdate) {
        let setup = LearnedSetup {
            trace: Some(self.trace.clone()),
            ..update.setup.clone()
        };
        match build_policy(LEARNED, &[], Some(&setup)) {
            Ok((policy, _)) => {
                let policy = Policy {
                    reservation: self.policy.reservation,
                    rebalance: self.policy.rebalance,
                    consolidate: self.policy.consolidate,
                    quota: self.policy.quota.clone(),
                    ..policy
                };
                self.policy = if self.cpu_nodes_first {
                    policy.with_cpu_nodes_first()
                } else {
                    policy
                };
                self.model_generation = update.generation;
                self.model_version = update.version.clone();
                self.gate_threshold = update.gate_threshold();
                self.trace.lock().unwrap_or_else(|e| e.into_inner()).clear();
            }
            Err(e) => {
                // Cannot happen with a validated configuration; keep the current policy.
                tracing::error!(error = %e, "learned policy not rebuilt; the current model is kept");
                self.model_generation = update.generation;
            }
        }
    }

    /// Whether node `n` takes new work, applied to the cluster state.
    pub fn refresh_node(&mut self, n: NodeId) {
        let r = &self.nodes[n.0 as usize];
        let up = (r.registered || !self.require_registration)
            && !r.cordoned
            && !r.quarantined
            && !r.unreachable;
        self.state.set_node_up(n, up);
        self.node_gauges_stale = true;
    }

    pub fn mark_node(&mut self, n: NodeId) {
        self.dirty.nodes.insert(n.0);
        self.refresh_node(n);
        self.needs_cycle = true;
    }

    pub fn push_event(&mut self, event: Event) {
        self.dirty.events.push(event);
    }

    pub fn next_seq(&mut self) -> u64 {
        self.event_seq += 1;
        self.event_seq
    }

    pub fn update_gauges(&mut self, m: &Metrics) {
        m.queue_depth.set(self.queue.len() as i64);
        m.active_jobs.set(self.active.len() as i64);
        m.allocated_milli.set(self.state.allocated_milli() as i64);
        m.starts_held.set(self.stop_waits.held_jobs() as i64);
        // Counting walks every node, and this runs after every event.
        if !std::mem::take(&mut self.node_gauges_stale) {
            return;
        }
        m.unreachable_nodes
            .set(self.nodes.iter().filter(|r| r.unreachable).count() as i64);
        m.schedulable_nodes.set(
            self.topo
                .node_ids()
                .filter(|&n| self.state.node_is_up(n))
                .count() as i64,
        );
    }

    /// Closes the current epoch: its records serialised, its events to publish.
    #[cfg(test)]
    pub(crate) fn take_batch(&mut self) -> (u64, (Batch, LogBatch), Vec<Event>) {
        let (epoch, changes, log, events) = self.take_changes();
        (epoch, (changes.serialise(), log), events)
    }

    /// Closes the current epoch: copies of its changed records (serialised later, off
    /// the lock), its decision-log rows and its events to publish.
    pub(crate) fn take_changes(&mut self) -> (u64, Changes, LogBatch, Vec<Event>) {
        let epoch = self.epoch;
        self.epoch += 1;
        let dirty = std::mem::take(&mut self.dirty);
        let jobs = dirty
            .jobs
            .iter()
            .filter_map(|id| Some((*id, self.jobs.get(id)?.clone())))
            .collect();
        let nodes = dirty
            .nodes
            .iter()
            .map(|&n| {
                (
                    self.topo.node(NodeId(n)).name.clone(),
                    self.nodes[n as usize].clone(),
                )
            })
            .collect();
        let stop_graces = dirty
            .stop_graces
            .iter()
            .map(|&n| {
                (
                    self.topo.node(NodeId(n)).name.clone(),
                    self.nodes[n as usize].confirms_stops_within_us,
                )
            })
            .chain(dirty.stale_stop_graces.into_iter().map(|name| (name, None)))
            .collect();
        let stop_waits = self.stop_wait_changes();
        let meta = if dirty.meta {
            vec![
                (META_NEXT_JOB, self.next_job as u64),
                (META_NEXT_DECISION, self.next_decision),
            ]
        } else {
            Vec::new()
        };
        let log = if self.log_enabled {
            LogBatch {
                decisions: dirty
                    .decisions
                    .iter()
                    .filter(|d| d.source == "cycle")
                    .map(|d| d.log_row())
                    .collect(),
                outcomes: dirty.outcomes,
            }
        } else {
            LogBatch::default()
        };
        let changes = Changes {
            jobs,
            nodes,
            decisions: dirty.decisions,
            meta,
            purged_jobs: dirty.purged_jobs,
            decisions_before: dirty.decisions_before,
            stop_waits,
            stop_graces,
        };
        (epoch, changes, log, dirty.events)
    }
}

/// One epoch's changed records, owned, so that serialising them for the store happens
/// outside the state's lock.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    jobs: Vec<(u32, JobRecord)>,
    nodes: Vec<(String, NodeRecord)>,
    decisions: Vec<DecisionRecord>,
    meta: Vec<(&'static str, u64)>,
    purged_jobs: Vec<u32>,
    decisions_before: Option<u64>,
    stop_waits: Vec<(u32, Option<Vec<StoredStopWait>>)>,
    stop_graces: Vec<(String, Option<i64>)>,
}

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.nodes.is_empty()
            && self.decisions.is_empty()
            && self.meta.is_empty()
            && self.purged_jobs.is_empty()
            && self.decisions_before.is_none()
            && self.stop_waits.is_empty()
            && self.stop_graces.is_empty()
    }

    pub(crate) fn serialise(self) -> Batch {
        let mut batch = Batch::default();
        for (id, r) in self.jobs {
            match codec::encode(&r) {
                Ok(bytes) => batch.jobs.push((id as u64, bytes)),
                Err(e) => tracing::error!(job = id, error = %e, "job record not serialisable"),
            }
        }
        for (name, r) in self.nodes {
            match codec::encode(&r) {
                Ok(bytes) => batch.nodes.push((name, bytes)),
                Err(e) => tracing::error!(node = %name, error = %e, "node record not serialisable"),
            }
        }
        for d in &self.decisions {
            match codec::encode(d) {
                Ok(bytes) => batch.decisions.push((d.id, bytes)),
                Err(e) => {
                    tracing::error!(decision = d.id, error = %e, "decision record not serialisable")
                }
            }
        }
        batch.meta = self.meta;
        batch.deleted_jobs = self.purged_jobs.into_iter().map(u64::from).collect();
        batch.decisions_before = self.decisions_before;
        for (id, waits) in self.stop_waits {
            match waits.as_ref().map(codec::encode).transpose() {
                Ok(bytes) => batch.stop_waits.push((u64::from(id), bytes)),
                Err(e) => tracing::error!(job = id, error = %e, "stop waits not serialisable"),
            }
        }
        batch.stop_graces = self.stop_graces;
        batch
    }
}

#[cfg(test)]
mod tests {
    use crate::service::config::ServiceConfig;
    use crate::service::testkit::TestCore;

    #[test]
    fn decision_files_of_an_earlier_database_are_noticed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!super::holds_decision_files(dir.path()));
        let decisions = dir.path().join(crate::decision_log::DECISIONS_DIR);
        std::fs::create_dir(&decisions).unwrap();
        std::fs::write(decisions.join("notes.txt"), b"").unwrap();
        assert!(!super::holds_decision_files(dir.path()));
        std::fs::write(decisions.join("decisions-0001.parquet"), b"").unwrap();
        assert!(super::holds_decision_files(dir.path()));
    }

    #[test]
    fn a_panic_in_the_scheduling_loop_stops_changes_with_its_reason() {
        let test = TestCore::new(ServiceConfig::default());
        assert!(test.core.check_writable().is_ok());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let ended = runtime.block_on(async {
            tokio::spawn(async { panic!("index out of bounds in the cycle") }).await
        });
        test.core.driver_ended(ended);
        let refused = test.core.check_writable().unwrap_err().to_string();
        assert!(
            refused.contains("the scheduling loop stopped (index out of bounds in the cycle)"),
            "{refused}"
        );
        assert!(test.core.committed().borrow().error.is_some());
        // A loop that returned (shutdown) changes nothing.
        let test = TestCore::new(ServiceConfig::default());
        test.core.driver_ended(Ok(()));
        assert!(test.core.check_writable().is_ok());
    }
}
