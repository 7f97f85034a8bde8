//! Applying assignments: what the node runs, keyed by incarnation (job, worker,
//! attempt), and the reports owed to the scheduler.
//!
//! - **Idempotent.** A START for an incarnation that runs, or that ran here already, is
//!   ignored: the server re-sends the node's current set on every watch, so the same
//!   START arrives again after each reconnect. A START for a newer attempt of a worker
//!   stops the older one first.
//! - **Snapshot.** The STARTs that open a watch are held until SYNCED; then whatever
//!   runs and is not in the snapshot is stopped first and the snapshot applied after, so
//!   two incarnations never hold one GPU at the same time.
//! - **Reports outlive connections.** RUNNING, COMPLETED and FAILED reports wait in
//!   [`Runner::reports`] until the scheduler acknowledges (or refuses) them; the jobs
//!   with a report owed are listed at registration as still running here.
//! - A job's workers on this node report once for the job: FAILED as soon as one fails,
//!   COMPLETED when all have exited with status 0.
//! - **`--exec` workers outlive the agent.** Each runs under a supervising shell that
//!   records its exit status (`supervisor`), with a state record on disk (`records`)
//!   from its start until the scheduler has no further use for it: its STOP, or the
//!   delivery (or refusal) of its job's final report. A restarted agent adopts them
//!   ([`Runner::adopt_survivors`]); a shutdown leaves them running
//!   ([`Runner::shut_down`]) unless told to stop them.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use marshal_scheduler::service::pb;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::connected::Backlog;
use crate::connected::checkpoints::{self, Checkpoints};
use crate::connected::env::{env_file_text, expected_runtime_s, job_env};
use crate::connected::mig::MigPool;
use crate::connected::procfs;
use crate::connected::records::{self, HeldGpu, RecordStore, WorkerRecord};
use crate::connected::supervisor;

mod adopt;
mod logs;
pub use adopt::Adoption;

/// One placement of one worker of a job.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation {
    pub job: u64,
    pub worker: u32,
    pub attempt: u32,
}

impl Incarnation {
    pub fn of(a: &pb::Assignment) -> Self {
        Incarnation {
            job: a.job_id,
            worker: a.worker,
            attempt: a.attempt,
        }
    }

    fn file_stem(&self) -> String {
        format!("{}.{}", self.job, self.worker)
    }
}

/// What the agent does with a START.
#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    /// Runs the command with `sh -c` in the job's environment, under a supervising
    /// shell that outlives the agent (`supervisor`); reports RUNNING, then COMPLETED
    /// (exit status 0) or FAILED (anything else, or a failed spawn). Linux only.
    Exec(String),
    /// Simulated source without a command: reports RUNNING, then COMPLETED once the job's
    /// expected run time (`MARSHAL_EXPECTED_RUNTIME_S`) divided by `speedup` has passed.
    /// A job without an expected run time runs until the scheduler stops it: the agent
    /// does not invent an end.
    Simulated { speedup: f64 },
    /// Writes the environment file only; whatever launches the job reports on it.
    EnvOnly,
}

/// One change to what the node runs, for tests and debugging.
#[derive(Clone, Debug)]
pub struct Applied {
    pub at: Instant,
    pub node: String,
    pub incarnation: Incarnation,
    pub gpus: Vec<pb::GpuSlot>,
    /// `true`: started; `false`: ended (exited, stopped, or superseded).
    pub started: bool,
    /// With `started`: not started here but adopted, running, from an earlier agent.
    pub adopted: bool,
}

/// A shared log of [`Applied`] changes.
pub type Journal = Arc<Mutex<Vec<Applied>>>;

/// A worker's process (or simulated run) ended on its own.
#[derive(Debug)]
pub struct Exit {
    pub incarnation: Incarnation,
    /// `Ok(())`: success; `Err(why)`: failure.
    pub outcome: Result<(), String>,
}

#[derive(Debug)]
struct Live {
    gpus: Vec<pb::GpuSlot>,
    /// Sending kills the worker; dropping it leaves an `--exec` worker running.
    kill: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// How long past the stop grace a START waits for a stopping worker: the SIGKILL and
/// the wait for the process group to go.
const STOP_WAIT: Duration = Duration::from_secs(12);

/// How many ended incarnations are remembered to ignore a repeated START.
const REMEMBERED: usize = 65_536;

#[derive(Debug)]
pub struct Runner {
    node: String,
    mode: Mode,
    assignments_dir: PathBuf,
    logs_dir: PathBuf,
    live: BTreeMap<Incarnation, Live>,
    /// `--exec` workers told to stop whose processes have not ended yet (SIGTERM sent,
    /// within the stop grace): their GPUs are still theirs.
    stopping: BTreeMap<Incarnation, Live>,
    /// SIGTERM to SIGKILL, for `--exec` workers ([`Runner::with_stop_grace`]).
    pub(crate) stop_grace: Duration,
    ended: HashSet<Incarnation>,
    ended_order: VecDeque<Incarnation>,
    /// Failed workers, so that a job's report stays FAILED whatever its other workers do.
    failed: HashSet<(u64, u32)>,
    /// (job, attempt) → the report owed: state and message.
    pub reports: BTreeMap<(u64, u32), (pb::JobState, String)>,
    /// (job, attempt) told to stop whose end the scheduler waits to hear about before
    /// it starts the job elsewhere: owed a confirmation once no worker of it is left here.
    confirm_when_ended: HashSet<(u64, u32)>,
    /// (job, attempt) whose workers here have all ended after such a stop: the
    /// confirmations owed (`ReportStopped`).
    pub stops_to_confirm: BTreeSet<(u64, u32)>,
    exits: mpsc::UnboundedSender<Exit>,
    backlog: Arc<Backlog>,
    journal: Option<Journal>,
    mig: MigPool,
    /// `--exec` only: the workers' state records and exit statuses (`OUT/jobs/state`).
    records: Option<RecordStore>,
    /// This boot's id, stored in each record.
    boot_id: String,
    /// Ended `--exec` workers whose record is kept until their job's report settles.
    awaiting_report: BTreeSet<Incarnation>,
    /// `--exec` only: the workers' checkpoint files (`OUT/jobs/checkpoints`).
    checkpoints: Option<Checkpoints>,
    /// `--exec` workers' logs older than this are deleted ([`Runner::sweep_logs`]).
    log_retention: Option<std::time::Duration>,
    next_log_sweep: std::time::Instant,
    pub starts: u64,
}

/// How often expired worker logs are looked for.
const LOG_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

impl Runner {
    pub fn new(
        node: &str,
        mode: Mode,
        out: &Path,
        exits: mpsc::UnboundedSender<Exit>,
        backlog: Arc<Backlog>,
        journal: Option<Journal>,
        mig: Vec<marshal_telemetry::MigInstance>,
    ) -> std::io::Result<Self> {
        let assignments_dir = out.join("assignments");
        let logs_dir = out.join("jobs");
        let at = |path: &Path| {
            let path = path.display().to_string();
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"))
        };
        std::fs::create_dir_all(&assignments_dir).map_err(at(&assignments_dir))?;
        let (records, boot_id, checkpoints) = if matches!(mode, Mode::Exec(_)) {
            // Without /proc (not Linux) a worker cannot be told from a stranger that
            // reuses its pid: `--exec` is refused rather than run unsupervisable.
            let boot_id = procfs::boot_id().map_err(std::io::Error::other)?;
            let (state, checkpoints) = (logs_dir.join("state"), logs_dir.join("checkpoints"));
            (
                Some(RecordStore::open(state.clone()).map_err(at(&state))?),
                boot_id,
                Some(Checkpoints::open(checkpoints.clone()).map_err(at(&checkpoints))?),
            )
        } else {
            (None, String::new(), None)
        };
        Ok(Runner {
            node: node.to_string(),
            mode,
            assignments_dir,
            logs_dir,
            live: BTreeMap::new(),
            stopping: BTreeMap::new(),
            confirm_when_ended: HashSet::new(),
            stops_to_confirm: BTreeSet::new(),
            stop_grace: Duration::ZERO,
            ended: HashSet::new(),
            ended_order: VecDeque::new(),
            failed: HashSet::new(),
            reports: BTreeMap::new(),
            exits,
            backlog,
            journal,
            mig: MigPool::new(mig),
            records,
            boot_id,
            awaiting_report: BTreeSet::new(),
            checkpoints,
            log_retention: None,
            next_log_sweep: std::time::Instant::now(),
            starts: 0,
        })
    }

    /// Deletes `--exec` workers' logs last written longer ago than `retention` (see
    /// [`Runner::sweep_logs`]); `None`: kept for ever.
    pub fn with_log_retention(mut self, retention: Option<std::time::Duration>) -> Self {
        self.log_retention = retention;
        self
    }

    /// How long a stopped `--exec` worker has between SIGTERM and SIGKILL (default: none,
    /// SIGKILL at once). A START for GPUs a stopping worker holds waits for it to end.
    pub fn with_stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// At most hourly: deletes expired worker logs, except those of workers running here
    /// or awaiting their report. Returns how many went.
    pub fn sweep_logs(&mut self) -> usize {
        let Some(keep) = self.log_retention else {
            return 0;
        };
        if self.records.is_none() || std::time::Instant::now() < self.next_log_sweep {
            return 0;
        }
        self.next_log_sweep = std::time::Instant::now() + LOG_SWEEP_EVERY;
        let Some(before) = std::time::SystemTime::now().checked_sub(keep) else {
            return 0;
        };
        logs::prune_logs(
            &self.logs_dir,
            before,
            self.live
                .keys()
                .chain(self.stopping.keys())
                .chain(&self.awaiting_report),
        )
    }

    pub fn live(&self) -> impl Iterator<Item = &Incarnation> {
        self.live.keys()
    }

    /// Stopped workers whose processes have not ended yet.
    pub fn stopping_count(&self) -> usize {
        self.stopping.len()
    }

    /// What runs here, and what finished without its report acknowledged: the
    /// registration's `running` list.
    pub fn running_list(&self) -> Vec<pb::RunningJob> {
        let set: BTreeSet<(u64, u32)> = self
            .live
            .keys()
            .map(|i| (i.job, i.attempt))
            .chain(self.reports.keys().copied())
            .collect();
        set.into_iter()
            .map(|(job_id, attempt)| pb::RunningJob { job_id, attempt })
            .collect()
    }

    /// The incarnations told to stop whose workers have not ended yet (within their
    /// stop grace), for a registration; each is confirmed when it ends, since the
    /// scheduler may have moved its job while this agent was away and wait for it.
    pub fn stopping_list(&mut self) -> Vec<pb::RunningJob> {
        let set: BTreeSet<(u64, u32)> = self.stopping.keys().map(|i| (i.job, i.attempt)).collect();
        for &(job, attempt) in &set {
            self.want_stop_confirmed(job, attempt);
        }
        set.into_iter()
            .map(|(job_id, attempt)| pb::RunningJob { job_id, attempt })
            .collect()
    }

    fn journal(&self, incarnation: Incarnation, gpus: &[pb::GpuSlot], started: bool) {
        self.journal_entry(incarnation, gpus, started, false);
    }

    fn journal_entry(
        &self,
        incarnation: Incarnation,
        gpus: &[pb::GpuSlot],
        started: bool,
        adopted: bool,
    ) {
        if let Some(j) = &self.journal {
            j.lock().unwrap_or_else(|p| p.into_inner()).push(Applied {
                at: Instant::now(),
                node: self.node.clone(),
                incarnation,
                gpus: gpus.to_vec(),
                started,
                adopted,
            });
        }
    }

    fn remember(&mut self, i: Incarnation) {
        if self.ended.insert(i) {
            self.ended_order.push_back(i);
            if self.ended_order.len() > REMEMBERED
                && let Some(old) = self.ended_order.pop_front()
            {
                self.ended.remove(&old);
            }
        }
    }

    fn env_path(&self, i: &Incarnation) -> PathBuf {
        self.assignments_dir.join(format!("{}.env", i.file_stem()))
    }

    /// A start that could not happen, reported as a failed run (through the exit
    /// channel, like a worker's): the scheduler requeues the job.
    fn fail_start(&mut self, inc: Incarnation, gpus: &[pb::GpuSlot], why: String) {
        self.journal(inc, gpus, true);
        self.live.insert(
            inc,
            Live {
                gpus: gpus.to_vec(),
                kill: None,
                task: None,
            },
        );
        let _ = self.exits.send(Exit {
            incarnation: inc,
            outcome: Err(why),
        });
    }

    /// Applies a START (idempotently).
    pub async fn start(&mut self, a: &pb::Assignment) {
        let inc = Incarnation::of(a);
        if self.live.contains_key(&inc) || self.ended.contains(&inc) {
            return;
        }
        let older: Vec<Incarnation> = self
            .live
            .keys()
            .filter(|i| i.job == inc.job && i.worker == inc.worker && i.attempt < inc.attempt)
            .copied()
            .collect();
        for i in older {
            self.stop(i).await;
        }
        if inc.attempt != 0
            && self
                .ended
                .iter()
                .any(|i| i.job == inc.job && i.worker == inc.worker && i.attempt > inc.attempt)
        {
            return; // an older placement than one already seen
        }
        self.reap_stopped();
        // Its GPUs must be free, and an earlier attempt of the same job gone: two
        // attempts at once would write one checkpoint.
        let wanted: HashSet<u32> = a.gpus.iter().map(|g| g.index).collect();
        self.wait_stopped(|i, l| {
            i.job == inc.job || l.gpus.iter().any(|g| wanted.contains(&g.index))
        })
        .await;
        let mut env = job_env(a, &self.node);
        if let Some(c) = &mut self.checkpoints {
            c.reset(&inc);
            env.insert(
                checkpoints::ENV_VAR.into(),
                c.path(&inc).display().to_string(),
            );
        }
        let mut mig_uuids = Vec::new();
        match self.claim_mig(inc, &a.gpus) {
            Ok(uuids) if !uuids.is_empty() => {
                let list = uuids.join(",");
                env.insert("CUDA_VISIBLE_DEVICES".into(), list.clone());
                env.insert("MARSHAL_MIG_UUID".into(), list);
                mig_uuids = uuids;
            }
            Ok(_) => {}
            Err(why) => return self.fail_start(inc, &a.gpus, why),
        }
        let path = self.env_path(&inc);
        // Whole and synced before it appears: a launcher that sees the file sees all of
        // it, after a crash too.
        if let Err((_, e)) = records::write_durably(&path, env_file_text(&env).as_bytes()) {
            tracing::error!(path = %path.display(), error = %e, "environment file not written");
            if matches!(self.mode, Mode::EnvOnly) {
                // The file is the only way the launcher hears of the job: without it the
                // job would never run while the scheduler held its GPUs for ever.
                let why = format!("environment file {} not written: {e}", path.display());
                return self.fail_start(inc, &a.gpus, why);
            }
        }
        self.journal(inc, &a.gpus, true);
        self.backlog.set_job(&a.gpus, Some(inc.job));
        self.starts += 1;
        let mut live = Live {
            gpus: a.gpus.clone(),
            kill: None,
            task: None,
        };
        match self.mode.clone() {
            Mode::EnvOnly => {}
            Mode::Simulated { speedup } => {
                self.owe(inc, pb::JobState::Running, "running (simulated)".into());
                if let Some(s) = expected_runtime_s(&env) {
                    let tx = self.exits.clone();
                    let wait = Duration::from_secs_f64((s / speedup).min(1e9));
                    live.task = Some(tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        let _ = tx.send(Exit {
                            incarnation: inc,
                            outcome: Ok(()),
                        });
                    }));
                }
            }
            Mode::Exec(cmd) => match self.launch(inc, &cmd, &env, &a.gpus, mig_uuids).await {
                Ok((kill, task)) => {
                    self.owe(inc, pb::JobState::Running, format!("running: {cmd}"));
                    live.kill = Some(kill);
                    live.task = Some(task);
                }
                Err(why) => {
                    let _ = self.exits.send(Exit {
                        incarnation: inc,
                        outcome: Err(why),
                    });
                }
            },
        }
        self.live.insert(inc, live);
    }

    /// Starts an `--exec` worker under its supervising shell, records it, and watches
    /// it. An error is the reason the start failed.
    async fn launch(
        &self,
        inc: Incarnation,
        cmd: &str,
        env: &BTreeMap<String, String>,
        gpus: &[pb::GpuSlot],
        mig_uuids: Vec<String>,
    ) -> Result<(oneshot::Sender<()>, JoinHandle<()>), String> {
        let Some(store) = self.records.clone() else {
            return Err("no worker state directory (not in `--exec` mode)".into());
        };
        // An exit status left by an earlier run of this incarnation would end it at once.
        store.remove(&inc);
        let log = self.logs_dir.join(logs::log_name(&inc));
        let launched = supervisor::launch(cmd, env, &log, &store.exit_path(&inc))
            .await
            .map_err(|e| format!("could not start `{cmd}`: {e}"))?;
        let record = WorkerRecord {
            job: inc.job,
            worker: inc.worker,
            attempt: inc.attempt,
            gpus: gpus.iter().map(HeldGpu::from).collect(),
            mig_uuids,
            pid: launched.identity.pid,
            start_ticks: launched.identity.start_ticks,
            boot_id: self.boot_id.clone(),
            command: cmd.to_string(),
            version: records::RECORD_VERSION,
        };
        let (kill, control) = oneshot::channel();
        let task = tokio::spawn(supervisor::watch_launched(
            launched,
            inc,
            store.clone(),
            control,
            self.exits.clone(),
            self.stop_grace,
        ));
        if let Err(e) = store.write(&record) {
            // Unrecorded, it would be left running unsupervised by the next shutdown.
            let _ = kill.send(());
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
            store.remove(&inc);
            return Err(format!(
                "could not record the worker, so it was stopped: {e}"
            ));
        }
        Ok((kill, task))
    }

    /// Records a report owed, unless a final one is owed already.
    fn owe(&mut self, inc: Incarnation, state: pb::JobState, message: String) {
        let key = (inc.job, inc.attempt);
        let final_owed = self
            .reports
            .get(&key)
            .is_some_and(|(s, _)| *s != pb::JobState::Running);
        if !final_owed || state == pb::JobState::Failed {
            self.reports.insert(key, (state, message));
        }
    }

    /// Owes a RUNNING report for each job whose workers wrote a checkpoint since the
    /// last poll (called at the agent's report-retry interval); a final report owed
    /// stays as it is.
    pub fn poll_checkpoints(&mut self) {
        let Some(c) = &mut self.checkpoints else {
            return;
        };
        for ((job, attempt), at) in c.poll(self.live.keys()) {
            let inc = Incarnation {
                job,
                worker: 0,
                attempt,
            };
            self.owe(inc, pb::JobState::Running, format!("checkpoint at {at:.3}"));
        }
    }

    /// The last checkpoint of `job` at `attempt` its workers here wrote (Unix seconds;
    /// 0: none, or not `--exec`).
    pub fn last_checkpoint(&self, job: u64, attempt: u32) -> f64 {
        self.checkpoints
            .as_ref()
            .map_or(0.0, |c| c.last(job, attempt))
    }

    /// Ends one incarnation at the scheduler's word (STOP, snapshot, registration),
    /// reporting nothing. An `--exec` worker's process is told to stop and, until it has
    /// ended (SIGTERM, then SIGKILL after the stop grace), keeps its GPUs: a START for
    /// them waits. Nothing else waits for it.
    pub async fn stop(&mut self, inc: Incarnation) {
        let Some(mut live) = self.live.remove(&inc) else {
            return;
        };
        if let Some(kill) = live.kill.take() {
            let _ = kill.send(());
        }
        // A repeated START of it is ignored from now, not only once it has ended.
        self.remember(inc);
        match live.task.take() {
            Some(task) if matches!(self.mode, Mode::Exec(_)) => {
                // The task ends the process group and reaps it.
                live.task = Some(task);
                self.stopping.insert(inc, live);
            }
            task => {
                match task {
                    Some(task) => task.abort(),
                    // An `--exec` worker adopted without a readable record: a process of
                    // it may run on unsupervised, so its end is not confirmed (the
                    // scheduler's deadline decides instead).
                    None if matches!(self.mode, Mode::Exec(_)) => {
                        self.confirm_when_ended.remove(&(inc.job, inc.attempt));
                    }
                    None => {}
                }
                self.stopped(inc, &live.gpus);
            }
        }
        // A report owed about this incarnation is moot: the scheduler moved on.
        if !self.attempt_runs(inc) {
            self.reports.remove(&(inc.job, inc.attempt));
            self.forget_finished(inc.job, inc.attempt);
        }
        self.forget_failure_once_done(inc);
    }

    /// A stopped worker's process has ended: its GPUs, MIG instances and record go.
    fn stopped(&mut self, inc: Incarnation, gpus: &[pb::GpuSlot]) {
        self.ended_cleanup(inc, gpus);
        if let Some(store) = &self.records {
            store.remove(&inc);
        }
        self.confirm_if_ended(inc.job, inc.attempt);
    }

    /// The stop grace this agent confirms stops within (`RegisterNodeRequest`), or
    /// `None` in a mode that cannot tell when a job's processes end.
    pub fn confirms_stops(&self) -> Option<Duration> {
        match self.mode {
            Mode::Exec(_) => Some(self.stop_grace),
            Mode::Simulated { .. } => Some(Duration::ZERO),
            Mode::EnvOnly => None,
        }
    }

    /// Notes that the scheduler waits to hear when `job` at `attempt` has no worker
    /// left here.
    fn want_stop_confirmed(&mut self, job: u64, attempt: u32) {
        if self.confirms_stops().is_some() {
            self.confirm_when_ended.insert((job, attempt));
        }
    }

    /// Owes the confirmation of `job` at `attempt` once none of its workers is left
    /// here, running or stopping, if one was asked for.
    fn confirm_if_ended(&mut self, job: u64, attempt: u32) {
        let key = (job, attempt);
        if !self.confirm_when_ended.contains(&key) {
            return;
        }
        let runs = self
            .live
            .keys()
            .chain(self.stopping.keys())
            .any(|i| i.job == job && i.attempt == attempt);
        if !runs {
            self.confirm_when_ended.remove(&key);
            self.stops_to_confirm.insert(key);
        }
    }

    /// Settles the stopping workers whose processes have ended (called before a start
    /// and at the report interval).
    pub fn reap_stopped(&mut self) {
        let ended: Vec<Incarnation> = self
            .stopping
            .iter()
            .filter(|(_, l)| l.task.as_ref().is_none_or(|t| t.is_finished()))
            .map(|(i, _)| *i)
            .collect();
        for i in ended {
            if let Some(l) = self.stopping.remove(&i) {
                self.stopped(i, &l.gpus);
            }
        }
    }

    /// Waits for the stopping workers `which` selects to end: all of them together at
    /// most the stop grace and the kill's own wait, after which the GPUs are handed on
    /// regardless (as a worker that ignores SIGKILL, in uninterruptible sleep on a hung
    /// driver, would otherwise hold them for ever). Each stays in `stopping` until it is
    /// settled, so a wait cut short (the session dropped at shutdown or by fencing)
    /// leaves it for the next one.
    async fn wait_stopped(&mut self, which: impl Fn(&Incarnation, &Live) -> bool) {
        let waiting: Vec<Incarnation> = self
            .stopping
            .iter()
            .filter(|(i, l)| which(i, l))
            .map(|(i, _)| *i)
            .collect();
        let limit = self.stop_grace + STOP_WAIT;
        let deadline = tokio::time::Instant::now() + limit;
        for i in waiting {
            if let Some(task) = self.stopping.get_mut(&i).and_then(|l| l.task.as_mut())
                && tokio::time::timeout_at(deadline, task).await.is_err()
            {
                tracing::warn!(
                    job = i.job,
                    worker = i.worker,
                    limit = ?limit,
                    "a stopped worker has not ended; its GPUs are handed on"
                );
            }
            if let Some(l) = self.stopping.remove(&i) {
                self.stopped(i, &l.gpus);
            }
        }
    }

    /// A failure only has to be remembered while other workers of the same attempt
    /// still run (so that their clean exits do not report the job COMPLETED); a
    /// long-lived agent would otherwise keep every failed attempt it ever saw.
    fn forget_failure_once_done(&mut self, inc: Incarnation) {
        if !self.attempt_runs(inc) {
            self.failed.remove(&(inc.job, inc.attempt));
        }
    }

    /// Whether a worker of `inc`'s job and attempt still runs here.
    fn attempt_runs(&self, inc: Incarnation) -> bool {
        self.live
            .keys()
            .any(|i| i.job == inc.job && i.attempt == inc.attempt)
    }

    /// Removes the state of ended workers of `job` at `attempt` (0: any attempt): the
    /// scheduler has heard all it will about them.
    fn forget_finished(&mut self, job: u64, attempt: u32) {
        let done: Vec<Incarnation> = self
            .awaiting_report
            .iter()
            .filter(|i| i.job == job && (attempt == 0 || i.attempt == attempt))
            .copied()
            .collect();
        for i in done {
            self.awaiting_report.remove(&i);
            if let Some(store) = &self.records {
                store.remove(&i);
            }
        }
    }

    /// The scheduler took (or refused for good) the report `state` about `job` at
    /// `attempt`: it is dropped unless a newer one replaced it meanwhile, and after a
    /// final one the ended workers' records go.
    pub fn settle_report(&mut self, job: u64, attempt: u32, state: pb::JobState) {
        if self.reports.get(&(job, attempt)).map(|r| r.0) != Some(state) {
            return;
        }
        self.reports.remove(&(job, attempt));
        if state != pb::JobState::Running {
            self.forget_finished(job, attempt);
        }
    }

    /// The MIG instances for the worker's MIG slices (none without an inventory).
    fn claim_mig(&mut self, inc: Incarnation, gpus: &[pb::GpuSlot]) -> Result<Vec<String>, String> {
        let mut uuids = Vec::new();
        for g in gpus.iter().filter(|g| g.mig_compute > 0) {
            let size = |v: u32| u8::try_from(v).map_err(|_| format!("MIG slice count {v}"));
            let claimed = self
                .mig
                .claim(inc, g.index, size(g.mig_compute)?, size(g.mig_memory)?);
            match claimed {
                Ok(Some(m)) => uuids.push(m.uuid.clone()),
                Ok(None) => {}
                Err(why) => {
                    self.mig.release(inc);
                    return Err(why);
                }
            }
        }
        Ok(uuids)
    }

    fn ended_cleanup(&mut self, inc: Incarnation, gpus: &[pb::GpuSlot]) {
        self.mig.release(inc);
        let others = self.attempt_runs(inc);
        if let Some(c) = &mut self.checkpoints {
            c.forget(&inc, others);
        }
        self.journal(inc, gpus, false);
        self.backlog.set_job(gpus, None);
        let still_here = self.live.keys().any(|i| i.job == inc.job);
        if !still_here {
            self.backlog.clear_job(inc.job);
        }
        let _ = std::fs::remove_file(self.env_path(&inc));
        self.remember(inc);
    }

    /// Stops every incarnation of `job` at `attempt` (0: any attempt).
    pub async fn stop_job(&mut self, job: u64, attempt: u32) {
        let matching: Vec<Incarnation> = self
            .live
            .keys()
            .filter(|i| i.job == job && (attempt == 0 || i.attempt == attempt))
            .copied()
            .collect();
        // The scheduler did not place these here; it may have placed the job elsewhere
        // while this agent was away, and then waits to hear that they ended.
        for i in matching {
            self.want_stop_confirmed(i.job, i.attempt);
            self.stop(i).await;
            self.confirm_if_ended(i.job, i.attempt);
        }
        if attempt == 0 {
            self.reports.retain(|(j, _), _| *j != job);
        } else {
            self.reports.remove(&(job, attempt));
        }
        self.forget_finished(job, attempt);
    }

    /// Applies a STOP assignment, confirming it once its workers here have ended when
    /// the scheduler asks (`Assignment.confirm`: it holds the job's next START until
    /// then). A STOP of nothing running here is confirmed at once.
    pub async fn apply_stop(&mut self, a: &pb::Assignment) {
        if a.confirm {
            self.want_stop_confirmed(a.job_id, a.attempt);
        }
        self.stop(Incarnation::of(a)).await;
        self.confirm_if_ended(a.job_id, a.attempt);
    }

    /// Applies a watch's opening snapshot.
    pub async fn sync(&mut self, snapshot: &[pb::Assignment]) {
        let keep: HashSet<Incarnation> = snapshot.iter().map(Incarnation::of).collect();
        let gone: Vec<Incarnation> = self
            .live
            .keys()
            .filter(|i| !keep.contains(i))
            .copied()
            .collect();
        // A STOP sent while this agent was away may have been waited on.
        for i in gone {
            self.want_stop_confirmed(i.job, i.attempt);
            self.stop(i).await;
            self.confirm_if_ended(i.job, i.attempt);
        }
        for a in snapshot {
            self.start(a).await;
        }
    }

    /// A process (or simulated run) ended by itself.
    pub fn exited(&mut self, exit: Exit) {
        let inc = exit.incarnation;
        let Some(live) = self.live.remove(&inc) else {
            return; // stopped meanwhile
        };
        self.ended_cleanup(inc, &live.gpus);
        match exit.outcome {
            Err(why) => {
                tracing::warn!(job = inc.job, worker = inc.worker, %why, "job failed");
                self.failed.insert((inc.job, inc.attempt));
                self.owe(
                    inc,
                    pb::JobState::Failed,
                    format!("worker {}: {why}", inc.worker),
                );
            }
            Ok(()) => {
                let others = self.attempt_runs(inc);
                if !others && !self.failed.contains(&(inc.job, inc.attempt)) {
                    self.owe(inc, pb::JobState::Completed, "exited with status 0".into());
                }
            }
        }
        self.forget_failure_once_done(inc);
        if self.records.is_some() {
            // Its exit status must outlive an agent restart until the report is taken.
            self.awaiting_report.insert(inc);
            let others = self.attempt_runs(inc);
            if !others && !self.reports.contains_key(&(inc.job, inc.attempt)) {
                // Nothing left to tell (its job's failure was reported already).
                self.forget_finished(inc.job, inc.attempt);
            }
        }
    }

    /// Stops everything, and waits until every stopped process has ended.
    pub async fn stop_all(&mut self) {
        let all: Vec<Incarnation> = self.live.keys().copied().collect();
        for i in all {
            self.stop(i).await;
        }
        self.wait_stopped(|_, _| true).await;
    }

    /// The agent is exiting: `--exec` workers are left running for the next agent to
    /// adopt (their records stay), unless `stop_workers`; simulated and env-only
    /// workers end with the agent, since nothing of theirs outlives it.
    pub async fn shut_down(&mut self, stop_workers: bool) {
        // Those already told to stop get their grace: left now, they would run on.
        self.wait_stopped(|_, _| true).await;
        if stop_workers || self.records.is_none() {
            self.stop_all().await;
            return;
        }
        for (inc, live) in std::mem::take(&mut self.live) {
            // A dropped control sender ends the watch and leaves the worker alone.
            drop(live.kill);
            if let Some(task) = live.task {
                let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
            }
            tracing::info!(
                job = inc.job,
                worker = inc.worker,
                attempt = inc.attempt,
                "worker left running for the next agent to adopt"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn start(job: u64, attempt: u32, gpus: &[u32]) -> pb::Assignment {
        pb::Assignment {
            job_id: job,
            action: pb::AssignmentAction::Start as i32,
            worker: 0,
            gpus: gpus
                .iter()
                .map(|&index| pb::GpuSlot {
                    index,
                    milli: 1000,
                    ..Default::default()
                })
                .collect(),
            env: Default::default(),
            reason: String::new(),
            attempt,
            confirm: false,
        }
    }

    fn runner(mode: Mode) -> (Runner, mpsc::UnboundedReceiver<Exit>, tempfile::TempDir) {
        runner_with_mig(mode, Vec::new())
    }

    fn runner_with_mig(
        mode: Mode,
        mig: Vec<marshal_telemetry::MigInstance>,
    ) -> (Runner, mpsc::UnboundedReceiver<Exit>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let backlog = Backlog::new("n-0", 8);
        let r = Runner::new("n-0", mode, dir.path(), tx, backlog, None, mig).unwrap();
        (r, rx, dir)
    }

    /// A START of one 1c/1m MIG slice on GPU 3.
    pub(super) fn mig_start(job: u64) -> pb::Assignment {
        let mut a = start(job, 1, &[3]);
        a.gpus[0].milli = 142;
        a.gpus[0].mig_compute = 1;
        a.gpus[0].mig_memory = 1;
        a
    }

    #[test]
    fn with_a_retention_expired_worker_logs_are_swept_at_most_hourly() {
        let (r, _rx, dir) = runner(Mode::Exec("true".into()));
        let mut r = r.with_log_retention(Some(std::time::Duration::from_secs(86_400)));
        let old = |name: &str| {
            let path = dir.path().join("jobs").join(name);
            std::fs::write(&path, b"x").unwrap();
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(
                    std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400),
                )
                .unwrap();
            path
        };
        let first = old("7.0.1.log");
        assert_eq!(r.sweep_logs(), 1);
        assert!(!first.exists());
        // Not again within the hour.
        let second = old("8.0.1.log");
        assert_eq!(r.sweep_logs(), 0);
        assert!(second.exists());
        // Without a retention, nothing is ever swept.
        let (mut keep_all, _rx, dir) = runner(Mode::Exec("true".into()));
        let path = dir.path().join("jobs/9.0.1.log");
        std::fs::write(&path, b"x").unwrap();
        assert_eq!(keep_all.sweep_logs(), 0);
    }

    #[tokio::test]
    async fn a_failed_worker_keeps_its_gang_from_completing_and_is_then_forgotten() {
        let (mut r, _rx, _dir) = runner(Mode::EnvOnly);
        let worker = |w: u32| {
            let mut a = start(5, 2, &[w]);
            a.worker = w;
            a
        };
        r.start(&worker(0)).await;
        r.start(&worker(1)).await;
        let inc = |worker| Incarnation {
            job: 5,
            worker,
            attempt: 2,
        };
        r.exited(Exit {
            incarnation: inc(0),
            outcome: Err("exit status 1".into()),
        });
        assert!(r.failed.contains(&(5, 2)), "worker 1 still runs");
        r.exited(Exit {
            incarnation: inc(1),
            outcome: Ok(()),
        });
        assert_eq!(r.reports[&(5, 2)].0, pb::JobState::Failed, "not COMPLETED");
        assert!(r.failed.is_empty(), "nothing of the attempt runs any more");
        // The same when the scheduler stops the last worker instead.
        r.start(&worker(0)).await;
        r.start(&worker(1)).await;
        r.exited(Exit {
            incarnation: inc(0),
            outcome: Err("exit status 1".into()),
        });
        r.stop(inc(1)).await;
        assert!(r.failed.is_empty());
    }

    #[tokio::test]
    async fn a_mig_slice_gets_its_instance_uuid_and_none_free_is_a_failed_start() {
        let instance = marshal_telemetry::MigInstance {
            gpu: 3,
            uuid: "MIG-4b7c".into(),
            profile: "1g.10gb".into(),
            compute: 1,
            memory: 1,
        };
        let (mut r, mut rx, dir) = runner_with_mig(Mode::EnvOnly, vec![instance]);
        r.start(&mig_start(1)).await;
        let env = std::fs::read_to_string(dir.path().join("assignments/1.0.env")).unwrap();
        assert!(env.contains("CUDA_VISIBLE_DEVICES='MIG-4b7c'\n"), "{env}");
        assert!(env.contains("MARSHAL_MIG_UUID='MIG-4b7c'\n"), "{env}");
        // The only instance is held: the next MIG job fails to start, with the reason.
        r.start(&mig_start(2)).await;
        let exit = rx.recv().await.unwrap();
        assert_eq!(exit.incarnation.job, 2);
        r.exited(exit);
        let (state, msg) = &r.reports[&(2, 1)];
        assert_eq!(*state, pb::JobState::Failed);
        assert!(
            msg.contains("no free MIG instance") && msg.contains("GPU 3"),
            "{msg}"
        );
        assert!(!dir.path().join("assignments/2.0.env").exists());
        // Once the first ends, its instance is free again.
        r.stop_job(1, 1).await;
        r.start(&mig_start(3)).await;
        let env = std::fs::read_to_string(dir.path().join("assignments/3.0.env")).unwrap();
        assert!(env.contains("CUDA_VISIBLE_DEVICES='MIG-4b7c'\n"), "{env}");
        // Without an inventory (simulated source) the index stays, as the scheduler sent it.
        let (mut r, _rx, dir) = runner(Mode::EnvOnly);
        r.start(&mig_start(4)).await;
        let env = std::fs::read_to_string(dir.path().join("assignments/4.0.env")).unwrap();
        assert!(env.contains("CUDA_VISIBLE_DEVICES='3'\n"), "{env}");
        assert!(!env.contains("MARSHAL_MIG_UUID"), "{env}");
    }

    #[tokio::test]
    async fn an_env_file_that_cannot_be_written_is_a_failed_start_without_exec() {
        let (mut r, mut rx, dir) = runner(Mode::EnvOnly);
        // A directory where the file should go: the rename fails (for root too).
        std::fs::create_dir(dir.path().join("assignments/7.0.env")).unwrap();
        r.start(&start(7, 1, &[0])).await;
        let exit = rx.recv().await.unwrap();
        assert_eq!(exit.incarnation.job, 7);
        r.exited(exit);
        let (state, msg) = &r.reports[&(7, 1)];
        assert_eq!(*state, pb::JobState::Failed);
        assert!(
            msg.contains("environment file") && msg.contains("7.0.env"),
            "{msg}"
        );
        assert_eq!(r.starts, 0);
        // Another job's file is written as usual.
        r.start(&start(8, 1, &[1])).await;
        assert!(dir.path().join("assignments/8.0.env").is_file());
        assert_eq!(r.starts, 1);
    }

    #[tokio::test]
    async fn repeated_and_stale_starts_are_ignored_and_a_snapshot_replaces_the_rest() {
        let (mut r, _rx, dir) = runner(Mode::EnvOnly);
        r.start(&start(1, 1, &[0])).await;
        r.start(&start(1, 1, &[0])).await;
        assert_eq!(r.starts, 1);
        assert!(dir.path().join("assignments/1.0.env").exists());
        // A newer attempt replaces the old one; the old one never comes back.
        r.start(&start(1, 2, &[1])).await;
        r.start(&start(1, 1, &[0])).await;
        assert_eq!(r.live().copied().collect::<Vec<_>>().len(), 1);
        assert_eq!(r.starts, 2);
        r.start(&start(2, 1, &[2])).await;
        r.sync(&[start(2, 1, &[2]), start(3, 1, &[3])]).await;
        let live: Vec<u64> = r.live().map(|i| i.job).collect();
        assert_eq!(live, vec![2, 3]);
        assert_eq!(r.starts, 4);
        assert!(!dir.path().join("assignments/1.0.env").exists());
    }

    /// A STOP returns at once; the stopped worker keeps its GPU through its grace: a
    /// START on that GPU waits for it to end, a START on another does not.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_start_waits_for_the_stopping_worker_on_its_gpus_and_no_other_does() {
        let marks = tempfile::tempdir().unwrap();
        let ended = marks.path().join("ended");
        let ready = marks.path().join("ready");
        let cmd = format!(
            "trap 'sleep 2; echo $MARSHAL_JOB_ID >> \"{}\"; exit 0' TERM; \
             touch \"{}\".$MARSHAL_JOB_ID; sleep 30 & wait",
            ended.display(),
            ready.display()
        );
        let (r, _rx, _dir) = runner(Mode::Exec(cmd));
        let mut r = r.with_stop_grace(Duration::from_secs(20));
        r.start(&start(1, 1, &[0])).await;
        let ready_1 = marks.path().join("ready.1");
        wait_for_file(&ready_1).await;
        let t = Instant::now();
        r.stop_job(1, 1).await;
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(r.stopping.len(), 1);
        // A repeated START of the stopping worker is ignored.
        r.start(&start(1, 1, &[0])).await;
        assert!(r.live.is_empty());
        r.start(&start(2, 1, &[1])).await;
        assert!(
            !ended.exists(),
            "a START on another GPU waited for the stopping worker"
        );
        r.start(&start(3, 1, &[0])).await;
        assert_eq!(std::fs::read_to_string(&ended).unwrap(), "1\n");
        assert!(r.stopping.is_empty());
        assert_eq!(r.live.len(), 2);
        // A later attempt of a stopping job waits for it wherever it is placed: two
        // attempts at once would write one checkpoint.
        r.start(&start(4, 1, &[4])).await;
        let ready_4 = marks.path().join("ready.4");
        wait_for_file(&ready_4).await;
        r.stop_job(4, 1).await;
        r.start(&start(4, 2, &[5])).await;
        assert_eq!(std::fs::read_to_string(&ended).unwrap(), "1\n4\n");
        r.stop_all().await;
        assert!(r.live.is_empty() && r.stopping.is_empty());
    }

    /// Waits (at most 10 s) for a worker to write the file at `path`.
    async fn wait_for_file(path: &Path) {
        let t = Instant::now();
        while !path.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} never written",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reaps until no stopped worker is left (at most 15 s).
    async fn reap_until_settled(r: &mut Runner) {
        let t = Instant::now();
        while !r.stopping.is_empty() {
            assert!(t.elapsed() < Duration::from_secs(15));
            tokio::time::sleep(Duration::from_millis(50)).await;
            r.reap_stopped();
        }
    }

    fn stop_of(job: u64, attempt: u32, confirm: bool) -> pb::Assignment {
        pb::Assignment {
            action: pb::AssignmentAction::Stop as i32,
            confirm,
            ..start(job, attempt, &[])
        }
    }

    /// A STOP the scheduler waits on is confirmed once the worker's process has ended,
    /// not when the SIGTERM is sent; one it does not wait on is never confirmed; a STOP
    /// of nothing running here is confirmed at once.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_stop_is_confirmed_when_the_stopped_worker_has_ended_if_asked() {
        let marks = tempfile::tempdir().unwrap();
        let ready = marks.path().join("ready");
        let cmd = format!(
            "trap 'sleep 1; exit 0' TERM; touch \"{}\".$MARSHAL_JOB_ID; sleep 30 & wait",
            ready.display()
        );
        let (r, _rx, _dir) = runner(Mode::Exec(cmd));
        let mut r = r.with_stop_grace(Duration::from_secs(20));
        assert_eq!(r.confirms_stops(), Some(Duration::from_secs(20)));
        for job in [1, 2] {
            r.start(&start(job, 1, &[job as u32])).await;
            wait_for_file(&marks.path().join(format!("ready.{job}"))).await;
        }
        r.apply_stop(&stop_of(1, 1, true)).await;
        r.apply_stop(&stop_of(2, 1, false)).await;
        assert_eq!(r.stopping.len(), 2);
        assert!(r.stops_to_confirm.is_empty(), "confirmed before it ended");
        reap_until_settled(&mut r).await;
        assert_eq!(r.stops_to_confirm, BTreeSet::from([(1, 1)]));
        r.stops_to_confirm.clear();
        r.apply_stop(&stop_of(9, 4, true)).await;
        assert_eq!(r.stops_to_confirm, BTreeSet::from([(9, 4)]));
        // A registration lists a worker still stopping apart from the running ones, and
        // its end is confirmed: the scheduler may have moved its job meanwhile.
        r.stops_to_confirm.clear();
        r.start(&start(3, 1, &[3])).await;
        wait_for_file(&marks.path().join("ready.3")).await;
        r.apply_stop(&stop_of(3, 1, false)).await;
        assert!(r.running_list().is_empty());
        let stopping = r.stopping_list();
        assert_eq!((stopping.len(), stopping[0].job_id), (1, 3));
        reap_until_settled(&mut r).await;
        assert_eq!(r.stops_to_confirm, BTreeSet::from([(3, 1)]));
    }

    #[tokio::test]
    async fn only_an_agent_that_sees_its_workers_end_confirms_stops() {
        let (mut r, _rx, _dir) = runner(Mode::Simulated { speedup: 1.0 });
        assert_eq!(r.confirms_stops(), Some(Duration::ZERO));
        r.start(&start(3, 2, &[0])).await;
        r.apply_stop(&stop_of(3, 2, true)).await;
        assert_eq!(r.stops_to_confirm, BTreeSet::from([(3, 2)]));
        let (mut r, _rx, _dir) = runner(Mode::EnvOnly);
        assert_eq!(r.confirms_stops(), None);
        r.start(&start(3, 2, &[0])).await;
        r.apply_stop(&stop_of(3, 2, true)).await;
        assert!(r.stops_to_confirm.is_empty());
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn exec_reports_failure_by_exit_status_and_a_stop_kills() {
        let (mut r, mut rx, _dir) = runner(Mode::Exec("exit $MARSHAL_ATTEMPT".into()));
        r.start(&start(7, 1, &[0])).await;
        assert_eq!(r.reports[&(7, 1)].0, pb::JobState::Running);
        let exit = rx.recv().await.unwrap();
        r.exited(exit);
        let (state, msg) = &r.reports[&(7, 1)];
        assert_eq!(*state, pb::JobState::Failed);
        assert!(msg.contains("exit status: 1"), "{msg}");
        assert_eq!(r.running_list().len(), 1);
        let (mut r, mut rx, _dir) = runner(Mode::Exec("sleep 30".into()));
        r.start(&start(8, 1, &[0])).await;
        let t = Instant::now();
        r.stop_job(8, 1).await;
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(r.reports.is_empty() && r.running_list().is_empty());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err()
        );
    }
}
